//! Every metric of ragstream, defined once.
//!
//! Naming: `ragstream_<noun>_<unit>[_total]`. Labels are bounded sets (an op, an outcome, a DLQ reason,
//! a partition number); never a document id, query id or free text. Operators record through the typed
//! helpers below and the label types of [`labels`], once per batch.

use std::sync::OnceLock;

pub mod labels;

pub use labels::{CacheResult, Endpoint, EndpointOutcome, Lane, Moved, QueryOutcome, Sink};

use ragstream_core::query::intent::Intent;
use ragstream_core::query::{Stage, Tier};

use prometheus::core::Collector;
use prometheus::{
    exponential_buckets, Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Declares every metric once: its field, type, name and help (the help is also the field's doc),
/// and how it is built. `Metrics::declared` builds and registers them all.
macro_rules! declare_metrics {
    ($( $field:ident: $ty:ty = $make:ident($name:literal, $help:literal $(, $extra:expr)* ); )*) => {
        /// All metrics, registered in one registry.
        pub struct Metrics {
            registry: Registry,
            $(
                #[doc = $help]
                #[doc = ""]
                #[doc = concat!("Exposed as `", $name, "`.")]
                pub $field: $ty,
            )*
        }

        impl Metrics {
            fn declared() -> Self {
                let registry = Registry::new();
                Self {
                    $( $field: register(&registry, $make($name, $help $(, $extra)*)), )*
                    registry,
                }
            }
        }
    };
}

declare_metrics! {
    // Ingest.
    documents: IntCounterVec = counter_vec("ragstream_documents_total",
        "Document events by op (upsert, delete) and outcome (applied, stale, dlq).", &["op", "outcome"]);
    source_events: IntCounter = counter("ragstream_source_events_total",
        "Events emitted by the sources (documents, deletes and refusals).");
    in_flight_messages: IntGauge = int_gauge("ragstream_in_flight_messages",
        "Consumed messages not yet acknowledged by the index.");
    consumer_lag: IntGaugeVec = int_gauge_vec("ragstream_consumer_lag_messages",
        "Consumer lag per partition (from librdkafka statistics).", &["partition"]);
    stale_versions: IntCounter = counter("ragstream_stale_versions_total",
        "Events older than the indexed version, ignored.");
    chunks_upserted: IntCounter = counter("ragstream_chunks_upserted_total",
        "Chunks written to the index (new or changed).");
    chunks_deleted: IntCounter = counter("ragstream_chunks_deleted_total",
        "Chunks deleted from the index (retracted by an update, shrink or delete).");
    chunks_unchanged: IntCounter = counter("ragstream_chunks_unchanged_total",
        "Unchanged chunks of updated documents: neither re-embedded nor rewritten.");
    chunks_hydrated: IntCounter = counter("ragstream_chunks_hydrated_total",
        "Chunks loaded from the index: at start, and from a shared index at assignments.");
    rehydrations: IntCounter = counter("ragstream_rehydrations_total",
        "Reads of the shared index at partition assignments.");
    invalidations: IntCounter = counter("ragstream_invalidations_total",
        "Published contexts invalidated: a chunk they cite was deleted or changed.");
    standing_held: IntGauge = int_gauge("ragstream_standing_queries",
        "Standing queries (subscriptions) held by the process.");
    standing_evaluations: IntCounter = counter("ragstream_standing_evaluations_total",
        "Evaluations of standing queries after their tenant's documents changed (first versions not counted).");
    standing_unchanged: IntCounter = counter("ragstream_standing_unchanged_total",
        "Evaluations of standing queries whose context had not moved: nothing published.");
    standing_filtered: IntCounter = counter("ragstream_standing_filtered_total",
        "Standing queries a tenant's change was found not to move (no re-evaluation).");
    standing_moved: IntCounterVec = counter_vec("ragstream_standing_moved_total",
        "Standing queries a tenant's change may move, by the first reason found: cites (a changed document has a candidate), dense or bm25 (a new chunk enters that lane), drift (corpus statistics moved the BM25 scores), unfiltered (no probe, or the change came without its chunks), rest (drift caught up once the tenant was quiet).", &["reason"]);
    standing_versions: IntCounter = counter("ragstream_standing_versions_total",
        "Versions of standing queries published (first versions included).");
    standing_change_to_version_seconds: Histogram = histogram("ragstream_standing_change_to_version_seconds",
        "Seconds from the index writers finishing a tenant's change to a standing query's new version reflecting it.", seconds());
    citations_held: IntGauge = int_gauge("ragstream_citations_held",
        "Chunk citations of published contexts kept to invalidate them (all workers of the process).");
    dlq_records: IntCounterVec = counter_vec("ragstream_dlq_records_total",
        "DLQ records by reason.", &["reason"]);
    quota_refusals: IntCounterVec = counter_vec("ragstream_quota_refusals_total",
        "Documents refused for a tenant's quota (ingest.quotas), by limit (documents, chunks, bytes, chunks_per_document).", &["limit"]);
    tenant_documents: IntGaugeVec = int_gauge_vec("ragstream_tenant_documents",
        "Documents a tenant holds in this process's index (the first 64 tenants seen hold a label each).", &["tenant"]);
    tenant_chunks: IntGaugeVec = int_gauge_vec("ragstream_tenant_chunks",
        "Chunks a tenant holds in this process's index (the first 64 tenants seen hold a label each).", &["tenant"]);
    tenant_bytes: IntGaugeVec = int_gauge_vec("ragstream_tenant_bytes",
        "Text bytes of a tenant's documents in this process's index (the first 64 tenants seen hold a label each).", &["tenant"]);
    http_rate_limited: IntCounter = counter("ragstream_http_rate_limited_total",
        "Requests answered 429 rate_limited (a credential over http.token_requests_per_second; the log names it at debug level).");
    sandbox_reads: IntCounterVec = counter_vec("ragstream_sandbox_reads_total",
        "Files (HTML, PDF, DOCX) read by the sandbox's child processes, by outcome (read, refused, memory_limit, time_limit, output_limit, crashed).", &["outcome"]);
    retries: IntCounterVec = counter_vec("ragstream_retries_total",
        "Retries of index writes and embedding calls after an outage, by component.", &["component"]);
    outage: IntGaugeVec = int_gauge_vec("ragstream_outage",
        "Callers retrying a dependency right now (index, embedder, dlq, query_dlq, rehydrate): above 0 while it is out; ingest pauses meanwhile and commits nothing.", &["dependency"]);
    event_to_searchable_seconds: Histogram = histogram("ragstream_event_to_searchable_seconds",
        "Seconds from an event's ingestion time to its chunks being searchable.", seconds());
    ingest_frontier_lag_seconds: Gauge = gauge("ragstream_ingest_frontier_lag_seconds",
        "Now minus the ingest frontier, in seconds.");

    // Embedding.
    embed_seconds: Histogram = histogram("ragstream_embed_batch_seconds",
        "Seconds per embedding batch.", seconds());
    embed_tokens: IntCounter = counter("ragstream_embed_tokens_total", "Word pieces embedded.");
    embed_texts: IntCounter = counter("ragstream_embed_texts_total",
        "Texts embedded (chunks, their evidence units and queries).");
    chunks_embedded: IntCounter = counter("ragstream_chunks_embedded_total",
        "Chunks embedded at ingest (each with its evidence units).");
    embed_batch_tokens: Histogram = histogram("ragstream_embed_batch_tokens",
        "Word pieces per embedding batch.", tokens());

    // Index.
    index_write_seconds: Histogram = histogram("ragstream_index_write_seconds",
        "Seconds per index write batch (upserts, deletes and the flush).", seconds());
    index_optimize_seconds: Histogram = histogram("ragstream_index_optimize_seconds",
        "Seconds per index shard optimization (segment merges, HNSW builds), run off the workers.", seconds());
    index_optimizations_running: IntGauge = int_gauge("ragstream_index_optimizations_running",
        "Index shards being optimized right now.");
    index_generation: IntCounter = counter("ragstream_index_generation_total",
        "Index write batches applied (cached contexts older than this are stale).");
    bm25_corpus_chunks: IntGauge = int_gauge("ragstream_bm25_corpus_chunks",
        "Chunks counted in this process's corpus-wide BM25 statistics (all tenants and shards).");

    // Queries.
    queries_received: IntCounter = counter("ragstream_queries_received_total",
        "Query events received (Kafka and HTTP).");
    queries: IntCounterVec = counter_vec("ragstream_queries_total",
        "Queries answered, by mode (unknown: refused before it had one) and outcome (ok, error, refused, cached, handed_over: its partition was revoked and the next owner answers).", &["mode", "outcome"]);
    query_stage_seconds: HistogramVec = histogram_vec("ragstream_query_stage_seconds",
        "Seconds per query stage.", &["stage"], seconds());
    query_seconds: Histogram = histogram("ragstream_query_seconds",
        "Seconds from a query's arrival to its published context.", seconds());
    query_cache: IntCounterVec = counter_vec("ragstream_query_cache_total",
        "Context cache lookups by result (hit, miss).", &["result"]);
    read_your_writes_wait_seconds: Histogram = histogram("ragstream_read_your_writes_wait_seconds",
        "Seconds read_your_writes queries waited for the ingest frontier.", seconds());
    queries_by_intent: IntCounterVec = counter_vec("ragstream_queries_by_intent_total",
        "Queries by the intent the analyzer chose.", &["intent"]);
    fusion_adapted: IntCounterVec = counter_vec("ragstream_fusion_adapted_total",
        "Queries whose fusion weights the lanes' hits changed, by rule.", &["rule"]);
    endpoint_calls: IntCounterVec = counter_vec("ragstream_endpoint_calls_total",
        "Calls of the query flow's model endpoints (rerank_http, rerank_cohere, rerank_llm, hyde), by outcome (ok, fallback, cached).",
        &["endpoint", "outcome"]);
    endpoint_seconds: HistogramVec = histogram_vec("ragstream_endpoint_seconds",
        "Duration of a model endpoint call, answered or not.", &["endpoint"],
        vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]);
    fusion_weight: HistogramVec = histogram_vec("ragstream_fusion_weight",
        "Fusion weight used per lane (dense, bm25), after any adaptation to the lanes' hits.", &["lane"],
        vec![0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]);
    dedup_drops: IntCounterVec = counter_vec("ragstream_dedup_drops_total",
        "Candidates dropped as duplicates, by reason.", &["reason"]);
    mmr_rejections: IntCounterVec = counter_vec("ragstream_mmr_rejections_total",
        "Candidates MMR deferred or left out, by reason.", &["reason"]);

    // Contexts.
    contexts_published: IntCounterVec = counter_vec("ragstream_contexts_published_total",
        "Contexts published, by sink (kafka, http).", &["sink"]);
    context_tokens: Histogram = histogram("ragstream_context_tokens",
        "Tokens of published contexts.", tokens());
    context_budget_tokens: Histogram = histogram("ragstream_context_budget_tokens",
        "Token budget of bounded contexts.", tokens());
    context_budget_used_ratio: Histogram = histogram("ragstream_context_budget_used_ratio",
        "Tokens used over the token budget, per bounded context.",
        vec![0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0]);
    context_chunks: Histogram = histogram("ragstream_context_chunks",
        "Chunks (or sources) returned per context.", counts());
    context_items: HistogramVec = histogram_vec("ragstream_context_items",
        "Packed items per context, by tier (expanded, snippet, surrogate, gist, micro, full).", &["tier"], counts());
    context_redundancy_ratio: Histogram = histogram("ragstream_context_redundancy_ratio",
        "Packed item bytes over the bytes of their distinct sentences, per context.",
        vec![1.0, 1.01, 1.02, 1.05, 1.1, 1.2, 1.5, 2.0, 3.0]);
    contexts_truncated: IntCounter = counter("ragstream_contexts_truncated_total",
        "Contexts with items shortened or left out for the budget.");
    budget_overruns: IntCounter = counter("ragstream_context_budget_overruns_total",
        "Contexts whose token count exceeded their budget (always a bug).");

    // The process.
    operator_activation_seconds: HistogramVec = histogram_vec("ragstream_operator_activation_seconds",
        "Seconds a worker spent in one activation of an operator (Dataflow: a whole worker step); a query waits out the activation under way.",
        &["operator"], crate::activations::BUCKETS.to_vec());
    build_info: IntGaugeVec = int_gauge_vec("ragstream_build_info",
        "Build information (value 1).", &["version"]);
}

fn register<M: Collector + Clone + 'static>(registry: &Registry, metric: M) -> M {
    registry
        .register(Box::new(metric.clone()))
        .expect("unique metric");
    metric
}

