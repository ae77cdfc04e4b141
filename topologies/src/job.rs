//! The job: what one process's workers share ([`ProcessParts`]: the inference service, this
//! process's shards, the HTTP ingress, the corpus statistics, the checkpoint …) and the dataflow each
//! worker builds from it ([`ProcessParts::build_worker`]): its shard hydrated, then ingest and the
//! query flow in one dataflow, the query flow reading the index changes ingest made.
//!
//! The binary's runtime opens the parts (and serves HTTP); the wiring is here, with the other
//! topologies.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use ragstream_core::query::endpoints::{PassageWriter, Reranker};
use ragstream_core::query::invalidate::InvalidationLog;
use ragstream_core::query::surrogate::AccessCounts;
use ragstream_operators::embed::service::InferenceService;
use ragstream_operators::ingest::chunk::{Chunker, ChunkerConfig};
use ragstream_operators::ingest::guard::Rehydration;
use ragstream_operators::ingest::hydrate::hydrate;
use ragstream_operators::ingest::written::Finished;
use ragstream_operators::io::checkpoint::IndexCheckpoint;
use ragstream_operators::io::local_source::{DocumentIngress, LocalInput};
use ragstream_operators::io::query_source::{HttpIngress, IngestProgress};
use ragstream_operators::model::DocKey;
use ragstream_operators::query::job::QueryServices;
use ragstream_operators::store::stats::CorpusStats;
use ragstream_operators::store::VectorStore;
use ragstream_operators::tokens::Encoding;
use timely::dataflow::ProbeHandle;
use timely::worker::Worker;

use crate::config::{Config, IndexKind, SourceKind};
use crate::factory::{self, SourceParts};
use crate::ingest::{ingest, IngestParts};
use crate::query::{query, QueryParts};

/// What the workers of one process share.
pub struct ProcessParts {
    /// The validated configuration.
    pub config: Arc<Config>,
    /// Reads the files of document events (the job's sandbox).
    pub files: Arc<dyn ragstream_operators::ingest::extract::FileReader>,
    /// The tokenizer chunks and budgets are counted with.
    pub encoding: Encoding,
    /// The process's inference service (every worker's ingest and queries).
    pub service: InferenceService,
    /// This process's shards, one per worker, in worker order.
    pub shards: Arc<Vec<Arc<dyn VectorStore>>>,
    /// The global index of this process's first worker.
    pub first_worker: usize,
    /// The first worker of every process (each keeps its process's copy of the corpus statistics).
    pub stats_leaders: Vec<usize>,
    /// The corpus's BM25 statistics, one copy per process.
    pub corpus_stats: Arc<CorpusStats>,
    /// How far ingest has come (for `read_your_writes`).
    pub progress: Arc<IngestProgress>,
    /// The embedded index's own position in the documents topic (Kafka source, edge index).
    pub checkpoint: Option<Arc<IndexCheckpoint>>,
    /// The local source's input, taken by the first worker.
    pub local_input: Arc<Mutex<Option<LocalInput>>>,
    /// Documents posted over HTTP into a local source.
    pub posted: Option<Arc<DocumentIngress>>,
    /// `POST /v1/query` of this process, shared by its workers.
    pub ingress: Arc<HttpIngress>,
    /// Invalidations kept for `GET /v1/invalidations?since=`.
    pub invalidation_log: Arc<Mutex<InvalidationLog>>,
    /// The reranker endpoint, if configured.
    pub reranker: Option<Arc<dyn Reranker>>,
    /// The HyDE writer endpoint, if configured.
    pub writer: Option<Arc<dyn PassageWriter>>,
    /// Access counts of the importance surrogate policy.
    pub access: Arc<Mutex<AccessCounts>>,
    /// Set to stop the sources.
    pub shutdown: Arc<AtomicBool>,
    /// What each tenant holds in this process's index, under `ingest.quotas`.
    pub usage: Arc<ragstream_operators::ingest::quota::Usage>,
    /// The per-tenant change feed of the standing queries (`standing.enabled`).
    pub changes: Option<Arc<ragstream_operators::ingest::written::Changes>>,
    /// Where the queries topic's standing events go (standing queries on, documents from Kafka).
    pub standing_intake: Option<Arc<dyn ragstream_operators::io::query_source::StandingIntake>>,
}

