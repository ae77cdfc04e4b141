//! Internal events: each one is logged and counted by a single [`InternalEvent::emit`], so a log line
//! and the metric that counts the same thing are written together and cannot drift apart.

use std::time::Duration;

use crate::ingest::dlq::DlqRecord;
use crate::metrics::metrics;

/// Something the job reports to its operators: a log line and its metrics.
pub trait InternalEvent {
    /// Logs the event and records its metrics.
    fn emit(self);
}

/// A record is durably in the dead-letter queue.
pub struct DeadLettered<'a>(pub &'a DlqRecord);

impl InternalEvent for DeadLettered<'_> {
    fn emit(self) {
        let record = self.0;
        tracing::warn!(reason = %record.reason, origin = %record.origin, error = %record.message, "dead-lettered");
        metrics()
            .dlq_records
            .with_label_values(&[record.reason.as_str()])
            .inc();
    }
}

/// A query was refused (malformed, over its limits) and its record is durably in the dead-letter queue;
/// its error context goes back to the caller.
pub struct QueryRefused<'a> {
    /// Why (the refusal's reason, also the DLQ record's).
    pub reason: &'a str,
    /// The DLQ record.
    pub record: &'a DlqRecord,
}

impl InternalEvent for QueryRefused<'_> {
    fn emit(self) {
        tracing::warn!(reason = self.reason, origin = %self.record.origin, error = %self.record.message, "query refused");
        let m = metrics();
        m.query_ended(None, crate::metrics::QueryOutcome::Refused);
        m.dlq_records
            .with_label_values(&[self.record.reason.as_str()])
            .inc();
    }
}

/// A call failed on an outage and is tried again after `delay`.
pub struct Retrying<'a> {
    /// What was called (`index`, `dlq`, `embedder`).
    pub component: &'a str,
    /// Why it failed.
    pub error: &'a dyn std::fmt::Display,
    /// How long until the next try.
    pub delay: Duration,
}

impl InternalEvent for Retrying<'_> {
    fn emit(self) {
        let retry_in_ms = self.delay.as_millis() as u64;
        tracing::warn!(component = self.component, error = %self.error, retry_in_ms, "outage; retrying");
        metrics().retries.with_label_values(&[self.component]).inc();
    }
}

/// A document event older than the version indexed was ignored.
pub struct StaleVersion<'a> {
    /// The document (`tenant/doc_id`).
    pub key: &'a dyn std::fmt::Display,
    /// The event's version.
    pub version: u64,
    /// The version indexed.
    pub applied: u64,
    /// The event's op (`upsert`, `delete`).
    pub op: &'a str,
}

impl InternalEvent for StaleVersion<'_> {
    fn emit(self) {
        tracing::debug!(key = %self.key, version = self.version, applied = self.applied, "ignored stale version");
        metrics().record_document(self.op, "stale");
        metrics().stale_versions.inc();
    }
}

/// A shard optimization (segment merges, HNSW builds) ended after `seconds`.
pub struct ShardOptimized<'a> {
    /// How long it ran.
    pub seconds: f64,
    /// Why it failed, if it did (nothing is lost: every write was durable before it started).
    pub error: Option<&'a dyn std::fmt::Display>,
}

impl InternalEvent for ShardOptimized<'_> {
    fn emit(self) {
        metrics().index_optimize_seconds.observe(self.seconds);
        match self.error {
            None => tracing::info!(seconds = self.seconds, "index shard optimized"),
            Some(error) => {
                tracing::warn!(%error, seconds = self.seconds, "index optimization failed")
            }
        }
    }
}
