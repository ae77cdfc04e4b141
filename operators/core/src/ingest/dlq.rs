//! Dead-letter records: bad input with its reason, origin and (bounded) original bytes.

use serde::{Deserialize, Serialize};

/// Where an event came from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Origin {
    /// A Kafka message.
    Kafka {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset.
        offset: i64,
    },
    /// A file of a directory or JSONL source (with the line for JSONL).
    File {
        /// Path.
        path: String,
        /// 1-based line, for JSONL sources.
        line: Option<u64>,
    },
    /// A request to the job's HTTP server (`POST /v1/query`).
    Http {
        /// The endpoint.
        endpoint: String,
    },
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Kafka {
                topic,
                partition,
                offset,
            } => write!(f, "{topic}/{partition}@{offset}"),
            Self::File {
                path,
                line: Some(line),
            } => write!(f, "{path}:{line}"),
            Self::File { path, line: None } => write!(f, "{path}"),
            Self::Http { endpoint } => write!(f, "http {endpoint}"),
        }
    }
}

/// Why a record went to the dead-letter queue: one closed set for documents, queries and the
/// index, so it can label metrics and name the HTTP API's problem types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DlqReason {
    /// The value is not UTF-8.
    InvalidUtf8,
    /// The value is not JSON, or not an object of the expected shape.
    MalformedJson,
    /// A required field is missing or empty.
    MissingField,
    /// `kind` is not one of the known kinds.
    UnknownKind,
    /// `op` is not `upsert` or `delete`.
    UnknownOp,
    /// The value is larger than the configured limit.
    Oversize,
    /// The message key is not `tenant/doc_id`, or disagrees with the body.
    BadKey,
    /// The tenant is not in the configured allow-list.
    UnknownTenant,
    /// `metadata` is not a flat object of bounded values ([`crate::metadata`]).
    InvalidMetadata,
    /// A file (HTML, PDF, DOCX, or `content_base64` of no known format) whose text cannot be read
    /// ([`crate::ingest::extract`]).
    Unparseable,
    /// A query: JSON, but not a valid query (missing or out-of-range fields).
    InvalidQuery,
    /// The embedder returned vectors of another dimension than the index's.
    EmbeddingDimension,
    /// The embedder refused a document's chunks.
    EmbeddingFailed,
    /// The index refused a document's points.
    IndexRefused,
    /// The document would take its tenant past a quota (`ingest.quotas`: documents, chunks, bytes),
    /// or gives more chunks than one document may.
    QuotaExceeded,
}

impl DlqReason {
    /// Snake-case name used in DLQ records and headers, metric labels and problem types.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidUtf8 => "invalid_utf8",
            Self::MalformedJson => "malformed_json",
            Self::MissingField => "missing_field",
            Self::UnknownKind => "unknown_kind",
            Self::UnknownOp => "unknown_op",
            Self::InvalidMetadata => "invalid_metadata",
            Self::Oversize => "oversize",
            Self::BadKey => "bad_key",
            Self::UnknownTenant => "unknown_tenant",
            Self::Unparseable => "unparseable",
            Self::InvalidQuery => "invalid_query",
            Self::EmbeddingDimension => "embedding_dimension",
            Self::EmbeddingFailed => "embedding_failed",
            Self::IndexRefused => "index_refused",
            Self::QuotaExceeded => "quota_exceeded",
        }
    }

    /// Every reason, for metric initialisation.
    pub const ALL: [DlqReason; 15] = [
        Self::InvalidUtf8,
        Self::MalformedJson,
        Self::MissingField,
        Self::UnknownKind,
        Self::UnknownOp,
        Self::Oversize,
        Self::BadKey,
        Self::UnknownTenant,
        Self::InvalidMetadata,
        Self::Unparseable,
        Self::InvalidQuery,
        Self::EmbeddingDimension,
        Self::EmbeddingFailed,
        Self::IndexRefused,
        Self::QuotaExceeded,
    ];
}

impl std::fmt::Display for DlqReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Largest original value kept in a DLQ record; longer values are cut (and marked truncated).
pub const MAX_DLQ_VALUE_BYTES: usize = 256 << 10;

/// Longest original key kept; longer keys are cut (and the record marked truncated), so a record
/// always fits a broker's message limit.
pub const MAX_DLQ_KEY_BYTES: usize = 4 << 10;

/// Longest tenant kept (a DLQ header): a refused event's tenant comes from its key or value
/// unchecked, so a megabyte one must not make the record too large to send.
pub const MAX_DLQ_TENANT_BYTES: usize = crate::ingest::decode::MAX_TENANT_BYTES;