impl ProcessParts {
    /// Builds `worker`'s dataflow: hydrates its shard, then wires ingest and the query flow. Panics
    /// where a worker cannot start (its shard unreadable, a sink that cannot be opened): the job
    /// stops with the reason.
    pub fn build_worker(&self, worker: &mut Worker) {
        let config = &self.config;
        let index = worker.index();
        let peers = worker.peers();
        let store = self.shards[index - self.first_worker].clone();
        let owns = move |key: &DocKey| (key.route() % peers as u64) as usize == index;
        let hydrated = hydrate(store.as_ref(), &owns)
            .unwrap_or_else(|e| panic!("hydrating shard {index}: {e}"));
        tracing::info!(
            worker = index,
            documents = hydrated.documents.len(),
            chunks = hydrated.chunk_count(),
            "hydrated"
        );
        let chunker = Chunker::new(ChunkerConfig {
            encoding: self.encoding,
            prose_tokens: config.chunking.prose_tokens,
            code_tokens: config.chunking.code_tokens,
            schema_tokens: config.chunking.schema_tokens,
            overlap_ratio: config.chunking.overlap_ratio,
        });
        let dlq = factory::dlq_sink(config).unwrap_or_else(|e| panic!("{e:#}"));
        let query_dlq = factory::dlq_sink(config).unwrap_or_else(|e| panic!("{e:#}"));
        let acks = ProbeHandle::new();
        let kafka_queries = factory::query_kafka(config)
            .map(|kafka| kafka.with_standing(self.standing_intake.clone()));
        let (publisher, invalidations) =
            factory::query_publishers(config, self.ingress.clone(), self.invalidation_log.clone())
                .unwrap_or_else(|e| panic!("{e:#}"));
        let services = self.query_services(peers, &acks);
        let finite = config.source.kind == SourceKind::Jsonl && !config.runtime.serve;
        let input = if index == self.first_worker {
            self.local_input.lock().expect("local input").take()
        } else {
            None
        };
        let posted = input.as_ref().and(self.posted.clone());
        // A shared index (the server's one collection) is read again at every assignment.
        let rehydration = (config.index.kind == IndexKind::Server).then(|| Rehydration {
            store: store.clone(),
            owns: Arc::new(owns),
            acks: acks.clone(),
        });
        worker.dataflow::<u64, _, _>(|scope| {
            let (events, assigned) = factory::document_source(
                scope,
                config,
                SourceParts {
                    local: input,
                    checkpoint: self.checkpoint.clone(),
                    acks: acks.clone(),
                    shutdown: self.shutdown.clone(),
                    progress: self.progress.clone(),
                    posted,
                    files: self.files.clone(),
                },
            );
            let changed = ingest(
                scope,
                events,
                assigned,
                IngestParts {
                    hydrated,
                    chunker,
                    embedder: self.service.clone(),
                    evidence_units: config.embedder.evidence(),
                    bm25: config.index.bm25,
                    store,
                    optimize: (&config.index.tuning).into(),
                    dlq,
                    stats: self.corpus_stats.clone(),
                    stats_leaders: self.stats_leaders.clone(),
                    rehydration,
                    fair: config.ingest.fair,
                    finished: Finished {
                        written: self.posted.as_ref().map(|posted| posted.written()),
                        changes: self.changes.clone(),
                        ship: self.stats_leaders.len() > 1,
                    },
                    usage: self.usage.clone(),
                },
                &acks,
            );
            query(
                scope,
                QueryParts {
                    services,
                    kafka: kafka_queries,
                    http: Some(self.ingress.clone()),
                    publisher,
                    dlq: query_dlq,
                    shutdown: self.shutdown.clone(),
                    finite_ingest: finite.then(|| acks.clone()),
                    invalidations: Some(Box::new(invalidations)),
                },
                changed,
            );
        });
    }

    /// The query flow's services on a worker of `peers`, whose ingest acknowledges through `acks`.
    fn query_services(&self, peers: usize, acks: &ProbeHandle<u64>) -> QueryServices {
        QueryServices {
            shards: self.shards.clone(),
            first_worker: self.first_worker,
            peers,
            shared_index: self.config.index.kind == IndexKind::Server,
            embedder: self.service.clone(),
            // Resolved at load; resolved here too for a configuration built in code (a preset that
            // does not resolve was refused by `Config::validate`, and a query naming it is refused).
            config: Arc::new(
                self.config
                    .query
                    .clone()
                    .with_presets()
                    .unwrap_or_else(|_| self.config.query.clone()),
            ),
            encoding: self.encoding,
            progress: self.progress.clone(),
            acks: acks.clone(),
            stats: self.corpus_stats.clone(),
            reranker: self.reranker.clone(),
            writer: self.writer.clone(),
            access: self.access.clone(),
        }
    }
}
