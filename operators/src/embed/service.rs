//! The inference service: embedders on threads of their own, so no dataflow worker ever waits on a model.
//!
//! Operators [`submit`](InferenceService::submit) texts with a [`Priority`] and their waker, park their
//! capabilities with the [`Ticket`] (the job's one way off the worker: [`crate::offload`]), and go on;
//! when the vectors are ready the service keeps the request's promise (stores them, calls the waker),
//! and the operator, activated, takes them with [`Ticket::try_take`].
//!
//! # Guarantees
//! - **Queries first.** An idle executor takes every waiting query request (up to `query_batch` of
//!   them, in one call) before any ingest work. Ingest requests are cut into slices of about
//!   `slice_word_pieces` word pieces (estimated from the text length), so a query arriving while the model
//!   runs waits at most one slice.
//! - **Or a query executor of its own** ([`ServiceConfig::query_executor`]): the last executor takes
//!   only queries and the others only ingest slices, on threads at a lower CPU priority
//!   ([`HELPER_NICE`](crate::offload::HELPER_NICE) on Linux). A query then waits behind no slice at
//!   all, and where the cores are short the scheduler runs it (and the worker) before ingest.
//! - **Headroom for queries** ([`ServiceConfig::query_headroom`]): within that long of the last
//!   query request, at most all but one of the executors that take ingest slices embed at once (with
//!   two or more), so ingest never holds every core while queries come in; a host that runs the
//!   machine beside others stops it for up to 100 ms once all its cores are busy.
//! - **Every executor busy while there is work** (headroom aside): a submit wakes one executor, and an executor that
//!   takes work while more is waiting wakes the next.
//! - **Order.** Each request's vectors come back in the order of its texts. An ingest request's texts are
//!   embedded shortest first (slices of similar lengths pad little), and its ticket completes only when
//!   all of them are embedded.
//! - **Outages never reach the workers.** A retryable failure ([`EmbedError::is_retryable`]) of an ingest
//!   slice puts the slice back and pauses ingest work with capped exponential backoff, on the service's
//!   threads: the request completes once the embedder is back, nothing is lost. Query requests are tried
//!   once and fail at once during an outage (the query answers from the BM25 lane and says so), so an
//!   outage costs queries no waiting.
//! - Any other failure completes the request with the error (the Embed operator then isolates the
//!   failing documents).
//! - Several executors (an HTTP embedder's concurrent requests) share the queues under the same rules; a
//!   local model runs as one executor whose parallelism is the runtime's own intra-op threads.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::offload::Waker;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{EmbedError, Embedder, Spans};
use crate::events::{InternalEvent, Retrying};
use crate::metrics::metrics;

mod executor;
mod schedule;

use executor::*;
use schedule::*;

/// Which queue a request joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// A query's vector: taken before any ingest work, never retried.
    Query,
    /// Chunks to index: sliced, retried through outages.
    Ingest,
}

/// How the service schedules.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Estimated word pieces per ingest slice: the longest a query waits behind ingest is the model time
    /// of one slice.
    pub slice_word_pieces: usize,
    /// Most query requests embedded together in one call.
    pub query_batch: usize,
    /// The last executor serves queries only; the others serve ingest only, at a lower CPU priority
    /// (needs at least two executors; with one it is ignored).
    pub query_executor: bool,
    /// Appended to the embedders' version (`<version> + <tag>`): what else the index's stored
    /// vectors depend on (a BM25 weighting other than the default, [`crate::store::Bm25Params::tag`]).
    pub version_tag: Option<String>,
    /// While a query was submitted within this window, one ingest executor sits out (needs at least
    /// two that take ingest work): ingest never holds every core while queries come in. `None`: off.
    pub query_headroom: Option<Duration>,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            slice_word_pieces: DEFAULT_SLICE_WORD_PIECES,
            query_batch: 32,
            query_executor: false,
            version_tag: None,
            query_headroom: None,
        }
    }
}

/// Default ingest slice: about 20 ms of the int8 MiniLM on two cores (see BENCHMARKS.md).
pub const DEFAULT_SLICE_WORD_PIECES: usize = 256;

/// Word pieces a text is expected to give (about four bytes each, capped at the model's input), used
/// only to cut slices.
pub fn estimated_word_pieces(text: &str) -> usize {
    (text.len() / 4 + 2).min(super::minilm::MAX_WORD_PIECES)
}

/// The vectors of one request.
#[derive(Debug, Clone, Default)]
pub struct Embedded {
    /// One vector per text, in order (texts submitted with spans: each text's, then its spans').
    pub vectors: Vec<Vec<f32>>,
    /// Word pieces the model saw.
    pub word_pieces: usize,
}

/// A submitted request's result, once it is there ([`Ticket::try_take`], or [`Ticket::wait`] off the
/// workers).
pub type Ticket = crate::offload::Ticket<Result<Embedded, EmbedError>>;
type Promise = crate::offload::Promise<Result<Embedded, EmbedError>>;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

