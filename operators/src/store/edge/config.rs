//! The shard's configuration: segments of the merge optimizer, HNSW and quantisation settings, the
//! evidence multi-vector's parameters.

use qdrant_edge::{
    Distance, EdgeOptimizersConfig, EdgeVectorParams, HnswIndexConfig, MultiVectorComparator,
    MultiVectorConfig, QuantizationConfig, VectorStorageDatatype,
};

use crate::store::{DenseDistance, IndexTuning};

/// Segments a shard's merge optimizer aims at. The engine's default on two cores is 2, so every
/// optimization merged the newly indexed points into the shard's largest segment and rebuilt it: the
/// cost of an optimization grew with the shard and, since writes wait for it, ingest slowed from 1590
/// to 370 chunks/s between 20k and 200k chunks (`bench volume`,
/// docs/decisions/0042-volume-200k-segments-upsert-state.md). With 8, segments are merged smallest
/// first once there are more than 8, so a point is rewritten a logarithmic number of times; a search
/// visits at most about 8 indexed segments plus the appendable one.
const SEGMENTS: usize = 8;

/// The merge optimizer's settings: the engine's defaults with [`SEGMENTS`] segments.
pub(super) fn optimizers() -> EdgeOptimizersConfig {
    EdgeOptimizersConfig {
        default_segment_number: Some(SEGMENTS),
        ..EdgeOptimizersConfig::default()
    }
}

/// The evidence units' multi-vector: cosine, compared by the rerank (never searched, so no HNSW
/// graph is built for it), stored as 16-bit floats (half the memory, cosines within 1e-3).
pub(super) fn evidence_params(dimension: usize) -> EdgeVectorParams {
    EdgeVectorParams::builder(dimension, Distance::Cosine)
        .multivector_config(MultiVectorConfig {
            comparator: MultiVectorComparator::MaxSim,
        })
        .datatype(VectorStorageDatatype::Float16)
        .hnsw_config(HnswIndexConfig {
            m: 0,
            ..HnswIndexConfig::default()
        })
        .build()
}

/// The engine's distance for the dense vectors.
pub(super) fn distance(tuning: &IndexTuning) -> Distance {
    match tuning.distance {
        DenseDistance::Cosine => Distance::Cosine,
        DenseDistance::Dot => Distance::Dot,
        DenseDistance::L2 => Distance::Euclid,
    }
}

/// The HNSW settings of `tuning`.
pub(super) fn hnsw(tuning: &IndexTuning) -> HnswIndexConfig {
    HnswIndexConfig {
        m: tuning.m,
        ef_construct: tuning.ef_construct,
        max_indexing_threads: tuning.threads(),
        ..HnswIndexConfig::default()
    }
}

/// Scalar int8 quantisation kept in RAM. `ScalarQuantization` is not exported by qdrant-edge; the
/// config deserialises from its REST form.
pub(super) fn int8() -> QuantizationConfig {
    serde_json::from_value(serde_json::json!({
        "scalar": { "type": "int8", "quantile": IndexTuning::INT8_QUANTILE, "always_ram": true }
    }))
    .expect("scalar quantization config deserialises")
}
