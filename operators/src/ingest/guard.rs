//! VersionGuard: applies document events in version order, per document key.
//!
//! Semantics: an upsert or delete whose `version` is older than the last applied version of its document
//! is ignored and counted (`stale`); an equal version is applied again (a replay is harmless: the index is
//! idempotent). A Kafka tombstone (delete without a version) always applies. Versions are seeded at start
//! from the index (the newest chunk version of each stored document), so the guard survives restarts.
//! Within one timestamp the events of a key are applied in arrival order and only the final state is
//! emitted, so the downstream upsert sees at most one update per key and time.
//!
//! The stream must be exchanged by [`DocKey::route`] so each key is guarded by the worker that owns its
//! index shard (and seeded from that shard).
//!
//! Rehydration (a shared index only: the Qdrant server's one collection, written by every job instance
//! of the group). The upsert state of this instance is its own view of the index; after a rebalance
//! another instance may have written the documents of the partitions this one is assigned. At each
//! assignment marker (time `r`, before any message of the assigned partitions), once every write of
//! this job before `r` is acknowledged, the guard reads its documents' stored chunks again (on a helper
//! thread), reseeds its versions from them and emits each document's stored ids at `r` on its second
//! output, for the upsert: the next event of a document is diffed against what the index holds. A
//! document the guard knew that the index no longer holds is emitted with no ids. Documents with an
//! event at `r` itself keep the upsert's state (this instance wrote them last). Markers that follow one
//! another with no event between share one read.
//!
//! Known window: a write the previous owner still had in flight when its partitions were revoked can
//! land after this read; its events are replayed here (their offsets were not committed), so the index
//! ends exact unless a later event of the same document is applied here before that write lands.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::{Exchange, Pipeline};
use timely::dataflow::operators::generic::OutputBuilderSession;
use timely::dataflow::operators::vec::Broadcast;
use timely::dataflow::operators::{Capability, OkErr, Operator};
use timely::dataflow::{ProbeHandle, StreamVec};
use timely::scheduling::Activator;

use super::hydrate::{hydrate, Hydrated};
use crate::events::{InternalEvent, StaleVersion};
use crate::metrics::metrics;
use crate::model::{ChunkIds, DocKey, DocOp, Document};
use crate::offload::{with_backoff, Background, Deliver, Ticket, Waker};
use crate::store::{StoreError, VectorStore};

/// A marker: a source was assigned partitions (the marker's time precedes their messages); with a
/// shared index the guard reads its documents from the collection again at that time.
pub type Assigned = ();

/// What the guard decided for one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Apply: `Some(doc)` upserts, `None` deletes.
    Apply(DocKey, Option<Document>),
    /// Ignored: older than the applied version.
    Stale {
        /// The document.
        key: DocKey,
        /// The event's version.
        version: u64,
        /// The version already applied.
        applied: u64,
    },
}

/// Last applied version per document.
#[derive(Debug, Default, Clone)]
pub struct VersionGuard {
    versions: HashMap<DocKey, u64>,
}

impl VersionGuard {
    /// Seeds the version of a document already in the index.
    pub fn seed(&mut self, key: DocKey, version: u64) {
        let entry = self.versions.entry(key).or_insert(version);
        *entry = (*entry).max(version);
    }

    /// Decides one event and records its version if applied.
    pub fn admit(&mut self, op: DocOp) -> Admission {
        let (key, version, document) = match op {
            DocOp::Upsert(doc) => (doc.key.clone(), Some(doc.version), Some(doc)),
            DocOp::Delete { key, version } => (key, version, None),
        };
        if let (Some(version), Some(&applied)) = (version, self.versions.get(&key)) {
            if version < applied {
                return Admission::Stale {
                    key,
                    version,
                    applied,
                };
            }
        }
        if let Some(version) = version {
            self.versions.insert(key.clone(), version);
        }
        Admission::Apply(key, document)
    }
}

/// Reading the index again at every assignment (a shared index only).
pub struct Rehydration {
    /// The shared index.
    pub store: Arc<dyn VectorStore>,
    /// Whether this worker guards a document (the guard's exchange: `route % peers == index`).
    pub owns: Arc<dyn Fn(&DocKey) -> bool + Send + Sync>,
    /// The index and DLQ writers' frontier: the index is read once every earlier write is acknowledged.
    pub acks: ProbeHandle<u64>,
}

