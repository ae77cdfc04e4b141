//! The timely side of the query flow: one thin operator per step around the pure cores.
//!
//! ```text
//! QuerySource ─ok─► AwaitConsistency ─► CacheLookup ─► Intent ─► EmbedQuery ─► broadcast ─► SearchShard
//!   │                                                                                          │ exchange to the origin worker
//!   │  Publish ◄─ Pack ◄─ Neighbours ◄─ Mmr ◄─ Dedup ◄─ Rerank ◄─ Fuse ◄─ Gather ◄────────────┘
//!   │                         │ ▲ exchange to the top hit's shard owner and back
//!   └─err (refused query) ─► PublishRefusal (error context + DLQ)
//! ```
//!
//! A query is answered (gathered, packed and published) on the worker that received it, so an HTTP
//! caller's reply is delivered by the process holding its connection. Each step records its latency on
//! the job; the context carries them all.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::{Exchange, Pipeline};
use timely::dataflow::operators::vec::Broadcast;
use timely::dataflow::operators::{Capability, Operator};
use timely::dataflow::{ProbeHandle, StreamVec};

use super::adapt::adapt;
use super::cache::LruTtl;
use super::decode::QueryError;
use super::dedup::dedup;
use super::fuse::{attach_vectors, fuse};
use super::intent::analyze;
use super::mmr::{mmr, MmrConfig};
use super::modes::{
    budget_for, max_new_tokens, rank_files, sql_compact, sql_full, unknown_chunk,
    SQL_FULL_HINT_TOKENS,
};
use super::pack::{pack, render_full, AnswerCue, PackRequest};
use super::rerank::rerank;
use super::retrieve::{gather, pool_size, results_wanted, search_shard, QueryVectors, ShardAnswer};
use crate::stage::{flat_map_stage, map_stage};

use super::{
    Candidate, Consistency, Context, Decision, Mode, Plan, Query, QueryConfig, Trace,
    TraceCandidate, Watermark,
};
use crate::embed::service::{InferenceService, Priority, Ticket};
use crate::ingest::dlq::DlqRecord;
use crate::io::context_sink::ContextPublisher;
use crate::io::dlq_sink::DlqSink;
use crate::io::query_source::IngestProgress;
use crate::metrics::metrics;
use crate::store::stats::CorpusStats;
use crate::store::{Bm25Encoder, SearchFilter, VectorStore};
use crate::tokens::{Encoding, TokenCounter};
use crate::wire::Wire;

/// Where a context goes besides the contexts topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// The HTTP request with this ticket waits for it.
    Http(u64),
    /// Only the contexts topic; the lease of the consumer that read it (see
    /// [`crate::io::query_ledger`]).
    Kafka(crate::io::query_ledger::Lease),
}

/// A query on its way through the flow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueryJob {
    /// The query.
    pub query: Query,
    /// Dataflow time it arrived at (ms).
    pub arrived_ms: u64,
    /// Wall clock at arrival (µs since the epoch), for the total latency.
    pub arrived_us: u64,
    /// The worker that received it: it gathers, packs and publishes.
    pub origin: usize,
    /// Unique id of this job.
    pub id: u64,
    /// Where the context goes.
    pub reply: Reply,
    /// Read-your-writes: documents-topic offsets the index must have acknowledged.
    pub wait_for: BTreeMap<i32, i64>,
    /// The analysed query.
    pub plan: Option<Plan>,
    /// The query's vectors.
    pub vectors: QueryVectors,
    /// Milliseconds per stage.
    pub latency: BTreeMap<String, f64>,
    /// Notes for the context (consistency timeout, …).
    pub notes: Vec<String>,
    /// What the index reflected when the query was searched.
    pub watermark: Watermark,
    /// The index generation read before retrieval: the context is cached under it, so a write that
    /// lands between retrieval and packing leaves the entry stale for the next lookup, not fresh.
    pub generation: u64,
    /// A cached context for this query, if one was fresh.
    pub cached: Option<Box<Context>>,
}

fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

impl QueryJob {
    /// A job for a decoded query.
    pub fn new(
        query: Query,
        arrived_ms: u64,
        origin: usize,
        id: u64,
        reply: Reply,
        wait_for: BTreeMap<i32, i64>,
    ) -> Self {
        Self {
            query,
            arrived_ms,
            arrived_us: now_micros(),
            origin,
            id,
            reply,
            wait_for,
            plan: None,
            vectors: QueryVectors::default(),
            latency: BTreeMap::new(),
            notes: Vec::new(),
            watermark: Watermark::default(),
            generation: 0,
            cached: None,
        }
    }

    fn record(&mut self, stage: &str, started: Instant) {
        let seconds = started.elapsed().as_secs_f64();
        metrics()
            .query_stage_seconds
            .with_label_values(&[stage])
            .observe(seconds);
        *self.latency.entry(stage.to_string()).or_default() += seconds * 1000.0;
    }
}

