//! Written: the documents the index writers finished, one by one, for the local source.
//!
//! A time's frontier passes only when every document of it is written, so a source that answers by
//! the frontier answers a tenant's small document only after another tenant's large one of an earlier
//! time. The local source answers its posted requests and frees a tenant's room in flight document
//! by document instead: each IndexWrite records here every document it finished (written, or
//! dead-lettered by the embedder or the index), by key and event time, and the source takes them on
//! its next activation. A document that reaches no writer (a stale version, an unchanged re-send) is
//! done when its time's frontier passes, as before.

use std::sync::Mutex;

use crate::model::DocKey;

/// Documents finished since the source last looked (process-wide, shared by every worker's
/// IndexWrite and the local source).
#[derive(Debug, Default)]
pub struct Written {
    finished: Mutex<Vec<(DocKey, u64)>>,
}

/// Most entries held between two looks of the source (it looks every few milliseconds; past this
/// the oldest are dropped, and their documents are done by the frontier instead).
const MAX_HELD: usize = 1 << 20;

impl Written {
    /// Records documents finished, each with the time of its event.
    pub fn record(&self, finished: impl IntoIterator<Item = (DocKey, u64)>) {
        let mut held = self.finished.lock().unwrap_or_else(|p| p.into_inner());
        held.extend(finished);
        if held.len() > MAX_HELD {
            let over = held.len() - MAX_HELD;
            held.drain(..over);
        }
    }

    /// The documents finished since the last call.
    pub fn take(&self) -> Vec<(DocKey, u64)> {
        std::mem::take(&mut *self.finished.lock().unwrap_or_else(|p| p.into_inner()))
    }
}
