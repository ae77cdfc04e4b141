//! The forms a candidate can take in a context (snippets, surrogates; the whole ones are in
//! `whole.rs`) and how each is cut: sentences scored by the query's terms and the answer's kind
//! ([`AnswerCue`]), token estimates before the exact count.

use super::{Candidate, PackConfig, Tier};
use crate::query::surrogate::{gist, key_phrases, SurrogateTier};
use crate::text::{sentence_spans, sentences};
use crate::tokens::TokenCounter;

/// The share of a candidate's value each form keeps ([`Form::factor`]): the packer weighs a form's
/// value against its tokens, so these rank the forms of one candidate against each other and
/// against other candidates' forms. The whole chunk keeps all of it.
pub(super) mod value {
    /// The chunk as it is (or a snippet that turned out to be all of it).
    pub(in crate::query::pack) const WHOLE: f32 = 1.0;
    /// The chunk with its neighbours and section header: worth more than the chunk alone.
    pub(in crate::query::pack) const EXPANDED: f32 = 1.25;
    /// A snippet of `snippet_tokens`.
    pub(in crate::query::pack) const SNIPPET: f32 = 0.8;
    /// A snippet of half that.
    pub(in crate::query::pack) const SHORT_SNIPPET: f32 = 0.6;
    /// The sentence holding most query terms, where `sentence_tokens` is shorter still.
    pub(in crate::query::pack) const SENTENCE: f32 = 0.45;
    /// The gist tier: the chunk's most central sentences.
    pub(in crate::query::pack) const GIST: f32 = 0.4;
    /// The surrogate: title, section path and first sentence.
    pub(in crate::query::pack) const SURROGATE: f32 = 0.15;
    /// The micro tier: key phrases only.
    pub(in crate::query::pack) const MICRO: f32 = 0.1;
}

/// Tokens per byte of a cut, over the chunk's average: a cut part can be denser than the whole
/// (a token estimate before the exact count must not come in under it).
const TOKEN_MARGIN: f64 = 1.1;
/// Tokens added to a cut's estimate (a word split at either end).
const CUT_TOKENS: usize = 2;
/// Bytes a cut stays under its budget: a margin for the estimate.
const CUT_BYTES: usize = 8;

/// One way to render a candidate.
#[derive(Debug, Clone)]
pub(super) struct Form {
    pub(super) tier: Tier,
    /// Share of the candidate's value this form keeps (the expanded form is worth more than the chunk).
    pub(super) factor: f32,
    pub(super) header: String,
    pub(super) text: String,
    pub(super) lines: (u32, u32),
    /// Byte range in the document this form covers.
    pub(super) range: (u32, u32),
    pub(super) estimate: usize,
}

impl Form {
    pub(super) fn factor(&self) -> f32 {
        self.factor
    }
}

/// Estimated tokens of `bytes` bytes of a chunk with `tokens` tokens over `total` bytes (rounded up,
/// with a margin for the cut).
pub(super) fn estimate(tokens: u32, total: usize, bytes: usize) -> usize {
    if bytes == 0 {
        return 0;
    }
    if bytes >= total {
        return tokens as usize;
    }
    let share = tokens as f64 * bytes as f64 / total.max(1) as f64;
    (share * TOKEN_MARGIN).ceil() as usize + CUT_TOKENS
}

/// Cuts `text` to at most `max_bytes` at a whitespace boundary (or a char boundary if none).
pub(super) fn cut_bytes(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let end = text.floor_char_boundary(max_bytes);
    match text[..end].rfind(char::is_whitespace) {
        Some(space) if space > 0 => text[..space].trim_end(),
        _ => &text[..end],
    }
}

pub(super) fn line_of(chunk: &crate::model::Chunk, offset: usize) -> u32 {
    let offset = offset.min(chunk.text.len());
    chunk.lines.0 + memchr::memchr_iter(b'\n', &chunk.text.as_bytes()[..offset]).count() as u32
}

