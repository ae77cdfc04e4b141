//! BM25 sparse vectors with code-aware terms, identical for both index backends.
//!
//! Terms: the words of [`crate::text`] (identifiers and their parts, lowercased, stop words dropped),
//! stemmed with its Snowball English stemmer.
//!
//! Document vectors hold BM25 term-frequency weights `tf·(k1+1) / (tf + k1·(1 − b + b·len/avg_len))`
//! (the `standard` variant of [`Bm25Params`]; `plus` and `l` are BM25+ and BM25L);
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

/// How a document's term frequencies become weights (`[index.bm25] variant`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Bm25Variant {
    /// Robertson's BM25: `tf·(k1+1) / (tf + k1·(1 − b + b·len/avg_len))`.
    #[default]
    Standard,
    /// BM25+ (Lv and Zhai): the standard weight plus `delta` for every term present, so a term in a
    /// very long chunk never weighs next to nothing.
    Plus,
    /// BM25L (Lv and Zhai): `(k1+1)·(c+delta) / (k1+c+delta)` with `c = tf / (1 − b + b·len/avg_len)`,
    /// which favours long chunks less harshly.
    L,
    /// BM25T: named so that a configuration asking for it is refused with the reason (below).
    T,
    /// BM25-adpt: likewise refused.
    Adpt,
}

/// BM25's document-side parameters (`[index.bm25]`). They shape the weights stored at ingest, so an
/// index holds one setting: any other than the default is part of the version stamped on every
/// point ([`Bm25Params::tag`]).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Bm25Params {
    /// `standard`, `plus` (BM25+) or `l` (BM25L). BM25T and BM25-adpt are not offered: they take a
    /// per-term `k1` from the whole corpus's statistics, which a stored weight cannot follow as the
    /// corpus changes.
    pub variant: Bm25Variant,
    /// Term-frequency saturation, 0 to 3.
    pub k1: f32,
    /// Length normalisation, 0 (none) to 1 (full).
    pub b: f32,
    /// `plus` and `l`: the shift (0 to 2; BM25+'s usual 1.0, BM25L's 0.5).
    pub delta: f32,
}

impl Default for Bm25Params {
    fn default() -> Self {
        Self {
            variant: Bm25Variant::Standard,
            k1: BM25_K1,
            b: BM25_B,
            delta: 1.0,
        }
    }
}

impl Bm25Params {
    /// Checks the ranges; the message names the key.
    pub fn check(&self) -> Result<(), String> {
        if matches!(self.variant, Bm25Variant::T | Bm25Variant::Adpt) {
            return Err(
                "variants t and adpt take a per-term k1 from the whole corpus's statistics, which weights stored at ingest cannot follow as the corpus changes: use standard, plus or l"
                    .into(),
            );
        }
        if !(0.0..=3.0).contains(&self.k1) {
            return Err(format!("k1 must be in 0..=3, got {}", self.k1));
        }
        if !(0.0..=1.0).contains(&self.b) {
            return Err(format!("b must be in 0..=1, got {}", self.b));
        }
        if !(0.0..=2.0).contains(&self.delta) {
            return Err(format!("delta must be in 0..=2, got {}", self.delta));
        }
        Ok(())
    }

    /// What the index records of a setting other than the default (appended to the embedder
    /// version on every point); `None` for the default, so an index written before the setting
    /// existed stays valid.
    pub fn tag(&self) -> Option<String> {
        let standard = Self::default();
        if self.variant == Bm25Variant::Standard && self.k1 == standard.k1 && self.b == standard.b {
            return None;
        }
        let variant = match self.variant {
            Bm25Variant::Standard => return Some(format!("bm25 k1={} b={}", self.k1, self.b)),
            Bm25Variant::Plus => "plus",
            Bm25Variant::L => "l",
            Bm25Variant::T => "t",
            Bm25Variant::Adpt => "adpt",
        };
        Some(format!(
            "bm25 {variant} k1={} b={} delta={}",
            self.k1, self.b, self.delta
        ))
    }

    /// A bound on [`Bm25Params::weight`] over every `tf` and `length`: `k1 + 1 + delta`.
    pub fn weight_max(&self) -> f32 {
        self.k1 + 1.0 + self.delta.max(0.0)
    }

