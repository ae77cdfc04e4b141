//! Written: the documents the index writers finished, one by one, for the local source.
//!
//! A time's frontier passes only when every document of it is written, so a source that answers by
//! the frontier answers a tenant's small document only after another tenant's large one of an earlier
//! time. The local source answers its posted requests and frees a tenant's room in flight document
//! by document instead: each IndexWrite records here every document it finished (written, or
//! dead-lettered by the embedder or the index), by key and event time, and the source takes them on
//! its next activation. A document that reaches no writer (a stale version, an unchanged re-send) is
//! done when its time's frontier passes, as before.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::model::DocKey;
use crate::store::SparseVector;

/// Where an index writer records the documents it finished: the local source's [`Written`] and the
/// standing queries' [`Changes`], each where the job has one.
#[derive(Debug, Clone, Default)]
pub struct Finished {
    /// The local source's log, if documents come from one.
    pub written: Option<Arc<Written>>,
    /// The per-tenant change feed, if standing queries are served.
    pub changes: Option<Arc<Changes>>,
    /// In a cluster: the writer hands the documents it finished, with their chunks, to its ack
    /// ([`ShippedChanges`]) for the first worker of every process to record in that process's
    /// `changes` (`ShareChanges`), instead of recording them in its own process's alone.
    pub ship: bool,
}

/// Documents an index writer finished and the chunks they wrote, on their way to every process's
/// change feed (a cluster's standing queries are held in any process; each shard is written in one).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ShippedChanges {
    /// Documents finished, each with the time of its event.
    pub finished: Vec<(DocKey, u64)>,
    /// The chunks some of them wrote.
    pub details: Vec<DocChange>,
}

impl ShippedChanges {
    /// Records them in a process's change feed.
    pub fn record_in(self, changes: &Changes) {
        changes.record_with(&self.finished, self.details);
    }
}

impl Finished {
    /// Whether the change feed wants the chunks each document wrote ([`Changes::detailed`]).
    pub fn detailed(&self) -> bool {
        // Shipped: another process's subscriptions may want them (this one cannot tell).
        self.changes
            .as_ref()
            .is_some_and(|changes| self.ship || changes.detailed())
    }

