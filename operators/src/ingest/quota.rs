//! Quota: what each tenant holds in this process's index, and the documents that would take it past
//! its quotas.
//!
//! Every document's chunks and text bytes are counted per tenant ([`Usage`], one per process, shared
//! by its workers), seeded from the index at start and kept as documents are chunked and deleted. A
//! chunked document that would take its tenant past `ingest.quotas` (documents, chunks, bytes), or
//! gives more chunks than `max_chunks_per_document`, is refused there: dead-lettered
//! `quota_exceeded` with its document as value, and the version the index holds stays. The HTTP API
//! checks the documents and bytes of a batch before taking it (403, or 413 for a document that could
//! never fit), so a caller is told at once; chunks are known only once a document is chunked.
//!
//! Counts are this process's: in a cluster each process holds the tenants' documents of its shards,
//! and a quota bounds each process's share.

use std::collections::HashMap;
use std::sync::Mutex;

use super::dlq::{DlqReason, DlqRecord, Origin};
use crate::model::{ChunkSet, DocKey};

/// The names of the quotas, as refusals and metrics name them.
pub const LIMITS: [&str; 4] = ["documents", "chunks", "bytes", "chunks_per_document"];

/// A tenant's limits; 0: none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Quotas {
    /// Documents of one tenant.
    pub max_documents: u64,
    /// Chunks of one tenant.
    pub max_chunks: u64,
    /// Text bytes of one tenant's documents (as chunked: a file's extracted text).
    pub max_bytes: u64,
    /// Chunks of one document.
    pub max_chunks_per_document: u64,
}

impl Quotas {
    /// The first of the documents, chunks and bytes quotas a tenant holding `documents`, `chunks`
    /// and `bytes` would pass (chunks and bytes each with what the document alone brings, for
    /// [`Refusal::never_fits`]; chunks `None`: not known yet).
    fn passed(
        &self,
        documents: u64,
        chunks: Option<(u64, u64)>,
        bytes: (u64, u64),
    ) -> Option<Refusal> {
        let over = |limit, (would_be, alone): (u64, u64), quota: u64| {
            (quota > 0 && would_be > quota).then_some(Refusal {
                limit,
                would_be,
                quota,
                never_fits: alone > quota,
            })
        };
        over("documents", (documents, 0), self.max_documents)
            .or_else(|| chunks.and_then(|chunks| over("chunks", chunks, self.max_chunks)))
            .or_else(|| over("bytes", bytes, self.max_bytes))
    }
}

/// What a tenant holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Held {
    /// Documents.
    pub documents: u64,
    /// Chunks.
    pub chunks: u64,
    /// Text bytes.
    pub bytes: u64,
}

/// Which quota a document would pass, and by how much.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `documents`, `chunks`, `bytes` or `chunks_per_document`.
    pub limit: &'static str,
    /// What the document makes it.
    pub would_be: u64,
    /// The quota.
    pub quota: u64,
    /// Whether no state of the tenant lets the document in (it alone passes the quota).
    pub never_fits: bool,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.limit {
            "chunks_per_document" => write!(
                f,
                "the document gives {} chunks; one document may give at most {} (ingest.quotas.max_chunks_per_document)",
                self.would_be, self.quota
            ),
            limit => write!(
                f,
                "the tenant would hold {} {limit}; its quota is {} (ingest.quotas.max_{limit})",
                self.would_be, self.quota
            ),
        }
    }
}

/// Each document's chunks and bytes, and each tenant's totals.
#[derive(Debug, Default)]
pub struct Usage {
    quotas: Quotas,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    documents: HashMap<DocKey, (u64, u64)>,
    tenants: HashMap<String, Held>,
}

