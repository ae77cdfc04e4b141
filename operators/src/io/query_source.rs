//! QuerySource: query events from the queries topic and from `POST /v1/query` (and the routes and tools built on it), decoded and timestamped.
//!
//! Every worker runs one consumer of the queries group (partitions spread over workers); worker 0 also
//! drains the HTTP ingress queue. Queries are emitted at time `max(now_ms, previous + 1)`, the same
//! clock as the document events. A query offset is stored only once the context of every query of its
//! batch has been published (the `published` probe passed the batch's time). Each query read takes a
//! lease in the publisher's [`QueryLedger`](super::query_ledger::QueryLedger); when the group revokes
//! partitions, the consumer's rebalance callback commits them up to their first query not answered and
//! ends the leases of the rest, which their next owner answers (see [`super::query_ledger`]).
//!
//! Read-your-writes: when a query asks for it and documents come from Kafka, the source records the
//! documents topic's high watermarks fetched after the query was read (on a helper thread: the worker
//! never waits for the broker). Its batch is held, with a capability at its time, until they come;
//! later batches go on, and their offsets are stored only after the held batch's (the `published`
//! probe cannot pass a time still held). The query then waits until the index acknowledged every offset
//! below them (see [`crate::query::consistency`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::kafka_log::{log_client_error, ErrorDedup, QuietContext};
use super::query_ledger::Handover;
use rdkafka::{ClientConfig, ClientContext};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::operators::generic::source;
use timely::dataflow::{ProbeHandle, Scope, StreamVec};

use crate::ingest::dlq::{DlqRecord, Origin};
use crate::metrics::metrics;
use crate::offload::{Background, Deliver, Parked};
use crate::query::job::{QueryJob, Refusal, Reply};
use ragstream_core::query::decode::QueryError;
use ragstream_core::query::{Consistency, Context, QueryConfig};
use reader::QueryReader;

mod reader;
pub mod route;

/// Requests from the HTTP server waiting for their contexts.
#[derive(Debug, Default)]
pub struct HttpIngress {
    queue: Mutex<VecDeque<(u64, Vec<u8>)>>,
    replies: Mutex<HashMap<u64, Waiting>>,
    next: AtomicU64,
    /// Workers of this process that drain the queue (each takes its share per activation).
    drainers: AtomicUsize,
    /// Set once the job stops taking queries.
    closed: AtomicBool,
    /// The context caches of this process's workers (the operations tools read and clear them).
    pub caches: crate::query::caches::CacheRegistry,
    /// `force_reindex` over this process's shards (set once the job has opened them).
    pub reindex: std::sync::OnceLock<Arc<crate::ingest::reindex::Reindexer>>,
}

/// A request in the dataflow: where its context goes (`None` once its caller stopped waiting), and
/// what it holds until the dataflow answers it (the HTTP server's slot among the queries in
/// flight, so a caller that goes away does not make room for more work than the cap).
#[derive(Debug)]
struct Waiting {
    sender: Option<mpsc::Sender<Context>>,
    _hold: Option<Box<dyn std::any::Any + Send>>,
    since: Instant,
    /// Asked by the job itself (a standing query's evaluation): answered to its caller only, not
    /// published on the contexts topic.
    internal: bool,
}

/// Forgets its request when dropped ([`HttpIngress::submit_guarded`]).
#[derive(Debug)]
pub struct Abandon {
    ingress: Arc<HttpIngress>,
    ticket: u64,
}

impl Drop for Abandon {
    fn drop(&mut self) {
        self.ingress.abandon(self.ticket);
    }
}

/// How long an abandoned request that the dataflow never answered keeps its hold: a bound on what
/// a lost answer could cost, far past any query's round trip (the HTTP wait is 120 s).
const HOLD_AT_MOST: Duration = Duration::from_secs(600);

impl HttpIngress {
    /// Queues a query body; the receiver gets its context. Once the ingress is closed (the job is
    /// stopping) the receiver is disconnected at once.
    pub fn submit(&self, body: Vec<u8>) -> (u64, mpsc::Receiver<Context>) {
        self.submit_holding(body, None)
    }

    /// [`Self::submit`] for the job's own questions (a standing query's evaluation): the context
    /// goes to the receiver only, never to the contexts topic.
    pub fn submit_internal(&self, body: Vec<u8>) -> (u64, mpsc::Receiver<Context>) {
        self.queue_request(body, None, true)
    }

