//! Intent: a rule-based query analyzer choosing the fusion weights and each lane's retrieval depth.
//!
//! Signals are read from the raw text (identifier/code tokens, quoted phrases, SQL words, question
//! words and cue phrases); the first matching intent in [`PRESETS`] order wins, so the more specific
//! ones (identifiers, quotes, SQL) beat the generic ones. Exact-match intents lean to BM25, open
//! questions to the dense lane. The analysis also yields the terms, entities and dates the rerank
//! scores candidates with.

use super::{Depth, Plan, Weights};
use crate::store::Bm25Encoder;

/// The signal of a query that names a programming language ([`LANGUAGES`]).
pub const NAMES_LANGUAGE: &str = "names_language";

/// An intent's fusion preset: the lanes' weights and how deep each lane is read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Preset {
    /// The intent's name (trace, metrics label).
    pub intent: &'static str,
    /// Fusion weights.
    pub weights: Weights,
    /// Candidates fetched per lane before the query's own floor (twice `k`, `query.min_pool`).
    pub depth: Depth,
}

const fn preset(intent: &'static str, dense: f32, bm25: f32, depth: (usize, usize)) -> Preset {
    Preset {
        intent,
        weights: Weights { dense, bm25 },
        depth: Depth {
            dense: depth.0,
            bm25: depth.1,
        },
    }
}

/// The presets, most specific first. The lane an intent leans on is read deeper: an exact-match
/// intent's answer may sit below BM25's twentieth hit when many chunks share the term, an open
/// question's below the dense lane's. Both lanes are read at least to the query's floor, so a depth
/// under it (16 on a balanced intent) only matters where `min_pool` is set lower.
pub const PRESETS: [Preset; 12] = [
    preset("identifier", 0.3, 0.7, (20, 40)),
    preset("quoted_phrase", 0.3, 0.7, (16, 40)),
    preset("sql", 0.4, 0.6, (20, 30)),
    preset("measurement", 0.45, 0.55, (16, 24)),
    preset("date_time", 0.45, 0.55, (16, 24)),
    preset("ownership", 0.5, 0.5, (16, 16)),
    preset("location", 0.5, 0.5, (16, 16)),
    preset("definition", 0.5, 0.5, (16, 16)),
    preset("procedure", 0.6, 0.4, (24, 16)),
    preset("multi_entity", 0.5, 0.5, (20, 20)),
    preset("claim", 0.5, 0.5, (16, 16)),
    preset("exploratory", 0.7, 0.3, (30, 12)),
];

const MONTHS: [&str; 12] = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

const SQL_WORDS: [&str; 10] = [
    "select", "table", "tables", "column", "columns", "schema", "join", "sql", "rows", "query",
];

/// Programming languages a query may name ("read a csv file in python"): a query that names one asks
/// about code in words, and [`super::adapt`] then needs fewer code hits to call it a code search.
const LANGUAGES: [&str; 18] = [
    "python",
    "javascript",
    "typescript",
    "java",
    "golang",
    "kotlin",
    "php",
    "perl",
    "haskell",
    "c++",
    "c#",
    "csharp",
    "cpp",
    "scala",
    "bash",
    "powershell",
    "matlab",
    "node.js",
];

/// Language names that are everyday words too: they count only after "in", "using" or "with"
/// ("sort a map in go").
const LANGUAGES_AFTER_IN: [&str; 8] = ["go", "rust", "ruby", "swift", "c", "r", "dart", "julia"];

/// Whether `words` (the query's words, split on whitespace) name a programming language.
fn names_language(words: &[&str]) -> bool {
    let clean: Vec<String> = words
        .iter()
        .map(|w| {
            w.trim_start_matches(['(', '"', '\'', '`'])
                .trim_end_matches(['.', ',', '?', '!', ':', ';', ')', '"', '\'', '`'])
                .to_lowercase()
        })
        .collect();
    clean.iter().enumerate().any(|(index, word)| {
        LANGUAGES.contains(&word.as_str())
            || (LANGUAGES_AFTER_IN.contains(&word.as_str())
                && index
                    .checked_sub(1)
                    .is_some_and(|p| ["in", "using", "with"].contains(&clean[p].as_str())))
    })
}

