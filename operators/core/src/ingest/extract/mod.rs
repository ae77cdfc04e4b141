//! Extract: HTML, PDF and DOCX files into the text the chunkers read.
//!
//! A file is recognised by its source's extension, then by its content ([`detect`]): `%PDF-` at the
//! start, a ZIP archive holding `word/document.xml`, or text that opens with `<!doctype html` or
//! `<html`. Its text comes out in ragstream's *extracted form*, which is what the document event
//! carries once extracted (`"extracted": true`) and what a DLQ record of the document replays:
//! - HTML and DOCX: markdown lines. Headings become `#` lines (so the markdown chunker carries them as
//!   the section path), paragraphs are separated by blank lines, list items start with `- `, table
//!   rows are `| a | b |` lines, preformatted blocks are fenced.
//! - PDF: the text of each page, pages separated by a form feed (`\x0c`, as `pdftotext` writes them);
//!   the chunker never lets a chunk cross one and numbers the pages from 1.
//!
//! Guarantees: extraction never panics on any input (a parser panic is caught and reported), every
//! decompression is bounded ([`ExtractLimits`]), the text is at most `max_text_bytes`, and a file
//! that cannot be read, or holds no text, is an [`ExtractError`] naming why (the DLQ reason
//! `unparseable`). The HTML and DOCX walks keep no stack of the input's nesting, so a deeply nested
//! file costs time linear in its size.
//!
//! The readers are the `formats` feature; a build without it still recognises these files and
//! refuses each with an [`ExtractError`] naming the feature.

#[cfg(feature = "formats")]
mod docx;
#[cfg(feature = "formats")]
mod html;
#[cfg(feature = "formats")]
mod pdf;

use crate::model::DocKind;

/// Bounds of one extraction.
#[derive(Debug, Clone, Copy)]
pub struct ExtractLimits {
    /// Longest extracted text, in bytes.
    pub max_text_bytes: usize,
    /// Most bytes one compressed part (a PDF stream, a DOCX archive entry) may inflate to.
    pub max_inflated_bytes: usize,
    /// Most PDF pages read.
    pub max_pages: usize,
}

impl ExtractLimits {
    /// The limits for a document event of at most `max_document_bytes`: the text may be as long as
    /// an event's text could be, one part may inflate to eight times that (at least 64 MiB).
    pub fn for_documents(max_document_bytes: usize) -> Self {
        Self {
            max_text_bytes: max_document_bytes,
            max_inflated_bytes: max_document_bytes.saturating_mul(8).max(64 << 20),
            max_pages: MAX_PAGES,
        }
    }
}

/// Most pages of a PDF read: a longer one is refused rather than cut.
pub const MAX_PAGES: usize = 10_000;

/// Why a file could not be extracted (the DLQ reason is `unparseable`; this is its message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{format} file cannot be read: {message}")]
pub struct ExtractError {
    /// The format it was read as.
    pub format: &'static str,
    /// What went wrong.
    pub message: String,
}

impl ExtractError {
    /// The refusal of a file read as `kind`.
    pub fn new(kind: DocKind, message: impl Into<String>) -> Self {
        Self {
            format: kind.as_str(),
            message: message.into(),
        }
    }
}

/// An extracted document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extracted {
    /// The text in extracted form.
    pub text: String,
    /// The title the file names for itself (HTML `<title>`, DOCX `dc:title`), if any.
    pub title: Option<String>,
}

/// Who reads files: this process ([`InProcess`]) or a reader the job provides (its sandbox: a child
/// process under hard limits, in the operators crate). A reader may block for as long as its own
/// limits allow: callers run it off the dataflow workers.
pub trait FileReader: Send + Sync + std::fmt::Debug {
    /// Extracts a file of `kind` (one of [`is_file_kind`]'s), as [`extract`] does.
    fn read(
        &self,
        kind: DocKind,
        bytes: &[u8],
        limits: &ExtractLimits,
    ) -> Result<Extracted, ExtractError>;
}

