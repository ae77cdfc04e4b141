//! The records that flow through the ingest dataflow.
//!
//! A [`DocKey`] (`tenant/doc_id`) identifies a document everywhere: on the Kafka topic (the message key),
//! in the differential upsert, in the index payload. A [`ChunkSet`] is everything the index holds for one
//! document; two chunk sets with the same chunk ids differ at most in their version.

use serde::{Deserialize, Serialize};

/// Tenant and document id: the key of every document event.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DocKey {
    /// The tenant owning the document (no `/`).
    pub tenant: String,
    /// The document id inside the tenant (may contain `/`).
    pub doc_id: String,
}

impl DocKey {
    /// Builds a key.
    pub fn new(tenant: impl Into<String>, doc_id: impl Into<String>) -> Self {
        Self {
            tenant: tenant.into(),
            doc_id: doc_id.into(),
        }
    }

    /// Parses the wire form `tenant/doc_id` (the tenant is everything before the first `/`).
    pub fn parse(key: &str) -> Option<Self> {
        let (tenant, doc_id) = key.split_once('/')?;
        if tenant.is_empty() || doc_id.is_empty() {
            return None;
        }
        Some(Self::new(tenant, doc_id))
    }

    /// A stable 64-bit hash used to route the key to its owning worker and shard.
    pub fn route(&self) -> u64 {
        let mut hasher = blake3::Hasher::new();
        hasher.update(self.tenant.as_bytes());
        hasher.update(b"/");
        hasher.update(self.doc_id.as_bytes());
        hash_prefix(&hasher.finalize())
    }
}

/// blake3 of length-prefixed fields, so that no two lists of fields hash alike by running together.
pub fn hash_fields(fields: &[&[u8]]) -> blake3::Hash {
    let mut hasher = blake3::Hasher::new();
    for bytes in fields {
        hasher.update(&(bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    }
    hasher.finalize()
}

/// The first eight bytes of a hash, as a number.
pub fn hash_prefix(hash: &blake3::Hash) -> u64 {
    u64::from_le_bytes(hash.as_bytes()[..8].try_into().expect("8 bytes"))
}

impl std::fmt::Display for DocKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.tenant, self.doc_id)
    }
}

/// What kind of text a document holds; decides the chunker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum DocKind {
    /// Plain text: paragraphs and sentences.
    Prose,
    /// Markdown: headings, paragraphs, fenced code.
    Markdown,
    /// Source code: function and class boundaries.
    Code,
    /// SQL table metadata as JSON: one chunk per table.
    SqlSchema,
    /// An HTML page: its headings are the section path ([`crate::ingest::extract`]).
    Html,
    /// A PDF: the text of each page, every chunk within one page and numbered by it.
    Pdf,
    /// A Word document (DOCX): its headings are the section path.
    Docx,
    /// Decide from the source's extension and the content.
    Auto,
}

impl DocKind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Prose => "prose",
            Self::Markdown => "markdown",
            Self::Code => "code",
            Self::SqlSchema => "sql_schema",
            Self::Html => "html",
            Self::Pdf => "pdf",
            Self::Docx => "docx",
            Self::Auto => "auto",
        }
    }

    /// Parses a wire name.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "prose" => Some(Self::Prose),
            "markdown" => Some(Self::Markdown),
            "code" => Some(Self::Code),
            "sql_schema" => Some(Self::SqlSchema),
            "html" => Some(Self::Html),
            "pdf" => Some(Self::Pdf),
            "docx" => Some(Self::Docx),
            "auto" => Some(Self::Auto),
            _ => None,
        }
    }
}