    /// Whether request `ticket` is one of the job's own ([`Self::submit_internal`]).
    pub fn is_internal(&self, ticket: u64) -> bool {
        self.replies
            .lock()
            .expect("replies")
            .get(&ticket)
            .is_some_and(|waiting| waiting.internal)
    }

    /// [`Self::submit`], keeping `hold` until the dataflow answers the request (or, abandoned and
    /// never answered, for [`HOLD_AT_MOST`]), whether or not its caller still waits.
    pub fn submit_holding(
        &self,
        body: Vec<u8>,
        hold: Option<Box<dyn std::any::Any + Send>>,
    ) -> (u64, mpsc::Receiver<Context>) {
        self.queue_request(body, hold, false)
    }

    fn queue_request(
        &self,
        body: Vec<u8>,
        hold: Option<Box<dyn std::any::Any + Send>>,
        internal: bool,
    ) -> (u64, mpsc::Receiver<Context>) {
        let ticket = self.next.fetch_add(1, Ordering::SeqCst);
        let (sender, receiver) = mpsc::channel();
        let mut queue = self.queue.lock().expect("queue");
        if !self.closed.load(Ordering::SeqCst) {
            let mut replies = self.replies.lock().expect("replies");
            replies.retain(|_, waiting| {
                waiting.sender.is_some() || waiting.since.elapsed() < HOLD_AT_MOST
            });
            replies.insert(
                ticket,
                Waiting {
                    sender: Some(sender),
                    _hold: hold,
                    since: Instant::now(),
                    internal,
                },
            );
            queue.push_back((ticket, body));
        }
        (ticket, receiver)
    }

    /// Stops taking queries: requests still queued and later ones are disconnected (the HTTP server
    /// answers 503); those already in the dataflow are still answered.
    pub fn close(&self) {
        let mut queue = self.queue.lock().expect("queue");
        self.closed.store(true, Ordering::SeqCst);
        let mut replies = self.replies.lock().expect("replies");
        for (ticket, _) in queue.drain(..) {
            replies.remove(&ticket);
        }
    }

    /// [`Self::submit_holding`] for a caller that may go away: dropping the returned guard (the
    /// caller's handler dropped, or done waiting) forgets the request ([`Self::abandon`]; a no-op
    /// once it was answered).
    pub fn submit_guarded(
        self: &Arc<Self>,
        body: Vec<u8>,
        hold: Option<Box<dyn std::any::Any + Send>>,
    ) -> (Abandon, mpsc::Receiver<Context>) {
        let (ticket, receiver) = self.submit_holding(body, hold);
        (
            Abandon {
                ingress: self.clone(),
                ticket,
            },
            receiver,
        )
    }

    /// Forgets a request whose caller stopped waiting: one still queued leaves the queue (and
    /// drops its hold); one in the dataflow keeps its hold until answered.
    pub fn abandon(&self, ticket: u64) {
        let mut queue = self.queue.lock().expect("queue");
        let mut replies = self.replies.lock().expect("replies");
        if let Some(at) = queue.iter().position(|(queued, _)| *queued == ticket) {
            queue.remove(at);
            replies.remove(&ticket);
        } else if let Some(waiting) = replies.get_mut(&ticket) {
            waiting.sender = None;
            waiting.since = Instant::now();
        }
    }

    /// Hands a context to the waiting request, if it still waits, and drops what it held.
    pub fn reply(&self, ticket: u64, context: Context) {
        let waiting = self.replies.lock().expect("replies").remove(&ticket);
        if let Some(Waiting {
            sender: Some(sender),
            ..
        }) = waiting
        {
            let _ = sender.send(context);
        }
    }

    /// Registers a worker that drains the queue.
    fn register(&self) {
        self.drainers.fetch_add(1, Ordering::SeqCst);
    }

    /// This worker's share of what is queued: an even split over the draining workers, so a burst of
    /// requests is answered by all of them rather than by whichever polled first.
    fn drain(&self) -> Vec<(u64, Vec<u8>)> {
        let mut queue = self.queue.lock().expect("queue");
        let drainers = self.drainers.load(Ordering::SeqCst).max(1);
        let share = queue.len().div_ceil(drainers);
        queue.drain(..share).collect()
    }
}

