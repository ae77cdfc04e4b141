//! QueryLedger: one context per query id when the queries group moves a partition.
//!
//! A query read from Kafka is answered by the worker whose consumer read it. When the group takes a
//! partition from that consumer (a process joins or leaves), the partition's next owner starts at the
//! group's committed offset and reads again every query after it. Without care both owners answer
//! the queries that were in flight. The ledger of a worker's consumer prevents that:
//! - each query read takes a [`Lease`]: its partition, offset and the partition's epoch (which moves
//!   on at every revocation);
//! - the publisher sends a context only while its lease holds ([`QueryLedger::settle`]) and marks the
//!   query sent; a context whose lease lapsed is dropped (counted as `handed_over`): the partition's
//!   next owner answers that query;
//! - when partitions are revoked (the consumer's rebalance callback, on the worker's thread, before
//!   they move), the contexts producer is flushed so every sent context is on the broker, the group
//!   commits each revoked partition up to its first query not sent ([`QueryLedger::revoke`]), and the
//!   epochs move on.
//!
//! # Guarantees
//! - Across rebalances of live members, a query gets one context, unless a later query of the same
//!   partition was sent before an earlier one that was still in flight at the revocation (queries
//!   that wait for read-your-writes, and queries embedded in concurrent requests, can finish out of
//!   order): the later one is answered again.
//! - After a crash the group restarts from its last commit (at most one second old, plus the batches
//!   whose contexts were not yet acknowledged): those queries are answered again, with the same query
//!   id. Contexts are therefore at-least-once, keyed by query id; consumers keep the first per id.
//! - Offsets are only ever committed for queries whose contexts are on the broker.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// What the queries consumer needs of the publisher when partitions are revoked.
#[derive(Clone)]
pub struct Handover {
    /// The ledger the publisher settles leases in.
    pub ledger: Arc<QueryLedger>,
    /// Waits until every context sent is on the broker; `false` if that did not happen in time.
    pub flush: Arc<dyn Fn() -> bool + Send + Sync>,
}

impl std::fmt::Debug for Handover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handover")
            .field("ledger", &self.ledger)
            .finish_non_exhaustive()
    }
}

/// A query's claim to be answered by this consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Partition of the queries topic.
    pub partition: i32,
    /// Offset of the query.
    pub offset: i64,
    /// The partition's epoch when the query was read.
    pub epoch: u64,
}

#[derive(Debug, Default)]
struct Partition {
    /// Moves on at every revocation.
    epoch: u64,
    /// Offsets read whose contexts were not sent.
    open: BTreeSet<i64>,
    /// One past the highest offset read in this epoch.
    next: Option<i64>,
}

/// The queries of one consumer, by partition.
#[derive(Debug, Default)]
pub struct QueryLedger {
    partitions: Mutex<HashMap<i32, Partition>>,
}

impl QueryLedger {
    /// Records a query read at `offset` of `partition`; returns its lease.
    pub fn read(&self, partition: i32, offset: i64) -> Lease {
        let mut partitions = self.partitions.lock().expect("query ledger");
        let state = partitions.entry(partition).or_default();
        state.open.insert(offset);
        state.next = Some(state.next.map_or(offset + 1, |next| next.max(offset + 1)));
        Lease {
            partition,
            offset,
            epoch: state.epoch,
        }
    }

    /// Whether `lease` still holds; if it does, the query counts as sent from now on.
    pub fn settle(&self, lease: &Lease) -> bool {
        let mut partitions = self.partitions.lock().expect("query ledger");
        match partitions.get_mut(&lease.partition) {
            Some(state) if state.epoch == lease.epoch => {
                state.open.remove(&lease.offset);
                true
            }
            _ => false,
        }
    }

    /// Whether leases of `epoch` on `partition` still hold (its offsets may be stored).
    pub fn holds(&self, partition: i32, epoch: u64) -> bool {
        let partitions = self.partitions.lock().expect("query ledger");
        partitions
            .get(&partition)
            .map_or(epoch == 0, |state| state.epoch == epoch)
    }

    /// The partitions are taken away: returns, for each that had queries read in this epoch, the
    /// offset to commit (its first query not sent, or one past the last read), and ends the epoch,
    /// so leases taken before lapse.
    pub fn revoke(&self, revoked: &[i32]) -> Vec<(i32, i64)> {
        let mut partitions = self.partitions.lock().expect("query ledger");
        let mut commit = Vec::new();
        for partition in revoked {
            let state = partitions.entry(*partition).or_default();
            if let Some(next) = state.next {
                let first_open = state.open.first().copied().unwrap_or(next);
                commit.push((*partition, first_open));
            }
            state.epoch += 1;
            state.open.clear();
            state.next = None;
        }
        commit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revoked_partition_commits_up_to_its_first_unsent_query_and_its_leases_lapse() {
        let ledger = QueryLedger::default();
        let leases: Vec<Lease> = (10..15).map(|offset| ledger.read(0, offset)).collect();
        let other = ledger.read(1, 7);
        assert!(ledger.settle(&leases[0]) && ledger.settle(&leases[1]));
        assert!(ledger.settle(&leases[3]), "sent out of order");
        assert_eq!(
            ledger.revoke(&[0]),
            vec![(0, 12)],
            "offset 12 was not sent: the next owner starts there"
        );
        assert!(
            !ledger.settle(&leases[2]),
            "in flight at the revocation: dropped"
        );
        assert!(!ledger.settle(&leases[4]));
        assert!(
            !ledger.holds(0, leases[0].epoch),
            "old offsets are not stored"
        );
        assert!(ledger.settle(&other), "partition 1 was not revoked");
        assert!(ledger.holds(1, other.epoch));
        // Assigned again: a new epoch, read again from the committed offset.
        let again = ledger.read(0, 12);
        assert_eq!(again.epoch, leases[0].epoch + 1);
        assert!(ledger.settle(&again));
        assert!(ledger.holds(0, again.epoch));
        assert_eq!(
            ledger.revoke(&[0]),
            vec![(0, 13)],
            "all sent: one past the last read"
        );
    }

    #[test]
    fn a_partition_with_nothing_read_commits_nothing() {
        let ledger = QueryLedger::default();
        assert!(ledger.revoke(&[3]).is_empty());
        assert!(
            ledger.holds(5, 0),
            "an unseen partition is in its first epoch"
        );
        assert!(!ledger.holds(3, 0));
    }
}
