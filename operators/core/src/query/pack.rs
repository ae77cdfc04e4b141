//! Pack: a token-true context in tiers, never over budget.
//!
//! Every candidate has forms from richest to smallest:
//! - the top result **expanded**: its section header line and the chunk merged with its neighbours of
//!   the same document (overlapping windows merged by byte range, so no text repeats), up to 600 tokens;
//! - a **snippet**: the whole chunk when it has at most 200 tokens, otherwise the sentence window around
//!   the sentence holding most query terms, cut on sentence boundaries;
//! - a **surrogate**: title, section path and first sentence (~60 tokens).
//!
//! Each item is rendered as its citation line (`header_format`, by default `Source: {source} (lines
//! a–b)`), with `include_metadata_in_context` its document's metadata line, then its text; items are joined by the
//! separator, and the whole context is wrapped in `<retrieved-context trust="untrusted">` …
//! `</retrieved-context>`: what is inside is untrusted data from indexed documents, not instructions (a
//! document that spells either delimiter has it defused, so no text can close the block early). Planning uses the token counts stored at ingest (parts of a chunk are estimated by their
//! byte share, rounded up with a margin), so no chunk is re-tokenized per query. While the plan is over
//! budget, the step with the least value lost per token saved is taken: shrink an item one form or
//! drop it, where an item's value is its relevance discounted by its redundancy with better items, and
//! its relevance follows its score's standing on the evidence stop's scale (below), not its rank:
//! `exp(−10 · (1 − standing))`, so a second result that scores nearly as well as the top keeps nearly
//! as much room, and one far below it gives way first. The
//! assembled string is then counted with the real tokenizer; if it is still over budget another step
//! is taken and it is counted again. The top result is never dropped while anything fits: its last
//! form is its surrogate cut to the budget. Budget left over is filled with deferred candidates. The
//! expanded top result covers the text of its document's other candidates, which are cut to what it
//! leaves; when the budget then shrinks it to a smaller form, the plan is made again without the
//! expanded form, so that those candidates compete for the budget on their own.
//!
//! **Tier caps** (`max_snippets`, `max_surrogates`, off by default) bound how many items take each
//! kind of form: in value order, an item past the snippet cap takes its surrogate, one past the
//! surrogate cap is left out (trace cause `tier_cap`); `expansion_max_bytes` bounds the expanded
//! form in bytes as `expanded_tokens` does in tokens.
//!
//! **Evidence stop.** A context need not fill its budget: a candidate other than the top result is
//! packed only while its score, on the scale from the bottom of the rerank's scale (0: one below the
//! lowest reranked score, where candidates below the rerank window start) to
//! the top result (1), is at least `evidence_ratio`. A query whose top result stands clear of the
//! rest gets a short context; one whose candidates score alike gets them all, as before. A candidate
//! standing at or above `evidence_ratio` but below `sentence_ratio` (the **evidence band**) is packed
//! as its best sentence only (code and schemas: its smallest snippet): a weak candidate's value is in
//! the sentence that matches the query, not in the rest of its chunk. The note and the trace
//! (`evidence_stop`, `evidence_band`) say what was left out or cut and why; a request with
//! `fill: true`, or `evidence_ratio = 0`, packs to the budget with neither.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::{Candidate, ContextItem, Decision, Tier};
use crate::query::surrogate::SurrogateTier;
use crate::store::StoredChunk;
use crate::tokens::TokenCounter;

mod forms;
mod plan;
mod whole;
pub use forms::AnswerCue;
use forms::*;
use plan::pack_once;

