//! Hydrate: what the index already holds, as the initial state of the ingest dataflow.
//!
//! On start every worker scrolls its shard (payload only, no vectors) and gathers, per document, the
//! stored chunks and their newest version. Their ids enter the differential upsert at the hydration epoch, so
//! an update or delete of a document indexed before a restart retracts exactly the chunks the index
//! holds; the versions seed the [`VersionGuard`].

use std::collections::BTreeMap;

use super::guard::VersionGuard;
use crate::model::{ChunkIds, DocKey};
use crate::store::stats::StatsDelta;
use crate::store::{Bm25Encoder, SearchFilter, StoreError, StoredChunk, VectorStore};

/// The index's contents, grouped by document.
#[derive(Debug, Default)]
pub struct Hydrated {
    /// Stored chunks by document (ordered by `order_index`).
    pub documents: BTreeMap<DocKey, Vec<StoredChunk>>,
}

impl Hydrated {
    /// A version guard seeded with every hydrated document's version.
    pub fn guard(&self) -> VersionGuard {
        let mut guard = VersionGuard::default();
        for (key, ids) in self.ids() {
            guard.seed(key, ids.version);
        }
        guard
    }

    /// Number of chunks.
    pub fn chunk_count(&self) -> usize {
        self.documents.values().map(Vec::len).sum()
    }

    /// What the differential upsert starts from, per document: the newest stored version and the
    /// stored point ids (as the index holds them, whatever id scheme wrote them) with their layouts.
    pub fn ids(&self) -> impl Iterator<Item = (DocKey, ChunkIds)> + '_ {
        self.documents.iter().map(|(key, stored)| {
            let mut ids: Vec<(uuid::Uuid, u64)> =
                stored.iter().map(|s| (s.id, s.chunk.layout())).collect();
            ids.sort_unstable();
            let version = stored.iter().map(|s| s.version).max().unwrap_or(0);
            (key.clone(), ChunkIds { version, ids })
        })
    }

    /// The BM25 statistics of the hydrated chunks ([`crate::store::stats`]), their vectors encoded
    /// from the stored text as the embed step encoded them.
    pub fn stats(&self) -> StatsDelta {
        let encoder = Bm25Encoder::default();
        let mut stats = StatsDelta::default();
        for (key, stored) in &self.documents {
            for chunk in stored {
                let sparse = encoder.encode_document(&chunk.chunk.embedding_input());
                stats.count(&key.tenant, &sparse, 1);
            }
        }
        stats
    }
}

/// Reads every chunk of documents for which `owns` is true.
pub fn hydrate(
    store: &dyn VectorStore,
    owns: &dyn Fn(&DocKey) -> bool,
) -> Result<Hydrated, StoreError> {
    let mut hydrated = Hydrated::default();
    store.scroll(&SearchFilter::default(), &mut |stored| {
        if owns(&stored.key) {
            hydrated
                .documents
                .entry(stored.key.clone())
                .or_default()
                .push(stored);
        }
    })?;
    for stored in hydrated.documents.values_mut() {
        stored.sort_by_key(|s| s.chunk.order_index);
    }
    Ok(hydrated)
}