    /// The weight of a term occurring `tf` times (at least once) in a chunk of `length` terms.
    pub fn weight(&self, tf: f32, length: f32) -> f32 {
        let norm = 1.0 - self.b + self.b * length / BM25_AVG_LEN;
        match self.variant {
            // T and adpt never pass `check`; they weigh as the standard variant.
            Bm25Variant::Standard | Bm25Variant::T | Bm25Variant::Adpt => {
                tf * (self.k1 + 1.0) / (tf + self.k1 * norm)
            }
            Bm25Variant::Plus => tf * (self.k1 + 1.0) / (tf + self.k1 * norm) + self.delta,
            Bm25Variant::L => {
                let c = tf / norm.max(f32::MIN_POSITIVE) + self.delta;
                (self.k1 + 1.0) * c / (self.k1 + c)
            }
        }
    }
}

/// Turns text into BM25 sparse vectors: the words of [`crate::text`], stemmed.
#[derive(Debug, Default)]
pub struct Bm25Encoder {
    stemmer: Stemmer,
    params: Bm25Params,
}

impl Bm25Encoder {
    /// An encoder weighting document terms with `params`.
    pub fn with_params(params: Bm25Params) -> Self {
        Self {
            stemmer: Stemmer::default(),
            params,
        }
    }

    /// The document-side parameters it weighs with.
    pub fn params(&self) -> &Bm25Params {
        &self.params
    }

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
        let (indices, values) = counts
            .into_iter()
            .map(|(id, tf)| (id, self.params.weight(tf, length)))
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

    #[test]
    fn variants_weigh_as_their_formulas_and_only_other_settings_are_tagged() {
        let close = |a: f32, b: f32| (a - b).abs() < 1e-5;
        let standard = Bm25Params::default();
        // tf 2 in a chunk of the reference length: norm 1.
        assert!(close(
            standard.weight(2.0, BM25_AVG_LEN),
            2.0 * 2.2 / (2.0 + 1.2)
        ));
        // A chunk twice the reference length: norm 1 − 0.75 + 1.5 = 1.75.
        assert!(close(standard.weight(1.0, 240.0), 2.2 / (1.0 + 1.2 * 1.75)));
        let plus = Bm25Params {
            variant: Bm25Variant::Plus,
            ..standard
        };
        assert!(close(
            plus.weight(1.0, 240.0),
            2.2 / (1.0 + 1.2 * 1.75) + 1.0
        ));
        let l = Bm25Params {
            variant: Bm25Variant::L,
            delta: 0.5,
            ..standard
        };
        let c = 1.0 / 1.75 + 0.5;
        assert!(close(l.weight(1.0, 240.0), 2.2 * c / (1.2 + c)));
        // b = 0: no length normalisation; k1 = 0: a term's weight is 1 whatever its count.
        let flat = Bm25Params { b: 0.0, ..standard };
        assert!(close(flat.weight(3.0, 20.0), flat.weight(3.0, 2000.0)));
        let binary = Bm25Params {
            k1: 0.0,
            ..standard
        };
        assert!(close(binary.weight(1.0, 120.0), 1.0) && close(binary.weight(9.0, 120.0), 1.0));
        // No weight passes the bound, however often a term occurs in however short a chunk.
        for params in [standard, plus, l, flat, binary] {
            for (tf, length) in [(1.0, 1.0), (50.0, 1.0), (1e6, 1.0), (3.0, 2000.0)] {
                assert!(params.weight(tf, length) <= params.weight_max() + 1e-4);
            }
        }
        // The encoder uses them; the default leaves the index's version alone.
        let text = "error error budget";
        let by = |params| {
            Bm25Encoder::with_params(params)
                .encode_document(text)
                .values
        };
        assert_eq!(
            by(standard),
            Bm25Encoder::default().encode_document(text).values
        );
        assert!(by(plus)
            .iter()
            .zip(by(standard))
            .all(|(p, s)| close(*p, s + 1.0)));
        assert_eq!(standard.tag(), None);
        assert_eq!(
            Bm25Params {
                delta: 0.3,
                ..standard
            }
            .tag(),
            None,
            "delta is unused by the standard variant"
        );
        assert_eq!(
            plus.tag().as_deref(),
            Some("bm25 plus k1=1.2 b=0.75 delta=1")
        );
        assert_eq!(
            Bm25Params {
                k1: 1.5,
                ..standard
            }
            .tag()
            .as_deref(),
            Some("bm25 k1=1.5 b=0.75")
        );
        assert!(Bm25Params {
            k1: 4.0,
            ..standard
        }
        .check()
        .unwrap_err()
        .contains("k1"));
        assert!(Bm25Params {
            b: -0.1,
            ..standard
        }
        .check()
        .unwrap_err()
        .contains('b'));
        assert!(Bm25Params {
            delta: f32::NAN,
            ..standard
        }
        .check()
        .is_err());
        let adpt = Bm25Params {
            variant: Bm25Variant::Adpt,
            ..standard
        };
        assert!(adpt.check().unwrap_err().contains("per-term k1"));
    }
}