/// A validated document to (re)index.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Document {
    /// Tenant and id.
    pub key: DocKey,
    /// Monotonic version chosen by the producer; older versions than the indexed one are ignored.
    pub version: u64,
    /// Where the document comes from (a path or URL); shown in every context item.
    pub source: String,
    /// The kind as sent (`Auto` is resolved by the chunker).
    pub kind: DocKind,
    /// Optional title; defaults to the source's file name.
    pub title: Option<String>,
    /// The full text.
    pub text: String,
    /// Access-control labels; a query must carry one of them to see the document (empty = tenant-wide).
    pub acl: Vec<String>,
    /// When the document last changed, milliseconds since the Unix epoch, as the event's `updated_at`
    /// says; 0 when it does not (the age policy of surrogates then treats it as new).
    pub updated_ms: u64,
    /// The event's `metadata` object, checked and canonical ([`crate::metadata`]).
    pub metadata: crate::metadata::Metadata,
}

/// A document event after decoding: an upsert or a delete.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum DocOp {
    /// Insert or replace the document.
    Upsert(Document),
    /// Remove the document. `version` is `None` for a Kafka tombstone (delete whatever is there).
    Delete {
        /// The document to remove.
        key: DocKey,
        /// The version of the delete, if the event carried one.
        version: Option<u64>,
    },
}

impl DocOp {
    /// The document key the event is about.
    pub fn key(&self) -> &DocKey {
        match self {
            Self::Upsert(doc) => &doc.key,
            Self::Delete { key, .. } => key,
        }
    }
}

/// One chunk of a document, with every field the index stores except the versions.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Chunk {
    /// Position of the chunk in its document, from 0.
    pub order_index: u32,
    /// Heading path (markdown), item path (code) or table path (schema) leading to the chunk.
    pub section_path: Vec<String>,
    /// A one-line header for the chunk (the innermost heading, the item signature, the table name).
    pub header: String,
    /// The document title.
    pub doc_title: String,
    /// The document source.
    pub source: String,
    /// The resolved kind (never `Auto`).
    pub kind: DocKind,
    /// First and last line of the chunk in the document, 1-based and inclusive.
    pub lines: (u32, u32),
    /// The PDF page the chunk is on, from 1 (a chunk never spans pages); `None` for other kinds.
    #[serde(default)]
    pub page: Option<u32>,
    /// Byte range of the chunk in the document text, `[start, end)`.
    pub char_range: (u32, u32),
    /// Token count of `text`, with the tokenizer named in the ingest config.
    pub tokens: u32,
    /// Hash of what the embedder sees (title, section path, text): equal hashes mean an equal vector.
    pub content_hash: String,
    /// How many earlier chunks of the document have the same `content_hash` (identical passages of
    /// one document are kept apart by it).
    pub occurrence: u32,
    /// Access-control labels copied from the document.
    pub acl: Vec<String>,
    /// ISO 639-3 code of the document's language (`ingest::lang`); empty when none was detected (code,
    /// schemas, texts too short to call).
    pub lang: String,
    /// When the chunk's document last changed as of the version that wrote it (the document's
    /// `updated_ms`; 0 = unknown). Not part of the layout: an unchanged chunk keeps the time it was
    /// written with.
    #[serde(default)]
    pub updated_ms: u64,
    /// The document's metadata, copied to every chunk (filterable inside the index query).
    #[serde(default)]
    pub metadata: crate::metadata::Metadata,
    /// The chunk text.
    pub text: String,
    /// The document's last chunk (`false` in points written before it was kept: unknown). With
    /// `order_index` 0, the document's only chunk: it has no neighbours to read.
    #[serde(default)]
    pub last: bool,
}

impl Chunk {
    /// The point id: the chunk's identity in its document, whatever its position.
    pub fn point_id(&self, key: &DocKey) -> uuid::Uuid {
        point_id(key, &self.content_hash, self.occurrence)
    }