/// A refused query: its error context and DLQ record.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// Why.
    pub error: QueryError,
    /// The DLQ record (original bytes and origin).
    pub dlq: DlqRecord,
    /// Where the error context goes.
    pub reply: Reply,
}

/// A query after its shards answered.
#[derive(Debug, Clone)]
pub struct Working {
    /// The job.
    pub job: QueryJob,
    /// The gathered shard answers.
    pub answer: ShardAnswer,
    /// Candidates (after fusion, in the current order).
    pub candidates: Vec<Candidate>,
    /// Candidates held back by MMR caps.
    pub deferred: Vec<Candidate>,
    /// Decisions so far.
    pub trace: Trace,
    /// Chunks that passed the filters (before dedup and MMR).
    pub available: usize,
    /// Chunks of the top candidate's document around it (for the expanded tier), fetched on the
    /// worker owning its shard.
    pub neighbours: Vec<crate::store::StoredChunk>,
}

/// Query jobs waiting for their vectors from the inference service.
struct PendingEmbedding {
    cap: timely::dataflow::operators::Capability<u64>,
    jobs: Vec<QueryJob>,
    /// Jobs that need a dense vector.
    wanted: Vec<usize>,
    /// Jobs whose vector was not cached (the request's texts, in order).
    missing: Vec<usize>,
    ticket: Ticket,
    started: Instant,
}

/// What the query operators share.
#[derive(Clone)]
pub struct QueryServices {
    /// This process's shards: `shards[i]` belongs to worker `first_worker + i`.
    pub shards: Arc<Vec<Arc<dyn VectorStore>>>,
    /// The global index of this process's first worker (0 outside a cluster).
    pub first_worker: usize,
    /// Workers of the whole cluster (= shards of an embedded index).
    pub peers: usize,
    /// One collection shared by all workers (server backend): only worker 0 searches it.
    pub shared_index: bool,
    /// The process's inference service (query requests go ahead of ingest work).
    pub embedder: InferenceService,
    /// Tunables.
    pub config: Arc<QueryConfig>,
    /// Tokenizer of contexts when the query names none (the ingest tokenizer: stored counts match it).
    pub encoding: Encoding,
    /// Acknowledged document offsets.
    pub progress: Arc<IngestProgress>,
    /// The ingest acknowledgement probe (its frontier is the index watermark).
    pub acks: ProbeHandle<u64>,
    /// The corpus's BM25 statistics: IDF weights of query terms.
    pub stats: Arc<CorpusStats>,
}

impl std::fmt::Debug for QueryServices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryServices")
            .field("shards", &self.shards.len())
            .finish()
    }
}

impl QueryServices {
    fn watermark(&self) -> Watermark {
        let frontier_ms = self
            .acks
            .with_frontier(|f| f.first().copied())
            .unwrap_or(u64::MAX);
        Watermark {
            frontier_ms,
            offsets: self.progress.snapshot(),
        }
    }

    /// Whether the index reflects every document event written before `job` arrived.
    fn consistent(&self, job: &QueryJob) -> bool {
        if self
            .progress
            .kafka
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            self.progress.covers(&job.wait_for)
        } else {
            !self.acks.less_equal(&job.arrived_ms)
        }
    }

    /// The worker whose shard holds `key` (with a shared index: any, so `origin`).
    pub fn owner_of(&self, key: &crate::model::DocKey, origin: usize) -> usize {
        if self.shared_index {
            return origin;
        }
        (key.route() % self.peers.max(1) as u64) as usize
    }

    /// The shard of global worker `worker`, if it is in this process.
    pub fn local_shard(&self, worker: usize) -> Option<&Arc<dyn VectorStore>> {
        if self.shared_index {
            return self.shards.first();
        }
        worker
            .checked_sub(self.first_worker)
            .and_then(|local| self.shards.get(local))
    }
}

/// Extension trait: every step of the query flow.
pub trait QuerySteps<'scope> {
    /// Holds `read_your_writes` queries until the index reflects every earlier document event.
    fn await_consistency(self, services: QueryServices) -> StreamVec<'scope, u64, QueryJob>;
    /// Answers a query from the cache when a context for it was computed at the current index state.
    fn cache_lookup(
        self,
        cache: Arc<Mutex<LruTtl<String, Context>>>,
    ) -> StreamVec<'scope, u64, QueryJob>;
    /// Chooses the intent, weights and pool.
    fn intent(self) -> StreamVec<'scope, u64, QueryJob>;
    /// Embeds the query texts of each batch in one call (dense) and encodes BM25 terms.
    fn embed_query(self, services: QueryServices) -> StreamVec<'scope, u64, QueryJob>;
    /// Broadcasts to every worker, searches each shard and gathers the answers on the origin worker.
    fn retrieve(self, services: QueryServices) -> StreamVec<'scope, u64, Working>;
}

