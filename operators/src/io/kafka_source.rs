//! KafkaSource: document events from a Kafka topic, offsets stored only after the index acknowledged.
//!
//! Every worker runs one consumer of the same group, so the topic's partitions spread over the workers
//! (and over processes in a cluster). The source holds one capability; each poll batch is emitted at
//! time `max(now_ms, previous + 1)` and the capability then moves past it, so times are wall-clock
//! milliseconds shared by both flows.
//!
//! Delivery: `enable.auto.offset.store=false` — an offset is stored only when the ack probe (the frontier
//! of the index write and DLQ write operators, across all workers) has passed the time of the batch that
//! carried it. librdkafka then commits stored offsets in the background (`enable.auto.commit`) and on
//! shutdown we commit synchronously. A crash replays at most the unacknowledged tail: at-least-once into
//! an idempotent, version-guarded index.
//!
//! Rebalances: with the embedded index, each partition assigned to this source starts from the
//! index's own checkpoint ([`IndexCheckpoint`]) when it has one, not from the group's offset: a
//! partition that another instance consumed for a while and then gave back is replayed from where
//! this index left it, so nothing that instance saw is missing here. Checkpoints advance with the
//! stored offsets, whether or not the partition is still assigned. With a shared index (the Qdrant
//! server, written by every instance of the group) the source instead marks each assignment on a
//! second stream, [`Assigned`], at a time before any message of the assigned partitions: the version
//! guard reads the index again there ([`crate::ingest::guard`]), since another instance may have
//! written those partitions' documents since this one last saw them.
//!
//! Flow control: when more than `max_in_flight` messages (or `max_in_flight_bytes` of their payloads)
//! are unacknowledged, the assigned partitions are
//! paused (polling continues, so the group membership stays alive) and resumed once the index brought
//! them down to half of that. Pausing drops librdkafka's prefetched messages, so each resume costs a
//! fetch round trip; resuming at half keeps the job busy during that fetch instead of pausing and
//! resuming after every batch.
//!
//! Files: an event carrying a file (HTML, PDF, DOCX) is decoded on the worker but extracted by the
//! sandbox on the source's helper thread ([`crate::ingest::sandbox`]): its batch waits, its time's
//! capability held, and later batches wait behind it (polling goes on, within the flow control), so
//! batches leave in the order they were polled.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::{ClientConfig, Message};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::operators::generic::{source, OutputBuilderSession};
use timely::dataflow::operators::{Capability, OkErr};
use timely::dataflow::{ProbeHandle, Scope};
use timely::scheduling::Activator;

use super::checkpoint::IndexCheckpoint;
use super::query_source::IngestProgress;
use crate::ingest::decode::DecodeConfig;
use crate::ingest::dlq::DlqRecord;
use crate::metrics::metrics;
use crate::model::DocOp;
use crate::offload::{Background, Parked, Ticket};

mod consumer;
mod polled;

pub use crate::ingest::guard::Assigned;
pub use consumer::{consumer, group_client, LagContext};
use polled::{decode_message, Batch, Polled};

/// How long a poll batch keeps filling after its first message.
pub const BATCH_LINGER: Duration = Duration::from_millis(20);

/// Settings of the Kafka source.
#[derive(Clone)]
pub struct KafkaSourceConfig {
    /// Client settings (bootstrap servers, security) shared with producers.
    pub client: ClientConfig,
    /// The documents topic.
    pub topic: String,
    /// Consumer group.
    pub group_id: String,
    /// Most messages per poll batch.
    pub max_batch: usize,
    /// Unacknowledged messages above which partitions are paused (resumed at half of it).
    pub max_in_flight: usize,
    /// Unacknowledged payload bytes above which partitions are paused (resumed at half of it); a poll
    /// batch ends past half of it.
    pub max_in_flight_bytes: usize,
    /// librdkafka's prefetch per consumer, KiB (`queued.max.messages.kbytes`).
    pub prefetch_kbytes: usize,
    /// Wait between polls when the topic is idle.
    pub idle_poll: Duration,
    /// Group session timeout (see [`group_client`]).
    pub session_timeout: Duration,
    /// Static group membership: each worker joins as `<instance_id>-<worker>`, so a restarted job takes
    /// its predecessor's place at once instead of waiting for the broker to evict a dead member.
    pub instance_id: Option<String>,
    /// The embedded index's position per partition; `None` with a shared index (the Qdrant server),
    /// whose position is the group's offsets.
    pub checkpoint: Option<Arc<IndexCheckpoint>>,
}

