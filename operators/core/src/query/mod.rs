//! The query side: one query event in, one context out.
//!
//! Each step is a pure function over plain values (unit- and property-tested without timely, Kafka or
//! an index): decode, intent, the lanes' depths, fusion, rerank, dedup, MMR and packing. The timely
//! operators that run them are in `ragstream-operators` (`query::*`, one a file); the chain they form
//! is drawn once, in ARCHITECTURE.md, "Query flow". The records here are the wire contracts of the
//! queries and contexts topics (ARCHITECTURE.md).

pub mod adapt;
pub mod cache;
mod context;
pub mod decode;
pub mod dedup;
pub mod depth;
pub mod endpoints;
pub mod fuse;
pub mod intent;
pub mod invalidate;
pub mod ledger;
pub mod mmr;
pub mod modes;
pub mod pack;
pub mod pattern;
pub mod presets;
pub mod probe;
pub mod rerank;
mod stage;
pub mod surrogate;
mod trace;

pub use context::*;
pub use stage::Stage;
pub use trace::*;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::model::DocKind;
use crate::store::StoredChunk;

/// Default token budget of a bounded context (`query.default_token_budget`'s default).
pub const DEFAULT_BUDGET: usize = 3000;
/// Default number of results (`query.default_k`'s default).
pub const DEFAULT_K: usize = 10;
/// Default number of whole chunks of a `deep` query (`query.deep_k`'s default).
pub const DEEP_DEFAULT_K: usize = 20;
/// Most results of a query (of a `deep` query: whole chunks).
pub const DEEP_MAX_K: usize = 50;
/// Documents per `list_sources` page when `k` is not given.
pub const LIST_PAGE: usize = 100;
/// Most documents per `list_sources` page.
pub const LIST_MAX_PAGE: usize = 1000;

/// What a query asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// A context packed into the token budget (the default).
    #[default]
    Bounded,
    /// Full chunk texts of up to 50 results, no budget.
    Deep,
    /// The full text of one chunk (the query text is its id).
    ReadChunk,
    /// The tenant's documents with their chunk counts.
    ListSources,
    /// Files ranked by the concentration of chunk hits.
    Files,
    /// SQL schema tables: qualified names, row counts, columns and types.
    SqlCompact,
    /// SQL schema tables with distributions and up to 5 sample rows.
    SqlFull,
    /// What the index holds for the tenant: chunks (those the caller's ACL labels and filters
    /// see), by kind, and the shards that answered (no text; `get_index_stats`).
    IndexStats,
}

impl Mode {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Bounded => "bounded",
            Mode::Deep => "deep",
            Mode::ReadChunk => "read_chunk",
            Mode::ListSources => "list_sources",
            Mode::Files => "files",
            Mode::SqlCompact => "sql_compact",
            Mode::SqlFull => "sql_full",
            Mode::IndexStats => "index_stats",
        }
    }

    /// Whether the mode retrieves candidates with the query text.
    pub fn retrieves(self) -> bool {
        !matches!(self, Mode::ReadChunk | Mode::ListSources | Mode::IndexStats)
    }

    /// Whether the mode needs no query text.
    pub fn textless(self) -> bool {
        matches!(self, Mode::ListSources | Mode::IndexStats)
    }
}

/// How fresh the index must be for a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Consistency {
    /// Whatever the index holds now.
    #[default]
    Eventual,
    /// Wait until every document event written before the query arrived is indexed.
    ReadYourWrites,
}

/// Filters applied inside the index query.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct QueryFilters {
    /// Only sources under this path prefix (whole path components: `docs/` matches `docs/a.md`).
    #[serde(default)]
    pub source_prefix: Option<String>,
    /// Only sources matching this glob (`docs/**/*.md`, `src/*.rs`; at most 512 bytes): its leading
    /// literal components inside the index query, the rest on the candidates the lanes return
    /// ([`pattern`]).
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = 512)))]
    pub source_pattern: Option<String>,
    /// Only these kinds.
    #[serde(default)]
    pub kinds: Vec<DocKind>,
    /// Only these documents.
    #[serde(default)]
    pub doc_ids: Vec<String>,
    /// Only documents in these languages (ISO 639-3 codes as detected at ingest: `eng`, `fra`, …).
    #[serde(default)]
    pub langs: Vec<String>,
    /// Conditions on the documents' metadata (key → value, `{any: [...]}` or `{gte, lte}`; see
    /// [`crate::metadata`]).
    #[serde(default)]
    pub metadata: crate::metadata::MetaFilters,
}