impl Usage {
    /// No document yet, under `quotas`.
    pub fn new(quotas: Quotas) -> Self {
        Self {
            quotas,
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The quotas.
    pub fn quotas(&self) -> Quotas {
        self.quotas
    }

    /// A document the index holds at start: `chunks` chunks over `bytes` of text.
    pub fn seed(&self, key: &DocKey, chunks: u64, bytes: u64) {
        self.lock().set(key, Some((chunks, bytes)));
    }

    /// What `tenant` holds.
    pub fn held(&self, tenant: &str) -> Held {
        self.lock().tenants.get(tenant).copied().unwrap_or_default()
    }

    /// Whether `key`'s new text of `bytes` (its chunks not known yet; `None`: a delete) keeps its
    /// tenant within the documents and bytes quotas, as the HTTP API checks a batch: each of
    /// `documents` in turn, the earlier ones counted.
    pub fn check_batch(&self, documents: &[(DocKey, Option<u64>)]) -> Result<(), (usize, Refusal)> {
        let state = self.lock();
        let mut changed: HashMap<&DocKey, Option<(u64, u64)>> = HashMap::new();
        let mut tenants: HashMap<&str, Held> = HashMap::new();
        for (index, (key, bytes)) in documents.iter().enumerate() {
            let before = match changed.get(key) {
                Some(now) => *now,
                None => state.documents.get(key).copied(),
            };
            let held = tenants
                .entry(key.tenant.as_str())
                .or_insert_with(|| state.tenants.get(&key.tenant).copied().unwrap_or_default());
            let old = before.unwrap_or((0, 0));
            let (documents, bytes_after) = match bytes {
                Some(bytes) => (
                    held.documents + u64::from(before.is_none()),
                    held.bytes.saturating_sub(old.1).saturating_add(*bytes),
                ),
                None => (
                    held.documents.saturating_sub(u64::from(before.is_some())),
                    held.bytes.saturating_sub(old.1),
                ),
            };
            if let Some(new) = bytes {
                if let Some(refusal) = self.quotas.passed(documents, None, (bytes_after, *new)) {
                    return Err((index, refusal));
                }
            }
            held.documents = documents;
            held.bytes = bytes_after;
            changed.insert(key, bytes.map(|b| (old.0, b)));
        }
        Ok(())
    }

    /// Admits a chunked document (`set`: its chunks; `None`: a delete) and counts it, or refuses it
    /// (nothing counted: its tenant keeps what the index holds).
    pub fn admit(&self, key: &DocKey, set: Option<&ChunkSet>) -> Result<(), Refusal> {
        let mut state = self.lock();
        let Some(set) = set else {
            state.set(key, None);
            return Ok(());
        };
        let chunks = set.chunks.len() as u64;
        let bytes = set.document.as_ref().map_or(0, |d| d.text.len() as u64);
        let quotas = self.quotas;
        if quotas.max_chunks_per_document > 0 && chunks > quotas.max_chunks_per_document {
            return Err(Refusal {
                limit: "chunks_per_document",
                would_be: chunks,
                quota: quotas.max_chunks_per_document,
                never_fits: true,
            });
        }
        let before = state.documents.get(key).copied();
        let old = before.unwrap_or((0, 0));
        let held = state.tenants.get(&key.tenant).copied().unwrap_or_default();
        let documents = held.documents + u64::from(before.is_none());
        let total_chunks = held.chunks.saturating_sub(old.0).saturating_add(chunks);
        let total_bytes = held.bytes.saturating_sub(old.1).saturating_add(bytes);
        if let Some(refusal) = quotas.passed(
            documents,
            Some((total_chunks, chunks)),
            (total_bytes, bytes),
        ) {
            return Err(refusal);
        }
        state.set(key, Some((chunks, bytes)));
        Ok(())
    }
}

impl State {
    /// `key` now holds `now` (chunks, bytes), or nothing.
    fn set(&mut self, key: &DocKey, now: Option<(u64, u64)>) {
        let before = match now {
            Some(now) => self.documents.insert(key.clone(), now),
            None => self.documents.remove(key),
        };
        if before.is_none() && now.is_none() {
            return;
        }
        let held = self.tenants.entry(key.tenant.clone()).or_default();
        let (old, new) = (before.unwrap_or((0, 0)), now.unwrap_or((0, 0)));
        held.documents =
            (held.documents + u64::from(now.is_some())).saturating_sub(u64::from(before.is_some()));
        held.chunks = held.chunks.saturating_sub(old.0).saturating_add(new.0);
        held.bytes = held.bytes.saturating_sub(old.1).saturating_add(new.1);
        if held.documents == 0 {
            self.tenants.remove(&key.tenant);
        }
        crate::metrics::metrics().tenant_held(&key.tenant, self.tenants.get(&key.tenant));
    }
}

/// The DLQ record of a document refused for `refusal`, its document as value.
pub fn refused_record(key: &DocKey, set: &ChunkSet, refusal: &Refusal) -> DlqRecord {
    crate::metrics::metrics()
        .quota_refusals
        .with_label_values(&[refusal.limit])
        .inc();
    DlqRecord::new(
        DlqReason::QuotaExceeded,
        refusal.to_string(),
        Origin::File {
            path: key.to_string(),
            line: None,
        },
        Some(key.tenant.clone()),
        Some(key.to_string().as_bytes()),
        set.document
            .as_deref()
            .map(crate::ingest::decode::encode_event)
            .as_deref(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn set(tenant: &str, id: &str, chunks: usize, bytes: usize) -> (DocKey, ChunkSet) {
        let document = ragstream_core::testing::prose(tenant, id, &"x".repeat(bytes));
        let one = crate::ingest::chunk::Chunker::new(Default::default())
            .chunk(&ragstream_core::testing::prose(tenant, id, "One sentence."));
        (
            document.key.clone(),
            ChunkSet {
                version: 1,
                chunks: std::iter::repeat_n(one[0].clone(), chunks).collect(),
                document: Some(Arc::new(document)),
            },
        )
    }

    #[test]
    fn a_tenant_is_held_to_its_quotas_and_a_refusal_changes_nothing() {
        let usage = Usage::new(Quotas {
            max_documents: 2,
            max_chunks: 9,
            max_bytes: 1000,
            max_chunks_per_document: 6,
        });
        let held = |documents, chunks, bytes| Held {
            documents,
            chunks,
            bytes,
        };
        let (a, a_set) = set("t", "a", 4, 300);
        usage.admit(&a, Some(&a_set)).expect("within every quota");
        let (b, b_set) = set("t", "b", 7, 300);
        let refused = usage.admit(&b, Some(&b_set)).unwrap_err();
        assert_eq!(
            (refused.limit, refused.would_be, refused.never_fits),
            ("chunks_per_document", 7, true)
        );
        let (b, b_set) = set("t", "b", 6, 300);
        let refused = usage.admit(&b, Some(&b_set)).unwrap_err();
        assert_eq!(
            (refused.limit, refused.would_be, refused.never_fits),
            ("chunks", 10, false)
        );
        assert_eq!(usage.held("t"), held(1, 4, 300), "refusals count nothing");
        let (b, b_set) = set("t", "b", 5, 600);
        usage.admit(&b, Some(&b_set)).expect("9 chunks, 900 bytes");
        let (c, c_set) = set("t", "c", 1, 10);
        assert_eq!(
            usage.admit(&c, Some(&c_set)).unwrap_err().limit,
            "documents"
        );
        // Another tenant has quotas of its own.
        let (other, other_set) = set("u", "c", 1, 10);
        usage
            .admit(&other, Some(&other_set))
            .expect("another tenant");
        // A new version replaces its document's counts; a delete frees them.
        let (a2, a2_set) = set("t", "a", 2, 500);
        assert_eq!(usage.admit(&a2, Some(&a2_set)).unwrap_err().limit, "bytes");
        let (a2, a2_set) = set("t", "a", 2, 100);
        usage.admit(&a2, Some(&a2_set)).expect("smaller");
        assert_eq!(usage.held("t"), held(2, 7, 700));
        usage.admit(&a, None).expect("a delete always goes");
        assert_eq!(usage.held("t"), held(1, 5, 600));
        usage.admit(&c, Some(&c_set)).expect("room again");
        // The HTTP API's check of a batch: documents and bytes, the earlier ones counted.
        let batch = [
            (DocKey::new("t", "d"), Some(10)),
            (DocKey::new("t", "e"), Some(10)),
        ];
        let (index, refusal) = usage.check_batch(&batch).unwrap_err();
        assert_eq!((index, refusal.limit), (0, "documents"));
        let batch = [
            (DocKey::new("t", "b"), None),
            (DocKey::new("t", "d"), Some(2000)),
        ];
        let (index, refusal) = usage.check_batch(&batch).unwrap_err();
        assert_eq!(
            (index, refusal.limit, refusal.never_fits),
            (1, "bytes", true)
        );
        let batch = [
            (DocKey::new("t", "b"), None),
            (DocKey::new("t", "d"), Some(100)),
        ];
        usage
            .check_batch(&batch)
            .expect("the delete makes room first");
        // No quotas: everything goes.
        let open = Usage::new(Quotas::default());
        let (big, big_set) = set("t", "big", 50, 5000);
        open.admit(&big, Some(&big_set)).expect("no quota");
    }
}
