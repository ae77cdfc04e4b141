//! HTML into markdown lines, with html5ever's tokenizer (the WHATWG tokenizer, no tree).
//!
//! What is kept: headings (`h1`–`h6` as `#` lines), paragraphs and other blocks, list items, table
//! rows, preformatted text (fenced), the `<title>`. What is dropped with everything inside it:
//! `script`, `style`, `noscript`, `template`, `svg`, `math`, `iframe`, `object`, `select`, `nav`,
//! any element with `role="navigation"` or the `hidden` attribute. Without a tree there is no stack:
//! a skipped element ends at the end tag that balances its own start tags, so nesting depth costs
//! nothing; text that is not UTF-8 is read lossily.

use std::cell::RefCell;

use html5ever::tendril::StrTendril;
use html5ever::tokenizer::states::RawKind;
use html5ever::tokenizer::{
    BufferQueue, Tag, TagKind, Token, TokenSink, TokenSinkResult, Tokenizer, TokenizerOpts,
};

use super::{ExtractLimits, Extracted, Writer};

/// Longest heading kept as a heading, in bytes: a longer one (an unclosed `<h2>` swallowing the
/// page) is written as a paragraph from there on.
const MAX_HEADING_BYTES: usize = 512;
/// Longest title kept, in bytes.
const MAX_TITLE_BYTES: usize = 512;

/// Elements dropped with their content.
const SKIPPED: [&str; 10] = [
    "script", "style", "noscript", "template", "svg", "math", "iframe", "object", "select", "nav",
];

/// Elements that start and end a block (a paragraph break around them).
const BLOCKS: [&str; 30] = [
    "p",
    "div",
    "section",
    "article",
    "main",
    "header",
    "footer",
    "aside",
    "blockquote",
    "ul",
    "ol",
    "dl",
    "dt",
    "dd",
    "table",
    "thead",
    "tbody",
    "tfoot",
    "caption",
    "figure",
    "figcaption",
    "form",
    "fieldset",
    "legend",
    "address",
    "details",
    "summary",
    "hr",
    "body",
    "center",
];

pub(super) fn extract(bytes: &[u8], limits: &ExtractLimits) -> Result<Extracted, String> {
    let text = String::from_utf8_lossy(bytes);
    let sink = Sink {
        state: RefCell::new(State::new(limits.max_text_bytes)),
    };
    let tokenizer = Tokenizer::new(sink, TokenizerOpts::default());
    let input = BufferQueue::default();
    input.push_back(StrTendril::from_slice(&text));
    let _ = tokenizer.feed(&input);
    tokenizer.end();
    let state = tokenizer.sink.state.into_inner();
    state.finish()
}

struct Sink {
    state: RefCell<State>,
}

struct State {
    out: Writer,
    /// The element being skipped and how many of its start tags are open.
    skip: Option<(String, usize)>,
    /// The heading being read: its level and text.
    heading: Option<(usize, String)>,
    /// Open `pre` elements.
    pre: usize,
    /// The `<title>` text, while and after it is read.
    title: Option<String>,
    in_title: bool,
}

impl State {
    fn new(max: usize) -> Self {
        Self {
            out: Writer::new(max),
            skip: None,
            heading: None,
            pre: 0,
            title: None,
            in_title: false,
        }
    }

    fn finish(mut self) -> Result<Extracted, String> {
        self.flush_heading();
        let title = self
            .title
            .map(|t| t.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|t| !t.is_empty());
        Ok(Extracted {
            text: self.out.finish()?,
            title,
        })
    }

    fn flush_heading(&mut self) {
        if let Some((level, text)) = self.heading.take() {
            let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
            self.out.end_block();
            if !text.is_empty() {
                self.out.push(&"#".repeat(level));
                self.out.push(" ");
                self.out.push(&text);
                self.out.end_block();
            }
        }
    }

    fn text(&mut self, text: &str) {
        if self.skip.is_some() {
            return;
        }
        if self.in_title {
            let title = self.title.get_or_insert_with(String::new);
            if title.len() + text.len() <= MAX_TITLE_BYTES {
                title.push_str(text);
            }
            return;
        }
        if let Some((_, heading)) = &mut self.heading {
            if heading.len() + text.len() <= MAX_HEADING_BYTES {
                heading.push_str(text);
                return;
            }
            // Not a heading after all: what was read goes out as a paragraph with the rest.
            let (_, read) = self.heading.take().unwrap_or_default();
            self.out.end_block();
            self.inline(&read);
        }
        if self.pre > 0 {
            self.out.push(text);
        } else {
            self.inline(text);
        }
    }

