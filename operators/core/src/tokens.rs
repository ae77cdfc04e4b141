//! Token counting with a real BPE tokenizer (tiktoken-rs).
//!
//! Every budget in ragstream — chunk sizes at ingest, context budgets at query time — is counted with the
//! same tokenizer an LLM application would use, never estimated from characters. The BPE tables are
//! embedded in tiktoken-rs and loaded once per process (`*_singleton`), so a [`TokenCounter`] is a cheap
//! `Copy` handle.
//!
//! Guarantees: [`TokenCounter::truncate`] returns a prefix of its input (at a `char` boundary) whose token
//! count is at most the limit; `count(a) == encode(a).len()` always.

use serde::{Deserialize, Serialize};
use tiktoken_rs::CoreBPE;

mod pieces;

/// The BPE encodings ragstream can count with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// GPT-4o / o-series encoding (the default).
    #[default]
    O200kBase,
    /// GPT-4 / GPT-3.5 encoding.
    Cl100kBase,
}

impl Encoding {
    /// Parses the names used in configs and queries (`o200k_base`, `cl100k_base`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "o200k_base" => Some(Self::O200kBase),
            "cl100k_base" => Some(Self::Cl100kBase),
            _ => None,
        }
    }

    /// The canonical name of the encoding.
    pub fn name(self) -> &'static str {
        match self {
            Self::O200kBase => "o200k_base",
            Self::Cl100kBase => "cl100k_base",
        }
    }
}

/// A cheap handle on a process-wide BPE table.
#[derive(Clone, Copy)]
pub struct TokenCounter {
    encoding: Encoding,
    bpe: &'static CoreBPE,
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCounter")
            .field("encoding", &self.encoding)
            .finish()
    }
}

impl TokenCounter {
    /// Returns the counter for `encoding`, loading its table on first use.
    pub fn new(encoding: Encoding) -> Self {
        let bpe = match encoding {
            Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
            Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
        };
        Self { encoding, bpe }
    }

    /// The encoding this counter uses.
    pub fn encoding(&self) -> Encoding {
        self.encoding
    }

    /// Number of tokens of `text` (special-token text is counted as ordinary text). Under o200k_base
    /// the text is split into the tokenizer's pieces by a hand-written pre-tokenizer and each piece's
    /// count is cached per thread (see `pieces`); the result equals [`Self::count_whole`].
    pub fn count(&self, text: &str) -> usize {
        if text.is_empty() {
            return 0;
        }
        if self.encoding == Encoding::O200kBase {
            return pieces::count(text, |piece| self.count_whole(piece));
        }
        self.count_whole(text)
    }

    /// Number of tokens of `text` and of each of its `spans` (byte ranges at character boundaries)
    /// counted alone, as [`Self::count`] counts them. Under o200k_base `text` is walked once (a span
    /// starting where the tokenizer's pieces must break, as a line does, adds only its last few
    /// characters); otherwise each span and the whole are counted in turn.
    pub fn count_spans(&self, text: &str, spans: &[std::ops::Range<usize>]) -> (usize, Vec<usize>) {
        if self.encoding == Encoding::O200kBase {
            return pieces::count_spans(text, spans, |piece| self.count_whole(piece));
        }
        let counts = spans.iter().map(|span| self.count(&text[span.clone()]));
        (self.count(text), counts.collect())
    }

    /// Number of tokens of `text`, encoded by tiktoken in one call (the reference [`Self::count`]
    /// agrees with).
    pub fn count_whole(&self, text: &str) -> usize {
        self.bpe.encode_ordinary(text).len()
    }