fn cache_key(query: &Query) -> String {
    let mut key = query.clone();
    key.query_id.clear();
    serde_json::to_string(&key).expect("queries serialise")
}

impl<'scope> QuerySteps<'scope> for StreamVec<'scope, u64, QueryJob> {
    fn await_consistency(self, services: QueryServices) -> StreamVec<'scope, u64, QueryJob> {
        let timeout = Duration::from_millis(services.config.consistency_timeout_ms);
        let scope = self.scope();
        self.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(Pipeline, "AwaitConsistency", move |_, info| {
            let activator = scope.activator_for(info.address.clone());
            let mut waiting: Vec<(Capability<u64>, QueryJob, Instant)> = Vec::new();
            move |input, output| {
                input.for_each(|cap, data| {
                    for job in data.drain(..) {
                        let read_your_writes = job.query.consistency == Consistency::ReadYourWrites;
                        if read_your_writes && !services.consistent(&job) {
                            waiting.push((cap.retain_least(0).expect("time of the batch"), job, Instant::now()));
                        } else {
                            if read_your_writes {
                                metrics().read_your_writes_wait_seconds.observe(0.0);
                            }
                            output.session(&cap).give(job);
                        }
                    }
                });
                waiting.retain_mut(|(cap, job, since)| {
                    let ready = services.consistent(job);
                    let expired = since.elapsed() >= timeout;
                    if !(ready || expired) {
                        return true;
                    }
                    let mut job = job.clone();
                    job.record("consistency_wait", *since);
                    metrics()
                        .read_your_writes_wait_seconds
                        .observe(since.elapsed().as_secs_f64());
                    if !ready {
                        job.notes.push(format!(
                            "read_your_writes: the index had not caught up after {} ms; answered from what it holds",
                            timeout.as_millis()
                        ));
                    }
                    output.session(cap).give(job);
                    false
                });
                if !waiting.is_empty() {
                    activator.activate_after(Duration::from_millis(2));
                }
            }
        })
    }

    fn cache_lookup(
        self,
        cache: Arc<Mutex<LruTtl<String, Context>>>,
    ) -> StreamVec<'scope, u64, QueryJob> {
        map_stage(self, "CacheLookup", move |mut job: QueryJob| {
            let generation = metrics().index_generation.get();
            job.generation = generation;
            if let Some(mut context) = cache
                .lock()
                .expect("cache")
                .get(&cache_key(&job.query), generation)
            {
                context.query_id = job.query.query_id.clone();
                context.latency_ms = BTreeMap::from([("cache".to_string(), 0.0)]);
                job.cached = Some(Box::new(context));
                metrics().query_cache.with_label_values(&["hit"]).inc();
            } else {
                metrics().query_cache.with_label_values(&["miss"]).inc();
            }
            job
        })
    }

    fn intent(self) -> StreamVec<'scope, u64, QueryJob> {
        let bm25 = Bm25Encoder::default();
        map_stage(self, "Intent", move |mut job: QueryJob| {
            if job.cached.is_none() {
                let started = Instant::now();
                let plan = analyze(&job.query.text, &bm25);
                if job.query.mode.retrieves() {
                    job.vectors.sparse = bm25.encode_query(&job.query.text);
                }
                let m = metrics();
                m.queries_by_intent
                    .with_label_values(&[plan.intent.as_str()])
                    .inc();
                m.fusion_weight
                    .with_label_values(&["dense"])
                    .observe(plan.weights.dense as f64);
                m.fusion_weight
                    .with_label_values(&["bm25"])
                    .observe(plan.weights.bm25 as f64);
                job.plan = Some(plan);
                job.record("intent", started);
            }
            job
        })
    }

    fn embed_query(self, services: QueryServices) -> StreamVec<'scope, u64, QueryJob> {
        // Repeated query texts (other budgets, other modes) are embedded once.
        let mut vectors: LruTtl<String, Vec<f32>> = LruTtl::new(16_384, Duration::from_secs(3600));
        let scope = self.scope();
        self.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(
            Pipeline,
            "EmbedQuery",
            move |_, info| {
                // The service wakes this operator from its own thread when a query's vector is ready;
                // meanwhile the worker runs the rest of the query flow and ingest.
                let waker = crate::background::operator_waker(scope.worker(), &info.address);
                // Batches waiting for their vectors, each holding its capability.
                let mut waiting: Vec<PendingEmbedding> = Vec::new();
                move |input, output| {
                    input.for_each(|cap, data| {
                        let started = Instant::now();
                        let mut jobs: Vec<QueryJob> = std::mem::take(data);
                        let wanted: Vec<usize> = (0..jobs.len())
                            .filter(|&i| jobs[i].cached.is_none() && jobs[i].query.mode.retrieves())
                            .collect();
                        let mut missing: Vec<usize> = Vec::new();
                        for &i in &wanted {
                            match vectors.get(&jobs[i].query.text, 0) {
                                Some(vector) => jobs[i].vectors.dense = vector,
                                None => missing.push(i),
                            }
                        }
                        if missing.is_empty() {
                            for &i in &wanted {
                                jobs[i].record("embed", started);
                            }
                            output.session(&cap).give_iterator(jobs.into_iter());
                            return;
                        }
                        let texts = missing
                            .iter()
                            .map(|&i| jobs[i].query.text.clone())
                            .collect();
                        let waker = waker.clone();
                        let ticket = services
                            .embedder
                            .submit(texts, Priority::Query, move || waker());
                        waiting.push(PendingEmbedding {
                            cap: cap.retain_least(0).expect("time of the batch"),
                            jobs,
                            wanted,
                            missing,
                            ticket,
                            started,
                        });
                    });
                    waiting.retain_mut(|pending| {
                        let Some(result) = pending.ticket.try_take() else {
                            return true;
                        };
                        let jobs = &mut pending.jobs;
                        match result {
                            Ok(embedded) => {
                                for (&i, vector) in pending.missing.iter().zip(embedded.vectors) {
                                    vectors.put(jobs[i].query.text.clone(), vector.clone(), 0);
                                    jobs[i].vectors.dense = vector;
                                }
                            }
                            Err(error) => {
                                // The BM25 lane still answers; the context says the dense lane was out.
                                for &i in &pending.missing {
                                    jobs[i]
                                        .notes
                                        .push(format!("dense lane unavailable: {error}"));
                                }
                            }
                        }
                        for &i in &pending.wanted {
                            jobs[i].record("embed", pending.started);
                        }
                        output
                            .session(&pending.cap)
                            .give_iterator(std::mem::take(jobs).into_iter());
                        false
                    });
                }
            },
        )
    }

    fn retrieve(self, services: QueryServices) -> StreamVec<'scope, u64, Working> {
        let search = services.clone();
        let worker = self.scope().index();
        // Jobs and answers cross processes in a cluster: as JSON (see `crate::wire`).
        // The BM25 vector carries each term's IDF over the tenant's whole corpus, weighed once here so
        // every shard scores with the same weights.
        // (An index created with the engine's own per-shard IDF gets the bare query vector.)
        let stats = services.stats.clone();
        let engine_idf = services.shards.iter().any(|shard| shard.engine_idf());
        let wired = map_stage(self, "WireQuery", move |mut job: QueryJob| {
            if !engine_idf && !job.vectors.sparse.indices.is_empty() {
                job.vectors.sparse = stats.weigh(&job.query.tenant, &job.vectors.sparse);
            }
            Wire(job)
        })
        .broadcast();
        let answers = map_stage(wired, "SearchShard", move |Wire(job): Wire<QueryJob>| {
            let started = Instant::now();
            let skip = job.cached.is_some() || (search.shared_index && worker != 0);
            let answer = match search.local_shard(worker) {
                Some(shard) if !skip => {
                    let pool = pool_size(
                        &job.query,
                        job.plan.as_ref().map_or(16, |p| p.pool),
                        search.config.min_pool,
                    );
                    search_shard(shard.as_ref(), &job.query, &job.vectors, pool)
                }
                _ => ShardAnswer::default(),
            };
            Wire((job, answer, started.elapsed().as_secs_f64()))
        });
        let peers = services.peers;
        answers.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(
            Exchange::new(|Wire((job, _, _)): &Wire<(QueryJob, ShardAnswer, f64)>| {
                job.origin as u64
            }),
            "Gather",
            move |_, _| {
                let mut parts: HashMap<u64, (QueryJob, Vec<ShardAnswer>, f64)> = HashMap::new();
                move |input, output| {
                    input.for_each(|cap, data| {
                        for Wire((job, answer, seconds)) in data.drain(..) {
                            let id = job.id;
                            let complete = {
                                let entry =
                                    parts.entry(id).or_insert_with(|| (job, Vec::new(), 0.0));
                                entry.1.push(answer);
                                entry.2 = entry.2.max(seconds);
                                entry.1.len() == peers
                            };
                            if !complete {
                                continue;
                            }
                            let (mut job, answers, seconds) =
                                parts.remove(&id).expect("complete entry");
                            let pool = pool_size(
                                &job.query,
                                job.plan.as_ref().map_or(16, |p| p.pool),
                                services.config.min_pool,
                            );
                            job.watermark = services.watermark();
                            *job.latency.entry("retrieve".into()).or_default() += seconds * 1000.0;
                            metrics()
                                .query_stage_seconds
                                .with_label_values(&["retrieve"])
                                .observe(seconds);
                            output.session(&cap).give(Working {
                                answer: gather(answers, pool),
                                job,
                                candidates: Vec::new(),
                                deferred: Vec::new(),
                                trace: Trace::default(),
                                available: 0,
                                neighbours: Vec::new(),
                            });
                        }
                    });
                }
            },
        )
    }
}