/// Prompt parts that share the model's context window with the packed context.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Prompt {
    /// System prompt.
    #[serde(default)]
    pub system: String,
    /// Prompt template (without the context).
    #[serde(default)]
    pub template: String,
    /// Conversation history.
    #[serde(default)]
    pub history: Vec<String>,
}

/// A query event (the queries topic's value, or the body of `POST /v1/query`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Query {
    /// Caller-chosen id; the context is keyed by it. At most 1024 bytes (UTF-8).
    #[cfg_attr(
        feature = "schema",
        schemars(length(max = 1024), regex(pattern = r"\S"))
    )]
    pub query_id: String,
    /// The tenant whose documents are searched (nothing else is ever visible). At most 128 bytes
    /// (UTF-8).
    #[cfg_attr(
        feature = "schema",
        schemars(length(min = 1, max = 128), regex(pattern = r"^[^/]+$"))
    )]
    pub tenant: String,
    /// The question, or the chunk id for `read_chunk`.
    #[serde(default)]
    pub text: String,
    /// Token budget of the packed context.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 1_000_000)))]
    pub token_budget: Option<usize>,
    /// Number of results: 1 to 50; a bounded query's limit grows with its `token_budget` (or
    /// `context_window`): one result per 32 tokens, at most 400; 1 to 1000 for `list_sources`.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 1000)))]
    pub k: Option<usize>,
    /// What to return.
    #[serde(default)]
    pub mode: Mode,
    /// Filters applied inside the index query.
    #[serde(default)]
    pub filters: QueryFilters,
    /// The caller's ACL labels: chunks with labels are visible only when one is shared. Absent: public
    /// chunks only (no labels), unless the job runs with `query.absent_acl = "all"`.
    #[serde(default)]
    pub acl: Option<Vec<String>>,
    /// Lowest cosine similarity (−1..1) a dense-lane candidate may have.
    #[serde(default)]
    pub score_threshold: Option<f32>,
    /// Lowest BM25 score a keyword-lane candidate may have: the sum, over the query's terms, of the
    /// term's IDF in the tenant's corpus times its saturated frequency in the chunk (0..~3 per term).
    #[serde(default)]
    pub bm25_score_threshold: Option<f32>,
    /// `o200k_base` (default) or `cl100k_base`.
    #[serde(default)]
    #[cfg_attr(
        feature = "schema",
        schemars(regex(pattern = r"^(o200k_base|cl100k_base)$"))
    )]
    pub tokenizer: Option<String>,
    /// The model's context window; with `prompt`, the budget is derived from it.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 1_000_000)))]
    pub context_window: Option<usize>,
    /// Prompt parts that share the window.
    #[serde(default)]
    pub prompt: Option<Prompt>,
    /// Tokens reserved for the model's answer (default: the job's `query.window.reserve_ratio` of the window,
    /// 25 % unless configured, and at least its `min_reserve`).
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(range(max = 1_000_000)))]
    pub reserve_output: Option<usize>,
    /// Freshness required.
    #[serde(default)]
    pub consistency: Consistency,
    /// Return the trace of every decision.
    #[serde(default)]
    pub trace: bool,
    /// Pack to the budget: no evidence stop (`query.pack.evidence_ratio`); without `k`, the lanes,
    /// the rerank window and the results grow with the budget (`ragstream_core::query::depth`).
    #[serde(default)]
    pub fill: bool,
    /// `bounded`: every item a whole chunk, never a snippet or surrogate; a chunk that does not fit
    /// the budget is left out (the top result alone is cut to it).
    #[serde(default)]
    pub return_full: bool,
    /// SQL modes: give each column's value distribution (default: `sql_full` does, `sql_compact`
    /// does not).
    #[serde(default)]
    pub include_distributions: Option<bool>,
    /// SQL modes: give up to 5 sample rows per table (default: `sql_full` does, `sql_compact` does
    /// not).
    #[serde(default)]
    pub include_samples: Option<bool>,
    /// HyDE for this query, overriding the intents it is configured for: `combined` (the query's
    /// vector and its passages' mean), `hyde` (the passages' mean alone), `original` or `skip` (the
    /// query's own vector). Needs a job with `query.hyde` enabled; without one the query's own
    /// vector is used and the note says so.
    #[serde(default)]
    pub hyde: Option<endpoints::HydeStrategy>,
    /// Hypothetical passages written for this query (1 to 8; default `query.hyde.num_hypotheses`).
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 8)))]
    pub num_hypotheses: Option<usize>,
    /// `list_sources`: the page starts after this document id (the previous page's `next_cursor`).
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(length(max = 1024)))]
    pub cursor: Option<String>,
    /// `files`: candidates per retrieval lane that are grouped into files (1 to 500; default: the
    /// lane's usual depth for the intent, at least twice `k` and the preset's `min_pool`, at most
    /// 100).
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 500)))]
    pub pool: Option<usize>,
    /// `files`: what a file is: `doc_id` (the default), `source`, `directory` (the source's
    /// directory) or `metadata.<key>` (documents with the same value of that metadata key).
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(length(max = 80)))]
    pub file_key: Option<String>,
    /// The retrieval preset the query is answered with: `default` (the job's `[query]` section,
    /// also when absent), `fast`, `conservative`, or one the job defines (`query.presets`). An
    /// unknown name is refused.
    #[serde(default)]
    #[cfg_attr(
        feature = "schema",
        schemars(length(min = 1, max = 64), regex(pattern = r"^[a-z0-9_-]+$"))
    )]
    pub preset: Option<String>,
}

