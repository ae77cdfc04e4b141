//! Fault injection for the fault suite (`tests/faults/`), off unless its environment variables are set.
//!
//! - `RAGSTREAM_FAILPOINT=<name>:<n>`: the `n`-th time the job passes fail point `<name>`, it logs
//!   `fail point <name> reached` and kills itself with SIGKILL (no destructor, flush or commit runs).
//!   Names: [`AFTER_CONSUME`], [`AFTER_EMBED`], [`AFTER_INDEX_DELETE`], [`AFTER_INDEX_WRITE`],
//!   [`AFTER_OFFSET_STORE`].
//! - `RAGSTREAM_FAULT_INDEX_DOWN=<path>`: while the file `<path>` exists, every index write (upsert,
//!   delete, flush) fails with [`StoreError::Unavailable`], as an unreachable index would
//!   ([`FaultyStore`], wrapped around each shard by the runtime).
//!
//! Both are read once at start; a fail point not named costs one relaxed atomic load.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crate::store::{
    Hit, PointWrite, SearchFilter, SearchVector, StoreError, StoredChunk, VectorStore,
};

/// A batch was polled from Kafka and handed to the dataflow (nothing of it written yet).
pub const AFTER_CONSUME: &str = "after_consume";
/// A batch of chunks was embedded (not yet written).
pub const AFTER_EMBED: &str = "after_embed";
/// A write batch's deletes were applied, its upserts not yet (a shrink half done).
pub const AFTER_INDEX_DELETE: &str = "after_index_delete";
/// A write batch is durable in the index; its offsets are not stored yet.
pub const AFTER_INDEX_WRITE: &str = "after_index_write";
/// Offsets of acknowledged batches were stored (committed within a second by the consumer).
pub const AFTER_OFFSET_STORE: &str = "after_offset_store";

/// Environment variable arming a fail point.
pub const FAILPOINT_ENV: &str = "RAGSTREAM_FAILPOINT";
/// Environment variable naming the file whose presence makes index writes fail.
pub const INDEX_DOWN_ENV: &str = "RAGSTREAM_FAULT_INDEX_DOWN";

struct Armed {
    name: String,
    at: usize,
    hits: AtomicUsize,
}

fn armed() -> Option<&'static Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let value = std::env::var(FAILPOINT_ENV).ok()?;
            let (name, at) = value.split_once(':').unwrap_or((&value, "1"));
            let at = at.parse().unwrap_or(1).max(1);
            tracing::warn!(fail_point = name, at, "fault injection armed");
            Some(Armed {
                name: name.to_string(),
                at,
                hits: AtomicUsize::new(0),
            })
        })
        .as_ref()
}

/// Passes fail point `name`: kills the process if it is the armed one and this is its `n`-th hit.
pub fn fail_point(name: &str) {
    let Some(armed) = armed() else {
        return;
    };
    if armed.name != name || armed.hits.fetch_add(1, Ordering::SeqCst) + 1 != armed.at {
        return;
    }
    tracing::error!(fail_point = name, "fail point {name} reached: SIGKILL");
    let pid = std::process::id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid])
        .status();
    // The signal is on its way; never go on past the fail point.
    loop {
        std::thread::park();
    }
}

/// Wraps `store` in a [`FaultyStore`] when [`INDEX_DOWN_ENV`] is set.
pub fn maybe_faulty(store: Arc<dyn VectorStore>) -> Arc<dyn VectorStore> {
    match std::env::var_os(INDEX_DOWN_ENV) {
        Some(path) => Arc::new(FaultyStore {
            inner: store,
            down: PathBuf::from(path),
        }),
        None => store,
    }
}

/// A store whose writes fail as unavailable while the file `down` exists; reads pass through.
pub struct FaultyStore {
    inner: Arc<dyn VectorStore>,
    down: PathBuf,
}

impl FaultyStore {
    fn check(&self) -> Result<(), StoreError> {
        if self.down.exists() {
            Err(StoreError::Unavailable(
                "injected fault: index down".to_string(),
            ))
        } else {
            Ok(())
        }
    }
}

impl VectorStore for FaultyStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn check_embedder(&self, embedder_version: &str, dimension: usize) -> Result<(), StoreError> {
        self.inner.check_embedder(embedder_version, dimension)
    }
    fn upsert(&self, points: &[PointWrite]) -> Result<(), StoreError> {
        self.check()?;
        self.inner.upsert(points)
    }
    fn delete(&self, ids: &[uuid::Uuid]) -> Result<(), StoreError> {
        self.check()?;
        self.inner.delete(ids)
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.check()?;
        self.inner.flush()
    }
    fn scroll(
        &self,
        filter: &SearchFilter,
        visit: &mut dyn FnMut(StoredChunk),
    ) -> Result<(), StoreError> {
        self.inner.scroll(filter, visit)
    }
    fn count(&self, filter: &SearchFilter) -> Result<usize, StoreError> {
        self.inner.count(filter)
    }
    fn search(
        &self,
        vector: &SearchVector,
        filter: &SearchFilter,
        limit: usize,
        score_threshold: Option<f32>,
    ) -> Result<Vec<Hit>, StoreError> {
        self.inner.search(vector, filter, limit, score_threshold)
    }
    fn get(&self, ids: &[uuid::Uuid]) -> Result<Vec<StoredChunk>, StoreError> {
        self.inner.get(ids)
    }
    fn dense_vectors(&self, ids: &[uuid::Uuid]) -> Result<Vec<(uuid::Uuid, Vec<f32>)>, StoreError> {
        self.inner.dense_vectors(ids)
    }
    fn optimize(&self) -> Result<(), StoreError> {
        self.check()?;
        self.inner.optimize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::edge::EdgeStore;

    #[test]
    fn faulty_store_fails_writes_only_while_the_file_exists() {
        let dir = tempfile::tempdir().expect("tempdir");
        let inner: Arc<dyn VectorStore> =
            Arc::new(EdgeStore::open(&dir.path().join("shard"), 4).expect("open"));
        let down = dir.path().join("down");
        let store = FaultyStore {
            inner,
            down: down.clone(),
        };
        std::fs::write(&down, "").expect("down");
        assert!(matches!(store.delete(&[]), Err(StoreError::Unavailable(_))));
        assert!(matches!(store.flush(), Err(StoreError::Unavailable(_))));
        assert_eq!(
            store.count(&SearchFilter::default()).expect("reads pass"),
            0
        );
        std::fs::remove_file(&down).expect("up");
        store.delete(&[]).expect("writes pass again");
        store.flush().expect("flush passes again");
    }
}
