//! BM25 sparse vectors with code-aware terms, identical for both index backends.
//!
//! Terms: text is split on non-alphanumeric characters; identifiers are also split into their parts
//! (`snake_case`, `camelCase`, `kebab-case`, `HTTPServer` → `http`, `server`), keeping the whole
//! identifier as a term too, so `parse_config` matches `parse_config`, `parseConfig` and `config`.
//! Terms are lowercased, English stop words dropped, and stemmed with the Snowball English stemmer.
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

use rust_stemmers::{Algorithm, Stemmer};

use crate::query::pack::sentences;

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

/// Turns text into BM25 sparse vectors.
pub struct Bm25Encoder {
    stemmer: Stemmer,
}

impl std::fmt::Debug for Bm25Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Bm25Encoder")
    }
}

impl Default for Bm25Encoder {
    fn default() -> Self {
        Self {
            stemmer: Stemmer::create(Algorithm::English),
        }
    }
}

/// English stop words.
const STOP_WORDS: [&str; 47] = [
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it",
    "its", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they",
    "this", "to", "was", "were", "will", "with", "what", "which", "who", "whom", "how", "when",
    "where", "why", "did", "does", "do", "has", "have", "had",
];

/// A word of at most seven bytes as one integer: its bytes, then its length in the top byte.
const fn word_key(word: &[u8]) -> u64 {
    let mut key = (word.len() as u64) << 56;
    let mut index = 0;
    while index < word.len() {
        key |= (word[index] as u64) << (8 * index);
        index += 1;
    }
    key
}

/// Slots of the stop-word table (a power of two, about ten times the words: a collision-free
/// multiplier is found within a few tries).
const STOP_SLOTS_BITS: u32 = 9;

/// The slot of a key: the top bits of the key times `multiplier`.
const fn stop_slot(key: u64, multiplier: u64) -> usize {
    (key.wrapping_mul(multiplier) >> (64 - STOP_SLOTS_BITS)) as usize
}

/// A perfect hash of [`STOP_WORDS`]: a multiplier under which no two keys share a slot, and each
/// slot's key (0, which no word has, where empty). Found at compile time.
const STOP_TABLE: (u64, [u64; 1 << STOP_SLOTS_BITS]) = {
    let mut multiplier: u64 = 0x9E37_79B9_7F4A_7C15;
    loop {
        let mut table = [0u64; 1 << STOP_SLOTS_BITS];
        let mut index = 0;
        let mut clash = false;
        while index < STOP_WORDS.len() {
            let key = word_key(STOP_WORDS[index].as_bytes());
            let slot = stop_slot(key, multiplier);
            if table[slot] != 0 {
                clash = true;
                break;
            }
            table[slot] = key;
            index += 1;
        }
        if !clash {
            break (multiplier, table);
        }
        multiplier = multiplier.wrapping_add(0x6A09_E667_F3BC_C909);
    }
};

/// The longest stop word, in bytes.
const STOP_WORD_MAX: usize = {
    let mut longest = 0;
    let mut index = 0;
    while index < STOP_WORDS.len() {
        if STOP_WORDS[index].len() > longest {
            longest = STOP_WORDS[index].len();
        }
        index += 1;
    }
    assert!(longest <= 7);
    longest
};

/// Whether `word` (lowercased) is one of [`STOP_WORDS`]: its key is looked up in one slot.
fn is_stop_word(word: &str) -> bool {
    let bytes = word.as_bytes();
    if bytes.is_empty() || bytes.len() > STOP_WORD_MAX {
        return false;
    }
    // Byte by byte (zero past the end), so the key takes no copy of the word.
    let mut key = (bytes.len() as u64) << 56;
    for index in 0..STOP_WORD_MAX {
        key |= u64::from(bytes.get(index).copied().unwrap_or(0)) << (8 * index);
    }
    let (multiplier, table) = &STOP_TABLE;
    table[stop_slot(key, *multiplier)] == key
}