impl std::fmt::Debug for KafkaSourceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client config may hold credentials: never print it.
        f.debug_struct("KafkaSourceConfig")
            .field("topic", &self.topic)
            .field("group_id", &self.group_id)
            .finish()
    }
}

fn now_after(previous: u64) -> u64 {
    crate::now_millis().max(previous)
}

pub use super::SourceStreams;

/// The source operator. `acks` is the probe of the index and DLQ writers; `shutdown` stops it gracefully.
pub fn kafka_source<'scope>(
    scope: Scope<'scope, u64>,
    config: KafkaSourceConfig,
    decode: DecodeConfig,
    acks: ProbeHandle<u64>,
    shutdown: Arc<AtomicBool>,
    progress: Arc<IngestProgress>,
) -> SourceStreams<'scope> {
    let items = source::<_, CapacityContainerBuilder<Vec<Item>>, _, _>(
        scope,
        "KafkaSource",
        move |cap, info| {
            let activator = scope.activator_for(info.address.clone());
            let consumer = consumer(&config, scope.index())
                .unwrap_or_else(|e| panic!("cannot create the Kafka consumer: {e}"));
            let mut cap = Some(cap);
            let files = {
                let decode = decode.clone();
                let waker = crate::offload::operator_waker(scope.worker(), &info.address);
                Background::start(
                    "kafka-files",
                    move |batch: Vec<Polled>, deliver| {
                        deliver.send(Polled::resolve_all(batch, &decode))
                    },
                    waker,
                )
            };
            let mut reader = DocumentReader {
                config,
                decode,
                files,
                parked: Parked::default(),
                acks,
                shutdown,
                progress,
                activator,
                consumer,
                pending: BTreeMap::new(),
                pending_count: BTreeMap::new(),
                polled_bytes: 0,
                paused: false,
                poll_failing: false,
                reported_in_flight: 0i64,
            };
            move |output| {
                let Some(capability) = cap.as_mut() else {
                    return;
                };
                // 1. Store offsets of acknowledged times.
                reader.store_acknowledged();
                let in_flight = reader.report_in_flight();
                // Batches whose files were extracted since (on shutdown too: what is in flight
                // finishes).
                reader.emit_extracted(output);
                if reader.shutdown.load(Ordering::SeqCst) {
                    if reader.finish() {
                        cap = None;
                    }
                    return;
                }
                // 2. Flow control.
                reader.flow_control(in_flight);
                // 3. Poll a batch.
                let time = now_after(*capability.time());
                capability.downgrade(&time);
                let (batch, offsets) = reader.poll_batch();
                reader.emit(capability, time, batch, offsets, output);
            }
        },
    );
    items.ok_err(|item| item)
}

/// What the source operator emits: a document event (or its DLQ record), or an assignment marker.
type Item = Result<Result<DocOp, DlqRecord>, Assigned>;
/// The source operator's output in one activation.
type ItemOutput<'a> = OutputBuilderSession<'a, u64, CapacityContainerBuilder<Vec<Item>>>;
/// Per partition, the first and last offset of a batch.
type BatchOffsets = BTreeMap<i32, (i64, i64)>;