/// An item's citation line, by the config's `header_format` (by default `Source: guide.md (lines
/// 3–9)`, with the page for a PDF: `Source: report.pdf (page 2, lines 40–52)`), and with
/// `include_metadata_in_context` a `Metadata: {json}` line when the document has metadata.
pub(super) fn header(
    chunk: &crate::model::Chunk,
    lines: (u32, u32),
    config: &PackConfig,
) -> String {
    let span = format!("{}–{}", lines.0, lines.1);
    let location = match chunk.page {
        Some(page) => format!("page {page}, lines {span}"),
        None => format!("lines {span}"),
    };
    let mut out = if config.header_format == super::DEFAULT_HEADER {
        format!("Source: {} ({location})", chunk.source)
    } else {
        let page = chunk.page.map(|p| p.to_string()).unwrap_or_default();
        let section = chunk.section_path.join(" › ");
        super::fill_header(
            &config.header_format,
            &[
                ("source", chunk.source.as_str()),
                ("location", location.as_str()),
                ("lines", span.as_str()),
                ("page", page.as_str()),
                ("title", chunk.doc_title.as_str()),
                ("section", section.as_str()),
            ],
        )
    };
    out.push('\n');
    if config.include_metadata_in_context && !chunk.metadata.is_empty() {
        out.push_str("Metadata: ");
        out.push_str(chunk.metadata.as_str());
        out.push('\n');
    }
    out
}