pub use ragstream_core::progress::IngestProgress;
use ragstream_core::progress::COMMITTED_REFRESH;

/// Settings of the Kafka side of the query source.
#[derive(Clone)]
pub struct QueryKafkaConfig {
    /// Client settings.
    pub client: ClientConfig,
    /// The queries topic.
    pub topic: String,
    /// The documents topic (for read-your-writes watermarks).
    pub documents_topic: String,
    /// The documents consumer group (its committed offsets tell what other processes indexed).
    pub documents_group: String,
    /// Consumer group.
    pub group_id: String,
    /// Static membership id prefix.
    pub instance_id: Option<String>,
    /// Group session timeout (see [`super::kafka_source::group_client`]).
    pub session_timeout: Duration,
    /// Where query events with a `standing` object go instead of the dataflow (`None`: standing
    /// queries are off; such events are decoded as queries and refused).
    pub standing: Option<Arc<dyn StandingIntake>>,
}

/// The registry of standing queries, as the queries topic's reader hands it the events that
/// subscribe or unsubscribe (a top-level `standing` object).
pub trait StandingIntake: Send + Sync {
    /// Takes a standing event (its key and value) and answers at once: the registry does the work
    /// on a thread of its own (a worker never waits on it), refusing what it cannot take with a DLQ
    /// record of its own. The event's offset is stored as any query's.
    fn take(&self, key: Option<&[u8]>, payload: &[u8], origin: Origin);
}

/// Whether a query event's top-level object has a `standing` member (looked at only in events that
/// hold the word, and at most `max_bytes` long: larger ones go on to the decoder's refusal).
pub fn is_standing(payload: &[u8], max_bytes: usize) -> bool {
    const WORD: &[u8] = b"\"standing\"";
    payload.len() <= max_bytes
        && payload.windows(WORD.len()).any(|window| window == WORD)
        && serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(payload)
            .is_ok_and(|event| event.contains_key("standing"))
}

/// The queries consumer's context: errors logged as [`QuietContext`] does, and the handover of
/// revoked partitions.
struct QueryConsumerContext {
    errors: ErrorDedup,
    topic: String,
    handover: Handover,
}

impl ClientContext for QueryConsumerContext {
    fn error(&self, error: KafkaError, reason: &str) {
        log_client_error(&self.errors, "queries consumer", error, reason);
    }
}

impl ConsumerContext for QueryConsumerContext {
    /// Before partitions move: the contexts sent are flushed to the broker, each revoked partition is
    /// stored and committed up to its first query not answered, and the leases of its queries in
    /// flight end (their contexts are dropped; the next owner answers them).
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(revoked) = rebalance else {
            return;
        };
        let partitions: Vec<i32> = revoked
            .elements_for_topic(&self.topic)
            .iter()
            .map(|element| element.partition())
            .collect();
        let flushed = (self.handover.flush)();
        let commit = self.handover.ledger.revoke(&partitions);
        if !flushed {
            // Committing past contexts not on the broker could lose them: the next owner answers
            // these queries again instead.
            tracing::warn!(
                ?partitions,
                "contexts not acknowledged before a revocation; its queries may be answered twice"
            );
            return;
        }
        if commit.is_empty() {
            return;
        }
        let mut list = TopicPartitionList::new();
        for (partition, offset) in &commit {
            if let Err(error) =
                list.add_partition_offset(&self.topic, *partition, Offset::Offset(*offset))
            {
                tracing::warn!(%error, partition, "cannot list a revoked partition's offset");
            }
        }
        // Stored too: the automatic commit when the partitions go must not take an older offset.
        let stored = consumer.store_offsets(&list);
        match stored.and_then(|()| consumer.commit(&list, CommitMode::Sync)) {
            Ok(()) => tracing::info!(?commit, "revoked query partitions committed"),
            Err(error) => {
                tracing::warn!(%error, ?commit, "cannot commit revoked query partitions")
            }
        }
    }
}

/// Documents-topic high watermarks, with the partition list refreshed every 30 s, and the documents
/// group's committed offsets (`group`: a client of that group that never joins it, only reads).
struct Watermarks {
    consumer: BaseConsumer<QuietContext>,
    group: BaseConsumer<QuietContext>,
    topic: String,
    partitions: Vec<i32>,
    listed: Option<Instant>,
}

