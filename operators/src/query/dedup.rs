//! Dedup: exact duplicates (same normalised text) and near-duplicates (stored vectors with cosine at
//! or above a threshold, default 0.95) leave the list; the better-ranked copy stays.

use std::collections::BTreeSet;

use super::{Candidate, Decision};
use crate::embed::cosine;

/// Hash of the text with case and whitespace runs normalised.
pub fn text_hash(text: &str) -> blake3::Hash {
    let mut hasher = blake3::Hasher::new();
    for word in text.split_whitespace() {
        hasher.update(word.to_lowercase().as_bytes());
        hasher.update(b" ");
    }
    hasher.finalize()
}

/// Removes duplicates from `candidates` (best first), recording why.
pub fn dedup(candidates: Vec<Candidate>, near_duplicate: f32) -> (Vec<Candidate>, Vec<Decision>) {
    let mut decisions = Vec::new();
    let mut hashes = BTreeSet::new();
    let mut kept: Vec<Candidate> = Vec::with_capacity(candidates.len());
    for candidate in candidates {
        if !hashes.insert(*text_hash(&candidate.stored.chunk.text).as_bytes()) {
            decisions.push(Decision::new(
                candidate.id(),
                "dedup",
                "dropped",
                "exact duplicate text",
            ));
            continue;
        }
        let near = candidate.vector.as_ref().and_then(|vector| {
            kept.iter().find_map(|other| {
                let similarity = cosine(vector, other.vector.as_ref()?);
                (similarity >= near_duplicate).then(|| (other.id(), similarity))
            })
        });
        if let Some((other, similarity)) = near {
            decisions.push(Decision::new(
                candidate.id(),
                "dedup",
                "dropped",
                format!("near-duplicate of {other} (cosine {similarity:.3})"),
            ));
            continue;
        }
        kept.push(candidate);
    }
    (kept, decisions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::fuse::tests::stored;

    fn candidate(doc: &str, text: &str, vector: Vec<f32>) -> Candidate {
        let mut c = Candidate::new(stored(doc, 0, text));
        c.vector = Some(vector);
        c
    }

    #[test]
    fn exact_and_near_duplicates_leave() {
        let candidates = vec![
            candidate("a", "The same  text.", vec![1.0, 0.0]),
            candidate("b", "the same text.", vec![0.0, 1.0]),
            candidate("c", "Other words", vec![0.99, 0.1]),
            candidate("d", "Different again", vec![0.6, 0.8]),
        ];
        let (kept, decisions) = dedup(candidates, 0.95);
        let docs: Vec<&str> = kept.iter().map(|c| c.stored.key.doc_id.as_str()).collect();
        assert_eq!(docs, vec!["a", "d"]);
        assert_eq!(decisions.len(), 2);
        assert!(decisions[0].reason.contains("exact"));
        assert!(decisions[1].reason.contains("near-duplicate"));
    }

    #[test]
    fn threshold_is_respected() {
        let candidates = vec![
            candidate("a", "one", vec![1.0, 0.0]),
            candidate("b", "two", vec![0.9, 0.436]),
        ];
        // cosine ≈ 0.9: kept at 0.95, dropped at 0.85.
        assert_eq!(dedup(candidates.clone(), 0.95).0.len(), 2);
        assert_eq!(dedup(candidates, 0.85).0.len(), 1);
    }
}