    /// A fingerprint of everything the index stores with the chunk besides what the embedder sees and
    /// the version: position, line and byte ranges, page, header, source, kind, token count, ACL,
    /// language, metadata, being the document's last. A chunk
    /// whose id is kept and whose layout changed is rewritten with its stored vector, not re-embedded.
    /// (A chunk that is not the last hashes as before `last` was kept, so only last chunks written
    /// before it are rewritten when their document next changes.)
    pub fn layout(&self) -> u64 {
        let acl = self.acl.join("\u{1f}");
        let fields: [&[u8]; 14] = [
            &self.order_index.to_le_bytes(),
            &self.lines.0.to_le_bytes(),
            &self.lines.1.to_le_bytes(),
            &self.page.unwrap_or(0).to_le_bytes(),
            &self.char_range.0.to_le_bytes(),
            &self.char_range.1.to_le_bytes(),
            self.header.as_bytes(),
            self.source.as_bytes(),
            self.kind.as_str().as_bytes(),
            &self.tokens.to_le_bytes(),
            acl.as_bytes(),
            self.lang.as_bytes(),
            self.metadata.as_str().as_bytes(),
            b"last",
        ];
        let used = if self.last {
            fields.len()
        } else {
            fields.len() - 1
        };
        hash_prefix(&hash_fields(&fields[..used]))
    }

    /// The document's only chunk: nothing of its document lies around it.
    pub fn is_whole_document(&self) -> bool {
        self.order_index == 0 && self.last
    }

    /// The text handed to the embedder (and to the BM25 encoder): title and section path give the
    /// passage its context. A title or section-path element is left out when it adds nothing: an
    /// opaque name ([`crate::text::is_opaque_name`]: a file called `4711.py` or by a hash), a path
    /// element equal to the title (a document without a title is titled by its file name), or one
    /// the text's first lines already hold as a word (the item's signature, the section's heading).
    /// Such a repeat weighs the identifier twice in a vector that should say what the passage does:
    /// over CoSQA's functions, dense-only nDCG@10 was 0.5873 with the `<file> > <name>` line,
    /// 0.5936 without the opaque file name and 0.6021 without either.
    pub fn embedding_input(&self) -> String {
        let mut input = String::with_capacity(self.text.len() + 64);
        let title = self.doc_title.trim();
        let title = if crate::text::is_opaque_name(title) {
            ""
        } else {
            title
        };
        if !title.is_empty() {
            input.push_str(title);
            input.push('\n');
        }
        let opening = opening_lines(&self.text, self.kind == DocKind::Code);
        let mut first = true;
        for element in &self.section_path {
            if crate::text::is_opaque_name(element)
                || element.trim() == title
                || crate::text::holds_word(opening, element)
            {
                continue;
            }
            if !first {
                input.push_str(" > ");
            }
            input.push_str(element);
            first = false;
        }
        if !first {
            input.push('\n');
        }
        input.push_str(&self.text);
        input
    }

    /// The chunk's evidence units: its sentences (in code and schemas, where a line break ends a
    /// sentence, its lines), each with a vector of its own so the rerank can see the one sentence that
    /// answers a query in a chunk about several things. Units without a word (two letters in a row)
    /// are left out, repeats are kept once, at most [`MAX_EVIDENCE_UNITS`] are taken from the start,
    /// and a chunk of one unit has none (its own vector is that sentence's).
    pub fn evidence_units(&self) -> Vec<&str> {
        self.evidence_spans()
            .into_iter()
            .map(|range| &self.text[range])
            .collect()
    }

    /// Where [`Self::evidence_units`] lie in the chunk's text (byte ranges, in the same order).
    pub fn evidence_spans(&self) -> Vec<std::ops::Range<usize>> {
        let mut spans: Vec<std::ops::Range<usize>> = Vec::new();
        for (start, end) in crate::text::sentence_spans(&self.text) {
            let unit = &self.text[start..end];
            if has_word(unit) && !spans.iter().any(|s| &self.text[s.clone()] == unit) {
                spans.push(start..end);
                if spans.len() == MAX_EVIDENCE_UNITS {
                    break;
                }
            }
        }
        if spans.len() < 2 {
            spans.clear();
        }
        spans
    }
}

