//! The query source's state on one worker and what it does in each activation (see the parent
//! module for the guarantees it keeps).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::Message;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::operators::generic::OutputBuilderSession;
use timely::dataflow::operators::Capability;
use timely::dataflow::ProbeHandle;
use timely::scheduling::Activator;

use super::{
    decode_timed, refusal, wait_for, Batch, DecodeRules, HttpIngress, QueryConsumerContext,
    QueryKafkaConfig,
};
use crate::ingest::dlq::Origin;
use crate::io::query_ledger::{Handover, Lease};
use crate::metrics::metrics;
use crate::offload::{Background, Parked};
use crate::query::job::{QueryJob, Refusal, Reply};
use ragstream_core::query::Consistency;

/// The query source's output in one activation.
type QueryOutput<'a> =
    OutputBuilderSession<'a, u64, CapacityContainerBuilder<Vec<Result<QueryJob, Refusal>>>>;

/// One worker's query source between activations.
pub(super) struct QueryReader {
    pub(super) activator: Activator,
    pub(super) worker: usize,
    pub(super) kafka: Option<QueryKafkaConfig>,
    pub(super) http: Option<Arc<HttpIngress>>,
    pub(super) rules: DecodeRules,
    pub(super) published: ProbeHandle<u64>,
    pub(super) handover: Handover,
    pub(super) shutdown: Arc<AtomicBool>,
    pub(super) finite_ingest: Option<ProbeHandle<u64>>,
    /// The queries consumer, with `kafka` only.
    pub(super) consumer: Option<BaseConsumer<QueryConsumerContext>>,
    /// The read-your-writes watermarks fetcher, with `kafka` only.
    pub(super) watermarks: Option<Background<(), BTreeMap<i32, i64>>>,
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
    /// Stores the offsets of batches whose contexts are all published.
    pub(super) fn store_published_offsets(&mut self) {
        while let Some(entry) = self.pending.first_entry() {
            if self.published.less_equal(entry.key()) {
                break;
            }
            let (Some(consumer), Some(config)) = (self.consumer.as_ref(), self.kafka.as_ref())
            else {
                entry.remove();
                continue;
            };
            for (partition, (offset, epoch)) in entry.remove() {
                // A partition revoked since was committed at the revocation.
                if self.handover.ledger.holds(partition, epoch) {
                    let _ = consumer.store_offset(&config.topic, partition, offset);
                }
            }
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
            if let Some(consumer) = self.consumer.as_ref() {
                let _ = consumer.commit_consumer_state(CommitMode::Sync);
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
        if let (Some(consumer), Some(config)) = (self.consumer.as_ref(), self.kafka.as_ref()) {
            while batch.len() < 256 {
                match consumer.poll(Duration::ZERO) {
                    None => break,
                    Some(Err(error)) => {
                        tracing::warn!(%error, "queries poll error");
                        break;
                    }
                    Some(Ok(message)) => {
                        let lease = self
                            .handover
                            .ledger
                            .read(message.partition(), message.offset());
                        offsets.insert(message.partition(), (message.offset(), lease.epoch));
                        let payload = message.payload().unwrap_or_default();
                        if let Some(route) = self
                            .route
                            .as_ref()
                            .filter(|_| super::is_standing(payload, self.rules.max_bytes))
                        {
                            let origin = Origin::Kafka {
                                topic: config.topic.clone(),
                                partition: message.partition(),
                                offset: message.offset(),
                            };
                            route.push(time, message.key(), payload, origin);
                            continue;
                        }
                        batch.push(kafka_query(
                            &message,
                            &config.topic,
                            lease,
                            &self.rules,
                            &mut job,
                        ));
                    }
                }
            }
        }
        (batch, offsets)
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
            let reads_own_writes = batch.iter().any(|job| {
                job.as_ref()
                    .is_ok_and(|job| job.query.consistency == Consistency::ReadYourWrites)
            });
            match &self.watermarks {
                Some(fetcher) if reads_own_writes => {
                    let marks = fetcher.submit(());
                    self.waiting.park(capability.delayed(&time), batch, marks);
                }
                _ => output
                    .session(&*capability)
                    .give_iterator(batch.into_iter()),
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

/// Decodes a query read from the queries topic, answered under `lease`, into its job or refusal.
// The `Err` side is a refusal flowing through the dataflow as data, not an error path.
#[allow(clippy::result_large_err)]
fn kafka_query<M: Message>(
    message: &M,
    topic: &str,
    lease: Lease,
    rules: &DecodeRules,
    job: &mut impl FnMut(ragstream_core::query::Query, Reply) -> QueryJob,
) -> Result<QueryJob, Refusal> {
    let payload = message.payload().unwrap_or_default();
    let origin = Origin::Kafka {
        topic: topic.to_string(),
        partition: message.partition(),
        offset: message.offset(),
    };
    match decode_timed(payload, rules) {
        Ok(query) => Ok(job(query, Reply::Kafka(lease))),
        Err(error) => Err(refusal(
            error,
            origin,
            message.key(),
            payload,
            Reply::Kafka(lease),
        )),
    }
}