/// Dense and BM25 weights of the fusion.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Weights {
    /// Weight of the dense lane.
    pub dense: f32,
    /// Weight of the BM25 lane.
    pub bm25: f32,
}

/// How many candidates each lane fetches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Depth {
    /// Dense lane.
    pub dense: usize,
    /// BM25 lane.
    pub bm25: usize,
}

/// The analysed query: its intent, the fusion preset and the features the rerank uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The winning intent.
    pub intent: intent::Intent,
    /// Every signal the analyzer (and the code-search rule) saw, for the trace.
    pub signals: Vec<intent::Signal>,
    /// Fusion weights.
    pub weights: Weights,
    /// Candidates fetched per lane, before the query's floor (twice `k`, `min_pool`).
    pub depth: Depth,
    /// Analysed (stemmed) query terms.
    pub terms: Vec<String>,
    /// The query's phrases: each pair of analysed terms that follow each other in the query (stop
    /// words between them skipped), as indices into `terms`, each pair once.
    #[serde(default)]
    pub pairs: Vec<(u32, u32)>,
    /// Entities: capitalised words, identifiers, quoted phrases, numbers.
    pub entities: Vec<String>,
    /// Years and date literals in the query.
    pub dates: Vec<String>,
    /// Scale of the rerank's lexical features (1 but where [`adapt`] found the words of the query a
    /// weak signal).
    #[serde(default = "one")]
    pub lexical: f32,
}

fn one() -> f32 {
    1.0
}

/// Rank (1-based) and raw engine score of a candidate on one lane.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LaneHit {
    /// 1-based rank in the lane after deduplication.
    pub rank: usize,
    /// The engine's score (cosine or BM25).
    pub score: f32,
}

/// One candidate chunk as it moves through fuse, rerank, dedup, MMR and pack.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// The chunk and its document.
    pub stored: StoredChunk,
    /// Dense lane rank and score.
    pub dense: Option<LaneHit>,
    /// BM25 lane rank and score.
    pub bm25: Option<LaneHit>,
    /// Weighted reciprocal-rank fusion score.
    pub fused: f32,
    /// Rerank factors (name → value), empty outside the rerank window. Names are the rerank's own
    /// (borrowed, no allocation per candidate) unless deserialised.
    pub factors: BTreeMap<std::borrow::Cow<'static, str>, f32>,
    /// The score every later step orders by (fused, then reranked).
    pub score: f32,
    /// The stored dense vector (for near-duplicate removal and MMR), when fetched.
    pub vector: Option<Vec<f32>>,
    /// Sentence evidence: the best cosine between the query and one of the chunk's evidence units
    /// ([`crate::model::Chunk::evidence_units`]; the chunk's own where it has none), when the shard
    /// computed it.
    #[serde(default)]
    pub evidence: Option<f32>,
}