/// Packing tiers (config section `query.pack`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PackConfig {
    /// Section reunification: the top result expanded with its section header and its document's
    /// neighbouring chunks (the design's `SECTION_REUNIFICATION`); off, it is packed like the others
    /// and no neighbours are fetched.
    pub section_reunification: bool,
    /// Most tokens of the expanded top result.
    pub expanded_tokens: usize,
    /// Most tokens of a snippet.
    pub snippet_tokens: usize,
    /// Most tokens of the smallest snippet: the sentence holding most query terms.
    pub sentence_tokens: usize,
    /// Most tokens of a surrogate.
    pub surrogate_tokens: usize,
    /// Most items packed as snippets; past it an item takes its surrogate (or is left out when the
    /// surrogates are full too). The top result is packed whatever the caps, and counts. 0: no cap.
    pub max_snippets: usize,
    /// Most items packed as surrogates (`surrogate`, `gist`, `micro`); past it an item is left out.
    /// 0: no cap.
    pub max_surrogates: usize,
    /// Most bytes of the expanded top result's text: neighbours stop being added before it, and a
    /// top chunk longer than it is not expanded. 0: only `expanded_tokens` bounds it.
    pub expansion_max_bytes: usize,
    /// An item's relevance by its standing: `exp(−standing_decay · (1 − standing))`, the standing
    /// being its score on the evidence stop's scale (0: the bottom of the rerank's scale, 1: the top
    /// result), with or without the stop; 0 values every item alike.
    pub standing_decay: f32,
    /// And by its rank among the candidates' scores: times `1 / (1 + position_decay · rank)`
    /// (0: rank does not count).
    pub position_decay: f32,
    /// How much an item's value is discounted by its highest cosine to a better item (0 = none).
    pub redundancy_weight: f32,
    /// What a deferred candidate's value (one held back by a per-document or per-section cap) is
    /// multiplied by: it fills budget left unused rather than competing for it.
    pub deferred_value: f32,
    /// Between items.
    pub separator: String,
    /// Wrap the context in the untrusted-content delimiters ([`UNTRUSTED_OPEN`], [`UNTRUSTED_CLOSE`]).
    pub untrusted_delimiters: bool,
    /// Evidence stop: the lowest score, on the scale from the bottom of the rerank's scale (0) to
    /// its top result (1), of a candidate packed after the top result; 0 packs to the budget.
    pub evidence_ratio: f32,
    /// Evidence band: a candidate after the top result whose score stands below this on the same
    /// scale (and at or above `evidence_ratio`) is packed as its best sentence (code and schemas:
    /// its smallest snippet); at or below `evidence_ratio` there is no band.
    pub sentence_ratio: f32,
    /// Surrogate tiers and the policy that picks them ([`crate::query::surrogate`]).
    pub surrogates: crate::query::surrogate::SurrogateConfig,
    /// Each item's citation line, before its text: `{source}`, `{location}` (`lines 3–9`, or `page
    /// 2, lines 40–52` for a PDF), `{lines}` (`3–9`), `{page}` (empty without one), `{title}` and
    /// `{section}` (the section path joined by ` › `) are filled in; a newline follows it. At most
    /// 256 bytes; any other `{name}` is refused at load.
    pub header_format: String,
    /// After each item's citation line, a `Metadata: {json}` line with its document's metadata
    /// (canonical JSON), counted in the budget like the rest.
    pub include_metadata_in_context: bool,
}

/// The default `header_format`.
pub const DEFAULT_HEADER: &str = "Source: {source} ({location})";
/// The placeholders a `header_format` may use.
pub const HEADER_FIELDS: [&str; 6] = ["source", "location", "lines", "page", "title", "section"];

