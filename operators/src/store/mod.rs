//! The two index backends behind the core's [`VectorStore`] trait (`ragstream_core::store`,
//! re-exported here with its records, the BM25 encoder and the corpus statistics).
//!
//! - [`edge::EdgeStore`]: qdrant-edge, the Qdrant engine in-process, on disk (the embedded default).
//!   Pinned to 0.7.2: 0.8 and 0.9 use `std::debug_assert_matches`, unstable on the stable toolchain.
//! - `server::ServerStore` (the `qdrant-server` feature): a Qdrant server through qdrant-client
//!   (production).

pub use ragstream_core::store::*;

pub mod edge;
#[cfg(feature = "qdrant-server")]
pub mod server;

#[cfg(test)]
pub(crate) mod contract;
