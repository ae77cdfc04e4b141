//! Text: what a sentence, a word and a stem are, defined once here for the packer (snippets cut on
//! sentences), the rerank (a sentence's evidence), BM25 (its terms) and the redundancy metric.
//!
//! - **Sentence**: a line break ends one, and so does `.`, `?` or `!` before whitespace or the end of
//!   the text ([`ends_sentence`]); spans are trimmed and never empty. The chunker cuts paragraphs into
//!   sentences with a finer rule of its own (`ingest::chunk::text`): a stop must be followed by what
//!   starts a sentence, so `e.g. this` stays one unit.
//! - **Word**: a run of alphanumeric characters, `_` and `-`, trimmed of `_` and `-` at its ends. A
//!   plain word (a first character, then lowercase ASCII letters: `Word`, `1st`) is one term; another
//!   identifier yields itself and its parts (`snake_case`, `camelCase`, `kebab-case`, `HTTPServer` →
//!   `http`, `server`), so `parse_config` matches `parse_config`, `parseConfig` and `config`. Words
//!   are lowercased; English stop words are dropped ([`visit_words`]).
//! - **Stem**: the Snowball English stemmer over a lowercased word ([`Stemmer`]).
//! - **Code**: text whose lines read as source code ([`looks_like_code`]), whatever kind it was
//!   indexed as.
//!
//! Plain code throughout: put back alone, the largest of the hand-vectorised scans these replaced (the
//! block word scan) changed no round trip of a job-level bench
//! (docs/decisions/0035-plain-text-scans.md).

/// English stop words: dropped from BM25 terms and from the rerank's query terms.
pub const STOP_WORDS: [&str; 47] = [
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it",
    "its", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they",
    "this", "to", "was", "were", "will", "with", "what", "which", "who", "whom", "how", "when",
    "where", "why", "did", "does", "do", "has", "have", "had",
];

/// Whether `word` (lowercased) is one of [`STOP_WORDS`]. A `match` over the same words (a test
/// checks both agree): the compiler branches on the length and the bytes instead of comparing every
/// word in turn, and every word of every candidate passes through here.
pub fn is_stop_word(word: &str) -> bool {
    matches!(
        word,
        "a" | "an"
            | "and"
            | "are"
            | "as"
            | "at"
            | "be"
            | "but"
            | "by"
            | "for"
            | "if"
            | "in"
            | "into"
            | "is"
            | "it"
            | "its"
            | "of"
            | "on"
            | "or"
            | "such"
            | "that"
            | "the"
            | "their"
            | "then"
            | "there"
            | "these"
            | "they"
            | "this"
            | "to"
            | "was"
            | "were"
            | "will"
            | "with"
            | "what"
            | "which"
            | "who"
            | "whom"
            | "how"
            | "when"
            | "where"
            | "why"
            | "did"
            | "does"
            | "do"
            | "has"
            | "have"
            | "had"
    )
}

/// Whether a sentence ends at byte `at` of `bytes`: a line break, or `.`, `?` or `!` before whitespace
/// or the end of the text.
pub fn ends_sentence(bytes: &[u8], at: usize) -> bool {
    match bytes[at] {
        b'\n' => true,
        b'.' | b'?' | b'!' => bytes.get(at + 1).is_none_or(|b| b.is_ascii_whitespace()),
        _ => false,
    }
}

/// Sentence byte ranges of `text` (trimmed, non-empty).
pub fn sentences(text: &str) -> Vec<(usize, usize)> {
    sentence_spans(text).collect()
}

/// Sentence byte ranges of `text` (trimmed, non-empty), found as they are asked for.
pub fn sentence_spans(text: &str) -> impl Iterator<Item = (usize, usize)> + '_ {
    let bytes = text.as_bytes();
    let mut start = 0;
    std::iter::from_fn(move || {
        while start < bytes.len() {
            let from = start;
            start = (from..bytes.len())
                .find(|&at| ends_sentence(bytes, at))
                .map_or(bytes.len(), |at| at + 1);
            let piece = &text[from..start];
            let lead = piece.len() - piece.trim_start().len();
            let trimmed = piece.trim();
            if !trimmed.is_empty() {
                return Some((from + lead, from + lead + trimmed.len()));
            }
        }
        None
    })
}

/// Splits an identifier into its camelCase / acronym / digit parts (`HTTPServerError` → `HTTP`,
/// `Server`, `Error`; `utf8` → `utf`, `8`).
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

/// Whether an ASCII byte belongs to an identifier (a letter, a digit, `_` or `-`).
const IDENTIFIER_BYTES: [bool; 128] = {
    let mut table = [false; 128];
    let mut byte = 0;
    while byte < 128 {
        let c = byte as u8;
        table[byte] = c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
        byte += 1;
    }
    table
};

