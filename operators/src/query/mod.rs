//! The timely side of the query flow: one thin operator per step around the pure steps of
//! `ragstream_core::query` (re-exported here).
//!
//! ```text
//! QuerySource ─ok─► AwaitConsistency ─► CacheLookup ─► Intent ─► EmbedQuery ─► broadcast ─► SearchShard
//!   │                                                                                          │ exchange to the origin worker
//!   │  Publish ◄─ Pack ◄─ Neighbours ◄─ Mmr ◄─ Dedup ◄─ Rerank ◄─ Fuse ◄─ Gather ◄────────────┘
//!   │                         │ ▲ exchange to the top hit's shard owner and back
//!   └─err (refused query) ─► RefuseQueries (error context + DLQ) ─► Publish
//! ```
//!
//! - [`job`]: the records the operators pass along and the services they share;
//! - [`steps`]: up to the shards' answers ([`steps::QuerySteps`]); [`retrieve`]: the lanes on a shard;
//! - [`answer`]: fusion to packing ([`answer::AnswerSteps`]);
//! - [`publish`]: refusals and publishing, through a [`publish::ContextSink`] the adapters implement;
//! - [`invalidation`]: what published contexts cite, and the invalidations when those chunks change;
//! - [`remote`]: the optional model endpoints (HyDE after Intent, a reranker after Rerank), called
//!   off the worker.
//!
//! A query is answered (gathered, packed and published) on the worker that received it, so an HTTP
//! caller's reply is delivered by the process holding its connection. Each step records its latency on
//! the job; the context carries them all.

pub use ragstream_core::query::*;

pub mod answer;
pub mod invalidation;
pub mod job;
pub mod publish;
pub mod remote;
pub mod retrieve;
pub mod steps;

#[cfg(test)]
mod dataflow_tests;
