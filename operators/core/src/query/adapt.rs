//! Adapt: fusion weights that follow what the lanes found, not only the query's wording.
//!
//! The intent analyzer ([`super::intent`]) reads the query text alone. Once the lanes have answered,
//! their hits are evidence too. The rule applied here, before fusion:
//!
//! **Code search.** A query in plain words (no identifier; quoted words count as plain ones, as the
//! BM25 lane analyses them alike and matches no phrases) whose dense lane's top
//! `query.code_search.head` hits are mostly source code (at least `share` of them) is looking for code by what
//! it does (a hit indexed as prose or markdown counts when its text reads as code,
//! [`crate::text::looks_like_code`]: code pasted into a text file, or a corpus indexed without its
//! kind); a query that names a programming language (the intent's `names_language` signal: "read
//! a csv file in python") says so itself, and then `share_named` of the hits suffice, so the
//! rule also fires in a corpus where code is the smaller part (a repository's docs beside its code).
//! Its words are seldom the code's own identifiers, so exact-term matching earns little: the
//! intent becomes `code_search`, the lanes are weighted `query.code_search.weights`, and the rerank's lexical
//! features (term recall and precision, sentence recall, weighted sentence recall, phrase, entity
//! coverage) are scaled by the BM25 lane's share of the weights relative to an even split
//! ([`Plan::lexical`]). A query that names an identifier keeps its intent: there, the code's own
//! words are what it asks for.
//!
//! The decision and its figures go to the trace, and `ragstream_fusion_adapted_total{rule}` counts it.

use serde::{Deserialize, Serialize};

use super::intent::{Intent, Signal};
use super::{Plan, Weights};
use crate::model::DocKind;
use crate::store::Hit;

/// The code-search rule's thresholds and weights (config section `query.code_search`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CodeSearchConfig {
    /// Dense hits looked at (the head of the dense lane).
    pub head: usize,
    /// The share of them that must be code.
    pub share: f32,
    /// The share of them that must be code when the query names a programming language.
    pub share_named: f32,
    /// Lane weights of a code search.
    pub weights: Weights,
}

impl Default for CodeSearchConfig {
    fn default() -> Self {
        Self {
            head: 10,
            share: 0.6,
            share_named: 0.3,
            weights: Weights {
                dense: 0.85,
                bm25: 0.15,
            },
        }
    }
}

impl CodeSearchConfig {
    /// Checks the shares (0..=1), the head (1..=1000) and the weights (finite, non-negative, not
    /// both zero).
    pub fn validate(&self) -> Result<(), String> {
        let share = |s: f32| (0.0..=1.0).contains(&s);
        let weight = |w: f32| w.is_finite() && w >= 0.0;
        if !(1..=1000).contains(&self.head) {
            return Err("query.code_search.head must be 1 to 1000".into());
        }
        if !share(self.share) || !share(self.share_named) {
            return Err("query.code_search.share and share_named must be 0 to 1".into());
        }
        if !weight(self.weights.dense)
            || !weight(self.weights.bm25)
            || self.weights.dense + self.weights.bm25 <= 0.0
        {
            return Err(
                "query.code_search.weights must be finite, non-negative and not both zero".into(),
            );
        }
        Ok(())
    }
}

