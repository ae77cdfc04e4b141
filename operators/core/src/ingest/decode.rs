//! Decode: raw document events (Kafka key + value bytes) into [`DocOp`]s, or a [`DecodeError`] for the DLQ.
//!
//! Wire format (JSON, key = `tenant/doc_id`):
//! `{"op": "upsert"|"delete", "tenant", "doc_id", "version", "source", "kind", "title"?, "text" | "content_base64", "extracted"?, "acl"?, "updated_at"?, "metadata"?}`
//! (`updated_at`: when the document last changed, milliseconds since the Unix epoch).
//! A message with a key and no value (a Kafka tombstone) is a delete of that key.
//!
//! Guarantees: decoding never panics and never allocates more than the size limit for a payload it
//! refuses; every refusal names a [`DlqReason`] (a bounded set, used as a metric label) and a message.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::ingest::extract::{self, FileReader};
use crate::metadata::Metadata;
use crate::model::{DocKey, DocKind, DocOp, Document};

/// Limits and checks applied to every event.
#[derive(Debug, Clone)]
pub struct DecodeConfig {
    /// Largest accepted event value in bytes; larger ones go to the DLQ unparsed.
    pub max_document_bytes: usize,
    /// When non-empty, events of any other tenant are refused.
    pub allowed_tenants: Vec<String>,
    /// Who reads the files of `html`, `pdf` and `docx` events (the job: its sandbox).
    pub files: Arc<dyn FileReader>,
}

impl Default for DecodeConfig {
    fn default() -> Self {
        Self {
            max_document_bytes: DEFAULT_MAX_DOCUMENT_BYTES,
            allowed_tenants: Vec::new(),
            files: Arc::new(extract::InProcess),
        }
    }
}

/// Longest `tenant`, in bytes.
pub const MAX_TENANT_BYTES: usize = 128;
/// Longest `doc_id` (and message key), in bytes.
pub const MAX_DOC_ID_BYTES: usize = 1024;
/// Longest `source`, in bytes; every path prefix of it is stored with each chunk.
pub const MAX_SOURCE_BYTES: usize = 1024;
/// Most `/`-separated components of a `source` (the path prefixes stored per chunk).
pub const MAX_SOURCE_COMPONENTS: usize = 32;
/// Longest `title`, in bytes.
pub const MAX_TITLE_BYTES: usize = 1024;
/// Most ACL labels of a document, and the longest label in bytes.
pub const MAX_ACL_LABELS: usize = 64;
/// Longest ACL label, in bytes.
pub const MAX_ACL_LABEL_BYTES: usize = 256;

/// Default size limit of one document event: 8 MiB.
pub const DEFAULT_MAX_DOCUMENT_BYTES: usize = 8 << 20;

pub use super::dlq::DlqReason;

/// A refused event: the reason and a human-readable message (never the document text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", reason.as_str())]
pub struct DecodeError {
    /// The bounded reason.
    pub reason: DlqReason,
    /// What exactly was wrong.
    pub message: String,
}

impl DecodeError {
    fn new(reason: DlqReason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

/// What a document event does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum EventOp {
    /// Insert or replace the document (the default when `op` is absent).
    #[default]
    Upsert,
    /// Remove the document and every chunk of it.
    Delete,
}

/// A document event: the documents topic's value (key `tenant/doc_id`), a line of a JSONL source
/// and an item of `POST /v1/documents`. [`decode_event`] checks it (bounds, the key, the kind) and
/// names what is wrong; [`encode_event`] writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(
    feature = "schema",
    schemars(extend(
        "if" = {"properties": {"op": {"const": "delete"}}, "required": ["op"]},
        "else" = {"required": ["version"], "anyOf": [{"required": ["text"]}, {"required": ["content_base64"]}]}
    ))
)]
pub struct DocumentEvent {
    /// `upsert` (the default) or `delete`.
    #[serde(default)]
    pub op: EventOp,
    /// The tenant (no `/`, at most 128 bytes).
    pub tenant: String,
    /// The document's id within its tenant (at most 1024 bytes).
    pub doc_id: String,
    /// The document's version: an upsert or delete older than the version indexed is ignored.
    /// Required for an upsert.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    /// Where the document comes from (a path or URL; `/`-separated, at most 1024 bytes); the
    /// `doc_id` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// How to read and chunk it; `auto` (the default) decides from the source's extension and the
    /// content (`html`, `pdf` and `docx` files are recognised by either).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<DocKind>,
    /// Its title (at most 1024 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Its text (an HTML page's source for `html`). An upsert carries `text` or `content_base64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The file's bytes, base64 (standard alphabet, padded): a PDF, a DOCX, an HTML page, or text
    /// in UTF-8. Instead of `text`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_base64: Option<String>,
    /// `text` is already in extracted form (`kind` `html`, `docx`: markdown lines; `pdf`: pages
    /// separated by form feeds): what the DLQ writes for an extracted document, or the text of a
    /// file extracted elsewhere.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub extracted: bool,
    /// ACL labels: a query sees the document's chunks only when it shares one (none: public).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acl: Vec<String>,
    /// When the document last changed, in milliseconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<u64>,
    /// Metadata stored with every chunk, filtered on by queries ([`crate::metadata`]).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    #[cfg_attr(
        feature = "schema",
        schemars(schema_with = "crate::metadata::schema::metadata_object")
    )]
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

