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

    /// Number of tokens of `text` (special-token text is counted as ordinary text).
    pub fn count(&self, text: &str) -> usize {
        if text.is_empty() {
            return 0;
        }
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
        let mut end = bytes.min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
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

    #[test]
    fn parse_names_roundtrip() {
        for enc in [Encoding::O200kBase, Encoding::Cl100kBase] {
            assert_eq!(Encoding::parse(enc.name()), Some(enc));
        }
        assert_eq!(Encoding::parse("gpt2"), None);
    }
}
