//! Qdrant server backend: a collection on a Qdrant server, through qdrant-client (gRPC).
//!
//! The client is async; the store owns a current-thread tokio runtime and blocks on every call, so it
//! implements the synchronous [`VectorStore`] like the embedded backend.
//!
//! Semantics mirror [`super::edge::EdgeStore`]: the same collection layout, the same filters (tenant
//! `must`; kinds and doc ids any-of; ACL as "empty or any of the labels"), scroll in id order with the
//! payload only, exact counts.
//!
//! Durability: every write is sent with `wait=true`, so the server has applied it (and written it to
//! its WAL, which it replays after a crash) before the call returns. [`VectorStore::flush`] therefore
//! has nothing left to do.
//!
//! Errors: transport failures, the 5xx-like gRPC statuses (the server could not serve the request
//! now), a refused API key and a missing collection are [`StoreError::Unavailable`] and retried by the
//! caller, which commits nothing meanwhile; what is left (a bad request) is [`StoreError::Invalid`].

use std::time::Duration;

use qdrant_client::qdrant::vectors_config::Config as VectorsConfigKind;
use qdrant_client::qdrant::{
    CountPointsBuilder, CreateCollectionBuilder, CreateFieldIndexCollectionBuilder, Datatype,
    DeleteCollectionBuilder, DeletePointsBuilder, Distance, FieldType, GetPointsBuilder,
    HnswConfigDiffBuilder, KeywordIndexParamsBuilder, Modifier, MultiVectorComparator,
    MultiVectorConfigBuilder, NamedVectors, PayloadIncludeSelector, PointId, PointStruct,
    QuantizationType, ScalarQuantizationBuilder, ScrollPointsBuilder, SparseIndexConfigBuilder,
    SparseVectorParamsBuilder, SparseVectorsConfigBuilder, UpsertPointsBuilder, Vector,
    VectorParamsBuilder, VectorsConfigBuilder,
};
use qdrant_client::Qdrant;
use ragstream_core::metadata::MetaIndex;

use super::{
    check_compatible, check_dimensions, chunk_payload, DenseDistance, Hit, IndexTuning, LaneHits,
    LaneQuery, PointWrite, SearchFilter, SearchVector, StoreError, StoredChunk, StoredVectors,
    VectorStore, DENSE_VECTOR, EVIDENCE_VECTOR, KEYWORD_INDEXES, ON_DISK_KEYWORD_INDEXES,
    SPARSE_VECTOR,
};
use crate::model::DocKey;
use crate::outage::{Backoff, Dependency, GaveUp, Retry};

mod convert;
mod read;
mod write;
use convert::*;
use read::{stored_vectors, unit_count};
use write::server_distance;

/// Points per scroll page.
const SCROLL_PAGE: u32 = 512;

/// The payload field of a point written into a collection with evidence units: how many units it
/// has (0: the multi-vector holds the point's own dense vector in their place). Absent from points
/// written before it, whose multi-vector, where they have one, holds real units.
const UNITS_FIELD: &str = "units";

/// Deadline of one gRPC request. Writes wait for the server to apply them, so this is longer than
/// the client's default (5 s); a request past it fails as [`StoreError::Unavailable`] and is retried
/// (writes are idempotent).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// How long connecting waits out a server that does not answer yet (one still starting, or another
/// instance creating the same collection) before the job gives up.
const CONNECT_PATIENCE: Duration = Duration::from_secs(90);

/// A collection on a Qdrant server.
pub struct ServerStore {
    client: Qdrant,
    runtime: tokio::runtime::Runtime,
    url: String,
    has_api_key: bool,
    collection: String,
    dimension: usize,
    tuning: IndexTuning,
    /// The collection's sparse vector has the server's IDF modifier (as this store creates it): the
    /// server computes IDF over the whole collection, which every job instance shares. Set by
    /// `ensure_collection`.
    engine_idf: std::sync::atomic::AtomicBool,
    /// Whether the collection has the evidence multi-vector (collections created before it do not).
    /// Set by `ensure_collection`.
    evidence: std::sync::atomic::AtomicBool,
    /// The declared metadata keys' index types ([`VectorStore::index_metadata`]).
    declared: std::sync::Mutex<std::collections::BTreeMap<String, MetaIndex>>,
    /// Writes of this process share it; `replace_current` holds it alone between its check and
    /// its write.
    writes: std::sync::RwLock<()>,
}

