//! The query topology: wiring only. The chain it wires is drawn once, in ARCHITECTURE.md, "Query
//! flow"; the code below reads in the same order.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use timely::dataflow::operators::{Concat, OkErr, Probe};
use timely::dataflow::{ProbeHandle, Scope, StreamVec};

use ragstream_core::query::cache::LruTtl;
use ragstream_operators::io::context_sink::ContextPublisher;
use ragstream_operators::io::dlq_sink::DlqSink;
use ragstream_operators::io::query_source::{
    query_source, DecodeRules, HttpIngress, QueryKafkaConfig,
};
use ragstream_operators::query::cache_lookup::CacheLookup;
use ragstream_operators::query::consistency::AwaitConsistency;
use ragstream_operators::query::dedup::Dedup;
use ragstream_operators::query::embed_query::EmbedQuery;
use ragstream_operators::query::fuse::Fuse;
use ragstream_operators::query::hyde::Hyde;
use ragstream_operators::query::intent::Intent;
use ragstream_operators::query::invalidation::{Cite, Invalidate, InvalidationSink, Invalidator};
use ragstream_operators::query::job::{QueryJob, QueryServices, Refusal};
use ragstream_operators::query::lookup::Lookup;
use ragstream_operators::query::mmr::Mmr;
use ragstream_operators::query::neighbours::Neighbours;
use ragstream_operators::query::pack::Pack;
use ragstream_operators::query::publish::Publish;
use ragstream_operators::query::refuse::RefuseQueries;
use ragstream_operators::query::rerank::Rerank;
use ragstream_operators::query::rerank_endpoint::RerankEndpoint;
use ragstream_operators::query::retrieve::Retrieve;
use ragstream_operators::stage::map_stage;

/// Everything one worker's query flow needs.
pub struct QueryParts {
    /// Shards, embedder, tunables, ingest progress.
    pub services: QueryServices,
    /// The queries topic, when documents come from Kafka.
    pub kafka: Option<QueryKafkaConfig>,
    /// `POST /v1/query` requests (drained by worker 0).
    pub http: Option<Arc<HttpIngress>>,
    /// Where contexts go.
    pub publisher: ContextPublisher,
    /// Where refused queries go.
    pub dlq: Box<dyn DlqSink>,
    /// Stops the source.
    pub shutdown: Arc<AtomicBool>,
    /// With a finite document input: the ingest probe; the query flow stops once it is done.
    pub finite_ingest: Option<ProbeHandle<u64>>,
    /// Where invalidations of published contexts go (`None`, or `query.invalidations.enabled = false`:
    /// no citation is kept).
    pub invalidations: Option<Box<dyn InvalidationSink>>,
}

/// Wires the query flow; `changed` are the chunk ids the index writes deleted or changed (ingest's
/// output). Returns the probe of published contexts.
// Refused queries travel as data to the DLQ writer, not as error paths.
#[allow(clippy::result_large_err)]
pub fn query<'scope>(
    scope: Scope<'scope, u64>,
    parts: QueryParts,
    changed: StreamVec<'scope, u64, uuid::Uuid>,
) -> ProbeHandle<u64> {
    let QueryParts {
        services,
        kafka,
        http,
        publisher,
        dlq,
        shutdown,
        finite_ingest,
        invalidations,
    } = parts;
    let config = services.config.clone();
    let published = ProbeHandle::new();
    let front = http.clone();
    let events = query_source(
        scope,
        kafka,
        http,
        DecodeRules::of(&config),
        published.clone(),
        services.progress.clone(),
        publisher.handover(),
        shutdown,
        finite_ingest,
    );
    let (jobs, refused): (
        StreamVec<'scope, u64, QueryJob>,
        StreamVec<'scope, u64, Refusal>,
    ) = events.ok_err(|event| event);
    let rules = config.clone();
    let jobs = map_stage(jobs, "JobRules", move |mut job: QueryJob| {
        job.query.apply_job_rules(&rules);
        job
    });
    let cache = Arc::new(Mutex::new(LruTtl::new(
        config.cache_entries,
        config.cache_ttl_secs,
    )));
    if let Some(front) = &front {
        front.caches.register(cache.clone());
    }
    // A cache hit leaves here and joins again before Cite and Publish.
    let (misses, hits) = jobs
        .await_consistency(services.clone())
        .cache_lookup(cache.clone(), services.progress.clone());
    let planned = misses.intent(config.intents.clone());
    let planned = match &services.writer {
        Some(writer) => planned.hyde(writer.clone(), config.clone()),
        // A query that asks for HyDE where the job has no writer is told so.
        None => map_stage(planned, "NoHyde", |mut job: QueryJob| {
            if job.query.hyde.is_some_and(|s| s.weight(0.0).is_some()) {
                job.notes.push(
                    "hyde asked for, but the job has no HyDE writer (query.hyde.enabled = false): the query's own vector was used"
                        .into(),
                );
            }
            job
        }),
    };
    let (ranked, looked_up) = planned
        .embed_query(services.clone())
        .retrieve(services.clone())
        .lookup(services.clone(), cache.clone());
    let reranked = ranked.fuse().rerank();
    let reranked = match &services.reranker {
        Some(reranker) => reranked.rerank_endpoint(
            reranker.clone(),
            config.rerank.endpoint_window,
            config.rerank.endpoint.concurrency.get(),
            config.rerank.endpoint.timeout_ms,
        ),
        None => reranked,
    };
    let contexts = reranked
        .dedup()
        .mmr()
        .neighbours(services.clone())
        .pack(services.clone(), cache)
        .concat(looked_up)
        .concat(hits);
    let settings = config.invalidations;
    let contexts = match invalidations {
        Some(sink) if settings.enabled => {
            let invalidator =
                Invalidator::new(settings.ttl_secs, settings.max_citations, sink, services);
            changed.invalidate(invalidator.clone());
            contexts.cite(invalidator)
        }
        _ => contexts,
    };
    contexts
        .concat(refused.refuse_queries(dlq))
        .publish(publisher)
        .probe_with(&published);
    published
}