fn counter(name: &str, help: &str) -> IntCounter {
    IntCounter::new(name, help).expect("valid metric")
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
}

fn gauge(name: &str, help: &str) -> Gauge {
    Gauge::new(name, help).expect("valid metric")
}

fn int_gauge(name: &str, help: &str) -> IntGauge {
    IntGauge::new(name, help).expect("valid metric")
}

fn int_gauge_vec(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric")
}

fn histogram(name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).expect("valid metric")
}

fn histogram_vec(name: &str, help: &str, labels: &[&str], buckets: Vec<f64>) -> HistogramVec {
    HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
        .expect("valid metric")
}

/// The `q` quantile of a histogram, interpolated within its bucket (seconds).
pub fn quantile(histogram: &prometheus::Histogram, q: f64) -> f64 {
    let families = histogram.collect();
    let Some(metric) = families
        .first()
        .and_then(|family| family.get_metric().first())
    else {
        return 0.0;
    };
    let histogram = metric.get_histogram();
    let total = histogram.get_sample_count() as f64;
    if total == 0.0 {
        return 0.0;
    }
    let target = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for bucket in histogram.get_bucket() {
        let (upper, count) = (bucket.upper_bound(), bucket.cumulative_count() as f64);
        if count >= target {
            let share = if count > below {
                (target - below) / (count - below)
            } else {
                0.0
            };
            return lower + (upper - lower) * share;
        }
        (lower, below) = (upper, count);
    }
    lower
}

