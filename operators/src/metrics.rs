//! Every metric of ragstream, defined once.
//!
//! Naming: `ragstream_<noun>_<unit>[_total]`. Labels are bounded sets (an op, an outcome, a DLQ reason,
//! a partition number); never a document id, query id or free text. Operators record through the typed
//! helpers below, once per batch.

use std::sync::OnceLock;

use crate::query::Tier;

use prometheus::{
    exponential_buckets, Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// All metrics, registered in one registry.
pub struct Metrics {
    registry: Registry,
    /// Document events by op (`upsert`, `delete`) and outcome (`applied`, `stale`, `dlq`).
    pub documents: IntCounterVec,
    /// Chunks written to the index (new or changed).
    pub chunks_upserted: IntCounter,
    /// Chunks deleted from the index (retracted by an update, shrink or delete).
    pub chunks_deleted: IntCounter,
    /// Chunks of updated documents that were unchanged: neither re-embedded nor rewritten.
    pub chunks_unchanged: IntCounter,
    /// Chunks loaded from the index at start (hydration).
    pub chunks_hydrated: IntCounter,
    /// Reads of a shared index at partition assignments ([`crate::ingest::guard`]).
    pub rehydrations: IntCounter,
    /// Seconds per embedding batch.
    pub embed_seconds: Histogram,
    /// Word pieces (model tokens) embedded.
    pub embed_tokens: IntCounter,
    /// Texts embedded.
    pub embed_texts: IntCounter,
    /// Seconds per index write (upserts, deletes and flush of one batch).
    pub index_write_seconds: Histogram,
    /// Seconds per index shard optimization (segment merges, HNSW builds), run off the workers.
    pub index_optimize_seconds: Histogram,
    /// Shards being optimized right now.
    pub index_optimizations_running: IntGauge,
    /// Retries of index writes and embedding calls after an outage.
    pub retries: IntCounterVec,
    /// DLQ records by reason.
    pub dlq_records: IntCounterVec,
    /// Events ignored because their version is older than the indexed one.
    pub stale_versions: IntCounter,
    /// Seconds from an event's ingestion time to its chunks being searchable.
    pub event_to_searchable_seconds: Histogram,
    /// Now minus the ingest frontier, in seconds.
    pub ingest_frontier_lag_seconds: prometheus::Gauge,
    /// Consumer lag per partition (from librdkafka statistics).
    pub consumer_lag: IntGaugeVec,
    /// Events emitted by the sources (documents, deletes and refusals).
    pub source_events: IntCounter,
    /// Messages consumed and not yet acknowledged by the index.
    pub in_flight_messages: IntGauge,
    /// Query events received (Kafka and HTTP).
    pub queries_received: IntCounter,
    /// Queries answered, by mode and outcome (`ok`, `error`, `refused`, `cached`).
    pub queries: IntCounterVec,
    /// Seconds per query stage (`intent`, `embed`, `consistency`, `retrieve`, `fuse`, `rerank`, `dedup`, `mmr`, `pack`).
    pub query_stage_seconds: HistogramVec,
    /// Seconds from a query's arrival to its context being published.
    pub query_seconds: Histogram,
    /// Tokens of the published contexts.
    pub context_tokens: Histogram,
    /// Share of the budget the context used.
    pub context_budget_used_ratio: Histogram,
    /// Contexts with something shortened or left out for the budget.
    pub contexts_truncated: IntCounter,
    /// Index writes applied (the query cache's generation).
    pub index_generation: IntCounter,
    /// Chunks counted in this process's corpus-wide BM25 statistics (all tenants, all shards).
    pub bm25_corpus_chunks: IntGauge,
    /// Queries by intent.
    pub queries_by_intent: IntCounterVec,
    /// Queries whose fusion the lanes' evidence changed, by rule ([`crate::query::adapt`]).
    pub fusion_adapted: IntCounterVec,
    /// Fusion weight chosen per lane (`dense`, `bm25`).
    pub fusion_weight: HistogramVec,
    /// Token budget of bounded contexts.
    pub context_budget_tokens: Histogram,
    /// Chunks (or sources) returned per context.
    pub context_chunks: Histogram,
    /// Packed items per context by tier (`expanded`, `snippet`, `surrogate`, `full`).
    pub context_items: HistogramVec,
    /// Packed bytes over the bytes of distinct sentences, per context.
    pub context_redundancy_ratio: Histogram,
    /// Contexts over their budget (must stay 0).
    pub budget_overruns: IntCounter,
    /// Duplicate drops by reason (`exact`, `near_duplicate`, `overlap`).
    pub dedup_drops: IntCounterVec,
    /// MMR rejections by reason (`document_cap`, `section_cap`, `beyond_k`).
    pub mmr_rejections: IntCounterVec,
    /// Context cache lookups by result (`hit`, `miss`).
    pub query_cache: IntCounterVec,
    /// Contexts published by sink (`kafka`, `http`).
    pub contexts_published: IntCounterVec,
    /// Seconds read_your_writes queries waited.
    pub read_your_writes_wait_seconds: Histogram,
    /// Word pieces per embedding batch.
    pub embed_batch_tokens: Histogram,
    /// Build information.
    pub build_info: IntGaugeVec,
    /// Seconds of each activation of a dataflow operator on a worker, by operator name (see
    /// [`crate::activations`]); `Dataflow` is a whole worker step.
    pub operator_activation_seconds: HistogramVec,
}

impl Metrics {
    fn new() -> Self {
        let registry = Registry::new();
        let seconds_buckets = exponential_buckets(0.0005, 2.0, 18).expect("valid buckets");
        let register = |metric: Box<dyn prometheus::core::Collector>| {
            registry.register(metric).expect("unique metric");
        };
        let counter = |name: &str, help: &str| {
            let metric = IntCounter::new(name, help).expect("valid metric");
            register(Box::new(metric.clone()));
            metric
        };
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let metric = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            register(Box::new(metric.clone()));
            metric
        };
        let histogram = |name: &str, help: &str| {
            let metric = Histogram::with_opts(
                HistogramOpts::new(name, help).buckets(seconds_buckets.clone()),
            )
            .expect("valid metric");
            register(Box::new(metric.clone()));
            metric
        };
        let histogram_with = |name: &str, help: &str, buckets: Vec<f64>| {
            let metric = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets))
                .expect("valid metric");
            register(Box::new(metric.clone()));
            metric
        };
        let int_gauge = |name: &str, help: &str| {
            let metric = IntGauge::new(name, help).expect("valid metric");
            register(Box::new(metric.clone()));
            metric
        };
        let histogram_vec = |name: &str, help: &str, labels: &[&str], buckets: Vec<f64>| {
            let metric = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
                .expect("valid metric");
            register(Box::new(metric.clone()));
            metric
        };
        let counts = vec![0.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 55.0];
        let tokens = exponential_buckets(16.0, 2.0, 12).expect("valid buckets");
        let metrics = Self {
            queries_by_intent: counter_vec(
                "ragstream_queries_by_intent_total",
                "Queries by the intent the analyzer chose.",
                &["intent"],
            ),
            fusion_adapted: counter_vec(
                "ragstream_fusion_adapted_total",
                "Queries whose fusion weights the lanes' hits changed, by rule.",
                &["rule"],
            ),
            fusion_weight: histogram_vec(
                "ragstream_fusion_weight",
                "Fusion weight chosen per lane.",
                &["lane"],
                vec![0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
            ),
            context_budget_tokens: histogram_with(
                "ragstream_context_budget_tokens",
                "Token budget of bounded contexts.",
                tokens.clone(),
            ),
            context_chunks: histogram_with(
                "ragstream_context_chunks",
                "Chunks (or sources) returned per context.",
                counts.clone(),
            ),
            context_items: histogram_vec(
                "ragstream_context_items",
                "Packed items per context, by tier.",
                &["tier"],
                counts,
            ),
            context_redundancy_ratio: histogram_with(
                "ragstream_context_redundancy_ratio",
                "Packed item bytes over the bytes of their distinct sentences, per context.",
                vec![1.0, 1.01, 1.02, 1.05, 1.1, 1.2, 1.5, 2.0, 3.0],
            ),
            budget_overruns: counter(
                "ragstream_context_budget_overruns_total",
                "Contexts whose token count exceeded their budget (always a bug).",
            ),
            dedup_drops: counter_vec(
                "ragstream_dedup_drops_total",
                "Candidates dropped as duplicates, by reason.",
                &["reason"],
            ),
            mmr_rejections: counter_vec(
                "ragstream_mmr_rejections_total",
                "Candidates MMR deferred or left out, by reason.",
                &["reason"],
            ),
            query_cache: counter_vec(
                "ragstream_query_cache_total",
                "Context cache lookups by result.",
                &["result"],
            ),
            contexts_published: counter_vec(
                "ragstream_contexts_published_total",
                "Contexts published, by sink.",
                &["sink"],
            ),
            read_your_writes_wait_seconds: histogram(
                "ragstream_read_your_writes_wait_seconds",
                "Seconds read_your_writes queries waited for the ingest frontier.",
            ),
            operator_activation_seconds: histogram_vec(
                "ragstream_operator_activation_seconds",
                "Seconds a worker spent in one activation of an operator (Dataflow: a whole worker step); a query waits out the activation under way.",
                &["operator"],
                crate::activations::BUCKETS.to_vec(),
            ),
            embed_batch_tokens: histogram_with(
                "ragstream_embed_batch_tokens",
                "Word pieces per embedding batch.",
                tokens,
            ),
            build_info: {
                let gauge = IntGaugeVec::new(
                    Opts::new("ragstream_build_info", "Build information (value 1)."),
                    &["version"],
                )
                .expect("valid metric");
                register(Box::new(gauge.clone()));
                gauge
            },
            queries_received: counter(
                "ragstream_queries_received_total",
                "Query events received (Kafka and HTTP).",
            ),
            queries: counter_vec(
                "ragstream_queries_total",
                "Queries answered by mode and outcome.",
                &["mode", "outcome"],
            ),
            query_stage_seconds: {
                let metric = HistogramVec::new(
                    HistogramOpts::new("ragstream_query_stage_seconds", "Seconds per query stage.")
                        .buckets(seconds_buckets.clone()),
                    &["stage"],
                )
                .expect("valid metric");
                register(Box::new(metric.clone()));
                metric
            },
            query_seconds: histogram(
                "ragstream_query_seconds",
                "Seconds from a query's arrival to its published context.",
            ),
            context_tokens: {
                let metric = Histogram::with_opts(
                    HistogramOpts::new("ragstream_context_tokens", "Tokens of published contexts.")
                        .buckets(exponential_buckets(16.0, 2.0, 12).expect("valid buckets")),
                )
                .expect("valid metric");
                register(Box::new(metric.clone()));
                metric
            },
            context_budget_used_ratio: {
                let metric = Histogram::with_opts(
                    HistogramOpts::new(
                        "ragstream_context_budget_used_ratio",
                        "Tokens used over the token budget, per bounded context.",
                    )
                    .buckets(vec![0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0]),
                )
                .expect("valid metric");
                register(Box::new(metric.clone()));
                metric
            },
            contexts_truncated: counter(
                "ragstream_contexts_truncated_total",
                "Contexts with items shortened or left out for the budget.",
            ),
            index_generation: counter(
                "ragstream_index_generation_total",
                "Index write batches applied (cached contexts older than this are stale).",
            ),
            documents: counter_vec(
                "ragstream_documents_total",
                "Document events by op and outcome.",
                &["op", "outcome"],
            ),
            chunks_upserted: counter(
                "ragstream_chunks_upserted_total",
                "Chunks written to the index.",
            ),
            chunks_deleted: counter(
                "ragstream_chunks_deleted_total",
                "Chunks deleted from the index.",
            ),
            chunks_unchanged: counter(
                "ragstream_chunks_unchanged_total",
                "Unchanged chunks of updated documents, not re-embedded.",
            ),
            source_events: counter(
                "ragstream_source_events_total",
                "Events emitted by the sources.",
            ),
            chunks_hydrated: counter(
                "ragstream_chunks_hydrated_total",
                "Chunks loaded from the index: at start, and from a shared index at assignments.",
            ),
            rehydrations: counter(
                "ragstream_rehydrations_total",
                "Reads of the shared index at partition assignments.",
            ),
            embed_seconds: histogram(
                "ragstream_embed_batch_seconds",
                "Seconds per embedding batch.",
            ),
            embed_tokens: counter("ragstream_embed_tokens_total", "Word pieces embedded."),
            embed_texts: counter("ragstream_embed_texts_total", "Texts embedded."),
            index_write_seconds: histogram(
                "ragstream_index_write_seconds",
                "Seconds per index write batch, flush included.",
            ),
            index_optimize_seconds: histogram(
                "ragstream_index_optimize_seconds",
                "Seconds per index shard optimization (segment merges and HNSW builds).",
            ),
            bm25_corpus_chunks: int_gauge(
                "ragstream_bm25_corpus_chunks",
                "Chunks counted in this process's corpus-wide BM25 statistics (all tenants and shards).",
            ),
            index_optimizations_running: int_gauge(
                "ragstream_index_optimizations_running",
                "Index shards being optimized right now.",
            ),
            retries: counter_vec(
                "ragstream_retries_total",
                "Retries after an outage, by component.",
                &["component"],
            ),
            dlq_records: counter_vec(
                "ragstream_dlq_records_total",
                "DLQ records by reason.",
                &["reason"],
            ),
            stale_versions: counter(
                "ragstream_stale_versions_total",
                "Events older than the indexed version, ignored.",
            ),
            event_to_searchable_seconds: histogram(
                "ragstream_event_to_searchable_seconds",
                "Seconds from ingestion to searchable.",
            ),
            ingest_frontier_lag_seconds: {
                let gauge = prometheus::Gauge::new(
                    "ragstream_ingest_frontier_lag_seconds",
                    "Now minus the ingest frontier.",
                )
                .expect("valid metric");
                register(Box::new(gauge.clone()));
                gauge
            },
            consumer_lag: {
                let gauge = IntGaugeVec::new(
                    Opts::new(
                        "ragstream_consumer_lag_messages",
                        "Consumer lag per partition.",
                    ),
                    &["partition"],
                )
                .expect("valid metric");
                register(Box::new(gauge.clone()));
                gauge
            },
            in_flight_messages: int_gauge(
                "ragstream_in_flight_messages",
                "Consumed messages not yet acknowledged by the index.",
            ),
            registry,
        };
        // Pre-create bounded label sets so dashboards see zeros rather than gaps.
        for op in ["upsert", "delete"] {
            for outcome in ["applied", "stale", "dlq"] {
                metrics.documents.with_label_values(&[op, outcome]);
            }
        }
        for reason in crate::ingest::decode::DecodeReason::ALL {
            metrics.dlq_records.with_label_values(&[reason.as_str()]);
        }
        for stage in QUERY_STAGES {
            metrics.query_stage_seconds.with_label_values(&[stage]);
        }
        for lane in ["dense", "bm25"] {
            metrics.fusion_weight.with_label_values(&[lane]);
        }
        for tier in [Tier::Expanded, Tier::Snippet, Tier::Surrogate, Tier::Full] {
            metrics.context_items.with_label_values(&[tier.as_str()]);
        }
        for (intent, ..) in crate::query::intent::PRESETS {
            metrics.queries_by_intent.with_label_values(&[intent]);
        }
        for reason in DEDUP_REASONS {
            metrics.dedup_drops.with_label_values(&[reason]);
        }
        for reason in MMR_REASONS {
            metrics.mmr_rejections.with_label_values(&[reason]);
        }
        for result in ["hit", "miss"] {
            metrics.query_cache.with_label_values(&[result]);
        }
        for sink in ["kafka", "http"] {
            metrics.contexts_published.with_label_values(&[sink]);
        }
        metrics
            .build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        #[cfg(target_os = "linux")]
        {
            let process = prometheus::process_collector::ProcessCollector::for_self();
            let _ = metrics.registry.register(Box::new(process));
        }
        metrics
    }

    /// The registry (for extra collectors).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buffer)
            .expect("text encoding");
        String::from_utf8(buffer).expect("prometheus text is UTF-8")
    }

    /// Records a DLQ record.
    pub fn record_dlq(&self, reason: &str) {
        self.dlq_records.with_label_values(&[reason]).inc();
    }

    /// Records the pipeline's drop and defer decisions of one query, labelled by their cause.
    pub fn record_decisions(&self, decisions: &[crate::query::Decision]) {
        use crate::query::Cause;
        for decision in decisions {
            let counter = match decision.cause {
                Cause::Exact | Cause::NearDuplicate | Cause::Overlap => &self.dedup_drops,
                Cause::DocumentCap | Cause::SectionCap | Cause::BeyondK => &self.mmr_rejections,
                Cause::LaneDuplicate
                | Cause::EvidenceRule
                | Cause::OverBudget
                | Cause::Fits
                | Cause::Shortened
                | Cause::BudgetLeft => continue,
            };
            counter.with_label_values(&[decision.cause.as_str()]).inc();
        }
    }

    /// Records a published context: tokens, budget use, tiers, redundancy, overruns.
    pub fn record_context(&self, context: &crate::query::Context) {
        self.context_tokens.observe(context.tokens_used as f64);
        self.context_chunks.observe(context.chunks_returned as f64);
        if context.truncated {
            self.contexts_truncated.inc();
        }
        if let Some(budget) = context.token_budget {
            self.context_budget_tokens.observe(budget as f64);
            self.context_budget_used_ratio
                .observe(context.tokens_used as f64 / budget.max(1) as f64);
            if context.tokens_used > budget {
                self.budget_overruns.inc();
            }
        }
        if context.error.is_some() || context.items.is_empty() {
            return;
        }
        for tier in [Tier::Expanded, Tier::Snippet, Tier::Surrogate, Tier::Full] {
            let count = context.items.iter().filter(|i| i.tier == tier).count();
            self.context_items
                .with_label_values(&[tier.as_str()])
                .observe(count as f64);
        }
        let mut seen = std::collections::HashSet::new();
        let (mut packed, mut distinct) = (0usize, 0usize);
        for item in &context.items {
            packed += item.text.len();
            for (from, to) in crate::query::pack::sentences(&item.text) {
                let sentence = &item.text[from..to];
                if seen.insert(sentence) {
                    distinct += sentence.len();
                }
            }
        }
        if distinct > 0 {
            self.context_redundancy_ratio
                .observe(packed as f64 / distinct as f64);
        }
    }

    /// Records a document event's outcome.
    pub fn record_document(&self, op: &str, outcome: &str) {
        self.documents.with_label_values(&[op, outcome]).inc();
    }
}

/// Stages of `ragstream_query_stage_seconds`.
pub const QUERY_STAGES: [&str; 13] = [
    "decode",
    "intent",
    "embed",
    "consistency_wait",
    "retrieve",
    "retrieve_dense",
    "retrieve_bm25",
    "fuse",
    "rerank",
    "dedup",
    "mmr",
    "pack",
    "publish",
];

/// Bounded reasons of `ragstream_dedup_drops_total`.
pub const DEDUP_REASONS: [&str; 3] = ["exact", "near_duplicate", "overlap"];
/// Bounded reasons of `ragstream_mmr_rejections_total`.
pub const MMR_REASONS: [&str; 3] = ["document_cap", "section_cap", "beyond_k"];

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}
