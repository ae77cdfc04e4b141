//! qdrant-edge backend: the Qdrant engine in-process, one shard per directory.
//!
//! Durability: qdrant-edge 0.7.2 writes each update to its WAL and applies it to the segments, but
//! does not replay the WAL on load; data is durable once `flush()` has synced the segments. The store
//! therefore flushes in [`VectorStore::flush`] and the dataflow acknowledges only after it.
//! `EdgeShard::flush` panics if it races an update or an optimizer's segment swap, so writes, flushes
//! and optimizations hold one writer lock. Reads (search, scroll, retrieve, count) take no lock of
//! ours: the engine's segment holder lets them run beside a write or an optimization (as the Qdrant
//! server does), so a long optimization never holds queries.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use qdrant_edge::{
    CountRequest, EdgeConfig, EdgeShard, EdgeSparseVectorParams, EdgeVectorParams, Modifier,
    PointId, PointInsertOperations, PointOperations, PointStruct, ScrollRequest, UpdateOperation,
    Vector, VectorInternal, VectorStructInternal, Vectors, WithPayloadInterface, WithVector,
};

use std::collections::BTreeMap;

use ragstream_core::metadata::MetaIndex;

use super::{
    check_compatible, check_dimensions, chunk_from_payload, chunk_payload, unit_evidence, Hit,
    IndexTuning, LaneHits, LaneQuery, PointWrite, SearchFilter, SearchVector, StoreError,
    StoredChunk, StoredVectors, VectorStore, DENSE_VECTOR, EVIDENCE_VECTOR, SPARSE_VECTOR,
};

mod config;
mod error;
mod filter;
mod ids;
mod indexes;
mod search;

use config::{distance, evidence_params, hnsw, int8, optimizers};
use error::{engine_error, io_error};
use filter::engine_filter;
use ids::{point_id, uuid_of};
pub use search::DenseSearch;

/// Points per scroll page.
const SCROLL_PAGE: usize = 512;

/// Whether the shard's sparse vector has the engine's IDF modifier (shards created before the
/// corpus-wide statistics).
fn engine_idf(shard: &EdgeShard) -> bool {
    shard
        .config()
        .sparse_vectors
        .get(SPARSE_VECTOR)
        .is_some_and(|params| params.modifier == Some(Modifier::Idf))
}

/// A qdrant-edge shard on disk.
pub struct EdgeStore {
    shard: EdgeShard,
    path: PathBuf,
    dimension: usize,
    tuning: IndexTuning,
    /// Whether the shard has the evidence multi-vector (shards created before it do not).
    evidence: bool,
    /// Held by writers (update, flush, optimize); readers take none. See the module docs.
    writer: Mutex<()>,
    /// The declared metadata keys' index types ([`VectorStore::index_metadata`]).
    declared: Mutex<BTreeMap<String, MetaIndex>>,
}

impl std::fmt::Debug for EdgeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdgeStore")
            .field("path", &self.path)
            .field("dimension", &self.dimension)
            .field("tuning", &self.tuning)
            .finish()
    }
}

impl EdgeStore {
    /// Writes `points`; the caller holds the writer lock.
    fn upsert_locked(&self, points: &[PointWrite]) -> Result<(), StoreError> {
        if points.is_empty() {
            return Ok(());
        }
        check_dimensions(points, self.dimension)?;
        let mut list = Vec::with_capacity(points.len());
        for point in points {
            let sparse =
                Vector::new_sparse(point.sparse.indices.clone(), point.sparse.values.clone())
                    .map_err(engine_error)?;
            let mut named = vec![
                (
                    DENSE_VECTOR,
                    Vector::new_dense(self.tuning.distance.prepare(&point.dense)),
                ),
                (SPARSE_VECTOR, sparse),
            ];
            if self.evidence && !point.evidence.is_empty() {
                if point.evidence.iter().any(|v| v.len() != self.dimension) {
                    return Err(StoreError::Invalid(format!(
                        "evidence vector of a dimension other than the index's {}",
                        self.dimension
                    )));
                }
                named.push((
                    EVIDENCE_VECTOR,
                    Vector::new_multi(point.evidence.clone()).map_err(engine_error)?,
                ));
            }
            let vectors = Vectors::new_named(named);
            let payload = serde_json::Value::Object(chunk_payload(point));
            list.push(PointStruct::new(point_id(point.id), vectors, payload).into());
        }
        self.shard
            .update(UpdateOperation::PointOperation(
                PointOperations::UpsertPoints(PointInsertOperations::PointsList(list)),
            ))
            .map_err(engine_error)
    }

