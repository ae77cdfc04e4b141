//! Hydrate: what the index already holds, as the initial state of the ingest dataflow.
//!
//! On start every worker scrolls its shard (payload only, no vectors) and rebuilds, per document, the
//! chunk set and its version. The chunk sets enter the differential upsert at the hydration epoch, so
//! an update or delete of a document indexed before a restart retracts exactly the chunks the index
//! holds; the versions seed the [`VersionGuard`].

use std::collections::BTreeMap;

use super::guard::VersionGuard;
use crate::model::{ChunkSet, DocKey};
use crate::store::{SearchFilter, StoreError, VectorStore};

/// The index's contents, grouped by document.
#[derive(Debug, Default)]
pub struct Hydrated {
    /// Chunk sets by document (chunks ordered by `order_index`).
    pub chunk_sets: BTreeMap<DocKey, ChunkSet>,
}

impl Hydrated {
    /// A version guard seeded with every hydrated document's version.
    pub fn guard(&self) -> VersionGuard {
        let mut guard = VersionGuard::default();
        for (key, set) in &self.chunk_sets {
            guard.seed(key.clone(), set.version);
        }
        guard
    }

    /// Number of chunks.
    pub fn chunk_count(&self) -> usize {
        self.chunk_sets.values().map(|s| s.chunks.len()).sum()
    }
}

/// Reads every chunk of documents for which `owns` is true.
pub fn hydrate(
    store: &dyn VectorStore,
    owns: &dyn Fn(&DocKey) -> bool,
) -> Result<Hydrated, StoreError> {
    let mut hydrated = Hydrated::default();
    store.scroll(&SearchFilter::default(), &mut |stored| {
        if !owns(&stored.key) {
            return;
        }
        let set = hydrated
            .chunk_sets
            .entry(stored.key)
            .or_insert_with(|| ChunkSet {
                version: 0,
                chunks: Vec::new(),
            });
        set.version = set.version.max(stored.version);
        set.chunks.push(stored.chunk);
    })?;
    for set in hydrated.chunk_sets.values_mut() {
        set.chunks.sort_by_key(|c| c.order_index);
    }
    Ok(hydrated)
}