/// 0.5 ms to about 65 s.
fn seconds() -> Vec<f64> {
    exponential_buckets(0.0005, 2.0, 18).expect("valid buckets")
}

/// 16 to 32 768 tokens.
fn tokens() -> Vec<f64> {
    exponential_buckets(16.0, 2.0, 12).expect("valid buckets")
}

/// Small counts.
fn counts() -> Vec<f64> {
    vec![0.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 55.0]
}

/// Tenants with labels of their own in the per-tenant gauges (bounded cardinality).
const MAX_TENANT_LABELS: usize = 64;

impl Metrics {
    /// Sets the per-tenant gauges of `tenant` to what it holds (`None`: nothing, its labels go). The
    /// first [`MAX_TENANT_LABELS`] tenants holding documents get labels; the others are not exported
    /// one by one until a labelled tenant's documents are all gone.
    pub fn tenant_held(&self, tenant: &str, held: Option<&crate::ingest::quota::Held>) {
        static LABELLED: OnceLock<std::sync::Mutex<std::collections::HashSet<String>>> =
            OnceLock::new();
        let mut labelled = LABELLED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let gauges = [
            &self.tenant_documents,
            &self.tenant_chunks,
            &self.tenant_bytes,
        ];
        let Some(held) = held else {
            if labelled.remove(tenant) {
                for gauge in gauges {
                    let _ = gauge.remove_label_values(&[tenant]);
                }
            }
            return;
        };
        if !labelled.contains(tenant) {
            if labelled.len() >= MAX_TENANT_LABELS {
                return;
            }
            labelled.insert(tenant.to_string());
        }
        let values = [held.documents, held.chunks, held.bytes];
        for (gauge, value) in gauges.into_iter().zip(values) {
            gauge
                .with_label_values(&[tenant])
                .set(i64::try_from(value).unwrap_or(i64::MAX));
        }
    }

