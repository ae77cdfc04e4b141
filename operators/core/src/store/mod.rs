//! The vector index's contract: one [`VectorStore`] trait, its records, the BM25 encoder and the
//! corpus statistics. The two backends live in `ragstream-operators` (`store::edge`: qdrant-edge, the
//! Qdrant engine in-process, the embedded default; `store::server`: a Qdrant server through
//! qdrant-client, production).
//!
//! Both hold the same collection layout: a named dense vector `dense` (cosine, the embedder's dimension)
//! and a sparse vector `bm25` of BM25 term weights (IDF: the query vector's from [`stats`] on the embedded
//! index, the server's IDF modifier over the one shared collection on the server); keyword payload indexes on `tenant` (as the tenant
//! index), `doc_id`, `source`, `kind`, `acl`. Point ids are deterministic ([`crate::model::point_id`]), so
//! every write is idempotent. Tenant and ACL filters are part of every search request and are evaluated
//! by the engine inside the vector search, never after it.
//!
//! Durability contract: after [`VectorStore::flush`] returns `Ok`, every earlier write survives a crash
//! of the process. The dataflow acknowledges (and Kafka offsets advance) only after a flush.

pub mod bm25;
pub mod lanes;
mod payload;
pub mod reindex;
pub mod stats;

use serde_json::{json, Map, Value};

use crate::model::{Chunk, DocKey, DocKind};

pub use bm25::{Bm25Encoder, Bm25Params, Bm25Variant, SparseVector};
pub use lanes::{Lane, LaneHits, LaneQuery, Pool};
pub use payload::{chunk_from_payload, chunk_payload};
pub use reindex::still_current;

/// Name of the dense vector in the collection.
pub const DENSE_VECTOR: &str = "dense";
/// Name of the sparse BM25 vector in the collection.
pub const SPARSE_VECTOR: &str = "bm25";
/// Name of the multi-vector of a chunk's evidence units ([`Chunk::evidence_units`]): one dense vector
/// per sentence, never searched (no HNSW graph), read back for the rerank's sentence evidence.
pub const EVIDENCE_VECTOR: &str = "sentences";
/// Keyword payload fields with an index (tenant is the tenant index).
pub const KEYWORD_INDEXES: [&str; 7] = [
    "tenant",
    "doc_id",
    "source",
    "source_prefixes",
    "kind",
    "acl",
    "lang",
];

/// Keyword indexes with about one value per document (many values, each on few points): memory-mapped
/// when [`IndexTuning::indexes_on_disk`]. The others (tenant, kind, ACL) have few values and stay in RAM.
pub const ON_DISK_KEYWORD_INDEXES: [&str; 3] = ["doc_id", "source", "source_prefixes"];

/// How a backend builds and searches its dense index (config section `index.tuning`).
///
/// The defaults are chosen by `bench volume` at 200k and 1M chunks on two cores (BENCHMARKS.md,
/// "Volume at one million chunks").
/// The embedded index applies the HNSW settings to existing shards too; a Qdrant server collection
/// takes all of them when it is created, and the search beam and re-scoring on every search.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct IndexTuning {
    /// HNSW edges per node.
    pub m: usize,
    /// HNSW beam width while building.
    pub ef_construct: usize,
    /// HNSW beam width while searching (raised to the request's limit when that is larger).
    pub ef: usize,
    /// Dense vectors also kept as int8 (scalar quantisation, in RAM) and searched with those; the
    /// float originals move to disk (memory-mapped) and re-score the best candidates, so the ranking
    /// is the originals'. `false` keeps only the float vectors, in RAM.
    pub quantized: bool,
    /// Threads one optimization (HNSW build, merge) may use; 0 = every core but one, at least one, so
    /// an optimization never takes the core the dataflow worker answers queries on (a Qdrant server
    /// runs on its own machine: it takes a non-zero value, and its own default for 0).
    pub indexing_threads: usize,
    /// The BM25 lane's inverted index and the keyword indexes with a value per document
    /// ([`ON_DISK_KEYWORD_INDEXES`]) are memory-mapped from disk instead of held in RAM: the kernel
    /// keeps the pages searches touch and can drop the rest. `false` holds them in RAM.
    pub indexes_on_disk: bool,
    /// Points written (upserted or deleted) to an embedded shard between two optimizations. Points
    /// written since the last optimization sit in the shard's appendable segment, which searches scan
    /// point by point; an optimization indexes them (and merges segments). A Qdrant server optimizes
    /// on its own and ignores it.
    pub optimize_every: usize,
    /// Milliseconds an embedded shard's writer waits, with no new batch, after a write before it
    /// optimizes what was written since its last optimization, so that an index at rest is searched
    /// through indexed segments; 0: only every `optimize_every` points. A Qdrant server ignores it.
    #[serde(with = "crate::duration::millis")]
    pub optimize_idle_ms: std::time::Duration,
    /// The dense lane's distance: `cosine`, `dot` or `l2`. Fixed when the index is created (a shard
    /// or collection of another distance is refused). With `dot` and `l2` the job stores and searches
    /// unit-length vectors, so the three rank alike, and scores are reported as cosines whichever it
    /// is (`score_threshold` too is a cosine): the setting lets the job create, or join, a collection
    /// of that distance.
    pub distance: DenseDistance,
}