    /// Records documents finished, each with the time of its event, and the chunks some of them
    /// wrote (`details`, where [`Finished::detailed`] asked for them).
    /// Shipping ([`Finished::ship`]), the change feed's part comes back for the ack.
    pub fn record(
        &self,
        finished: Vec<(DocKey, u64)>,
        details: Vec<DocChange>,
    ) -> Option<ShippedChanges> {
        let shipped = match (&self.changes, self.ship) {
            (Some(_), true) if !finished.is_empty() => Some(ShippedChanges {
                finished: finished.clone(),
                details,
            }),
            (Some(changes), false) => {
                changes.record_with(&finished, details);
                None
            }
            _ => None,
        };
        if let Some(written) = &self.written {
            written.record(finished);
        }
        shipped
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

/// What the index writers changed, per tenant: a serial that grows with every batch of documents
/// finished, the latest event time among them and, while standing queries are held, each
/// document's new chunks (process-wide; read by the standing queries, which re-evaluate the
/// subscriptions a change may move).
#[derive(Debug, Default)]
pub struct Changes {
    inner: Mutex<ChangeLog>,
    serial: AtomicU64,
    detailed: AtomicBool,
}

#[derive(Debug, Default)]
struct ChangeLog {
    tenants: HashMap<String, TenantChange>,
    /// Documents changed, oldest first, with their chunks.
    details: VecDeque<DocChange>,
    /// Chunks held in `details`.
    held: usize,
    /// The latest serial whose documents are not all in `details` (recorded without their chunks,
    /// or dropped past the bound).
    gap: u64,
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

/// One document finished, with the chunks it wrote.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DocChange {
    /// The serial of the record it came with.
    pub serial: u64,
    /// The document.
    pub key: DocKey,
    /// Its event time (ms).
    pub time: u64,
    /// The chunks it wrote: dense vector and BM25 vector (a chunk rewritten with what the index
    /// holds, its payload changed, comes with an empty dense vector: it may enter any dense lane;
    /// a delete writes none).
    pub chunks: Vec<(Vec<f32>, SparseVector)>,
}

impl DocChange {
    /// The change a delta makes (its upserts and its rewrites), before it is written.
    pub fn of(
        key: &DocKey,
        time: u64,
        (points, restamp): (&[crate::store::PointWrite], &[crate::store::PointWrite]),
    ) -> Self {
        Self {
            serial: 0,
            key: key.clone(),
            time,
            chunks: points
                .iter()
                .map(|point| (point.dense.clone(), point.sparse.clone()))
                .chain(
                    restamp
                        .iter()
                        .map(|point| (Vec::new(), point.sparse.clone())),
                )
                .collect(),
        }
    }
}

/// Most chunks the feed holds between two looks of the standing queries (they look every few
/// milliseconds; past this the oldest are dropped and the subscriptions of their tenants are
/// re-evaluated without the filter).
const MAX_DETAIL_CHUNKS: usize = 1 << 15;

/// What changed since a serial ([`Changes::take_since`]).
#[derive(Debug, Default)]
pub struct ChangesSince {
    /// The serial now.
    pub serial: u64,
    /// The tenants changed since, with their changes.
    pub tenants: Vec<(String, TenantChange)>,
    /// The documents recorded with their chunks since (all of them where `complete`).
    pub docs: Vec<DocChange>,
    /// Whether `docs` holds every document changed since.
    pub complete: bool,
}

impl Changes {
    /// Whether the feed keeps each document's chunks (while standing queries are held).
    pub fn detailed(&self) -> bool {
        self.detailed.load(Ordering::SeqCst)
    }

    /// Keeps (or stops keeping) each document's chunks.
    pub fn set_detailed(&self, detailed: bool) {
        self.detailed.store(detailed, Ordering::SeqCst);
    }

    /// Records documents finished (written or dead-lettered), each with the time of its event.
    pub fn record(&self, finished: &[(DocKey, u64)]) {
        self.record_with(finished, Vec::new());
    }

    /// [`Changes::record`], with the chunks written by those of `finished` in `details` (the
    /// others count as changed without them).
    pub fn record_with(&self, finished: &[(DocKey, u64)], details: Vec<DocChange>) {
        if finished.is_empty() {
            return;
        }
        let now = crate::now_millis();
        let mut log = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let serial = self.serial.fetch_add(1, Ordering::SeqCst) + 1;
        for (key, time) in finished {
            let change = match log.tenants.get_mut(&key.tenant) {
                Some(change) => change,
                None => log.tenants.entry(key.tenant.clone()).or_default(),
            };
            change.serial = serial;
            change.time = change.time.max(*time);
            change.recorded_ms = now;
        }
        let detailed = self.detailed();
        let keys: HashSet<&DocKey> = details.iter().map(|doc| &doc.key).collect();
        if !(detailed && finished.iter().all(|(key, _)| keys.contains(key))) {
            log.gap = serial;
        }
        if !detailed {
            return;
        }
        let finished: HashSet<&DocKey> = finished.iter().map(|(key, _)| key).collect();
        for mut doc in details {
            if !finished.contains(&doc.key) {
                continue;
            }
            doc.serial = serial;
            log.held += doc.chunks.len().max(1);
            log.details.push_back(doc);
        }
        while log.held > MAX_DETAIL_CHUNKS {
            let Some(dropped) = log.details.pop_front() else {
                break;
            };
            log.held -= dropped.chunks.len().max(1);
            log.gap = log.gap.max(dropped.serial);
        }
    }

    /// The tenant's changes so far, if it ever changed.
    pub fn of(&self, tenant: &str) -> Option<TenantChange> {
        let log = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        log.tenants.get(tenant).copied()
    }

    /// The process's change serial: it moved when any tenant changed.
    pub fn serial(&self) -> u64 {
        self.serial.load(Ordering::SeqCst)
    }

    /// The tenants changed after serial `since`, with their changes.
    pub fn since(&self, since: u64) -> Vec<(String, TenantChange)> {
        let log = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        changed_since(&log, since)
    }

    /// What changed after serial `since`, taking the documents held (one reader takes them: the
    /// standing queries' evaluator).
    pub fn take_since(&self, since: u64) -> ChangesSince {
        let mut log = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let docs: Vec<DocChange> = log
            .details
            .drain(..)
            .filter(|doc| doc.serial > since)
            .collect();
        log.held = 0;
        ChangesSince {
            serial: self.serial(),
            tenants: changed_since(&log, since),
            docs,
            complete: log.gap <= since,
        }
    }
}

fn changed_since(log: &ChangeLog, since: u64) -> Vec<(String, TenantChange)> {
    log.tenants
        .iter()
        .filter(|(_, change)| change.serial > since)
        .map(|(tenant, change)| (tenant.clone(), *change))
        .collect()
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

    /// In a single process the writer records in its own change feed; in a cluster it records
    /// nothing there and ships the documents and their chunks, which a process's feed then takes
    /// as if recorded there (the local source's log is written either way).
    #[test]
    fn a_clusters_writer_ships_what_a_single_process_records() {
        let change = DocChange {
            serial: 0,
            key: key("t", "d"),
            time: 7,
            chunks: vec![(vec![1.0, 0.0], SparseVector::default())],
        };
        let finished = || vec![(key("t", "d"), 7)];
        let single = Finished {
            written: Some(Arc::new(Written::default())),
            changes: Some(Arc::new(Changes::default())),
            ship: false,
        };
        single.changes.as_ref().unwrap().set_detailed(true);
        assert_eq!(single.record(finished(), vec![change.clone()]), None);
        let recorded = single.changes.as_ref().unwrap().take_since(0);
        assert_eq!(recorded.docs.len(), 1);

        let cluster = Finished {
            written: Some(Arc::new(Written::default())),
            changes: Some(Arc::new(Changes::default())),
            ship: true,
        };
        assert!(cluster.detailed(), "another process may hold subscriptions");
        let shipped = cluster
            .record(finished(), vec![change.clone()])
            .expect("shipped");
        assert_eq!(
            cluster.changes.as_ref().unwrap().serial(),
            0,
            "nothing recorded here"
        );
        assert_eq!(cluster.written.as_ref().unwrap().take(), finished());
        // Across processes the record travels serialized.
        let travelled: ShippedChanges =
            serde_json::from_slice(&serde_json::to_vec(&shipped).unwrap()).unwrap();
        let elsewhere = Changes::default();
        elsewhere.set_detailed(true);
        travelled.record_in(&elsewhere);
        let there = elsewhere.take_since(0);
        assert_eq!(there.tenants.len(), 1);
        assert_eq!(there.docs.len(), 1);
        assert_eq!(there.docs[0].chunks, change.chunks);
        assert!(there.complete);
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

    /// While detailed, the documents recorded with their chunks come back once, with the serial of
    /// their record; a document recorded without its chunks, or before the feed was detailed, makes
    /// what follows incomplete.
    #[test]
    fn details_are_taken_once_and_gaps_are_told() {
        let changes = Changes::default();
        changes.record(&[(key("a", "0"), 1)]);
        changes.set_detailed(true);
        let doc = |name: &str| DocChange {
            key: key("a", name),
            chunks: vec![(vec![1.0], SparseVector::default())],
            serial: 0,
            time: 0,
        };
        changes.record_with(&[(key("a", "1"), 2)], vec![doc("1"), doc("stale")]);
        let taken = changes.take_since(0);
        assert!(!taken.complete, "the first record had no chunks");
        assert_eq!(taken.docs.len(), 1);
        assert_eq!(taken.docs[0].key.doc_id, "1");
        assert_eq!(taken.docs[0].serial, changes.serial());
        let since = changes.serial() - 1;
        let again = changes.take_since(since);
        assert!(again.complete && again.docs.is_empty(), "taken once");
        changes.record_with(&[(key("a", "2"), 3), (key("b", "1"), 3)], vec![doc("2")]);
        assert!(!changes.take_since(changes.serial() - 1).complete);
        let last = changes.serial();
        changes.record_with(&[(key("a", "3"), 4)], vec![doc("3")]);
        let taken = changes.take_since(last);
        assert!(taken.complete);
        assert_eq!(taken.tenants.len(), 1);
    }
}
