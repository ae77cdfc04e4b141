//! Source path patterns: a query's `filters.source_pattern` (the MCP tools' `doc_filter` given as a
//! string), a glob over each document's source path.
//!
//! `*` matches within one path component, `**` across components, `?` one character, `[abc]` a
//! class and `{a,b}` alternatives: `docs/**/*.md`, `src/*.rs`, `**/README.md`. The pattern's leading
//! literal components (`docs` of `docs/**/*.md`) are applied inside the index query like a
//! `source_prefix`; the rest is matched against the sources of the candidates each lane returns,
//! the lanes reading [`PATTERN_DEPTH_FACTOR`] times deeper. A pattern matching few of the documents
//! under its literal components can therefore return fewer results than asked for: give it a longer
//! literal part, or a `source_prefix`.

/// Longest pattern accepted.
pub const MAX_PATTERN_BYTES: usize = 512;
/// How many times deeper each lane reads when a pattern filters its hits.
pub const PATTERN_DEPTH_FACTOR: usize = 4;

/// A checked source pattern.
#[derive(Debug, Clone)]
pub struct SourcePattern {
    matcher: globset::GlobMatcher,
    literal: String,
}

/// Whether a path component holds a glob metacharacter.
fn is_literal(component: &str) -> bool {
    !component.contains(['*', '?', '[', ']', '{', '}', '\\'])
}

/// The leading literal components of a pattern (empty when it starts with a wildcard), without
/// compiling it.
pub fn literal_prefix(pattern: &str) -> String {
    let trimmed = pattern.trim_start_matches('/');
    let literal: Vec<&str> = trimmed.split('/').take_while(|c| is_literal(c)).collect();
    literal.join("/")
}

impl SourcePattern {
    /// Checks and compiles `pattern`; the error says why it is refused.
    pub fn parse(pattern: &str) -> Result<Self, String> {
        if pattern.is_empty() || pattern.len() > MAX_PATTERN_BYTES {
            return Err(format!(
                "source_pattern must be 1 to {MAX_PATTERN_BYTES} bytes"
            ));
        }
        let glob = globset::GlobBuilder::new(pattern)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| format!("source_pattern {pattern:?}: {}", e.kind()))?;
        Ok(Self {
            matcher: glob.compile_matcher(),
            literal: literal_prefix(pattern),
        })
    }

    /// The pattern's leading literal components (empty when it starts with a wildcard).
    pub fn literal_prefix(&self) -> &str {
        &self.literal
    }

    /// Whether a source path matches.
    pub fn matches(&self, source: &str) -> bool {
        self.matcher.is_match(source)
    }
}

/// A glob over a query's text (`clear_cache`'s pattern): `*` any run of characters, `?` one, case
/// ignored; at most [`MAX_PATTERN_BYTES`].
#[derive(Debug, Clone)]
pub struct TextPattern(globset::GlobMatcher);

impl TextPattern {
    /// Checks and compiles `pattern`.
    pub fn parse(pattern: &str) -> Result<Self, String> {
        if pattern.is_empty() || pattern.len() > MAX_PATTERN_BYTES {
            return Err(format!("pattern must be 1 to {MAX_PATTERN_BYTES} bytes"));
        }
        let glob = globset::GlobBuilder::new(pattern)
            .case_insensitive(true)
            .literal_separator(false)
            .build()
            .map_err(|e| format!("pattern {pattern:?}: {}", e.kind()))?;
        Ok(Self(glob.compile_matcher()))
    }

    /// Whether a query text matches.
    pub fn matches(&self, text: &str) -> bool {
        self.0.is_match(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_patterns_match_whole_texts_ignoring_case_and_slashes() {
        let tides = TextPattern::parse("*tide*").expect("valid");
        assert!(tides.matches("Why do TIDES rise?"));
        assert!(tides.matches("tide"));
        assert!(!tides.matches("why is the sky blue"));
        let paths = TextPattern::parse("where is src/*").expect("valid");
        assert!(paths.matches("where is src/lib/mod.rs"), "`*` crosses `/`");
        assert!(TextPattern::parse("").is_err());
        assert!(TextPattern::parse(&"a".repeat(513)).is_err());
        assert!(TextPattern::parse("[unclosed").is_err());
    }

    #[test]
    fn globs_match_paths_by_component_and_give_their_literal_directories() {
        let md = SourcePattern::parse("docs/**/*.md").expect("valid");
        assert_eq!(md.literal_prefix(), "docs");
        assert!(md.matches("docs/guide/intro.md"));
        assert!(md.matches("docs/a.md"));
        assert!(!md.matches("docs/a.rs"));
        assert!(!md.matches("other/docs/a.md"));
        let shallow = SourcePattern::parse("src/*.rs").expect("valid");
        assert!(shallow.matches("src/lib.rs"));
        assert!(
            !shallow.matches("src/query/mod.rs"),
            "* stays in one component"
        );
        let anywhere = SourcePattern::parse("**/README.{md,txt}").expect("valid");
        assert_eq!(anywhere.literal_prefix(), "");
        assert!(anywhere.matches("README.md") && anywhere.matches("a/b/README.txt"));
        let one = SourcePattern::parse("notes/day?.txt").expect("valid");
        assert_eq!(one.literal_prefix(), "notes");
        assert!(one.matches("notes/day1.txt") && !one.matches("notes/day10.txt"));
        let exact = SourcePattern::parse("docs/guide.md").expect("valid");
        assert_eq!(exact.literal_prefix(), "docs/guide.md");
        assert!(exact.matches("docs/guide.md"));
    }

    #[test]
    fn bad_patterns_are_refused_with_a_reason() {
        assert!(SourcePattern::parse("docs/[a")
            .unwrap_err()
            .contains("docs/[a"));
        assert!(SourcePattern::parse("").is_err());
        assert!(SourcePattern::parse(&"a".repeat(MAX_PATTERN_BYTES + 1)).is_err());
    }
}