/// Extension trait: the steps after the shards answered.
pub trait AnswerSteps<'scope> {
    /// Weighted reciprocal-rank fusion of the gathered lanes.
    fn fuse(self, config: Arc<QueryConfig>) -> StreamVec<'scope, u64, Working>;
    /// Answer-focused rerank of the top window.
    fn rerank(self, config: Arc<QueryConfig>) -> StreamVec<'scope, u64, Working>;
    /// Exact-duplicate removal (near-duplicates leave against each MMR pick).
    fn dedup(self) -> StreamVec<'scope, u64, Working>;
    /// MMR with per-document and per-section caps.
    fn mmr(self, config: Arc<QueryConfig>) -> StreamVec<'scope, u64, Working>;
    /// Fetches the neighbours of a bounded query's top candidate on the worker owning its shard (in
    /// this process or another of the cluster) and joins them back on the origin worker.
    fn neighbours(self, services: QueryServices) -> StreamVec<'scope, u64, Working>;
    /// Packs (or renders, for the other modes) the context.
    fn pack(
        self,
        services: QueryServices,
        cache: Arc<Mutex<LruTtl<String, Context>>>,
    ) -> StreamVec<'scope, u64, (Context, Reply)>;
}

fn ranked(working: &Working) -> bool {
    working.job.cached.is_none()
        && working.answer.error.is_none()
        && matches!(
            working.job.query.mode,
            Mode::Bounded | Mode::Deep | Mode::Files | Mode::SqlCompact | Mode::SqlFull
        )
}

