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

use super::query_ledger::Handover;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::operators::generic::source;
use timely::dataflow::{ProbeHandle, Scope, StreamVec};

use crate::ingest::dlq::{DlqRecord, Origin};
use crate::metrics::metrics;
use crate::offload::Parked;
use crate::query::job::{QueryJob, Refusal, Reply};
use ragstream_core::query::decode::QueryError;
use ragstream_core::query::{Consistency, Context, QueryConfig};
use reader::QueryReader;

#[cfg(feature = "kafka")]
mod kafka;
mod reader;
pub mod route;

#[cfg(feature = "kafka")]
pub use kafka::QueryKafkaConfig;

/// Without the `kafka` feature there is no queries topic: no value of this type exists, so a
/// query source is never given one.
#[cfg(not(feature = "kafka"))]
#[derive(Clone, Debug)]
pub enum QueryKafkaConfig {}

#[cfg(not(feature = "kafka"))]
impl QueryKafkaConfig {
    /// Hands the standing events of the topic to `intake` (there is no topic).
    pub fn with_standing(self, _intake: Option<Arc<dyn StandingIntake>>) -> Self {
        match self {}
    }
}

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
    metrics().observe_stage(
        ragstream_core::query::Stage::Decode,
        started.elapsed().as_secs_f64(),
    );
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
    #[cfg(feature = "kafka")]
    let route = kafka
        .as_ref()
        .and_then(|config| config.standing.clone())
        .map(|intake| route::route(scope, intake, &published));
    #[cfg(not(feature = "kafka"))]
    let route = None;
    source::<_, CapacityContainerBuilder<Vec<_>>, _, _>(scope, "QuerySource", move |cap, info| {
        let activator = scope.activator_for(info.address.clone());
        let worker = scope.index();
        if let Some(http) = &http {
            http.register();
        }
        #[cfg(feature = "kafka")]
        let kafka = kafka.map(|config| {
            kafka::KafkaQueries::start(
                config,
                worker,
                &handover,
                &progress,
                scope.worker(),
                &info.address,
            )
        });
        #[cfg(not(feature = "kafka"))]
        let _ = (kafka, &progress);
        let mut reader = QueryReader {
            activator,
            worker,
            #[cfg(feature = "kafka")]
            kafka,
            http,
            rules,
            published,
            handover,
            shutdown,
            finite_ingest,
            waiting: Parked::default(),
            pending: BTreeMap::new(),
            sequence: 0u64,
            route,
        };
        let mut cap = reader.has_input().then_some(cap);
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