/// The runs of `text` of alphanumeric characters, `_` and `-` (what splitting at every other
/// character leaves, empty runs skipped). ASCII bytes are looked up in a table; only other
/// characters are decoded and asked `is_alphanumeric` (every word of every chunk the rerank reads
/// and the index stores passes through here).
fn identifiers(text: &str) -> impl Iterator<Item = &str> {
    let bytes = text.as_bytes();
    let mut at = 0;
    std::iter::from_fn(move || {
        let mut start = None;
        while at < bytes.len() {
            let byte = bytes[at];
            let (inside, width) = if byte < 0x80 {
                (IDENTIFIER_BYTES[byte as usize], 1)
            } else {
                let c = text[at..].chars().next().expect("at a character boundary");
                (c.is_alphanumeric(), c.len_utf8())
            };
            if inside {
                start.get_or_insert(at);
            } else if let Some(from) = start {
                let run = &text[from..at];
                at += width;
                return Some(run);
            }
            at += width;
        }
        start.map(|from| &text[from..])
    })
}

/// Visits the words of `text` (see the module docs), lowercased, stop words dropped, before stemming:
/// callers that only need some terms stem only those.
pub fn visit_words(text: &str, visit: &mut dyn FnMut(&str)) {
    let mut push = |term: &str| {
        let upper = if term.is_ascii() {
            term.bytes().any(|b| b.is_ascii_uppercase())
        } else {
            term.chars().any(char::is_uppercase)
        };
        let lower: std::borrow::Cow<'_, str> = if upper {
            std::borrow::Cow::Owned(term.to_lowercase())
        } else {
            std::borrow::Cow::Borrowed(term)
        };
        if !lower.is_empty() && !is_stop_word(&lower) {
            visit(&lower);
        }
    };
    for identifier in identifiers(text) {
        let identifier = identifier.trim_matches(['_', '-']);
        if identifier.is_empty() {
            continue;
        }
        // A plain word (any first character, then lowercase ASCII letters: `word`, `Word`, `1st`) is
        // one part.
        if identifier.is_ascii() && identifier.bytes().skip(1).all(|b| b.is_ascii_lowercase()) {
            push(identifier);
            continue;
        }
        let mut parts: Vec<&str> = Vec::new();
        for piece in identifier.split(['_', '-']).filter(|p| !p.is_empty()) {
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

/// Visits the words of `text` as [`visit_words`] does, with `visit(None)` after each sentence (as
/// [`sentences`] cuts them).
pub fn visit_sentence_words(text: &str, mut visit: impl FnMut(Option<&str>)) {
    for (from, to) in sentence_spans(text) {
        visit_words(&text[from..to], &mut |word| visit(Some(word)));
        visit(None);
    }
}

/// The Snowball English stemmer.
pub struct Stemmer(rust_stemmers::Stemmer);

impl Default for Stemmer {
    fn default() -> Self {
        Self(rust_stemmers::Stemmer::create(
            rust_stemmers::Algorithm::English,
        ))
    }
}

impl std::fmt::Debug for Stemmer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stemmer(English)")
    }
}

impl Stemmer {
    /// The stem of one lowercased word.
    pub fn stem(&self, lower: &str) -> String {
        self.0.stem(lower).into_owned()
    }
}

/// Line starts that only source code has (a keyword and what follows it, a decorator).
const CODE_STARTS: [&str; 37] = [
    "def ",
    "class ",
    "import ",
    "from ",
    "return",
    "fn ",
    "pub ",
    "let ",
    "const ",
    "var ",
    "function ",
    "func ",
    "package ",
    "elif ",
    "else:",
    "else {",
    "} else",
    "try:",
    "except",
    "async ",
    "await ",
    "struct ",
    "impl ",
    "use ",
    "static ",
    "public ",
    "private ",
    "protected ",
    "raise ",
    "yield ",
    "lambda",
    "switch",
    "case ",
    "break;",
    "continue;",
    "if (",
    "@",
];

/// Operators that prose does not write between spaces or letters.
const CODE_OPERATORS: [&str; 11] = [
    " = ", "==", "!=", "+=", "-=", "->", "=>", "::", ":=", "&&", "||",
];

/// Whether `line` (trimmed, inline code spans removed) reads as a line of source code: a closing
/// bracket alone, a keyword start, an operator, or a line ending in `{ } ; : , )` that calls something
/// (`name(`) or opens a bracket.
fn code_line(line: &str) -> bool {
    if matches!(
        line,
        "}" | "};" | ")" | "]" | "end" | "});" | "})" | ");" | "]," | "},"
    ) {
        return true;
    }
    if CODE_STARTS.iter().any(|start| line.starts_with(start))
        || CODE_OPERATORS.iter().any(|op| line.contains(op))
    {
        return true;
    }
    let bytes = line.as_bytes();
    let call = bytes.windows(2).any(|w| {
        w[1] == b'(' && (w[0].is_ascii_alphanumeric() || matches!(w[0], b'_' | b')' | b']'))
    });
    line.ends_with(['{', '}', ';', ':', ',', ')']) && (call || line.contains(['[', '{']))
}

