//! Ingest operators: decode, version guard, chunk, diff, embed, index write.
//!
//! ```text
//! source ─► VersionGuard ─► Chunk ─► (differential upsert by DocKey, hydrated at time 0) ─► ChunkDiff ─► Embed ─► IndexWrite ─► ack probe
//!    └──────────────────────────────────────── DLQ records ──────────────────────────────────────┴──► DlqWrite ─► ack probe
//! ```

pub use ragstream_core::ingest::{chunk, decode, dlq, extract};

pub mod acked;
pub mod chunk_op;
pub mod diff;
pub mod embed;
pub mod guard;
pub mod hydrate;
pub mod index_write;
pub mod quota;
pub mod reindex;
pub mod sandbox;
pub mod stats;
pub mod written;
