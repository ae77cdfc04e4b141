//! Every metric of ragstream, defined once.
//!
//! Naming: `ragstream_<noun>_<unit>[_total]`. Labels are bounded sets (an op, an outcome, a DLQ reason,
//! a partition number); never a document id, query id or free text. Operators record through the typed
//! helpers below, once per batch.

use std::sync::OnceLock;

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
    /// Seconds per embedding batch.
    pub embed_seconds: Histogram,
    /// Word pieces (model tokens) embedded.
    pub embed_tokens: IntCounter,
    /// Texts embedded.
    pub embed_texts: IntCounter,
    /// Seconds per index write (upserts, deletes and flush of one batch).
    pub index_write_seconds: Histogram,
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
}

impl Metrics {
    fn new() -> Self {
        let registry = Registry::new();
        let seconds_buckets = exponential_buckets(0.0005, 2.0, 18).expect("valid buckets");
        let counter = |name: &str, help: &str| {
            let metric = IntCounter::new(name, help).expect("valid metric");
            registry
                .register(Box::new(metric.clone()))
                .expect("unique metric");
            metric
        };
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let metric = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(metric.clone()))
                .expect("unique metric");
            metric
        };
        let histogram = |name: &str, help: &str| {
            let metric = Histogram::with_opts(
                HistogramOpts::new(name, help).buckets(seconds_buckets.clone()),
            )
            .expect("valid metric");
            registry
                .register(Box::new(metric.clone()))
                .expect("unique metric");
            metric
        };
        let metrics = Self {
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
                registry
                    .register(Box::new(metric.clone()))
                    .expect("unique metric");
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
                registry
                    .register(Box::new(metric.clone()))
                    .expect("unique metric");
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
                registry
                    .register(Box::new(metric.clone()))
                    .expect("unique metric");
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
                "Chunks loaded from the index at start.",
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
                registry
                    .register(Box::new(gauge.clone()))
                    .expect("unique metric");
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
                registry
                    .register(Box::new(gauge.clone()))
                    .expect("unique metric");
                gauge
            },
            in_flight_messages: {
                let gauge = IntGauge::new(
                    "ragstream_in_flight_messages",
                    "Consumed messages not yet acknowledged by the index.",
                )
                .expect("valid metric");
                registry
                    .register(Box::new(gauge.clone()))
                    .expect("unique metric");
                gauge
            },
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

    /// Records a document event's outcome.
    pub fn record_document(&self, op: &str, outcome: &str) {
        self.documents.with_label_values(&[op, outcome]).inc();
    }
}

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}
