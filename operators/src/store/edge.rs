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
    HnswIndexConfig, JsonPath, KeywordIndexParams, Match, Modifier, NamedQuery, PayloadFieldSchema,
    PayloadSchemaParams, PayloadSchemaType, PointId, PointInsertOperations, PointOperations,
    PointStruct, QuantizationConfig, QuantizationSearchParams, QueryEnum, QueryRequest,
    ScoringQuery, ScrollRequest, SearchParams, UpdateOperation, Vector, VectorInternal,
    VectorStructInternal, Vectors, WithPayloadInterface, WithVector,
};

use super::{
    check_compatible, chunk_from_payload, chunk_payload, Hit, IndexTuning, PointWrite,
    SearchFilter, SearchVector, StoreError, StoredChunk, VectorStore, DENSE_VECTOR,
    KEYWORD_INDEXES, ON_DISK_KEYWORD_INDEXES, SPARSE_VECTOR,
};

/// Points per scroll page.
const SCROLL_PAGE: usize = 512;

/// Segments a shard's merge optimizer aims at. The engine's default on two cores is 2, so every
/// optimization merged the newly indexed points into the shard's largest segment and rebuilt it: the
/// cost of an optimization grew with the shard and, since writes wait for it, ingest slowed from 1590
/// to 370 chunks/s between 20k and 200k chunks (`bench volume`, BENCHMARKS.md). With 8, segments are
/// merged smallest first once there are more than 8, so a point is rewritten a logarithmic number of
/// times; a search visits at most about 8 indexed segments plus the appendable one.
const SEGMENTS: usize = 8;

