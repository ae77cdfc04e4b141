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
//! drop it, where an item's value is its relevance discounted by its redundancy with better items. The
//! assembled string is then counted with the real tokenizer; if it is still over budget another step
//! is taken and it is counted again. The top result is never dropped while anything fits: its last
//! form is its surrogate cut to the budget. Budget left over is filled with deferred candidates.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Action, Candidate, Cause, ContextItem, Decision, Tier};
use crate::embed::{cosine_with_norms, dot};
use crate::store::StoredChunk;
use crate::tokens::TokenCounter;

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
    /// Value by rank: `1 / (1 + position_decay · position)`.
    pub position_decay: f32,
    /// How much an item's value is discounted by its highest cosine to a better item (0 = none).
    pub redundancy_weight: f32,
    /// Between items.
    pub separator: String,
    /// Wrap the context in the untrusted-content delimiters ([`UNTRUSTED_OPEN`], [`UNTRUSTED_CLOSE`]).
    pub untrusted_delimiters: bool,
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
            position_decay: 3.0,
            redundancy_weight: 0.5,
            separator: "\n\n".into(),
            untrusted_delimiters: true,
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

/// One way to render a candidate.
#[derive(Debug, Clone)]
struct Form {
    tier: Tier,
    /// Share of the candidate's value this form keeps (the expanded form is worth more than the chunk).
    factor: f32,
    header: String,
    text: String,
    lines: (u32, u32),
    /// Byte range in the document this form covers.
    range: (u32, u32),
    estimate: usize,
}

impl Form {
    fn factor(&self) -> f32 {
        self.factor
    }
}

struct Entry<'a> {
    candidate: &'a Candidate,
    forms: Vec<Form>,
    /// Index into `forms`, `None` when left out.
    state: Option<usize>,
    value: f32,
    deferred: bool,
}

/// Whether a sentence ends at byte `at` of `bytes`: a line break, or `.`, `?` or `!` before whitespace
/// or the end of the text.
pub fn ends_sentence(bytes: &[u8], at: usize) -> bool {
    match bytes[at] {
        b'\n' => true,
        b'.' | b'?' | b'!' => bytes.get(at + 1).is_none_or(|b| b.is_ascii_whitespace()),
        _ => false,
    }
}

