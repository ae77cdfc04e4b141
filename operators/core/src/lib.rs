//! ragstream's core: the records, tokens and text, the chunkers, the pure query steps and the contracts
//! (embedder, vector store) the operators are written against.
//!
//! Nothing here knows timely, Kafka, Qdrant, ONNX Runtime or an async runtime: every function is plain
//! Rust over plain values, unit- and property-tested on its own, and builds in seconds. The timely
//! operators and the adapters to the outside world are in `ragstream-operators`, which depends on this
//! crate and never the other way round (`deploy/scripts/check/layers.sh` checks it in the test command).
#![forbid(missing_docs)]

pub mod duration;
pub mod embed;
pub mod ingest;
pub mod metadata;
pub mod model;
pub mod progress;
pub mod query;
pub mod store;
pub mod text;
pub mod tokens;
pub mod wire;

#[cfg(any(test, feature = "testing"))]
pub mod testing;