    /// Opens the shard at `path`, creating it (with indexes) if missing, with the default tuning.
    pub fn open(path: &Path, dimension: usize) -> Result<Self, StoreError> {
        Self::open_tuned(path, dimension, IndexTuning::default())
    }

    /// Opens the shard at `path`, creating it (with indexes) if missing.
    ///
    /// A new shard takes every setting of `tuning`. An existing one takes its HNSW settings and
    /// indexing threads (segments built before are rebuilt by the engine's next optimization);
    /// whether its vectors are quantised was fixed when it was created and stays (a warning says so).
    pub fn open_tuned(
        path: &Path,
        dimension: usize,
        tuning: IndexTuning,
    ) -> Result<Self, StoreError> {
        std::fs::create_dir_all(path).map_err(io_error)?;
        let mut dense = EdgeVectorParams::builder(dimension, distance(&tuning));
        if tuning.quantized {
            dense = dense.on_disk(true).quantization_config(int8());
        }
        let config = EdgeConfig::builder()
            .vector(DENSE_VECTOR, dense.build())
            .vector(EVIDENCE_VECTOR, evidence_params(dimension))
            .sparse_vector(
                SPARSE_VECTOR,
                EdgeSparseVectorParams::builder()
                    .on_disk(tuning.indexes_on_disk)
                    .build(),
            )
            .hnsw_config(hnsw(&tuning))
            .optimizers(optimizers())
            .build();
        let existing = path.join("edge_config.json").exists();
        let shard = if existing {
            EdgeShard::load(path, None)
        } else {
            EdgeShard::new(path, config)
        }
        .map_err(engine_error)?;
        if existing {
            // Shards written by an earlier version or config keep their config file: bring the
            // optimizer's and the HNSW settings up to date.
            if shard.config().optimizers != optimizers() {
                shard
                    .set_optimizers_config(optimizers())
                    .map_err(engine_error)?;
            }
            if shard.config().hnsw_config != hnsw(&tuning) {
                shard.set_hnsw_config(hnsw(&tuning)).map_err(engine_error)?;
            }
            let found = shard.config().vectors.get(DENSE_VECTOR).cloned();
            if found.as_ref().map(|v| v.size) != Some(dimension) {
                return Err(StoreError::EmbedderMismatch {
                    found: "(existing index)".into(),
                    found_dimension: found.map_or(0, |v| v.size),
                    expected: "(this job)".into(),
                    expected_dimension: dimension,
                });
            }
            if let Some(found) = found.as_ref().filter(|v| v.distance != distance(&tuning)) {
                return Err(StoreError::Invalid(format!(
                    "the shard at {} holds dense vectors of distance {:?}; index.tuning.distance is {}: re-index into a new path to change it",
                    path.display(),
                    found.distance,
                    tuning.distance.as_str()
                )));
            }
            if engine_idf(&shard) {
                tracing::warn!(
                    shard = %path.display(),
                    "the shard was created with the engine's per-shard BM25 IDF: its BM25 ranking depends on the number of shards until the index is rebuilt"
                );
            }
            if !shard.config().vectors.contains_key(EVIDENCE_VECTOR) {
                tracing::warn!(
                    shard = %path.display(),
                    "the shard was created without evidence vectors: the rerank's sentence evidence falls back to each chunk's own vector until the index is rebuilt"
                );
            }
            let quantized = found.is_some_and(|v| v.quantization_config.is_some());
            if quantized != tuning.quantized {
                tracing::warn!(
                    shard = %path.display(),
                    quantized,
                    "index.tuning.quantized differs from the shard's; the shard keeps its own (rebuild the index to change it)"
                );
            }
        }
        let evidence = shard.config().vectors.contains_key(EVIDENCE_VECTOR);
        let store = Self {
            evidence,
            shard,
            path: path.to_path_buf(),
            dimension,
            tuning,
            writer: Mutex::new(()),
            declared: Mutex::new(BTreeMap::new()),
        };
        store.create_indexes()?;
        Ok(store)
    }