/// Splits an identifier into its camelCase / acronym parts (`HTTPServerError` → `HTTP`, `Server`, `Error`).
fn camel_parts(word: &str) -> Vec<&str> {
    let chars: Vec<(usize, char)> = word.char_indices().collect();
    let mut parts = Vec::new();
    let mut start = 0;
    for i in 1..chars.len() {
        let (index, c) = chars[i];
        let previous = chars[i - 1].1;
        let next_lower = chars.get(i + 1).is_some_and(|(_, n)| n.is_lowercase());
        let boundary = (c.is_uppercase() && previous.is_lowercase())
            || (c.is_uppercase() && previous.is_uppercase() && next_lower)
            || (c.is_ascii_digit() != previous.is_ascii_digit()
                && c.is_alphanumeric()
                && previous.is_alphanumeric());
        if boundary {
            parts.push(&word[start..index]);
            start = index;
        }
    }
    parts.push(&word[start..]);
    parts
}

/// [`Bm25Encoder::visit_words`] for any text.
fn visit_unicode_words(text: &str, visit: &mut dyn FnMut(&str)) {
    let mut push = |term: &str| {
        let lower: std::borrow::Cow<'_, str> = if term.chars().any(char::is_uppercase) {
            std::borrow::Cow::Owned(term.to_lowercase())
        } else {
            std::borrow::Cow::Borrowed(term)
        };
        if lower.is_empty() || is_stop_word(&lower) {
            return;
        }
        visit(&lower);
    };
    // Identifiers keep `_` and `-` inside them so the whole identifier is a term as well.
    for identifier in text.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-')) {
        let identifier = identifier.trim_matches(['_', '-']);
        if identifier.is_empty() {
            continue;
        }
        // Plain words (`word`, `Word`) have one part: skip the splitting.
        if identifier.is_ascii() && identifier.bytes().skip(1).all(|b| b.is_ascii_lowercase()) {
            push(identifier);
            continue;
        }
        let pieces: Vec<&str> = identifier
            .split(['_', '-'])
            .filter(|p| !p.is_empty())
            .collect();
        let mut parts: Vec<&str> = Vec::new();
        for piece in &pieces {
            parts.extend(camel_parts(piece));
        }
        if parts.len() > 1 {
            push(identifier);
        }
        for part in parts {
            push(part);
        }
    }
}

