//! BM25 sparse vectors with code-aware terms, identical for both index backends.
//!
//! Terms: the words of [`crate::text`] (identifiers and their parts, lowercased, stop words dropped),
//! stemmed with its Snowball English stemmer.
//!
//! Document vectors hold BM25 term-frequency weights `tf·(k1+1) / (tf + k1·(1 − b + b·len/avg_len))`;
//! query vectors hold 1.0 per distinct term, which the query flow replaces by the term's IDF over the
//! tenant's whole corpus ([`super::stats`]): a chunk's BM25 score does not depend on the shard that
//! holds it. The length normalisation uses a fixed reference length, [`BM25_AVG_LEN`], not the
//! corpus's running mean: a stored weight would otherwise go stale whenever the mean moved (every
//! vector of the tenant rewritten to follow it), and a chunk's weights would depend on when, and so on
//! which shard's schedule, it was written. The chunker bounds chunk lengths, so the reference sits
//! near the real mean.

use std::collections::BTreeMap;

use crate::text::{self, Stemmer};

/// BM25 term-saturation parameter.
pub const BM25_K1: f32 = 1.2;
/// BM25 length-normalisation parameter.
pub const BM25_B: f32 = 0.75;
/// Average chunk length in terms (prose chunks of ~200 tokens hold ~120 terms after stop words).
pub const BM25_AVG_LEN: f32 = 120.0;

/// A sparse vector: sorted unique indices and their values.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct SparseVector {
    /// Term ids, ascending and unique.
    pub indices: Vec<u32>,
    /// Weights, one per index.
    pub values: Vec<f32>,
}

/// Turns text into BM25 sparse vectors: the words of [`crate::text`], stemmed.
#[derive(Debug, Default)]
pub struct Bm25Encoder {
    stemmer: Stemmer,
}

impl Bm25Encoder {
    /// The analysed terms of `text`, in order (with repeats).
    pub fn terms(&self, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        self.visit_words(text, &mut |lower| out.push(self.stem(lower)));
        out
    }

    /// Stems one lowercased word.
    pub fn stem(&self, lower: &str) -> String {
        self.stemmer.stem(lower)
    }

    /// The words of `text` that become terms, before stemming ([`text::visit_words`]).
    pub fn visit_words(&self, text: &str, visit: &mut dyn FnMut(&str)) {
        text::visit_words(text, visit);
    }

    /// The words of `text` with sentence ends ([`text::visit_sentence_words`]).
    pub fn visit_sentence_words(&self, text: &str, visit: impl FnMut(Option<&str>)) {
        text::visit_sentence_words(text, visit);
    }

    /// Stable term id: the first 4 bytes of the term's blake3 hash.
    pub fn term_id(term: &str) -> u32 {
        let hash = blake3::hash(term.as_bytes());
        u32::from_le_bytes(hash.as_bytes()[..4].try_into().expect("4 bytes"))
    }

    /// The document-side vector: BM25 term-frequency weights.
    pub fn encode_document(&self, text: &str) -> SparseVector {
        let terms = self.terms(text);
        let length = terms.len() as f32;
        let mut counts: BTreeMap<u32, f32> = BTreeMap::new();
        for term in &terms {
            *counts.entry(Self::term_id(term)).or_default() += 1.0;
        }
        let norm = BM25_K1 * (1.0 - BM25_B + BM25_B * length / BM25_AVG_LEN);
        let (indices, values) = counts
            .into_iter()
            .map(|(id, tf)| (id, tf * (BM25_K1 + 1.0) / (tf + norm)))
            .unzip();
        SparseVector { indices, values }
    }

    /// The query-side vector: 1.0 per distinct term.
    pub fn encode_query(&self, text: &str) -> SparseVector {
        let mut ids: Vec<u32> = self.terms(text).iter().map(|t| Self::term_id(t)).collect();
        ids.sort_unstable();
        ids.dedup();
        let values = vec![1.0; ids.len()];
        SparseVector {
            indices: ids,
            values,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_aware_terms() {
        let encoder = Bm25Encoder::default();
        let terms = encoder.terms("fn parse_config(HTTPServer) uses parseConfig and kebab-case");
        for expected in [
            "parse_config",
            "pars",
            "config",
            "httpserver",
            "http",
            "server",
            "parseconfig",
            "kebab-cas",
            "kebab",
            "case",
        ] {
            assert!(
                terms.iter().any(|t| t == expected),
                "missing {expected} in {terms:?}"
            );
        }
        assert!(!terms.iter().any(|t| t == "and"), "stop word kept");
    }

    #[test]
    fn document_weights_saturate_and_queries_are_binary() {
        let encoder = Bm25Encoder::default();
        let doc = encoder.encode_document("error error error error budget");
        assert_eq!(doc.indices.len(), 2);
        assert!(doc.indices.windows(2).all(|w| w[0] < w[1]));
        let error = doc.values[doc
            .indices
            .iter()
            .position(|&i| i == Bm25Encoder::term_id("error"))
            .unwrap()];
        let budget = doc.values[doc
            .indices
            .iter()
            .position(|&i| i == Bm25Encoder::term_id("budget"))
            .unwrap()];
        assert!(
            error > budget && error < 4.0 * budget,
            "tf saturates: {error} vs {budget}"
        );
        let query = encoder.encode_query("budget budget errors");
        assert_eq!(query.values, vec![1.0, 1.0]);
    }
}