/// The dense vectors' distance in the index (`[index.tuning] distance`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DenseDistance {
    /// Cosine similarity (the engine normalises the vectors).
    #[default]
    Cosine,
    /// Dot product of unit vectors (equal to their cosine).
    Dot,
    /// Euclidean distance `d` of unit vectors (`cos = 1 − d²/2`).
    L2,
}

impl DenseDistance {
    /// The name in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cosine => "cosine",
            Self::Dot => "dot",
            Self::L2 => "l2",
        }
    }

    /// The vector as the index stores and searches it: unit length for `dot` and `l2`, as given for
    /// `cosine` (the engine normalises). A zero vector stays zero.
    pub fn prepare(self, vector: &[f32]) -> Vec<f32> {
        if self == Self::Cosine {
            return vector.to_vec();
        }
        let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
        if norm > 0.0 && norm.is_finite() {
            vector.iter().map(|x| x / norm).collect()
        } else {
            vector.to_vec()
        }
    }

    /// The engine's score of a dense hit as a cosine.
    pub fn to_cosine(self, score: f32) -> f32 {
        match self {
            Self::Cosine | Self::Dot => score,
            Self::L2 => 1.0 - score * score / 2.0,
        }
    }

    /// A cosine threshold as the engine's: the largest distance allowed for `l2`.
    pub fn engine_threshold(self, cosine: f32) -> f32 {
        match self {
            Self::Cosine | Self::Dot => cosine,
            Self::L2 => (2.0 - 2.0 * cosine.clamp(-1.0, 1.0)).sqrt(),
        }
    }
}

impl Default for IndexTuning {
    fn default() -> Self {
        Self {
            m: 16,
            ef_construct: 100,
            ef: 100,
            quantized: true,
            indexing_threads: 0,
            indexes_on_disk: true,
            optimize_every: 20_000,
            optimize_idle_ms: std::time::Duration::from_secs(2),
            distance: DenseDistance::Cosine,
        }
    }
}

impl IndexTuning {
    /// Candidates pre-selected with the int8 vectors per result, re-scored with the originals.
    pub const OVERSAMPLING: f64 = 2.0;
    /// Share of each vector component's values the int8 range covers (the rest are clipped).
    pub const INT8_QUANTILE: f32 = 0.99;

    /// The beam width for a search of `limit` results.
    pub fn ef_for(&self, limit: usize) -> usize {
        self.ef.max(limit)
    }

    /// How long an embedded shard's writer waits idle before it optimizes (`None`: it does not).
    pub fn optimize_when_idle(&self) -> Option<std::time::Duration> {
        (!self.optimize_idle_ms.is_zero()).then_some(self.optimize_idle_ms)
    }

    /// Indexing threads with 0 resolved against this machine's cores.
    pub fn threads(&self) -> usize {
        match self.indexing_threads {
            0 => std::thread::available_parallelism()
                .map_or(1, |cores| cores.get().saturating_sub(1))
                .max(1),
            threads => threads,
        }
    }
}

/// Why an index operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The index is unreachable or failed transiently: retry with backoff, never drop.
    #[error("index unavailable: {0}")]
    Unavailable(String),
    /// The collection holds vectors of another embedder or dimension.
    #[error("the index holds vectors of embedder {found} (dimension {found_dimension}); this job embeds with {expected} (dimension {expected_dimension}); re-embed to switch")]
    EmbedderMismatch {
        /// Embedder version found in the index.
        found: String,
        /// Its dimension.
        found_dimension: usize,
        /// Embedder version of this job.
        expected: String,
        /// Its dimension.
        expected_dimension: usize,
    },
    /// A request the engine refused (a bug or a bad filter): not retryable.
    #[error("index refused the operation: {0}")]
    Invalid(String),
    /// The collection no longer exists (deleted under the running job): nothing may be written
    /// around it, the job stops (and creates it again at its next start).
    #[error("the index collection is gone: {0}")]
    Gone(String),
}