/// Longest error message kept (and logged): parser errors can quote the input, and a document must
/// never reach the logs or the DLQ headers beyond a short prefix.
pub const MAX_DLQ_MESSAGE_CHARS: usize = 300;

/// `message` cut to [`MAX_DLQ_MESSAGE_CHARS`] characters, marked with `…` when cut.
pub fn bounded_message(message: String) -> String {
    match message.char_indices().nth(MAX_DLQ_MESSAGE_CHARS) {
        Some((cut, _)) => format!("{}…", &message[..cut]),
        None => message,
    }
}

/// A refused event on its way to the DLQ.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DlqRecord {
    /// Why.
    pub reason: DlqReason,
    /// What exactly was wrong (never more than a short prefix of the input).
    pub message: String,
    /// Where the event came from.
    pub origin: Origin,
    /// The tenant, if known.
    pub tenant: Option<String>,
    /// The original key, cut at [`MAX_DLQ_KEY_BYTES`].
    pub key: Option<Vec<u8>>,
    /// The original value, cut at [`MAX_DLQ_VALUE_BYTES`].
    pub value: Option<Vec<u8>>,
    /// Whether `value`, `key` or `tenant` was cut.
    pub truncated: bool,
}

impl DlqRecord {
    /// Builds a record, bounding the kept value.
    pub fn new(
        reason: DlqReason,
        message: String,
        origin: Origin,
        tenant: Option<String>,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) -> Self {
        let tenant_cut = tenant
            .as_ref()
            .is_some_and(|t| t.len() > MAX_DLQ_TENANT_BYTES);
        let truncated = value.is_some_and(|v| v.len() > MAX_DLQ_VALUE_BYTES)
            || key.is_some_and(|k| k.len() > MAX_DLQ_KEY_BYTES)
            || tenant_cut;
        Self {
            reason,
            message: bounded_message(message),
            origin,
            tenant: tenant.map(|mut tenant| {
                let end = tenant.floor_char_boundary(MAX_DLQ_TENANT_BYTES);
                tenant.truncate(end);
                tenant
            }),
            key: key.map(|k| k[..k.len().min(MAX_DLQ_KEY_BYTES)].to_vec()),
            value: value.map(|v| v[..v.len().min(MAX_DLQ_VALUE_BYTES)].to_vec()),
            truncated,
        }
    }
}

/// A DLQ record as the file DLQ (`dlq.path`) writes it: one JSON object per line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct DlqLine {
    /// Bounded reason (`malformed_json`, `oversize`, `embedding_failed`, …): the same names as the
    /// HTTP API's problem types.
    pub reason: String,
    /// What exactly was wrong (at most 300 characters; never more than a short prefix of the input).
    pub error: String,
    /// Where the event came from: `topic/partition@offset`, a path (`path:line` for JSONL) or
    /// `http <endpoint>`.
    pub origin: String,
    /// The tenant, if known.
    pub tenant: Option<String>,
    /// The original key (lossy UTF-8).
    pub key: Option<String>,
    /// The first 512 bytes of the original value (lossy UTF-8).
    pub value_prefix: Option<String>,
    /// Bytes of the original value kept (at most 256 KiB).
    pub value_bytes: Option<usize>,
    /// Whether the value or the key was cut.
    pub truncated: bool,
}

impl From<&DlqRecord> for DlqLine {
    fn from(record: &DlqRecord) -> Self {
        let lossy = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        Self {
            reason: record.reason.as_str().to_string(),
            error: record.message.clone(),
            origin: record.origin.to_string(),
            tenant: record.tenant.clone(),
            key: record.key.as_deref().map(lossy),
            value_prefix: record
                .value
                .as_deref()
                .map(|value| lossy(&value[..value.len().min(512)])),
            value_bytes: record.value.as_ref().map(Vec::len),
            truncated: record.truncated,
        }
    }
}

/// The headers of a record on the DLQ topic, as an object of header name → value (each header's
/// bytes are UTF-8). The record's key and value are the refused message's own (the value left out
/// when the broker refused it whole, then `truncated` says so).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct DlqHeaders {
    /// Bounded reason, as in [`DlqLine::reason`].
    pub reason: String,
    /// What exactly was wrong, as in [`DlqLine::error`].
    pub error: String,
    /// The refused message's topic (records of Kafka messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// Its partition, in decimal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(regex(pattern = r"^[0-9]+$")))]
    pub partition: Option<String>,
    /// Its offset, in decimal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(regex(pattern = r"^[0-9]+$")))]
    pub offset: Option<String>,
    /// Where other records came from (a file, `http <endpoint>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// The tenant, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// `true` when the value was cut or left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(regex(pattern = r"^true$")))]
    pub truncated: Option<String>,
}