/// Reads files in the calling process: [`extract`] itself (tests, tools; the job uses its sandbox).
#[derive(Debug, Clone, Copy, Default)]
pub struct InProcess;

impl FileReader for InProcess {
    fn read(
        &self,
        kind: DocKind,
        bytes: &[u8],
        limits: &ExtractLimits,
    ) -> Result<Extracted, ExtractError> {
        extract(kind, bytes, limits)
    }
}

/// Whether `kind` is read from a file format rather than from text.
pub fn is_file_kind(kind: DocKind) -> bool {
    matches!(kind, DocKind::Html | DocKind::Pdf | DocKind::Docx)
}

/// The file format of `bytes` from `source`: the extension first (`.html`, `.htm`, `.xhtml`,
/// `.pdf`, `.docx`), then the content. `None`: not a format extracted here (text kinds decide later).
pub fn detect(source: &str, bytes: &[u8]) -> Option<DocKind> {
    let extension = source
        .rsplit(['/', '\\'])
        .next()
        .and_then(|name| name.rsplit_once('.'))
        .map(|(_, ext)| ext.to_ascii_lowercase())
        .unwrap_or_default();
    match extension.as_str() {
        "html" | "htm" | "xhtml" => return Some(DocKind::Html),
        "pdf" => return Some(DocKind::Pdf),
        "docx" => return Some(DocKind::Docx),
        _ => {}
    }
    let head = &bytes[..bytes.len().min(1024)];
    // A PDF starts with its header; a reader also takes one within the first KiB after binary junk.
    // Text that merely mentions the header (this file's own docs) is not a PDF.
    let at = memchr::memmem::find(head, b"%PDF-");
    if at == Some(0) || (at.is_some() && std::str::from_utf8(bytes).is_err()) {
        return Some(DocKind::Pdf);
    }
    #[cfg(feature = "formats")]
    if bytes.starts_with(b"PK\x03\x04") && docx::is_docx(bytes) {
        return Some(DocKind::Docx);
    }
    if looks_like_html(head) {
        return Some(DocKind::Html);
    }
    None
}

fn looks_like_html(head: &[u8]) -> bool {
    let head = head.strip_prefix(b"\xef\xbb\xbf").unwrap_or(head);
    let start = head
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(head.len());
    let head = &head[start..];
    let opens = |prefix: &[u8]| {
        head.len() >= prefix.len() && head[..prefix.len()].eq_ignore_ascii_case(prefix)
    };
    opens(b"<!doctype html") || opens(b"<html")
}

/// The reader of `kind`.
#[cfg(feature = "formats")]
fn read(kind: DocKind, bytes: &[u8], limits: &ExtractLimits) -> Result<Extracted, String> {
    match kind {
        DocKind::Html => html::extract(bytes, limits),
        DocKind::Pdf => pdf::extract(bytes, limits),
        DocKind::Docx => docx::extract(bytes, limits),
        other => Err(format!("{} is not a file format", other.as_str())),
    }
}

/// A build without the `formats` feature reads none of them.
#[cfg(not(feature = "formats"))]
fn read(kind: DocKind, _bytes: &[u8], _limits: &ExtractLimits) -> Result<Extracted, String> {
    Err(match is_file_kind(kind) {
        true => "this build of ragstream reads no such files: build it with the `formats` feature \
                 (cargo build --features formats, or --features full)"
            .into(),
        false => format!("{} is not a file format", kind.as_str()),
    })
}