impl DocumentEvent {
    /// The upsert event of `doc`.
    pub fn upsert(doc: &Document) -> Self {
        Self {
            op: EventOp::Upsert,
            tenant: doc.key.tenant.clone(),
            doc_id: doc.key.doc_id.clone(),
            version: Some(doc.version),
            source: Some(doc.source.clone()),
            kind: Some(doc.kind),
            title: doc.title.clone(),
            text: Some(doc.text.clone()),
            content_base64: None,
            extracted: crate::ingest::extract::is_file_kind(doc.kind),
            acl: doc.acl.clone(),
            updated_at: (doc.updated_ms != 0).then_some(doc.updated_ms),
            metadata: doc.metadata.to_object(),
        }
    }
}

/// The JSON body as sent; validated into a [`DocOp`].
#[derive(Deserialize)]
struct WireEvent {
    op: Option<String>,
    tenant: Option<String>,
    doc_id: Option<String>,
    version: Option<u64>,
    source: Option<String>,
    kind: Option<String>,
    title: Option<String>,
    text: Option<String>,
    content_base64: Option<String>,
    #[serde(default)]
    extracted: bool,
    #[serde(default)]
    acl: Vec<String>,
    updated_at: Option<u64>,
    #[serde(default)]
    metadata: serde_json::Value,
}

/// Decodes one event. `key` is the message key (may be absent), `value` the payload (`None` = tombstone).
/// A file's event is extracted by `config.files` before this returns: callers on a dataflow worker
/// use [`decode_deferred`] and extract off the worker.
pub fn decode_event(
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    config: &DecodeConfig,
) -> Result<DocOp, DecodeError> {
    match decode_deferred(key, value, config)? {
        Decoded::Ready(op) => Ok(op),
        Decoded::File(file) => file.extract(config),
    }
}

/// A decoded event: ready, or the upsert of a file still to extract ([`PendingFile::extract`]).
#[derive(Debug)]
pub enum Decoded {
    /// The event's operation.
    Ready(DocOp),
    /// An upsert whose body is a file (HTML, PDF, DOCX): every other field checked.
    File(PendingFile),
}

/// The upsert of a file whose text is not extracted yet.
#[derive(Debug)]
pub struct PendingFile {
    /// The document, its text empty and its kind the file's format.
    document: Document,
    /// The file's bytes.
    bytes: Vec<u8>,
}

impl PendingFile {
    /// The document's key.
    pub fn key(&self) -> &DocKey {
        &self.document.key
    }

    /// The file's size in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Extracts the file with `config.files` (blocking for as long as its limits allow): the upsert,
    /// or the refusal (`unparseable`, naming why).
    pub fn extract(self, config: &DecodeConfig) -> Result<DocOp, DecodeError> {
        let Self {
            mut document,
            bytes,
        } = self;
        let limits = extract::ExtractLimits::for_documents(config.max_document_bytes);
        let file = config
            .files
            .read(document.kind, &bytes, &limits)
            .map_err(|err| DecodeError::new(DlqReason::Unparseable, err.to_string()))?;
        document.text = file.text;
        if document.title.is_none() {
            document.title = file.title;
        }
        Ok(DocOp::Upsert(document))
    }
}