fn optimizers() -> EdgeOptimizersConfig {
    EdgeOptimizersConfig {
        default_segment_number: Some(SEGMENTS),
        ..EdgeOptimizersConfig::default()
    }
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
    /// Held by writers (update, flush, optimize); readers take none. See the module docs.
    writer: Mutex<()>,
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

fn engine_error(error: impl std::fmt::Display) -> StoreError {
    StoreError::Invalid(error.to_string())
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

/// The engine filter for a [`SearchFilter`] (see [`SearchFilter::conditions`]).
fn engine_filter(filter: &SearchFilter) -> Option<Filter> {
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
    (!must.is_empty()).then(|| Filter {
        must: Some(must),
        ..Filter::default()
    })
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
            let quantized = found.is_some_and(|v| v.quantization_config.is_some());
            if quantized != tuning.quantized {
                tracing::warn!(
                    shard = %path.display(),
                    quantized,
                    "index.tuning.quantized differs from the shard's; the shard keeps its own (rebuild the index to change it)"
                );
            }
        }
        let store = Self {
            shard,
            path: path.to_path_buf(),
            dimension,
            tuning,
            writer: Mutex::new(()),
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
            filter: engine_filter(filter),
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
            let vectors = Vectors::new_named([
                (DENSE_VECTOR, Vector::new_dense(point.dense.clone())),
                (SPARSE_VECTOR, sparse),
            ]);
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
        let filter = engine_filter(filter);
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
                filter: engine_filter(filter),
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

    fn dense_vectors(&self, ids: &[uuid::Uuid]) -> Result<Vec<(uuid::Uuid, Vec<f32>)>, StoreError> {
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
                match record.vector? {
                    VectorStructInternal::Named(mut vectors) => {
                        match vectors.remove(DENSE_VECTOR)? {
                            VectorInternal::Dense(dense) => Some((id, dense)),
                            _ => None,
                        }
                    }
                    _ => None,
                }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::bm25::Bm25Encoder;

    #[test]
    fn edge_store_passes_the_contract() {
        let dir = tempfile::tempdir().expect("tempdir");
        let open =
            |path: &Path| EdgeStore::open(path, super::super::contract::DIMENSION).expect("open");
        super::super::contract::run(&|| Box::new(open(dir.path())) as Box<dyn VectorStore>);
    }

    /// A shard created with the engine's per-shard IDF (before the corpus-wide statistics) says so,
    /// and is searched with the engine's IDF still; a new shard stores plain BM25 weights.
    #[test]
    fn shards_with_the_engine_idf_are_recognised() {
        let dir = tempfile::tempdir().expect("tempdir");
        let legacy = dir.path().join("legacy");
        let config = EdgeConfig::builder()
            .vector(
                DENSE_VECTOR,
                EdgeVectorParams::builder(4, Distance::Cosine).build(),
            )
            .sparse_vector(
                SPARSE_VECTOR,
                EdgeSparseVectorParams::builder()
                    .modifier(Modifier::Idf)
                    .build(),
            )
            .build();
        std::fs::create_dir_all(&legacy).expect("dir");
        drop(EdgeShard::new(&legacy, config).expect("legacy shard"));
        assert!(EdgeStore::open(&legacy, 4).expect("open").engine_idf());
        let fresh = EdgeStore::open(&dir.path().join("fresh"), 4).expect("open");
        assert!(!VectorStore::engine_idf(&fresh));
    }

    /// Points of a shard large enough for the optimizer to build HNSW graphs and int8 vectors (the
    /// engine indexes segments above 10 MB of vectors).
    const POINTS: usize = 8000;
    const DIMENSION: usize = 384;

    /// Uniform values in [-0.5, 0.5), the same sequence on every run.
    fn xorshift() -> impl FnMut() -> f32 {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        }
    }

    /// [`POINTS`] points of tenant `t` with random vectors and texts of three words from a small
    /// vocabulary (so BM25 searches have many matches with different scores).
    fn random_points(random: &mut impl FnMut() -> f32) -> Vec<PointWrite> {
        (0..POINTS)
            .map(|i| {
                let text = format!("w{} w{} w{}", i % 97, i % 89, i % 13);
                let mut point =
                    super::super::contract::sample_point("t", &format!("doc{i}"), 1, &text, &[]);
                point.dense = (0..DIMENSION).map(|_| random()).collect();
                point
            })
            .collect()
    }

    /// A shard at `path` holding `points`, optimized (its segments indexed).
    fn optimized_shard(path: &Path, tuning: IndexTuning, points: &[PointWrite]) -> EdgeStore {
        let store = EdgeStore::open_tuned(path, DIMENSION, tuning).expect("open");
        for batch in points.chunks(1000) {
            store.upsert(batch).expect("upsert");
        }
        assert!(store.optimize().expect("optimize"), "the optimizer ran");
        assert!(
            store.shard.info().indexed_vectors_count > 0,
            "segments were indexed"
        );
        store
    }

    /// The `index_type` of every sparse index the engine built under `dir`.
    fn sparse_index_types(dir: &Path) -> Vec<String> {
        let mut types = Vec::new();
        for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                types.extend(sparse_index_types(&path));
            } else if path
                .file_name()
                .is_some_and(|name| name == "sparse_index_config.json")
            {
                let config: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
                types.push(config["index_type"].as_str().unwrap_or("?").to_string());
            }
        }
        types
    }

    /// `indexes_on_disk` moves the optimized segments' BM25 index to memory-mapped files, and
    /// searches through it (BM25, document filters) answer exactly as with the index in RAM.
    #[test]
    fn indexes_on_disk_answer_as_indexes_in_ram() {
        let points = random_points(&mut xorshift());
        let dirs = [
            tempfile::tempdir().expect("tempdir"),
            tempfile::tempdir().expect("tempdir"),
        ];
        let [on_disk, in_ram] = [true, false].map(|indexes_on_disk| {
            let tuning = IndexTuning {
                indexes_on_disk,
                ..IndexTuning::default()
            };
            optimized_shard(dirs[usize::from(!indexes_on_disk)].path(), tuning, &points)
        });
        let types = sparse_index_types(dirs[0].path());
        assert!(types.iter().any(|t| t == "Mmap"), "{types:?}");
        assert!(!types.iter().any(|t| t == "ImmutableRam"), "{types:?}");
        let types = sparse_index_types(dirs[1].path());
        assert!(types.iter().any(|t| t == "ImmutableRam"), "{types:?}");
        let encoder = Bm25Encoder::default();
        for (text, doc_ids) in [
            ("w5 w17", vec![]),
            ("w3 w40 w7", vec![]),
            ("w5", (0..400).map(|i| format!("doc{}", i * 7)).collect()),
        ] {
            let filter = SearchFilter {
                tenant: Some("t".into()),
                doc_ids,
                ..SearchFilter::default()
            };
            let query = SearchVector::Sparse(encoder.encode_query(text));
            let [disk, ram] = [&on_disk, &in_ram].map(|store| {
                store
                    .search(&query, &filter, 20, None)
                    .expect("search")
                    .into_iter()
                    .map(|hit| (hit.stored.key.doc_id, hit.score))
                    .collect::<Vec<_>>()
            });
            assert!(!disk.is_empty(), "{text}: BM25 finds matches");
            assert_eq!(disk, ram, "{text}");
        }
    }

    /// An optimized shard with int8 vectors: a search finds the point a query is next to, and
    /// every score is the float vectors' cosine, not the int8 estimate.
    #[test]
    fn quantised_search_is_rescored_with_the_float_vectors() {
        let mut random = xorshift();
        let points = random_points(&mut random);
        let dir = tempfile::tempdir().expect("tempdir");
        let store = optimized_shard(dir.path(), IndexTuning::default(), &points);
        let filter = SearchFilter {
            tenant: Some("t".into()),
            ..SearchFilter::default()
        };
        let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        let cosine = |a: &[f32], b: &[f32]| {
            a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>() / (norm(a) * norm(b))
        };
        for j in (0..POINTS).step_by(POINTS / 20) {
            // Near one stored point: it must come first, found through the int8 graph search.
            let query: Vec<f32> = points[j]
                .dense
                .iter()
                .map(|x| x + 0.02 * random())
                .collect();
            let hits = store
                .search(&SearchVector::Dense(query.clone()), &filter, 10, None)
                .expect("search");
            assert_eq!(hits.len(), 10);
            assert_eq!(hits[0].stored.key.doc_id, format!("doc{j}"));
            for hit in &hits {
                let index: usize = hit.stored.key.doc_id[3..].parse().expect("doc id");
                let float = cosine(&query, &points[index].dense);
                assert!(
                    (hit.score - float).abs() < 1e-4,
                    "score {} is the float vectors' {float}",
                    hit.score
                );
            }
        }
    }
}
