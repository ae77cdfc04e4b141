//! Dedup: exact duplicates (same text up to case and whitespace) leave the list; the better-ranked
//! copy stays. Near-duplicates (stored vectors with cosine at or above 0.95) are removed against each
//! pick inside [`super::mmr`], which computes those similarities anyway: k·n comparisons instead of n².

use rustc_hash::FxHashMap;

use super::{Candidate, Decision};

/// Whitespace as `char::is_whitespace` sees it, for ASCII bytes.
fn is_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t'..=b'\r')
}

/// The text with case and whitespace runs normalised (lowercase, single spaces, trimmed).
fn normalised(text: &str) -> Vec<u8> {
    let mut out: Vec<u8> = Vec::with_capacity(text.len());
    for word in text.split_whitespace() {
        if !out.is_empty() {
            out.push(b' ');
        }
        if word.is_ascii() {
            out.extend(word.bytes().map(|b| b.to_ascii_lowercase()));
        } else {
            out.extend_from_slice(word.to_lowercase().as_bytes());
        }
    }
    out
}

/// A cheap key of the normalised text: texts equal up to case and whitespace have equal keys (the
/// count and the sum of the non-space bytes with ASCII case folded). One branch-free pass over ASCII
/// text; other text is normalised first. Equal keys are confirmed on the normalised texts.
fn signature(text: &str) -> (u32, u32) {
    let scan = |bytes: &[u8]| {
        let (mut count, mut sum) = (0u32, 0u32);
        // Blocks of 128 bytes sum into 16-bit lanes (128 · 255 fits), twice as many per vector
        // register as 32-bit ones.
        for block in bytes.chunks(128) {
            let (mut block_count, mut block_sum) = (0u16, 0u16);
            for &byte in block {
                let keep = u16::from(!is_space(byte));
                // Wrapping: no overflow check in the loop, so it vectorises in every profile.
                block_count = block_count.wrapping_add(keep);
                block_sum = block_sum.wrapping_add(u16::from(byte | 0x20) * keep);
            }
            count = count.wrapping_add(u32::from(block_count));
            sum = sum.wrapping_add(u32::from(block_sum));
        }
        (count, sum)
    };
    if text.is_ascii() {
        scan(text.as_bytes())
    } else {
        scan(&normalised(text))
    }
}

/// Removes exact duplicates (same text up to case and whitespace) from `candidates` (best first),
/// recording why.
pub fn dedup(candidates: Vec<Candidate>) -> (Vec<Candidate>, Vec<Decision>) {
    let mut decisions = Vec::new();
    let mut seen: FxHashMap<(u32, u32), Vec<usize>> =
        FxHashMap::with_capacity_and_hasher(candidates.len(), Default::default());
    let mut kept: Vec<Candidate> = Vec::with_capacity(candidates.len());
    for candidate in candidates {
        let text = &candidate.stored.chunk.text;
        let same_key = seen.entry(signature(text)).or_default();
        let duplicate = !same_key.is_empty() && {
            let mine = normalised(text);
            same_key
                .iter()
                .any(|&k| normalised(&kept[k].stored.chunk.text) == mine)
        };
        if duplicate {
            decisions.push(Decision::new(
                candidate.id(),
                "dedup",
                "dropped",
                "exact duplicate text",
            ));
            continue;
        }
        same_key.push(kept.len());
        kept.push(candidate);
    }
    (kept, decisions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spaces_are_the_ascii_whitespace_characters() {
        for byte in 0u8..128 {
            assert_eq!(is_space(byte), (byte as char).is_whitespace(), "{byte}");
        }
    }
    use crate::query::fuse::tests::stored;

    proptest::proptest! {
        /// The blocked key is the count and the sum of the non-space bytes (ASCII case folded) of
        /// the normalised text, for texts longer than a block.
        #[test]
        fn keys_are_counts_and_sums(text in "[a-zA-Z \t\n.é]{0,700}") {
            let normal = normalised(&text);
            let kept = normal.iter().filter(|b| !is_space(**b));
            let expected = (
                kept.clone().count() as u32,
                kept.map(|b| u32::from(b | 0x20)).sum::<u32>(),
            );
            proptest::prop_assert_eq!(signature(&text), expected);
        }
    }

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
        // The ASCII fast path and the Unicode path agree on keys.
        assert_eq!(signature(" Hello \t World "), signature("hello world"));
        assert_eq!(signature("Ünïcode  Text"), signature("ünïcode text"));
        assert_eq!(signature("Ünïcode  Text"), signature("ÜNÏCODE Text"));
    }

    #[test]
    fn equal_keys_are_confirmed_on_the_text() {
        // Same bytes in another order, and words joined: the keys collide, the texts differ.
        assert_eq!(signature("ab ba"), signature("ba ab"));
        assert_eq!(signature("a b"), signature("ab"));
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
