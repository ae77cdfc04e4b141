//! The o200k_base pre-tokenizer, written out by hand for the characters whose Unicode general
//! category is known here.
//!
//! tiktoken splits text into pieces with the pattern below (run by a backtracking regex engine, the
//! largest part of counting a long context), then byte-pair-encodes each piece on its own. The same
//! pieces come out of [`split`], which walks the text once; the token count of a piece is looked up in
//! a per-thread cache and only a piece not seen before is encoded by tiktoken itself. Around a
//! character outside the known blocks (ASCII, Latin-1, Latin Extended-A, General Punctuation) the
//! text is cut where every match of the pattern ends whatever the characters are, and that stretch
//! (a word or a few) is encoded by tiktoken on its own.
//!
//! ```text
//! [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//! |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
//! |\p{N}{1,3}
//! | ?[^\s\p{L}\p{N}]+[\r\n/]*
//! |\s*[\r\n]+
//! |\s+(?!\S)
//! |\s+
//! ```
//!
//! In the known blocks every letter is `Lu` or `Ll` (`ª` and `º`, the two `Lo` letters of Latin-1,
//! are left to tiktoken), so a character is one of six classes and the alternatives reduce to runs of
//! classes.

use std::cell::RefCell;

use rustc_hash::FxHashMap;

/// What the pattern sees of a character.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// `\p{Lu}` (no `Lt`, `Lm`, `Lo` or `M` in the known blocks).
    Upper,
    /// `\p{Ll}`.
    Lower,
    /// `\p{N}`.
    Digit,
    /// `\r` or `\n`.
    Newline,
    /// Any other `\s` (Unicode White_Space).
    Space,
    /// Neither letter, number nor whitespace.
    Other,
}

impl Class {
    fn is_space(self) -> bool {
        matches!(self, Self::Newline | Self::Space)
    }
}

/// The class of `c`, or `None` outside the blocks whose categories are known here.
fn class(c: char) -> Option<Class> {
    Some(match c {
        'A'..='Z' => Class::Upper,
        'a'..='z' => Class::Lower,
        '0'..='9' => Class::Digit,
        '\r' | '\n' => Class::Newline,
        '\t' | '\u{0B}' | '\u{0C}' | ' ' => Class::Space,
        '\0'..='\u{7F}' => Class::Other,
        '\u{85}' | '\u{A0}' => Class::Space,
        'µ' => Class::Lower,
        '²' | '³' | '¹' | '¼' | '½' | '¾' => Class::Digit,
        'ª' | 'º' => return None,
        '\u{80}'..='\u{BF}' | '×' | '÷' => Class::Other,
        '\u{C0}'..='\u{17F}' if c.is_uppercase() => Class::Upper,
        '\u{C0}'..='\u{17F}' if c.is_lowercase() => Class::Lower,
        '\u{2000}'..='\u{206F}' if c.is_whitespace() => Class::Space,
        '\u{2000}'..='\u{206F}' => Class::Other,
        _ => return None,
    })
}

/// The class of each ASCII byte, as [`class`] has it.
const ASCII_CLASSES: [Class; 128] = {
    let mut table = [Class::Other; 128];
    let mut byte = 0;
    while byte < 128 {
        let b = byte as u8;
        table[byte] = match b {
            b'A'..=b'Z' => Class::Upper,
            b'a'..=b'z' => Class::Lower,
            b'0'..=b'9' => Class::Digit,
            b'\r' | b'\n' => Class::Newline,
            b'\t' | 0x0B | 0x0C | b' ' => Class::Space,
            _ => Class::Other,
        };
        byte += 1;
    }
    table
};

/// The length of the ASCII prefix of `bytes`, read eight bytes at a time.
fn ascii_prefix(bytes: &[u8]) -> usize {
    let (blocks, _) = bytes.as_chunks::<8>();
    for (index, block) in blocks.iter().enumerate() {
        let high = u64::from_le_bytes(*block) & 0x8080_8080_8080_8080;
        if high != 0 {
            return 8 * index + high.trailing_zeros() as usize / 8;
        }
    }
    let tail = 8 * blocks.len();
    tail + bytes[tail..].iter().take_while(|b| b.is_ascii()).count()
}