/// Which evidence units of a chunk get vectors at ingest (`[embedder] evidence_units` and
/// `evidence_vectors`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EvidenceUnits {
    /// None: a chunk's evidence is its own vector's cosine.
    #[default]
    Off,
    /// Every unit ([`Chunk::evidence_units`]), each embedded as a text of its own.
    Alone,
    /// The units of prose (every kind but code and SQL schemas), pooled from their chunk's own pass;
    /// code and schema chunks get none: their lines pooled in context ranked CoSQA below no units at
    /// all (docs/decisions/0048-pooled-evidence-units.md).
    Pooled,
}

impl EvidenceUnits {
    /// The units of `chunk` that get vectors, as byte ranges of its text.
    pub fn spans(self, chunk: &Chunk) -> Vec<std::ops::Range<usize>> {
        match self {
            Self::Off => Vec::new(),
            Self::Pooled if matches!(chunk.kind, DocKind::Code | DocKind::SqlSchema) => Vec::new(),
            Self::Alone | Self::Pooled => chunk.evidence_spans(),
        }
    }

    /// [`Self::spans`] as byte ranges of `input`, the chunk's [`Chunk::embedding_input`] (which ends
    /// with its text).
    pub fn spans_in_input(self, chunk: &Chunk, input: &str) -> Vec<std::ops::Range<usize>> {
        let offset = input.len().saturating_sub(chunk.text.len());
        self.spans(chunk)
            .into_iter()
            .map(|range| range.start + offset..range.end + offset)
            .collect()
    }
}

/// Evidence units embedded per chunk at most ([`Chunk::evidence_units`]): a 200-token prose chunk
/// holds about 8 sentences, a 300-token code chunk about 25 lines.
pub const MAX_EVIDENCE_UNITS: usize = 32;

/// Lines of a chunk's opening that may repeat its section path: a signature, a heading.
const OPENING_LINES: usize = 3;

/// The start of `text` up to its [`OPENING_LINES`]th non-blank line, as one slice. In code, lines of
/// doc comments, attributes and decorators (starting `//`, `/*`, `*`, `#` or `@`) do not count: a
/// code item's chunk opens with them and its signature follows.
fn opening_lines(text: &str, code: bool) -> &str {
    let mut seen = 0;
    let mut end = text.len();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        offset += line.len();
        let line = line.trim();
        let prefix = code && (crate::text::comment_line(line) || line.starts_with('@'));
        if !line.is_empty() && !prefix {
            seen += 1;
            if seen == OPENING_LINES {
                end = offset;
                break;
            }
        }
    }
    &text[..end]
}

/// Whether `text` holds two letters in a row.
fn has_word(text: &str) -> bool {
    let mut previous = false;
    text.chars().any(|c| {
        let letter = c.is_alphabetic();
        let word = previous && letter;
        previous = letter;
        word
    })
}

/// Everything the index holds for one document.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ChunkSet {
    /// Version of the document event that produced these chunks.
    pub version: u64,
    /// The chunks, by `order_index`.
    pub chunks: Vec<Chunk>,
    /// The document they were cut from, while its change is on its way to the index (what a refusal
    /// dead-letters); `None` for what the index itself holds.
    #[serde(default)]
    pub document: Option<std::sync::Arc<Document>>,
}

impl ChunkSet {
    /// What the differential upsert keeps of this set: the version, the point ids and their layouts.
    pub fn ids(&self, key: &DocKey) -> ChunkIds {
        let mut ids: Vec<(uuid::Uuid, u64)> = self
            .chunks
            .iter()
            .map(|c| (c.point_id(key), c.layout()))
            .collect();
        ids.sort_unstable();
        ChunkIds {
            version: self.version,
            ids,
        }
    }
}

