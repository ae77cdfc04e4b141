//! Documents in over HTTP: `POST /v1/documents` (a batch of upserts and deletes) and
//! `DELETE /v1/documents/{doc_id}`. Each document is checked as the documents topic's decoder checks
//! it; a batch with any refusal is answered 400 with every refusal and nothing of it is written (the
//! caller holds the input, so nothing is lost). An accepted batch goes to the documents topic (Kafka
//! mode: answered 202 once the broker acknowledged every message) or straight into the local
//! source's ingest flow (local mode: answered 200 once the index acknowledged every document).

use ragstream_operators::ingest::decode::{
    decode_event, encode_event, DecodeConfig, DocumentEvent,
};
use ragstream_operators::ingest::extract;
use ragstream_operators::io::local_source::DocumentIngress;
use ragstream_operators::model::DocOp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::http::api::{DocumentError, Problem};

#[cfg(feature = "kafka")]
mod kafka;
#[cfg(feature = "kafka")]
pub use kafka::{KafkaDocuments, SendError};

/// Most documents of one request.
pub const MAX_BATCH: usize = 1000;

/// A body's documents as they stand in it (unparsed), at most [`MAX_BATCH`]: the parse stops at
/// the first one over, so a body of millions of tiny values is refused before it is a tree in memory.
struct Documents<'a>(Vec<&'a serde_json::value::RawValue>);

impl<'de: 'a, 'a> Deserialize<'de> for Documents<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Documents<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of document events")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut documents = Vec::new();
                while let Some(document) = seq.next_element::<&'de serde_json::value::RawValue>()? {
                    if documents.len() == MAX_BATCH {
                        return Err(serde::de::Error::custom(format!(
                            "a batch holds 1 to {MAX_BATCH} documents, not more"
                        )));
                    }
                    documents.push(document);
                }
                Ok(Documents(documents))
            }
        }
        deserializer.deserialize_seq(Visit(std::marker::PhantomData))
    }
}

/// A `POST /v1/documents` body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Body<'a> {
    #[serde(borrow)]
    documents: Documents<'a>,
}

/// The body of `POST /v1/documents`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DocumentsRequest {
    /// Document events, as on the documents topic (at most 1000). `tenant` may be left out where the
    /// token opens exactly one tenant.
    pub documents: Vec<DocumentEvent>,
}

/// The answer to an accepted batch.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct DocumentsAccepted {
    /// Documents accepted.
    pub accepted: usize,
    /// `true` (200, local mode): the index holds them; `false` (202): the documents topic holds them
    /// (Kafka mode), and the job indexes them as it reads the topic, or (local mode) they were not
    /// indexed within the request's `wait`: `status` tells when they are.
    pub indexed: bool,
    /// Local mode, not indexed within `wait`: the batch's status link (`GET /v1/batches/{id}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// Where accepted documents go.
pub enum DocumentsTarget {
    /// The documents topic (the `kafka` feature).
    #[cfg(feature = "kafka")]
    Kafka(std::sync::Arc<KafkaDocuments>),
    /// The local source; `owned_tenant` is the directory source's tenant, whose documents come only
    /// from its directory (a rescan would delete any other).
    Local {
        /// The local source's ingress.
        ingress: std::sync::Arc<DocumentIngress>,
        /// The directory source's tenant.
        owned_tenant: Option<String>,
        /// What each tenant holds, checked against its quotas before a batch is taken.
        usage: std::sync::Arc<ragstream_operators::ingest::quota::Usage>,
    },
    /// A job that reads a JSONL file once and stops takes no documents.
    None,
}

impl DocumentsTarget {
    /// `None` where the job takes no documents; else the tenant whose documents only the watched
    /// directory writes, if any.
    pub fn takes_documents(&self) -> Option<Option<&str>> {
        match self {
            #[cfg(feature = "kafka")]
            Self::Kafka(_) => Some(None),
            Self::Local { owned_tenant, .. } => Some(owned_tenant.as_deref()),
            Self::None => None,
        }
    }
}

