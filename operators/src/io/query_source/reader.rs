//! The query source's state on one worker and what it does in each activation (see the parent
//! module for the guarantees it keeps).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use timely::container::CapacityContainerBuilder;
use timely::dataflow::operators::generic::OutputBuilderSession;
use timely::dataflow::operators::Capability;
use timely::dataflow::ProbeHandle;
use timely::scheduling::Activator;

use super::{decode_timed, refusal, wait_for, Batch, DecodeRules, HttpIngress};
use crate::ingest::dlq::Origin;
use crate::io::query_ledger::Handover;
use crate::metrics::metrics;
use crate::offload::Parked;
use crate::query::job::{QueryJob, Refusal, Reply};
#[cfg(feature = "kafka")]
use ragstream_core::query::Consistency;

/// The query source's output in one activation.
type QueryOutput<'a> =
    OutputBuilderSession<'a, u64, CapacityContainerBuilder<Vec<Result<QueryJob, Refusal>>>>;

/// One worker's query source between activations.
pub(super) struct QueryReader {
    pub(super) activator: Activator,
    pub(super) worker: usize,
    /// The queries topic (the `kafka` feature).
    #[cfg(feature = "kafka")]
    pub(super) kafka: Option<super::kafka::KafkaQueries>,
    pub(super) http: Option<Arc<HttpIngress>>,
    pub(super) rules: DecodeRules,
    pub(super) published: ProbeHandle<u64>,
    #[cfg_attr(
        not(feature = "kafka"),
        allow(dead_code, reason = "the topic's leases")
    )]
    pub(super) handover: Handover,
    pub(super) shutdown: Arc<AtomicBool>,
    pub(super) finite_ingest: Option<ProbeHandle<u64>>,
    /// Batches read with read-your-writes queries in them, each held at its time until watermarks
    /// fetched after it was read come back (in order: one fetch per batch).
    pub(super) waiting: Parked<Capability<u64>, Batch, BTreeMap<i32, i64>>,
    /// Per batch time: per partition, the highest offset read and the partition's lease epoch.
    pub(super) pending: BTreeMap<u64, BTreeMap<i32, (i64, u64)>>,
    /// Queries read by this worker so far (the low bits of their ids).
    pub(super) sequence: u64,
    /// Where standing events go, to the worker owning their subscription (standing queries on
    /// the queries topic only).
    pub(super) route: Option<std::rc::Rc<super::route::StandingRoute>>,
}

impl QueryReader {
    /// Whether there is anything to read: the HTTP queue or the queries topic.
    pub(super) fn has_input(&self) -> bool {
        #[cfg(feature = "kafka")]
        if self.kafka.is_some() {
            return true;
        }
        self.http.is_some()
    }

    /// Stores the offsets of batches whose contexts are all published.
    pub(super) fn store_published_offsets(&mut self) {
        while let Some(entry) = self.pending.first_entry() {
            if self.published.less_equal(entry.key()) {
                break;
            }
            let offsets = entry.remove();
            #[cfg(feature = "kafka")]
            if let Some(kafka) = &self.kafka {
                for (partition, (offset, epoch)) in offsets {
                    // A partition revoked since was committed at the revocation.
                    if self.handover.ledger.holds(partition, epoch) {
                        kafka.store_offset(partition, offset);
                    }
                }
            }
            #[cfg(not(feature = "kafka"))]
            drop(offsets);
        }
    }

    /// Emits the held batches whose watermarks came back, oldest first.
    pub(super) fn release_held(&mut self, output: &mut QueryOutput<'_>) {
        // The helper wakes the operator when they come.
        for (held, mut batch, marks) in self.waiting.ready_in_order() {
            wait_for(&mut batch, &marks);
            output.session(&held).give_iterator(batch.into_iter());
        }
    }

    /// Whether the source stops: the job is stopping, or the finite input is fully indexed.
    pub(super) fn stopping(&self) -> bool {
        let input_done = self.finite_ingest.as_ref().is_some_and(ProbeHandle::done);
        self.shutdown.load(Ordering::SeqCst) || input_done
    }

    /// Tells the standing route where the reader's capability is (`None`: let go).
    pub(super) fn advance_route(&self, time: Option<u64>) {
        if let Some(route) = &self.route {
            route.advance(time);
        }
    }