impl StoreError {
    /// Whether the failure is an outage, retried with backoff (never dropped): only
    /// [`StoreError::Unavailable`]; every other error is an answer retrying would not change.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

/// One point to write: a chunk of a document, its vectors and versions.
#[derive(Debug, Clone)]
pub struct PointWrite {
    /// The point id ([`Chunk::point_id`] for a new chunk, the stored id for a rewrite).
    pub id: uuid::Uuid,
    /// The document.
    pub key: DocKey,
    /// The document version that produced the chunk.
    pub version: u64,
    /// The chunk.
    pub chunk: Chunk,
    /// Dense embedding.
    pub dense: Vec<f32>,
    /// Dense embeddings of the chunk's evidence units, in their order (empty: none, or not embedded).
    pub evidence: Vec<Vec<f32>>,
    /// BM25 document vector.
    pub sparse: SparseVector,
    /// Embedder version of `dense`.
    pub embedder_version: String,
}

/// The vectors a point holds.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StoredVectors {
    /// The chunk's dense vector.
    pub dense: Vec<f32>,
    /// Its evidence units' vectors.
    pub evidence: Vec<Vec<f32>>,
}

impl StoredVectors {
    /// The sentence evidence for the query vector `query`: the highest cosine between it and one of
    /// the chunk's evidence units, or the chunk's own cosine where it has none. (Taking the chunk's
    /// own vector into the maximum counts the dense lane twice: on CoSQA the rerank then gained 0.0077
    /// less nDCG@10 in an offline replay, docs/decisions/0024-sentence-evidence.md.)
    pub fn evidence_score(&self, query: &[f32]) -> f32 {
        unit_evidence(query, self.evidence.iter().map(Vec::as_slice))
            .unwrap_or_else(|| crate::embed::cosine(query, &self.dense))
    }
}

/// The highest cosine between `query` and one of a chunk's evidence `units`; `None` without units
/// (the chunk's own cosine stands in: [`StoredVectors::evidence_score`]). Backends that hold the
/// units where they lie score them with this, without copying them out.
pub fn unit_evidence<'a>(query: &[f32], units: impl IntoIterator<Item = &'a [f32]>) -> Option<f32> {
    let mut units = units.into_iter().peekable();
    units.peek()?;
    Some(
        units
            .map(|unit| crate::embed::cosine(query, unit))
            .fold(f32::MIN, f32::max),
    )
}

/// A chunk as read back from the index (payload only).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StoredChunk {
    /// Point id.
    pub id: uuid::Uuid,
    /// The document.
    pub key: DocKey,
    /// The document version that wrote the chunk.
    pub version: u64,
    /// Embedder version of the stored vector.
    pub embedder_version: String,
    /// The chunk.
    pub chunk: Chunk,
}

/// Filters applied inside every search (and optionally scroll).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SearchFilter {
    /// Only this tenant's points (required for searches).
    pub tenant: Option<String>,
    /// When set, a point matches if its `acl` is empty or shares a label with these.
    pub acl: Option<Vec<String>>,
    /// Only these kinds.
    pub kinds: Vec<DocKind>,
    /// Only these documents.
    pub doc_ids: Vec<String>,
    /// Only sources under this path prefix (whole components; see [`source_prefixes`]).
    pub source_prefix: Option<String>,
    /// Only chunks of documents in these languages (ISO 639-3 codes, `ingest::lang`).
    pub langs: Vec<String>,
    /// Conditions on the documents' metadata, all required.
    pub metadata: Vec<crate::metadata::MetaCondition>,
}

/// Every path prefix of a source, by whole components (`docs/a/b.md` → `docs`, `docs/a`, `docs/a/b.md`):
/// stored with each chunk, so a source-prefix filter is a keyword match inside the index query.
pub fn source_prefixes(source: &str) -> Vec<String> {
    let trimmed = source.trim_matches('/');
    let mut out = Vec::new();
    for (index, _) in trimmed.match_indices('/') {
        out.push(trimmed[..index].to_string());
    }
    if !trimmed.is_empty() {
        out.push(trimmed.to_string());
    }
    out
}

