//! Sources and sinks: Kafka (the `kafka` feature), directories, JSONL files, DLQ sinks.

pub mod checkpoint;
pub mod context_sink;
pub mod dir_source;
pub mod dlq_sink;
pub mod endpoints;
pub mod invalidation_sink;
#[cfg(feature = "kafka")]
pub mod kafka_admin;
#[cfg(feature = "kafka")]
pub mod kafka_log;
#[cfg(feature = "kafka")]
pub mod kafka_source;
pub mod local_source;
/// The query ledger is a pure step of the core (`ragstream_core::query::ledger`).
pub use ragstream_core::query::ledger as query_ledger;
pub mod query_source;

/// A document source's streams: the decoded document operations (or their DLQ records), and the
/// assignment markers of a source whose partitions move (none from a local source).
pub type SourceStreams<'scope> = (
    timely::dataflow::StreamVec<
        'scope,
        u64,
        Result<crate::model::DocOp, crate::ingest::dlq::DlqRecord>,
    >,
    timely::dataflow::StreamVec<'scope, u64, crate::ingest::guard::Assigned>,
);
