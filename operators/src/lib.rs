//! ragstream operators: the timely operators and the adapters to the outside world (Kafka, the two
//! index backends, the embedders).
//!
//! Each operator is a thin timely extension trait over a pure step of `ragstream-core` (records, tokens,
//! chunkers, query steps, the embedder and vector-store contracts; re-exported here under the same
//! paths). Wiring lives in the `ragstream-topologies` crate.
#![forbid(missing_docs)]

pub use ragstream_core::{metadata, model, text, tokens, wire};

pub mod activations;
pub mod embed;
pub mod events;
pub mod faults;
pub mod ingest;
pub mod io;
pub mod metrics;
pub mod offload;
pub mod outage;
pub mod query;
pub mod stage;
pub mod store;

/// Milliseconds since the Unix epoch: the dataflow's time domain.
pub fn now_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
