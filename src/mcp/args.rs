//! The tools' arguments: each a JSON schema the MCP client lists (the `///` comments are the
//! arguments' descriptions), checked strictly (an unknown argument is refused).

use rmcp::schemars::{self, JsonSchema};
use serde::Deserialize;
use serde_json::Value;

/// Restricts a search to some documents: a path pattern (`docs/**/*.md`), or conditions.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum DocFilterArg {
    /// Only sources matching this glob: `*` within a path component, `**` across them, `?` one
    /// character, `{a,b}` alternatives (e.g. `src/**/*.rs`).
    Pattern(String),
    /// Conditions, all required.
    Filter(DocFilter),
}

impl DocFilterArg {
    /// The conditions (a pattern as `source_pattern`).
    pub fn into_filter(self) -> DocFilter {
        match self {
            DocFilterArg::Pattern(pattern) => DocFilter {
                source_pattern: Some(pattern),
                ..DocFilter::default()
            },
            DocFilterArg::Filter(filter) => filter,
        }
    }
}

/// Restricts a search to some documents (applied inside the index query).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DocFilter {
    /// Only these document ids.
    #[serde(default)]
    pub doc_ids: Vec<String>,
    /// Only sources under this path prefix (whole path components: `docs/` matches `docs/a.md`).
    #[serde(default)]
    pub source_prefix: Option<String>,
    /// Only sources matching this glob (`docs/**/*.md`; at most 512 bytes).
    #[serde(default)]
    pub source_pattern: Option<String>,
    /// Only these kinds: `prose`, `markdown`, `code`, `sql_schema`.
    #[serde(default)]
    pub kinds: Vec<String>,
    /// Only documents in these languages (ISO 639-3, e.g. `eng`).
    #[serde(default)]
    pub langs: Vec<String>,
    /// Conditions on the documents' metadata, all required: key → a value (string, integer or
    /// boolean), `{"any": [values]}`, or a range `{"gte": x, "lte": y}` of numbers or RFC 3339
    /// date-times.
    #[serde(default)]
    pub metadata: Option<serde_json::Map<String, Value>>,
}

/// Arguments of `rag_search`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchArgs {
    /// The question or search text.
    pub query: String,
    /// Token budget of the packed context (default 3000), counted with the o200k_base tokenizer.
    #[serde(default)]
    pub token_budget: Option<usize>,
    /// Number of results to choose from (default 10; with `fill`, as many as the budget holds). At
    /// most 50, or one per 32 tokens of the budget (at most 400).
    #[serde(default)]
    pub k: Option<usize>,
    /// Lowest cosine similarity (-1..1) a dense-lane candidate may have.
    #[serde(default)]
    pub score_threshold: Option<f32>,
    /// Restrict the search to some documents: a path pattern or conditions.
    #[serde(default)]
    pub doc_filter: Option<DocFilterArg>,
    /// The tenant to search, when the credential opens more than one.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Pack to the budget instead of stopping once the evidence is in, reading as deep as the budget
    /// needs (default false).
    #[serde(default)]
    pub fill: Option<bool>,
    /// Whole chunks instead of snippets: a chunk that does not fit the budget is left out (default
    /// false).
    #[serde(default)]
    pub return_full: Option<bool>,
    /// Retrieval preset: `default`, `fast` (fewer candidates, no neighbour fetch, no HyDE),
    /// `conservative` (fewer, surer items) or one the job defines.
    #[serde(default)]
    pub preset: Option<String>,
    /// HyDE for this search (needs a job with `query.hyde` enabled): `combined` (the question's
    /// vector and its hypothetical passages'), `hyde` (the passages' alone), `original` or `skip`
    /// (none). Default: the job's rule for the question's intent.
    #[serde(default)]
    pub hyde: Option<String>,
    /// Hypothetical passages written (1 to 8; default the job's `query.hyde.num_hypotheses`).
    #[serde(default)]
    pub num_hypotheses: Option<usize>,
}

/// Arguments of `rag_search_deep`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeepArgs {
    /// The question or search text.
    pub query: String,
    /// Number of whole chunks (default 20, the job's `query.deep_k`; at most 50).
    #[serde(default)]
    pub k: Option<usize>,
    /// Lowest cosine similarity (-1..1) a dense-lane candidate may have.
    #[serde(default)]
    pub score_threshold: Option<f32>,
    /// Restrict the search to some documents: a path pattern or conditions.
    #[serde(default)]
    pub doc_filter: Option<DocFilterArg>,
    /// The tenant to search, when the credential opens more than one.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Retrieval preset: `default`, `fast`, `conservative` or one the job defines.
    #[serde(default)]
    pub preset: Option<String>,
}