    fn new() -> Self {
        let metrics = Self::declared();
        // Pre-create bounded label sets so dashboards see zeros rather than gaps.
        for op in ["upsert", "delete"] {
            for outcome in ["applied", "stale", "dlq"] {
                metrics.documents.with_label_values(&[op, outcome]);
            }
        }
        for reason in crate::ingest::decode::DlqReason::ALL {
            metrics.dlq_records.with_label_values(&[reason.as_str()]);
        }
        for limit in crate::ingest::quota::LIMITS {
            metrics.quota_refusals.with_label_values(&[limit]);
        }
        for outcome in crate::ingest::sandbox::OUTCOMES {
            metrics.sandbox_reads.with_label_values(&[outcome]);
        }
        for stage in Stage::ALL {
            metrics
                .query_stage_seconds
                .with_label_values(&[stage.as_str()]);
        }
        metrics
            .fusion_adapted
            .with_label_values(&[Intent::CodeSearch.as_str()]);
        for tier in Tier::ALL {
            metrics.context_items.with_label_values(&[tier.as_str()]);
        }
        for intent in Intent::ANALYZED {
            metrics
                .queries_by_intent
                .with_label_values(&[intent.as_str()]);
        }
        for reason in DEDUP_REASONS {
            metrics.dedup_drops.with_label_values(&[reason]);
        }
        for reason in MMR_REASONS {
            metrics.mmr_rejections.with_label_values(&[reason]);
        }
        metrics.create_typed_labels();
        for dependency in crate::outage::Dependency::ALL {
            metrics.outage.with_label_values(&[dependency.as_str()]);
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

    /// Records the pipeline's drop and defer decisions of one query, labelled by their cause.
    pub fn record_decisions(&self, decisions: &[ragstream_core::query::Decision]) {
        use ragstream_core::query::Cause;
        for decision in decisions {
            let counter = match decision.cause {
                Cause::Exact | Cause::NearDuplicate | Cause::Overlap => &self.dedup_drops,
                Cause::DocumentCap | Cause::SectionCap | Cause::BeyondK => &self.mmr_rejections,
                Cause::LaneDuplicate
                | Cause::EvidenceRule
                | Cause::OverBudget
                | Cause::Fits
                | Cause::Shortened
                | Cause::BudgetLeft
                | Cause::EvidenceStop
                | Cause::EvidenceBand
                | Cause::EndpointFallback
                | Cause::SurrogatePolicy
                | Cause::TierCap => continue,
            };
            counter.with_label_values(&[decision.cause.as_str()]).inc();
        }
    }

    /// Records a published context: tokens, budget use, tiers, redundancy, overruns.
    pub fn record_context(&self, context: &ragstream_core::query::Context) {
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
        for tier in Tier::ALL {
            let count = context.items.iter().filter(|i| i.tier == tier).count();
            self.context_items
                .with_label_values(&[tier.as_str()])
                .observe(count as f64);
        }
        let mut seen = std::collections::HashSet::new();
        let (mut packed, mut distinct) = (0usize, 0usize);
        for item in &context.items {
            packed += item.text.len();
            for (from, to) in crate::text::sentences(&item.text) {
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

    /// Observes `seconds` spent in a query's `stage` (`ragstream_query_stage_seconds`).
    pub fn observe_stage(&self, stage: Stage, seconds: f64) {
        self.query_stage_seconds
            .with_label_values(&[stage.as_str()])
            .observe(seconds);
    }

    /// Records a document event's outcome.
    pub fn record_document(&self, op: &str, outcome: &str) {
        self.documents.with_label_values(&[op, outcome]).inc();
    }
}

/// Bounded reasons of `ragstream_dedup_drops_total`.
pub const DEDUP_REASONS: [&str; 3] = ["exact", "near_duplicate", "overlap"];
/// Bounded reasons of `ragstream_mmr_rejections_total`.
pub const MMR_REASONS: [&str; 3] = ["document_cap", "section_cap", "beyond_k"];

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

#[cfg(test)]
mod tests {
    use prometheus::{Histogram, HistogramOpts};

    /// Quantiles fall in the bucket holding them, interpolated by the counts around them.
    #[test]
    fn quantiles_interpolate_within_their_bucket() {
        let histogram =
            Histogram::with_opts(HistogramOpts::new("h", "h").buckets(vec![1.0, 2.0, 4.0]))
                .expect("histogram");
        assert_eq!(super::quantile(&histogram, 0.5), 0.0);
        for value in [0.5, 0.5, 1.5, 1.5, 3.0, 3.0, 3.0, 3.0] {
            histogram.observe(value);
        }
        // Two of eight in (0, 1], two in (1, 2], four in (2, 4].
        assert!((super::quantile(&histogram, 0.25) - 1.0).abs() < 1e-9);
        assert!((super::quantile(&histogram, 0.5) - 2.0).abs() < 1e-9);
        assert!((super::quantile(&histogram, 0.75) - 3.0).abs() < 1e-9);
    }
}
