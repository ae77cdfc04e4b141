//! Pack: a token-true context in tiers, never over budget.
//!
//! Every candidate has forms from richest to smallest:
//! - the top result **expanded**: its section header line and the chunk merged with its neighbours of
//!   the same document (overlapping windows merged by byte range, so no text repeats), up to 600 tokens;
//! - a **snippet**: the whole chunk when it has at most 200 tokens, otherwise the sentence window around
//!   the sentence holding most query terms, cut on sentence boundaries;
//! - a **surrogate**: title, section path and first sentence (~60 tokens).
//!
//! Each item is rendered as `Source: {source} (lines a–b)` + newline + text; items are joined by the
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

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Action, Candidate, Cause, ContextItem, Decision, Tier};
use crate::embed::{cosine_with_norms, dot};
use crate::query::surrogate::SurrogateTier;
use crate::store::StoredChunk;
use crate::tokens::TokenCounter;

mod forms;
pub use forms::AnswerCue;
use forms::*;

/// Packing tiers (config section `query.pack`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PackConfig {
    /// Most tokens of the expanded top result.
    pub expanded_tokens: usize,
    /// Most tokens of a snippet.
    pub snippet_tokens: usize,
    /// Most tokens of the smallest snippet: the sentence holding most query terms.
    pub sentence_tokens: usize,
    /// Most tokens of a surrogate.
    pub surrogate_tokens: usize,
    /// An item's relevance by its standing: `exp(−standing_decay · (1 − standing))`, the standing
    /// being its score on the evidence stop's scale (0: the bottom of the rerank's scale, 1: the top
    /// result), with or without the stop; 0 values every item alike.
    pub standing_decay: f32,
    /// And by its rank among the candidates' scores: times `1 / (1 + position_decay · rank)`
    /// (0: rank does not count).
    pub position_decay: f32,
    /// How much an item's value is discounted by its highest cosine to a better item (0 = none).
    pub redundancy_weight: f32,
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
/// (nothing for no items).
pub fn wrap_items(items: &[String], config: &PackConfig) -> String {
    if items.is_empty() {
        return String::new();
    }
    let body = items.join(&config.separator);
    if config.untrusted_delimiters {
        format!("{UNTRUSTED_OPEN}{body}{UNTRUSTED_CLOSE}")
    } else {
        body
    }
}

