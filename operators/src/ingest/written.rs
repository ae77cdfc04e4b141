//! Written: the documents the index writers finished, one by one, for the local source.
//!
//! A time's frontier passes only when every document of it is written, so a source that answers by
//! the frontier answers a tenant's small document only after another tenant's large one of an earlier
//! time. The local source answers its posted requests and frees a tenant's room in flight document
//! by document instead: each IndexWrite records here every document it finished (written, or
//! dead-lettered by the embedder or the index), by key and event time, and the source takes them on
//! its next activation. A document that reaches no writer (a stale version, an unchanged re-send) is
//! done when its time's frontier passes, as before.

use std::sync::{Arc, Mutex};

use crate::model::DocKey;

/// Where an index writer records the documents it finished: the local source's [`Written`] and the
/// standing queries' [`Changes`], each where the job has one.
#[derive(Debug, Clone, Default)]
pub struct Finished {
    /// The local source's log, if documents come from one.
    pub written: Option<Arc<Written>>,
    /// The per-tenant change feed, if standing queries are served.
    pub changes: Option<Arc<Changes>>,
}

impl Finished {
    /// Records documents finished, each with the time of its event.
    pub fn record(&self, finished: Vec<(DocKey, u64)>) {
        if let Some(changes) = &self.changes {
            changes.record(&finished);
        }
        if let Some(written) = &self.written {
            written.record(finished);
        }
    }
}

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

/// What the index writers changed, per tenant: a serial that grows with every document finished
/// and the latest event time among them (process-wide; read by the standing queries, which
/// re-evaluate a tenant's subscriptions once their context may have moved).
#[derive(Debug, Default)]
pub struct Changes {
    tenants: Mutex<std::collections::HashMap<String, TenantChange>>,
    serial: std::sync::atomic::AtomicU64,
}

/// A tenant's changes so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantChange {
    /// The process's change serial when the tenant last changed (grows with every record).
    pub serial: u64,
    /// The latest event time (ms) among the tenant's documents finished.
    pub time: u64,
    /// When the tenant last changed (ms since the epoch).
    pub recorded_ms: u64,
}

impl Changes {
    /// Records documents finished (written or dead-lettered), each with the time of its event.
    pub fn record(&self, finished: &[(DocKey, u64)]) {
        if finished.is_empty() {
            return;
        }
        let serial = self
            .serial
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        let now = crate::now_millis();
        let mut tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        for (key, time) in finished {
            let change = tenants.entry(key.tenant.clone()).or_default();
            change.serial = serial;
            change.time = change.time.max(*time);
            change.recorded_ms = now;
        }
    }

    /// The tenant's changes so far, if it ever changed.
    pub fn of(&self, tenant: &str) -> Option<TenantChange> {
        let tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        tenants.get(tenant).copied()
    }

    /// The process's change serial: it moved when any tenant changed.
    pub fn serial(&self) -> u64 {
        self.serial.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The tenants changed after serial `since`, with their changes.
    pub fn since(&self, since: u64) -> Vec<(String, TenantChange)> {
        let tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        tenants
            .iter()
            .filter(|(_, change)| change.serial > since)
            .map(|(tenant, change)| (tenant.clone(), *change))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tenant: &str, doc: &str) -> DocKey {
        DocKey {
            tenant: tenant.into(),
            doc_id: doc.into(),
        }
    }

    /// Each record moves the serial once; `since` names exactly the tenants changed after it, with
    /// their latest event time.
    #[test]
    fn changes_name_the_tenants_changed_since_a_serial() {
        let changes = Changes::default();
        changes.record(&[(key("a", "1"), 10), (key("b", "1"), 7)]);
        let first = changes.serial();
        changes.record(&[(key("a", "2"), 5)]);
        changes.record(&[]);
        assert_eq!(changes.serial(), first + 1);
        let mut since = changes.since(first);
        since.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(since.len(), 1);
        assert_eq!(since[0].0, "a");
        assert_eq!((since[0].1.serial, since[0].1.time), (first + 1, 10));
        assert_eq!(
            changes.of("b").map(|c| (c.serial, c.time)),
            Some((first, 7))
        );
        assert_eq!(changes.of("c"), None);
        assert_eq!(changes.since(0).len(), 2);
        assert!(changes.since(changes.serial()).is_empty());
    }
}
