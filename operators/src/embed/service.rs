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

/// The next work for an executor of `role`, or `None` when the service stops.
fn next_work(shared: &Shared, role: Role) -> Option<Work> {
    let condvar = match role {
        Role::Query => &shared.query_work,
        Role::Both | Role::Ingest => &shared.work,
    };
    let mut queues = lock(&shared.queues);
    loop {
        if queues.stopping {
            return None;
        }
        let now = Instant::now();
        let paused_until = queues
            .backoff_until
            .filter(|&until| until > now && role != Role::Query)
            .or_else(|| sitting_out(shared, &queues, now).filter(|_| role != Role::Query));
        let work = if !queues.query.is_empty() && role != Role::Ingest {
            let take = queues.query.len().min(shared.config.query_batch);
            Some(Work::Queries(queues.query.drain(..take).collect()))
        } else if paused_until.is_none() && role != Role::Query {
            let queues = &mut *queues;
            let slice = take_slice(
                &mut queues.ingest,
                &mut queues.lanes,
                shared.config.slice_word_pieces,
                shared.pools_spans,
            );
            queues.slices_running += usize::from(slice.is_some());
            slice
        } else {
            None
        };
        if let Some(work) = work {
            // A submit wakes one executor: with work left, this one passes the wake on, so every
            // executor is busy while there is work (not only after the next submit).
            if !queues.query.is_empty() {
                shared.wake_for_queries();
            }
            if paused_until.is_none() && queues.ingest.iter().any(Request::has_slices) {
                shared.work.notify_one();
            }
            return Some(work);
        }
        queues = match paused_until {
            Some(until) => {
                condvar
                    .wait_timeout(queues, until - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            None => condvar.wait(queues).unwrap_or_else(|e| e.into_inner()),
        };
    }
}

/// Until when an executor that would start an ingest slice sits out: while a query came within
/// [`ServiceConfig::query_headroom`] and all but one of the ingest executors are embedding, until
/// the window ends (a finished slice wakes it sooner). `None`: it may start one.
fn sitting_out(shared: &Shared, queues: &Queues, now: Instant) -> Option<Instant> {
    let window = shared.config.query_headroom?;
    let until = queues.last_query? + window;
    (shared.ingest_executors > 1
        && until > now
        && queues.slices_running + 1 >= shared.ingest_executors)
        .then_some(until)
}

/// Deficit round robin over the ingest lanes: the lane at the front takes slices while its credit
/// covers their estimated word pieces; short of it, it gets a quantum (one slice's budget) more and
/// goes to the back. A lane with nothing waiting leaves the round and its credit is dropped.
#[derive(Default)]
struct Drr {
    active: VecDeque<Arc<str>>,
    credit: std::collections::HashMap<Arc<str>, usize>,
}

/// Estimated word pieces of the text at `position` with its spans (free where they are `pooled`).
fn text_cost(request: &Request, position: usize, pooled: bool) -> usize {
    let text = &request.texts[position];
    let spans = match pooled {
        true => &[][..],
        false => request.spans.get(position).map_or(&[][..], Vec::as_slice),
    };
    estimated_word_pieces(text)
        + spans
            .iter()
            .map(|r| estimated_word_pieces(text.get(r.clone()).unwrap_or_default()))
            .sum::<usize>()
}

/// The next slice of `request`: a slice handed back after an outage, else about `budget` estimated
/// word pieces (at least one text) not handed out yet; with its cost. Nothing is taken yet.
fn next_slice(request: &Request, budget: usize, pooled: bool) -> (Vec<usize>, usize) {
    if let Some(positions) = request.retry.last() {
        let cost = positions
            .iter()
            .map(|&p| text_cost(request, p, pooled))
            .sum();
        return (positions.clone(), cost);
    }
    let mut cost = 0;
    let mut positions = Vec::new();
    for &position in &request.order[request.next..] {
        let text_cost = text_cost(request, position, pooled);
        if !positions.is_empty() && cost + text_cost > budget {
            break;
        }
        cost += text_cost;
        positions.push(position);
    }
    (positions, cost)
}

/// The next ingest slice: from the lane whose turn it is ([`Drr`]), its first request with texts not
/// yet handed out (or handed back).
fn take_slice(
    ingest: &mut VecDeque<Request>,
    lanes: &mut Drr,
    budget: usize,
    pooled: bool,
) -> Option<Work> {
    for request in ingest.iter().filter(|r| r.has_slices()) {
        if !lanes.credit.contains_key(&request.lane) {
            lanes.credit.insert(request.lane.clone(), 0);
            lanes.active.push_back(request.lane.clone());
        }
    }
    loop {
        let lane = lanes.active.front()?.clone();
        let Some(request) = ingest.iter_mut().find(|r| r.lane == lane && r.has_slices()) else {
            lanes.active.pop_front();
            lanes.credit.remove(&lane);
            continue;
        };
        let (positions, cost) = next_slice(request, budget, pooled);
        let credit = lanes.credit.entry(lane).or_default();
        if *credit < cost {
            *credit += budget;
            lanes.active.rotate_left(1);
            continue;
        }
        *credit -= cost;
        match request.retry.pop() {
            Some(_) => {}
            None => request.next += positions.len(),
        }
        return Some(Work::Slice {
            id: request.id,
            texts: request.texts.clone(),
            spans: request.spans.clone(),
            positions,
        });
    }
}

fn run_executor(shared: &Shared, mut embedder: Box<dyn Embedder>, role: Role) {
    if role == Role::Ingest {
        crate::offload::lower_priority();
    }
    while let Some(work) = next_work(shared, role) {
        match work {
            Work::Queries(requests) => run_queries(embedder.as_mut(), requests),
            Work::Slice {
                id,
                texts,
                spans,
                positions,
            } => {
                let inputs: Vec<&str> = positions.iter().map(|&p| texts[p].as_str()).collect();
                let spans: Vec<Spans> = positions
                    .iter()
                    .map(|&p| spans.get(p).cloned().unwrap_or_default())
                    .collect();
                let result = timed_embed(embedder.as_mut(), &inputs, &spans);
                finish_slice(shared, id, positions, &spans, result);
            }
        }
    }
}

/// Embeds `texts` (with their `spans`, [`Embedder::embed_spans`]) and records the model's time and
/// word pieces.
fn timed_embed(
    embedder: &mut dyn Embedder,
    texts: &[&str],
    spans: &[Spans],
) -> Result<(Vec<Vec<f32>>, usize), EmbedError> {
    let started = Instant::now();
    let expected = texts.len() + spans.iter().map(Vec::len).sum::<usize>();
    let vectors = match expected > texts.len() {
        true => embedder.embed_spans(texts, spans)?,
        false => embedder.embed(texts)?,
    };
    if vectors.len() != expected {
        return Err(EmbedError::Model(format!(
            "{} vectors for {expected} texts and spans",
            vectors.len(),
        )));
    }
    let tokens = embedder.last_token_count();
    let metrics = metrics();
    metrics
        .embed_seconds
        .observe(started.elapsed().as_secs_f64());
    metrics.embed_tokens.inc_by(tokens as u64);
    metrics.embed_batch_tokens.observe(tokens as f64);
    metrics.embed_texts.inc_by(texts.len() as u64);
    Ok((vectors, tokens))
}

/// Query requests in one call; each completes (with its vectors or the error) at once.
fn run_queries(embedder: &mut dyn Embedder, requests: Vec<Request>) {
    let inputs: Vec<&str> = requests
        .iter()
        .flat_map(|r| r.texts.iter().map(String::as_str))
        .collect();
    match timed_embed(embedder, &inputs, &[]) {
        Ok((vectors, word_pieces)) => {
            let mut vectors = vectors.into_iter();
            for request in requests {
                let vectors: Vec<Vec<f32>> = vectors.by_ref().take(request.texts.len()).collect();
                request.promise.keep(Ok(Embedded {
                    vectors,
                    word_pieces,
                }));
            }
        }
        Err(error) => {
            tracing::warn!(%error, requests = requests.len(), "query embedding failed");
            let message = error.to_string();
            for request in requests {
                let error = if error.is_retryable() {
                    EmbedError::Unavailable(message.clone())
                } else {
                    EmbedError::Model(message.clone())
                };
                request.promise.keep(Err(error));
            }
        }
    }
}

/// Files a slice's vectors under its request (completing it when it was the last), or hands the slice
/// back after an outage, or fails the request.
fn finish_slice(
    shared: &Shared,
    id: u64,
    positions: Vec<usize>,
    spans: &[Spans],
    result: Result<(Vec<Vec<f32>>, usize), EmbedError>,
) {
    let mut queues = lock(&shared.queues);
    queues.slices_running = queues.slices_running.saturating_sub(1);
    if shared.config.query_headroom.is_some() {
        // An executor sitting out may take the next slice.
        shared.work.notify_one();
    }
    let Some(index) = queues.ingest.iter().position(|r| r.id == id) else {
        return; // The request failed on another slice meanwhile.
    };
    match result {
        Ok((vectors, word_pieces)) => {
            queues.backoff.reset();
            queues.backoff_until = None;
            queues.outage = None;
            let request = &mut queues.ingest[index];
            let mut vectors = vectors.into_iter();
            for (slot, &position) in positions.iter().enumerate() {
                let count = 1 + spans.get(slot).map_or(0, Vec::len);
                request.vectors[position] = vectors.by_ref().take(count).collect();
                request.done += 1;
            }
            request.word_pieces += word_pieces;
            if request.done == request.texts.len() {
                let request = queues.ingest.remove(index).expect("request exists");
                drop(queues);
                request.promise.keep(Ok(Embedded {
                    vectors: request.vectors.into_iter().flatten().collect(),
                    word_pieces: request.word_pieces,
                }));
            }
        }
        Err(error) if error.is_retryable() => {
            let delay = queues.backoff.next_delay();
            queues.backoff_until = Some(Instant::now() + delay);
            match &queues.outage {
                Some(outage) => outage.failed_again(&error),
                None => queues.outage = Some(crate::outage::Retrying::begin("embedder", &error)),
            }
            queues.ingest[index].retry.push(positions);
            drop(queues);
            // Ingest pauses; queries are still served (and fail over to BM25 while it lasts).
            Retrying {
                component: "embedder",
                error: &error,
                delay,
            }
            .emit();
            shared.work.notify_all();
        }
        Err(error) => {
            let request = queues.ingest.remove(index).expect("request exists");
            drop(queues);
            request.promise.keep(Err(error));
        }
    }
}

#[cfg(test)]
mod tests;