/// Extracts a file of `kind` (one of [`is_file_kind`]'s).
pub fn extract(
    kind: DocKind,
    bytes: &[u8],
    limits: &ExtractLimits,
) -> Result<Extracted, ExtractError> {
    // The parsers are third-party code over hostile input: a panic in one is this file's refusal,
    // never the job's end.
    let result = std::panic::catch_unwind(|| read(kind, bytes, limits));
    let extracted = match result {
        Ok(Ok(extracted)) => extracted,
        Ok(Err(message)) => return Err(ExtractError::new(kind, message)),
        Err(_) => return Err(ExtractError::new(kind, "the parser failed on this file")),
    };
    if extracted.text.len() > limits.max_text_bytes {
        return Err(ExtractError::new(
            kind,
            format!(
                "its text exceeds the limit of {} bytes",
                limits.max_text_bytes
            ),
        ));
    }
    if extracted.text.trim().is_empty() {
        return Err(ExtractError::new(kind, "it holds no text"));
    }
    Ok(extracted)
}

/// The pages of a PDF's extracted text: each page's byte range (form feeds excluded) and number.
pub fn pages(text: &str) -> impl Iterator<Item = (usize, usize, u32)> + '_ {
    let mut start = 0;
    let mut number = 0u32;
    text.split('\x0c').map(move |page| {
        let range = (start, start + page.len());
        start += page.len() + 1;
        number = number.saturating_add(1);
        (range.0, range.1, number)
    })
}

/// Text assembled in extracted form with a size bound: pushes past `max` are dropped and remembered.
#[cfg(feature = "formats")]
struct Writer {
    text: String,
    max: usize,
    over: bool,
}

#[cfg(feature = "formats")]
impl Writer {
    fn new(max: usize) -> Self {
        Self {
            text: String::new(),
            max,
            over: false,
        }
    }

    fn push(&mut self, s: &str) {
        if self.text.len().saturating_add(s.len()) > self.max {
            self.over = true;
        } else {
            self.text.push_str(s);
        }
    }

    /// Ends the current line if it has text.
    fn end_line(&mut self) {
        if !self.at_line_start() {
            self.push("\n");
        }
    }

    /// Ends the current paragraph: a blank line follows it (not at the start of the text or a
    /// page).
    fn end_block(&mut self) {
        self.end_line();
        if !self.text.is_empty() && !self.text.ends_with("\n\n") && !self.text.ends_with('\x0c') {
            self.push("\n");
        }
    }

    /// Whether the current line has no text yet (the text, or a page, starts here).
    fn at_line_start(&self) -> bool {
        self.text.is_empty() || self.text.ends_with('\n') || self.text.ends_with('\x0c')
    }

    /// Appends inline text with its whitespace collapsed (one space between words, none at a line's
    /// start).
    fn push_inline(&mut self, s: &str) {
        for (index, word) in s.split(char::is_whitespace).enumerate() {
            if index > 0 && !self.at_line_start() && !self.text.ends_with(' ') {
                self.push(" ");
            }
            if !word.is_empty() {
                self.push(word);
            }
        }
    }

    fn finish(self) -> Result<String, String> {
        if self.over {
            return Err(format!("its text exceeds the limit of {} bytes", self.max));
        }
        // Trailing spaces of lines carry nothing.
        let mut out = String::with_capacity(self.text.len() + 1);
        for line in self.text.split_inclusive('\n') {
            let body = line.trim_end_matches(['\n', ' ']);
            out.push_str(body);
            if line.ends_with('\n') {
                out.push('\n');
            }
        }
        // One line end closes the text, however many blocks ended there.
        let end = out.trim_end_matches('\n').len();
        out.truncate(end);
        if !out.is_empty() {
            out.push('\n');
        }
        Ok(out)
    }
}

#[cfg(all(test, feature = "formats"))]
mod tests;

#[cfg(all(test, not(feature = "formats")))]
mod without_readers {
    use super::*;

    #[test]
    fn a_build_without_the_readers_refuses_each_file_naming_the_feature() {
        let limits = ExtractLimits::for_documents(1 << 20);
        assert_eq!(detect("report.pdf", b"%PDF-1.5"), Some(DocKind::Pdf));
        for kind in [DocKind::Html, DocKind::Pdf, DocKind::Docx] {
            let error = extract(kind, b"<html><p>text</p>", &limits).expect_err("refused");
            assert!(error.message.contains("`formats` feature"), "{error}");
        }
    }
}