impl std::fmt::Debug for ServerStore {
    // By hand: the client's configuration holds the API key, which must never reach a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerStore")
            .field("url", &self.url)
            .field(
                "api_key",
                &if self.has_api_key {
                    "<redacted>"
                } else {
                    "<none>"
                },
            )
            .field("collection", &self.collection)
            .field("dimension", &self.dimension)
            .finish()
    }
}

impl ServerStore {
    /// Connects to the Qdrant server at `url` (gRPC, e.g. `http://localhost:6334`) and opens
    /// `collection`, creating it (with payload indexes) if missing. A server that is unavailable
    /// is tried again, with a growing wait, for up to [`CONNECT_PATIENCE`].
    ///
    /// Fails with [`StoreError::EmbedderMismatch`] if the collection holds dense vectors of another
    /// dimension.
    pub fn connect(
        url: &str,
        api_key: Option<String>,
        collection: &str,
        dimension: usize,
        tuning: IndexTuning,
    ) -> Result<Self, StoreError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                StoreError::Unavailable(format!("starting the Qdrant client runtime: {e}"))
            })?;
        let has_api_key = api_key.is_some();
        let mut config = Qdrant::from_url(url)
            .skip_compatibility_check()
            .timeout(REQUEST_TIMEOUT);
        if let Some(key) = api_key {
            config = config.api_key(key);
        }
        let client = config.build().map_err(store_error)?;
        let store = Self {
            client,
            runtime,
            url: url.to_string(),
            has_api_key,
            collection: collection.to_string(),
            dimension,
            tuning,
            engine_idf: std::sync::atomic::AtomicBool::new(false),
            evidence: std::sync::atomic::AtomicBool::new(false),
            declared: Default::default(),
            writes: std::sync::RwLock::new(()),
        };
        // Waiting for the server shows as an index outage (`/readyz`, `ragstream_outage`) and logs
        // each retry.
        Retry::new(Dependency::Index)
            .waits(Backoff::new(Backoff::FIRST, Duration::from_secs(5)))
            .within(CONNECT_PATIENCE)
            .run(StoreError::is_retryable, || {
                let result = store.ensure_collection();
                if let Err(StoreError::Unavailable(error)) = &result {
                    tracing::warn!(url, collection, %error, "waiting for the Qdrant server");
                }
                result
            })
            .map_err(GaveUp::into_error)?;
        Ok(store)
    }

    /// The collection name.
    pub fn collection(&self) -> &str {
        &self.collection
    }

    /// Deletes the whole collection (tests and explicit re-indexing only).
    pub fn delete_collection(&self) -> Result<(), StoreError> {
        self.runtime
            .block_on(
                self.client
                    .delete_collection(DeleteCollectionBuilder::new(&self.collection)),
            )
            .map(|_| ())
            .map_err(store_error)
    }

    fn ensure_collection(&self) -> Result<(), StoreError> {
        let exists = self
            .runtime
            .block_on(self.client.collection_exists(&self.collection))
            .map_err(store_error)?;
        if !exists {
            let mut vectors = VectorsConfigBuilder::default();
            let mut dense =
                VectorParamsBuilder::new(self.dimension as u64, server_distance(&self.tuning));
            if self.tuning.quantized {
                dense = dense.on_disk(true).quantization_config(
                    ScalarQuantizationBuilder::default()
                        .r#type(QuantizationType::Int8.into())
                        .quantile(IndexTuning::INT8_QUANTILE)
                        .always_ram(true),
                );
            }
            vectors.add_named_vector_params(DENSE_VECTOR, dense);
            // The evidence units: compared by the rerank, never searched (no HNSW graph).
            vectors.add_named_vector_params(
                EVIDENCE_VECTOR,
                VectorParamsBuilder::new(self.dimension as u64, Distance::Cosine)
                    .multivector_config(MultiVectorConfigBuilder::new(
                        MultiVectorComparator::MaxSim,
                    ))
                    .datatype(Datatype::Float16)
                    .hnsw_config(HnswConfigDiffBuilder::default().m(0)),
            );
            let mut sparse = SparseVectorsConfigBuilder::default();
            sparse.add_named_vector_params(
                SPARSE_VECTOR,
                SparseVectorParamsBuilder::default()
                    .modifier(Modifier::Idf)
                    .index(
                        SparseIndexConfigBuilder::default().on_disk(self.tuning.indexes_on_disk),
                    ),
            );
            let mut hnsw = HnswConfigDiffBuilder::default()
                .m(self.tuning.m as u64)
                .ef_construct(self.tuning.ef_construct as u64);
            if self.tuning.indexing_threads > 0 {
                hnsw = hnsw.max_indexing_threads(self.tuning.indexing_threads as u64);
            }
            let request = CreateCollectionBuilder::new(&self.collection)
                .hnsw_config(hnsw)
                .vectors_config(vectors)
                .sparse_vectors_config(sparse);
            match self
                .runtime
                .block_on(self.client.create_collection(request))
            {
                Ok(_) => {}
                // Another process created it between the check and the create: checked below.
                Err(error) if already_exists(&error) => {}
                Err(error) => return Err(store_error(error)),
            }
        }
        let (found, engine_idf, evidence, distance) = self.collection_params()?;
        if found.is_some() && distance != Some(server_distance(&self.tuning) as i32) {
            return Err(StoreError::Invalid(format!(
                "the collection {} holds dense vectors of distance {:?}; index.tuning.distance is {}: use a new collection to change it",
                self.collection,
                distance.and_then(|d| Distance::try_from(d).ok()),
                self.tuning.distance.as_str()
            )));
        }
        if !evidence {
            tracing::warn!(
                collection = %self.collection,
                "the collection has no evidence vectors: the rerank's sentence evidence falls back to each chunk's own vector (recreate the collection)"
            );
        }
        self.evidence
            .store(evidence, std::sync::atomic::Ordering::Relaxed);
        if !engine_idf {
            tracing::warn!(
                collection = %self.collection,
                "the collection's sparse vector has no IDF modifier: BM25 scores are term weights only (recreate the collection)"
            );
        }
        self.engine_idf
            .store(engine_idf, std::sync::atomic::Ordering::Relaxed);
        if found != Some(self.dimension) {
            return Err(StoreError::EmbedderMismatch {
                found: "(existing index)".into(),
                found_dimension: found.unwrap_or(0),
                expected: "(this job)".into(),
                expected_dimension: self.dimension,
            });
        }
        self.create_indexes()
    }

    /// Keyword payload indexes, `tenant` as the tenant index. Idempotent: re-issued on every connect
    /// (the server accepts an identical index again); an "already exists" refusal is accepted too.
    fn create_indexes(&self) -> Result<(), StoreError> {
        for field in KEYWORD_INDEXES {
            let mut request =
                CreateFieldIndexCollectionBuilder::new(&self.collection, field, FieldType::Keyword)
                    .wait(true);
            if field == "tenant" {
                request = request
                    .field_index_params(KeywordIndexParamsBuilder::default().is_tenant(true));
            } else if self.tuning.indexes_on_disk && ON_DISK_KEYWORD_INDEXES.contains(&field) {
                request =
                    request.field_index_params(KeywordIndexParamsBuilder::default().on_disk(true));
            }
            self.create_index(request)?;
        }
        Ok(())
    }

    /// Creates one payload index; one already there is accepted.
    fn create_index(&self, request: CreateFieldIndexCollectionBuilder) -> Result<(), StoreError> {
        match self
            .runtime
            .block_on(self.client.create_field_index(request))
        {
            Ok(_) => Ok(()),
            Err(error) if already_exists(&error) => Ok(()),
            Err(error) => Err(store_error(error)),
        }
    }

    /// The declared metadata keys (a copy: a few entries).
    fn declared(&self) -> std::collections::BTreeMap<String, MetaIndex> {
        self.declared.lock().map(|d| d.clone()).unwrap_or_default()
    }

    fn create_metadata_indexes(&self, keys: &[(String, MetaIndex)]) -> Result<(), StoreError> {
        if let Ok(mut declared) = self.declared.lock() {
            declared.extend(keys.iter().cloned());
        }
        for (key, index) in keys {
            let kind = match index {
                MetaIndex::Keyword => FieldType::Keyword,
                MetaIndex::Integer => FieldType::Integer,
                MetaIndex::Float => FieldType::Float,
                MetaIndex::Bool => FieldType::Bool,
                MetaIndex::Datetime => FieldType::Datetime,
            };
            let request = CreateFieldIndexCollectionBuilder::new(
                &self.collection,
                format!("metadata.{key}"),
                kind,
            )
            .wait(true);
            self.create_index(request)?;
        }
        Ok(())
    }

    /// The collection's dense dimension (`None` if it has no dense vector), whether its sparse vector
    /// has the IDF modifier, whether it has the evidence multi-vector, and the dense distance.
    #[allow(clippy::type_complexity)]
    fn collection_params(&self) -> Result<(Option<usize>, bool, bool, Option<i32>), StoreError> {
        let info = self
            .runtime
            .block_on(self.client.collection_info(&self.collection))
            .map_err(store_error)?;
        let params = info
            .result
            .and_then(|info| info.config)
            .and_then(|config| config.params);
        let engine_idf = params
            .as_ref()
            .and_then(|params| params.sparse_vectors_config.as_ref())
            .and_then(|sparse| sparse.map.get(SPARSE_VECTOR))
            .is_some_and(|params| params.modifier == Some(Modifier::Idf as i32));
        let config = params
            .and_then(|params| params.vectors_config)
            .and_then(|vectors| vectors.config);
        let (dimension, evidence, distance) = match config {
            Some(VectorsConfigKind::ParamsMap(map)) => (
                map.map.get(DENSE_VECTOR).map(|params| params.size as usize),
                map.map.contains_key(EVIDENCE_VECTOR),
                map.map.get(DENSE_VECTOR).map(|params| params.distance),
            ),
            _ => (None, false, None),
        };
        Ok((dimension, engine_idf, evidence, distance))
    }
}