impl Default for PackConfig {
    fn default() -> Self {
        Self {
            expanded_tokens: 600,
            snippet_tokens: 200,
            sentence_tokens: 60,
            surrogate_tokens: 60,
            standing_decay: 10.0,
            position_decay: 0.0,
            redundancy_weight: 0.5,
            separator: "\n\n".into(),
            untrusted_delimiters: true,
            evidence_ratio: 0.64,
            sentence_ratio: 0.78,
            surrogates: Default::default(),
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

struct Entry<'a> {
    candidate: &'a Candidate,
    forms: Vec<Form>,
    /// Index into `forms`, `None` when left out.
    state: Option<usize>,
    value: f32,
    deferred: bool,
    /// Index into the picked-then-deferred list (and `tiers`).
    position: usize,
    /// The candidate's standing when the evidence band holds it to its best sentence.
    band: Option<f32>,
}

/// Estimated tokens of the plan: items, separators and (when anything is in it) the delimiters.
fn plan_tokens(entries: &[Entry<'_>], separator: usize, delimiters: usize) -> usize {
    let included: Vec<usize> = entries
        .iter()
        .filter_map(|e| e.state.map(|s| e.forms[s].estimate))
        .collect();
    if included.is_empty() {
        return 0;
    }
    included.iter().sum::<usize>() + separator * (included.len() - 1) + delimiters
}

/// Takes the cheapest shrink step (least value lost per token saved). Returns false if none is left.
fn shrink(entries: &mut [Entry<'_>]) -> bool {
    let mut best: Option<(usize, Option<usize>, f32)> = None;
    for (index, entry) in entries.iter().enumerate() {
        let Some(state) = entry.state else { continue };
        let current = &entry.forms[state];
        // The next smaller form, or dropping (never for the top result).
        let mut options: Vec<(Option<usize>, usize, f32)> = (state + 1..entry.forms.len())
            .map(|s| (Some(s), entry.forms[s].estimate, entry.forms[s].factor()))
            .collect();
        if index != 0 || entry.deferred {
            options.push((None, 0, 0.0));
        }
        for (next, size, factor) in options {
            if size >= current.estimate {
                continue;
            }
            let saved = (current.estimate - size) as f32;
            let lost = entry.value * (current.factor() - factor).max(0.0);
            let cost = lost / saved;
            if best.is_none_or(|(_, _, c)| cost < c) {
                best = Some((index, next, cost));
            }
            break;
        }
    }
    match best {
        Some((index, next, _)) => {
            entries[index].state = next;
            true
        }
        None => false,
    }
}

fn assemble(entries: &[Entry<'_>], config: &PackConfig) -> String {
    let items: Vec<String> = entries
        .iter()
        .filter_map(|e| e.state.map(|s| &e.forms[s]))
        .map(|f| render(&f.header, &f.text))
        .collect();
    wrap_items(&items, config)
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
    match pack_once(request, true) {
        (first, true) => {
            let mut packed = pack_once(request, false).0;
            packed.counts += first.counts;
            packed
        }
        (packed, false) => packed,
    }
}

/// One packing; with `offer_expanded`, the top result's first form is its expanded one. Also
/// whether the expanded form covered another candidate's text and was then given up.
fn pack_once(request: PackRequest<'_>, offer_expanded: bool) -> (Packed, bool) {
    let PackRequest {
        picked,
        deferred,
        neighbours,
        budget,
        counter,
        terms,
        cue,
        config,
        fill,
        floor,
        tiers,
    } = request;
    let mut packed = Packed::default();
    let terms: Vec<memchr::memmem::Finder<'_>> = terms
        .iter()
        .map(|term| memchr::memmem::Finder::new(term.as_bytes()))
        .collect();
    let separator_tokens = counter.count(&config.separator);
    let delimiter_tokens = if config.untrusted_delimiters {
        counter.count(UNTRUSTED_OPEN) + counter.count(UNTRUSTED_CLOSE)
    } else {
        0
    };
    let all: Vec<(&Candidate, bool)> = picked
        .iter()
        .map(|c| (c, false))
        .chain(deferred.iter().map(|c| (c, true)))
        .collect();
    if all.is_empty() {
        return (packed, false);
    }
    // Each vector's dot product with itself, for the cosines between items.
    let self_dots: Vec<Option<f32>> = all
        .iter()
        .map(|(c, _)| c.vector.as_deref().map(|v| dot(v, v)))
        .collect();
    let mut covered: BTreeMap<&crate::model::DocKey, Vec<(u32, u32)>> = BTreeMap::new();
    let mut entries: Vec<Entry<'_>> = Vec::with_capacity(all.len());
    let scale = {
        let top = all.iter().map(|(c, _)| c.score).fold(f32::MIN, f32::max);
        (top, (top - floor.min(top)).max(f32::EPSILON))
    };
    let stop = (!fill && config.evidence_ratio > 0.0).then_some(scale);
    let (mut stopped, mut banded) = (0, 0);
    // The document of the top result when its first form is expanded, and whether that form
    // covered a later candidate of it.
    let mut expanded_document = None;
    let mut expanded_covers_others = false;
    for (position, (candidate, is_deferred)) in all.iter().enumerate() {
        let mut band = None;
        if let Some((top, range)) = stop.filter(|_| position > 0) {
            let standing = 1.0 - (top - candidate.score) / range;
            if standing < config.sentence_ratio {
                band = Some(standing);
            }
            if standing < config.evidence_ratio {
                stopped += 1;
                packed.decisions.push(Decision::new(
                    candidate.id(),
                    Action::Dropped,
                    Cause::EvidenceStop,
                    format!(
                        "evidence stop: score at {standing:.2} of the top result's (scale bottom 0), below {}",
                        config.evidence_ratio
                    ),
                ));
                continue;
            }
        }
        let stored = &candidate.stored;
        expanded_covers_others |= expanded_document == Some(&stored.key);
        let doc_covered = covered.entry(&stored.key).or_default();
        let Some(available) = uncovered(&stored.chunk, doc_covered) else {
            packed.decisions.push(Decision::new(
                candidate.id(),
                Action::Dropped,
                Cause::Overlap,
                "text already in the context (overlapping window)",
            ));
            continue;
        };
        let ceiling = tiers
            .get(position)
            .map_or(SurrogateTier::Full, |(tier, _)| *tier);
        let expanded_form = (offer_expanded && position == 0 && ceiling == SurrogateTier::Full)
            .then(|| expanded(stored, neighbours, counter, config.expanded_tokens))
            .flatten();
        let forms = forms(
            candidate,
            available,
            (&terms, cue),
            config,
            counter,
            expanded_form,
            ceiling,
            if band.is_some() {
                Room::Sentence
            } else {
                Room::Whole
            },
        );
        doc_covered.push(forms[0].range);
        if forms[0].tier == Tier::Expanded {
            expanded_document = Some(&stored.key);
        } else {
            doc_covered.push(stored.chunk.char_range);
        }
        let position_of = position;
        // Relevance by the score, not by MMR's pick order (that trades relevance for diversity,
        // which the redundancy discount below accounts for): by its standing on the evidence stop's
        // scale (candidates that score alike are worth alike, whatever their ranks; one far below
        // the top is worth little even at rank 2), and by its rank where `position_decay` asks.
        let standing = 1.0 - (scale.0 - candidate.score) / scale.1;
        let mut relevance = (-config.standing_decay * (1.0 - standing)).exp();
        if config.position_decay > 0.0 {
            let rank = all
                .iter()
                .filter(|(other, _)| other.score > candidate.score)
                .count();
            relevance /= 1.0 + config.position_decay * rank as f32;
        }
        let redundancy = candidate.vector.as_ref().map_or(0.0, |v| {
            all[..position]
                .iter()
                .zip(&self_dots)
                .filter_map(|((other, _), other_dot)| {
                    Some(cosine_with_norms(
                        v,
                        other.vector.as_ref()?,
                        self_dots[position]?,
                        (*other_dot)?,
                    ))
                })
                .fold(0.0f32, f32::max)
        });
        let value = relevance
            * (1.0 - config.redundancy_weight * redundancy.max(0.0))
            * if *is_deferred { 0.5 } else { 1.0 };
        entries.push(Entry {
            candidate,
            state: (!is_deferred).then_some(0),
            forms,
            value,
            deferred: *is_deferred,
            position: position_of,
            band,
        });
    }
    // Plan on estimates.
    while plan_tokens(&entries, separator_tokens, delimiter_tokens) > budget && shrink(&mut entries)
    {
    }
    // Greedy shrinking can overshoot: grow items back (best value first, left-out and deferred ones
    // included) to the largest form that still fits.
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by(|&a, &b| entries[b].value.total_cmp(&entries[a].value));
    for index in order {
        let current = entries[index].state;
        for form in 0..current.unwrap_or(entries[index].forms.len()) {
            entries[index].state = Some(form);
            if plan_tokens(&entries, separator_tokens, delimiter_tokens) <= budget {
                break;
            }
            entries[index].state = current;
        }
    }
    // Count the real string; shrink until it fits.
    loop {
        packed.context = assemble(&entries, config);
        packed.tokens_used = counter.count(&packed.context);
        packed.counts += 1;
        if packed.tokens_used <= budget || !shrink(&mut entries) {
            break;
        }
    }
    if packed.tokens_used > budget {
        // Only the top result's surrogate is left and it is still too long: cut it to the budget.
        if let Some(entry) = entries.iter_mut().find(|e| e.state.is_some()) {
            let form = &mut entry.forms[entry.state.expect("found")];
            let header_tokens = counter.count(&form.header) + delimiter_tokens;
            let room = budget.saturating_sub(header_tokens + 1);
            if room == 0 {
                entry.state = None;
            } else {
                form.text = counter.truncate(&form.text, room).trim_end().to_string();
                if form.text.is_empty() {
                    entry.state = None;
                }
            }
        }
        packed.context = assemble(&entries, config);
        packed.tokens_used = counter.count(&packed.context);
        packed.counts += 1;
        if packed.tokens_used > budget {
            for entry in &mut entries {
                entry.state = None;
            }
            packed.context.clear();
            packed.tokens_used = 0;
        }
    }
    // Items and decisions.
    let (mut shortened, mut left_out) = (0, 0);
    for entry in &entries {
        let id = entry.candidate.id();
        match entry.state {
            Some(state) => {
                let form = &entry.forms[state];
                if state > 0 {
                    shortened += 1;
                }
                let (cause, reason) = if matches!(form.tier, Tier::Gist | Tier::Micro) {
                    let why = tiers
                        .get(entry.position)
                        .map_or("", |(_, why)| why.as_str());
                    (
                        Cause::SurrogatePolicy,
                        format!("surrogate tier {}: {why}", form.tier.as_str()),
                    )
                } else if let (Some(standing), 0) = (entry.band, state) {
                    banded += 1;
                    (
                        Cause::EvidenceBand,
                        format!(
                            "evidence band: score at {standing:.2} of the top result's (scale bottom 0), below {}: its best sentence only",
                            config.sentence_ratio
                        ),
                    )
                } else if state > 0 {
                    let first = entry.forms[0].tier.as_str();
                    (
                        Cause::Shortened,
                        format!("shortened from {first} to fit the budget"),
                    )
                } else if entry.deferred {
                    (
                        Cause::BudgetLeft,
                        "budget left unused: deferred candidate added".to_string(),
                    )
                } else {
                    (Cause::Fits, "fits".to_string())
                };
                packed
                    .decisions
                    .push(Decision::new(id, form.tier.into(), cause, reason));
                let stored = &entry.candidate.stored;
                packed.items.push(ContextItem {
                    chunk_id: entry.candidate.id(),
                    doc_id: stored.key.doc_id.clone(),
                    source: stored.chunk.source.clone(),
                    lines: form.lines,
                    page: stored.chunk.page,
                    section_path: stored.chunk.section_path.clone(),
                    tier: form.tier,
                    score: entry.candidate.score,
                    tokens: counter.count(&render(&form.header, &form.text)),
                    text: form.text.clone(),
                    metadata: stored.chunk.metadata.to_object(),
                });
            }
            None if !entry.deferred => {
                left_out += 1;
                packed.decisions.push(Decision::new(
                    id,
                    Action::Dropped,
                    Cause::OverBudget,
                    "lowest marginal value (score, redundancy) when over budget",
                ));
            }
            None => {}
        }
    }
    packed.truncated = shortened + left_out > 0;
    let mut notes = Vec::new();
    if packed.truncated {
        notes.push(format!(
            "budget {budget}: {shortened} item(s) shortened, {left_out} left out (lowest marginal value first)"
        ));
    }
    if banded > 0 {
        notes.push(format!(
            "evidence band: {banded} candidate(s) scored below {} of the top result's score packed as their best sentence (fill: true packs them whole)",
            config.sentence_ratio
        ));
    }
    if stopped > 0 {
        notes.push(format!(
            "evidence stop: {stopped} candidate(s) scored below {} of the top result's score (scale bottom 0) left out; {} of {budget} tokens used (fill: true packs to the budget)",
            config.evidence_ratio, packed.tokens_used
        ));
    }
    if !notes.is_empty() {
        packed.note = Some(notes.join("; "));
    }
    let expanded_given_up = entries.first().is_some_and(|top| {
        top.position == 0 && top.forms[0].tier == Tier::Expanded && top.state != Some(0)
    });
    (packed, expanded_covers_others && expanded_given_up)
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
        let rendered = render(&header(chunk, chunk.lines), text);
        items.push(ContextItem {
            chunk_id: candidate.id(),
            doc_id: candidate.stored.key.doc_id.clone(),
            source: chunk.source.clone(),
            lines: chunk.lines,
            page: chunk.page,
            section_path: chunk.section_path.clone(),
            tier: Tier::Full,
            score: candidate.score,
            tokens: counter.count(&rendered),
            text: text.clone(),
            metadata: chunk.metadata.to_object(),
        });
        parts.push(rendered);
    }
    let context = wrap_items(&parts, config);
    let tokens = counter.count(&context);
    (items, context, tokens)
}

#[cfg(test)]
mod tests;