/// Arguments of `rag_search_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FilesArgs {
    /// The question or search text.
    pub query: String,
    /// Number of files (default 10, the job's `query.default_k`; at most 50).
    #[serde(default)]
    pub k: Option<usize>,
    /// Candidate chunks per retrieval lane that are grouped into files (1 to 500; default: the
    /// lane's usual depth for the question's intent, at least twice `k` and the preset's
    /// `min_pool`, at most 100).
    #[serde(default)]
    pub pool: Option<usize>,
    /// What a file is: `doc_id` (default), `source`, `directory`, or `metadata.<key>` (documents
    /// sharing that metadata value).
    #[serde(default)]
    pub file_key: Option<String>,
    /// Restrict the search to some documents: a path pattern or conditions.
    #[serde(default)]
    pub doc_filter: Option<DocFilterArg>,
    /// The tenant to search, when the credential opens more than one.
    #[serde(default)]
    pub tenant: Option<String>,
}

/// Arguments of `rag_read_chunk`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadChunkArgs {
    /// The chunk id (from a search result's `items[].chunk_id`).
    pub chunk_id: String,
    /// The tenant, when the credential opens more than one.
    #[serde(default)]
    pub tenant: Option<String>,
}

/// Arguments of `rag_list_sources`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListSourcesArgs {
    /// The tenant, when the credential opens more than one.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Documents per page (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<usize>,
    /// The previous page's `next_cursor`: the page starts after it.
    #[serde(default)]
    pub cursor: Option<String>,
}

/// How much `sql_search` tells about each table.
#[derive(Debug, Default, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SqlDetail {
    /// Qualified names, row counts, columns and types.
    #[default]
    Compact,
    /// Also value distributions and up to 5 sample rows.
    Full,
}

/// Lowest cosine similarity of a table to an SQL search (the design's default): a table further
/// from the question is not listed.
pub const SQL_SCORE_THRESHOLD: f32 = 0.3;

/// Arguments of `sql_search`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SqlArgs {
    /// What the tables should hold (e.g. "orders per customer").
    pub query: String,
    /// `compact` (default) or `full`.
    #[serde(default)]
    pub detail: SqlDetail,
    /// The design's name for `detail`: true is `compact`, false is `full`; when given it decides.
    #[serde(default)]
    pub compact: Option<bool>,
    /// Give each column's value distribution (default: only with `full`).
    #[serde(default)]
    pub include_distributions: Option<bool>,
    /// Give up to 5 sample rows per table (default: only with `full`).
    #[serde(default)]
    pub include_samples: Option<bool>,
    /// Lowest cosine similarity (-1..1) of a table to the query (default 0.3).
    #[serde(default)]
    pub score_threshold: Option<f32>,
    /// Number of tables (default 10).
    #[serde(default)]
    pub k: Option<usize>,
    /// The tenant to search, when the credential opens more than one.
    #[serde(default)]
    pub tenant: Option<String>,
}

/// Arguments of `sql_search_compact`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SqlCompactArgs {
    /// What the tables should hold (e.g. "orders per customer").
    pub query: String,
    /// Number of tables (default 10).
    #[serde(default)]
    pub k: Option<usize>,
    /// The tenant to search, when the credential opens more than one.
    #[serde(default)]
    pub tenant: Option<String>,
}

/// Arguments of `get_index_stats` and `get_cache_stats`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantArgs {
    /// The tenant, when the credential opens more than one.
    #[serde(default)]
    pub tenant: Option<String>,
}

/// Arguments of `clear_cache`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClearCacheArgs {
    /// Only contexts of questions matching this glob (`*tides*`, `how do I *`; case ignored; at
    /// most 512 bytes). Absent: all of the tenant's.
    #[serde(default)]
    pub pattern: Option<String>,
    /// The tenant, when the credential opens more than one.
    #[serde(default)]
    pub tenant: Option<String>,
}

/// Arguments of `force_reindex`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReindexArgs {
    /// Only documents whose source matches this glob (`docs/**/*.md`); all of the tenant's without.
    #[serde(default)]
    pub source_pattern: Option<String>,
    /// Wait for the run to end (at most 60 seconds; the status says whether it has) instead of
    /// returning as it starts.
    #[serde(default)]
    pub wait: bool,
    /// The tenant, when the credential opens more than one.
    #[serde(default)]
    pub tenant: Option<String>,
}

/// Arguments of `rag_subscribe`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SubscribeArgs {
    /// The question or search text to keep answered.
    pub query: String,
    /// Token budget of the packed context (default 3000), counted with the o200k_base tokenizer.
    #[serde(default)]
    pub token_budget: Option<usize>,
    /// Number of results to choose from (default 10).
    #[serde(default)]
    pub k: Option<usize>,
    /// Restrict the search to some documents: a path pattern or conditions.
    #[serde(default)]
    pub doc_filter: Option<DocFilterArg>,
    /// The tenant to search, when the credential opens more than one.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Pack to the budget instead of stopping once the evidence is in.
    #[serde(default)]
    pub fill: Option<bool>,
    /// Least milliseconds between two answers (0 to 3600000; default the job's).
    #[serde(default)]
    pub min_interval_ms: Option<u64>,
    /// Seconds until the subscription ends (default the job's `standing.default_ttl_secs`).
    #[serde(default)]
    pub ttl_secs: Option<u64>,
}

/// Arguments of `rag_unsubscribe`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UnsubscribeArgs {
    /// The subscription's id, or its resource uri (`ragstream://subscriptions/{id}`).
    pub subscription_id: String,
}