/// Masks of a block of at most 64 bytes of ASCII text: bit `i` of each says whether byte `i` is a
/// word byte (letter, digit, `_`, `-`), whitespace (as `u8::is_ascii_whitespace`), a stop (`.`, `?`,
/// `!`), a line break, a lowercase letter or an uppercase letter. Flags are set per byte by
/// comparisons the compiler vectorises, then packed eight at a time by a multiply (for bytes that
/// are 0 or 1, the top byte of `x · 0x0102040810204080` holds byte `k`'s value at bit `k`).
#[cfg(any(test, not(target_arch = "x86_64")))]
fn block_masks_portable(block: &[u8]) -> [u64; 6] {
    let mut bytes = [0u8; 64];
    bytes[..block.len()].copy_from_slice(block);
    let mut flags = [[0u8; 64]; 6];
    for (i, &b) in bytes.iter().enumerate() {
        let lower = b.wrapping_sub(b'a') < 26;
        let upper = b.wrapping_sub(b'A') < 26;
        let letter = lower | upper;
        let digit = b.wrapping_sub(b'0') < 10;
        flags[0][i] = u8::from(letter | digit | (b == b'_') | (b == b'-'));
        flags[1][i] =
            u8::from((b == b' ') | (b == b'\t') | (b == b'\n') | (b == 0x0C) | (b == b'\r'));
        flags[2][i] = u8::from((b == b'.') | (b == b'?') | (b == b'!'));
        flags[3][i] = u8::from(b == b'\n');
        flags[4][i] = u8::from(lower);
        flags[5][i] = u8::from(upper);
    }
    flags.map(|flags| {
        flags
            .chunks_exact(8)
            .enumerate()
            .fold(0u64, |bits, (k, eight)| {
                let x = u64::from_le_bytes(eight.try_into().expect("eight bytes"));
                bits | (x.wrapping_mul(0x0102_0408_1020_4080) >> 56) << (8 * k)
            })
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn block_masks(block: &[u8]) -> [u64; 6] {
    block_masks_portable(block)
}

/// [`block_masks_portable`] with SSE2 (part of every x86-64 CPU; see [`block_masks_sse2`]).
#[cfg(target_arch = "x86_64")]
fn block_masks(block: &[u8]) -> [u64; 6] {
    // SAFETY: SSE2 is part of x86-64: every CPU this code can run on has it.
    unsafe { block_masks_sse2(block) }
}

/// Each 16-byte lane is compared as a whole and `pmovmskb` packs the compare results into 16 bits
/// of each mask. A byte range is one unsigned test: `byte − low ≤ span` exactly when the minimum of
/// the two is the difference.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn block_masks_sse2(block: &[u8]) -> [u64; 6] {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8, _mm_sub_epi8,
    };
    let mut padded = [0u8; 64];
    let bytes: &[u8; 64] = match block.try_into() {
        Ok(full) => full,
        Err(_) => {
            padded[..block.len()].copy_from_slice(block);
            &padded
        }
    };
    let mut masks = [0u64; 6];
    for (lane, sixteen) in bytes.as_chunks::<16>().0.iter().enumerate() {
        // SAFETY: `sixteen` is 16 readable bytes; the load has no alignment requirement.
        let v = unsafe { _mm_loadu_si128(sixteen.as_ptr().cast::<__m128i>()) };
        let is = |byte: u8| _mm_cmpeq_epi8(v, _mm_set1_epi8(byte as i8));
        let within = |low: u8, count: u8| {
            let above = _mm_sub_epi8(v, _mm_set1_epi8(low as i8));
            _mm_cmpeq_epi8(_mm_min_epu8(above, _mm_set1_epi8((count - 1) as i8)), above)
        };
        let any = |masks: &[__m128i]| {
            masks
                .iter()
                .fold(masks[0], |all, &mask| _mm_or_si128(all, mask))
        };
        let (lower, upper) = (within(b'a', 26), within(b'A', 26));
        let lane_masks = [
            any(&[lower, upper, within(b'0', 10), is(b'_'), is(b'-')]),
            any(&[is(b' '), is(b'\t'), is(b'\n'), is(0x0C), is(b'\r')]),
            any(&[is(b'.'), is(b'?'), is(b'!')]),
            is(b'\n'),
            lower,
            upper,
        ];
        for (mask, lane_mask) in masks.iter_mut().zip(lane_masks) {
            *mask |= u64::from(_mm_movemask_epi8(lane_mask) as u16) << (16 * lane);
        }
    }
    masks
}

/// [`Bm25Encoder::visit_words`] for ASCII text: the same words, found on bytes, lowercased into one
/// reused buffer. With `breaks`, `visit(None)` marks each sentence end between words (where
/// [`sentences`] cuts: no word spans one, as none of its bytes is a word byte).
///
/// The text is read in blocks of 64 bytes: bit masks give each block's word starts, word ends and
/// sentence ends, visited in order by their set bits, with no branch per byte. A word is visited at
/// its start (its end is the next word end; no sentence end lies inside a word).
fn scan_ascii_words(text: &str, breaks: bool, mut visit: impl FnMut(Option<&str>)) {
    let mut buffer = String::new();
    let bytes = text.as_bytes();
    // A word that runs on past the end of the block it started in.
    let mut open: Option<usize> = None;
    // Whether the last byte of the previous block was a word byte.
    let mut carry = 0u64;
    for (index, block) in bytes.chunks(64).enumerate() {
        let base = 64 * index;
        let valid = u64::MAX >> (64 - block.len());
        let [words, spaces, stops, newlines, lowers, uppers] = block_masks(block);
        let previous = words << 1 | carry;
        let starts = words & !previous;
        let ends = !words & previous & valid;
        carry = words >> 63;
        if let Some(start) = open {
            if ends == 0 {
                continue;
            }
            open = None;
            let end = base + ends.trailing_zeros() as usize;
            visit_identifier(text, start, end, &mut buffer, &mut visit);
        }
        let sentence_ends = if breaks {
            // A stop ends a sentence before whitespace or the end of the text.
            let next_space = bytes.get(base + 64).is_none_or(u8::is_ascii_whitespace);
            let followed = spaces >> 1 | u64::from(next_space) << (block.len() - 1);
            newlines | (stops & followed)
        } else {
            0
        };
        let mut events = starts | sentence_ends;
        while events != 0 {
            let bit = events.trailing_zeros();
            events &= events - 1;
            if sentence_ends >> bit & 1 != 0 {
                visit(None);
                continue;
            }
            // The word's end: the first word end after its start, here or in a later block.
            let later = ends & (u64::MAX << bit);
            if later == 0 {
                open = Some(base + bit as usize);
                continue;
            }
            let end = later.trailing_zeros();
            // A plain word (a letter or digit, then lowercase letters only) is its own term, at most
            // its first letter to lowercase; other words are trimmed and split.
            let rest = (1u64 << (end - bit - 1)) - 1;
            let (start, end) = (base + bit as usize, base + end as usize);
            let joiner = matches!(bytes[start], b'_' | b'-');
            if !joiner && (lowers >> (bit + 1)) & rest == rest {
                let word = &text[start..end];
                let lower = if uppers >> bit & 1 != 0 {
                    buffer.clear();
                    buffer.push_str(word);
                    buffer.make_ascii_lowercase();
                    buffer.as_str()
                } else {
                    word
                };
                if !is_stop_word(lower) {
                    visit(Some(lower));
                }
            } else {
                visit_identifier(text, start, end, &mut buffer, &mut visit);
            }
        }
    }
    if let Some(start) = open {
        visit_identifier(text, start, bytes.len(), &mut buffer, &mut visit);
    }
}

/// Visits the terms of the run of word bytes `text[start..end]`: the identifier, trimmed of `_` and
/// `-`, lowercased (into `buffer` only if it has capitals) unless it is a stop word, and its parts
/// when it has several.
#[inline(always)]
fn visit_identifier(
    text: &str,
    start: usize,
    end: usize,
    buffer: &mut String,
    visit: &mut impl FnMut(Option<&str>),
) {
    fn push(buffer: &mut String, term: &str, visit: &mut impl FnMut(Option<&str>)) {
        let lower = if term.bytes().any(|b| b.is_ascii_uppercase()) {
            buffer.clear();
            buffer.push_str(term);
            buffer.make_ascii_lowercase();
            buffer.as_str()
        } else {
            term
        };
        if !lower.is_empty() && !is_stop_word(lower) {
            visit(Some(lower));
        }
    }
    let bytes = text.as_bytes();
    // `trim_matches(['_', '-'])` on bytes.
    let joiner = |b: u8| b == b'_' || b == b'-';
    let (mut from, mut to) = (start, end);
    while from < to && joiner(bytes[from]) {
        from += 1;
    }
    while to > from && joiner(bytes[to - 1]) {
        to -= 1;
    }
    if from == to {
        return;
    }
    let identifier = &text[from..to];
    // One part: a first character then lowercase letters, or digits only (a number has no camel or
    // digit boundary inside).
    let rest = &bytes[from + 1..to];
    if rest.iter().all(u8::is_ascii_lowercase)
        || (bytes[from].is_ascii_digit() && rest.iter().all(u8::is_ascii_digit))
    {
        push(buffer, identifier, visit);
        return;
    }
    let mut parts: Vec<&str> = Vec::new();
    for piece in identifier.split(['_', '-']).filter(|p| !p.is_empty()) {
        parts.extend(camel_parts(piece));
    }
    if parts.len() > 1 {
        push(buffer, identifier, visit);
    }
    for part in parts {
        push(buffer, part, visit);
    }
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
        self.stemmer.stem(lower).into_owned()
    }

    /// Visits the lowercased words of `text` that become terms (stop words dropped), before stemming:
    /// callers that only need some terms stem only those.
    pub fn visit_words(&self, text: &str, visit: &mut dyn FnMut(&str)) {
        if text.is_ascii() {
            scan_ascii_words(text, false, |word| {
                if let Some(word) = word {
                    visit(word);
                }
            });
        } else {
            visit_unicode_words(text, visit);
        }
    }

    /// Visits the words of `text` as [`Self::visit_words`] does, with `visit(None)` at sentence ends
    /// (sentences as [`sentences`] cuts them; the last one may end without a call). One pass over
    /// ASCII text.
    pub fn visit_sentence_words(&self, text: &str, mut visit: impl FnMut(Option<&str>)) {
        if text.is_ascii() {
            scan_ascii_words(text, true, visit);
        } else {
            for (from, to) in sentences(text) {
                visit_unicode_words(&text[from..to], &mut |word| visit(Some(word)));
                visit(None);
            }
        }
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

    /// The byte-at-a-time word finding [`scan_ascii_words`] replaced (the reference it must agree
    /// with): each run of word bytes goes to [`visit_identifier`] whole, and with `breaks`
    /// `visit(None)` marks each byte where [`crate::query::pack::ends_sentence`] is true.
    fn scan_ascii_words_bytewise(text: &str, breaks: bool, mut visit: impl FnMut(Option<&str>)) {
        let mut buffer = String::new();
        let bytes = text.as_bytes();
        let word_byte = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
        let mut at = 0;
        while at < bytes.len() {
            if !word_byte(bytes[at]) {
                if breaks && crate::query::pack::ends_sentence(bytes, at) {
                    visit(None);
                }
                at += 1;
                continue;
            }
            let start = at;
            while at < bytes.len() && word_byte(bytes[at]) {
                at += 1;
            }
            visit_identifier(text, start, at, &mut buffer, &mut visit);
        }
    }

    proptest::proptest! {
        /// The masks of the SSE2 version are those of the portable one, for any bytes (word,
        /// space and stop bytes often) and any block length.
        #[test]
        fn block_masks_are_the_portable_ones(
            block in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::sample::select(b" \t\n\r\x0b\x0c.?!_-aAzZ09@[`{/:".to_vec()),
                    proptest::num::u8::ANY,
                ],
                0..=64,
            ),
        ) {
            proptest::prop_assert_eq!(block_masks(&block), block_masks_portable(&block));
        }

        /// A number is one part, so the digits shortcut of `visit_identifier` visits what its
        /// split into parts would.
        #[test]
        fn numbers_are_one_part(number in "[0-9]{1,12}") {
            proptest::prop_assert_eq!(camel_parts(&number), vec![number.as_str()]);
            let mut visited = Vec::new();
            visit_identifier(&number, 0, number.len(), &mut String::new(), &mut |w: Option<&str>| {
                visited.push(w.map(str::to_string))
            });
            proptest::prop_assert_eq!(visited, vec![Some(number.clone())]);
        }

        /// The block scan visits the words and sentence ends the byte scan visits, in order
        /// (texts of up to four blocks, so words and sentence ends cross block edges).
        #[test]
        fn block_scan_is_the_byte_scan(
            text in "([a-zA-Z0-9_ .?!,()\\n\\t-]|Word|ID_x|HTTPServer){0,120}",
            breaks in proptest::bool::ANY,
        ) {
            let mut blocks = Vec::new();
            scan_ascii_words(&text, breaks, |w| blocks.push(w.map(str::to_string)));
            let mut bytewise = Vec::new();
            scan_ascii_words_bytewise(&text, breaks, |w| bytewise.push(w.map(str::to_string)));
            proptest::prop_assert_eq!(blocks, bytewise);
        }
    }

    proptest::proptest! {
        /// The integer lookup is membership in the list.
        #[test]
        fn stop_words_are_the_list(word in "[a-z\\x00]{0,8}", pick in 0..STOP_WORDS.len()) {
            proptest::prop_assert_eq!(is_stop_word(&word), STOP_WORDS.contains(&word.as_str()));
            proptest::prop_assert!(is_stop_word(STOP_WORDS[pick]));
        }

        #[test]
        fn ascii_words_are_the_unicode_path_words(
            text in "[a-zA-Z0-9_ .,()\\n-]{0,80}"
        ) {
            let mut ascii = Vec::new();
            scan_ascii_words(&text, false, |w| ascii.push(w.expect("no breaks").to_string()));
            let mut unicode = Vec::new();
            visit_unicode_words(&text, &mut |w| unicode.push(w.to_string()));
            proptest::prop_assert_eq!(ascii, unicode);
        }

        /// One pass with sentence ends finds the words of each sentence `sentences` cuts, on both
        /// paths.
        #[test]
        fn sentence_words_are_the_words_of_each_sentence(
            text in "[a-zA-Z0-9_ .?!,()\\n-]{0,80}",
            unicode in proptest::bool::ANY,
        ) {
            let text = if unicode { format!("{text} é") } else { text };
            let encoder = Bm25Encoder::default();
            let mut expected: Vec<Vec<String>> = Vec::new();
            for (from, to) in sentences(&text) {
                let mut words = Vec::new();
                encoder.visit_words(&text[from..to], &mut |w| words.push(w.to_string()));
                if !words.is_empty() {
                    expected.push(words);
                }
            }
            let mut found: Vec<Vec<String>> = vec![Vec::new()];
            encoder.visit_sentence_words(&text, &mut |w: Option<&str>| match w {
                Some(w) => found.last_mut().expect("open").push(w.to_string()),
                None => found.push(Vec::new()),
            });
            found.retain(|words| !words.is_empty());
            proptest::prop_assert_eq!(found, expected);
        }
    }

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