/// [`decode_event`] without the extraction of a file: every check but reading the file's text, in
/// time linear in the event's size.
pub fn decode_deferred(
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    config: &DecodeConfig,
) -> Result<Decoded, DecodeError> {
    let key = match key {
        None => None,
        Some(bytes) => {
            let text = std::str::from_utf8(bytes)
                .map_err(|_| DecodeError::new(DlqReason::BadKey, "message key is not UTF-8"))?;
            Some(DocKey::parse(text).ok_or_else(|| {
                DecodeError::new(
                    DlqReason::BadKey,
                    format!("message key {:?} is not tenant/doc_id", prefix(text)),
                )
            })?)
        }
    };
    let Some(value) = value else {
        let key =
            key.ok_or_else(|| DecodeError::new(DlqReason::BadKey, "tombstone without a key"))?;
        check_tenant(&key.tenant, config)?;
        check_bounds(&key.tenant, &key.doc_id, None, None, &[])?;
        return Ok(Decoded::Ready(DocOp::Delete { key, version: None }));
    };
    if value.len() > config.max_document_bytes {
        return Err(DecodeError::new(
            DlqReason::Oversize,
            format!(
                "event of {} bytes exceeds the limit of {} bytes",
                value.len(),
                config.max_document_bytes
            ),
        ));
    }
    let text = std::str::from_utf8(value).map_err(|err| {
        DecodeError::new(
            DlqReason::InvalidUtf8,
            format!("invalid UTF-8 at byte {}", err.valid_up_to()),
        )
    })?;
    let mut wire: WireEvent = serde_json::from_str(text).map_err(|err| {
        DecodeError::new(DlqReason::MalformedJson, format!("malformed JSON: {err}"))
    })?;
    let tenant = required(wire.tenant.take(), "tenant")?;
    let doc_id = required(wire.doc_id.take(), "doc_id")?;
    check_bounds(
        &tenant,
        &doc_id,
        wire.source.as_deref(),
        wire.title.as_deref(),
        &wire.acl,
    )?;
    if tenant.contains('/') {
        return Err(DecodeError::new(
            DlqReason::BadKey,
            "tenant must not contain '/'",
        ));
    }
    let body_key = DocKey::new(tenant, doc_id);
    if let Some(key) = &key {
        if *key != body_key {
            return Err(DecodeError::new(
                DlqReason::BadKey,
                format!(
                    "message key {} disagrees with body {}",
                    prefix(&key.to_string()),
                    prefix(&body_key.to_string())
                ),
            ));
        }
    }
    check_tenant(&body_key.tenant, config)?;
    let op = wire.op.take().unwrap_or_else(|| "upsert".into());
    match op.as_str() {
        "delete" => Ok(Decoded::Ready(DocOp::Delete {
            key: body_key,
            version: wire.version,
        })),
        "upsert" => upsert(wire, body_key),
        other => Err(DecodeError::new(
            DlqReason::UnknownOp,
            format!("unknown op {:?}", prefix(other)),
        )),
    }
}

/// The document of an upsert event whose key checked out.
fn upsert(wire: WireEvent, body_key: DocKey) -> Result<Decoded, DecodeError> {
    let version = wire
        .version
        .ok_or_else(|| DecodeError::new(DlqReason::MissingField, "missing field `version`"))?;
    let kind_name = wire.kind.as_deref().unwrap_or("auto");
    let kind = DocKind::parse(kind_name).ok_or_else(|| {
        DecodeError::new(
            DlqReason::UnknownKind,
            format!("unknown kind {:?}", prefix(kind_name)),
        )
    })?;
    let metadata = Metadata::parse(&wire.metadata)
        .map_err(|message| DecodeError::new(DlqReason::InvalidMetadata, message))?;
    let source = wire
        .source
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| body_key.doc_id.clone());
    let body = body(wire.text, wire.content_base64)?;
    let (kind, text, file) = match read_body(kind, &source, body, wire.extracted)? {
        Read::Text(kind, text) => (kind, text, None),
        Read::File(format, bytes) => (format, String::new(), Some(bytes)),
    };
    let document = Document {
        key: body_key,
        version,
        source,
        kind,
        title: wire.title,
        text,
        acl: wire.acl,
        updated_ms: wire.updated_at.unwrap_or(0),
        metadata,
    };
    Ok(match file {
        Some(bytes) => Decoded::File(PendingFile { document, bytes }),
        None => Decoded::Ready(DocOp::Upsert(document)),
    })
}

