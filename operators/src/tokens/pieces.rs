//! The o200k_base pre-tokenizer, written out by hand for the characters whose Unicode general
//! category is known here.
//!
//! tiktoken splits text into pieces with the pattern below (run by a backtracking regex engine, the
//! largest part of counting a long context), then byte-pair-encodes each piece on its own. The same
//! pieces come out of [`split`], which walks the text once; the token count of a piece is looked up in
//! a per-thread cache and only a piece not seen before is encoded by tiktoken itself. Text holding a
//! character outside the known blocks (ASCII, Latin-1, Latin Extended-A, General Punctuation) makes
//! [`split`] answer `None` and is counted by tiktoken whole.
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

/// A text with the class of each character, walked by byte offset.
struct Classes<'a> {
    text: &'a str,
    /// `(byte offset, class, char)` of every character, then an end marker.
    chars: Vec<(usize, Class, char)>,
}

impl<'a> Classes<'a> {
    fn of(text: &'a str) -> Option<Self> {
        let mut chars = Vec::with_capacity(text.len() + 1);
        for (at, c) in text.char_indices() {
            chars.push((at, class(c)?, c));
        }
        Some(Self { text, chars })
    }

    fn len(&self) -> usize {
        self.chars.len()
    }

    fn class(&self, i: usize) -> Option<Class> {
        self.chars.get(i).map(|c| c.1)
    }

    fn char(&self, i: usize) -> Option<char> {
        self.chars.get(i).map(|c| c.2)
    }

    /// The end of the run of characters from `i` that satisfy `keep`.
    fn run(&self, mut i: usize, keep: impl Fn(Class, char) -> bool) -> usize {
        while let Some(&(_, class, c)) = self.chars.get(i) {
            if !keep(class, c) {
                break;
            }
            i += 1;
        }
        i
    }

    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)?` at `i`: where it ends.
    fn contraction(&self, i: usize) -> usize {
        if self.char(i) != Some('\'') {
            return i;
        }
        // Case-insensitive as the regex engine folds: `ſ` (long s) folds to `s`.
        let lower = |k: usize| {
            self.char(k).map(|c| match c {
                'ſ' => 's',
                c => c.to_ascii_lowercase(),
            })
        };
        match (lower(i + 1), lower(i + 2)) {
            (Some('s' | 't' | 'm' | 'd'), _) => i + 2,
            (Some('r' | 'v'), Some('e')) | (Some('l'), Some('l')) => i + 3,
            _ => i,
        }
    }

    /// The end (character index) of the piece starting at `i`.
    fn piece(&self, i: usize) -> usize {
        let first = self.chars[i].1;
        // Letters, after an optional character that is no letter, number or line break.
        let letters = if matches!(first, Class::Space | Class::Other) {
            i + 1
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
            return self.run(i, |class, _| class == Class::Digit).min(i + 3);
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
        // non-space follows (that one joins the next piece), else all of it.
        let end = self.run(i, |class, _| class.is_space());
        if let Some(last) = (i..end)
            .rev()
            .find(|&k| self.class(k) == Some(Class::Newline))
        {
            return last + 1;
        }
        if end < self.len() && end - i > 1 {
            end - 1
        } else {
            end
        }
    }
}

/// The pieces of `text` as the o200k_base pattern splits it, or `None` when it holds a character
/// outside the known blocks.
pub fn split(text: &str) -> Option<Vec<&str>> {
    let classes = Classes::of(text)?;
    let mut pieces = Vec::new();
    let mut i = 0;
    while i < classes.len() {
        let end = classes.piece(i);
        let from = classes.chars[i].0;
        let to = classes.chars.get(end).map_or(classes.text.len(), |c| c.0);
        pieces.push(&classes.text[from..to]);
        i = end;
    }
    Some(pieces)
}

/// Most pieces a thread remembers (then it starts over): a few MiB at most.
const CACHE_LIMIT: usize = 1 << 16;

thread_local! {
    static COUNTS: RefCell<FxHashMap<Box<str>, u32>> = RefCell::new(FxHashMap::default());
}

/// The tokens of `text` under o200k_base: the pieces' counts, each from the cache or from `encode`
/// (tiktoken on the piece alone). `None` when [`split`] cannot split it.
pub fn count(text: &str, encode: impl Fn(&str) -> usize) -> Option<usize> {
    let pieces = split(text)?;
    COUNTS.with(|cache| {
        let mut cache = cache.borrow_mut();
        let mut total = 0;
        for piece in pieces {
            // Every single byte is a token of its own.
            if piece.len() == 1 {
                total += 1;
                continue;
            }
            if let Some(&tokens) = cache.get(piece) {
                total += tokens as usize;
                continue;
            }
            let tokens = encode(piece);
            if cache.len() >= CACHE_LIMIT {
                cache.clear();
            }
            cache.insert(piece.into(), tokens as u32);
            total += tokens;
        }
        Some(total)
    })
}