impl Candidate {
    /// A candidate from a chunk, with no lane hits yet.
    pub fn new(stored: StoredChunk) -> Self {
        Self {
            stored,
            dense: None,
            bm25: None,
            fused: 0.0,
            factors: BTreeMap::new(),
            score: 0.0,
            vector: None,
            evidence: None,
        }
    }

    /// The lanes that found it, dense first.
    pub fn lanes(&self) -> Vec<fuse::Lane> {
        let mut lanes = Vec::with_capacity(2);
        if self.dense.is_some() {
            lanes.push(fuse::Lane::Dense);
        }
        if self.bm25.is_some() {
            lanes.push(fuse::Lane::Bm25);
        }
        lanes
    }

    /// The point id as a string.
    pub fn id(&self) -> String {
        self.stored.id.to_string()
    }
}

impl Default for Weights {
    fn default() -> Self {
        Self {
            dense: 0.5,
            bm25: 0.5,
        }
    }
}

/// What a query that names no ACL labels may see.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AbsentAcl {
    /// Only chunks without labels: closed by default.
    #[default]
    Public,
    /// Every chunk of the tenant, whatever its labels (for deployments whose callers are all trusted).
    All,
}

impl Query {
    /// Applies the job's rule for queries without `acl`: under [`AbsentAcl::Public`] they carry an
    /// empty label list, which the index filter reads as "chunks without labels only".
    pub fn apply_absent_acl(&mut self, rule: AbsentAcl) {
        if rule == AbsentAcl::Public && self.acl.is_none() {
            self.acl = Some(Vec::new());
        }
    }

    /// Applies the job's rules to a query as it arrives: the ACL rule for a query without `acl`
    /// ([`Self::apply_absent_acl`]), and `similarity_threshold` where the query gives no
    /// `score_threshold` (the query's preset's).
    pub fn apply_job_rules(&mut self, config: &QueryConfig) {
        self.apply_absent_acl(config.absent_acl);
        let threshold = config.preset(self.preset.as_deref()).similarity_threshold;
        if self.score_threshold.is_none() && threshold > -1.0 {
            self.score_threshold = Some(threshold);
        }
    }
}

/// Tunables of the query pipeline (config section `query`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueryConfig {
    /// Results of a query that does not give `k` (1 to 50).
    pub default_k: usize,
    /// Whole chunks of a `deep` query that does not give `k` (1 to 50).
    pub deep_k: usize,
    /// Token budget of a bounded context when the query gives neither `token_budget` nor
    /// `context_window` (1 to 1 000 000).
    pub default_token_budget: usize,
    /// Reciprocal-rank-fusion constant.
    pub rrf_k: f32,
    /// Fewest candidates fetched per lane (the intent's pool and twice `k` may ask for more).
    pub min_pool: usize,
    /// Lowest cosine (−1..1) a dense-lane candidate may have when the query gives no
    /// `score_threshold`; −1: none.
    pub similarity_threshold: f32,
    /// Rerank window and factor weights.
    pub rerank: rerank::RerankConfig,
    /// Cosine at or above which two chunks are near-duplicates.
    pub near_duplicate: f32,
    /// MMR trade-off between relevance (1.0) and diversity (0.0).
    pub mmr_lambda: f32,
    /// MMR's soft spread over documents: taken off a candidate's value per pick its document
    /// already has (the design's `file_penalty`; 0: the per-document cap alone).
    pub mmr_file_penalty: f32,
    /// Most chunks of one document (lifted when the budget would be left unused).
    pub per_document_cap: usize,
    /// Most chunks of one section (lifted when the budget would be left unused).
    pub per_section_cap: usize,
    /// Packing tiers.
    pub pack: pack::PackConfig,
    /// Query vectors cached by query text (a text asked again, at another budget or in another
    /// mode, is embedded once).
    pub embedding_cache: EmbeddingCacheConfig,
    /// How a budget is derived from a model's context window ([`modes::budget_for`]).
    pub window: modes::WindowConfig,
    /// Contexts cached (0 disables the cache).
    pub cache_entries: usize,
    /// Seconds a cached context lives.
    #[serde(with = "crate::duration::secs")]
    pub cache_ttl_secs: Duration,
    /// Longest wait for `read_your_writes`, in milliseconds.
    #[serde(with = "crate::duration::millis")]
    pub consistency_timeout_ms: Duration,
    /// Longest accepted query text, in bytes.
    pub max_query_bytes: usize,
    /// What a query without `acl` sees: `public` (chunks without labels) or `all`.
    pub absent_acl: AbsentAcl,
    /// Each intent's fusion weights and lane depths ([`intent::IntentPresets`]).
    pub intents: intent::IntentPresets,
    /// Let the lanes' hits change the intent's fusion weights ([`adapt`]); off: the intent's alone.
    pub adapt_fusion: bool,
    /// The code-search rule's thresholds and weights ([`adapt::CodeSearchConfig`]).
    pub code_search: adapt::CodeSearchConfig,
    /// Invalidations of published contexts ([`invalidate`]).
    pub invalidations: InvalidationConfig,
    /// Hypothetical-passage query expansion ([`endpoints`]), off by default.
    pub hyde: endpoints::HydeConfig,
    /// Retrieval presets a query picks with `preset` ([`presets`]): each a table of this section's
    /// per-query keys (depths, fusion, rerank weights, dedup, MMR, `pack`, `window`, HyDE's
    /// strategy) merged over it. `fast` and `conservative` are built in (their keys may be
    /// changed here); `default` is this section itself.
    pub presets: BTreeMap<String, presets::PresetOverlay>,
    /// The presets resolved at load ([`QueryConfig::with_presets`]).
    #[serde(skip)]
    pub resolved_presets: std::sync::Arc<BTreeMap<String, std::sync::Arc<QueryConfig>>>,
}