/// An upsert's body once read: text to index as it is, or a file of a format to extract.
enum Read {
    Text(DocKind, String),
    File(DocKind, Vec<u8>),
}

/// What an upsert carries: text, or a file's bytes.
enum Body {
    Text(String),
    Bytes(Vec<u8>),
}

fn body(text: Option<String>, content_base64: Option<String>) -> Result<Body, DecodeError> {
    match (text, content_base64) {
        (Some(_), Some(_)) => Err(DecodeError::new(
            DlqReason::MalformedJson,
            "an upsert carries `text` or `content_base64`, not both",
        )),
        (Some(text), None) => Ok(Body::Text(text)),
        (None, Some(encoded)) => {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .map(Body::Bytes)
                .map_err(|err| {
                    DecodeError::new(
                        DlqReason::MalformedJson,
                        format!("`content_base64` is not base64: {err}"),
                    )
                })
        }
        (None, None) => Err(DecodeError::new(
            DlqReason::MissingField,
            "missing field `text` (or `content_base64`)",
        )),
    }
}

/// The kind and text of an upsert: a file format (`html`, `pdf`, `docx`, named or recognised by
/// [`extract::detect`] when `auto`) is a file to extract, other text is taken as it is.
fn read_body(
    kind: DocKind,
    source: &str,
    body: Body,
    extracted: bool,
) -> Result<Read, DecodeError> {
    if extracted {
        let Body::Text(text) = body else {
            return Err(DecodeError::new(
                DlqReason::MalformedJson,
                "`extracted` needs `text`, not `content_base64`",
            ));
        };
        if !extract::is_file_kind(kind) {
            return Err(DecodeError::new(
                DlqReason::UnknownKind,
                format!(
                    "`extracted` text needs kind html, pdf or docx, not {}",
                    kind.as_str()
                ),
            ));
        }
        return Ok(Read::Text(kind, text));
    }
    let bytes = match &body {
        Body::Text(text) => text.as_bytes(),
        Body::Bytes(bytes) => bytes.as_slice(),
    };
    let format = match kind {
        kind if extract::is_file_kind(kind) => Some(kind),
        DocKind::Auto => extract::detect(source, bytes),
        _ => None,
    };
    if let Some(format) = format {
        let bytes = match body {
            Body::Text(text) => text.into_bytes(),
            Body::Bytes(bytes) => bytes,
        };
        return Ok(Read::File(format, bytes));
    }
    let text = match body {
        Body::Text(text) => text,
        Body::Bytes(bytes) => String::from_utf8(bytes).map_err(|err| {
            DecodeError::new(
                DlqReason::Unparseable,
                format!(
                    "`content_base64` is neither HTML, PDF, DOCX nor UTF-8 text (invalid UTF-8 at byte {})",
                    err.utf8_error().valid_up_to()
                ),
            )
        })?,
    };
    Ok(Read::Text(kind, text))
}

/// The upsert event of `doc` in the documents topic's format: what [`decode_event`] turns back into
/// the same document (the DLQ value of a document refused after decoding, replayable as it is).
/// `updated_at` is left out when unknown (0).
pub fn encode_event(doc: &Document) -> Vec<u8> {
    serde_json::to_vec(&DocumentEvent::upsert(doc)).unwrap_or_default()
}