impl VectorStore for ServerStore {
    fn backend(&self) -> &'static str {
        "server"
    }

    fn index_metadata(&self, keys: &[(String, MetaIndex)]) -> Result<(), StoreError> {
        self.create_metadata_indexes(keys)
    }

    fn engine_idf(&self) -> bool {
        self.engine_idf.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn check_embedder(&self, embedder_version: &str, dimension: usize) -> Result<(), StoreError> {
        let page = self
            .runtime
            .block_on(
                self.client.scroll(
                    ScrollPointsBuilder::new(&self.collection)
                        .limit(1)
                        .with_payload(true)
                        .with_vectors(false),
                ),
            )
            .map_err(store_error)?;
        let found = page
            .result
            .into_iter()
            .next()
            .and_then(|point| stored_chunk(point.id.as_ref(), point.payload));
        let found_dimension = self.collection_params()?.0.unwrap_or(0);
        check_compatible(found.as_ref(), found_dimension, embedder_version, dimension)
    }

    fn upsert(&self, points: &[PointWrite]) -> Result<(), StoreError> {
        let _shared = self.writes.read().unwrap_or_else(|e| e.into_inner());
        self.upsert_held(points)
    }

    fn replace_current(&self, points: &[PointWrite]) -> Result<usize, StoreError> {
        let _alone = self.writes.write().unwrap_or_else(|e| e.into_inner());
        let current = super::still_current(self, points)?;
        self.upsert_held(&current)?;
        Ok(current.len())
    }

    fn delete(&self, ids: &[uuid::Uuid]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let _shared = self.writes.read().unwrap_or_else(|e| e.into_inner());
        let ids: Vec<PointId> = ids.iter().map(|id| point_id(*id)).collect();
        self.runtime
            .block_on(
                self.client.delete_points(
                    DeletePointsBuilder::new(&self.collection)
                        .points(ids)
                        .wait(true),
                ),
            )
            .map(|_| ())
            .map_err(store_error)
    }

    fn flush(&self) -> Result<(), StoreError> {
        // Nothing to do: every write was sent with `wait=true`, so it returned only after the server
        // had written it to its WAL and applied it; the server replays its WAL after a crash, so those
        // writes are already durable. (Unlike qdrant-edge 0.7.2, which does not replay its WAL.)
        Ok(())
    }

    fn scroll(
        &self,
        filter: &SearchFilter,
        visit: &mut dyn FnMut(StoredChunk),
    ) -> Result<(), StoreError> {
        let filter = server_filter(filter, &self.declared())?;
        self.scroll_where(filter, visit)
    }

    fn neighbours(
        &self,
        key: &DocKey,
        order: u32,
        radius: u32,
    ) -> Result<Vec<StoredChunk>, StoreError> {
        self.neighbours_in_one(key, order, radius)
    }

    fn count(&self, filter: &SearchFilter) -> Result<usize, StoreError> {
        let mut request = CountPointsBuilder::new(&self.collection).exact(true);
        if let Some(filter) = server_filter(filter, &self.declared())? {
            request = request.filter(filter);
        }
        let response = self
            .runtime
            .block_on(self.client.count(request))
            .map_err(store_error)?;
        Ok(response.result.map_or(0, |result| result.count as usize))
    }

    fn search(
        &self,
        vector: &SearchVector,
        filter: &SearchFilter,
        limit: usize,
        score_threshold: Option<f32>,
    ) -> Result<Vec<Hit>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let filter = server_filter(filter, &self.declared())?;
        let request = self.lane_request(
            vector,
            filter,
            limit,
            score_threshold,
            read::Returns::Payload,
        );
        let dense = matches!(vector, SearchVector::Dense(_));
        let response = self
            .runtime
            .block_on(self.client.query(request))
            .map_err(store_error)?;
        Ok(response
            .result
            .into_iter()
            .filter_map(|mut point| self.hit(&mut point, dense))
            .collect())
    }

    fn search_lanes(
        &self,
        lanes: &LaneQuery,
        filter: &SearchFilter,
    ) -> Result<LaneHits, StoreError> {
        self.lanes_in_one(lanes, filter)
    }

    fn get(&self, ids: &[uuid::Uuid]) -> Result<Vec<StoredChunk>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<PointId> = ids.iter().map(|id| point_id(*id)).collect();
        let request = GetPointsBuilder::new(&self.collection, ids)
            .with_payload(true)
            .with_vectors(false);
        let response = self
            .runtime
            .block_on(self.client.get_points(request))
            .map_err(store_error)?;
        Ok(response
            .result
            .into_iter()
            .filter_map(|point| stored_chunk(point.id.as_ref(), point.payload))
            .collect())
    }

    fn vectors(&self, ids: &[uuid::Uuid]) -> Result<Vec<(uuid::Uuid, StoredVectors)>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<PointId> = ids.iter().map(|id| point_id(*id)).collect();
        let request = GetPointsBuilder::new(&self.collection, ids)
            .with_payload(PayloadIncludeSelector {
                fields: vec![UNITS_FIELD.to_string()],
            })
            .with_vectors(self.vector_selector());
        let response = self
            .runtime
            .block_on(self.client.get_points(request))
            .map_err(store_error)?;
        Ok(response
            .result
            .into_iter()
            .filter_map(|point| {
                let id = uuid_of(point.id.as_ref())?;
                let mut vectors = stored_vectors(point.vectors?)?;
                if unit_count(&point.payload) == Some(0) {
                    // The stand-in for units the point does not have.
                    vectors.evidence.clear();
                }
                Some((id, vectors))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests;