/// A durable destination for DLQ records.
pub trait DlqSink: Send {
    /// Writes the records; they are durable when this returns `Ok`.
    fn write(&mut self, records: &[DlqRecord]) -> Result<(), DlqError>;
}

/// Why a DLQ write failed: an outage the job waits out, or a DLQ that can never take records as
/// configured.
#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    /// The DLQ is out for now (a broker away, a topic not created yet, a full disk, a file the job
    /// may not write yet): retried with backoff while the batch's offsets wait.
    #[error("DLQ unavailable: {0}")]
    Unavailable(String),
    /// The DLQ can never take records as configured (its path is a directory, under a file or on
    /// a read-only file system; its topic name is invalid): records have nowhere else to go, so
    /// the job stops, committing nothing, and its next start reads the batch again.
    #[error("the DLQ cannot take records: {0}")]
    Refused(String),
}

impl DlqError {
    /// Whether the failure is an outage, retried with backoff: only [`DlqError::Unavailable`].
    pub fn is_retryable(&self) -> bool {
        matches!(self, DlqError::Unavailable(_))
    }

    /// A file system error of a file DLQ: a path that cannot be a writable file as configured (a
    /// directory, a file where a directory must be, a read-only file system, a name the system
    /// refuses) is
    /// [`DlqError::Refused`]; anything else (a full disk, a permission an operator can grant) an
    /// outage.
    pub fn from_io(context: &str, error: &std::io::Error) -> Self {
        use std::io::ErrorKind;
        let message = format!("{context}: {error}");
        match error.kind() {
            ErrorKind::IsADirectory
            | ErrorKind::NotADirectory
            | ErrorKind::AlreadyExists
            | ErrorKind::ReadOnlyFilesystem
            | ErrorKind::InvalidFilename
            | ErrorKind::InvalidInput => DlqError::Refused(message),
            _ => DlqError::Unavailable(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_quoting_a_whole_document_is_cut_to_a_short_prefix() {
        let document = "secret body ".repeat(30_000);
        let error = serde_json::from_str::<u64>(&format!("\"{document}\"")).expect_err("a string");
        assert!(error.to_string().len() > 100_000, "serde quotes the input");
        let record = DlqRecord::new(
            DlqReason::MalformedJson,
            error.to_string(),
            Origin::File {
                path: "e.jsonl".into(),
                line: Some(1),
            },
            None,
            None,
            Some(document.as_bytes()),
        );
        assert_eq!(record.message.chars().count(), MAX_DLQ_MESSAGE_CHARS + 1);
        assert!(record.message.ends_with('…'));
        assert_eq!(bounded_message("short".into()), "short");
        assert!(
            record.truncated && record.value.as_ref().map_or(0, Vec::len) == MAX_DLQ_VALUE_BYTES
        );
    }

    #[test]
    fn a_megabyte_key_is_cut_so_the_record_fits_a_message() {
        let key = vec![b'k'; 1 << 20];
        let origin = Origin::File {
            path: "k".into(),
            line: None,
        };
        let record = DlqRecord::new(
            DlqReason::BadKey,
            "too long".into(),
            origin.clone(),
            None,
            Some(&key),
            Some(b"v"),
        );
        assert!(record.truncated);
        assert_eq!(record.key.as_ref().map(Vec::len), Some(MAX_DLQ_KEY_BYTES));
        let short = DlqRecord::new(
            DlqReason::BadKey,
            "x".into(),
            origin,
            None,
            Some(b"t/d"),
            Some(b"v"),
        );
        assert!(!short.truncated);
        // The tenant of a refused event is read from its key unchecked: a megabyte one (and one
        // whose cut falls inside a character) is cut too.
        let tenant = format!("é{}", "t".repeat(1 << 20));
        let record = DlqRecord::new(
            DlqReason::MissingField,
            "no text".into(),
            short.origin.clone(),
            Some(tenant.clone()),
            Some(b"t/d"),
            Some(b"{}"),
        );
        assert!(record.truncated);
        let kept = record.tenant.expect("kept");
        assert!(kept.len() <= MAX_DLQ_TENANT_BYTES && kept.len() >= MAX_DLQ_TENANT_BYTES - 3);
        assert!(tenant.starts_with(&kept));
    }
}