fn is_identifier(word: &str) -> bool {
    let inner = word.trim_matches(|c: char| !c.is_alphanumeric());
    let has_lower_upper =
        inner.chars().any(char::is_lowercase) && inner.chars().skip(1).any(char::is_uppercase);
    inner.contains('_')
        || inner.contains("::")
        || word.contains("()")
        || word.starts_with('`')
        || (has_lower_upper && inner.chars().next().is_some_and(char::is_lowercase))
        || (inner.contains('.')
            && inner.rsplit('.').next().is_some_and(|ext| {
                [
                    "rs", "py", "go", "ts", "js", "md", "sql", "toml", "json", "yaml",
                ]
                .contains(&ext)
            }))
}

fn is_year(word: &str) -> bool {
    let digits = word.trim_matches(|c: char| !c.is_ascii_digit());
    digits.len() == 4
        && digits.chars().all(|c| c.is_ascii_digit())
        && (digits.starts_with("1") || digits.starts_with("20"))
}

/// Quoted phrases (`"…"` or `“…”`).
fn quoted(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(['"', '“']) {
        let open = rest[start..].chars().next().expect("found");
        let after = &rest[start + open.len_utf8()..];
        let Some(end) = after.find(['"', '”']) else {
            break;
        };
        let phrase = after[..end].trim();
        if !phrase.is_empty() {
            out.push(phrase.to_string());
        }
        let close = after[end..].chars().next().expect("found");
        rest = &after[end + close.len_utf8()..];
    }
    out
}

