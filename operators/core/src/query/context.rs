//! What a query returns: the context, its items and their tiers, and the ingest progress it reflects.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Trace, Weights};

/// How an item was packed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// The top result with its section header and neighbours.
    Expanded,
    /// A sentence-bounded excerpt.
    Snippet,
    /// Title, section path and first sentence.
    Surrogate,
    /// The whole chunk (deep, read_chunk, sql modes).
    Full,
    /// Title, section path and the chunk's central sentences (surrogate tier `gist`).
    Gist,
    /// Title, section path and the chunk's key phrases (surrogate tier `micro`).
    Micro,
}

impl Tier {
    /// The tier's name (as serialised).
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Expanded => "expanded",
            Tier::Snippet => "snippet",
            Tier::Surrogate => "surrogate",
            Tier::Full => "full",
            Tier::Gist => "gist",
            Tier::Micro => "micro",
        }
    }

    /// Every tier.
    pub const ALL: [Tier; 6] = [
        Tier::Expanded,
        Tier::Snippet,
        Tier::Surrogate,
        Tier::Full,
        Tier::Gist,
        Tier::Micro,
    ];
}

/// One item of a context.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ContextItem {
    /// The point id (of the top chunk for an expanded item).
    pub chunk_id: String,
    /// The document.
    pub doc_id: String,
    /// The document source.
    pub source: String,
    /// First and last line covered.
    pub lines: (u32, u32),
    /// The PDF page of the item (of its top chunk), from 1; absent for other kinds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page: Option<u32>,
    /// Section path.
    pub section_path: Vec<String>,
    /// How it was packed.
    pub tier: Tier,
    /// Its final score.
    pub score: f32,
    /// Tokens of the item's rendering (header line included).
    pub tokens: usize,
    /// Tokens of the whole chunk (the top chunk of an expanded item) as counted at ingest, with the
    /// ingest's tokenizer: what `read_chunk` returns, without its header.
    #[serde(default)]
    pub full_tokens: usize,
    /// The retrieval lanes that found the item (its top chunk): `dense`, `bm25` or both; empty for
    /// a chunk read by its id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lanes: Vec<super::fuse::Lane>,
    /// The item's text (without the `Source:` header).
    pub text: String,
    /// The document's metadata (absent when it has none).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    #[cfg_attr(
        feature = "schema",
        schemars(schema_with = "crate::metadata::schema::metadata_object")
    )]
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

/// A document of `list_sources` or a file of `files`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SourceEntry {
    /// The document.
    pub doc_id: String,
    /// Its source.
    pub source: String,
    /// Its title.
    pub title: String,
    /// Chunks the document has in the index.
    pub chunks: usize,
    /// Chunks among the query's candidates (`files`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hits: Option<usize>,
    /// Concentration score (`files`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub score: Option<f32>,
    /// `files` with a `file_key` other than `doc_id`: the group's value (the source, its
    /// directory, or the metadata value; empty for documents without it); `doc_id`, `source` and
    /// `title` are then the group's best document's, `chunks` and `hits` the group's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// `files` with a `file_key` other than `doc_id`: the group's documents among the candidates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documents: Option<usize>,
}

/// `index_stats`: what the index holds for a tenant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct IndexStats {
    /// Chunks the query sees: the tenant's, within its filters and ACL labels.
    pub chunks: usize,
    /// The same by chunk kind (`prose`, `markdown`, `code`, `sql_schema`).
    pub chunks_by_kind: BTreeMap<String, usize>,
    /// Shards that answered (one for a Qdrant server collection, which every worker shares).
    pub shards: usize,
    /// The index backend: `edge` (embedded) or `server`.
    pub backend: String,
}