fn step<'scope>(
    stream: StreamVec<'scope, u64, Working>,
    name: &'static str,
    mut logic: impl FnMut(&mut Working) + 'static,
) -> StreamVec<'scope, u64, Working> {
    map_stage(stream, name, move |mut working: Working| {
        if ranked(&working) {
            let started = Instant::now();
            logic(&mut working);
            working.job.record(&name.to_lowercase(), started);
        }
        working
    })
}

impl<'scope> AnswerSteps<'scope> for StreamVec<'scope, u64, Working> {
    fn fuse(self, config: Arc<QueryConfig>) -> StreamVec<'scope, u64, Working> {
        step(self, "Fuse", move |working| {
            if let Some(plan) = working.job.plan.as_mut().filter(|_| config.adapt_fusion) {
                if let Some(reason) = adapt(plan, &working.answer.dense) {
                    metrics()
                        .fusion_adapted
                        .with_label_values(&[plan.intent.as_str()])
                        .inc();
                    working
                        .trace
                        .decisions
                        .push(Decision::new("", "fuse", "adapted", reason));
                }
            }
            let weights = working
                .job
                .plan
                .as_ref()
                .map(|p| p.weights)
                .unwrap_or_default();
            let (mut candidates, decisions) = fuse(
                std::mem::take(&mut working.answer.dense),
                std::mem::take(&mut working.answer.bm25),
                weights,
                config.rrf_k,
            );
            attach_vectors(&mut candidates, std::mem::take(&mut working.answer.vectors));
            working.available = candidates.len();
            working.candidates = candidates;
            working.trace.decisions.extend(decisions);
        })
    }

    fn rerank(self, config: Arc<QueryConfig>) -> StreamVec<'scope, u64, Working> {
        let bm25 = Bm25Encoder::default();
        step(self, "Rerank", move |working| {
            if let Some(plan) = &working.job.plan {
                rerank(&mut working.candidates, plan, &config.rerank, &bm25);
            }
            if working.job.query.trace {
                working.trace.candidates = working
                    .candidates
                    .iter()
                    .map(TraceCandidate::from)
                    .collect();
            }
        })
    }

    fn dedup(self) -> StreamVec<'scope, u64, Working> {
        step(self, "Dedup", move |working| {
            let (kept, decisions) = dedup(std::mem::take(&mut working.candidates));
            working.candidates = kept;
            working.trace.decisions.extend(decisions);
        })
    }

    fn mmr(self, config: Arc<QueryConfig>) -> StreamVec<'scope, u64, Working> {
        step(self, "Mmr", move |working| {
            let query = &working.job.query;
            let k = results_wanted(query);
            match query.mode {
                Mode::Bounded | Mode::Deep => {
                    let caps = if query.mode == Mode::Deep {
                        (k, k)
                    } else {
                        (config.per_document_cap, config.per_section_cap)
                    };
                    let selection = mmr(
                        std::mem::take(&mut working.candidates),
                        k,
                        MmrConfig {
                            lambda: config.mmr_lambda,
                            per_document: caps.0,
                            per_section: caps.1,
                            near_duplicate: config.near_duplicate,
                        },
                    );
                    working.candidates = selection.picked;
                    working.deferred = selection.deferred;
                    working.trace.decisions.extend(selection.decisions);
                }
                Mode::SqlCompact | Mode::SqlFull => working.candidates.truncate(k),
                _ => {}
            }
        })
    }

    fn neighbours(self, services: QueryServices) -> StreamVec<'scope, u64, Working> {
        type Request = Wire<((usize, u64), crate::store::StoredChunk)>;
        type Answer = Wire<((usize, u64), Vec<crate::store::StoredChunk>)>;
        let wants = |working: &Working| {
            working.job.cached.is_none()
                && working.job.query.mode == Mode::Bounded
                && !working.candidates.is_empty()
        };
        let route = services.clone();
        let requests = flat_map_stage(
            self.clone(),
            "NeighbourRequests",
            move |working: Working| -> Option<Request> {
                wants(&working).then(|| {
                    let top = working.candidates[0].stored.clone();
                    Wire(((working.job.origin, working.job.id), top))
                })
            },
        );
        let fetch = services.clone();
        let worker_of =
            move |key: &crate::model::DocKey, origin: usize| route.owner_of(key, origin);
        let answers = requests.unary::<CapacityContainerBuilder<Vec<Answer>>, _, _, _>(
            Exchange::new(move |Wire(((origin, _), top)): &Request| {
                worker_of(&top.key, *origin) as u64
            }),
            "FetchNeighbours",
            move |_, _| {
                move |input, output| {
                    input.for_each(|cap, data| {
                        let mut session = output.session(&cap);
                        for Wire((id, top)) in data.drain(..) {
                            let owner = fetch.owner_of(&top.key, id.0);
                            let neighbours = match fetch.local_shard(owner) {
                                Some(shard) => neighbours_of(shard.as_ref(), &top),
                                None => Vec::new(),
                            };
                            session.give(Wire((id, neighbours)));
                        }
                    });
                }
            },
        );
        self.binary::<_, CapacityContainerBuilder<Vec<Working>>, _, _, _, _>(
            answers,
            Pipeline,
            Exchange::new(|Wire(((origin, _), _)): &Answer| *origin as u64),
            "Neighbours",
            move |_, _| {
                let mut waiting: HashMap<(usize, u64), (Capability<u64>, Working)> = HashMap::new();
                let mut arrived: HashMap<(usize, u64), Vec<crate::store::StoredChunk>> =
                    HashMap::new();
                move |working_input, answer_input, output| {
                    working_input.for_each(|cap, data| {
                        for mut working in data.drain(..) {
                            if !wants(&working) {
                                output.session(&cap).give(working);
                                continue;
                            }
                            let id = (working.job.origin, working.job.id);
                            match arrived.remove(&id) {
                                Some(neighbours) => {
                                    working.neighbours = neighbours;
                                    output.session(&cap).give(working);
                                }
                                None => {
                                    let retained = cap.retain_least(0).expect("time of the batch");
                                    waiting.insert(id, (retained, working));
                                }
                            }
                        }
                    });
                    answer_input.for_each(|_, data| {
                        for Wire((id, neighbours)) in data.drain(..) {
                            match waiting.remove(&id) {
                                Some((cap, mut working)) => {
                                    working.neighbours = neighbours;
                                    output.session(&cap).give(working);
                                }
                                None => {
                                    arrived.insert(id, neighbours);
                                }
                            }
                        }
                    });
                }
            },
        )
    }

    fn pack(
        self,
        services: QueryServices,
        cache: Arc<Mutex<LruTtl<String, Context>>>,
    ) -> StreamVec<'scope, u64, (Context, Reply)> {
        map_stage(self, "Pack", move |mut working: Working| {
            if let Some(cached) = working.job.cached.take() {
                metrics()
                    .queries
                    .with_label_values(&[working.job.query.mode.as_str(), "cached"])
                    .inc();
                return (*cached, working.job.reply);
            }
            let started = Instant::now();
            let mut context = answer(&mut working, &services);
            working.job.record("pack", started);
            context.latency_ms = working.job.latency.clone();
            let total = now_micros().saturating_sub(working.job.arrived_us) as f64 / 1000.0;
            context.latency_ms.insert("total".into(), total);
            if context.error.is_none() {
                cache.lock().expect("cache").put(
                    cache_key(&working.job.query),
                    context.clone(),
                    working.job.generation,
                );
            }
            (context, working.job.reply)
        })
    }
}

