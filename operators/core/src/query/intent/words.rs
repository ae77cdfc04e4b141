//! The words of a query as intent detection reads them: identifiers, years, months, quoted
//! phrases, SQL words and programming languages.

use super::*;

pub(super) const MONTHS: [&str; 12] = [
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

pub(super) const SQL_WORDS: [&str; 10] = [
    "select", "table", "tables", "column", "columns", "schema", "join", "sql", "rows", "query",
];

/// Programming languages a query may name ("read a csv file in python"): a query that names one asks
/// about code in words, and [`super::adapt`] then needs fewer code hits to call it a code search.
pub(super) const LANGUAGES: [&str; 18] = [
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
pub(super) const LANGUAGES_AFTER_IN: [&str; 8] =
    ["go", "rust", "ruby", "swift", "c", "r", "dart", "julia"];

/// Whether `words` (the query's words, split on whitespace) name a programming language.
pub(super) fn names_language(words: &[&str]) -> bool {
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

pub(super) fn is_identifier(word: &str) -> bool {
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

pub(super) fn is_year(word: &str) -> bool {
    let digits = word.trim_matches(|c: char| !c.is_ascii_digit());
    digits.len() == 4
        && digits.chars().all(|c| c.is_ascii_digit())
        && (digits.starts_with("1") || digits.starts_with("20"))
}

/// Quoted phrases (`"…"` or `“…”`).
pub(super) fn quoted(text: &str) -> Vec<String> {
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

/// The query's words: as written (split on whitespace), and trimmed of punctuation and lowercased.
pub(super) struct Words<'a> {
    lower: String,
    words: Vec<&'a str>,
    lower_words: Vec<String>,
}

impl<'a> Words<'a> {
    pub(super) fn new(text: &'a str) -> Self {
        let words: Vec<&str> = text.split_whitespace().collect();
        let lower_words = words
            .iter()
            .map(|w| {
                w.trim_matches(|c: char| !c.is_alphanumeric())
                    .to_lowercase()
            })
            .collect();
        Self {
            lower: text.to_lowercase(),
            words,
            lower_words,
        }
    }

    /// Identifier-like words, trimmed.
    pub(super) fn identifiers(&self) -> Vec<String> {
        self.words
            .iter()
            .filter(|w| is_identifier(w))
            .map(|w| {
                w.trim_matches(|c: char| !c.is_alphanumeric() && c != '_')
                    .to_string()
            })
            .collect()
    }

    /// Years, and months ("may" only next to a number).
    pub(super) fn dates(&self) -> Vec<String> {
        let (words, lower_words) = (&self.words, &self.lower_words);
        let mut dates: Vec<String> = words
            .iter()
            .filter(|w| is_year(w))
            .map(|w| w.trim_matches(|c: char| !c.is_ascii_digit()).to_string())
            .collect();
        for (index, word) in lower_words.iter().enumerate() {
            // "may" is a month only next to a number ("May 2019", "3 May").
            let numeric =
                |i: Option<&String>| i.is_some_and(|w| w.chars().any(|c| c.is_ascii_digit()));
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
        dates
    }

    /// Entities: capitalised words after the first, acronyms, numbers, identifiers, quoted phrases.
    pub(super) fn entities(&self, identifiers: &[String], phrases: &[String]) -> Vec<String> {
        let words = &self.words;
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
        entities
    }

    /// Every signal the text shows, in [`Intent::ANALYZED`] order, then [`Signal::NamesLanguage`].
    pub(super) fn signals(
        &self,
        identifiers: &[String],
        phrases: &[String],
        entities: &[String],
        dates: &[String],
    ) -> Vec<Signal> {
        let (lower, words, lower_words) = (&self.lower, &self.words, &self.lower_words);
        let starts = |prefixes: &[&str]| prefixes.iter().any(|p| lower.starts_with(p));
        let contains = |phrases: &[&str]| phrases.iter().any(|p| lower.contains(p));
        let has_word = |set: &[&str]| lower_words.iter().any(|w| set.contains(&w.as_str()));
        let mut signals = Vec::new();
        let mut matched = |signal: Signal, hit: bool| {
            if hit {
                signals.push(signal);
            }
        };
        matched(Signal::Shows(Intent::Identifier), !identifiers.is_empty());
        matched(Signal::Shows(Intent::QuotedPhrase), !phrases.is_empty());
        matched(
            Signal::Shows(Intent::Sql),
            has_word(&SQL_WORDS)
                && (has_word(&["table", "tables", "column", "columns", "schema"])
                    || starts(&["select "])),
        );
        matched(
            Signal::Shows(Intent::Measurement),
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
            Signal::Shows(Intent::DateTime),
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
            Signal::Shows(Intent::Ownership),
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
            Signal::Shows(Intent::Location),
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
            Signal::Shows(Intent::Definition),
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
            Signal::Shows(Intent::Procedure),
            starts(&["how to", "how do", "how can", "how should", "steps"])
                || contains(&["step by step", "install", "configure", "set up"]),
        );
        let capitalised = entities
            .iter()
            .filter(|e| e.chars().next().is_some_and(char::is_uppercase))
            .count();
        matched(
            Signal::Shows(Intent::MultiEntity),
            capitalised >= 2 || contains(&[" vs ", " versus ", "compare", "difference between"]),
        );
        let question = lower.ends_with('?')
            || lower_words.first().is_some_and(|w| {
                [
                    "what", "which", "who", "whom", "where", "when", "why", "how", "is", "are",
                    "does", "do", "can", "did",
                ]
                .contains(&w.as_str())
            });
        matched(Signal::Shows(Intent::Claim), !question && words.len() >= 4);
        // Not an intent of its own (no preset): evidence for the code-search rule ([`super::adapt`]).
        matched(Signal::NamesLanguage, names_language(words));
        signals
    }
}