/// The conditions of a [`SearchFilter`], independent of the engine: each `must` entry is "the keyword
/// field holds one of these values"; `acl`, when set, is "the point has no labels or shares one".
#[derive(Debug, Clone, PartialEq)]
pub struct FilterConditions {
    /// `(field, accepted values)`, all required.
    pub must: Vec<(&'static str, Vec<String>)>,
    /// The query's ACL labels, if the query is ACL-restricted.
    pub acl: Option<Vec<String>>,
    /// Conditions on `metadata.<key>` payload fields, all required.
    pub metadata: Vec<crate::metadata::MetaCondition>,
}

impl SearchFilter {
    /// The filter's conditions, in the form both backends translate.
    pub fn conditions(&self) -> FilterConditions {
        let mut must = Vec::new();
        if let Some(tenant) = &self.tenant {
            must.push(("tenant", vec![tenant.clone()]));
        }
        if !self.kinds.is_empty() {
            must.push((
                "kind",
                self.kinds.iter().map(|k| k.as_str().to_string()).collect(),
            ));
        }
        if !self.doc_ids.is_empty() {
            must.push(("doc_id", self.doc_ids.clone()));
        }
        if !self.langs.is_empty() {
            must.push(("lang", self.langs.clone()));
        }
        if let Some(prefix) = &self.source_prefix {
            let prefix = prefix.trim_matches('/');
            if !prefix.is_empty() {
                must.push(("source_prefixes", vec![prefix.to_string()]));
            }
        }
        FilterConditions {
            must,
            acl: self.acl.clone(),
            metadata: self.metadata.clone(),
        }
    }
}

/// A search on one lane.
#[derive(Debug, Clone)]
pub enum SearchVector {
    /// Dense cosine search.
    Dense(Vec<f32>),
    /// BM25 search (IDF applied by the engine).
    Sparse(SparseVector),
}

/// A search hit.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Hit {
    /// The chunk.
    pub stored: StoredChunk,
    /// Engine score (cosine for dense, BM25 for sparse).
    pub score: f32,
}