/// Builds the context of a gathered query (every mode).
fn answer(working: &mut Working, services: &QueryServices) -> Context {
    let job = &working.job;
    let query = &job.query;
    let encoding = query
        .tokenizer
        .as_deref()
        .and_then(Encoding::parse)
        .unwrap_or(services.encoding);
    let counter = TokenCounter::new(encoding);
    let plan = job.plan.clone();
    let mut context = Context {
        query_id: query.query_id.clone(),
        tenant: query.tenant.clone(),
        mode: query.mode.as_str().to_string(),
        tokenizer: encoding.name().to_string(),
        intent: plan.as_ref().map_or_else(String::new, |p| p.intent.clone()),
        weights: plan.as_ref().map(|p| p.weights).unwrap_or_default(),
        index_watermark: job.watermark.clone(),
        chunks_available: working.available,
        ..Context::default()
    };
    let mut notes = job.notes.clone();
    if let Some(error) = &working.answer.error {
        context.error = Some(format!("index unavailable: {error}"));
        return finish(context, notes, working);
    }
    let k = results_wanted(query);
    match query.mode {
        Mode::Bounded => {
            let (budget, window) = budget_for(query, counter);
            let neighbours = std::mem::take(&mut working.neighbours);
            let terms = plan.as_ref().map(|p| p.terms.clone()).unwrap_or_default();
            let packed = pack(PackRequest {
                picked: &working.candidates,
                deferred: &working.deferred,
                neighbours: &neighbours,
                budget,
                counter,
                terms: &terms,
                cue: AnswerCue::of_question(&query.text),
                config: &services.config.pack,
            });
            context.token_budget = Some(budget);
            context.tokens_used = packed.tokens_used;
            context.truncated = packed.truncated;
            if let Some(note) = packed.note {
                notes.push(note);
            }
            if let Some((window, prompt)) = window {
                context.max_new_tokens = Some(max_new_tokens(window, prompt, packed.tokens_used));
            }
            context.items = packed.items;
            context.context = packed.context;
            working.trace.decisions.extend(packed.decisions);
        }
        Mode::Deep => {
            let items: Vec<(Candidate, String)> = working
                .candidates
                .iter()
                .map(|c| (c.clone(), c.stored.chunk.text.clone()))
                .collect();
            let (items, text, tokens) = render_full(&items, &services.config.pack, counter);
            (context.items, context.context, context.tokens_used) = (items, text, tokens);
            notes.push(format!(
                "deep mode: no token budget; {} full chunks, {} tokens — check they fit your model's window",
                context.items.len(),
                context.tokens_used
            ));
        }
        Mode::ReadChunk => match &working.answer.chunk {
            Some(stored) => {
                let candidate = Candidate::new(stored.clone());
                let (items, text, tokens) = render_full(
                    &[(candidate, stored.chunk.text.clone())],
                    &services.config.pack,
                    counter,
                );
                (context.items, context.context, context.tokens_used) = (items, text, tokens);
                context.chunks_available = 1;
            }
            None => {
                context.error = Some(unknown_chunk(query.text.trim(), &working.answer.sources));
                context.sources = working.answer.sources.clone();
            }
        },
        Mode::ListSources => {
            context.sources = working.answer.sources.clone();
            context.chunks_available = context.sources.iter().map(|s| s.chunks).sum();
            context.context = context
                .sources
                .iter()
                .map(|s| format!("{} — {} ({} chunks)", s.source, s.title, s.chunks))
                .collect::<Vec<_>>()
                .join("\n");
            context.tokens_used = counter.count(&context.context);
        }
        Mode::Files => {
            context.sources = rank_files(&working.candidates, &working.answer.sources, k);
            context.context = context
                .sources
                .iter()
                .map(|s| {
                    format!(
                        "{} ({} of {} chunks match)",
                        s.source,
                        s.hits.unwrap_or(0),
                        s.chunks
                    )
                })
                .collect::<Vec<_>>()
                .join("\n");
            context.tokens_used = counter.count(&context.context);
        }
        Mode::SqlCompact | Mode::SqlFull => {
            let render = if query.mode == Mode::SqlCompact {
                sql_compact
            } else {
                sql_full
            };
            let items: Vec<(Candidate, String)> = working
                .candidates
                .iter()
                .map(|c| (c.clone(), render(&c.stored.chunk.text)))
                .collect();
            let (items, text, tokens) = render_full(&items, &services.config.pack, counter);
            (context.items, context.context, context.tokens_used) = (items, text, tokens);
            if query.mode == Mode::SqlFull && context.tokens_used > SQL_FULL_HINT_TOKENS {
                notes.push(format!(
                    "sql_full used {} tokens; mode sql_compact returns names, row counts and column types only",
                    context.tokens_used
                ));
            }
        }
    }
    finish(context, notes, working)
}