    /// The longest prefix of `text` with at most `max_tokens` tokens, cut at a `char` boundary.
    pub fn truncate<'a>(&self, text: &'a str, max_tokens: usize) -> &'a str {
        let tokens = self.bpe.encode_ordinary(text);
        if tokens.len() <= max_tokens {
            return text;
        }
        // Tokens decode to a byte prefix of the input; a token may end inside a multi-byte char.
        let bytes = self
            .bpe
            .decode_bytes(&tokens[..max_tokens])
            .map(|b| b.len())
            .unwrap_or(0);
        let end = text.floor_char_boundary(bytes);
        let prefix = &text[..end];
        debug_assert!(self.count(prefix) <= max_tokens);
        prefix
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_match_known_values() {
        let counter = TokenCounter::new(Encoding::O200kBase);
        assert_eq!(counter.count(""), 0);
        assert_eq!(counter.count("hello world"), 2);
        let cl = TokenCounter::new(Encoding::Cl100kBase);
        assert_eq!(cl.count("hello world"), 2);
        // The two encodings disagree on longer multilingual text.
        let text = "Tokenisierung ist nicht trivial: 東京 は 大きい";
        assert_ne!(counter.count(text), cl.count(text));
    }

    #[test]
    fn truncate_respects_limit_and_char_boundaries() {
        let counter = TokenCounter::new(Encoding::O200kBase);
        let text = "Zürich — 東京 — naïve café. ".repeat(20);
        for limit in 0..40 {
            let prefix = counter.truncate(&text, limit);
            assert!(text.starts_with(prefix));
            assert!(counter.count(prefix) <= limit, "limit {limit}");
        }
        assert_eq!(counter.truncate("short", 10), "short");
    }

    /// Fragments that meet every alternative of the o200k pattern and the edges between them: case
    /// runs, contractions (also `ſ`, which folds to `s`), digit runs, symbol runs with trailing
    /// slashes and line breaks, whitespace runs with and without line breaks, Latin-1 letters,
    /// numbers and symbols, and characters the pre-tokenizer leaves to tiktoken (CJK, emoji,
    /// combining marks, `ª`).
    const FRAGMENTS: &[&str] = &[
        "a", "word", "Word", "WORD", "wORD", "McDonald", "é", "É", "ß", "Ÿ", "ĸ", "ſ", "İ", "ı",
        "µ", "'", "'s", "'S", "'ſ", "'t", "'re", "'VE", "'m", "'ll", "'Ld", "'d", "'x", "1", "12",
        "2015", "1234567", "²", "½", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\n ",
        "\u{0B}", "\u{0C}", "\u{85}", "\u{A0}", "\u{2028}", "\u{2003}", "\u{200B}", ".", ",", "(",
        ")", "/", "//", "-", "_", "#", "<", ">", "\"", "–", "—", "›", "…", "§", "©", "×", "\u{1F}",
        "\u{7F}", "\u{AD}", "x", "Source: ", " (lines ", "12–34", ")\n", "\n/", "/\n", "東京",
        "🙂", "e\u{301}", "ª", "Σ", "\u{212A}", "ǅ", "\u{3000}", "αβ", "\u{1680}", "\u{300}",
    ];
    /// The fragments above that the pre-tokenizer leaves to tiktoken (the last ones).
    const UNKNOWN: usize = 11;

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        #[test]
        fn piece_counts_agree_with_tiktoken(
            picks in proptest::collection::vec(0..FRAGMENTS.len(), 0..40)
        ) {
            let counter = TokenCounter::new(Encoding::O200kBase);
            let text: String = picks.iter().map(|&i| FRAGMENTS[i]).collect();
            proptest::prop_assert_eq!(counter.count(&text), counter.count_whole(&text), "{:?}", text);
        }

        #[test]
        fn pre_tokenizer_agrees_with_tiktoken(
            picks in proptest::collection::vec(0..FRAGMENTS.len() - UNKNOWN, 0..60)
        ) {
            // Known characters only: every one of these texts takes the hand-written split.
            let counter = TokenCounter::new(Encoding::O200kBase);
            let text: String = picks.iter().map(|&i| FRAGMENTS[i]).collect();
            proptest::prop_assert!(pieces::split(&text).is_some());
            proptest::prop_assert_eq!(counter.count(&text), counter.count_whole(&text), "{:?}", text);
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        /// Parts joined by a separator, as a context joins its items: the whole and each part count
        /// as tiktoken counts them alone, under both encodings.
        #[test]
        fn span_counts_agree_with_tiktoken(
            parts in proptest::collection::vec(
                proptest::collection::vec(0..FRAGMENTS.len(), 0..12), 1..6
            ),
            separator in 0..FRAGMENTS.len(),
        ) {
            let mut text = String::from(FRAGMENTS[separator]);
            let mut spans = Vec::new();
            for part in &parts {
                let start = text.len();
                text.extend(part.iter().map(|&i| FRAGMENTS[i]));
                spans.push(start..text.len());
                text.push_str(FRAGMENTS[separator]);
            }
            for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
                let counter = TokenCounter::new(encoding);
                let (total, counts) = counter.count_spans(&text, &spans);
                proptest::prop_assert_eq!(total, counter.count_whole(&text), "{:?}", text);
                for (span, count) in spans.iter().zip(counts) {
                    proptest::prop_assert_eq!(
                        count, counter.count_whole(&text[span.clone()]), "{:?} in {:?}", span, text
                    );
                }
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        /// ASCII text (classified by table) counts as tiktoken counts it.
        #[test]
        fn ascii_pre_tokenizer_agrees_with_tiktoken(
            picks in proptest::collection::vec(0..FRAGMENTS.len(), 0..60)
        ) {
            let counter = TokenCounter::new(Encoding::O200kBase);
            let text: String = picks
                .iter()
                .map(|&i| FRAGMENTS[i])
                .filter(|f| f.is_ascii())
                .collect();
            proptest::prop_assert_eq!(counter.count(&text), counter.count_whole(&text), "{:?}", text);
        }
    }

    #[test]
    fn pieces_match_the_pattern() {
        let split = |text| pieces::split(text).expect("known characters");
        assert_eq!(
            split("Hello  world's TOKENS, 2015th!\n\n  x"),
            ["Hello", " ", " world's", " TOKENS", ",", " ", "201", "5", "th", "!\n\n", " ", " x"]
        );
        assert_eq!(
            split(" \t\n  (lines 12–34)\n"),
            [" \t\n", " ", " (", "lines", " ", "12", "–", "34", ")\n"]
        );
        assert_eq!(split("a  "), ["a", "  "]);
        // Characters outside the known blocks go to tiktoken.
        assert!(pieces::split("東京").is_none());
        assert!(pieces::split("ª").is_none());
        for fragment in &FRAGMENTS[..FRAGMENTS.len() - UNKNOWN] {
            assert!(pieces::split(fragment).is_some(), "{fragment:?}");
        }
        for fragment in &FRAGMENTS[FRAGMENTS.len() - UNKNOWN..] {
            assert!(pieces::split(fragment).is_none(), "{fragment:?}");
        }
    }

    /// A long context with a few characters outside the known blocks (Greek words, a CJK name, an
    /// emoji) counts as tiktoken counts it whole, at every prefix ending on a word.
    #[test]
    fn long_texts_with_unknown_characters_agree_with_tiktoken() {
        let counter = TokenCounter::new(Encoding::O200kBase);
        let paragraph = "Source: athens.md (lines 3–9)\nThe city of Athens (Ἀθῆναι) was named \
            after Athena; its port, Piraeus, lies 12 km away.\n\nIn 2004 it hosted the Olympics 🙂 \
            and the torch passed through 東京 before.\n/path/ends\u{3000}here, and ǅ or ª too.";
        let text = paragraph.repeat(40);
        assert_eq!(counter.count(&text), counter.count_whole(&text));
        for (at, _) in text.match_indices(' ').step_by(7) {
            let prefix = &text[..at];
            assert_eq!(
                counter.count(prefix),
                counter.count_whole(prefix),
                "{prefix:?}"
            );
        }
    }

    #[test]
    fn parse_names_roundtrip() {
        for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
            assert_eq!(Encoding::parse(enc.name()), Some(enc));
        }
        assert_eq!(Encoding::parse("gpt2"), None);
    }
}
