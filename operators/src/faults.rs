//! Fault injection for the fault suite (`tests/faults/`), off unless its environment variables are set.
//!
//! - `RAGSTREAM_FAILPOINT=<name>:<n>`: the `n`-th time the job passes fail point `<name>`, it logs
//!   `fail point <name> reached` and kills itself with SIGKILL (no destructor, flush or commit runs).
//!   Names: [`AFTER_CONSUME`], [`AFTER_EMBED`], [`AFTER_INDEX_DELETE`], [`AFTER_INDEX_WRITE`],
//!   [`AFTER_OFFSET_STORE`].
//! - `RAGSTREAM_FAULT_INDEX_DOWN=<path>`: while the file `<path>` exists, every index write (upsert,
//!   delete, flush) fails with [`StoreError::Unavailable`], as an unreachable index would
//!   ([`FaultyStore`], wrapped around each shard by the runtime).
//! - `RAGSTREAM_FAULT_INDEX_RULES=<path>`: the file `<path>`, read at every upsert, holds lines
//!   `refuse <doc_id>` (the index refuses that document's points: [`StoreError::Invalid`], as a point the
//!   engine will never take) and `unavailable <doc_id>` (its points fail with [`StoreError::Unavailable`]
//!   while the line is there).
//!
//! The variables are read once at start; a fail point not named costs one relaxed atomic load.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crate::store::{
    Hit, PointWrite, SearchFilter, SearchVector, StoreError, StoredChunk, StoredVectors,
    VectorStore,
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
/// Environment variable naming the file of per-document index write rules.
pub const INDEX_RULES_ENV: &str = "RAGSTREAM_FAULT_INDEX_RULES";

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

/// Wraps `store` in a [`FaultyStore`] when [`INDEX_DOWN_ENV`] or [`INDEX_RULES_ENV`] is set.
pub fn maybe_faulty(store: Arc<dyn VectorStore>) -> Arc<dyn VectorStore> {
    let down = std::env::var_os(INDEX_DOWN_ENV).map(PathBuf::from);
    let rules = std::env::var_os(INDEX_RULES_ENV).map(PathBuf::from);
    if down.is_none() && rules.is_none() {
        return store;
    }
    Arc::new(FaultyStore {
        inner: store,
        down,
        rules,
    })
}

/// A store whose writes fail as unavailable while the file `down` exists, and whose upserts follow
/// the per-document `rules` file; reads pass through.
pub struct FaultyStore {
    inner: Arc<dyn VectorStore>,
    down: Option<PathBuf>,
    rules: Option<PathBuf>,
}

impl FaultyStore {
    /// `inner` with every write failing as unavailable while the file `down` exists.
    pub fn with_down(inner: Arc<dyn VectorStore>, down: PathBuf) -> Self {
        Self {
            inner,
            down: Some(down),
            rules: None,
        }
    }

    /// `inner` with upserts following the per-document rules file at `rules` (see the module docs).
    pub fn with_rules(inner: Arc<dyn VectorStore>, rules: PathBuf) -> Self {
        Self {
            inner,
            down: None,
            rules: Some(rules),
        }
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.down.as_ref().is_some_and(|down| down.exists()) {
            Err(StoreError::Unavailable(
                "injected fault: index down".to_string(),
            ))
        } else {
            Ok(())
        }
    }

    fn check_points(&self, points: &[PointWrite]) -> Result<(), StoreError> {
        let Some(rules) = self
            .rules
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
        else {
            return Ok(());
        };
        for line in rules.lines() {
            let Some((rule, doc_id)) = line.trim().split_once(' ') else {
                continue;
            };
            if !points.iter().any(|p| p.key.doc_id == doc_id) {
                continue;
            }
            match rule {
                "refuse" => {
                    return Err(StoreError::Invalid(format!(
                        "injected fault: points of {doc_id} refused"
                    )))
                }
                "unavailable" => {
                    return Err(StoreError::Unavailable(format!(
                        "injected fault: points of {doc_id} unavailable"
                    )))
                }
                _ => {}
            }
        }
        Ok(())
    }
}

impl VectorStore for FaultyStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn check_embedder(&self, embedder_version: &str, dimension: usize) -> Result<(), StoreError> {
        self.inner.check_embedder(embedder_version, dimension)
    }
    fn engine_idf(&self) -> bool {
        self.inner.engine_idf()
    }
    fn index_metadata(
        &self,
        keys: &[(String, crate::metadata::MetaIndex)],
    ) -> Result<(), StoreError> {
        self.inner.index_metadata(keys)
    }
    fn upsert(&self, points: &[PointWrite]) -> Result<(), StoreError> {
        self.check()?;
        self.check_points(points)?;
        self.inner.upsert(points)
    }
    fn replace_current(&self, points: &[PointWrite]) -> Result<usize, StoreError> {
        self.check()?;
        self.check_points(points)?;
        self.inner.replace_current(points)
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
    fn vectors(&self, ids: &[uuid::Uuid]) -> Result<Vec<(uuid::Uuid, StoredVectors)>, StoreError> {
        self.inner.vectors(ids)
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
            down: Some(down.clone()),
            rules: None,
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
