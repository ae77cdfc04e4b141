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

use std::collections::{BTreeMap, HashMap};

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::{Capability, Operator};
use timely::dataflow::StreamVec;

use crate::metrics::metrics;
use crate::model::{DocKey, DocOp, Document};

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

/// Extension trait: guard a stream of document events.
pub trait GuardVersions<'scope> {
    /// Emits `(key, Some(doc) | None, time)` upserts, at most one per key and time, in version order.
    fn guard_versions(
        self,
        guard: VersionGuard,
    ) -> StreamVec<'scope, u64, (DocKey, Option<Document>, u64)>;
}

impl<'scope> GuardVersions<'scope> for StreamVec<'scope, u64, DocOp> {
    fn guard_versions(
        self,
        mut guard: VersionGuard,
    ) -> StreamVec<'scope, u64, (DocKey, Option<Document>, u64)> {
        let pact = Exchange::new(|op: &DocOp| op.key().route());
        self.unary_frontier::<CapacityContainerBuilder<Vec<_>>, _, _, _>(pact, "VersionGuard", move |_cap, _info| {
            let mut stash: BTreeMap<u64, (Capability<u64>, Vec<DocOp>)> = BTreeMap::new();
            move |(input, frontier), output| {
                input.for_each(|cap, data| {
                    if let Some(&time) = cap.least() {
                        let entry = stash.entry(time).or_insert_with(|| (cap.retain_least(0).expect("time of the batch"), Vec::new()));
                        entry.1.append(data);
                    }
                });
                // Times complete in order; holding each capability until its time is complete keeps the
                // output frontier at or below the earliest unprocessed event.
                while let Some(entry) = stash.first_entry() {
                    if frontier.less_equal(entry.key()) {
                        break;
                    }
                    let time = *entry.key();
                    let (cap, ops) = entry.remove();
                    let mut last: BTreeMap<DocKey, Option<Document>> = BTreeMap::new();
                    for op in ops {
                        let op_name = if matches!(op, DocOp::Upsert(_)) { "upsert" } else { "delete" };
                        match guard.admit(op) {
                            Admission::Apply(key, document) => {
                                metrics().record_document(op_name, "applied");
                                last.insert(key, document);
                            }
                            Admission::Stale { key, version, applied } => {
                                metrics().record_document(op_name, "stale");
                                metrics().stale_versions.inc();
                                tracing::debug!(%key, version, applied, "ignored stale version");
                            }
                        }
                    }
                    output.session(&cap).give_iterator(last.into_iter().map(|(key, document)| (key, document, time)));
                }
            }
        })
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
            .guard_versions(VersionGuard::default())
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
