//! The records the query operators pass along ([`QueryJob`], [`Working`], [`Refusal`], [`Reply`]) and
//! what they share ([`QueryServices`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use timely::dataflow::{ProbeHandle, StreamVec};

use super::search::{QueryVectors, ShardAnswer};
use crate::embed::service::InferenceService;
use crate::ingest::dlq::DlqRecord;
use crate::metrics::metrics;
use crate::stage::map_stage;
use crate::store::stats::CorpusStats;
use crate::store::VectorStore;
use crate::tokens::Encoding;
use ragstream_core::progress::IngestProgress;
use ragstream_core::query::decode::QueryError;
use ragstream_core::query::{Candidate, Mode, Plan, Query, QueryConfig, Stage, Trace, Watermark};

/// Where a context goes besides the contexts topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// The HTTP request with this ticket waits for it.
    Http(u64),
    /// Only the contexts topic; the lease of the consumer that read it (see
    /// [`ragstream_core::query::ledger`]).
    Kafka(ragstream_core::query::ledger::Lease),
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
    pub latency: BTreeMap<Stage, f64>,
    /// Notes for the context (consistency timeout, …).
    pub notes: Vec<String>,
    /// What the index reflected when the query was searched.
    pub watermark: Watermark,
    /// The index generation read before retrieval: the context is cached under it, so a write that
    /// lands between retrieval and packing leaves the entry stale for the next lookup, not fresh.
    pub generation: u64,
    /// HyDE: the hypothetical passages whose vectors join the dense query.
    #[serde(default)]
    pub hyde: Option<HydePassage>,
    /// An optional endpoint fell back for this query: its context is not cached.
    #[serde(default)]
    pub degraded: bool,
}

/// The HyDE passages of a query.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HydePassage {
    /// The passages the model wrote (at least one).
    pub texts: Vec<String>,
    /// Whether they came from the passage cache.
    pub cached: bool,
    /// The passages' share of the dense query (1 under `hyde`).
    pub weight: f32,
    /// How many passages were asked for (the query's `num_hypotheses`, else its preset's).
    #[serde(default)]
    pub asked: usize,
    /// How they shape the dense query.
    pub strategy: ragstream_core::query::endpoints::HydeStrategy,
    /// Whether their vectors joined the dense query (set by EmbedQuery).
    #[serde(default)]
    pub joined: bool,
}

pub(crate) fn now_micros() -> u64 {
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
            hyde: None,
            degraded: false,
        }
    }

    pub(crate) fn record(&mut self, stage: Stage, started: Instant) {
        self.record_seconds(stage, started.elapsed().as_secs_f64());
    }

    /// Records `seconds` spent in `stage`: the metric and the context's `latency_ms`.
    pub(crate) fn record_seconds(&mut self, stage: Stage, seconds: f64) {
        metrics().observe_stage(stage, seconds);
        *self.latency.entry(stage).or_default() += seconds * 1000.0;
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
    /// The query's settings: the job's `[query]` section with the query's preset resolved, once,
    /// at Gather ([`QueryConfig::settings`]). Every step after it reads them here.
    pub settings: Arc<QueryConfig>,
    /// The gathered shard answers.
    pub answer: ShardAnswer,
    /// Candidates (after fusion, in the current order).
    pub candidates: Vec<Candidate>,
    /// Candidates held back by MMR caps.
    pub deferred: Vec<Candidate>,
    /// The bottom of the evidence stop's scale: one below the lowest reranked score (without a rerank
    /// plan, the lowest score).
    pub score_floor: f32,
    /// Decisions so far.
    pub trace: Trace,
    /// Chunks that passed the filters (before dedup and MMR).
    pub available: usize,
    /// Chunks of the top candidate's document around it (for the expanded tier), fetched on the
    /// worker owning its shard.
    pub neighbours: Vec<crate::store::StoredChunk>,
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
    /// The reranker endpoint after the built-in rerank (`query.rerank.kind`), if any.
    pub reranker: Option<Arc<dyn ragstream_core::query::endpoints::Reranker>>,
    /// The HyDE passage writer (`query.hyde`), if enabled.
    pub writer: Option<Arc<dyn ragstream_core::query::endpoints::PassageWriter>>,
    /// How often this process packed each chunk (the importance policy of surrogate tiers).
    pub access: Arc<std::sync::Mutex<ragstream_core::query::surrogate::AccessCounts>>,
}

impl std::fmt::Debug for QueryServices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryServices")
            .field("shards", &self.shards.len())
            .finish()
    }
}

impl QueryServices {
    pub(crate) fn watermark(&self) -> Watermark {
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
    pub(crate) fn consistent(&self, job: &QueryJob) -> bool {
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

impl Working {
    /// Whether the query goes through the ranking steps (Fuse to Pack): a retrieving mode and no
    /// error from the shards. The others leave the chain at Lookup, right after Gather.
    pub fn is_ranked(&self) -> bool {
        self.answer.error.is_none()
            && matches!(
                self.job.query.mode,
                Mode::Bounded | Mode::Deep | Mode::Files | Mode::SqlCompact | Mode::SqlFull
            )
    }

    /// With `trace`, records the candidates in their current order (after a rerank).
    pub fn trace_ranking(&mut self) {
        if self.job.query.trace {
            self.trace.candidates = self
                .candidates
                .iter()
                .map(ragstream_core::query::TraceCandidate::from)
                .collect();
        }
    }
}

/// A ranking step, the timely operator `name`: `logic` runs on each [`ranked`] record and its time
/// is recorded under `stage`; other records pass untouched.
pub(crate) fn ranked_step<'scope>(
    stream: StreamVec<'scope, u64, Working>,
    name: &'static str,
    stage: Stage,
    mut logic: impl FnMut(&mut Working) + 'static,
) -> StreamVec<'scope, u64, Working> {
    map_stage(stream, name, move |mut working: Working| {
        if working.is_ranked() {
            let started = Instant::now();
            logic(&mut working);
            working.job.record(stage, started);
        }
        working
    })
}