/// Analyzes a query: intent, weights, lane depths and rerank features.
pub fn analyze(text: &str, bm25: &Bm25Encoder) -> Plan {
    let lower = text.to_lowercase();
    let words: Vec<&str> = text.split_whitespace().collect();
    let lower_words: Vec<String> = words
        .iter()
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .collect();
    let starts = |prefixes: &[&str]| prefixes.iter().any(|p| lower.starts_with(p));
    let contains = |phrases: &[&str]| phrases.iter().any(|p| lower.contains(p));
    let has_word = |set: &[&str]| lower_words.iter().any(|w| set.contains(&w.as_str()));

    let phrases = quoted(text);
    let identifiers: Vec<String> = words
        .iter()
        .filter(|w| is_identifier(w))
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric() && c != '_')
                .to_string()
        })
        .collect();
    let mut dates: Vec<String> = words
        .iter()
        .filter(|w| is_year(w))
        .map(|w| w.trim_matches(|c: char| !c.is_ascii_digit()).to_string())
        .collect();
    for (index, word) in lower_words.iter().enumerate() {
        // "may" is a month only next to a number ("May 2019", "3 May").
        let numeric = |i: Option<&String>| i.is_some_and(|w| w.chars().any(|c| c.is_ascii_digit()));
        if MONTHS.contains(&word.as_str())
            && (word != "may"
                || numeric(lower_words.get(index + 1))
                || index
                    .checked_sub(1)
                    .is_some_and(|p| numeric(lower_words.get(p))))
        {
            dates.push(word.clone());
        }
    }
    // Entities: capitalised words after the first, acronyms, numbers, identifiers, quoted phrases.
    let mut entities: Vec<String> = Vec::new();
    for (index, word) in words.iter().enumerate() {
        let clean = word.trim_matches(|c: char| !c.is_alphanumeric());
        if clean.is_empty() {
            continue;
        }
        let capitalised = clean.chars().next().is_some_and(char::is_uppercase);
        let acronym = clean.len() > 1
            && clean
                .chars()
                .all(|c| c.is_uppercase() || c.is_ascii_digit());
        let number = clean.chars().any(|c| c.is_ascii_digit());
        if (capitalised && index > 0) || acronym || number {
            entities.push(clean.to_string());
        }
    }
    entities.extend(identifiers.iter().cloned());
    entities.extend(phrases.iter().cloned());
    entities.sort();
    entities.dedup();

    let mut signals = Vec::new();
    let mut matched = |name: &str, hit: bool| {
        if hit {
            signals.push(name.to_string());
        }
    };
    matched("identifier", !identifiers.is_empty());
    matched("quoted_phrase", !phrases.is_empty());
    matched(
        "sql",
        has_word(&SQL_WORDS)
            && (has_word(&["table", "tables", "column", "columns", "schema"])
                || starts(&["select "])),
    );
    matched(
        "measurement",
        contains(&[
            "how many",
            "how much",
            "how long",
            "how far",
            "how big",
            "how old",
            "how tall",
            "percentage",
            "what percent",
            "number of",
            "amount of",
        ]),
    );
    matched(
        "date_time",
        starts(&["when"])
            || contains(&[
                "what year",
                "which year",
                "what date",
                "what century",
                "what time",
            ])
            || !dates.is_empty(),
    );
    matched(
        "ownership",
        contains(&[
            "who owns",
            "owner",
            "owned by",
            "maintainer",
            "responsible for",
            "whose",
            "belongs to",
        ]) || starts(&["who "]),
    );
    matched(
        "location",
        starts(&["where"])
            || contains(&[
                "which city",
                "what city",
                "which country",
                "what country",
                "located",
                "where is",
                "which state",
                "what state",
            ]),
    );
    matched(
        "definition",
        starts(&[
            "what is",
            "what are",
            "what does",
            "define",
            "definition of",
            "meaning of",
            "what's",
        ]) || contains(&["stand for", "is defined as"]),
    );
    matched(
        "procedure",
        starts(&["how to", "how do", "how can", "how should", "steps"])
            || contains(&["step by step", "install", "configure", "set up"]),
    );
    let capitalised = entities
        .iter()
        .filter(|e| e.chars().next().is_some_and(char::is_uppercase))
        .count();
    matched(
        "multi_entity",
        capitalised >= 2 || contains(&[" vs ", " versus ", "compare", "difference between"]),
    );
    let question = lower.ends_with('?')
        || lower_words.first().is_some_and(|w| {
            [
                "what", "which", "who", "whom", "where", "when", "why", "how", "is", "are", "does",
                "do", "can", "did",
            ]
            .contains(&w.as_str())
        });
    matched("claim", !question && words.len() >= 4);
    // Not an intent of its own (no preset): evidence for the code-search rule ([`super::adapt`]).
    matched(NAMES_LANGUAGE, names_language(&words));

    let preset = PRESETS
        .iter()
        .find(|preset| signals.iter().any(|s| s == preset.intent))
        .copied()
        .unwrap_or(PRESETS[PRESETS.len() - 1]);
    let sequence = bm25.terms(text);
    let mut terms = sequence.clone();
    terms.sort();
    terms.dedup();
    let pairs = term_pairs(&sequence, &terms);
    Plan {
        intent: preset.intent.to_string(),
        signals,
        weights: preset.weights,
        depth: preset.depth,
        terms,
        pairs,
        entities,
        dates,
        lexical: 1.0,
    }
}

