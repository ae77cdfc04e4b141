//! The rerank's lexical features of one chunk for one query: term recall and precision, entity and
//! date coverage, sentence recall, phrases and distractor cues ([`Lexical`]), computed by [`Features`],
//! which prepares what a query looks for once and applies it to each chunk of the window.

use super::{Plan, RerankConfig};
use crate::store::Bm25Encoder;

/// Words that mark a chunk as tentative: drafts, proposals, checklists, open questions.
pub const DISTRACTOR_CUES: [&str; 12] = [
    "tentative",
    "draft",
    "checklist",
    "todo",
    "tbd",
    "to be confirmed",
    "to be decided",
    "proposal",
    "proposed",
    "not yet decided",
    "work in progress",
    "[ ]",
];

/// The lexical features of one chunk for one query, each 0 to 1 (see the module's formula).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Lexical {
    /// The share of query terms the chunk holds.
    pub term_recall: f32,
    /// The share of the chunk's words that are query terms.
    pub term_precision: f32,
    /// The share of the query's entities the chunk names.
    pub entity: f32,
    /// The share of the query's years and date literals the chunk holds.
    pub date: f32,
    /// 1 for tentative, draft or checklist language, else 0.
    pub distractor: f32,
    /// The largest share of query terms one sentence holds.
    pub sentence_recall: f32,
    /// The share of the query's phrases the chunk holds in order within a sentence.
    pub phrase: f32,
}

impl Lexical {
    /// Each feature's name (the trace's factor), value and weight under `config`, with the lexical
    /// ones scaled by `lexical` ([`Plan::lexical`]), in the order the rerank adds them.
    pub fn weighted(&self, config: &RerankConfig, lexical: f32) -> [(&'static str, f32, f32); 7] {
        [
            (
                "term_recall",
                self.term_recall,
                config.term_recall * lexical,
            ),
            (
                "term_precision",
                self.term_precision,
                config.term_precision * lexical,
            ),
            ("entity", self.entity, config.entity * lexical),
            ("date", self.date, config.date),
            ("distractor", self.distractor, -config.distractor),
            (
                "sentence_recall",
                self.sentence_recall,
                config.sentence_recall * lexical,
            ),
            ("phrase", self.phrase, config.phrase * lexical),
        ]
    }
}

/// What one query's features look for, prepared once per query and applied to each chunk of the
/// window: the stems of words seen (a window's chunks share most words), a searcher per entity and
/// date literal, and the distractor cues tried only where words start.
pub struct Features<'a> {
    plan: &'a Plan,
    bm25: &'a Bm25Encoder,
    /// Only words that could stem to a query term are stemmed (a stem keeps the word's first letters).
    prefixes: Prefixes<'a>,
    /// The query's entities and dates, lowercased, each once with what it stands for, searched for
    /// in the lowercased chunk text (a lowercase needle occurs there exactly where an ASCII
    /// case-insensitive search finds it in the text).
    needles: Vec<(memchr::memmem::Finder<'static>, Vec<Role>)>,
    /// Needles that match anything (empty ones).
    always: Vec<Role>,
    stems: rustc_hash::FxHashMap<String, Option<usize>>,
    /// The lowercased text of the part being searched (reused).
    lowered: String,
    /// The query terms each sentence of the last chunk holds, one bit per term (the first 64 terms),
    /// sentences without any left out: what [`weighted_sentence_recall`] weighs.
    pub(super) sentences: Vec<u64>,
}

/// The first three characters of each query term: a word stems to a term only if it starts with the
/// term's prefix, so the other words of a chunk are never stemmed.
struct Prefixes<'a> {
    prefixes: Vec<&'a str>,
    /// Whether a word starting with this byte may start with a prefix (every byte where a prefix
    /// is empty): most of a chunk's words are ruled out by one lookup.
    first: [bool; 256],
}

impl<'a> Prefixes<'a> {
    fn new(terms: &'a [String]) -> Self {
        let prefixes: Vec<&str> = terms
            .iter()
            .map(|term| &term[..term.char_indices().nth(3).map_or(term.len(), |(i, _)| i)])
            .collect();
        let mut first = [false; 256];
        for prefix in &prefixes {
            match prefix.as_bytes().first() {
                Some(&byte) => first[byte as usize] = true,
                None => first = [true; 256],
            }
        }
        Self { prefixes, first }
    }