/// The query-vector cache (config section `query.embedding_cache`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbeddingCacheConfig {
    /// Vectors kept (at least 1).
    pub entries: std::num::NonZeroUsize,
    /// Seconds a vector lives.
    #[serde(with = "crate::duration::secs")]
    pub ttl_secs: Duration,
}

impl Default for EmbeddingCacheConfig {
    fn default() -> Self {
        Self {
            entries: std::num::NonZeroUsize::new(16_384).expect("not zero"),
            ttl_secs: Duration::from_secs(3600),
        }
    }
}

/// Invalidations of published contexts (config section `query.invalidations`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InvalidationConfig {
    /// Remember what published contexts cite and publish an invalidation when a cited chunk is
    /// deleted or changed.
    pub enabled: bool,
    /// Seconds a published context's citations are kept (a context older is never invalidated).
    #[serde(with = "crate::duration::secs")]
    pub ttl_secs: Duration,
    /// Most chunk citations kept by one worker (the oldest contexts are forgotten first).
    pub max_citations: usize,
    /// Invalidations kept by a process for `GET /v1/invalidations?since=`.
    pub log_entries: usize,
}

impl Default for InvalidationConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            ttl_secs: Duration::from_secs(3600),
            max_citations: 200_000,
            log_entries: 10_000,
        }
    }
}

impl Default for QueryConfig {
    fn default() -> Self {
        Self {
            default_k: DEFAULT_K,
            deep_k: DEEP_DEFAULT_K,
            default_token_budget: DEFAULT_BUDGET,
            rrf_k: 60.0,
            min_pool: 20,
            similarity_threshold: -1.0,
            rerank: rerank::RerankConfig::default(),
            near_duplicate: 0.95,
            mmr_lambda: 0.8,
            mmr_file_penalty: 0.0,
            per_document_cap: 2,
            per_section_cap: 1,
            pack: pack::PackConfig::default(),
            embedding_cache: EmbeddingCacheConfig::default(),
            window: modes::WindowConfig::default(),
            cache_entries: 1024,
            cache_ttl_secs: Duration::from_secs(60),
            consistency_timeout_ms: Duration::from_secs(10),
            max_query_bytes: 8192,
            absent_acl: AbsentAcl::Public,
            intents: intent::IntentPresets::default(),
            adapt_fusion: true,
            code_search: adapt::CodeSearchConfig::default(),
            invalidations: InvalidationConfig::default(),
            hyde: endpoints::HydeConfig::default(),
            presets: BTreeMap::new(),
            resolved_presets: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests;