/// A batch checked: each document's key (`tenant/doc_id`), its event as sent and what it does.
pub struct Admitted {
    /// (key, value) per document, in order.
    pub events: Vec<(String, Vec<u8>)>,
    /// What each does, as the ingest flow takes it.
    pub ops: Vec<DocOp>,
}

fn refuse(name: &str, detail: impl Into<String>) -> Box<Problem> {
    Box::new(Problem::new(name, detail))
}

/// Checks a `POST /v1/documents` body: its shape, each document's tenant against what the token
/// opens (`tenants`: `None` for every tenant; a tenant left out is filled in where the token opens
/// exactly one), the directory source's tenant, and each document as the decoder checks it.
pub fn admit(
    body: &[u8],
    tenants: Option<&std::collections::BTreeSet<String>>,
    owned_tenant: Option<&str>,
    decode: &DecodeConfig,
) -> Result<Admitted, Box<Problem>> {
    let documents = match serde_json::from_slice::<Body>(body) {
        Ok(body) => body.documents.0,
        Err(error) if error.is_data() => {
            return Err(refuse(
                "bad_request",
                format!(
                "the body must be {{\"documents\": [document events]}} and nothing else: {error}"
            ),
            ))
        }
        Err(error) => {
            return Err(refuse(
                "malformed_json",
                format!("the body is not JSON: {error}"),
            ))
        }
    };
    if documents.is_empty() {
        return Err(refuse(
            "bad_request",
            format!("a batch holds 1 to {MAX_BATCH} documents, not 0"),
        ));
    }
    let only = tenants
        .filter(|t| t.len() == 1)
        .and_then(|t| t.iter().next());
    let mut events = Vec::with_capacity(documents.len());
    let mut ops = Vec::with_capacity(documents.len());
    let mut errors = Vec::new();
    for (index, raw) in documents.iter().enumerate() {
        // A document over the decoder's limit is refused before it is parsed.
        if raw.get().len() > decode.max_document_bytes {
            errors.push(DocumentError {
                index,
                reason: "oversize".into(),
                detail: format!(
                    "event of {} bytes exceeds the limit of {} bytes",
                    raw.get().len(),
                    decode.max_document_bytes
                ),
            });
            continue;
        }
        let mut document: Value = match serde_json::from_str(raw.get()) {
            Ok(document) => document,
            Err(error) => {
                errors.push(DocumentError {
                    index,
                    reason: "malformed_json".into(),
                    detail: format!("document {index} is not JSON: {error}"),
                });
                continue;
            }
        };
        if let (Value::Object(object), Some(only)) = (&mut document, only) {
            object
                .entry("tenant")
                .or_insert_with(|| Value::String(only.clone()));
        }
        let tenant = document.get("tenant").and_then(Value::as_str).unwrap_or("");
        if let Some(tenants) = tenants {
            if !tenants.contains(tenant) {
                return Err(refuse(
                    "forbidden",
                    format!("document {index}: this token may not write the tenant {tenant:?}"),
                ));
            }
        }
        if owned_tenant == Some(tenant) {
            return Err(refuse(
                "tenant_owned",
                format!(
                    "document {index}: the documents of tenant {tenant:?} come from the watched \
                     directory (source.path); post to another tenant"
                ),
            ));
        }
        let bytes = serde_json::to_vec(&document).unwrap_or_default();
        match decode_event(None, Some(&bytes), decode) {
            Ok(op) => {
                let key = op.key().to_string();
                // A file goes on as its extracted text: the broker carries text, and the job's
                // workers do not read the file again.
                let bytes = match &op {
                    DocOp::Upsert(doc) if extract::is_file_kind(doc.kind) => encode_event(doc),
                    _ => bytes,
                };
                ops.push(op);
                events.push((key, bytes));
            }
            Err(error) => errors.push(DocumentError {
                index,
                reason: error.reason.as_str().to_string(),
                detail: error.message,
            }),
        }
    }
    if let Some(first) = errors.first() {
        let mut problem = Problem::new(
            &first.reason,
            format!(
                "{} of {} documents refused; nothing was written. Document {}: {}",
                errors.len(),
                documents.len(),
                first.index,
                first.detail
            ),
        );
        problem.errors = errors;
        return Err(Box::new(problem));
    }
    Ok(Admitted { events, ops })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenants(names: &[&str]) -> std::collections::BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_batch_is_checked_whole_and_the_tenant_comes_from_the_token() {
        let decode = DecodeConfig::default();
        let body = br#"{"documents": [
            {"doc_id": "a", "version": 1, "text": "alpha"},
            {"op": "delete", "doc_id": "b"}]}"#;
        let acme = tenants(&["acme"]);
        let admitted = admit(body, Some(&acme), None, &decode).expect("admitted");
        assert_eq!(admitted.events[0].0, "acme/a");
        assert_eq!(admitted.events[1].0, "acme/b");
        assert!(matches!(admitted.ops[1], DocOp::Delete { .. }));
        // The every-tenant token names the tenant.
        let refused = admit(body, None, None, &decode).map(|_| ()).unwrap_err();
        assert_eq!(refused.kind, "urn:ragstream:problem:missing_field");
        assert_eq!(refused.errors.len(), 2, "{refused:?}");
        // Another tenant, the directory's own tenant, a bad document among good ones.
        let globex =
            br#"{"documents": [{"tenant": "globex", "doc_id": "a", "version": 1, "text": "x"}]}"#;
        assert_eq!(
            admit(globex, Some(&acme), None, &decode)
                .map(|_| ())
                .unwrap_err()
                .status,
            403
        );
        assert_eq!(
            admit(body, Some(&acme), Some("acme"), &decode)
                .map(|_| ())
                .unwrap_err()
                .status,
            409
        );
        let mixed = br#"{"documents": [{"tenant": "t", "doc_id": "a", "version": 1, "text": "x"},
            {"tenant": "t", "doc_id": "b", "version": 1, "text": "y", "kind": "poetry"}]}"#;
        let refused = admit(mixed, None, None, &decode).map(|_| ()).unwrap_err();
        assert_eq!(refused.kind, "urn:ragstream:problem:unknown_kind");
        assert_eq!((refused.errors.len(), refused.errors[0].index), (1, 1));
        for (bad, kind) in [
            (&b"[1]"[..], "bad_request"),
            (b"{\"documents\": []}", "bad_request"),
            (b"{\"documents\": [], \"x\": 1}", "bad_request"),
            (b"{\"documents\": {}}", "bad_request"),
            (b"nope", "malformed_json"),
            (b"{\"documents\": [", "malformed_json"),
        ] {
            let refused = admit(bad, None, None, &decode).map(|_| ()).unwrap_err();
            assert_eq!(
                refused.kind,
                format!("urn:ragstream:problem:{kind}"),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // Millions of tiny values: refused at the first document over the cap, never parsed whole.
        let flood = format!("{{\"documents\": [{}0]}}", "0,".repeat(4_000_000));
        let refused = admit(flood.as_bytes(), None, None, &decode)
            .map(|_| ())
            .unwrap_err();
        assert_eq!(refused.kind, "urn:ragstream:problem:bad_request");
        assert!(refused.detail.contains("1 to 1000"), "{}", refused.detail);
        // A document over the decoder's limit is refused as oversize before it is parsed; the
        // others are still checked.
        let small = DecodeConfig {
            max_document_bytes: 200,
            ..DecodeConfig::default()
        };
        let big = format!(
            r#"{{"documents": [{{"tenant": "t", "doc_id": "a", "version": 1, "text": "{}"}},
            {{"tenant": "t", "doc_id": "b", "version": 1, "text": "y", "kind": "poetry"}}]}}"#,
            "x".repeat(300)
        );
        let refused = admit(big.as_bytes(), None, None, &small)
            .map(|_| ())
            .unwrap_err();
        let reasons: Vec<(usize, &str)> = refused
            .errors
            .iter()
            .map(|e| (e.index, e.reason.as_str()))
            .collect();
        assert_eq!(reasons, vec![(0, "oversize"), (1, "unknown_kind")]);
    }
}