/// The pairs of terms that follow each other in `sequence` (the query's terms in order), as indices
/// into `terms` (sorted, each once), each pair once; a term followed by itself is no phrase.
fn term_pairs(sequence: &[String], terms: &[String]) -> Vec<(u32, u32)> {
    let index = |term: &String| terms.binary_search(term).ok().map(|i| i as u32);
    let mut pairs: Vec<(u32, u32)> = sequence
        .windows(2)
        .filter_map(|w| Some((index(&w[0])?, index(&w[1])?)))
        .filter(|(a, b)| a != b)
        .collect();
    pairs.sort_unstable();
    pairs.dedup();
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intent(text: &str) -> (String, Weights, Depth) {
        let plan = analyze(text, &Bm25Encoder::default());
        (plan.intent, plan.weights, plan.depth)
    }

    #[test]
    fn each_intent_has_a_trigger() {
        let cases = [
            ("where is parse_config called", "identifier"),
            ("what does HttpServer::bind() return", "identifier"),
            (
                "find \"exactly once delivery\" in the docs",
                "quoted_phrase",
            ),
            ("which table has the customer email column", "sql"),
            ("how many people live in Warsaw", "measurement"),
            ("when did the war end", "date_time"),
            ("what happened in 1969", "date_time"),
            ("who owns the billing service", "ownership"),
            ("where is the eiffel tower", "location"),
            ("what is a vector database", "definition"),
            ("how do I rotate the api key", "procedure"),
            (
                "Which NFL team represented the AFC at Super Bowl 50?",
                "multi_entity",
            ),
            (
                "0-dimensional biomaterials show inductive properties.",
                "claim",
            ),
            ("why is the sky blue", "exploratory"),
        ];
        for (text, expected) in cases {
            assert_eq!(intent(text).0, expected, "{text}");
        }
    }

    #[test]
    fn presets_lean_as_documented() {
        let (_, identifier, depth) = intent("where is parse_config called");
        assert!(identifier.bm25 > identifier.dense);
        assert_eq!((depth.dense, depth.bm25), (20, 40));
        let (_, definition, depth) = intent("what is a vector database");
        assert_eq!((definition.dense, definition.bm25), (0.5, 0.5));
        assert_eq!((depth.dense, depth.bm25), (16, 16));
        let (_, exploratory, depth) = intent("why is the sky blue");
        assert_eq!((exploratory.dense, exploratory.bm25), (0.7, 0.3));
        assert_eq!((depth.dense, depth.bm25), (30, 12));
    }

    #[test]
    fn the_lane_an_intent_leans_on_is_read_at_least_as_deep() {
        for preset in PRESETS {
            let Preset { weights, depth, .. } = preset;
            if weights.bm25 > weights.dense {
                assert!(depth.bm25 > depth.dense, "{}", preset.intent);
            } else if weights.dense > weights.bm25 {
                assert!(depth.dense > depth.bm25, "{}", preset.intent);
            } else {
                assert_eq!(depth.dense, depth.bm25, "{}", preset.intent);
            }
        }
    }

    #[test]
    fn features_for_the_rerank() {
        let plan = analyze(
            "What did Tesla announce in May 2019 about \"Model Y\"?",
            &Bm25Encoder::default(),
        );
        assert!(plan.dates.contains(&"2019".to_string()));
        assert!(plan.dates.contains(&"may".to_string()));
        assert!(plan.entities.contains(&"Tesla".to_string()));
        assert!(plan.entities.contains(&"Model Y".to_string()));
        assert!(plan.terms.contains(&"tesla".to_string()));
        // "may" as a verb is not a date.
        assert!(analyze("it may rain", &Bm25Encoder::default())
            .dates
            .is_empty());
    }

    #[test]
    fn a_named_programming_language_is_a_signal_not_an_intent() {
        let bm25 = Bm25Encoder::default();
        for text in [
            "read a csv file in Python",
            "how to reverse a string (javascript)",
            "c++ sort a vector descending",
            "parse json with C#",
            "sort a map by value in go",
            "handle errors using Rust?",
        ] {
            let plan = analyze(text, &bm25);
            assert!(
                plan.signals.iter().any(|s| s == NAMES_LANGUAGE),
                "{text}: {:?}",
                plan.signals
            );
            assert!(PRESETS.iter().all(|p| p.intent != NAMES_LANGUAGE));
        }
        // The intent is the one the other signals choose.
        assert_eq!(
            analyze("how to read a file in python", &bm25).intent,
            "procedure"
        );
        // Everyday words that name a language elsewhere.
        for text in [
            "go to the main page",
            "rust on the iron bridge",
            "the ruby was found in 1912",
            "which python species lives in Florida",
            "how to hold a c major chord",
        ] {
            let plan = analyze(text, &bm25);
            let named = plan.signals.iter().any(|s| s == NAMES_LANGUAGE);
            assert_eq!(named, text.contains("python"), "{text}: {:?}", plan.signals);
        }
    }
}