/// Whether a trimmed line is a comment of a common language, a doc comment or a Rust attribute
/// (starting `#`, `*`, `//` or `/*`); in markdown, `#` starts a heading.
pub fn comment_line(line: &str) -> bool {
    line.starts_with(['#', '*']) || line.starts_with("//") || line.starts_with("/*")
}

/// Whether a name (a file name, a path element) is opaque: its stem, before the last `.`, has no
/// letter (`4711.py`, `2024-05-01`), or is a hex run of at least 8 characters with a digit (a hash, a
/// UUID). Such a name tells an embedder nothing about the passage it labels.
pub fn is_opaque_name(name: &str) -> bool {
    let stem = name.rsplit_once('.').map_or(name, |(stem, _)| stem).trim();
    if stem.is_empty() {
        return !name.trim().chars().any(char::is_alphabetic);
    }
    if !stem.chars().any(char::is_alphabetic) {
        return true;
    }
    stem.len() >= 8
        && stem.chars().any(|c| c.is_ascii_digit())
        && stem.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

/// Whether `text` holds `word` with no letter, digit or `_` touching it on either side.
pub fn holds_word(text: &str, word: &str) -> bool {
    let word = word.trim();
    if word.is_empty() {
        return false;
    }
    let identifier = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(identifier) && !after.is_some_and(identifier)
    })
}