/// A text walked by byte offset, each character classified as it is read (ASCII bytes by table).
/// With `ASCII` the text is known to be ASCII, so every character is one byte classified by table.
struct Classes<'a, const ASCII: bool> {
    text: &'a str,
}

impl<'a> Classes<'a, false> {
    /// The walker of `text`, or `None` when a character of it is outside the known blocks.
    fn of(text: &'a str) -> Option<Self> {
        // Every ASCII character is known; the others are looked up once here (runs of ASCII are
        // skipped eight bytes at a time, not decoded).
        let mut rest = text;
        loop {
            rest = &rest[ascii_prefix(rest.as_bytes())..];
            let Some(c) = rest.chars().next() else {
                return Some(Self { text });
            };
            class(c)?;
            rest = &rest[c.len_utf8()..];
        }
    }
}

impl<'a> Classes<'a, true> {
    /// The walker of ASCII `text`.
    fn ascii(text: &'a str) -> Self {
        debug_assert!(text.is_ascii());
        Self { text }
    }
}

impl<const ASCII: bool> Classes<'_, ASCII> {
    fn len(&self) -> usize {
        self.text.len()
    }

    /// The class, character and byte length of the character at byte offset `at`.
    #[inline(always)]
    fn get(&self, at: usize) -> Option<(Class, char, usize)> {
        let byte = *self.text.as_bytes().get(at)?;
        if ASCII || byte.is_ascii() {
            return Some((ASCII_CLASSES[byte as usize], byte as char, 1));
        }
        let c = self.text[at..].chars().next()?;
        Some((class(c).expect("checked in `of`"), c, c.len_utf8()))
    }

    #[inline(always)]
    fn class(&self, at: usize) -> Option<Class> {
        self.get(at).map(|c| c.0)
    }

    #[inline(always)]
    fn char(&self, at: usize) -> Option<char> {
        self.get(at).map(|c| c.1)
    }

    /// The offset of the character after the one at `at` (`at` itself at the end).
    #[inline(always)]
    fn next(&self, at: usize) -> usize {
        self.get(at).map_or(at, |c| at + c.2)
    }

    /// The offset of the character before `at` (which is past the start).
    fn previous(&self, at: usize) -> usize {
        if ASCII {
            return at - 1;
        }
        let bytes = self.text.as_bytes();
        let mut k = at - 1;
        while bytes[k] & 0xC0 == 0x80 {
            k -= 1;
        }
        k
    }

    /// The end of the run of characters from `at` that satisfy `keep`.
    #[inline(always)]
    fn run(&self, mut at: usize, keep: impl Fn(Class, char) -> bool) -> usize {
        while let Some((class, c, length)) = self.get(at) {
            if !keep(class, c) {
                break;
            }
            at += length;
        }
        at
    }

    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)?` at `at`: where it ends.
    fn contraction(&self, at: usize) -> usize {
        if self.char(at) != Some('\'') {
            return at;
        }
        // Case-insensitive as the regex engine folds: `ſ` (long s) folds to `s`.
        let lower = |k: usize| {
            self.char(k).map(|c| match c {
                'ſ' => 's',
                c => c.to_ascii_lowercase(),
            })
        };
        let second = at + 1;
        let third = self.next(second);
        match (lower(second), lower(third)) {
            (Some('s' | 't' | 'm' | 'd'), _) => third,
            (Some('r' | 'v'), Some('e')) | (Some('l'), Some('l')) => self.next(third),
            _ => at,
        }
    }

    /// The end (byte offset) of the piece starting at `i`.
    fn piece(&self, i: usize) -> usize {
        let first = self.class(i).expect("a character at i");
        // Letters, after an optional character that is no letter, number or line break.
        let letters = if matches!(first, Class::Space | Class::Other) {
            self.next(i)
        } else {
            i
        };
        let uppers = self.run(letters, |class, _| class == Class::Upper);
        let lowers = self.run(uppers, |class, _| class == Class::Lower);
        if lowers > uppers || uppers > letters {
            // `[Lu]*[Ll]+` when lowercase letters follow, else `[Lu]+`: either way up to `lowers`.
            return self.contraction(lowers);
        }
        if first == Class::Digit {
            // At most three digits.
            let mut end = i;
            for _ in 0..3 {
                match self.get(end) {
                    Some((Class::Digit, _, length)) => end += length,
                    _ => break,
                }
            }
            return end;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
        let symbols = if self.char(i) == Some(' ') && self.class(i + 1) == Some(Class::Other) {
            i + 1
        } else {
            i
        };
        if self.class(symbols) == Some(Class::Other) {
            let end = self.run(symbols, |class, _| class == Class::Other);
            return self.run(end, |class, c| class == Class::Newline || c == '/');
        }
        // Whitespace: up to its last line break, else all of it but the last character when a
        // non-space follows (that one joins the next piece), else all of it. Line breaks are
        // ASCII, so the bytes are searched (no byte of a longer character is one).
        let end = self.run(i, |class, _| class.is_space());
        if let Some(last) = self.text.as_bytes()[i..end]
            .iter()
            .rposition(|&b| b == b'\r' || b == b'\n')
        {
            return i + last + 1;
        }
        if end < self.len() && self.previous(end) > i {
            self.previous(end)
        } else {
            end
        }
    }
}

/// The pieces of `text` as the o200k_base pattern splits it, or `None` when it holds a character
/// outside the known blocks.
#[cfg(test)]
pub fn split(text: &str) -> Option<Vec<&str>> {
    let mut pieces = Vec::new();
    walk(text, |at, end| pieces.push(&text[at..end]))?;
    Some(pieces)
}

/// Calls `visit(start, end)` for each piece of `text` in order; `None` (and no call) when it holds
/// a character outside the known blocks.
fn walk(text: &str, visit: impl FnMut(usize, usize)) -> Option<()> {
    fn pieces<const ASCII: bool>(classes: Classes<'_, ASCII>, mut visit: impl FnMut(usize, usize)) {
        let mut at = 0;
        while at < classes.len() {
            let end = classes.piece(at);
            visit(at, end);
            at = end;
        }
    }
    if text.is_ascii() {
        pieces(Classes::ascii(text), visit);
    } else {
        pieces(Classes::of(text)?, visit);
    }
    Some(())
}

/// Most pieces a thread remembers (then it starts over): a few MiB at most.
const CACHE_LIMIT: usize = 1 << 16;

/// Longest piece kept under an integer key.
const SHORT: usize = 7;

/// Token counts of pieces seen by this thread: pieces of up to [`SHORT`] bytes under an integer key
/// (their bytes, then their length in the top byte), longer ones by text.
#[derive(Default)]
struct Counts {
    short: FxHashMap<u64, u32>,
    long: FxHashMap<Box<str>, u32>,
}

thread_local! {
    static COUNTS: RefCell<Counts> = RefCell::new(Counts::default());
}

/// The key of `bytes[at..end]` (at most [`SHORT`] bytes): the bytes, then the length.
fn short_key(bytes: &[u8], at: usize, end: usize) -> u64 {
    let length = end - at;
    let value = match bytes.get(at..at + 8) {
        // Eight bytes read at once, the ones past the piece masked off.
        Some(eight) => {
            u64::from_le_bytes(eight.try_into().expect("eight bytes"))
                & ((1u64 << (8 * length)) - 1)
        }
        None => bytes[at..end]
            .iter()
            .rev()
            .fold(0u64, |key, &byte| key << 8 | u64::from(byte)),
    };
    value | (length as u64) << 56
}

/// Longest stretch around an unknown character whose count is cached (longer ones are encoded
/// each time, so that the cache's memory stays a few MiB).
const REGION_CACHED: usize = 128;

/// Whether every match of the o200k pattern ends at byte offset `at` of `text` (a character
/// boundary) whatever characters come before and after, known or not: no piece holds a letter
/// followed by whitespace (letters are only in the letter alternatives, which end in letters or a
/// contraction), nor a line break followed by anything but whitespace or `/` (a line break is in a
/// whitespace piece or at the end of a symbol run, `[\r\n/]*`). The start and end of the text count.
fn hard_boundary(text: &str, at: usize) -> bool {
    let (Some(before), Some(after)) = (text[..at].chars().next_back(), text[at..].chars().next())
    else {
        return true;
    };
    (matches!(class(before), Some(Class::Upper | Class::Lower)) && after.is_whitespace())
        || (matches!(before, '\r' | '\n') && !after.is_whitespace() && after != '/')
}

/// The byte offset and length of the first character of `text` at or after `from` outside the
/// known blocks.
fn next_unknown(text: &str, from: usize) -> Option<(usize, usize)> {
    let mut at = from;
    loop {
        at += ascii_prefix(&text.as_bytes()[at..]);
        let c = text[at..].chars().next()?;
        if class(c).is_none() {
            return Some((at, c.len_utf8()));
        }
        at += c.len_utf8();
    }
}

/// The tokens of `text` under o200k_base: the pieces' counts, each from the cache or from `encode`
/// (tiktoken on the piece alone). Around a character outside the known blocks the text is cut at
/// the nearest [`hard_boundary`] on each side and that stretch is encoded by tiktoken on its own (a
/// word or a few, where it used to be the whole text); the rest is split by hand.
pub fn count(text: &str, encode: impl Fn(&str) -> usize) -> usize {
    let mut total = 0;
    visit_counts(text, &encode, |_, tokens| total += tokens);
    total
}

/// Calls `visit(start, tokens)` for each piece of `text` in order, a stretch around characters
/// outside the known blocks as one piece (see [`count`]); no piece crosses a [`hard_boundary`].
fn visit_counts(text: &str, encode: &impl Fn(&str) -> usize, mut visit: impl FnMut(usize, usize)) {
    COUNTS.with(|cache| {
        let mut cache = cache.borrow_mut();
        let mut start = 0;
        while start < text.len() {
            let Some((unknown, length)) = next_unknown(text, start) else {
                cache.known(&text[start..], start, encode, &mut visit);
                break;
            };
            // `start` is a hard boundary (the text's start or the end of the last stretch).
            let back = (start..=unknown)
                .rev()
                .filter(|&at| text.is_char_boundary(at))
                .find(|&at| at == start || hard_boundary(text, at))
                .unwrap_or(unknown);
            let mut end = unknown + length;
            while end < text.len() && !hard_boundary(text, end) {
                end += text[end..].chars().next().map_or(1, char::len_utf8);
            }
            cache.known(&text[start..back], start, encode, &mut visit);
            if back < end {
                visit(back, cache.region(&text[back..end], encode));
            }
            start = end;
        }
    });
}

/// The tokens of `text` and of each of its `spans` (byte ranges at character boundaries) counted
/// alone, walking `text` once. A span that starts at a [`hard_boundary`] of `text` holds the same
/// pieces there as alone up to its last hard boundary, so only what follows that (a word or a few)
/// is counted again; any other span is counted on its own.
pub fn count_spans(
    text: &str,
    spans: &[std::ops::Range<usize>],
    encode: impl Fn(&str) -> usize,
) -> (usize, Vec<usize>) {
    // Each span's start and last hard boundary, where it starts at one and has one past its start.
    let cuts: Vec<Option<(usize, usize)>> = spans
        .iter()
        .map(|span| {
            if span.start >= span.end || !hard_boundary(text, span.start) {
                return None;
            }
            if hard_boundary(text, span.end) {
                return Some((span.start, span.end));
            }
            // Inside the span a boundary depends on the span's own characters only.
            text[span.start..span.end]
                .char_indices()
                .rev()
                .map(|(at, _)| span.start + at)
                .take_while(|&at| at > span.start)
                .find(|&at| hard_boundary(text, at))
                .map(|last| (span.start, last))
        })
        .collect();
    let mut marks: Vec<usize> = cuts.iter().flatten().flat_map(|&(a, b)| [a, b]).collect();
    marks.sort_unstable();
    marks.dedup();
    // The tokens before each mark.
    let mut before = Vec::with_capacity(marks.len());
    let mut total = 0;
    visit_counts(text, &encode, |start, tokens| {
        while before.len() < marks.len() && marks[before.len()] <= start {
            before.push(total);
        }
        total += tokens;
    });
    before.resize(marks.len(), total);
    let at = |mark: usize| before[marks.binary_search(&mark).expect("a mark")];
    let counts = spans
        .iter()
        .zip(&cuts)
        .map(|(span, cut)| match *cut {
            Some((start, last)) => at(last) - at(start) + count(&text[last..span.end], &encode),
            None => count(&text[span.clone()], &encode),
        })
        .collect();
    (total, counts)
}

impl Counts {
    /// Visits the pieces of `text`, which holds known characters only and starts at byte `offset` of
    /// the text walked: `visit(start, tokens)`.
    fn known(
        &mut self,
        text: &str,
        offset: usize,
        encode: &impl Fn(&str) -> usize,
        visit: &mut impl FnMut(usize, usize),
    ) {
        let bytes = text.as_bytes();
        let Counts { short, long } = self;
        let walked = walk(text, |at, end| {
            let length = end - at;
            // Every single byte is a token of its own.
            if length == 1 {
                visit(offset + at, 1);
                return;
            }
            let piece = &text[at..end];
            let tokens = if length <= SHORT {
                let key = short_key(bytes, at, end);
                Self::cached(short, &key, || key, piece, encode)
            } else {
                Self::cached(long, piece, || piece.into(), piece, encode)
            };
            visit(offset + at, tokens as usize);
        });
        debug_assert!(walked.is_some(), "known characters only");
    }

    /// The count of a stretch around characters outside the known blocks, by tiktoken (cached when
    /// short).
    fn region(&mut self, text: &str, encode: &impl Fn(&str) -> usize) -> usize {
        if text.len() > REGION_CACHED {
            return encode(text);
        }
        Self::cached(&mut self.long, text, || text.into(), text, encode) as usize
    }

    /// The count of `piece` in `map` under `key`, else from `encode` and kept under `own()` (the map
    /// starts over at [`CACHE_LIMIT`] entries).
    fn cached<K, Q>(
        map: &mut FxHashMap<K, u32>,
        key: &Q,
        own: impl FnOnce() -> K,
        piece: &str,
        encode: &impl Fn(&str) -> usize,
    ) -> u32
    where
        K: std::borrow::Borrow<Q> + std::hash::Hash + Eq,
        Q: std::hash::Hash + Eq + ?Sized,
    {
        if let Some(&tokens) = map.get(key) {
            return tokens;
        }
        let tokens = encode(piece) as u32;
        if map.len() >= CACHE_LIMIT {
            map.clear();
        }
        map.insert(own(), tokens);
        tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The integer key of a short piece is its bytes and length, read at once or byte by byte.
        #[test]
        fn short_keys_are_bytes_and_length(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 1..20),
            at in 0usize..20,
            length in 1usize..=SHORT,
        ) {
            let at = at % bytes.len();
            let end = (at + length).min(bytes.len());
            let mut expected = ((end - at) as u64) << 56;
            for (shift, &byte) in bytes[at..end].iter().enumerate() {
                expected |= u64::from(byte) << (8 * shift);
            }
            proptest::prop_assert_eq!(short_key(&bytes, at, end), expected);
        }
    }

    proptest::proptest! {
        /// The ASCII prefix read by blocks is the prefix read byte by byte.
        #[test]
        fn ascii_prefix_is_the_bytewise_prefix(text in "[a-z ]{0,20}[é–]?[a-z]{0,5}") {
            let bytes = text.as_bytes();
            proptest::prop_assert_eq!(
                ascii_prefix(bytes),
                bytes.iter().take_while(|b| b.is_ascii()).count()
            );
        }
    }

    #[test]
    fn ascii_table_is_the_class_of_each_byte() {
        for byte in 0u8..128 {
            assert_eq!(
                Some(ASCII_CLASSES[byte as usize]),
                class(byte as char),
                "{byte}"
            );
        }
    }
}