/// One worker's Kafka source between activations.
struct DocumentReader {
    config: KafkaSourceConfig,
    decode: DecodeConfig,
    /// The helper thread that extracts files' events, and the batches waiting for it (each at its
    /// time; a batch without files waits behind one with).
    files: Background<Vec<Polled>, Batch>,
    parked: Parked<Capability<u64>, (), Batch>,
    acks: ProbeHandle<u64>,
    shutdown: Arc<AtomicBool>,
    progress: Arc<IngestProgress>,
    activator: Activator,
    consumer: BaseConsumer<LagContext>,
    /// time → (partition → (first, last) offset) of batches not yet acknowledged.
    pending: BTreeMap<u64, BTreeMap<i32, (i64, i64)>>,
    /// time → messages of the batch not yet acknowledged, and their payloads' bytes.
    pending_count: BTreeMap<u64, (usize, usize)>,
    /// Payload bytes of the last poll batch.
    polled_bytes: usize,
    /// Whether the assigned partitions are paused (flow control).
    paused: bool,
    /// Whether the last poll failed (its error is logged once).
    poll_failing: bool,
    /// This worker's share of the in-flight gauge.
    reported_in_flight: i64,
}

impl DocumentReader {
    /// Stores the offsets of the batches the ack probe passed and advances the index checkpoint.
    fn store_acknowledged(&mut self) {
        let mut stored = false;
        while let Some(entry) = self.pending.first_entry() {
            if self.acks.less_equal(entry.key()) {
                break;
            }
            let time = *entry.key();
            let mut positions = Vec::new();
            for (partition, (_, offset)) in entry.remove() {
                // Stores offset + 1 (the next to consume); fails only if the partition was revoked,
                // in which case its new owner replays from the last committed offset.
                if let Err(error) =
                    self.consumer
                        .store_offset(&self.config.topic, partition, offset)
                {
                    tracing::debug!(partition, offset, %error, "offset not stored (partition revoked?)");
                }
                positions.push((partition, offset + 1));
            }
            if let Some(checkpoint) = &self.config.checkpoint {
                // Behind is safe (a replay into an idempotent index); never crash the job for it.
                if let Err(error) = checkpoint.advance(&positions) {
                    tracing::warn!(%error, "index checkpoint not written");
                }
            }
            self.pending_count.remove(&time);
            stored = true;
        }
        if stored {
            crate::faults::fail_point(crate::faults::AFTER_OFFSET_STORE);
        }
    }

    /// Counts the messages (and their payload bytes) in flight and updates the in-flight and
    /// frontier lag metrics.
    fn report_in_flight(&mut self) -> (usize, usize) {
        let (in_flight, bytes) = self
            .pending_count
            .values()
            .fold((0usize, 0usize), |(count, bytes), (c, b)| {
                (count.saturating_add(*c), bytes.saturating_add(*b))
            });
        // The gauge is the process's total: each worker adds the change of its own count.
        metrics().in_flight_messages.add(
            in_flight as i64 - std::mem::replace(&mut self.reported_in_flight, in_flight as i64),
        );
        if let Ok(frontier) = self.acks.with_frontier(|f| f.first().copied().ok_or(())) {
            let lag = crate::now_millis().saturating_sub(frontier) as f64 / 1000.0;
            metrics().ingest_frontier_lag_seconds.set(lag);
        }
        (in_flight, bytes)
    }

    /// On shutdown: commits once nothing is in flight (true: the capability can go), else waits.
    fn finish(&self) -> bool {
        // Graceful stop: poll nothing more, wait for what is in flight, commit, release.
        if self.pending.is_empty() {
            if let Err(error) = self.consumer.commit_consumer_state(CommitMode::Sync) {
                tracing::debug!(%error, "final commit");
            }
            true
        } else {
            self.activator.activate_after(Duration::from_millis(10));
            false
        }
    }