/// The identifying fields of a document within their bounds ([`MAX_DOC_ID_BYTES`] and the other
/// `MAX_` constants); beyond, the document is refused as oversize. Every source checks them.
pub fn check_bounds(
    tenant: &str,
    doc_id: &str,
    source: Option<&str>,
    title: Option<&str>,
    acl: &[String],
) -> Result<(), DecodeError> {
    let over = |field: &str, length: usize, limit: usize| {
        DecodeError::new(
            DlqReason::Oversize,
            format!("{field} of {length} bytes exceeds the limit of {limit} bytes"),
        )
    };
    for (field, value, limit) in [
        ("tenant", Some(tenant), MAX_TENANT_BYTES),
        ("doc_id", Some(doc_id), MAX_DOC_ID_BYTES),
        ("source", source, MAX_SOURCE_BYTES),
        ("title", title, MAX_TITLE_BYTES),
    ] {
        if let Some(value) = value.filter(|v| v.len() > limit) {
            return Err(over(field, value.len(), limit));
        }
    }
    if let Some(source) = source {
        let components = source.split('/').filter(|c| !c.is_empty()).count();
        if components > MAX_SOURCE_COMPONENTS {
            return Err(DecodeError::new(
                DlqReason::Oversize,
                format!("source has {components} path components, over the limit of {MAX_SOURCE_COMPONENTS}"),
            ));
        }
    }
    if acl.len() > MAX_ACL_LABELS {
        return Err(DecodeError::new(
            DlqReason::Oversize,
            format!(
                "{} ACL labels exceed the limit of {MAX_ACL_LABELS}",
                acl.len()
            ),
        ));
    }
    if let Some(label) = acl.iter().find(|l| l.len() > MAX_ACL_LABEL_BYTES) {
        return Err(over("an ACL label", label.len(), MAX_ACL_LABEL_BYTES));
    }
    Ok(())
}

fn required(field: Option<String>, name: &str) -> Result<String, DecodeError> {
    match field {
        Some(value) if !value.is_empty() => Ok(value),
        _ => Err(DecodeError::new(
            DlqReason::MissingField,
            format!("missing field `{name}`"),
        )),
    }
}

fn check_tenant(tenant: &str, config: &DecodeConfig) -> Result<(), DecodeError> {
    if config.allowed_tenants.is_empty() || config.allowed_tenants.iter().any(|t| t == tenant) {
        Ok(())
    } else {
        Err(DecodeError::new(
            DlqReason::UnknownTenant,
            format!("tenant {:?} is not allowed", prefix(tenant)),
        ))
    }
}

