//! Dedup: exact duplicates (same text up to case and whitespace) leave the list; the better-ranked
//! copy stays. Near-duplicates (stored vectors with cosine at or above 0.95) are removed against each
//! pick inside [`super::mmr`], which computes those similarities anyway: k·n comparisons instead of n².

use std::collections::BTreeSet;

use super::{Candidate, Decision};

/// Hash of the text with case and whitespace runs normalised.
pub fn text_hash(text: &str) -> blake3::Hash {
    let mut normalised: Vec<u8> = Vec::with_capacity(text.len());
    if text.is_ascii() {
        let mut space = false;
        for &byte in text.as_bytes() {
            if byte.is_ascii_whitespace() {
                space = !normalised.is_empty();
            } else {
                if space {
                    normalised.push(b' ');
                    space = false;
                }
                normalised.push(byte.to_ascii_lowercase());
            }
        }
        return blake3::hash(&normalised);
    }
    for word in text.split_whitespace() {
        if !normalised.is_empty() {
            normalised.push(b' ');
        }
        if word.is_ascii() {
            normalised.extend(word.bytes().map(|b| b.to_ascii_lowercase()));
        } else {
            normalised.extend_from_slice(word.to_lowercase().as_bytes());
        }
    }
    blake3::hash(&normalised)
}

/// Removes exact duplicates from `candidates` (best first), recording why.
pub fn dedup(candidates: Vec<Candidate>) -> (Vec<Candidate>, Vec<Decision>) {
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
        kept.push(candidate);
    }
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
        ];
        let (kept, decisions) = dedup(candidates);
        let docs: Vec<&str> = kept.iter().map(|c| c.stored.key.doc_id.as_str()).collect();
        assert_eq!(docs, vec!["a", "c"]);
        assert_eq!(decisions.len(), 1);
        assert!(decisions[0].reason.contains("exact"));
        assert_ne!(text_hash("a b"), text_hash("ab"));
        // The ASCII fast path and the Unicode path agree.
        assert_eq!(text_hash(" Hello \t World "), text_hash("hello world"));
        assert_eq!(text_hash("Ünïcode  Text"), text_hash("ünïcode text"));
    }
}