struct Request {
    id: u64,
    /// The ingest lane (a tenant): lanes share the executors by deficit round robin.
    lane: Arc<str>,
    texts: Arc<Vec<String>>,
    /// Each text's spans ([`Embedder::embed_spans`]; shorter than `texts` where the rest have none).
    spans: Arc<Vec<Spans>>,
    /// Kept (the result stored, the operator woken) when the request completes.
    promise: Promise,
    /// Positions of the texts, shortest first; `order[next..]` are not handed out yet.
    order: Vec<usize>,
    next: usize,
    /// Slices handed back after an outage.
    retry: Vec<Vec<usize>>,
    /// Per text: its vector, then its spans'.
    vectors: Vec<Vec<Vec<f32>>>,
    done: usize,
    word_pieces: usize,
}

impl Request {
    /// Whether texts of this request wait for an executor (never handed out, or handed back).
    fn has_slices(&self) -> bool {
        !self.retry.is_empty() || self.next < self.order.len()
    }
}

#[derive(Default)]
struct Queues {
    query: VecDeque<Request>,
    ingest: VecDeque<Request>,
    /// Whose ingest slice is next.
    lanes: Drr,
    next_id: u64,
    /// Ingest work waits until then after an outage.
    backoff_until: Option<Instant>,
    backoff: crate::outage::Backoff,
    /// Held while ingest work is retried after an outage (what `/readyz` shows).
    outage: Option<crate::outage::Retrying>,
    stopping: bool,
    /// When the last query request was submitted.
    last_query: Option<Instant>,
    /// Ingest slices being embedded.
    slices_running: usize,
}

struct Shared {
    queues: Mutex<Queues>,
    /// Wakes the executors that take ingest work (and queries, without a query executor).
    work: Condvar,
    /// Wakes the query executor.
    query_work: Condvar,
    config: ServiceConfig,
    /// The executors pool spans from their texts' passes (a span then costs no model time of its own).
    pools_spans: bool,
    /// Executors that take ingest slices.
    ingest_executors: usize,
}

/// What an executor takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Queries first, then ingest slices.
    Both,
    /// Ingest slices only (beside a query executor), at a lower CPU priority.
    Ingest,
    /// Queries only.
    Query,
}

impl Shared {
    /// Wakes an executor that takes queries.
    fn wake_for_queries(&self) {
        if self.config.query_executor {
            self.query_work.notify_one();
        } else {
            self.work.notify_one();
        }
    }
}

/// Stops the executors when the last handle goes.
struct Owner {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        lock(&self.shared.queues).stopping = true;
        self.shared.work.notify_all();
        self.shared.query_work.notify_all();
        for thread in lock(&self.threads).drain(..) {
            let _ = thread.join();
        }
    }
}

/// A handle on the service (cheap to clone; the executors stop when the last handle is dropped).
#[derive(Clone)]
pub struct InferenceService {
    shared: Arc<Shared>,
    _owner: Arc<Owner>,
    version: Arc<str>,
    dimension: usize,
}

impl std::fmt::Debug for InferenceService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InferenceService")
            .field("version", &self.version)
            .field("dimension", &self.dimension)
            .finish()
    }
}

/// One unit of work an executor took.
enum Work {
    Queries(Vec<Request>),
    Slice {
        id: u64,
        texts: Arc<Vec<String>>,
        spans: Arc<Vec<Spans>>,
        positions: Vec<usize>,
    },
}