/// At most 64 bytes of user input in an error message: the DLQ never echoes a document.
fn prefix(text: &str) -> &str {
    let end = text.floor_char_boundary(64);
    &text[..end]
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_encoded_event_decodes_to_the_same_document() {
        let key = DocKey::new("acme", "runbooks/deploy.md");
        for (title, acl, updated_ms, kind) in [
            (None, vec![], 0, DocKind::Prose),
            (
                Some("Deploy \"safely\"".to_string()),
                vec!["ops".to_string(), "sre".to_string()],
                1_700_000_000_000,
                DocKind::Markdown,
            ),
        ] {
            let doc = Document {
                key: key.clone(),
                version: 7,
                source: "runbooks/deploy.md".into(),
                kind,
                title,
                text: "# Deploy\nRun `deployctl` — then check.\n".into(),
                acl,
                updated_ms,
                metadata: Default::default(),
            };
            let event = encode_event(&doc);
            let decoded = decode_event(
                Some(key.to_string().as_bytes()),
                Some(&event),
                &DecodeConfig::default(),
            );
            assert_eq!(decoded, Ok(DocOp::Upsert(doc)));
        }
    }

    use super::*;

    fn decode(key: Option<&str>, value: Option<&str>) -> Result<DocOp, DecodeError> {
        decode_event(
            key.map(str::as_bytes),
            value.map(str::as_bytes),
            &DecodeConfig::default(),
        )
    }

    #[cfg(feature = "formats")]
    fn upsert_of(doc: &DocOp) -> &Document {
        match doc {
            DocOp::Upsert(doc) => doc,
            other => panic!("not an upsert: {other:?}"),
        }
    }

    #[test]
    #[cfg(feature = "formats")]
    fn files_in_base64_are_extracted_and_replay_from_the_dlq_as_extracted_text() {
        use base64::Engine as _;
        let encode = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        let pdf = crate::testing::pdf_file(&["Page one text.", "Page two text."]);
        // Recognised by content: the source names no extension.
        let event = format!(
            r#"{{"tenant":"t","doc_id":"upload-1","version":3,"content_base64":"{}"}}"#,
            encode(&pdf)
        );
        let op = decode(None, Some(&event)).expect("pdf");
        let doc = upsert_of(&op);
        assert_eq!(doc.kind, DocKind::Pdf);
        assert_eq!(doc.text, "Page one text.\n\x0cPage two text.\n");
        // The DLQ writes the extracted form; it decodes to the same document without the file.
        let replayed =
            decode_event(None, Some(&encode_event(doc)), &DecodeConfig::default()).expect("replay");
        assert_eq!(upsert_of(&replayed), doc);
        assert!(String::from_utf8(encode_event(doc))
            .unwrap()
            .contains(r#""extracted":true"#));

        let html = r#"{"tenant":"t","doc_id":"site/a.html","version":1,"text":"<html><title>Ferries</title><h1>Boats</h1><p>Noon.</p>"}"#;
        let op = decode(None, Some(html)).expect("html");
        let doc = upsert_of(&op);
        assert_eq!(
            (doc.kind, doc.text.as_str(), doc.title.as_deref()),
            (DocKind::Html, "# Boats\n\nNoon.\n", Some("Ferries"))
        );
        // A title the event gives wins over the file's own.
        let titled = html.replace(r#""version":1,"#, r#""version":1,"title":"Given","#);
        assert_eq!(
            upsert_of(&decode(None, Some(&titled)).unwrap())
                .title
                .as_deref(),
            Some("Given")
        );
        // Text in base64 is text; a kind named explicitly is not second-guessed.
        let text = format!(
            r#"{{"tenant":"t","doc_id":"n.md","version":1,"content_base64":"{}"}}"#,
            encode("# Notes\n\nplain".as_bytes())
        );
        assert_eq!(
            upsert_of(&decode(None, Some(&text)).unwrap()).text,
            "# Notes\n\nplain"
        );
        let raw =
            r#"{"tenant":"t","doc_id":"a.html","version":1,"kind":"prose","text":"<p>kept</p>"}"#;
        assert_eq!(
            upsert_of(&decode(None, Some(raw)).unwrap()).text,
            "<p>kept</p>"
        );
    }

    #[test]
    fn files_that_cannot_be_read_are_refused_as_unparseable_with_the_reason() {
        use base64::Engine as _;
        let encode = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
        let cases = [
            (
                format!(
                    r#"{{"tenant":"t","doc_id":"r.pdf","version":1,"content_base64":"{}"}}"#,
                    encode(b"%PDF-1.7 broken")
                ),
                DlqReason::Unparseable,
                "pdf file cannot be read",
            ),
            (
                format!(
                    r#"{{"tenant":"t","doc_id":"blob","version":1,"content_base64":"{}"}}"#,
                    encode(&[0xff, 0xfe, 0x00, 0x81])
                ),
                DlqReason::Unparseable,
                "neither HTML, PDF, DOCX nor UTF-8 text",
            ),
            (
                r#"{"tenant":"t","doc_id":"d","version":1,"content_base64":"not base64!"}"#.into(),
                DlqReason::MalformedJson,
                "not base64",
            ),
            (
                r#"{"tenant":"t","doc_id":"d","version":1,"text":"x","content_base64":"eA=="}"#
                    .into(),
                DlqReason::MalformedJson,
                "not both",
            ),
            (
                r#"{"tenant":"t","doc_id":"d","version":1,"text":"x","extracted":true}"#.into(),
                DlqReason::UnknownKind,
                "needs kind html, pdf or docx",
            ),
            (
                r#"{"tenant":"t","doc_id":"d.html","version":1,"text":"<nav>only</nav>"}"#.into(),
                DlqReason::Unparseable,
                // A build without the readers says which feature reads the file.
                if cfg!(feature = "formats") {
                    "holds no text"
                } else {
                    "build it with the `formats` feature"
                },
            ),
        ];
        for (event, reason, message) in cases {
            let err = decode(None, Some(&event)).expect_err(&event);
            assert_eq!(err.reason, reason, "{event}: {err}");
            assert!(err.message.contains(message), "{event}: {err}");
        }
    }

    #[test]
    fn decodes_upsert_with_defaults() {
        let op = decode(
            Some("t/d1"),
            Some(r#"{"tenant":"t","doc_id":"d1","version":3,"text":"hi","acl":["eng"]}"#),
        )
        .expect("valid upsert");
        let DocOp::Upsert(doc) = op else {
            panic!("expected upsert")
        };
        assert_eq!(doc.key, DocKey::new("t", "d1"));
        assert_eq!(doc.version, 3);
        assert_eq!(doc.kind, DocKind::Auto);
        assert_eq!(doc.source, "d1");
        assert_eq!(doc.acl, vec!["eng".to_string()]);
        assert!(doc.metadata.is_empty());
    }

    #[test]
    fn metadata_is_kept_in_canonical_form_and_survives_encoding() {
        let op = decode(
            None,
            Some(r#"{"tenant":"t","doc_id":"d","version":1,"text":"x","metadata":{"year":2024,"team":"a"}}"#),
        )
        .expect("valid upsert");
        let DocOp::Upsert(doc) = op else {
            panic!("expected upsert")
        };
        assert_eq!(doc.metadata.as_str(), r#"{"team":"a","year":2024}"#);
        let again = decode_event(None, Some(&encode_event(&doc)), &DecodeConfig::default());
        assert_eq!(again, Ok(DocOp::Upsert(doc)));
    }

    #[test]
    fn tombstone_is_delete_without_version() {
        let op = decode(Some("t/d1"), None).expect("tombstone");
        assert_eq!(
            op,
            DocOp::Delete {
                key: DocKey::new("t", "d1"),
                version: None
            }
        );
        assert_eq!(decode(None, None).unwrap_err().reason, DlqReason::BadKey);
        // A tombstone's key is held to the limits an upsert's is.
        let long = format!("t/{}", "d".repeat(MAX_DOC_ID_BYTES + 1));
        assert_eq!(
            decode(Some(&long), None).unwrap_err().reason,
            DlqReason::Oversize
        );
    }

    #[test]
    fn explicit_delete_carries_version() {
        let op = decode(
            None,
            Some(r#"{"op":"delete","tenant":"t","doc_id":"d","version":9}"#),
        )
        .expect("delete");
        assert_eq!(
            op,
            DocOp::Delete {
                key: DocKey::new("t", "d"),
                version: Some(9)
            }
        );
    }

    #[test]
    fn refusals_name_their_reason() {
        type Case<'a> = (Option<&'a [u8]>, &'a [u8], DlqReason);
        let cases: [Case; 10] = [
            (None, b"{not json", DlqReason::MalformedJson),
            (
                None,
                br#"{"tenant":"t","doc_id":"d","version":1,"text":"x","metadata":{"a":{"b":1}}}"#,
                DlqReason::InvalidMetadata,
            ),
            (
                None,
                br#"{"tenant":"t","doc_id":"d","version":1,"text":"x","metadata":"team=a"}"#,
                DlqReason::InvalidMetadata,
            ),
            (None, b"\xff\xfe{}", DlqReason::InvalidUtf8),
            (
                None,
                br#"{"tenant":"t","version":1,"text":"x"}"#,
                DlqReason::MissingField,
            ),
            (
                None,
                br#"{"tenant":"t","doc_id":"d","text":"x"}"#,
                DlqReason::MissingField,
            ),
            (
                None,
                br#"{"tenant":"t","doc_id":"d","version":1,"text":"x","kind":"spreadsheet"}"#,
                DlqReason::UnknownKind,
            ),
            (
                None,
                br#"{"op":"merge","tenant":"t","doc_id":"d","version":1}"#,
                DlqReason::UnknownOp,
            ),
            (
                Some(b"t/other"),
                br#"{"tenant":"t","doc_id":"d","version":1,"text":"x"}"#,
                DlqReason::BadKey,
            ),
            (None, b"[1,2,3]", DlqReason::MalformedJson),
        ];
        for (key, value, reason) in cases {
            let err =
                decode_event(key, Some(value), &DecodeConfig::default()).expect_err("must refuse");
            assert_eq!(err.reason, reason, "{err}");
        }
    }

    #[test]
    fn identifying_fields_are_bounded() {
        let event = |field: &str, value: serde_json::Value| {
            let mut event = serde_json::json!({
                "tenant": "t", "doc_id": "d", "version": 1, "source": "a.md", "text": "x"
            });
            event[field] = value;
            decode(None, Some(&event.to_string()))
        };
        for (field, limit) in [
            ("tenant", MAX_TENANT_BYTES),
            ("doc_id", MAX_DOC_ID_BYTES),
            ("source", MAX_SOURCE_BYTES),
            ("title", MAX_TITLE_BYTES),
        ] {
            assert!(
                event(field, "a".repeat(limit).into()).is_ok(),
                "{field} at its limit"
            );
            let refused = event(field, "a".repeat(limit + 1).into()).unwrap_err();
            assert_eq!(refused.reason, DlqReason::Oversize, "{field}");
            assert!(refused.message.starts_with(field), "{}", refused.message);
        }
        let deep = "a/".repeat(MAX_SOURCE_COMPONENTS + 1);
        assert_eq!(
            event("source", deep.into()).unwrap_err().reason,
            DlqReason::Oversize
        );
        let labels: Vec<String> = (0..=MAX_ACL_LABELS).map(|i| i.to_string()).collect();
        assert_eq!(
            event("acl", labels.into()).unwrap_err().reason,
            DlqReason::Oversize
        );
        let long = vec!["l".repeat(MAX_ACL_LABEL_BYTES + 1)];
        assert_eq!(
            event("acl", long.into()).unwrap_err().reason,
            DlqReason::Oversize
        );
    }

    #[test]
    fn oversize_is_refused_before_parsing() {
        let config = DecodeConfig {
            max_document_bytes: 16,
            ..DecodeConfig::default()
        };
        let err = decode_event(None, Some(&[b'{'; 17]), &config).expect_err("too big");
        assert_eq!(err.reason, DlqReason::Oversize);
    }

    #[test]
    fn tenant_allow_list() {
        let config = DecodeConfig {
            allowed_tenants: vec!["a".into()],
            ..DecodeConfig::default()
        };
        let ok = decode_event(
            None,
            Some(br#"{"tenant":"a","doc_id":"d","version":1,"text":"x"}"#),
            &config,
        );
        assert!(ok.is_ok());
        let err = decode_event(
            None,
            Some(br#"{"tenant":"b","doc_id":"d","version":1,"text":"x"}"#),
            &config,
        );
        assert_eq!(err.unwrap_err().reason, DlqReason::UnknownTenant);
    }

    #[test]
    fn messages_never_echo_long_input() {
        let long_kind = "k".repeat(10_000);
        let body =
            format!(r#"{{"tenant":"t","doc_id":"d","version":1,"text":"x","kind":"{long_kind}"}}"#);
        let err = decode(None, Some(&body)).unwrap_err();
        assert!(err.message.len() < 100, "{}", err.message);
    }

    /// JSON-shaped events with random field values: the building blocks of a hostile producer.
    fn event_json() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let value = prop_oneof![
            Just("null".to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<f64>().prop_map(|f| format!("{f:?}")),
            "\\PC{0,40}".prop_map(|s| serde_json::to_string(&s).unwrap()),
            Just("[]".to_string()),
            Just("{}".to_string()),
            Just("[\"eng\", 1]".to_string()),
        ];
        let field = prop_oneof![
            Just("op"),
            Just("tenant"),
            Just("doc_id"),
            Just("version"),
            Just("source"),
            Just("kind"),
            Just("title"),
            Just("text"),
            Just("acl"),
            Just("metadata"),
            Just("x"),
        ];
        proptest::collection::vec((field, value), 0..10).prop_map(|pairs| {
            let body: Vec<String> = pairs.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            format!("{{{}}}", body.join(","))
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]

        /// Fuzz: arbitrary key and value bytes decode or refuse with a reason; never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(
            key in proptest::option::of(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)),
            value in proptest::option::of(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)),
        ) {
            if let Err(error) = decode_event(key.as_deref(), value.as_deref(), &DecodeConfig::default()) {
                proptest::prop_assert!(!error.message.is_empty());
            }
        }

        /// Fuzz: JSON events with random fields and values never panic.
        #[test]
        fn hostile_json_never_panics(
            key in "\\PC{0,20}(/\\PC{0,20})?",
            body in event_json(),
        ) {
            let _ = decode_event(Some(key.as_bytes()), Some(body.as_bytes()), &DecodeConfig::default());
        }
    }
}