/// The index contract, implemented by both backends and checked by one contract test suite.
pub trait VectorStore: Send + Sync {
    /// Which backend this is (`edge`, `server`), for logs.
    fn backend(&self) -> &'static str;
    /// Checks the collection accepts vectors of `embedder_version`/`dimension` (an empty one accepts any).
    fn check_embedder(&self, embedder_version: &str, dimension: usize) -> Result<(), StoreError>;
    /// Inserts or replaces points (idempotent: same id, same content).
    fn upsert(&self, points: &[PointWrite]) -> Result<(), StoreError>;
    /// Writes each of `points` only where the index still holds that point at the same version and
    /// content (its vectors and weights re-computed: `force_reindex`), never resurrecting a deleted
    /// point nor overwriting a newer one; no other write of this process interleaves between the
    /// check and the write. Returns how many were written.
    fn replace_current(&self, points: &[PointWrite]) -> Result<usize, StoreError>;
    /// Deletes points by id (absent ids are ignored).
    fn delete(&self, ids: &[uuid::Uuid]) -> Result<(), StoreError>;
    /// Makes every earlier write durable.
    fn flush(&self) -> Result<(), StoreError>;
    /// Visits every stored chunk matching `filter` (payload only, no vectors), in id order.
    fn scroll(
        &self,
        filter: &SearchFilter,
        visit: &mut dyn FnMut(StoredChunk),
    ) -> Result<(), StoreError>;
    /// Number of points matching `filter`.
    fn count(&self, filter: &SearchFilter) -> Result<usize, StoreError>;
    /// Top `limit` hits of one lane, filters applied inside the engine's search.
    fn search(
        &self,
        vector: &SearchVector,
        filter: &SearchFilter,
        limit: usize,
        score_threshold: Option<f32>,
    ) -> Result<Vec<Hit>, StoreError>;
    /// The chunks of the given points, payload only (missing ids are skipped).
    fn get(&self, ids: &[uuid::Uuid]) -> Result<Vec<StoredChunk>, StoreError>;
    /// Stored vectors of the given points (missing ids are skipped): the dense vector and the evidence
    /// units' vectors (empty where the point has none).
    fn vectors(&self, ids: &[uuid::Uuid]) -> Result<Vec<(uuid::Uuid, StoredVectors)>, StoreError>;
    /// A query's retrieval: both lanes (as [`VectorStore::search`] answers each) and the stored
    /// vectors of their hits (as [`VectorStore::vectors`]). The default makes those three calls; a
    /// backend behind a network answers them in one request.
    fn search_lanes(
        &self,
        lanes: &LaneQuery,
        filter: &SearchFilter,
    ) -> Result<LaneHits, StoreError> {
        lanes::sequential(self, lanes, filter)
    }
    /// The chunks of `key`'s document within `radius` positions ([`Chunk::order_index`]) of `order`,
    /// payload only. The default scrolls the document; the server filters on position.
    fn neighbours(
        &self,
        key: &DocKey,
        order: u32,
        radius: u32,
    ) -> Result<Vec<StoredChunk>, StoreError> {
        lanes::scrolled_neighbours(self, key, order, radius)
    }
    /// Whether the index multiplies BM25 IDF into sparse scores itself (the engine's IDF modifier): the
    /// Qdrant server's one collection, shared by every job instance, and embedded shards created before
    /// the corpus-wide statistics of [`stats`] (whose ranking then depends on the number of shards).
    /// Such an index gets no statistics kept and queries with no IDF of their own.
    fn engine_idf(&self) -> bool {
        false
    }
    /// Creates the payload indexes of the declared metadata keys (`metadata.<key>`, of each key's
    /// type) where missing. Filters on undeclared keys work too, by scanning what the other
    /// conditions leave.
    fn index_metadata(
        &self,
        keys: &[(String, crate::metadata::MetaIndex)],
    ) -> Result<(), StoreError>;
    /// Housekeeping after many writes: vacuum deleted points and build search indexes. A no-op where
    /// the engine does it by itself (the Qdrant server).
    fn optimize(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
/// Refuses a write whose dense vectors are not of the index's `dimension` (both backends check
/// before writing anything).
pub fn check_dimensions(points: &[PointWrite], dimension: usize) -> Result<(), StoreError> {
    match points.iter().find(|point| point.dense.len() != dimension) {
        Some(point) => Err(StoreError::Invalid(format!(
            "vector of dimension {} for a {}-d index",
            point.dense.len(),
            dimension
        ))),
        None => Ok(()),
    }
}

/// The embedder guard shared by the backends: an index whose stored vectors (`found`, any one point) or
/// dimension differ from this job's embedder refuses it; an empty index only checks the dimension.
pub fn check_compatible(
    found: Option<&StoredChunk>,
    found_dimension: usize,
    embedder_version: &str,
    dimension: usize,
) -> Result<(), StoreError> {
    let found_version = found.map(|stored| stored.embedder_version.as_str());
    if found_dimension == dimension
        && found_version.is_none_or(|version| version == embedder_version)
    {
        return Ok(());
    }
    Err(StoreError::EmbedderMismatch {
        found: found_version.unwrap_or("(empty index)").to_string(),
        found_dimension,
        expected: embedder_version.to_string(),
        expected_dimension: dimension,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_roundtrip() {
        let point = crate::testing::sample_point("t", "d", 2, "hello world", &["eng"]);
        let payload = chunk_payload(&point);
        let stored = chunk_from_payload(point.id, payload.clone()).expect("roundtrip");
        assert_eq!(stored.chunk, point.chunk);
        assert_eq!(stored.key, point.key);
        assert_eq!(stored.version, 2);
        let mut broken = payload.clone();
        broken.remove("content_hash");
        assert!(chunk_from_payload(point.id, broken).is_none());
        let mut last = point.clone();
        last.chunk.last = true;
        let stored = chunk_from_payload(last.id, chunk_payload(&last)).expect("roundtrip");
        assert!(stored.chunk.last);
        // Points written before `last` was kept read as not known to be last.
        let mut older = chunk_payload(&last);
        older.remove("last");
        assert!(
            !chunk_from_payload(last.id, older)
                .expect("older")
                .chunk
                .last
        );
    }

    #[test]
    fn source_prefixes_by_component() {
        assert_eq!(
            source_prefixes("docs/guide/intro.md"),
            vec!["docs", "docs/guide", "docs/guide/intro.md"]
        );
        assert_eq!(source_prefixes("README.md"), vec!["README.md"]);
        let filter = SearchFilter {
            source_prefix: Some("docs/guide/".into()),
            ..SearchFilter::default()
        };
        assert_eq!(
            filter.conditions().must,
            vec![("source_prefixes", vec!["docs/guide".to_string()])]
        );
    }
}