    /// Stops taking queries; commits once nothing is pending or held (true: the capability can go).
    pub(super) fn finish(&self) -> bool {
        if let Some(http) = &self.http {
            http.close();
        }
        if self.pending.is_empty() && self.waiting.is_empty() {
            #[cfg(feature = "kafka")]
            if let Some(kafka) = &self.kafka {
                kafka.commit();
            }
            true
        } else {
            self.activator.activate_after(Duration::from_millis(10));
            false
        }
    }

    /// Reads a batch at `time` (HTTP share, then Kafka up to 256), with offsets and lease epochs.
    pub(super) fn read_batch(&mut self, time: u64) -> (Batch, BTreeMap<i32, (i64, u64)>) {
        let mut batch: Vec<Result<QueryJob, Refusal>> = Vec::new();
        #[cfg_attr(
            not(feature = "kafka"),
            allow(unused_mut, reason = "offsets are the topic's")
        )]
        let mut offsets: BTreeMap<i32, (i64, u64)> = BTreeMap::new();
        let worker = self.worker;
        let sequence = &mut self.sequence;
        let mut job = |query: ragstream_core::query::Query, reply: Reply| {
            *sequence += 1;
            QueryJob::new(
                query,
                time,
                worker,
                (worker as u64) << 48 | *sequence,
                reply,
                BTreeMap::new(),
            )
        };
        if let Some(http) = &self.http {
            for (ticket, body) in http.drain() {
                batch.push(http_query(ticket, &body, &self.rules, &mut job));
            }
        }
        #[cfg(feature = "kafka")]
        if let Some(kafka) = &self.kafka {
            let reading = super::kafka::Reading {
                handover: &self.handover,
                rules: &self.rules,
                route: self.route.as_deref(),
            };
            kafka.read(time, reading, &mut batch, &mut offsets, &mut job);
        }
        (batch, offsets)
    }

    /// Parks a batch with read-your-writes queries in it until the documents topic's watermarks of
    /// now come back (with Kafka only); gives the batch back when it can go at once.
    fn hold_for_watermarks(
        &mut self,
        capability: &Capability<u64>,
        time: u64,
        batch: Batch,
    ) -> Option<Batch> {
        #[cfg(feature = "kafka")]
        if let Some(kafka) = &self.kafka {
            let reads_own_writes = batch.iter().any(|job| {
                job.as_ref()
                    .is_ok_and(|job| job.query.consistency == Consistency::ReadYourWrites)
            });
            if reads_own_writes {
                let marks = kafka.watermarks();
                self.waiting.park(capability.delayed(&time), batch, marks);
                return None;
            }
        }
        let _ = (capability, time);
        Some(batch)
    }

    /// Emits a batch at `time` (or holds it for its watermarks) and moves the capability past it.
    pub(super) fn emit(
        &mut self,
        capability: &mut Capability<u64>,
        time: u64,
        batch: Batch,
        offsets: BTreeMap<i32, (i64, u64)>,
        output: &mut QueryOutput<'_>,
    ) {
        let polled = batch.len();
        if polled > 0 {
            metrics().queries_received.inc_by(polled as u64);
            if let Some(batch) = self.hold_for_watermarks(capability, time, batch) {
                output
                    .session(&*capability)
                    .give_iterator(batch.into_iter());
            }
            if !offsets.is_empty() {
                self.pending.insert(time, offsets);
            }
            capability.downgrade(&(time + 1));
            self.activator.activate();
        } else if !offsets.is_empty() {
            // Events taken by the standing queries only: their offsets are stored as any batch's.
            self.pending.insert(time, offsets);
            capability.downgrade(&(time + 1));
            self.activator.activate();
        } else {
            self.activator.activate_after(Duration::from_millis(2));
        }
    }
}

/// Decodes a query posted over HTTP into its job, or its refusal.
// The `Err` side is a refusal flowing through the dataflow as data, not an error path.
#[allow(clippy::result_large_err)]
fn http_query(
    ticket: u64,
    body: &[u8],
    rules: &DecodeRules,
    job: &mut impl FnMut(ragstream_core::query::Query, Reply) -> QueryJob,
) -> Result<QueryJob, Refusal> {
    let reply = Reply::Http(ticket);
    match decode_timed(body, rules) {
        Ok(query) => Ok(job(query, reply)),
        Err(error) => Err(refusal(
            error,
            Origin::Http {
                endpoint: "POST /v1/query".into(),
            },
            None,
            body,
            reply,
        )),
    }
}
