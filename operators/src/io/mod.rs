//! Sources and sinks: Kafka, directories, JSONL files, DLQ sinks.

pub mod checkpoint;
pub mod context_sink;
pub mod dir_source;
pub mod dlq_sink;
pub mod endpoints;
pub mod invalidation_sink;
pub mod kafka_admin;
pub mod kafka_log;
pub mod kafka_source;
pub mod local_source;
/// The query ledger is a pure step of the core (`ragstream_core::query::ledger`).
pub use ragstream_core::query::ledger as query_ledger;
pub mod query_source;