    /// Inline text; a line that would read as markdown structure (a heading, a fence) is escaped.
    fn inline(&mut self, text: &str) {
        if self.out.at_line_start() {
            let trimmed = text.trim_start();
            if trimmed.starts_with('#') || trimmed.starts_with("```") {
                self.out.push("\\");
            }
        }
        self.out.push_inline(text);
    }

    fn tag(&mut self, tag: &Tag) -> TokenSinkResult<()> {
        let name: &str = &tag.name;
        let start = tag.kind == TagKind::StartTag;
        if let Some((skipped, open)) = &mut self.skip {
            if name == skipped.as_str() && !tag.self_closing {
                if start {
                    *open += 1;
                } else {
                    *open -= 1;
                    if *open == 0 {
                        self.skip = None;
                    }
                }
            }
            return raw_kind(name, start);
        }
        if start && !tag.self_closing && skipped(tag) {
            self.skip = Some((name.to_string(), 1));
            return raw_kind(name, start);
        }
        match name {
            "title" => {
                self.in_title = start && !tag.self_closing;
                return raw_kind(name, start);
            }
            "h1" | "h2" | "h3" | "h4" | "h5" | "h6" => {
                self.flush_heading();
                if start {
                    let level = usize::from(name.as_bytes()[1] - b'0');
                    self.heading = Some((level, String::new()));
                }
            }
            "pre" | "listing" => {
                self.flush_heading();
                if start {
                    self.out.end_block();
                    self.pre += 1;
                    self.out.push("```\n");
                } else if self.pre > 0 {
                    self.pre -= 1;
                    self.out.end_line();
                    self.out.push("```");
                    self.out.end_block();
                }
            }
            "br" => {
                if let Some((_, heading)) = &mut self.heading {
                    heading.push(' ');
                } else if self.pre > 0 {
                    self.out.push("\n");
                } else {
                    self.out.end_line();
                }
            }
            "li" if start => {
                self.flush_heading();
                self.out.end_line();
                self.out.push("- ");
            }
            "li" => self.out.end_line(),
            "tr" => {
                self.out.end_line();
                if start {
                    self.out.push("|");
                }
            }
            "td" | "th" => {
                if start {
                    self.out.push(" ");
                } else {
                    self.out.push(" |");
                }
            }
            name if BLOCKS.contains(&name) => {
                self.flush_heading();
                self.out.end_block();
            }
            _ => {}
        }
        raw_kind(name, start)
    }
}

/// Whether an element is dropped with its content.
fn skipped(tag: &Tag) -> bool {
    SKIPPED.contains(&&*tag.name)
        || tag.attrs.iter().any(|attr| {
            let name: &str = &attr.name.local;
            name == "hidden"
                || (name == "role" && attr.value.trim().eq_ignore_ascii_case("navigation"))
                || (name == "aria-hidden" && attr.value.trim().eq_ignore_ascii_case("true"))
        })
}

/// The tokenizer state the content of a start tag is read in (what a tree builder would tell it),
/// so that `<script>if (a<b)</script>` is text and not a tag.
fn raw_kind(name: &str, start: bool) -> TokenSinkResult<()> {
    if !start {
        return TokenSinkResult::Continue;
    }
    match name {
        "script" => TokenSinkResult::RawData(RawKind::ScriptData),
        "style" | "xmp" | "iframe" | "noembed" | "noframes" | "noscript" => {
            TokenSinkResult::RawData(RawKind::Rawtext)
        }
        "title" | "textarea" => TokenSinkResult::RawData(RawKind::Rcdata),
        "plaintext" => TokenSinkResult::Plaintext,
        _ => TokenSinkResult::Continue,
    }
}

impl TokenSink for Sink {
    type Handle = ();

    fn process_token(&self, token: Token, _line: u64) -> TokenSinkResult<()> {
        let mut state = self.state.borrow_mut();
        match token {
            Token::TagToken(tag) => state.tag(&tag),
            Token::CharacterTokens(text) => {
                state.text(&text);
                TokenSinkResult::Continue
            }
            _ => TokenSinkResult::Continue,
        }
    }
}