impl Watermarks {
    /// Reads the documents group's committed offsets into `progress` when a read is due (one per
    /// [`COMMITTED_REFRESH`] per process); on a helper thread.
    fn refresh_committed(&mut self, progress: &IngestProgress) {
        if self.partitions.is_empty() || !progress.claim_refresh() {
            return;
        }
        let mut wanted = TopicPartitionList::new();
        for &partition in &self.partitions {
            wanted.add_partition(&self.topic, partition);
        }
        if let Ok(committed) = self.group.committed_offsets(wanted, Duration::from_secs(2)) {
            progress.set_committed(
                committed
                    .elements()
                    .iter()
                    .filter_map(|e| match e.offset() {
                        Offset::Offset(offset) => Some((e.partition(), offset)),
                        _ => None,
                    })
                    .collect(),
            );
        }
    }

    /// Lists the topic's partitions when the list is missing or 30 s old.
    fn list(&mut self) {
        if self
            .listed
            .is_none_or(|at| at.elapsed() > Duration::from_secs(30))
        {
            if let Ok(metadata) = self
                .consumer
                .fetch_metadata(Some(&self.topic), Duration::from_secs(2))
            {
                self.partitions = metadata
                    .topics()
                    .iter()
                    .flat_map(|t| t.partitions().iter().map(|p| p.id()))
                    .collect();
                self.listed = Some(Instant::now());
            }
        }
    }

    /// The high watermark of every partition that answers (2 s each at most).
    fn fetch(&mut self) -> BTreeMap<i32, i64> {
        self.list();
        self.partitions
            .iter()
            .filter_map(|&p| {
                self.consumer
                    .fetch_watermarks(&self.topic, p, Duration::from_secs(2))
                    .ok()
                    .map(|(_, high)| (p, high))
            })
            .collect()
    }
}

/// Query jobs and refusals read together.
type Batch = Vec<Result<QueryJob, Refusal>>;

/// Sets the watermarks every read-your-writes query of `batch` waits for.
fn wait_for(batch: &mut [Result<QueryJob, Refusal>], marks: &BTreeMap<i32, i64>) {
    for job in batch.iter_mut().flatten() {
        if job.query.consistency == Consistency::ReadYourWrites {
            job.wait_for = marks.clone();
        }
    }
}

/// What a query event is checked against as it is decoded.
#[derive(Debug, Clone)]
pub struct DecodeRules {
    /// Longest accepted event, in bytes (`query.max_query_bytes`).
    pub max_bytes: usize,
    /// The presets a query may name (`default` and the job's, [`QueryConfig::preset_names`]).
    pub presets: Vec<String>,
}

impl DecodeRules {
    /// The rules of a job's query section.
    pub fn of(config: &QueryConfig) -> Self {
        Self {
            max_bytes: config.max_query_bytes,
            presets: config.preset_names(),
        }
    }
}

/// Decodes a query event, recording the `decode` stage's seconds.
fn decode_timed(
    payload: &[u8],
    rules: &DecodeRules,
) -> Result<ragstream_core::query::Query, QueryError> {
    let started = Instant::now();
    let decoded =
        ragstream_core::query::decode::decode_query(payload, rules.max_bytes).and_then(|query| {
            ragstream_core::query::decode::check_preset(&query, &rules.presets)?;
            Ok(query)
        });
    metrics()
        .query_stage_seconds
        .with_label_values(&["decode"])
        .observe(started.elapsed().as_secs_f64());
    decoded
}

fn refusal(
    error: QueryError,
    origin: Origin,
    key: Option<&[u8]>,
    payload: &[u8],
    reply: Reply,
) -> Refusal {
    Refusal {
        dlq: DlqRecord::new(
            error.reason,
            error.message.clone(),
            origin,
            error.tenant.clone(),
            key,
            Some(payload),
        ),
        error,
        reply,
    }
}

