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
    /// A request to the job's HTTP server (`POST /query`).
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

/// Largest original value kept in a DLQ record; longer values are cut (and marked truncated).
pub const MAX_DLQ_VALUE_BYTES: usize = 256 << 10;

/// A refused event on its way to the DLQ.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DlqRecord {
    /// Bounded reason (`malformed_json`, `oversize`, `embedding_dimension`, …).
    pub reason: String,
    /// What exactly was wrong (never more than a short prefix of the input).
    pub message: String,
    /// Where the event came from.
    pub origin: Origin,
    /// The tenant, if known.
    pub tenant: Option<String>,
    /// The original key.
    pub key: Option<Vec<u8>>,
    /// The original value, cut at [`MAX_DLQ_VALUE_BYTES`].
    pub value: Option<Vec<u8>>,
    /// Whether `value` was cut.
    pub truncated: bool,
}

impl DlqRecord {
    /// Builds a record, bounding the kept value.
    pub fn new(
        reason: &str,
        message: String,
        origin: Origin,
        tenant: Option<String>,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) -> Self {
        let truncated = value.is_some_and(|v| v.len() > MAX_DLQ_VALUE_BYTES);
        Self {
            reason: reason.to_string(),
            message,
            origin,
            tenant,
            key: key.map(<[u8]>::to_vec),
            value: value.map(|v| v[..v.len().min(MAX_DLQ_VALUE_BYTES)].to_vec()),
            truncated,
        }
    }
}