fn finish(mut context: Context, notes: Vec<String>, working: &mut Working) -> Context {
    context.chunks_returned = context.items.len().max(context.sources.len());
    metrics().record_decisions(&working.trace.decisions);
    if !notes.is_empty() {
        context.note = Some(notes.join("; "));
    }
    if working.job.query.trace {
        let mut trace = std::mem::take(&mut working.trace);
        trace.signals = working
            .job
            .plan
            .as_ref()
            .map(|p| p.signals.clone())
            .unwrap_or_default();
        context.trace = Some(trace);
    }
    context
}

/// Chunks of `top`'s document within 3 positions of it, from `shard` (the one holding it).
fn neighbours_of(
    shard: &dyn VectorStore,
    top: &crate::store::StoredChunk,
) -> Vec<crate::store::StoredChunk> {
    let filter = SearchFilter {
        tenant: Some(top.key.tenant.clone()),
        doc_ids: vec![top.key.doc_id.clone()],
        ..SearchFilter::default()
    };
    let order = top.chunk.order_index;
    let mut out = Vec::new();
    let _ = shard.scroll(&filter, &mut |stored| {
        if stored.chunk.order_index.abs_diff(order) <= 3 && stored.chunk.acl == top.chunk.acl {
            out.push(stored);
        }
    });
    out
}

