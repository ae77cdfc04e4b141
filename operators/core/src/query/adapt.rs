//! Adapt: fusion weights that follow what the lanes found, not only the query's wording.
//!
//! The intent analyzer ([`super::intent`]) reads the query text alone. Once the lanes have answered,
//! their hits are evidence too. The rule applied here, before fusion:
//!
//! **Code search.** A query in plain words (no identifier; quoted words count as plain ones, as the
//! BM25 lane analyses them alike and matches no phrases) whose dense lane's top
//! [`HEAD`] hits are mostly source code (at least [`CODE_SHARE`] of them) is looking for code by what
//! it does (a hit indexed as prose or markdown counts when its text reads as code,
//! [`crate::text::looks_like_code`]: code pasted into a text file, or a corpus indexed without its
//! kind); a query that names a programming language (the intent's `names_language` signal: "read
//! a csv file in python") says so itself, and then [`CODE_SHARE_NAMED`] of the hits suffice, so the
//! rule also fires in a corpus where code is the smaller part (a repository's docs beside its code).
//! Its words are seldom the code's own identifiers, so exact-term matching earns little: the
//! intent becomes `code_search`, the lanes are weighted [`CODE_SEARCH`], and the rerank's lexical
//! features (term recall and precision, sentence recall, weighted sentence recall, phrase, entity
//! coverage) are scaled by the BM25 lane's share of the weights relative to an even split
//! ([`Plan::lexical`]). A query that names an identifier keeps its intent: there, the code's own
//! words are what it asks for.
//!
//! The decision and its figures go to the trace, and `ragstream_fusion_adapted_total{rule}` counts it.

use super::intent::NAMES_LANGUAGE;
use super::{Plan, Weights};
use crate::model::DocKind;
use crate::store::Hit;

/// Dense hits looked at.
pub const HEAD: usize = 10;
/// The share of them that must be code.
pub const CODE_SHARE: f32 = 0.6;
/// The share of them that must be code when the query names a programming language.
pub const CODE_SHARE_NAMED: f32 = 0.3;
/// The intent (and the `ragstream_fusion_adapted_total` rule) of a query the code-search rule adapted.
pub const CODE_SEARCH_INTENT: &str = "code_search";
/// Lane weights of a code search.
pub const CODE_SEARCH: Weights = Weights {
    dense: 0.85,
    bm25: 0.15,
};

/// Adapts `plan` to the dense lane's hits (best first); returns the reason when it changed it.
pub fn adapt(plan: &mut Plan, dense: &[Hit]) -> Option<String> {
    let exact = plan.signals.iter().any(|s| s == "identifier");
    let head = &dense[..dense.len().min(HEAD)];
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
    let named = plan.signals.iter().any(|s| s == NAMES_LANGUAGE);
    let share = if named { CODE_SHARE_NAMED } else { CODE_SHARE };
    if (code as f32) < share * head.len() as f32 {
        return None;
    }
    let before = plan.weights;
    plan.intent = CODE_SEARCH_INTENT.into();
    plan.signals.push("code_hits".into());
    plan.weights = CODE_SEARCH;
    plan.lexical = 2.0 * CODE_SEARCH.bm25 / (CODE_SEARCH.dense + CODE_SEARCH.bm25);
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
    use crate::query::intent::analyze;
    use crate::store::Bm25Encoder;

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
        assert_eq!(plan.intent, "code_search");
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
        assert!(plan.signals.iter().any(|s| s == "quoted_phrase"));
        assert!(adapt(&mut plan, &hits(&[DocKind::Code; 10])).is_some());
        assert_eq!(plan.intent, "code_search");
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
        assert_eq!(named.intent, CODE_SEARCH_INTENT);
        assert_eq!(named.weights, CODE_SEARCH);
        assert!(
            reason.contains("(it names a programming language)"),
            "{reason}"
        );
        let mut too_few = analyze("how to sort a list in python", &bm25);
        assert_eq!(adapt(&mut too_few, &mixed(2)), None);
        assert_eq!(too_few.intent, "procedure");
        // Unnamed, three code hits of ten are not enough.
        let mut unnamed = analyze("how to sort a list", &bm25);
        assert_eq!(adapt(&mut unnamed, &mixed(3)), None);
        assert_eq!(adapt(&mut unnamed, &mixed(5)), None);
        assert!(adapt(&mut unnamed, &mixed(6)).is_some());
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
        assert_eq!(plan.intent, CODE_SEARCH_INTENT);
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
