//! Dedup: exact duplicates (same text up to case and whitespace) leave the list; the better-ranked
//! copy stays. Near-duplicates (stored vectors with cosine at or above 0.95) are removed against each
//! pick inside [`super::mmr`], which computes those similarities anyway: k·n comparisons instead of n².

use std::hash::BuildHasher;

use rustc_hash::{FxBuildHasher, FxHashMap};

use super::{Action, Candidate, Cause, Decision};

/// Writes `text` into `out` with case and whitespace runs normalised: each character lowercased,
/// each run of whitespace one space, none at either end. `out` is reused from candidate to
/// candidate (every candidate of a query passes through here).
fn normalise_into(text: &str, out: &mut String) {
    out.clear();
    let mut space = false;
    for c in text.chars() {
        if c.is_whitespace() {
            space = !out.is_empty();
            continue;
        }
        if space {
            out.push(' ');
            space = false;
        }
        if c.is_ascii() {
            out.push(c.to_ascii_lowercase());
        } else {
            out.extend(c.to_lowercase());
        }
    }
}

/// Removes exact duplicates (same text up to case and whitespace) from `candidates` (best first),
/// recording why. The kept candidates stay in their order.
pub fn dedup(candidates: Vec<Candidate>) -> (Vec<Candidate>, Vec<Decision>) {
    let mut decisions = Vec::new();
    // The kept candidates by the hash of their normalised text (texts of equal hashes are
    // compared).
    let mut kept: FxHashMap<u64, Vec<usize>> =
        FxHashMap::with_capacity_and_hasher(candidates.len(), Default::default());
    let text = |i: usize| candidates[i].stored.chunk.text.as_str();
    let (mut normal, mut other) = (String::new(), String::new());
    let mut keep = vec![true; candidates.len()];
    for (i, flag) in keep.iter_mut().enumerate() {
        normalise_into(text(i), &mut normal);
        let same = kept.entry(FxBuildHasher.hash_one(&normal)).or_default();
        let duplicate = same.iter().any(|&j| {
            normalise_into(text(j), &mut other);
            other == normal
        });
        if duplicate {
            *flag = false;
            decisions.push(Decision::new(
                candidates[i].id(),
                Action::Dropped,
                Cause::Exact,
                "exact duplicate text",
            ));
        } else {
            same.push(i);
        }
    }
    let kept = candidates
        .into_iter()
        .zip(keep)
        .filter_map(|(candidate, keep)| keep.then_some(candidate))
        .collect();
    (kept, decisions)
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