/// The part of a chunk not covered by `covered` (byte ranges of the same document): its largest
/// uncovered piece, as offsets into the chunk text.
pub(super) fn uncovered(
    chunk: &crate::model::Chunk,
    covered: &[(u32, u32)],
) -> Option<(usize, usize)> {
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

pub(super) const MONTHS: [&str; 12] = [
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
pub(super) type Terms<'a> = &'a [memchr::memmem::Finder<'a>];

/// A sentence's score for snippet selection: query terms held (counting double), plus one when it
/// holds text of the answer's kind. `lower` is the sentence lowercased.
pub(super) fn sentence_score(
    sentence: &str,
    lower: &str,
    terms: Terms<'_>,
    cue: AnswerCue,
) -> usize {
    let hits = terms
        .iter()
        .filter(|t| t.find(lower.as_bytes()).is_some())
        .count();
    2 * hits + usize::from(cue.matches(sentence))
}

/// The sentences of a chunk's available text and their scores, computed once for all snippet sizes.
pub(super) struct Scored {
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
/// holds the sentences of `from..to`, computed on first need). With `sentence_only` and more than
/// one sentence, the best sentence alone, whatever fits.
pub(super) fn snippet(
    chunk: &crate::model::Chunk,
    (from, to): (usize, usize),
    scored: &mut Option<Scored>,
    (terms, cue): (Terms<'_>, AnswerCue),
    max_tokens: usize,
    sentence_only: bool,
) -> (usize, usize, bool) {
    let total = chunk.text.len();
    let whole = from == 0 && to == total;
    let sentence_only = sentence_only
        && scored
            .get_or_insert_with(|| Scored::of(chunk, (from, to), terms, cue))
            .spans
            .len()
            > 1;
    if !sentence_only && estimate(chunk.tokens, total, to - from) <= max_tokens {
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
            (max_tokens as f64 / TOKEN_MARGIN * total as f64 / chunk.tokens.max(1) as f64) as usize;
        let kept = cut_bytes(
            &chunk.text[spans[best].0..spans[best].1],
            budget_bytes.saturating_sub(CUT_BYTES),
        );
        return (spans[best].0, spans[best].0 + kept.len(), false);
    }
    if sentence_only {
        return (spans[best].0, spans[best].1, false);
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

/// The chunk's title › section path (cut to 160 bytes), the label of its surrogates.
fn label_of(chunk: &crate::model::Chunk) -> String {
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
    cut_bytes(&label, 160).to_string()
}

/// The forms of a chunk whose surrogate tier is below `full`: its gist (tier `gist` only), then its
/// key phrases, each after its label.
fn tiered_forms(
    chunk: &crate::model::Chunk,
    (from, to): (usize, usize),
    ceiling: SurrogateTier,
    config: &PackConfig,
    header_tokens: usize,
) -> Vec<Form> {
    let base = chunk.char_range.0;
    let label = label_of(chunk);
    let label_tokens = if label.is_empty() {
        0
    } else {
        label.len() / 3 + 2
    };
    let part = &chunk.text[from..to];
    let total = chunk.text.len();
    let with_label = |text: &str| {
        if label.is_empty() {
            text.to_string()
        } else {
            format!("{label}: {text}")
        }
    };
    let lines = (line_of(chunk, from), line_of(chunk, to));
    let header = header(chunk, lines, config);
    let form = |tier, factor, text: String, bytes: usize| Form {
        tier,
        factor,
        estimate: header_tokens + label_tokens + estimate(chunk.tokens, total, bytes),
        header: header.clone(),
        text,
        lines,
        range: (base + from as u32, base + to as u32),
    };
    let mut out = Vec::new();
    if ceiling == SurrogateTier::Gist {
        let budget = (config.surrogates.gist_tokens as f64 / TOKEN_MARGIN * total as f64
            / chunk.tokens.max(1) as f64) as usize;
        let gist = gist(part, budget.max(16));
        if !gist.is_empty() {
            out.push(form(Tier::Gist, value::GIST, with_label(&gist), gist.len()));
        }
    }
    let phrases = key_phrases(part, config.surrogates.micro_phrases);
    out.push(form(
        Tier::Micro,
        value::MICRO,
        with_label(&phrases),
        phrases.len(),
    ));
    out
}

/// The surrogate text of a chunk: title › section path: first sentence (cut to `max_tokens`).
pub(super) fn surrogate_text(
    chunk: &crate::model::Chunk,
    (from, to): (usize, usize),
    max_tokens: usize,
) -> (String, usize, usize) {
    let label = label_of(chunk);
    let part = &chunk.text[from..to];
    let first = sentence_spans(part).next().unwrap_or((0, part.len()));
    let sentence = &part[first.0..first.1];
    let total = chunk.text.len();
    // Label and sentence share the surrogate's tokens; the label is short metadata.
    let label_tokens = label.len() / 3 + 1;
    let room = max_tokens.saturating_sub(label_tokens);
    let budget_bytes =
        (room as f64 / TOKEN_MARGIN * total as f64 / chunk.tokens.max(1) as f64) as usize;
    let kept = cut_bytes(sentence, budget_bytes.saturating_sub(CUT_BYTES));
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

/// How much of a candidate the evidence allows into the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Room {
    /// Any form, from the richest.
    Whole,
    /// Its best sentence at most (prose); its smallest snippet (code, schemas: one line of a
    /// function is rarely readable alone).
    Sentence,
}

#[allow(clippy::too_many_arguments)]
pub(super) fn forms(
    candidate: &Candidate,
    available: (usize, usize),
    (terms, cue): (Terms<'_>, AnswerCue),
    config: &PackConfig,
    counter: TokenCounter,
    expanded_form: Option<Form>,
    ceiling: SurrogateTier,
    room: Room,
) -> Vec<Form> {
    let chunk = &candidate.stored.chunk;
    let base = chunk.char_range.0;
    // Every form's header names a sub-range of the chunk's lines: the header with the last line
    // twice has the most digits, an upper bound counted once for all of them.
    let header_tokens = counter.count(&header(chunk, (chunk.lines.1, chunk.lines.1), config));
    if ceiling != SurrogateTier::Full {
        return tiered_forms(chunk, available, ceiling, config, header_tokens);
    }
    let mut out: Vec<Form> = expanded_form.into_iter().collect();
    let mut scored = None;
    // A snippet, a shorter one (half the tokens) and the sentence holding most query terms, for
    // tight budgets: each keeps less of the candidate's value.
    let mut limits = vec![
        (config.snippet_tokens, value::SNIPPET),
        (config.snippet_tokens / 2, value::SHORT_SNIPPET),
    ];
    if config.sentence_tokens < config.snippet_tokens / 2 {
        limits.push((config.sentence_tokens, value::SENTENCE));
    }
    let prose = matches!(
        chunk.kind,
        crate::model::DocKind::Prose | crate::model::DocKind::Markdown
    );
    let sentence_only = room == Room::Sentence && prose;
    if room == Room::Sentence {
        // Prose: the whole best sentence up to the short snippet's size (a sentence cut short
        // loses what it ends with); code: the smallest snippet.
        let (smallest, factor) = *limits.last().expect("two limits at least");
        limits = vec![if prose {
            (config.snippet_tokens / 2, factor)
        } else {
            (smallest, factor)
        }];
    }
    for (limit, factor) in limits {
        if limit == 0 {
            continue;
        }
        let (from, to, whole) = snippet(
            chunk,
            available,
            &mut scored,
            (terms, cue),
            limit,
            sentence_only,
        );
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
        let header = header(chunk, lines, config);
        out.push(Form {
            tier: Tier::Snippet,
            factor: if whole { value::WHOLE } else { factor },
            estimate: header_tokens + estimate(chunk.tokens, chunk.text.len(), to - from),
            header,
            text: chunk.text[from..to].to_string(),
            lines,
            range: (base + from as u32, base + to as u32),
        });
    }
    let (text, at, text_estimate) = surrogate_text(chunk, available, config.surrogate_tokens);
    let line = line_of(chunk, at);
    let header = header(chunk, (line, line), config);
    out.push(Form {
        tier: Tier::Surrogate,
        factor: value::SURROGATE,
        estimate: header_tokens + text_estimate,
        header,
        text,
        lines: (line, line),
        range: (base + at as u32, base + at as u32),
    });
    out
}