/// `format` with each `{name}` of `values` replaced (one pass: a value is never read as a
/// placeholder).
fn fill_header(format: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(format.len() + 64);
    let mut rest = format;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after
            .find('}')
            .and_then(|close| Some((values.iter().find(|(k, _)| *k == &after[..close])?, close)))
        {
            Some(((_, value), close)) => {
                out.push_str(value);
                rest = &after[close + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

impl PackConfig {
    /// Checks the settings a config file gives: the key at fault and why.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if !(0.0..=1.0).contains(&self.evidence_ratio) {
            return Err(("query.pack.evidence_ratio", "must be in [0, 1]".into()));
        }
        if !(0.0..=1.0).contains(&self.sentence_ratio) {
            return Err(("query.pack.sentence_ratio", "must be in [0, 1]".into()));
        }
        if !(0.0..=1.0).contains(&self.deferred_value) {
            return Err(("query.pack.deferred_value", "must be in [0, 1]".into()));
        }
        if self.surrogate_tokens == 0
            || self.snippet_tokens < self.surrogate_tokens
            || self.expanded_tokens < self.snippet_tokens
        {
            return Err((
                "query.pack",
                "need 0 < surrogate_tokens <= snippet_tokens <= expanded_tokens".into(),
            ));
        }
        if self.header_format.len() > 256 {
            return Err(("query.pack.header_format", "at most 256 bytes".into()));
        }
        let mut rest = self.header_format.as_str();
        while let Some(open) = rest.find('{') {
            let after = &rest[open + 1..];
            let Some(close) = after.find('}') else {
                return Err(("query.pack.header_format", "an unclosed `{`".into()));
            };
            let name = &after[..close];
            if !HEADER_FIELDS.contains(&name) {
                return Err((
                    "query.pack.header_format",
                    format!(
                        "unknown placeholder {{{name}}} (known: {})",
                        HEADER_FIELDS.join(", ")
                    ),
                ));
            }
            rest = after;
        }
        Ok(())
    }
}

/// Opens a packed context: retrieved text is data to quote, never instructions to follow.
pub const UNTRUSTED_OPEN: &str = "<retrieved-context trust=\"untrusted\">\n";
/// Closes a packed context.
pub const UNTRUSTED_CLOSE: &str = "\n</retrieved-context>";
const DELIMITER_TAG: &str = "retrieved-context";

/// `text` with any spelling of the delimiters defused, so a document cannot close the block.
fn defuse(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains(DELIMITER_TAG) {
        std::borrow::Cow::Owned(text.replace(DELIMITER_TAG, "retrieved_context"))
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// Joins rendered items with the separator and wraps them in the untrusted-content delimiters
/// (nothing for no items); also where each item is in the string.
pub fn wrap_items(items: &[String], config: &PackConfig) -> (String, Vec<Range<usize>>) {
    if items.is_empty() {
        return (String::new(), Vec::new());
    }
    let (open, close) = if config.untrusted_delimiters {
        (UNTRUSTED_OPEN, UNTRUSTED_CLOSE)
    } else {
        ("", "")
    };
    let length = items.iter().map(String::len).sum::<usize>()
        + config.separator.len() * (items.len() - 1)
        + open.len()
        + close.len();
    let mut context = String::with_capacity(length);
    let mut spans = Vec::with_capacity(items.len());
    context.push_str(open);
    for (index, item) in items.iter().enumerate() {
        if index > 0 {
            context.push_str(&config.separator);
        }
        spans.push(context.len()..context.len() + item.len());
        context.push_str(item);
    }
    context.push_str(close);
    (context, spans)
}

impl Default for PackConfig {
    fn default() -> Self {
        Self {
            section_reunification: true,
            expanded_tokens: 600,
            snippet_tokens: 200,
            sentence_tokens: 60,
            surrogate_tokens: 60,
            max_snippets: 0,
            max_surrogates: 0,
            expansion_max_bytes: 0,
            standing_decay: 10.0,
            position_decay: 0.0,
            redundancy_weight: 0.5,
            deferred_value: 0.5,
            separator: "\n\n".into(),
            untrusted_delimiters: true,
            evidence_ratio: 0.64,
            sentence_ratio: 0.78,
            surrogates: Default::default(),
            header_format: DEFAULT_HEADER.into(),
            include_metadata_in_context: false,
        }
    }
}

/// What the packer works on.
#[derive(Debug, Clone, Copy)]
pub struct PackRequest<'a> {
    /// Candidates chosen by MMR, best first (the first is the top result).
    pub picked: &'a [Candidate],
    /// Candidates held back by a cap, used only if the budget is left unused.
    pub deferred: &'a [Candidate],
    /// Chunks of the top result's document (for the expanded tier), any order.
    pub neighbours: &'a [StoredChunk],
    /// The token budget of the whole context string.
    pub budget: usize,
    /// The tokenizer the budget is counted with.
    pub counter: TokenCounter,
    /// Analysed query terms (snippets centre on the sentence holding most of them).
    pub terms: &'a [String],
    /// What kind of text answers the question (breaks ties between sentences).
    pub cue: AnswerCue,
    /// Tiers and separator.
    pub config: &'a PackConfig,
    /// Pack to the budget (no evidence stop).
    pub fill: bool,
    /// Every item a whole chunk (the query's `return_full`): no expanded, snippet or surrogate form,
    /// so a chunk that does not fit is left out (the top result alone is cut to the budget).
    pub whole: bool,
    /// The bottom of the evidence stop's scale: what [`crate::query::rerank::rerank`] returns (one
    /// below the lowest reranked score), at most the lowest candidate's score.
    pub floor: f32,
    /// The surrogate tier of each candidate, picked then deferred, and why (empty: all `full`).
    pub tiers: &'a [(SurrogateTier, String)],
}

/// The packed context.
#[derive(Debug, Clone, Default)]
pub struct Packed {
    /// Items in context order.
    pub items: Vec<ContextItem>,
    /// The assembled string.
    pub context: String,
    /// Its token count (real tokenizer).
    pub tokens_used: usize,
    /// Whether anything was shortened or left out.
    pub truncated: bool,
    /// What was shortened or left out.
    pub note: Option<String>,
    /// Per-candidate decisions.
    pub decisions: Vec<Decision>,
    /// How many times the assembled string was counted.
    pub counts: usize,
}

/// An item as the context holds it: its `Source:` header, then its text, both defused.
fn render(header: &str, text: &str) -> String {
    format!("{}{}", defuse(header), defuse(text))
}

/// Packs `request` into its budget.
pub fn pack(request: PackRequest<'_>) -> Packed {
    // The expanded top result covers its neighbours' text, so candidates of its document are cut
    // to what it leaves (or left out). When the budget then shrinks it to a smaller form, that text
    // is no longer in the context: pack again without the expanded form, so that they compete for
    // the budget on their own.
    // Without section reunification there is no expanded form to offer.
    match pack_once(request, request.config.section_reunification) {
        (first, true) => {
            let mut packed = pack_once(request, false).0;
            packed.counts += first.counts;
            packed
        }
        (packed, false) => packed,
    }
}

/// Renders whole chunks (deep, read_chunk and SQL modes): no budget.
pub fn render_full(
    candidates: &[(Candidate, String)],
    config: &PackConfig,
    counter: TokenCounter,
) -> (Vec<ContextItem>, String, usize) {
    let mut items = Vec::with_capacity(candidates.len());
    let mut parts = Vec::with_capacity(candidates.len());
    for (candidate, text) in candidates {
        let chunk = &candidate.stored.chunk;
        let rendered = render(&header(chunk, chunk.lines, config), text);
        items.push(ContextItem {
            chunk_id: candidate.id(),
            doc_id: candidate.stored.key.doc_id.clone(),
            source: chunk.source.clone(),
            lines: chunk.lines,
            page: chunk.page,
            section_path: chunk.section_path.clone(),
            tier: Tier::Full,
            score: candidate.score,
            // Counted with the context below.
            tokens: 0,
            full_tokens: chunk.tokens as usize,
            lanes: candidate.lanes(),
            text: text.clone(),
            metadata: chunk.metadata.to_object(),
        });
        parts.push(rendered);
    }
    let (context, spans) = wrap_items(&parts, config);
    let (tokens, counts) = counter.count_spans(&context, &spans);
    for (item, count) in items.iter_mut().zip(counts) {
        item.tokens = count;
    }
    (items, context, tokens)
}

#[cfg(test)]
mod tests;