/// The source. `http` is drained by every worker given it (each takes its share of the queue);
/// `kafka` is consumed by every worker. With
/// `finite_ingest`, the source stops once that probe is done (a JSONL input fully indexed).
#[allow(clippy::too_many_arguments)]
pub fn query_source<'scope>(
    scope: Scope<'scope, u64>,
    kafka: Option<QueryKafkaConfig>,
    http: Option<Arc<HttpIngress>>,
    rules: DecodeRules,
    published: ProbeHandle<u64>,
    progress: Arc<IngestProgress>,
    handover: Handover,
    shutdown: Arc<AtomicBool>,
    finite_ingest: Option<ProbeHandle<u64>>,
) -> StreamVec<'scope, u64, Result<QueryJob, Refusal>> {
    // Standing events go to the worker owning their subscription ([`route`]).
    let route = kafka
        .as_ref()
        .and_then(|config| config.standing.clone())
        .map(|intake| route::route(scope, intake, &published));
    source::<_, CapacityContainerBuilder<Vec<_>>, _, _>(scope, "QuerySource", move |cap, info| {
        let activator = scope.activator_for(info.address.clone());
        let worker = scope.index();
        if let Some(http) = &http {
            http.register();
        }
        let consumer = kafka
            .as_ref()
            .map(|config| queries_consumer(config, worker, &handover));
        // Read-your-writes: the documents topic's high watermarks, fetched on a helper thread (a
        // broker that does not answer costs seconds per partition, which a worker must not wait).
        // The same thread reads the documents group's committed offsets, for the cache and for
        // read-your-writes queries whose partitions other processes consume.
        let watermarks = kafka
            .as_ref()
            .map(|config| start_watermarks(config, &progress, scope.worker(), &info.address));
        let mut cap = (consumer.is_some() || http.is_some()).then_some(cap);
        let mut reader = QueryReader {
            activator,
            worker,
            kafka,
            http,
            rules,
            published,
            handover,
            shutdown,
            finite_ingest,
            consumer,
            watermarks,
            waiting: Parked::default(),
            pending: BTreeMap::new(),
            sequence: 0u64,
            route,
        };
        move |output| {
            let Some(capability) = cap.as_mut() else {
                return;
            };
            reader.store_published_offsets();
            reader.release_held(output);
            if reader.stopping() {
                if reader.finish() {
                    cap = None;
                    reader.advance_route(None);
                }
                return;
            }
            let time = crate::now_millis().max(*capability.time());
            capability.downgrade(&time);
            let (batch, offsets) = reader.read_batch(time);
            reader.emit(capability, time, batch, offsets, output);
            reader.advance_route(Some(*capability.time()));
        }
    })
}

/// Builds the queries consumer of `worker` (subscribed), handing revoked partitions over.
fn queries_consumer(
    config: &QueryKafkaConfig,
    worker: usize,
    handover: &Handover,
) -> BaseConsumer<QueryConsumerContext> {
    let member = config
        .instance_id
        .as_ref()
        .map(|instance| format!("{instance}-queries-{worker}"));
    let context = QueryConsumerContext {
        errors: ErrorDedup::default(),
        topic: config.topic.clone(),
        handover: handover.clone(),
    };
    let consumer: BaseConsumer<QueryConsumerContext> = super::kafka_source::group_client(
        &config.client,
        &config.group_id,
        member,
        config.session_timeout,
    )
    .create_with_context(context)
    .unwrap_or_else(|e| panic!("cannot create the queries consumer: {e}"));
    consumer
        .subscribe(&[&config.topic])
        .unwrap_or_else(|e| panic!("cannot subscribe to {}: {e}", config.topic));
    consumer
}