    /// Pauses the assigned partitions above `max_in_flight` in flight, resumes them at half of it;
    /// after a rebalance, applies the state to the whole new assignment.
    fn flow_control(&mut self, (in_flight, bytes): (usize, usize)) {
        let over = over_limits(
            self.paused,
            (in_flight, bytes),
            (self.config.max_in_flight, self.config.max_in_flight_bytes),
        );
        let reassigned = self
            .consumer
            .context()
            .reassigned
            .swap(false, Ordering::SeqCst);
        if over != self.paused || reassigned {
            let applied = self.consumer.assignment().ok().is_some_and(|assignment| {
                if over {
                    self.consumer.pause(&assignment).is_ok()
                } else {
                    self.consumer.resume(&assignment).is_ok()
                }
            });
            if !applied {
                // Tried again at the next activation.
                if reassigned {
                    self.consumer
                        .context()
                        .reassigned
                        .store(true, Ordering::SeqCst);
                }
            } else if over != self.paused {
                self.paused = over;
                tracing::info!(paused = self.paused, in_flight, bytes, "flow control");
            }
        }
    }

    /// Emits the waiting batches whose files were extracted, in the order they were polled.
    fn emit_extracted(&mut self, output: &mut ItemOutput<'_>) {
        for (held, (), batch) in self.parked.ready_in_order() {
            output
                .session(&held)
                .give_iterator(batch.into_iter().map(Ok));
        }
    }

    /// Polls a batch of decoded messages, with the first and last offset polled per partition.
    fn poll_batch(&mut self) -> (Vec<Polled>, BatchOffsets) {
        let mut batch = Vec::new();
        let mut offsets: BTreeMap<i32, (i64, i64)> = BTreeMap::new();
        // Fill the batch for up to `BATCH_LINGER` once a first message arrived: larger batches embed
        // with less padding per forward pass, at a bounded cost in latency.
        let mut first_at: Option<std::time::Instant> = None;
        let mut bytes = 0usize;
        while batch.len() < self.config.max_batch && bytes <= self.config.max_in_flight_bytes / 2 {
            let lingering = first_at.is_some_and(|at| at.elapsed() < BATCH_LINGER);
            if first_at.is_some() && !lingering {
                break;
            }
            let wait = if lingering {
                Duration::from_millis(2)
            } else {
                Duration::from_millis(1)
            };
            match self.consumer.poll(wait) {
                None if lingering => continue,
                None => break,
                Some(Err(error)) => {
                    // Once per failure, not once per poll: the consumer retries by itself.
                    if !self.poll_failing {
                        tracing::warn!(%error, "kafka poll error (logged once until polling works again)");
                        self.poll_failing = true;
                    }
                    break;
                }
                Some(Ok(message)) => {
                    if std::mem::take(&mut self.poll_failing) {
                        tracing::info!("kafka polling works again");
                    }
                    first_at.get_or_insert_with(std::time::Instant::now);
                    offsets
                        .entry(message.partition())
                        .and_modify(|(_, last)| *last = message.offset())
                        .or_insert((message.offset(), message.offset()));
                    bytes = bytes.saturating_add(message.payload_len());
                    batch.push(decode_message(&message, &self.decode));
                }
            }
        }
        self.polled_bytes = bytes;
        (batch, offsets)
    }