/// An upsert admitted by the guard, `(key, Some(doc) | None, time)`.
pub type Admitted = (DocKey, Option<Document>, u64);
/// A document's ids as the index holds them, `(key, Some(ids), time)`, read at an assignment.
pub type Rehydrated = (DocKey, Option<ChunkIds>, u64);

/// How often a pending rehydration checks whether the writes before it are acknowledged.
const ACK_POLL: Duration = Duration::from_millis(10);

impl VersionGuard {
    /// The documents the guard has seen (seeded or admitted).
    pub fn keys(&self) -> impl Iterator<Item = &DocKey> + '_ {
        self.versions.keys()
    }
}

/// Extension trait: guard a stream of document events.
pub trait GuardVersions<'scope> {
    /// Emits `(key, Some(doc) | None, time)` upserts, at most one per key and time, in version order;
    /// with `rehydration`, the index's ids of the guarded documents at every `assigned` marker.
    fn guard_versions(
        self,
        guard: VersionGuard,
        assigned: StreamVec<'scope, u64, Assigned>,
        rehydration: Option<Rehydration>,
    ) -> (
        StreamVec<'scope, u64, Admitted>,
        StreamVec<'scope, u64, Rehydrated>,
    );
}

impl<'scope> GuardVersions<'scope> for StreamVec<'scope, u64, DocOp> {
    fn guard_versions(
        self,
        guard: VersionGuard,
        assigned: StreamVec<'scope, u64, Assigned>,
        rehydration: Option<Rehydration>,
    ) -> (
        StreamVec<'scope, u64, Admitted>,
        StreamVec<'scope, u64, Rehydrated>,
    ) {
        let scope = self.scope();
        let pact = Exchange::new(|op: &DocOp| op.key().route());
        let guarded = self
            .binary_frontier::<_, CapacityContainerBuilder<Vec<GuardItem>>, _, _, _, _>(
                assigned.broadcast(),
                pact,
                Pipeline,
                "VersionGuard",
                move |_cap, info| {
                    let activator = scope.activator_for(info.address.clone());
                    let reader = rehydration.map(|rehydration| {
                        let waker = crate::offload::operator_waker(scope.worker(), &info.address);
                        start_reader(rehydration, waker)
                    });
                    let mut state = GuardState {
                        guard,
                        reader,
                        stash: BTreeMap::new(),
                        markers: BTreeMap::new(),
                        reading: None,
                    };
                    move |(input, frontier), (marks, marks_frontier), output| {
                        input.for_each(|cap, data| {
                            if let Some(&time) = cap.least() {
                                let entry = state.stash.entry(time).or_insert_with(|| {
                                    (cap.retain_least(0).expect("time of the batch"), Vec::new())
                                });
                                entry.1.append(data);
                            }
                        });
                        marks.for_each(|cap, _| {
                            // Without a shared index there is nothing to read again.
                            if state.reader.is_some() {
                                if let Some(&time) = cap.least() {
                                    state.markers.entry(time).or_insert_with(|| {
                                        cap.retain_least(0).expect("time of the marker")
                                    });
                                }
                            }
                        });
                        // Times complete in order (events and markers alike); holding each
                        // capability until its time is complete keeps the output frontier at or
                        // below the earliest unprocessed one.
                        let done = |time: &u64| {
                            !frontier.less_equal(time) && !marks_frontier.less_equal(time)
                        };
                        state.process_complete(&done, &activator, output);
                    }
                },
            );
        guarded.ok_err(|item| item)
    }
}

/// The guard's output: admitted upserts (`Ok`) and the index's ids read at an assignment (`Err`).
type GuardItem = Result<Admitted, Rehydrated>;
/// The guard's output in one activation.
type GuardOutput<'a> = OutputBuilderSession<'a, u64, CapacityContainerBuilder<Vec<GuardItem>>>;
/// The index reader's helper thread, and the writers' frontier its reads wait for.
type Reader = (Background<(), Hydrated>, ProbeHandle<u64>);