impl InferenceService {
    /// Starts one thread per executor. All executors must be the same model (version and dimension).
    pub fn start(
        executors: Vec<Box<dyn Embedder>>,
        config: ServiceConfig,
    ) -> Result<Self, EmbedError> {
        let first = executors.first().ok_or_else(|| EmbedError::Load {
            path: String::new(),
            message: "the inference service needs at least one embedder".into(),
        })?;
        let version: Arc<str> = first.version().into();
        let dimension = first.dimension();
        let pools_spans = first.pools_spans();
        if let Some(other) = executors
            .iter()
            .find(|e| e.version() != &*version || e.dimension() != dimension)
        {
            return Err(EmbedError::Load {
                path: String::new(),
                message: format!("executors disagree: {} and {}", version, other.version()),
            });
        }
        let version: Arc<str> = match &config.version_tag {
            Some(tag) => format!("{version} + {tag}").into(),
            None => version,
        };
        let shared = Arc::new(Shared {
            queues: Mutex::new(Queues {
                backoff: crate::outage::Backoff::default(),
                ..Queues::default()
            }),
            work: Condvar::new(),
            query_work: Condvar::new(),
            config: ServiceConfig {
                slice_word_pieces: config.slice_word_pieces.max(1),
                query_batch: config.query_batch.max(1),
                query_executor: config.query_executor && executors.len() > 1,
                version_tag: None,
                query_headroom: config.query_headroom,
            },
            pools_spans,
            ingest_executors: executors.len()
                - usize::from(config.query_executor && executors.len() > 1),
        });
        let last = executors.len() - 1;
        let threads = executors
            .into_iter()
            .enumerate()
            .map(|(index, embedder)| {
                let shared = shared.clone();
                let (role, name) = match shared.config.query_executor {
                    false => (Role::Both, format!("ragstream-embed-{index}")),
                    true if index == last => (Role::Query, "ragstream-embed-query".to_string()),
                    true => (Role::Ingest, format!("ragstream-embed-{index}")),
                };
                std::thread::Builder::new()
                    .name(name)
                    .spawn(move || run_executor(&shared, embedder, role))
                    .map_err(|e| EmbedError::Load {
                        path: String::new(),
                        message: format!("cannot start an inference thread: {e}"),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            _owner: Arc::new(Owner {
                shared: shared.clone(),
                threads: Mutex::new(threads),
            }),
            shared,
            version,
            dimension,
        })
    }

    /// Model, pooling and truncation of the vectors.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Length of every vector.
    pub fn dimension(&self) -> usize {
        self.dimension
    }

    /// Queues `texts`; `waker` is called (on a service thread) once the ticket holds the result.
    pub fn submit(&self, texts: Vec<String>, priority: Priority, waker: &Waker) -> Ticket {
        self.submit_spans(texts, Vec::new(), priority, waker)
    }

    /// Queues `texts` with the `spans` of each ([`Embedder::embed_spans`]: the vectors come back
    /// as each text's, then its spans', text after text); `waker` as in [`Self::submit`].
    pub fn submit_spans(
        &self,
        texts: Vec<String>,
        spans: Vec<Spans>,
        priority: Priority,
        waker: &Waker,
    ) -> Ticket {
        self.submit_in_lane("", texts, spans, priority, waker)
    }

    /// [`Self::submit_spans`] in the ingest lane `lane` (a tenant): the lanes with work waiting take
    /// turns at the executors by deficit round robin over estimated word pieces, so a lane's long
    /// request delays that lane, not the others; requests of one lane are served in submission order.
    pub fn submit_in_lane(
        &self,
        lane: &str,
        texts: Vec<String>,
        spans: Vec<Spans>,
        priority: Priority,
        waker: &Waker,
    ) -> Ticket {
        if texts.is_empty() {
            return Ticket::ready(Ok(Embedded::default()));
        }
        let (promise, ticket) = crate::offload::promise(waker);
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| texts[i].len());
        let vectors = vec![Vec::new(); texts.len()];
        let mut queues = lock(&self.shared.queues);
        queues.next_id += 1;
        let request = Request {
            id: queues.next_id,
            lane: lane.into(),
            vectors,
            texts: Arc::new(texts),
            spans: Arc::new(spans),
            promise,
            order,
            next: 0,
            retry: Vec::new(),
            done: 0,
            word_pieces: 0,
        };
        match priority {
            Priority::Query => {
                queues.last_query = Some(Instant::now());
                queues.query.push_back(request);
            }
            Priority::Ingest => queues.ingest.push_back(request),
        }
        drop(queues);
        match priority {
            Priority::Query => self.shared.wake_for_queries(),
            Priority::Ingest => self.shared.work.notify_one(),
        }
        ticket
    }

    /// Embeds `texts` and waits for them (startup re-embedding, benches, tools: never on a worker).
    pub fn embed_blocking(
        &self,
        texts: Vec<String>,
        priority: Priority,
    ) -> Result<Embedded, EmbedError> {
        self.embed_blocking_spans(texts, Vec::new(), priority)
    }

    /// [`Self::embed_blocking`] with each text's spans, as [`Self::submit_spans`].
    pub fn embed_blocking_spans(
        &self,
        texts: Vec<String>,
        spans: Vec<Spans>,
        priority: Priority,
    ) -> Result<Embedded, EmbedError> {
        let nobody: Waker = Arc::new(|| {});
        self.submit_spans(texts, spans, priority, &nobody).wait()
    }

    /// Texts queued or being embedded, by priority (query, ingest).
    pub fn queued(&self) -> (usize, usize) {
        let queues = lock(&self.shared.queues);
        let count = |q: &VecDeque<Request>| q.iter().map(|r| r.texts.len() - r.done).sum();
        (count(&queues.query), count(&queues.ingest))
    }
}

/// Deficit round robin over the ingest lanes: the lane at the front takes slices while its credit
/// covers their estimated word pieces; short of it, it gets a quantum (one slice's budget) more and
/// goes to the back. A lane with nothing waiting leaves the round and its credit is dropped.
#[derive(Default)]
struct Drr {
    active: VecDeque<Arc<str>>,
    credit: std::collections::HashMap<Arc<str>, usize>,
}

#[cfg(test)]
mod tests;
