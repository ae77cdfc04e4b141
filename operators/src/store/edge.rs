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
    Condition, CountRequest, CreateIndex, Distance, EdgeConfig, EdgeOptimizersConfig, EdgeShard,
    EdgeSparseVectorParams, EdgeVectorParams, FieldCondition, FieldIndexOperations, Filter,
    HnswIndexConfig, JsonPath, KeywordIndexParams, Match, Modifier, MultiVectorComparator,
    MultiVectorConfig, NamedQuery, PayloadFieldSchema, PayloadSchemaParams, PayloadSchemaType,
    PointId, PointInsertOperations, PointOperations, PointStruct, QuantizationConfig,
    QuantizationSearchParams, QueryEnum, QueryRequest, ScoringQuery, ScrollRequest, SearchParams,
    UpdateOperation, Vector, VectorInternal, VectorStorageDatatype, VectorStructInternal, Vectors,
    WithPayloadInterface, WithVector,
};

use std::collections::BTreeMap;

use ragstream_core::metadata::{
    check_declared, MetaCondition, MetaIndex, MetaMatch, MetaScalar, RangeBound,
};

use super::{
    check_compatible, chunk_from_payload, chunk_payload, Hit, IndexTuning, PointWrite,
    SearchFilter, SearchVector, StoreError, StoredChunk, StoredVectors, VectorStore, DENSE_VECTOR,
    EVIDENCE_VECTOR, KEYWORD_INDEXES, ON_DISK_KEYWORD_INDEXES, SPARSE_VECTOR,
};

/// Points per scroll page.
const SCROLL_PAGE: usize = 512;

/// Segments a shard's merge optimizer aims at. The engine's default on two cores is 2, so every
/// optimization merged the newly indexed points into the shard's largest segment and rebuilt it: the
/// cost of an optimization grew with the shard and, since writes wait for it, ingest slowed from 1590
/// to 370 chunks/s between 20k and 200k chunks (`bench volume`,
/// docs/decisions/0042-volume-200k-segments-upsert-state.md). With 8, segments are merged smallest
/// first once there are more than 8, so a point is rewritten a logarithmic number of times; a search
/// visits at most about 8 indexed segments plus the appendable one.
const SEGMENTS: usize = 8;

fn optimizers() -> EdgeOptimizersConfig {
    EdgeOptimizersConfig {
        default_segment_number: Some(SEGMENTS),
        ..EdgeOptimizersConfig::default()
    }
}