/// What the ingest dataflow keeps of a document between its events: the version and its chunks'
/// point ids and layouts ([`Chunk::layout`]), 24 bytes a chunk. The chunks themselves (text, payload) travel beside the differential
/// upsert to `ChunkDiff` and are dropped once their time is done, so the state held for a whole corpus
/// does not include its text.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ChunkIds {
    /// Version of the document event that produced the chunks.
    pub version: u64,
    /// Point ids of the chunks with their layouts, sorted.
    pub ids: Vec<(uuid::Uuid, u64)>,
}

/// Deterministic point id of a chunk: UUIDv5 over tenant, doc id, content hash and occurrence.
///
/// A replayed event produces the same ids, so every index write is idempotent; a chunk that only
/// moved in its document keeps its id (its position is payload).
pub fn point_id(key: &DocKey, content_hash: &str, occurrence: u32) -> uuid::Uuid {
    let name = format!(
        "{}\u{1f}{}\u{1f}{}\u{1f}{}",
        key.tenant, key.doc_id, content_hash, occurrence
    );
    uuid::Uuid::new_v5(&POINT_NAMESPACE, name.as_bytes())
}

/// Namespace of ragstream point ids (a fixed random UUID).
const POINT_NAMESPACE: uuid::Uuid =
    uuid::Uuid::from_u128(0x6d1f_0c1e_93b4_4b8e_9a7d_5c2e_1f04_a3b7);

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(kind: DocKind, text: &str) -> Chunk {
        let mut chunk = crate::testing::sample_point("t", "d", 1, text, &[]).chunk;
        chunk.kind = kind;
        chunk
    }

    #[test]
    fn being_last_is_part_of_the_layout_and_only_a_first_last_chunk_is_the_whole_document() {
        let mut chunk = chunk(DocKind::Prose, "One passage.");
        let before = chunk.layout();
        assert!(!chunk.is_whole_document());
        chunk.last = true;
        assert_ne!(
            chunk.layout(),
            before,
            "a chunk that became last is rewritten"
        );
        assert!(chunk.is_whole_document());
        chunk.order_index = 1;
        assert!(!chunk.is_whole_document());
    }

    #[test]
    fn evidence_units_are_sentences_or_lines_with_words() {
        let prose = chunk(
            DocKind::Prose,
            "The ferry leaves at noon. Tickets cost 5 EUR!\n\nThe ferry leaves at noon. 42.",
        );
        // The repeated sentence is kept once; "42." holds no word.
        assert_eq!(
            prose.evidence_units(),
            vec!["The ferry leaves at noon.", "Tickets cost 5 EUR!"]
        );
        let code = chunk(
            DocKind::Code,
            "def is_iterable(value):\n    \"\"\"Whether value can be iterated.\"\"\"\n    try:\n        iter(value)\n    except TypeError:\n        return False\n    return True\n}",
        );
        assert_eq!(
            code.evidence_units(),
            vec![
                "def is_iterable(value):",
                "\"\"\"Whether value can be iterated.\"\"\"",
                "try:",
                "iter(value)",
                "except TypeError:",
                "return False",
                "return True",
            ]
        );
        // One unit: the chunk's own vector is that sentence's.
        assert!(chunk(DocKind::Prose, "Only one sentence here.")
            .evidence_units()
            .is_empty());
        let long: String = (0..50)
            .map(|i| format!("Sentence number {i} is here. "))
            .collect();
        let long = chunk(DocKind::Prose, &long);
        let units = long.evidence_units();
        assert_eq!(units.len(), MAX_EVIDENCE_UNITS);
        assert_eq!(units[0], "Sentence number 0 is here.");
    }

    #[test]
    fn evidence_spans_point_at_the_units_in_the_embedding_input() {
        let mut titled = chunk(
            DocKind::Prose,
            "Ferries leave at noon. Tickets cost 5 EUR! Ferries leave at noon.",
        );
        titled.doc_title = "Timetable".into();
        titled.section_path = vec!["Harbour".into(), "Summer".into()];
        let input = titled.embedding_input();
        assert!(
            input.starts_with("Timetable\nHarbour > Summer\n"),
            "{input}"
        );
        for units in [EvidenceUnits::Alone, EvidenceUnits::Pooled] {
            let spans = units.spans_in_input(&titled, &input);
            let in_input: Vec<&str> = spans.iter().map(|r| &input[r.clone()]).collect();
            assert_eq!(in_input, titled.evidence_units());
            assert_eq!(
                in_input,
                vec!["Ferries leave at noon.", "Tickets cost 5 EUR!"]
            );
        }
        assert!(EvidenceUnits::Off.spans(&titled).is_empty());
        // Code keeps its lines as units embedded alone, and none pooled.
        let code = chunk(
            DocKind::Code,
            "fn a() {\n    let x = ready();\n    x.go()\n}",
        );
        assert_eq!(EvidenceUnits::Alone.spans(&code).len(), 3);
        assert!(EvidenceUnits::Pooled.spans(&code).is_empty());
    }

    #[test]
    fn embedding_input_leaves_out_opaque_and_repeated_path_elements() {
        let mut function = chunk(
            DocKind::Code,
            "@cached\ndef write_boolean(self, n):\n    self.stream.write(n)",
        );
        function.doc_title = String::new();
        function.section_path = vec!["4711.py".into(), "write_boolean".into()];
        // The file name says nothing, the name is in the signature: the text alone.
        assert_eq!(function.embedding_input(), function.text);
        function.section_path = vec!["stream_writer.py".into(), "write_boolean".into()];
        assert_eq!(
            function.embedding_input(),
            format!("stream_writer.py\n{}", function.text)
        );
        // A later piece of the function does not open with its signature: the name is context.
        let mut piece = function.clone();
        piece.text = "    if n:\n        self.flush()\n    return n".into();
        assert_eq!(
            piece.embedding_input(),
            format!("stream_writer.py > write_boolean\n{}", piece.text)
        );
        // Doc comments and attributes above the signature do not count as lines of the opening.
        let mut documented = function.clone();
        documented.text = "/// Writes a boolean.\n/// Flushes first.\n///\n#[inline]\npub fn write_boolean(n: bool) {\n    write(n);\n}".into();
        documented.section_path = vec!["writer.rs".into(), "write_boolean".into()];
        assert_eq!(
            documented.embedding_input(),
            format!("writer.rs\n{}", documented.text)
        );
        // A name inside a longer identifier is not a repeat.
        piece.text = "    write_boolean_flag(n)\n".into();
        assert!(piece
            .embedding_input()
            .starts_with("stream_writer.py > write_boolean\n"));
        // Markdown: the innermost heading opens the chunk, the outer one is context.
        let mut section = chunk(DocKind::Markdown, "## Install\n\nRun the script.");
        section.doc_title = "Guide".into();
        section.section_path = vec!["Setup".into(), "Install".into()];
        assert_eq!(
            section.embedding_input(),
            "Guide\nSetup\n## Install\n\nRun the script."
        );
    }

    #[test]
    fn doc_key_parses_first_slash_only() {
        let key = DocKey::parse("acme/docs/guide.md").expect("valid key");
        assert_eq!(key.tenant, "acme");
        assert_eq!(key.doc_id, "docs/guide.md");
        assert_eq!(key.to_string(), "acme/docs/guide.md");
        assert!(DocKey::parse("no-slash").is_none());
        assert!(DocKey::parse("/doc").is_none());
        assert!(DocKey::parse("tenant/").is_none());
    }

    #[test]
    fn point_ids_are_deterministic_and_distinct() {
        let key = DocKey::new("t", "d");
        assert_eq!(point_id(&key, "h", 0), point_id(&key, "h", 0));
        assert_ne!(point_id(&key, "h", 0), point_id(&key, "h", 1));
        assert_ne!(point_id(&key, "h", 0), point_id(&key, "g", 0));
        assert_ne!(
            point_id(&key, "h", 0),
            point_id(&DocKey::new("t2", "d"), "h", 0)
        );
    }
}