    /// The shard directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The declared metadata keys (a copy: a few entries).
    fn declared(&self) -> BTreeMap<String, MetaIndex> {
        self.declared.lock().map(|d| d.clone()).unwrap_or_default()
    }

    /// Builds HNSW indexes and vacuums deleted points (synchronous; call off the hot path).
    pub fn optimize(&self) -> Result<bool, StoreError> {
        let _guard = self.writer.lock().expect("store writer lock");
        self.shard.optimize().map_err(engine_error)
    }
}

impl VectorStore for EdgeStore {
    fn optimize(&self) -> Result<(), StoreError> {
        EdgeStore::optimize(self).map(|_| ())
    }

    fn index_metadata(&self, keys: &[(String, MetaIndex)]) -> Result<(), StoreError> {
        self.create_metadata_indexes(keys)
    }

    fn engine_idf(&self) -> bool {
        engine_idf(&self.shard)
    }

    fn backend(&self) -> &'static str {
        "edge"
    }

    fn check_embedder(&self, embedder_version: &str, dimension: usize) -> Result<(), StoreError> {
        let mut found: Option<StoredChunk> = None;
        let (page, _) = self
            .shard
            .scroll(ScrollRequest {
                offset: None,
                limit: Some(1),
                filter: None,
                with_payload: Some(WithPayloadInterface::Bool(true)),
                with_vector: WithVector::Bool(false),
                order_by: None,
            })
            .map_err(engine_error)?;
        for record in page {
            if let (Some(id), Some(payload)) = (uuid_of(&record.id), record.payload) {
                found = chunk_from_payload(id, payload.0);
            }
        }
        check_compatible(found.as_ref(), self.dimension, embedder_version, dimension)
    }

    fn upsert(&self, points: &[PointWrite]) -> Result<(), StoreError> {
        let _guard = self.writer.lock().expect("store writer lock");
        self.upsert_locked(points)
    }

    fn replace_current(&self, points: &[PointWrite]) -> Result<usize, StoreError> {
        // Under the writer lock no other write of this shard interleaves between the check and the
        // write (readers take no lock).
        let _guard = self.writer.lock().expect("store writer lock");
        let current = super::still_current(self, points)?;
        self.upsert_locked(&current)?;
        Ok(current.len())
    }

    fn delete(&self, ids: &[uuid::Uuid]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let ids = ids.iter().map(|id| point_id(*id)).collect();
        let _guard = self.writer.lock().expect("store writer lock");
        self.shard
            .update(UpdateOperation::PointOperation(
                PointOperations::DeletePoints { ids },
            ))
            .map_err(engine_error)
    }

    fn flush(&self) -> Result<(), StoreError> {
        let _guard = self.writer.lock().expect("store writer lock");
        // `EdgeShard::flush` panics on I/O errors; contain it so the dataflow retries instead of dying.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.shard.flush())).map_err(
            |_| StoreError::Unavailable(format!("flush of {} failed", self.path.display())),
        )
    }

    fn scroll(
        &self,
        filter: &SearchFilter,
        visit: &mut dyn FnMut(StoredChunk),
    ) -> Result<(), StoreError> {
        let filter = engine_filter(filter, &self.declared())?;
        let mut offset = None;
        loop {
            let (page, next) = {
                self.shard
                    .scroll(ScrollRequest {
                        offset,
                        limit: Some(SCROLL_PAGE),
                        filter: filter.clone(),
                        with_payload: Some(WithPayloadInterface::Bool(true)),
                        with_vector: WithVector::Bool(false),
                        order_by: None,
                    })
                    .map_err(engine_error)?
            };
            for record in page {
                if let (Some(id), Some(payload)) = (uuid_of(&record.id), record.payload) {
                    if let Some(stored) = chunk_from_payload(id, payload.0) {
                        visit(stored);
                    }
                }
            }
            match next {
                Some(next) => offset = Some(next),
                None => return Ok(()),
            }
        }
    }

    fn count(&self, filter: &SearchFilter) -> Result<usize, StoreError> {
        self.shard
            .count(CountRequest {
                filter: engine_filter(filter, &self.declared())?,
                exact: true,
            })
            .map_err(engine_error)
    }

    fn search(
        &self,
        vector: &SearchVector,
        filter: &SearchFilter,
        limit: usize,
        score_threshold: Option<f32>,
    ) -> Result<Vec<Hit>, StoreError> {
        let params = matches!(vector, SearchVector::Dense(_)).then(|| self.dense_params(limit));
        self.query(vector, filter, limit, score_threshold, params)
    }

    fn get(&self, ids: &[uuid::Uuid]) -> Result<Vec<StoredChunk>, StoreError> {
        let ids: Vec<PointId> = ids.iter().map(|id| point_id(*id)).collect();
        let records = self
            .shard
            .retrieve(
                &ids,
                Some(WithPayloadInterface::Bool(true)),
                Some(WithVector::Bool(false)),
            )
            .map_err(engine_error)?;
        Ok(records
            .into_iter()
            .filter_map(|record| chunk_from_payload(uuid_of(&record.id)?, record.payload?.0))
            .collect())
    }

    fn vectors(&self, ids: &[uuid::Uuid]) -> Result<Vec<(uuid::Uuid, StoredVectors)>, StoreError> {
        let ids: Vec<PointId> = ids.iter().map(|id| point_id(*id)).collect();
        let records = self
            .shard
            .retrieve(
                &ids,
                Some(WithPayloadInterface::Bool(false)),
                Some(WithVector::Bool(true)),
            )
            .map_err(engine_error)?;
        Ok(records
            .into_iter()
            .filter_map(|record| Some((uuid_of(&record.id)?, stored_vectors(record.vector?)?)))
            .collect())
    }

    fn search_lanes(
        &self,
        lanes: &LaneQuery,
        filter: &SearchFilter,
    ) -> Result<LaneHits, StoreError> {
        self.lanes_then_points(lanes, filter)
    }
}