/// Starts the helper thread that reads the guarded documents from the shared index.
fn start_reader(rehydration: Rehydration, waker: Waker) -> Reader {
    let Rehydration { store, owns, acks } = rehydration;
    let read = Background::start(
        "ragstream-rehydrate",
        move |(), deliver: &Deliver<Hydrated>| {
            let retryable = |error: &StoreError| !matches!(error, StoreError::Gone(_));
            match with_backoff(crate::outage::Dependency::Rehydrate, retryable, || {
                hydrate(store.as_ref(), &*owns)
            }) {
                Ok(hydrated) => deliver.send(hydrated),
                Err(error) => crate::outage::stop_job(&error.to_string()),
            }
        },
        waker,
    );
    (read, acks)
}

/// The guard operator's state between activations.
struct GuardState {
    guard: VersionGuard,
    /// The index reader, with a shared index only.
    reader: Option<Reader>,
    /// Events by time, with a capability for it, until the time is complete.
    stash: BTreeMap<u64, (Capability<u64>, Vec<DocOp>)>,
    /// Assignment markers by time (kept only with a reader).
    markers: BTreeMap<u64, Capability<u64>>,
    /// The read on the helper thread (for a marker's time), and the ticket it comes back in.
    reading: Option<Ticket<Hydrated>>,
}

impl GuardState {
    /// Handles the complete times in order, markers first; stops at a read not back yet.
    fn process_complete(
        &mut self,
        done: &impl Fn(&u64) -> bool,
        activator: &Activator,
        output: &mut GuardOutput<'_>,
    ) {
        loop {
            let event = self.stash.keys().next().copied().filter(done);
            let marker = self.markers.keys().next().copied().filter(done);
            if let Some(at) = marker.filter(|at| event.is_none_or(|event| *at <= event)) {
                if !self.rehydrate(at, event, done, activator, output) {
                    break;
                }
                continue;
            }
            let Some(time) = event else {
                break;
            };
            self.admit_time(time, output);
        }
    }

    /// Reads the index again for the marker at `at`; false while the read is not back.
    fn rehydrate(
        &mut self,
        at: u64,
        event: Option<u64>,
        done: &impl Fn(&u64) -> bool,
        activator: &Activator,
        output: &mut GuardOutput<'_>,
    ) -> bool {
        let (read, acks) = self
            .reader
            .as_ref()
            .expect("markers are kept only with a reader");
        if self.reading.is_none() {
            if acks.less_than(&at) {
                activator.activate_after(ACK_POLL);
                return false;
            }
            self.reading = Some(read.submit(()));
        }
        let Some(hydrated) = self.reading.as_ref().and_then(Ticket::try_take) else {
            // The helper wakes the operator with the result.
            return false;
        };
        self.reading = None;
        let cap = self.markers.remove(&at).expect("the marker read");
        // Markers up to the next event share this read.
        while let Some(next) = self
            .markers
            .keys()
            .next()
            .copied()
            .filter(|next| done(next) && event.is_none_or(|event| *next <= event))
        {
            self.markers.remove(&next);
        }
        self.emit_rehydrated(at, &cap, &hydrated, output);
        true
    }

    /// Reseeds the guard from the index read at `at` and emits each document's stored ids.
    fn emit_rehydrated(
        &mut self,
        at: u64,
        cap: &Capability<u64>,
        hydrated: &Hydrated,
        output: &mut GuardOutput<'_>,
    ) {
        let busy: HashSet<&DocKey> = self
            .stash
            .get(&at)
            .map(|(_, ops)| ops.iter().map(DocOp::key).collect())
            .unwrap_or_default();
        let mut session = output.session(cap);
        let mut documents = 0usize;
        for (key, ids) in hydrated.ids() {
            if !busy.contains(&key) {
                self.guard.seed(key.clone(), ids.version);
                session.give(Err((key, Some(ids), at)));
                documents += 1;
            }
        }
        let gone: Vec<DocKey> = self
            .guard
            .keys()
            .filter(|key| !busy.contains(key) && !hydrated.documents.contains_key(*key))
            .cloned()
            .collect();
        for key in &gone {
            session.give(Err((
                key.clone(),
                Some(ChunkIds {
                    version: 0,
                    ids: Vec::new(),
                }),
                at,
            )));
        }
        metrics().rehydrations.inc();
        tracing::info!(
            time = at,
            documents,
            gone = gone.len(),
            chunks = hydrated.chunk_count(),
            "partitions assigned: read the shared index again"
        );
    }