/// Adapts `plan` to the dense lane's hits (best first); returns the reason when it changed it.
pub fn adapt(plan: &mut Plan, dense: &[Hit], rule: &CodeSearchConfig) -> Option<String> {
    let exact = plan.signals.contains(&Signal::Shows(Intent::Identifier));
    let head = &dense[..dense.len().min(rule.head)];
    if exact || head.is_empty() {
        return None;
    }
    let by_text = |hit: &&Hit| {
        matches!(
            hit.stored.chunk.kind,
            DocKind::Prose | DocKind::Markdown | DocKind::Html | DocKind::Pdf | DocKind::Docx
        ) && crate::text::looks_like_code(&hit.stored.chunk.text)
    };
    let labelled = head
        .iter()
        .filter(|hit| hit.stored.chunk.kind == DocKind::Code)
        .count();
    let read = head.iter().filter(by_text).count();
    let code = labelled + read;
    let named = plan.signals.contains(&Signal::NamesLanguage);
    let share = if named { rule.share_named } else { rule.share };
    if (code as f32) < share * head.len() as f32 {
        return None;
    }
    let before = plan.weights;
    plan.intent = Intent::CodeSearch;
    plan.signals.push(Signal::CodeHits);
    plan.weights = rule.weights;
    plan.lexical = 2.0 * rule.weights.bm25 / (rule.weights.dense + rule.weights.bm25);
    let language = if named {
        " (it names a programming language)"
    } else {
        ""
    };
    let read = if read > 0 {
        format!(" ({read} indexed as text that reads as code)")
    } else {
        String::new()
    };
    Some(format!(
        "{code} of the dense lane's top {} hits are code{read} and the query names no identifier{language}: code search, lanes weighted dense {:.2} / BM25 {:.2} (were {:.2} / {:.2}), lexical rerank features x{:.2}",
        head.len(),
        plan.weights.dense,
        plan.weights.bm25,
        before.dense,
        before.bm25,
        plan.lexical
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::fuse::tests::stored;
    use crate::query::intent::IntentPresets;
    use crate::store::Bm25Encoder;

    fn analyze(text: &str, bm25: &Bm25Encoder) -> Plan {
        crate::query::intent::analyze(text, bm25, &IntentPresets::default())
    }

    fn adapt(plan: &mut Plan, dense: &[Hit]) -> Option<String> {
        super::adapt(plan, dense, &CodeSearchConfig::default())
    }

    const CODE_SEARCH: Weights = Weights {
        dense: 0.85,
        bm25: 0.15,
    };

    fn hits(kinds: &[DocKind]) -> Vec<Hit> {
        kinds
            .iter()
            .enumerate()
            .map(|(i, kind)| {
                let mut stored = stored(&format!("d{i}"), 0, "text");
                stored.chunk.kind = *kind;
                Hit {
                    stored,
                    score: 1.0 - i as f32 / 100.0,
                }
            })
            .collect()
    }

    #[test]
    fn plain_words_over_code_hits_become_a_code_search() {
        let mut plan = analyze(
            "python check if a variable is iterable",
            &Bm25Encoder::default(),
        );
        let mut kinds = vec![DocKind::Code; 6];
        kinds.extend([DocKind::Prose; 4]);
        let reason = adapt(&mut plan, &hits(&kinds)).expect("adapted");
        assert_eq!(plan.intent, Intent::CodeSearch);
        assert_eq!(plan.weights, CODE_SEARCH);
        assert!((plan.lexical - 0.3).abs() < 1e-6, "{}", plan.lexical);
        assert!(
            reason.starts_with("6 of the dense lane's top 10 hits are code"),
            "{reason}"
        );
    }

    #[test]
    fn prose_hits_and_identifiers_keep_the_intent() {
        let bm25 = Bm25Encoder::default();
        let mut kinds = vec![DocKind::Code; 5];
        kinds.extend([DocKind::Markdown; 5]);
        let mut mostly_prose = analyze("how to sort a list", &bm25);
        let before = mostly_prose.clone();
        assert_eq!(adapt(&mut mostly_prose, &hits(&kinds)), None);
        assert_eq!(mostly_prose, before);
        for text in [
            "where is parse_config called",
            "find \"parse_config\" here",
            "find \"sortOrder\" here",
        ] {
            let mut plan = analyze(text, &bm25);
            let before = plan.clone();
            assert_eq!(
                adapt(&mut plan, &hits(&[DocKind::Code; 10])),
                None,
                "{text}"
            );
            assert_eq!(plan, before);
        }
        let mut empty = analyze("how to sort a list", &bm25);
        assert_eq!(adapt(&mut empty, &[]), None);
    }

    #[test]
    fn quoted_plain_words_over_code_hits_are_a_code_search() {
        // The BM25 lane analyses a quoted phrase into the same terms as unquoted words (it does not
        // match phrases), so quoting plain words does not make them the code's own.
        let bm25 = Bm25Encoder::default();
        let mut plan = analyze("python \"is not none\" check", &bm25);
        assert!(plan.signals.contains(&Signal::Shows(Intent::QuotedPhrase)));
        assert!(adapt(&mut plan, &hits(&[DocKind::Code; 10])).is_some());
        assert_eq!(plan.intent, Intent::CodeSearch);
        assert_eq!(plan.weights, CODE_SEARCH);
    }

    #[test]
    fn a_named_language_needs_fewer_code_hits() {
        let bm25 = Bm25Encoder::default();
        let mixed = |code: usize| {
            let mut kinds = vec![DocKind::Code; code];
            kinds.extend(vec![DocKind::Markdown; 10 - code]);
            hits(&kinds)
        };
        let mut named = analyze("how to sort a list in python", &bm25);
        let reason = adapt(&mut named, &mixed(3)).expect("adapted");
        assert_eq!(named.intent, Intent::CodeSearch);
        assert_eq!(named.weights, CODE_SEARCH);
        assert!(
            reason.contains("(it names a programming language)"),
            "{reason}"
        );
        let mut too_few = analyze("how to sort a list in python", &bm25);
        assert_eq!(adapt(&mut too_few, &mixed(2)), None);
        assert_eq!(too_few.intent, Intent::Procedure);
        // Unnamed, three code hits of ten are not enough.
        let mut unnamed = analyze("how to sort a list", &bm25);
        assert_eq!(adapt(&mut unnamed, &mixed(3)), None);
        assert_eq!(adapt(&mut unnamed, &mixed(5)), None);
        assert!(adapt(&mut unnamed, &mixed(6)).is_some());
        // The thresholds are the config's.
        let mut strict = analyze("how to sort a list in python", &bm25);
        let rule = CodeSearchConfig {
            share_named: 0.5,
            ..CodeSearchConfig::default()
        };
        assert_eq!(super::adapt(&mut strict, &mixed(3), &rule), None);
        assert!(super::adapt(&mut strict, &mixed(5), &rule).is_some());
        assert!(CodeSearchConfig { share: 1.5, ..rule }.validate().is_err());
    }

    #[test]
    fn hits_indexed_as_text_count_as_code_when_their_text_reads_as_code() {
        let bm25 = Bm25Encoder::default();
        let function = "def paste(xsel=False):\n    \"\"\"Returns the clipboard.\"\"\"\n    selection = \"primary\" if xsel else \"clipboard\"\n    return run(selection)";
        let prose = "Paste copies the clipboard into the document.\nIt keeps the formatting of the source,\nunless the user asks for plain text.";
        let with_texts = |code_text: usize| {
            let mut hits = hits(&[DocKind::Prose; 10]);
            for (i, hit) in hits.iter_mut().enumerate() {
                hit.stored.chunk.text = if i < code_text { function } else { prose }.into();
            }
            hits
        };
        let mut plan = analyze("paste from the clipboard", &bm25);
        let reason = adapt(&mut plan, &with_texts(6)).expect("adapted");
        assert_eq!(plan.intent, Intent::CodeSearch);
        assert!(
            reason.contains("(6 indexed as text that reads as code)"),
            "{reason}"
        );
        let mut fewer = analyze("paste from the clipboard", &bm25);
        assert_eq!(adapt(&mut fewer, &with_texts(5)), None);
        // Schema chunks are never read as code, whatever their text.
        let mut schemas = with_texts(10);
        for hit in &mut schemas {
            hit.stored.chunk.kind = DocKind::SqlSchema;
        }
        let mut plan = analyze("paste from the clipboard", &bm25);
        assert_eq!(adapt(&mut plan, &schemas), None);
    }
}