/// The answer to a query (the contexts topic's value, the body of the `POST /v1/query` response).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Context {
    /// The query's id.
    pub query_id: String,
    /// The tenant.
    pub tenant: String,
    /// The mode answered (`""` on an error context).
    #[serde(with = "empty_is_none")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub mode: Option<super::Mode>,
    /// The packed items.
    pub items: Vec<ContextItem>,
    /// Documents (`list_sources`, `files`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<SourceEntry>,
    /// `list_sources`: the cursor of the next page (absent on the last page).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// `index_stats`: what the index holds for the tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_stats: Option<IndexStats>,
    /// The packed string, items prefixed `Source: … (lines a–b)`.
    pub context: String,
    /// Tokens of `context`, counted with the real tokenizer.
    pub tokens_used: usize,
    /// The budget it was packed into (`None` for unbounded modes).
    pub token_budget: Option<usize>,
    /// The tokenizer the counts use.
    pub tokenizer: String,
    /// Candidates that passed the filters.
    pub chunks_available: usize,
    /// Items returned.
    pub chunks_returned: usize,
    /// Whether anything was cut or left out for the budget.
    pub truncated: bool,
    /// What was cut, warnings, hints.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Distinct sources (files) among the items.
    #[serde(default)]
    pub unique_files: usize,
    /// `unique_files` over the number of items (1: every item from another file; 0 when there is
    /// no item).
    #[serde(default)]
    pub file_diversity_ratio: f32,
    /// Tokens left for the answer when a context window was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_new_tokens: Option<usize>,
    /// Tokens of the prompt (system, template and history) when a context window was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_tokens: Option<usize>,
    /// Tokens reserved for the answer when a context window was given: the query's
    /// `reserve_output`, else `[query.window] reserve_ratio` of what the prompt leaves of the
    /// window, at least `min_reserve`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation_budget: Option<usize>,
    /// How `token_budget` and `generation_budget` were derived from a context window (absent
    /// without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<GenerationMeta>,
    /// The intent the analyzer chose (`""` where none ran: a lookup mode, an error context).
    #[serde(with = "empty_is_none")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub intent: Option<super::intent::Intent>,
    /// The fusion weights used.
    pub weights: Weights,
    /// What the index reflected: the ingest frontier (ms) and, with Kafka, the acknowledged offsets.
    pub index_watermark: Watermark,
    /// Present when the query asked for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<Trace>,
    /// Milliseconds per stage and in total.
    pub latency_ms: BTreeMap<String, f64>,
    /// Set when the query could not be answered (bad query, unknown chunk id, index failure).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The kind of `error`, stable for programs (the HTTP API's problem types): a refused query's
    /// DLQ reason (`invalid_query`, `malformed_json`, `invalid_utf8`, `oversize`), `unknown_chunk`,
    /// `index_unavailable` (retry later), `index_refused`, `too_large_context`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
    /// What the retrieval saw, for standing queries ([`super::probe`]); never serialised.
    #[serde(skip)]
    #[cfg_attr(feature = "schema", schemars(skip))]
    pub probe: Option<std::sync::Arc<super::probe::Probe>>,
}

/// How a context window was shared out: `token_budget = context_window − base_tokens −
/// generation_budget − safety_margin` (at most the query's own `token_budget`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct GenerationMeta {
    /// The model's context window, as the query gave it.
    pub context_window: usize,
    /// What the prompt leaves of the window (`context_window − base_tokens`).
    pub remaining: usize,
    /// Where `generation_budget` came from.
    pub reserve_from: super::modes::ReserveFrom,
    /// The job's `[query.window] reserve_ratio` (the share of `remaining` reserved when the query
    /// gives no `reserve_output`).
    pub reserve_ratio: f32,
    /// The job's `[query.window] min_reserve`.
    pub min_reserve: usize,
    /// Tokens kept free (`[query.window] safety_margin`).
    pub safety_margin: usize,
    /// The query's `token_budget` when it capped the derived budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capped_by_token_budget: Option<usize>,
}

/// The ingest progress a context reflects.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Watermark {
    /// Every document event with an earlier time (ms since the epoch) is indexed.
    pub frontier_ms: u64,
    /// Documents-topic partition → next offset not yet acknowledged by the index.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub offsets: BTreeMap<i32, i64>,
}

impl Context {
    /// The mode's wire name (`""` on an error context).
    pub fn mode_name(&self) -> &'static str {
        self.mode.map_or("", super::Mode::as_str)
    }

    /// The intent's wire name (`""` where no analysis ran).
    pub fn intent_name(&self) -> &'static str {
        self.intent.map_or("", super::intent::Intent::as_str)
    }
}

/// A name on the wire that is `""` when there is none: `None` is written `""` and `""` read back as
/// `None`; any other string must be one of the type's names.
mod empty_is_none {
    use serde::de::{DeserializeOwned, IntoDeserializer};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<T: Serialize, S: Serializer>(
        value: &Option<T>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => value.serialize(serializer),
            None => serializer.serialize_str(""),
        }
    }

    pub fn deserialize<'de, T: DeserializeOwned, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<T>, D::Error> {
        let name = String::deserialize(deserializer)?;
        if name.is_empty() {
            return Ok(None);
        }
        let name: serde::de::value::StringDeserializer<D::Error> = name.into_deserializer();
        T::deserialize(name).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::intent::Intent;
    use crate::query::Mode;

    #[test]
    fn mode_and_intent_are_their_names_on_the_wire_and_empty_when_none() {
        let answered = Context {
            mode: Some(Mode::SqlCompact),
            intent: Some(Intent::CodeSearch),
            ..Context::default()
        };
        let wire = serde_json::to_value(&answered).expect("encoded");
        assert_eq!(
            (&wire["mode"], &wire["intent"]),
            (&"sql_compact".into(), &"code_search".into())
        );
        assert_eq!(
            serde_json::from_value::<Context>(wire).expect("decoded"),
            answered
        );
        let error = Context::default();
        let wire = serde_json::to_value(&error).expect("encoded");
        assert_eq!((&wire["mode"], &wire["intent"]), (&"".into(), &"".into()));
        assert_eq!((error.mode_name(), error.intent_name()), ("", ""));
        assert_eq!(
            serde_json::from_value::<Context>(wire).expect("decoded"),
            error
        );
        let mut unknown = serde_json::to_value(&answered).expect("encoded");
        unknown["mode"] = "everything".into();
        assert!(serde_json::from_value::<Context>(unknown).is_err());
    }
}
