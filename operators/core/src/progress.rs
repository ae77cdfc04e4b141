//! How far the index has acknowledged the documents topic: written by the document sources, read by
//! the query flow's read-your-writes wait.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

/// Ingest progress shared by the document sources and the query flow.
#[derive(Debug, Default)]
pub struct IngestProgress {
    /// Documents-topic partition → next offset not yet acknowledged by the index.
    pub offsets: Mutex<BTreeMap<i32, i64>>,
    /// Whether documents come from Kafka (read-your-writes then waits on offsets, else on the frontier).
    pub kafka: AtomicBool,
}

impl IngestProgress {
    /// Whether every offset below `wanted` is acknowledged.
    pub fn covers(&self, wanted: &BTreeMap<i32, i64>) -> bool {
        let offsets = self.offsets.lock().expect("progress");
        wanted.iter().all(|(partition, high)| {
            *high <= 0 || offsets.get(partition).is_some_and(|o| o >= high)
        })
    }

    /// A copy of the acknowledged offsets.
    pub fn snapshot(&self) -> BTreeMap<i32, i64> {
        self.offsets.lock().expect("progress").clone()
    }
}