/// Whether `text` reads as source code: of its lines that are not blank, comments, headings, list
/// items or table rows (starting `#`, `//`, `/*`, `*` or `|`) and not in a `"""` or `'''` block
/// (docstrings: these say nothing either way), at least two and at least 40 % are code lines
/// ([`code_line`]). Inline code spans in
/// backticks are left out first, so prose that quotes code (`a = 1`) stays prose. A text of one
/// line never is: prose paragraphs arrive as one line. Over the dev corpora: 6234 of CoSQA's 6267
/// Python functions, none of SQuAD's 2067 paragraphs or SciFact's 5183 abstracts.
pub fn looks_like_code(text: &str) -> bool {
    // One line never holds two code lines; a prose corpus's paragraphs end here.
    if !text.trim().contains('\n') {
        return false;
    }
    let (mut lines, mut code) = (0usize, 0usize);
    let mut docstring = false;
    for line in text.lines() {
        let line = line.trim();
        let quotes = line.matches("\"\"\"").count() + line.matches("'''").count();
        if docstring || quotes > 0 {
            docstring ^= quotes % 2 == 1;
            continue;
        }
        if line.is_empty() || comment_line(line) || line.starts_with('|') {
            continue;
        }
        lines += 1;
        code += usize::from(if line.contains('`') {
            code_line(line.split('`').step_by(2).collect::<String>().trim())
        } else {
            code_line(line)
        });
    }
    code >= 2 && code * 5 >= lines * 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opaque_names_have_no_letters_or_are_hashes() {
        for name in [
            "4711.py",
            "0",
            "2024-05-01.md",
            "3f2a9c01.rs",
            "550e8400-e29b-41d4-a716-446655440000",
        ] {
            assert!(is_opaque_name(name), "{name}");
        }
        for name in [
            "service.rs",
            "add.py",
            "deadbeef.c",
            ".bashrc",
            "v1.2",
            "README",
            "face.py",
        ] {
            assert!(!is_opaque_name(name), "{name}");
        }
    }

    #[test]
    fn holds_word_needs_a_boundary_on_both_sides() {
        assert!(holds_word("def add(a, b):", "add"));
        assert!(holds_word("## Install", "Install"));
        assert!(!holds_word("def address(a):", "add"));
        assert!(!holds_word("x = _add", "add"));
        assert!(!holds_word("anything", ""));
    }

    fn words(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        visit_words(text, &mut |w| out.push(w.to_string()));
        out
    }

    #[test]
    fn sentence_splitting() {
        let text = "First one. Second? Third!\nFourth line without stop\n3.14 is pi.";
        let spans: Vec<&str> = sentences(text).iter().map(|&(a, b)| &text[a..b]).collect();
        assert_eq!(
            spans,
            vec![
                "First one.",
                "Second?",
                "Third!",
                "Fourth line without stop",
                "3.14 is pi."
            ]
        );
        assert!(sentences(" \n\n ").is_empty());
    }

    #[test]
    fn identifiers_yield_themselves_and_their_parts() {
        assert_eq!(
            words("fn parse_config(HTTPServer) and kebab-case, utf8"),
            vec![
                "fn",
                "parse_config",
                "parse",
                "config",
                "httpserver",
                "http",
                "server",
                "kebab-case",
                "kebab",
                "case",
                "utf8",
                "utf",
                "8"
            ]
        );
        // Plain words are one part; joiners at the ends are trimmed; stop words leave.
        assert_eq!(
            words("The -word_ Élan and 2024"),
            vec!["word", "élan", "2024"]
        );
        // A first character then lowercase letters is one word; a digit run ends a part elsewhere.
        assert_eq!(
            words("1990s 1st p53"),
            vec!["1990s", "1990", "s", "1st", "p53", "p", "53"]
        );
    }

    #[test]
    fn the_stop_word_match_is_the_list() {
        for word in STOP_WORDS {
            assert!(is_stop_word(word), "{word}");
        }
        let mut words = std::collections::BTreeSet::new();
        for word in STOP_WORDS {
            assert!(words.insert(word), "{word} twice");
            // Every prefix and extension of a stop word that is not itself one is no stop word.
            for cut in 0..word.len() {
                assert_eq!(
                    is_stop_word(&word[..cut]),
                    STOP_WORDS.contains(&&word[..cut])
                );
            }
            assert!(
                !is_stop_word(&format!("{word}s")) || STOP_WORDS.contains(&&*format!("{word}s"))
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn identifiers_are_the_runs_between_other_characters(text in "([a-zA-Z0-9_ .,;:!?'\"()\\[\\]/-]|[àéüßÄΣσ日本語٣²½\u{00A0}\u{2003}\u{0301}]){0,60}") {
            let expected: Vec<&str> = text
                .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-'))
                .filter(|run| !run.is_empty())
                .collect();
            proptest::prop_assert_eq!(identifiers(&text).collect::<Vec<_>>(), expected);
        }

        /// A stop word is one of the list, whatever its spelling around it.
        #[test]
        fn stop_words_are_dropped(pick in 0..STOP_WORDS.len(), word in "[a-z]{1,8}") {
            let stop = STOP_WORDS[pick];
            proptest::prop_assert!(words(&stop.to_uppercase()).is_empty());
            let expected = if STOP_WORDS.contains(&word.as_str()) { vec![] } else { vec![word.clone()] };
            proptest::prop_assert_eq!(words(&word), expected);
        }

        /// With sentence ends, the words are those of each sentence `sentences` cuts, in order.
        #[test]
        fn sentence_words_are_the_words_of_each_sentence(
            text in "([a-zA-Z0-9_-]{0,70}[ .,()?!\\n]{1,3}){0,8}",
            unicode in proptest::bool::ANY,
        ) {
            let text = if unicode { format!("{text} é") } else { text };
            let expected: Vec<Vec<String>> = sentences(&text)
                .into_iter()
                .map(|(from, to)| words(&text[from..to]))
                .filter(|words| !words.is_empty())
                .collect();
            let mut found: Vec<Vec<String>> = vec![Vec::new()];
            visit_sentence_words(&text, |w| match w {
                Some(w) => found.last_mut().expect("open").push(w.to_string()),
                None => found.push(Vec::new()),
            });
            found.retain(|words| !words.is_empty());
            proptest::prop_assert_eq!(found, expected);
        }
    }

    #[test]
    fn code_reads_as_code_and_prose_does_not() {
        let python = "def paste(xsel=False):\n    \"\"\"Returns system clipboard contents.\n\n    Long docstring lines\n    say nothing.\n    \"\"\"\n    selection = \"primary\" if xsel else \"clipboard\"\n    return run(selection)";
        assert!(looks_like_code(python));
        let rust = "fn main() {\n    let x = parse(input);\n    println!(\"{x}\");\n}";
        assert!(looks_like_code(rust));
        let java = "public int size() {\n    return count;\n}";
        assert!(looks_like_code(java));
        // One line: a prose paragraph (SQuAD, SciFact) arrives as one.
        assert!(!looks_like_code("x = f(y); return z;"));
        let wrapped = "The rule reads the hits (what the lanes found), not only the\nquery: a query in plain words, whose dense lane's top hits\nare mostly code, is a code search; for such a query the\nlanes are weighted dense 0.85 / BM25 0.15 (see Fuse).";
        assert!(!looks_like_code(wrapped));
        let quoting = "Set `ttl_secs = 3600` to keep contexts an hour,\nand `max_citations = 200000` to bound memory;\nboth live in the invalidations section.";
        assert!(
            !looks_like_code(quoting),
            "inline code spans are prose's quotes"
        );
        let markdown = "# Title\n\n| a | b |\n|---|---|\n\n- a list item\n- another one";
        assert!(!looks_like_code(markdown));
    }
}