/// The first byte at or after `from` where a sentence ends (see [`ends_sentence`]). The candidates
/// (`.`, `\n`, `?` and `!`) are found by byte search; `!` only before the next of the others, so no
/// byte is searched more than twice.
pub fn next_sentence_end(bytes: &[u8], mut from: usize) -> Option<usize> {
    while from < bytes.len() {
        let rest = &bytes[from..];
        let other = memchr::memchr3(b'.', b'\n', b'?', rest);
        let bang = memchr::memchr(b'!', &rest[..other.unwrap_or(rest.len())]);
        let at = from + bang.or(other)?;
        if ends_sentence(bytes, at) {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// Sentence byte ranges of `text` (trimmed, non-empty).
pub fn sentences(text: &str) -> Vec<(usize, usize)> {
    sentence_spans(text).collect()
}

/// Sentence byte ranges of `text` (trimmed, non-empty), found as they are asked for.
pub fn sentence_spans(text: &str) -> impl Iterator<Item = (usize, usize)> + '_ {
    let bytes = text.as_bytes();
    let mut start = 0;
    std::iter::from_fn(move || {
        while start < bytes.len() {
            let from = start;
            start = next_sentence_end(bytes, from).map_or(bytes.len(), |at| at + 1);
            let piece = &text[from..start];
            let lead = piece.len() - piece.trim_start().len();
            let trimmed = piece.trim();
            if !trimmed.is_empty() {
                return Some((from + lead, from + lead + trimmed.len()));
            }
        }
        None
    })
}

/// Estimated tokens of `bytes` bytes of a chunk with `tokens` tokens over `total` bytes (rounded up,
/// with a margin for the cut).
fn estimate(tokens: u32, total: usize, bytes: usize) -> usize {
    if bytes == 0 {
        return 0;
    }
    if bytes >= total {
        return tokens as usize;
    }
    let share = tokens as f64 * bytes as f64 / total.max(1) as f64;
    (share * 1.1).ceil() as usize + 2
}

/// Cuts `text` to at most `max_bytes` at a whitespace boundary (or a char boundary if none).
fn cut_bytes(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    match text[..end].rfind(char::is_whitespace) {
        Some(space) if space > 0 => text[..space].trim_end(),
        _ => &text[..end],
    }
}

fn line_of(chunk: &crate::model::Chunk, offset: usize) -> u32 {
    let offset = offset.min(chunk.text.len());
    chunk.lines.0 + memchr::memchr_iter(b'\n', &chunk.text.as_bytes()[..offset]).count() as u32
}

fn header(source: &str, lines: (u32, u32)) -> String {
    format!("Source: {source} (lines {}–{})\n", lines.0, lines.1)
}

/// The part of a chunk not covered by `covered` (byte ranges of the same document): its largest
/// uncovered piece, as offsets into the chunk text.
fn uncovered(chunk: &crate::model::Chunk, covered: &[(u32, u32)]) -> Option<(usize, usize)> {
    let (start, end) = chunk.char_range;
    let mut pieces = vec![(start, end)];
    for &(c0, c1) in covered {
        pieces = pieces
            .into_iter()
            .flat_map(|(p0, p1)| {
                if c1 <= p0 || c0 >= p1 {
                    vec![(p0, p1)]
                } else {
                    [(p0, c0.max(p0)), (c1.min(p1), p1)]
                        .into_iter()
                        .filter(|(a, b)| b > a)
                        .collect()
                }
            })
            .collect();
    }
    let (p0, p1) = pieces.into_iter().max_by_key(|(a, b)| b - a)?;
    let (mut from, mut to) = ((p0 - start) as usize, (p1 - start) as usize);
    let text = &chunk.text;
    while from < text.len() && !text.is_char_boundary(from) {
        from += 1;
    }
    while to > from && !text.is_char_boundary(to) {
        to -= 1;
    }
    // Skip a piece that is only whitespace or a few characters of a cut word.
    (text[from..to].trim().len() >= 3).then_some((from, to))
}

/// What kind of text answers a question, from its question words: among sentences holding as many
/// query terms, a snippet centres on one that also holds such text (the answer sentence of "where
/// was it played?" names a place, not only the terms of the question).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AnswerCue {
    /// No question word that tells.
    #[default]
    None,
    /// "when", "what year": a year or a month name.
    Time,
    /// "how many", "how much", "how long", "what percentage": a number.
    Number,
    /// "where": a capitalised word after a preposition of place.
    Place,
    /// "who", "whom", "whose": a capitalised word other than the sentence's first.
    Name,
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

impl AnswerCue {
    /// The cue of a question text.
    pub fn of_question(text: &str) -> Self {
        let lower = text.to_lowercase();
        let words: Vec<&str> = lower
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .collect();
        let has = |word: &str| words.contains(&word);
        let pair = |first: &str, seconds: &[&str]| {
            words
                .windows(2)
                .any(|w| w[0] == first && seconds.contains(&w[1]))
        };
        if has("when")
            || pair("what", &["year", "date", "century", "decade"])
            || pair("which", &["year", "century"])
        {
            Self::Time
        } else if pair(
            "how",
            &[
                "many", "much", "long", "far", "old", "large", "big", "high", "tall",
            ],
        ) || has("percentage")
            || has("percent")
        {
            Self::Number
        } else if has("where") {
            Self::Place
        } else if has("who") || has("whom") || has("whose") {
            Self::Name
        } else {
            Self::None
        }
    }

    /// Whether `sentence` holds text of this kind.
    pub fn matches(self, sentence: &str) -> bool {
        let capitalised = |word: &str| word.chars().next().is_some_and(char::is_uppercase);
        match self {
            Self::None => false,
            Self::Number => sentence.bytes().any(|b| b.is_ascii_digit()),
            Self::Time => sentence.split(|c: char| !c.is_alphanumeric()).any(|word| {
                (word.len() == 4
                    && word
                        .parse::<u32>()
                        .is_ok_and(|y| (1000..=2099).contains(&y)))
                    || MONTHS.contains(&word)
            }),
            Self::Place => sentence
                .split_whitespace()
                .collect::<Vec<_>>()
                .windows(2)
                .any(|w| matches!(w[0], "in" | "at" | "near" | "from" | "to") && capitalised(w[1])),
            Self::Name => sentence.split_whitespace().skip(1).any(capitalised),
        }
    }
}

/// The query terms, each with its searcher (built once per pack).
type Terms<'a> = &'a [memchr::memmem::Finder<'a>];

/// A sentence's score for snippet selection: query terms held (counting double), plus one when it
/// holds text of the answer's kind. `lower` is the sentence lowercased.
fn sentence_score(sentence: &str, lower: &str, terms: Terms<'_>, cue: AnswerCue) -> usize {
    let hits = terms
        .iter()
        .filter(|t| t.find(lower.as_bytes()).is_some())
        .count();
    2 * hits + usize::from(cue.matches(sentence))
}

/// The sentences of a chunk's available text and their scores, computed once for all snippet sizes.
struct Scored {
    spans: Vec<(usize, usize)>,
    scores: Vec<usize>,
}

impl Scored {
    fn of(
        chunk: &crate::model::Chunk,
        (from, to): (usize, usize),
        terms: Terms<'_>,
        cue: AnswerCue,
    ) -> Self {
        let spans: Vec<(usize, usize)> = sentences(&chunk.text[from..to])
            .into_iter()
            .map(|(a, b)| (a + from, b + from))
            .collect();
        // ASCII text is lowercased once, in place of each sentence (the same bytes).
        let ascii_lower = chunk.text[from..to]
            .is_ascii()
            .then(|| chunk.text[from..to].to_ascii_lowercase());
        let scores = spans
            .iter()
            .map(|&(a, b)| {
                let sentence = &chunk.text[a..b];
                match &ascii_lower {
                    Some(lower) => sentence_score(sentence, &lower[a - from..b - from], terms, cue),
                    None => sentence_score(sentence, &sentence.to_lowercase(), terms, cue),
                }
            })
            .collect();
        Self { spans, scores }
    }
}

/// The snippet of `chunk[from..to]`: whole if it fits, else the best sentence window (`scored`
/// holds the sentences of `from..to`, computed on first need).
fn snippet(
    chunk: &crate::model::Chunk,
    (from, to): (usize, usize),
    scored: &mut Option<Scored>,
    (terms, cue): (Terms<'_>, AnswerCue),
    max_tokens: usize,
) -> (usize, usize, bool) {
    let total = chunk.text.len();
    let whole = from == 0 && to == total;
    if estimate(chunk.tokens, total, to - from) <= max_tokens {
        return (from, to, whole);
    }
    let Scored { spans, scores } =
        scored.get_or_insert_with(|| Scored::of(chunk, (from, to), terms, cue));
    if spans.is_empty() {
        return (from, from, false);
    }
    let best = (0..spans.len())
        .max_by(|&a, &b| scores[a].cmp(&scores[b]).then(b.cmp(&a)))
        .expect("non-empty");
    let fits = |a: usize, b: usize| estimate(chunk.tokens, total, b - a) <= max_tokens;
    let (mut lo, mut hi) = (best, best);
    if !fits(spans[best].0, spans[best].1) {
        // One long sentence: cut it at a word boundary.
        let budget_bytes =
            (max_tokens as f64 / 1.1 * total as f64 / chunk.tokens.max(1) as f64) as usize;
        let kept = cut_bytes(
            &chunk.text[spans[best].0..spans[best].1],
            budget_bytes.saturating_sub(8),
        );
        return (spans[best].0, spans[best].0 + kept.len(), false);
    }
    loop {
        let after =
            (hi + 1 < spans.len() && fits(spans[lo].0, spans[hi + 1].1)).then(|| scores[hi + 1]);
        let before = (lo > 0 && fits(spans[lo - 1].0, spans[hi].1)).then(|| scores[lo - 1]);
        match (before, after) {
            (Some(b), Some(a)) if b > a => lo -= 1,
            (_, Some(_)) => hi += 1,
            (Some(_), None) => lo -= 1,
            (None, None) => break,
        }
    }
    (spans[lo].0, spans[hi].1, false)
}

/// The surrogate text of a chunk: title › section path: first sentence (cut to `max_tokens`).
fn surrogate_text(
    chunk: &crate::model::Chunk,
    (from, to): (usize, usize),
    max_tokens: usize,
) -> (String, usize, usize) {
    let mut label = chunk.doc_title.clone();
    let path: Vec<&str> = chunk
        .section_path
        .iter()
        .map(String::as_str)
        .filter(|s| *s != chunk.doc_title)
        .collect();
    if !path.is_empty() {
        if !label.is_empty() {
            label.push_str(" › ");
        }
        label.push_str(&path.join(" › "));
    }
    let part = &chunk.text[from..to];
    let first = sentence_spans(part).next().unwrap_or((0, part.len()));
    let sentence = &part[first.0..first.1];
    let total = chunk.text.len();
    // Label and sentence share the surrogate's tokens; the label is short metadata.
    let label = cut_bytes(&label, 160).to_string();
    let label_tokens = label.len() / 3 + 1;
    let room = max_tokens.saturating_sub(label_tokens);
    let budget_bytes = (room as f64 / 1.1 * total as f64 / chunk.tokens.max(1) as f64) as usize;
    let kept = cut_bytes(sentence, budget_bytes.saturating_sub(8));
    let text = if label.is_empty() {
        kept.to_string()
    } else if kept.is_empty() {
        label.clone()
    } else {
        format!("{label}: {kept}")
    };
    let estimate = estimate(chunk.tokens, total, kept.len()) + label_tokens + 2;
    (text, from + first.0, estimate)
}

fn expanded(
    top: &StoredChunk,
    neighbours: &[StoredChunk],
    counter: TokenCounter,
    max_tokens: usize,
) -> Option<Form> {
    let chunk = &top.chunk;
    let total = chunk.text.len();
    let section = if chunk.section_path.is_empty() {
        String::new()
    } else {
        format!("§ {}\n", chunk.section_path.join(" › "))
    };
    let mut estimate_tokens = counter.count(&section) + chunk.tokens as usize;
    if estimate_tokens > max_tokens {
        return None;
    }
    let mut by_order: BTreeMap<u32, &StoredChunk> = BTreeMap::new();
    for neighbour in neighbours {
        if neighbour.key == top.key && neighbour.id != top.id {
            by_order.insert(neighbour.chunk.order_index, neighbour);
        }
    }
    let (mut start, mut end) = chunk.char_range;
    let (mut first_line, mut last_line) = chunk.lines;
    let mut text = chunk.text.clone();
    let mut next = chunk.order_index + 1;
    let mut previous = chunk.order_index.checked_sub(1);
    let mut grow_next = true;
    let mut stuck = 0;
    while stuck < 2 {
        let order = if grow_next { Some(next) } else { previous };
        grow_next = !grow_next;
        let Some(neighbour) = order.and_then(|o| by_order.get(&o)) else {
            stuck += 1;
            continue;
        };
        let n = &neighbour.chunk;
        let (n0, n1) = n.char_range;
        let piece = if n.order_index > chunk.order_index {
            // Text after `end`.
            if n1 <= end {
                String::new()
            } else if n0 >= end {
                format!("\n{}", n.text)
            } else {
                let at = (end - n0) as usize;
                if !n.text.is_char_boundary(at) {
                    stuck += 1;
                    continue;
                }
                n.text[at..].to_string()
            }
        } else if n0 >= start {
            String::new()
        } else if n1 <= start {
            format!("{}\n", n.text)
        } else {
            let at = (start - n0) as usize;
            if !n.text.is_char_boundary(at) {
                stuck += 1;
                continue;
            }
            n.text[..at].to_string()
        };
        let cost = estimate(n.tokens, n.text.len(), piece.len());
        if estimate_tokens + cost > max_tokens {
            stuck += 1;
            continue;
        }
        stuck = 0;
        estimate_tokens += cost;
        if n.order_index > chunk.order_index {
            text.push_str(&piece);
            end = end.max(n1);
            last_line = last_line.max(n.lines.1);
            next += 1;
        } else {
            text.insert_str(0, &piece);
            start = start.min(n0);
            first_line = first_line.min(n.lines.0);
            previous = n.order_index.checked_sub(1);
        }
    }
    let _ = total;
    let lines = (first_line, last_line);
    let header = header(&chunk.source, lines);
    Some(Form {
        tier: Tier::Expanded,
        // The neighbours and section header are worth more than the chunk alone.
        factor: 1.25,
        estimate: estimate_tokens + counter.count(&header),
        header,
        text: format!("{section}{text}"),
        lines,
        range: (start, end),
    })
}

fn forms(
    candidate: &Candidate,
    available: (usize, usize),
    (terms, cue): (Terms<'_>, AnswerCue),
    config: &PackConfig,
    counter: TokenCounter,
    expanded_form: Option<Form>,
) -> Vec<Form> {
    let chunk = &candidate.stored.chunk;
    let base = chunk.char_range.0;
    let mut out: Vec<Form> = expanded_form.into_iter().collect();
    // Every form's header names a sub-range of the chunk's lines: the header with the last line
    // twice has the most digits, an upper bound counted once for all of them.
    let header_tokens = counter.count(&header(&chunk.source, (chunk.lines.1, chunk.lines.1)));
    let mut scored = None;
    // A snippet, a shorter one (half the tokens) and the sentence holding most query terms, for
    // tight budgets: each keeps less of the candidate's value.
    let mut limits = vec![
        (config.snippet_tokens, 0.8),
        (config.snippet_tokens / 2, 0.6),
    ];
    if config.sentence_tokens < config.snippet_tokens / 2 {
        limits.push((config.sentence_tokens, 0.45));
    }
    for (limit, factor) in limits {
        if limit == 0 {
            continue;
        }
        let (from, to, whole) = snippet(chunk, available, &mut scored, (terms, cue), limit);
        if to <= from
            || out.iter().any(|f| {
                f.tier == Tier::Snippet && f.range == (base + from as u32, base + to as u32)
            })
        {
            continue;
        }
        let lines = if whole {
            chunk.lines
        } else {
            (line_of(chunk, from), line_of(chunk, to))
        };
        let header = header(&chunk.source, lines);
        out.push(Form {
            tier: Tier::Snippet,
            factor: if whole { 1.0 } else { factor },
            estimate: header_tokens + estimate(chunk.tokens, chunk.text.len(), to - from),
            header,
            text: chunk.text[from..to].to_string(),
            lines,
            range: (base + from as u32, base + to as u32),
        });
    }
    let (text, at, text_estimate) = surrogate_text(chunk, available, config.surrogate_tokens);
    let line = line_of(chunk, at);
    let header = header(&chunk.source, (line, line));
    out.push(Form {
        tier: Tier::Surrogate,
        factor: 0.15,
        estimate: header_tokens + text_estimate,
        header,
        text,
        lines: (line, line),
        range: (base + at as u32, base + at as u32),
    });
    out
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
    let PackRequest {
        picked,
        deferred,
        neighbours,
        budget,
        counter,
        terms,
        cue,
        config,
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
        return packed;
    }
    // Each vector's dot product with itself, for the cosines between items.
    let self_dots: Vec<Option<f32>> = all
        .iter()
        .map(|(c, _)| c.vector.as_deref().map(|v| dot(v, v)))
        .collect();
    let mut covered: BTreeMap<&crate::model::DocKey, Vec<(u32, u32)>> = BTreeMap::new();
    let mut entries: Vec<Entry<'_>> = Vec::with_capacity(all.len());
    for (position, (candidate, is_deferred)) in all.iter().enumerate() {
        let stored = &candidate.stored;
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
        let expanded_form = (position == 0)
            .then(|| expanded(stored, neighbours, counter, config.expanded_tokens))
            .flatten();
        let forms = forms(
            candidate,
            available,
            (&terms, cue),
            config,
            counter,
            expanded_form,
        );
        doc_covered.push(forms[0].range);
        if forms[0].tier != Tier::Expanded {
            doc_covered.push(stored.chunk.char_range);
        }
        // Relevance by rank of the score (MMR chose the set; its pick order trades relevance for
        // diversity, which the redundancy discount below accounts for).
        let rank = all
            .iter()
            .filter(|(other, _)| other.score > candidate.score)
            .count();
        let relevance = 1.0 / (1.0 + config.position_decay * rank as f32);
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
                let (cause, reason) = if state > 0 {
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
                    section_path: stored.chunk.section_path.clone(),
                    tier: form.tier,
                    score: entry.candidate.score,
                    tokens: counter.count(&render(&form.header, &form.text)),
                    text: form.text.clone(),
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
    if packed.truncated {
        packed.note = Some(format!(
            "budget {budget}: {shortened} item(s) shortened, {left_out} left out (lowest marginal value first)"
        ));
    }
    packed
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
        let rendered = render(&header(&chunk.source, chunk.lines), text);
        items.push(ContextItem {
            chunk_id: candidate.id(),
            doc_id: candidate.stored.key.doc_id.clone(),
            source: chunk.source.clone(),
            lines: chunk.lines,
            section_path: chunk.section_path.clone(),
            tier: Tier::Full,
            score: candidate.score,
            tokens: counter.count(&rendered),
            text: text.clone(),
        });
        parts.push(rendered);
    }
    let context = wrap_items(&parts, config);
    let tokens = counter.count(&context);
    (items, context, tokens)
}

#[cfg(test)]
mod tests;