    /// Emits any assignment marker then the batch, publishes progress, schedules the next poll.
    fn emit(
        &mut self,
        capability: &mut Capability<u64>,
        time: u64,
        batch: Vec<Polled>,
        offsets: BatchOffsets,
        output: &mut ItemOutput<'_>,
    ) {
        let polled = batch.len();
        let mut time = time;
        if self
            .consumer
            .context()
            .assigned
            .swap(false, Ordering::SeqCst)
        {
            // The marker goes first; this poll's messages (the assigned partitions' first ones
            // among them) follow at a later time.
            output.session(&*capability).give(Err(()));
            time += 1;
            capability.downgrade(&time);
        }
        if !batch.is_empty() {
            let files = batch.iter().any(|polled| matches!(polled, Polled::File(_)));
            if files {
                // Extracted off the worker; emitted at this time once done.
                let ticket = self.files.submit(batch);
                self.parked.park(capability.clone(), (), ticket);
            } else {
                let done = batch.into_iter().filter_map(|polled| match polled {
                    Polled::Done(done) => Some(done),
                    Polled::File(_) => None,
                });
                if self.parked.is_empty() {
                    output.session(&*capability).give_iterator(done.map(Ok));
                } else {
                    // Behind a batch whose files are still being extracted.
                    let ready = Ticket::ready(done.collect());
                    self.parked.park(capability.clone(), (), ready);
                }
            }
            self.pending.insert(time, offsets);
            self.pending_count.insert(time, (polled, self.polled_bytes));
            // Counted in flight before they are counted polled: a reader of the two metrics never
            // sees them polled and not in flight.
            self.report_in_flight();
            // The batch's time can now complete.
            capability.downgrade(&(time + 1));
            crate::faults::fail_point(crate::faults::AFTER_CONSUME);
        }
        metrics().source_events.inc_by(polled as u64);
        publish_progress(&self.consumer, &self.pending, &self.progress);
        if polled > 0 {
            self.activator.activate();
        } else {
            self.activator.activate_after(self.config.idle_poll);
        }
    }
}

/// Whether a source with `(messages, bytes)` in flight should be paused under `(max messages, max
/// bytes)`: past either limit; once paused, until both are down to half of theirs.
fn over_limits(
    paused: bool,
    (messages, bytes): (usize, usize),
    (most, most_bytes): (usize, usize),
) -> bool {
    if paused {
        messages > most / 2 || bytes > most_bytes / 2
    } else {
        messages > most || bytes > most_bytes
    }
}

/// Publishes, per assigned partition, the next offset not yet acknowledged by the index: the first
/// offset of its oldest pending batch, or the consumer's position when nothing of it is pending.
fn publish_progress<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    pending: &BTreeMap<u64, BTreeMap<i32, (i64, i64)>>,
    progress: &IngestProgress,
) {
    let Ok(positions) = consumer.position() else {
        return;
    };
    let mut acknowledged: BTreeMap<i32, i64> = BTreeMap::new();
    for element in positions.elements() {
        if let rdkafka::Offset::Offset(offset) = element.offset() {
            acknowledged.insert(element.partition(), offset);
        }
    }
    for batch in pending.values() {
        for (partition, (first, _)) in batch {
            let entry = acknowledged.entry(*partition).or_insert(*first);
            *entry = (*entry).min(*first);
        }
    }
    let mut offsets = progress.offsets.lock().expect("progress");
    for (partition, offset) in acknowledged {
        offsets.insert(partition, offset);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumption_pauses_past_either_limit_and_resumes_below_half_of_both() {
        let limits = (5000, 256 << 20);
        // A few large documents pause it as surely as many small ones.
        assert!(!over_limits(false, (5000, 100 << 20), limits));
        assert!(over_limits(false, (5001, 1 << 20), limits));
        assert!(over_limits(false, (40, (256 << 20) + 1), limits));
        // Paused: resumed only once both are down to half.
        assert!(over_limits(true, (2501, 1 << 20), limits));
        assert!(over_limits(true, (10, (128 << 20) + 1), limits));
        assert!(!over_limits(true, (2500, 128 << 20), limits));
    }

    #[test]
    fn the_session_timeout_sets_the_heartbeat() {
        for (session, heartbeat) in [
            (3_000, "300"),
            (10_000, "1000"),
            (30_000, "3000"),
            (300_000, "3000"),
        ] {
            let client = group_client(
                &ClientConfig::new(),
                "g",
                None,
                Duration::from_millis(session),
            );
            assert_eq!(
                client.get("session.timeout.ms"),
                Some(session.to_string().as_str())
            );
            assert_eq!(client.get("heartbeat.interval.ms"), Some(heartbeat));
            assert_eq!(client.get("enable.auto.offset.store"), Some("false"));
        }
    }
}
