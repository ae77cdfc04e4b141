//! Dedup: exact duplicates (same text up to case and whitespace) leave the list; the better-ranked
//! copy stays. Near-duplicates (stored vectors with cosine at or above 0.95) are removed against each
//! pick inside [`super::mmr`], which computes those similarities anyway: k·n comparisons instead of n².

use rustc_hash::FxHashSet;

use super::{Action, Candidate, Cause, Decision};

/// The text with case and whitespace runs normalised (lowercase, single spaces, trimmed).
fn normalised(text: &str) -> String {
    let lower = text.to_lowercase();
    let mut out = String::with_capacity(lower.len());
    for word in lower.split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    out
}

/// Removes exact duplicates (same text up to case and whitespace) from `candidates` (best first),
/// recording why. The kept candidates stay in their order.
pub fn dedup(mut candidates: Vec<Candidate>) -> (Vec<Candidate>, Vec<Decision>) {
    let mut decisions = Vec::new();
    let mut seen: FxHashSet<String> =
        FxHashSet::with_capacity_and_hasher(candidates.len(), Default::default());
    candidates.retain(|candidate| {
        if seen.insert(normalised(&candidate.stored.chunk.text)) {
            return true;
        }
        decisions.push(Decision::new(
            candidate.id(),
            Action::Dropped,
            Cause::Exact,
            "exact duplicate text",
        ));
        false
    });
    (candidates, decisions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::fuse::tests::stored;

    #[test]
    fn exact_duplicates_leave_up_to_case_and_whitespace() {
        let candidates = vec![
            Candidate::new(stored("a", 0, "The same  text.")),
            Candidate::new(stored("b", 0, "the same\ntext.")),
            Candidate::new(stored("c", 0, "Other words")),
            Candidate::new(stored("d", 0, " ÜNÏCODE\tText ")),
            Candidate::new(stored("e", 0, "ünïcode text")),
        ];
        let (kept, decisions) = dedup(candidates);
        let docs: Vec<&str> = kept.iter().map(|c| c.stored.key.doc_id.as_str()).collect();
        assert_eq!(docs, vec!["a", "c", "d"]);
        assert_eq!(decisions.len(), 2);
        assert!(decisions.iter().all(|d| d.cause == Cause::Exact));
    }

    #[test]
    fn texts_that_differ_in_words_or_order_stay() {
        let candidates = vec![
            Candidate::new(stored("a", 0, "ab ba")),
            Candidate::new(stored("b", 0, "ba ab")),
            Candidate::new(stored("c", 0, "abba")),
            Candidate::new(stored("d", 0, "AB  BA")),
        ];
        let (kept, decisions) = dedup(candidates);
        let docs: Vec<&str> = kept.iter().map(|c| c.stored.key.doc_id.as_str()).collect();
        assert_eq!(docs, vec!["a", "b", "c"]);
        assert_eq!(decisions.len(), 1);
    }
}