/// Starts the helper thread fetching watermarks and refreshing committed offsets into `progress`.
fn start_watermarks(
    config: &QueryKafkaConfig,
    progress: &Arc<IngestProgress>,
    worker: &timely::worker::Worker,
    address: &[usize],
) -> Background<(), BTreeMap<i32, i64>> {
    let mut marks = Watermarks {
        consumer: config
            .client
            .clone()
            .create_with_context(QuietContext::new("watermark client"))
            .unwrap_or_else(|e| panic!("cannot create the watermark client: {e}")),
        group: config
            .client
            .clone()
            .set("group.id", &config.documents_group)
            .set("enable.auto.commit", "false")
            .create_with_context(QuietContext::new("committed offsets reader"))
            .unwrap_or_else(|e| panic!("cannot create the committed offsets reader: {e}")),
        topic: config.documents_topic.clone(),
        partitions: Vec::new(),
        listed: None,
    };
    let progress = progress.clone();
    let waker = crate::offload::operator_waker(worker, address);
    Background::start_idle(
        "watermarks",
        Some(COMMITTED_REFRESH),
        move |job: Option<()>, deliver: &Deliver<BTreeMap<i32, i64>>| {
            if job.is_some() {
                deliver.send(marks.fetch());
            } else {
                marks.list();
            }
            marks.refresh_committed(&progress);
        },
        waker,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_draining_worker_takes_its_share_of_the_http_queue() {
        let ingress = HttpIngress::default();
        ingress.register();
        ingress.register();
        let _receivers: Vec<_> = (0..5)
            .map(|i| ingress.submit(format!("q{i}").into_bytes()).1)
            .collect();
        let first = ingress.drain();
        let second = ingress.drain();
        assert_eq!(first.len(), 3, "half of 5, rounded up");
        assert_eq!(second.len(), 1, "half of the 2 left");
        assert_eq!(ingress.drain().len(), 1);
        assert!(ingress.drain().is_empty());
        let tickets: Vec<u64> = first.iter().chain(&second).map(|(t, _)| *t).collect();
        assert_eq!(tickets, vec![0, 1, 2, 3], "in arrival order");
    }

    #[test]
    fn a_request_holds_its_slot_until_answered_even_when_its_caller_went_away() {
        let ingress = HttpIngress::default();
        ingress.register();
        let slot = Arc::new(());
        let held = || Arc::strong_count(&slot) - 1;
        let hold = |slot: &Arc<()>| Some(Box::new(slot.clone()) as Box<dyn std::any::Any + Send>);
        // Abandoned while queued: it leaves the queue (the dataflow never sees it) and its hold goes.
        let (queued, _) = ingress.submit_holding(b"q0".to_vec(), hold(&slot));
        assert_eq!(held(), 1);
        ingress.abandon(queued);
        assert_eq!(held(), 0);
        assert!(
            ingress.drain().is_empty(),
            "an abandoned request is not run"
        );
        // Abandoned once in the dataflow: its caller is told at once, its hold stays until the
        // dataflow answers it.
        let (running, receiver) = ingress.submit_holding(b"q1".to_vec(), hold(&slot));
        assert_eq!(ingress.drain().len(), 1);
        ingress.abandon(running);
        assert_eq!(
            receiver.recv_timeout(Duration::from_millis(10)),
            Err(mpsc::RecvTimeoutError::Disconnected)
        );
        assert_eq!(held(), 1, "still running: still counted");
        ingress.reply(running, Context::default());
        assert_eq!(held(), 0);
        // Answered while waited for: the context goes to the caller, the hold is dropped.
        let (answered, receiver) = ingress.submit_holding(b"q2".to_vec(), hold(&slot));
        assert_eq!(ingress.drain().len(), 1);
        ingress.reply(answered, Context::default());
        assert!(receiver.recv_timeout(Duration::from_millis(10)).is_ok());
        assert_eq!(held(), 0);
        // The guard abandons its request when dropped (a caller's handler that went away).
        let ingress = Arc::new(ingress);
        let (guard, _receiver) = ingress.submit_guarded(b"q3".to_vec(), hold(&slot));
        assert_eq!(held(), 1);
        drop(guard);
        assert_eq!(held(), 0);
        assert!(ingress.drain().is_empty());
    }

    #[test]
    fn closing_disconnects_queued_and_later_requests_but_not_drained_ones() {
        let ingress = HttpIngress::default();
        ingress.register();
        let (drained_ticket, drained) = ingress.submit(b"first".to_vec());
        assert_eq!(ingress.drain().len(), 1);
        let (_, queued) = ingress.submit(b"second".to_vec());
        ingress.close();
        let (_, later) = ingress.submit(b"third".to_vec());
        assert!(
            ingress.drain().is_empty(),
            "nothing is handed to the dataflow after closing"
        );
        for receiver in [&queued, &later] {
            assert_eq!(
                receiver.recv_timeout(Duration::from_millis(10)),
                Err(mpsc::RecvTimeoutError::Disconnected)
            );
        }
        // The request already in the dataflow still gets its context.
        ingress.reply(drained_ticket, Context::default());
        assert!(drained.recv_timeout(Duration::from_millis(10)).is_ok());
    }
}