/// A refused query's error context (and its DLQ record, written here).
pub fn refusal_context(refusal: &Refusal) -> Context {
    Context {
        query_id: refusal.error.query_id.clone().unwrap_or_default(),
        tenant: refusal.error.tenant.clone().unwrap_or_default(),
        error: Some(refusal.error.to_string()),
        ..Context::default()
    }
}

/// Extension trait: write refused queries to the DLQ and turn them into error contexts.
pub trait RefuseQueries<'scope> {
    /// DLQ records written (durably) per batch; error contexts out.
    fn refuse(self, dlq: Box<dyn DlqSink>) -> StreamVec<'scope, u64, (Context, Reply)>;
}

impl<'scope> RefuseQueries<'scope> for StreamVec<'scope, u64, Refusal> {
    fn refuse(self, mut dlq: Box<dyn DlqSink>) -> StreamVec<'scope, u64, (Context, Reply)> {
        self.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(
            Pipeline,
            "RefuseQueries",
            move |_, _| {
                move |input, output| {
                    input.for_each(|cap, data| {
                        let records: Vec<DlqRecord> = data.iter().map(|r| r.dlq.clone()).collect();
                        let mut delay = Duration::from_millis(100);
                        while let Err(error) = dlq.write(&records) {
                            tracing::warn!(%error, "query DLQ write failed; retrying");
                            std::thread::sleep(delay);
                            delay = (delay * 2).min(Duration::from_secs(5));
                        }
                        for refusal in data.iter() {
                            metrics()
                                .queries
                                .with_label_values(&["unknown", "refused"])
                                .inc();
                            tracing::warn!(
                                reason = refusal.error.reason,
                                origin = %refusal.dlq.origin,
                                error = %refusal.dlq.message,
                                "query refused"
                            );
                        }
                        output
                            .session(&cap)
                            .give_iterator(data.drain(..).map(|r| (refusal_context(&r), r.reply)));
                    });
                }
            },
        )
    }
}

/// Extension trait: publish contexts.
pub trait PublishContexts<'scope> {
    /// Publishes each batch (HTTP replies, contexts topic); a batch's time completes (for the probe
    /// that gates query offsets) once its contexts are acknowledged by the broker.
    fn publish(self, publisher: ContextPublisher) -> StreamVec<'scope, u64, ()>;
}

impl<'scope> PublishContexts<'scope> for StreamVec<'scope, u64, (Context, Reply)> {
    fn publish(self, mut publisher: ContextPublisher) -> StreamVec<'scope, u64, ()> {
        let scope = self.scope();
        self.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(
            Pipeline,
            "Publish",
            move |_, info| {
                let activator = scope.activator_for(info.address.clone());
                // Times whose contexts may still be on their way to the broker.
                let mut held: Vec<Capability<u64>> = Vec::new();
                move |input, _output| {
                    input.for_each(|cap, data| {
                        let started = Instant::now();
                        let cap = cap.retain_least(0).expect("time of the batch");
                        let contexts = publisher.publish(*cap.time(), std::mem::take(data));
                        metrics()
                            .query_stage_seconds
                            .with_label_values(&["publish"])
                            .observe(started.elapsed().as_secs_f64());
                        for (context, _) in &contexts {
                            let outcome = if context.error.is_some() {
                                "error"
                            } else {
                                "ok"
                            };
                            if !context.mode.is_empty() {
                                metrics()
                                    .queries
                                    .with_label_values(&[&context.mode, outcome])
                                    .inc();
                            }
                            if let Some(total) = context.latency_ms.get("total") {
                                metrics().query_seconds.observe(total / 1000.0);
                            }
                            metrics().record_context(context);
                        }
                        held.push(cap);
                    });
                    // A time completes once all of its contexts are on the broker.
                    held.retain(|cap| !publisher.delivered(*cap.time()));
                    if !held.is_empty() {
                        activator.activate_after(Duration::from_millis(2));
                    }
                }
            },
        )
    }
}
