//! ragstream operators.
//!
//! Each operator is a pure core (plain Rust, unit-tested without timely, Kafka or Qdrant) plus a thin
//! timely extension trait that wires it into a stream. Wiring lives in the `ragstream-topologies` crate.
#![forbid(missing_docs)]

pub mod activations;
pub mod background;
pub mod embed;
pub mod faults;
pub mod ingest;
pub mod io;
pub mod metrics;
pub mod model;
pub mod query;
pub mod stage;
pub mod store;
pub mod tokens;
pub mod wire;

/// Milliseconds since the Unix epoch: the dataflow's time domain.
pub fn now_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