/// A point's dense vector and its evidence units' vectors, as the engine returned them.
fn stored_vectors(vectors: VectorStructInternal) -> Option<StoredVectors> {
    scored_vectors(vectors, None).map(|(vectors, _)| vectors)
}

/// [`stored_vectors`], or with `query` its dense vector and the sentence evidence of the query
/// ([`StoredVectors::evidence_score`], computed on the engine's vectors where they lie: the units are
/// not copied), `None` for a point without units.
fn scored_vectors(
    vectors: VectorStructInternal,
    query: Option<&[f32]>,
) -> Option<(StoredVectors, Option<f32>)> {
    let VectorStructInternal::Named(mut vectors) = vectors else {
        return None;
    };
    let VectorInternal::Dense(dense) = vectors.remove(DENSE_VECTOR)? else {
        return None;
    };
    let Some(VectorInternal::MultiDense(multi)) = vectors.remove(EVIDENCE_VECTOR) else {
        let evidence = Vec::new();
        return Some((StoredVectors { dense, evidence }, None));
    };
    let (evidence, score) = match query {
        Some(query) => (Vec::new(), unit_evidence(query, multi.multi_vectors())),
        None => (multi.multi_vectors().map(<[f32]>::to_vec).collect(), None),
    };
    Some((StoredVectors { dense, evidence }, score))
}

#[cfg(test)]
mod tests;