    /// Whether `word` starts with any prefix.
    fn start(&self, word: &str) -> bool {
        let first = word
            .as_bytes()
            .first()
            .is_none_or(|&b| self.first[b as usize]);
        first && self.prefixes.iter().any(|prefix| word.starts_with(prefix))
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Role {
    Entity(usize),
    Date(usize),
}

/// The distractor cues, longest first where two start at the same place.
static CUES: std::sync::LazyLock<aho_corasick::AhoCorasick> = std::sync::LazyLock::new(|| {
    aho_corasick::AhoCorasick::builder()
        .match_kind(aho_corasick::MatchKind::LeftmostLongest)
        .build(DISTRACTOR_CUES)
        .expect("the distractor cues build an automaton")
});

/// Whether `text` (ASCII-lowercased) holds a distractor cue as a whole word. A search (a SIMD scan
/// for the cues' bytes) finds the leftmost cue; one that is part of a longer word moves the search on
/// by one byte, so every place a cue starts is tried (no cue is a prefix of another, so at most one
/// cue starts at any place).
pub(super) fn has_cue(text: &str) -> bool {
    let mut from = 0;
    while let Some(found) = CUES.find(aho_corasick::Input::new(text).span(from..text.len())) {
        if is_word_boundary(text, found.start(), found.len()) {
            return true;
        }
        from = found.start() + 1;
    }
    false
}

impl<'a> Features<'a> {
    /// Prepares the features of `plan`.
    pub fn new(plan: &'a Plan, bm25: &'a Bm25Encoder) -> Self {
        let prefixes = Prefixes::new(&plan.terms);
        let mut always = Vec::new();
        let entities = plan
            .entities
            .iter()
            .enumerate()
            .map(|(i, e)| (e.to_lowercase(), Role::Entity(i)));
        let dates = plan
            .dates
            .iter()
            .enumerate()
            .map(|(i, d)| (d.to_lowercase(), Role::Date(i)));
        let mut needles: Vec<(String, Vec<Role>)> = Vec::new();
        for (needle, role) in entities.chain(dates) {
            if needle.is_empty() {
                always.push(role);
            } else if let Some((_, roles)) = needles.iter_mut().find(|(n, _)| *n == needle) {
                roles.push(role);
            } else {
                needles.push((needle, vec![role]));
            }
        }
        let needles = needles
            .into_iter()
            .map(|(needle, roles)| (memchr::memmem::Finder::new(&needle).into_owned(), roles))
            .collect();
        Self {
            plan,
            bm25,
            prefixes,
            needles,
            always,
            stems: rustc_hash::FxHashMap::default(),
            lowered: String::new(),
            sentences: Vec::new(),
        }
    }

    /// The features of a chunk whose text is `parts` joined by line breaks (title, section path,
    /// text).
    pub fn of(&mut self, parts: &[&str]) -> Lexical {
        let mut tally = Tally::new(self.plan);
        self.sentences.clear();
        for role in &self.always {
            match role {
                Role::Entity(i) => tally.entities[*i] = true,
                Role::Date(i) => tally.dates[*i] = true,
            }
        }
        for part in parts {
            self.tally_terms(part, &mut tally);
            self.tally_needles(part, &mut tally);
        }
        tally.lexical(self.plan.terms.len())
    }

    /// Counts `part`'s words, its query terms (per sentence, and as the query's phrases) and the
    /// sentences' term masks.
    fn tally_terms(&mut self, part: &str, tally: &mut Tally) {
        let terms = &self.plan.terms;
        let pairs = &self.plan.pairs;
        let prefixes = &self.prefixes;
        let (stems, bm25, sentences) = (&mut self.stems, self.bm25, &mut self.sentences);
        let Tally {
            phrases,
            total,
            matching,
            present,
            best_sentence,
            in_sentence,
            sentence_count,
            sentence_mask,
            ..
        } = tally;
        let mut end_sentence = |in_sentence: &mut [bool], count: &mut usize, mask: &mut u64| {
            *best_sentence = (*best_sentence).max(*count);
            in_sentence.iter_mut().for_each(|p| *p = false);
            *count = 0;
            if *mask != 0 {
                sentences.push(*mask);
            }
            *mask = 0;
        };
        // The query term the previous word stems to (None: another word, or a sentence start).
        let mut previous: Option<usize> = None;
        bm25.visit_sentence_words(part, |word: Option<&str>| {
            let Some(word) = word else {
                end_sentence(in_sentence, sentence_count, sentence_mask);
                previous = None;
                return;
            };
            *total += 1;
            if !prefixes.start(word) {
                previous = None;
                return;
            }
            let index = match stems.get(word) {
                Some(index) => *index,
                None => {
                    let index = terms.binary_search(&bm25.stem(word)).ok();
                    stems.insert(word.to_string(), index);
                    index
                }
            };
            if let (Some(before), Some(index)) = (previous, index) {
                let pair = (before as u32, index as u32);
                if let Some(found) = pairs.iter().position(|p| *p == pair) {
                    phrases[found] = true;
                }
            }
            previous = index;
            if let Some(index) = index {
                if index < 64 {
                    *sentence_mask |= 1 << index;
                }
                *matching += 1;
                present[index] = true;
                if !in_sentence[index] {
                    in_sentence[index] = true;
                    *sentence_count += 1;
                }
            }
        });
        end_sentence(in_sentence, sentence_count, sentence_mask);
    }

    /// Looks for the distractor cues and the query's entities and dates in `part`, lowercased.
    fn tally_needles(&mut self, part: &str, tally: &mut Tally) {
        if part.is_ascii() {
            self.lowered.clear();
            self.lowered.push_str(part);
            self.lowered.make_ascii_lowercase();
        } else {
            self.lowered = part.to_lowercase();
        }
        let text = self.lowered.as_str();
        tally.distractor = tally.distractor || has_cue(text);
        for (needle, roles) in &self.needles {
            let missing = roles.iter().any(|role| match role {
                Role::Entity(i) => !tally.entities[*i],
                Role::Date(i) => !tally.dates[*i],
            });
            if missing && needle.find(text.as_bytes()).is_some() {
                for role in roles {
                    match role {
                        Role::Entity(i) => tally.entities[*i] = true,
                        Role::Date(i) => tally.dates[*i] = true,
                    }
                }
            }
        }
    }
}

/// What [`Features::of`] counts over one chunk's parts.
struct Tally {
    /// The query's phrases the chunk holds: two of its terms next to each other, in the query's
    /// order, within one sentence (stop words between them skipped, as in the query).
    phrases: Vec<bool>,
    /// Words seen.
    total: usize,
    /// Words that stem to a query term.
    matching: usize,
    /// The query terms seen.
    present: Vec<bool>,
    /// The most distinct query terms in one sentence (answers sit in the sentence that echoes the
    /// question).
    best_sentence: usize,
    in_sentence: Vec<bool>,
    sentence_count: usize,
    sentence_mask: u64,
    entities: Vec<bool>,
    dates: Vec<bool>,
    distractor: bool,
}

impl Tally {
    fn new(plan: &Plan) -> Self {
        Self {
            phrases: vec![false; plan.pairs.len()],
            total: 0,
            matching: 0,
            present: vec![false; plan.terms.len()],
            best_sentence: 0,
            in_sentence: vec![false; plan.terms.len()],
            sentence_count: 0,
            sentence_mask: 0,
            entities: vec![false; plan.entities.len()],
            dates: vec![false; plan.dates.len()],
            distractor: false,
        }
    }

    /// The features, for a query of `terms` terms.
    fn lexical(&self, terms: usize) -> Lexical {
        let share = |found: &[bool]| {
            if found.is_empty() {
                0.0
            } else {
                found.iter().filter(|f| **f).count() as f32 / found.len() as f32
            }
        };
        let of_terms = |count: usize| {
            if terms == 0 {
                0.0
            } else {
                count as f32 / terms as f32
            }
        };
        let precision = if self.total == 0 {
            0.0
        } else {
            self.matching as f32 / self.total as f32
        };
        Lexical {
            term_recall: of_terms(self.present.iter().filter(|p| **p).count()),
            term_precision: precision,
            entity: share(&self.entities),
            date: share(&self.dates),
            distractor: if self.distractor { 1.0 } else { 0.0 },
            sentence_recall: of_terms(self.best_sentence),
            phrase: share(&self.phrases),
        }
    }
}

/// The features of one chunk text for one query (see [`Features`] for many chunks).
pub fn factors(plan: &Plan, text: &str, bm25: &Bm25Encoder) -> Lexical {
    Features::new(plan, bm25).of(&[text])
}

pub(super) fn is_word_boundary(text: &str, at: usize, len: usize) -> bool {
    let before = text[..at].chars().next_back();
    let after = text[at + len..].chars().next();
    !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
}