    /// Admits the events of the complete `time` in arrival order and emits each key's final state.
    fn admit_time(&mut self, time: u64, output: &mut GuardOutput<'_>) {
        let (cap, ops) = self.stash.remove(&time).expect("the first stashed time");
        let mut last: BTreeMap<DocKey, Option<Document>> = BTreeMap::new();
        for op in ops {
            let op_name = if matches!(op, DocOp::Upsert(_)) {
                "upsert"
            } else {
                "delete"
            };
            match self.guard.admit(op) {
                Admission::Apply(key, document) => {
                    metrics().record_document(op_name, "applied");
                    last.insert(key, document);
                }
                Admission::Stale {
                    key,
                    version,
                    applied,
                } => {
                    StaleVersion {
                        key: &key,
                        version,
                        applied,
                        op: op_name,
                    }
                    .emit();
                }
            }
        }
        output.session(&cap).give_iterator(
            last.into_iter()
                .map(|(key, document)| Ok((key, document, time))),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DocKind;

    fn upsert(id: &str, version: u64) -> DocOp {
        DocOp::Upsert(Document {
            key: DocKey::new("t", id),
            version,
            source: id.into(),
            kind: DocKind::Prose,
            title: None,
            text: format!("v{version}"),
            acl: vec![],
            updated_ms: 0,
            metadata: Default::default(),
        })
    }

    #[test]
    fn older_versions_are_stale_equal_ones_apply() {
        let mut guard = VersionGuard::default();
        assert!(matches!(
            guard.admit(upsert("a", 2)),
            Admission::Apply(_, Some(_))
        ));
        assert_eq!(
            guard.admit(upsert("a", 1)),
            Admission::Stale {
                key: DocKey::new("t", "a"),
                version: 1,
                applied: 2
            }
        );
        assert!(matches!(guard.admit(upsert("a", 2)), Admission::Apply(..)));
        assert!(
            matches!(guard.admit(upsert("b", 1)), Admission::Apply(..)),
            "keys are independent"
        );
    }

    #[test]
    fn deletes_are_versioned_tombstones_always_apply() {
        let mut guard = VersionGuard::default();
        guard.seed(DocKey::new("t", "a"), 5);
        let stale_delete = DocOp::Delete {
            key: DocKey::new("t", "a"),
            version: Some(4),
        };
        assert!(matches!(guard.admit(stale_delete), Admission::Stale { .. }));
        let tombstone = DocOp::Delete {
            key: DocKey::new("t", "a"),
            version: None,
        };
        assert_eq!(
            guard.admit(tombstone),
            Admission::Apply(DocKey::new("t", "a"), None)
        );
        // After a versioned delete, older upserts stay out.
        assert!(matches!(
            guard.admit(DocOp::Delete {
                key: DocKey::new("t", "a"),
                version: Some(7)
            }),
            Admission::Apply(..)
        ));
        assert!(matches!(
            guard.admit(upsert("a", 6)),
            Admission::Stale { .. }
        ));
        assert!(matches!(guard.admit(upsert("a", 8)), Admission::Apply(..)));
    }

    #[test]
    fn operator_emits_final_state_per_key_and_time() {
        use timely::dataflow::operators::capture::Extract;
        use timely::dataflow::operators::{Capture, ToStream};
        let captured = timely::example(|scope| {
            vec![
                upsert("a", 1),
                upsert("a", 3),
                upsert("a", 2),
                upsert("b", 1),
                DocOp::Delete {
                    key: DocKey::new("t", "b"),
                    version: Some(2),
                },
            ]
            .to_stream(scope)
            .guard_versions(
                VersionGuard::default(),
                timely::dataflow::operators::generic::operator::empty(scope),
                None,
            )
            .0
            .capture()
        });
        type Update = (DocKey, Option<Document>, u64);
        let got: Vec<(u64, Vec<Update>)> = captured.extract();
        assert_eq!(got.len(), 1);
        let updates = &got[0].1;
        assert_eq!(updates.len(), 2);
        assert_eq!(
            updates[0].1.as_ref().map(|d| d.version),
            Some(3),
            "a: v3 wins, v2 stale"
        );
        assert_eq!(updates[1], (DocKey::new("t", "b"), None, 0), "b: deleted");
    }
}
