//! How far the index has acknowledged the documents topic: written by the document sources, read by
//! the query flow's read-your-writes wait and its cache.
//!
//! Two views, because a process consumes only some partitions: `offsets`, what this process's own
//! sources saw acknowledged, and `committed`, the documents group's committed offsets as read from the
//! broker (a consumer commits an offset only after the index acknowledged everything below it, in
//! whichever process consumed it). A cluster process or one of several instances on a shared server
//! collection learns of the others' writes through `committed`, refreshed while read-your-writes
//! queries wait and every [`COMMITTED_REFRESH`] for the cache.

use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the documents group's committed offsets are read from the broker while anything needs
/// them (a waiting read-your-writes query, or the cache of a Kafka job).
pub const COMMITTED_REFRESH: Duration = Duration::from_millis(250);

/// Ingest progress shared by the document sources and the query flow.
#[derive(Debug, Default)]
pub struct IngestProgress {
    /// Documents-topic partition → next offset not yet acknowledged by the index (this process's
    /// sources).
    pub offsets: Mutex<BTreeMap<i32, i64>>,
    /// Whether documents come from Kafka (read-your-writes then waits on offsets, else on the frontier).
    pub kafka: AtomicBool,
    /// Documents-topic partition → the documents group's committed offset, as last read.
    committed: Mutex<BTreeMap<i32, i64>>,
    /// When `committed` was last read (by any of the process's readers).
    refreshed: Mutex<Option<Instant>>,
    /// Read-your-writes queries waiting now.
    waiting: AtomicUsize,
}

impl IngestProgress {
    /// Whether every offset below `wanted` is acknowledged, by this process or by the group.
    pub fn covers(&self, wanted: &BTreeMap<i32, i64>) -> bool {
        let offsets = self.offsets.lock().expect("progress");
        let committed = self.committed.lock().expect("progress");
        wanted.iter().all(|(partition, high)| {
            *high <= 0
                || offsets.get(partition).is_some_and(|o| o >= high)
                || committed.get(partition).is_some_and(|o| o >= high)
        })
    }

    /// A copy of the acknowledged offsets.
    pub fn snapshot(&self) -> BTreeMap<i32, i64> {
        self.offsets.lock().expect("progress").clone()
    }

    /// Records the documents group's committed offsets read from the broker.
    pub fn set_committed(&self, offsets: BTreeMap<i32, i64>) {
        *self.committed.lock().expect("progress") = offsets;
    }

    /// Claims the next read of the committed offsets: true (and the time recorded) when the last
    /// one is at least [`COMMITTED_REFRESH`] old, so the process's readers share one read per period.
    pub fn claim_refresh(&self) -> bool {
        let mut refreshed = self.refreshed.lock().expect("progress");
        if refreshed.is_some_and(|at| at.elapsed() < COMMITTED_REFRESH) {
            return false;
        }
        *refreshed = Some(Instant::now());
        true
    }

    /// A read-your-writes query starts or stops waiting.
    pub fn waiting(&self, started: bool) {
        if started {
            self.waiting.fetch_add(1, Ordering::SeqCst);
        } else {
            let _ = self
                .waiting
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        }
    }

    /// Whether read-your-writes queries wait now.
    pub fn anyone_waiting(&self) -> bool {
        self.waiting.load(Ordering::SeqCst) > 0
    }

    /// The cache generation: `local` (this process's index writes) combined with the group's
    /// committed offsets, so that a write acknowledged in another process (seen once committed and
    /// read back) also makes cached contexts stale.
    pub fn generation(&self, local: u64) -> u64 {
        let committed = self.committed.lock().expect("progress");
        if committed.is_empty() {
            return local;
        }
        let mut hasher = DefaultHasher::new();
        local.hash(&mut hasher);
        committed.hash(&mut hasher);
        hasher.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covered_by_this_process_or_by_the_group() {
        let progress = IngestProgress::default();
        progress.offsets.lock().unwrap().insert(0, 10);
        let wanted = BTreeMap::from([(0, 10), (1, 7), (2, 0)]);
        assert!(
            !progress.covers(&wanted),
            "partition 1 is consumed elsewhere"
        );
        progress.set_committed(BTreeMap::from([(0, 3), (1, 6)]));
        assert!(!progress.covers(&wanted), "not committed far enough");
        progress.set_committed(BTreeMap::from([(0, 3), (1, 7)]));
        assert!(progress.covers(&wanted));
    }

    #[test]
    fn the_generation_changes_with_local_writes_and_with_commits_elsewhere() {
        let progress = IngestProgress::default();
        assert_eq!(
            progress.generation(5),
            5,
            "no group offsets: the local count"
        );
        progress.set_committed(BTreeMap::from([(0, 3), (1, 7)]));
        let before = progress.generation(5);
        assert_eq!(progress.generation(5), before, "stable while nothing moves");
        assert_ne!(progress.generation(6), before);
        progress.set_committed(BTreeMap::from([(0, 3), (1, 8)]));
        assert_ne!(progress.generation(5), before);
    }

    #[test]
    fn one_refresh_per_period_and_a_waiting_count_that_never_underflows() {
        let progress = IngestProgress::default();
        assert!(progress.claim_refresh());
        assert!(!progress.claim_refresh());
        progress.waiting(false);
        assert!(!progress.anyone_waiting());
        progress.waiting(true);
        assert!(progress.anyone_waiting());
        progress.waiting(false);
        assert!(!progress.anyone_waiting());
    }
}
