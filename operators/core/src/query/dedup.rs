//! Dedup: exact duplicates (same text up to case and whitespace) leave the list; the better-ranked
//! copy stays. Near-duplicates (stored vectors with cosine at or above 0.95) are removed against each
//! pick inside [`super::mmr`], which computes those similarities anyway: k·n comparisons instead of n².

use rustc_hash::FxHashMap;

use super::{Action, Candidate, Cause, Decision};

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

/// The count and the wrapping sum of the non-space bytes of `bytes`, ASCII case folded (`| 0x20`).
fn scan_scalar(bytes: &[u8]) -> (u32, u32) {
    let (mut count, mut sum) = (0u32, 0u32);
    for &byte in bytes {
        let keep = u32::from(!is_space(byte));
        count = count.wrapping_add(keep);
        sum = sum.wrapping_add(u32::from(byte | 0x20) * keep);
    }
    (count, sum)
}

/// [`scan_scalar`], 16 bytes at a time with SSE2 (part of every x86-64 CPU; see [`scan_sse2`]).
#[cfg(target_arch = "x86_64")]
fn scan(bytes: &[u8]) -> (u32, u32) {
    // SAFETY: SSE2 is part of x86-64: every CPU this code can run on has it.
    unsafe { scan_sse2(bytes) }
}

/// [`scan_scalar`], 16 bytes at a time: the spaces are a
/// compare with `' '` and an unsigned range test for `\t`..=`\r`; `psadbw` adds the kept bytes (and
/// the kept ones' count) into 64-bit lanes, so nothing overflows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn scan_sse2(bytes: &[u8]) -> (u32, u32) {
    use std::arch::x86_64::{
        __m128i, _mm_add_epi64, _mm_andnot_si128, _mm_cmpeq_epi8, _mm_cvtsi128_si64,
        _mm_loadu_si128, _mm_min_epu8, _mm_or_si128, _mm_sad_epu8, _mm_set1_epi8,
        _mm_setzero_si128, _mm_sub_epi8, _mm_unpackhi_epi64,
    };
    let (blocks, rest) = bytes.as_chunks::<16>();
    let zero = _mm_setzero_si128();
    let (space, tab, range, case, one) = (
        _mm_set1_epi8(b' ' as i8),
        _mm_set1_epi8(b'\t' as i8),
        _mm_set1_epi8((b'\r' - b'\t') as i8),
        _mm_set1_epi8(0x20),
        _mm_set1_epi8(1),
    );
    let (mut count, mut sum) = (zero, zero);
    for block in blocks {
        // SAFETY: `block` is 16 readable bytes; the load has no alignment requirement.
        let bytes = unsafe { _mm_loadu_si128(block.as_ptr().cast::<__m128i>()) };
        // `byte - '\t' <= '\r' - '\t'` unsigned: the minimum equals the difference.
        let from_tab = _mm_sub_epi8(bytes, tab);
        let control = _mm_cmpeq_epi8(_mm_min_epu8(from_tab, range), from_tab);
        let spaces = _mm_or_si128(_mm_cmpeq_epi8(bytes, space), control);
        let kept = _mm_andnot_si128(spaces, _mm_or_si128(bytes, case));
        sum = _mm_add_epi64(sum, _mm_sad_epu8(kept, zero));
        count = _mm_add_epi64(count, _mm_sad_epu8(_mm_andnot_si128(spaces, one), zero));
    }
    let total = |lanes: __m128i| {
        (_mm_cvtsi128_si64(lanes) as u64)
            .wrapping_add(_mm_cvtsi128_si64(_mm_unpackhi_epi64(lanes, lanes)) as u64) as u32
    };
    let (tail_count, tail_sum) = scan_scalar(rest);
    (
        total(count).wrapping_add(tail_count),
        total(sum).wrapping_add(tail_sum),
    )
}

#[cfg(not(target_arch = "x86_64"))]
fn scan(bytes: &[u8]) -> (u32, u32) {
    scan_scalar(bytes)
}

/// A cheap key of the normalised text: texts equal up to case and whitespace have equal keys (the
/// count and the sum of the non-space bytes with ASCII case folded). One pass over ASCII text; other
/// text is normalised first. Equal keys are confirmed on the normalised texts.
fn signature(text: &str) -> (u32, u32) {
    if text.is_ascii() {
        scan(text.as_bytes())
    } else {
        scan(&normalised(text))
    }
}

/// Removes exact duplicates (same text up to case and whitespace) from `candidates` (best first),
/// recording why. The kept candidates stay where they are (no move unless one leaves).
pub fn dedup(mut candidates: Vec<Candidate>) -> (Vec<Candidate>, Vec<Decision>) {
    let mut decisions = Vec::new();
    // Each key's latest kept candidate, and each kept candidate's earlier one with the same key.
    let mut latest: FxHashMap<(u32, u32), usize> =
        FxHashMap::with_capacity_and_hasher(candidates.len(), Default::default());
    let mut earlier: Vec<Option<usize>> = vec![None; candidates.len()];
    let mut keep = vec![true; candidates.len()];
    for (index, candidate) in candidates.iter().enumerate() {
        let text = &candidate.stored.chunk.text;
        let key = signature(text);
        let mut same = latest.get(&key).copied();
        let duplicate = same.is_some() && {
            let mine = normalised(text);
            let mut found = false;
            while let Some(other) = same.filter(|_| !found) {
                found = normalised(&candidates[other].stored.chunk.text) == mine;
                same = earlier[other];
            }
            found
        };
        if duplicate {
            decisions.push(Decision::new(
                candidate.id(),
                Action::Dropped,
                Cause::Exact,
                "exact duplicate text",
            ));
            keep[index] = false;
            continue;
        }
        earlier[index] = latest.insert(key, index);
    }
    let mut kept = keep.into_iter();
    candidates.retain(|_| kept.next().unwrap_or(true));
    (candidates, decisions)
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
        /// The vectorised scan equals the byte loop on any bytes (ASCII or not, spaces and control
        /// characters often), at every length around the 16-byte blocks.
        #[test]
        fn scan_is_the_byte_loop(
            bytes in proptest::collection::vec(
                proptest::prop_oneof![0u8..=40, proptest::num::u8::ANY],
                0..80,
            ),
        ) {
            proptest::prop_assert_eq!(scan(&bytes), scan_scalar(&bytes));
        }

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
        assert_eq!(decisions[0].cause, Cause::Exact);
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