/// The evidence units' multi-vector: cosine, compared by the rerank (never searched, so no HNSW
/// graph is built for it), stored as 16-bit floats (half the memory, cosines within 1e-3).
fn evidence_params(dimension: usize) -> EdgeVectorParams {
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

fn hnsw(tuning: &IndexTuning) -> HnswIndexConfig {
    HnswIndexConfig {
        m: tuning.m,
        ef_construct: tuning.ef_construct,
        max_indexing_threads: tuning.threads(),
        ..HnswIndexConfig::default()
    }
}

/// Scalar int8 quantisation kept in RAM. `ScalarQuantization` is not exported by qdrant-edge; the
/// config deserialises from its REST form.
fn int8() -> QuantizationConfig {
    serde_json::from_value(serde_json::json!({
        "scalar": { "type": "int8", "quantile": IndexTuning::INT8_QUANTILE, "always_ram": true }
    }))
    .expect("scalar quantization config deserialises")
}

/// Whether the shard's sparse vector has the engine's IDF modifier (shards created before the
/// corpus-wide statistics).
fn engine_idf(shard: &EdgeShard) -> bool {
    shard
        .config()
        .sparse_vectors
        .get(SPARSE_VECTOR)
        .is_some_and(|params| params.modifier == Some(Modifier::Idf))
}

/// How [`EdgeStore::search_dense`] searches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenseSearch {
    /// As the job does: HNSW with the tuning's beam, int8 candidates re-scored when quantised.
    Configured,
    /// HNSW with the same beam on the float vectors only.
    FloatHnsw,
    /// Every point scored with its float vector: the reference.
    Exact,
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

/// The engine's errors that say it cannot serve now (its runtime, storage, memory, a deadline; a
/// full disk shows as a runtime error), not that the request is wrong: retried, never dead-lettered.
/// The engine's error type is not exported, so its messages are matched.
const ENGINE_OUTAGES: [&str; 5] = [
    "Service runtime error",
    "Inconsistent storage",
    "Out of memory",
    "Operation cancelled",
    "Timeout error",
];

fn engine_error(error: impl std::fmt::Display) -> StoreError {
    let message = error.to_string();
    if ENGINE_OUTAGES
        .iter()
        .any(|outage| message.starts_with(outage))
    {
        StoreError::Unavailable(message)
    } else {
        StoreError::Invalid(message)
    }
}

fn io_error(error: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(error.to_string())
}

fn json_path(name: &str) -> JsonPath {
    name.parse()
        .unwrap_or_else(|_| panic!("{name} is a valid payload path"))
}

fn any_of(field: &str, values: Vec<String>) -> Condition {
    Condition::Field(FieldCondition::new_match(
        json_path(field),
        Match::from(values),
    ))
}

/// The engine filter for a [`SearchFilter`] (see [`SearchFilter::conditions`]); metadata conditions
/// are checked against the `declared` keys' types first.
fn engine_filter(
    filter: &SearchFilter,
    declared: &BTreeMap<String, MetaIndex>,
) -> Result<Option<Filter>, StoreError> {
    check_declared(declared, &filter.metadata).map_err(StoreError::Invalid)?;
    let conditions = filter.conditions();
    let mut must: Vec<Condition> = conditions
        .must
        .into_iter()
        .map(|(field, values)| any_of(field, values))
        .collect();
    if let Some(acl) = conditions.acl {
        // `PayloadField` is not exported by qdrant-edge; the condition deserialises from its REST form.
        let is_empty: Condition =
            serde_json::from_value(serde_json::json!({ "is_empty": { "key": "acl" } }))
                .expect("is_empty condition deserialises");
        let mut should = vec![is_empty];
        if !acl.is_empty() {
            should.push(any_of("acl", acl));
        }
        must.push(Condition::Filter(Filter {
            should: Some(should),
            ..Filter::default()
        }));
    }
    for condition in &conditions.metadata {
        // Like `is_empty` above: the engine's field conditions deserialise from their REST form.
        let rest = metadata_condition(condition);
        must.push(serde_json::from_value(rest).map_err(|error| {
            StoreError::Invalid(format!(
                "filters.metadata.{}: the engine does not read this condition: {error}",
                condition.key
            ))
        })?);
    }
    Ok((!must.is_empty()).then(|| Filter {
        must: Some(must),
        ..Filter::default()
    }))
}

/// The REST form of a metadata condition (`{"key", "match"|"range"}`), as the engine reads it.
fn metadata_condition(condition: &MetaCondition) -> serde_json::Value {
    let scalar = |value: &MetaScalar| match value {
        MetaScalar::Keyword(text) => serde_json::json!(text),
        MetaScalar::Integer(i) => serde_json::json!(i),
        MetaScalar::Bool(b) => serde_json::json!(b),
    };
    let bound = |value: &RangeBound| match value {
        RangeBound::Number(n) => serde_json::json!(n),
        RangeBound::Datetime(text) => serde_json::json!(text),
    };
    let key = condition.path();
    match &condition.matches {
        MetaMatch::Value(value) => {
            serde_json::json!({ "key": key, "match": { "value": scalar(value) } })
        }
        MetaMatch::Any(values) => serde_json::json!({
            "key": key,
            "match": { "any": values.iter().map(scalar).collect::<Vec<_>>() }
        }),
        MetaMatch::Range { gte, lte } => {
            let mut range = serde_json::Map::new();
            if let Some(gte) = gte {
                range.insert("gte".into(), bound(gte));
            }
            if let Some(lte) = lte {
                range.insert("lte".into(), bound(lte));
            }
            serde_json::json!({ "key": key, "range": range })
        }
    }
}

fn uuid_of(id: &PointId) -> Option<uuid::Uuid> {
    match id {
        PointId::Uuid(uuid) => uuid::Uuid::from_slice(uuid.as_bytes()).ok(),
        PointId::NumId(_) => None,
    }
}

fn point_id(id: uuid::Uuid) -> PointId {
    PointId::Uuid(qdrant_edge::external::uuid::Uuid::from_bytes(
        *id.as_bytes(),
    ))
}

impl EdgeStore {
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
        let mut dense = EdgeVectorParams::builder(dimension, Distance::Cosine);
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

    fn create_indexes(&self) -> Result<(), StoreError> {
        // Idempotent: an existing index is accepted. Re-issued on every open (a segment created on load
        // may start without indexes).
        let _guard = self.writer.lock().expect("store writer lock");
        for field in KEYWORD_INDEXES {
            let on_disk = self.tuning.indexes_on_disk && ON_DISK_KEYWORD_INDEXES.contains(&field);
            let schema = if field == "tenant" {
                PayloadFieldSchema::FieldParams(PayloadSchemaParams::Keyword(KeywordIndexParams {
                    is_tenant: Some(true),
                    ..KeywordIndexParams::default()
                }))
            } else if on_disk {
                PayloadFieldSchema::FieldParams(PayloadSchemaParams::Keyword(KeywordIndexParams {
                    on_disk: Some(true),
                    ..KeywordIndexParams::default()
                }))
            } else {
                PayloadFieldSchema::FieldType(PayloadSchemaType::Keyword)
            };
            let operation = UpdateOperation::FieldIndexOperation(
                FieldIndexOperations::CreateIndex(CreateIndex {
                    field_name: json_path(field),
                    field_schema: Some(schema),
                }),
            );
            self.shard.update(operation).map_err(engine_error)?;
        }
        Ok(())
    }

    /// The declared metadata keys (a copy: a few entries).
    fn declared(&self) -> BTreeMap<String, MetaIndex> {
        self.declared.lock().map(|d| d.clone()).unwrap_or_default()
    }

    fn create_metadata_indexes(&self, keys: &[(String, MetaIndex)]) -> Result<(), StoreError> {
        let _guard = self.writer.lock().expect("store writer lock");
        if let Ok(mut declared) = self.declared.lock() {
            declared.extend(keys.iter().cloned());
        }
        for (key, index) in keys {
            let kind = match index {
                MetaIndex::Keyword => PayloadSchemaType::Keyword,
                MetaIndex::Integer => PayloadSchemaType::Integer,
                MetaIndex::Float => PayloadSchemaType::Float,
                MetaIndex::Bool => PayloadSchemaType::Bool,
                MetaIndex::Datetime => PayloadSchemaType::Datetime,
            };
            let path: JsonPath = format!("metadata.{key}")
                .parse()
                .map_err(|_| StoreError::Invalid(format!("metadata key {key:?}")))?;
            let operation = UpdateOperation::FieldIndexOperation(
                FieldIndexOperations::CreateIndex(CreateIndex {
                    field_name: path,
                    field_schema: Some(PayloadFieldSchema::FieldType(kind)),
                }),
            );
            self.shard.update(operation).map_err(engine_error)?;
        }
        Ok(())
    }

    /// Dense search in one of the [`DenseSearch`] ways (what `bench volume` measures the recall of the
    /// configured search with).
    pub fn search_dense(
        &self,
        vector: &[f32],
        filter: &SearchFilter,
        limit: usize,
        way: DenseSearch,
    ) -> Result<Vec<Hit>, StoreError> {
        let float_only = Some(QuantizationSearchParams {
            ignore: true,
            rescore: None,
            oversampling: None,
        });
        let params = match way {
            DenseSearch::Configured => self.dense_params(limit),
            DenseSearch::FloatHnsw => SearchParams {
                quantization: float_only,
                ..self.dense_params(limit)
            },
            DenseSearch::Exact => SearchParams {
                exact: true,
                quantization: float_only,
                ..SearchParams::default()
            },
        };
        let vector = SearchVector::Dense(vector.to_vec());
        self.query(&vector, filter, limit, None, Some(params))
    }

    fn query(
        &self,
        vector: &SearchVector,
        filter: &SearchFilter,
        limit: usize,
        score_threshold: Option<f32>,
        params: Option<SearchParams>,
    ) -> Result<Vec<Hit>, StoreError> {
        let (query, using) = match vector {
            SearchVector::Dense(dense) => (VectorInternal::Dense(dense.clone()), DENSE_VECTOR),
            SearchVector::Sparse(sparse) => {
                let sparse = qdrant_edge::SparseVector {
                    indices: sparse.indices.clone(),
                    values: sparse.values.clone(),
                };
                (VectorInternal::from(sparse), SPARSE_VECTOR)
            }
        };
        let request = QueryRequest {
            prefetches: vec![],
            query: Some(ScoringQuery::Vector(QueryEnum::Nearest(NamedQuery::new(
                query, using,
            )))),
            filter: engine_filter(filter, &self.declared())?,
            score_threshold: score_threshold
                .map(qdrant_edge::external::ordered_float::OrderedFloat),
            limit,
            offset: 0,
            params,
            with_vector: WithVector::Bool(false),
            with_payload: WithPayloadInterface::Bool(true),
        };
        let points = self.shard.query(request).map_err(engine_error)?;
        Ok(points
            .into_iter()
            .filter_map(|point| {
                let id = uuid_of(&point.id)?;
                let stored = chunk_from_payload(id, &point.payload.as_ref()?.0)?;
                Some(Hit {
                    stored,
                    score: point.score,
                })
            })
            .collect())
    }

    /// Search parameters of the dense lane: the beam width, and int8 candidates re-scored with the
    /// float originals.
    fn dense_params(&self, limit: usize) -> SearchParams {
        SearchParams {
            hnsw_ef: Some(self.tuning.ef_for(limit)),
            quantization: self.tuning.quantized.then_some(QuantizationSearchParams {
                ignore: false,
                rescore: Some(true),
                oversampling: Some(IndexTuning::OVERSAMPLING),
            }),
            ..SearchParams::default()
        }
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
            if let (Some(id), Some(payload)) = (uuid_of(&record.id), record.payload.as_ref()) {
                found = chunk_from_payload(id, &payload.0);
            }
        }
        check_compatible(found.as_ref(), self.dimension, embedder_version, dimension)
    }

    fn upsert(&self, points: &[PointWrite]) -> Result<(), StoreError> {
        if points.is_empty() {
            return Ok(());
        }
        let mut list = Vec::with_capacity(points.len());
        for point in points {
            if point.dense.len() != self.dimension {
                return Err(StoreError::Invalid(format!(
                    "vector of dimension {} for a {}-d index",
                    point.dense.len(),
                    self.dimension
                )));
            }
            let sparse =
                Vector::new_sparse(point.sparse.indices.clone(), point.sparse.values.clone())
                    .map_err(engine_error)?;
            let mut named = vec![
                (DENSE_VECTOR, Vector::new_dense(point.dense.clone())),
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
        let _guard = self.writer.lock().expect("store writer lock");
        self.shard
            .update(UpdateOperation::PointOperation(
                PointOperations::UpsertPoints(PointInsertOperations::PointsList(list)),
            ))
            .map_err(engine_error)
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
                if let (Some(id), Some(payload)) = (uuid_of(&record.id), record.payload.as_ref()) {
                    if let Some(stored) = chunk_from_payload(id, &payload.0) {
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
            .filter_map(|record| chunk_from_payload(uuid_of(&record.id)?, &record.payload?.0))
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
            .filter_map(|record| {
                let id = uuid_of(&record.id)?;
                let VectorStructInternal::Named(mut vectors) = record.vector? else {
                    return None;
                };
                let VectorInternal::Dense(dense) = vectors.remove(DENSE_VECTOR)? else {
                    return None;
                };
                let evidence = match vectors.remove(EVIDENCE_VECTOR) {
                    Some(VectorInternal::MultiDense(multi)) => {
                        multi.multi_vectors().map(<[f32]>::to_vec).collect()
                    }
                    _ => Vec::new(),
                };
                Some((id, StoredVectors { dense, evidence }))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests;
