//! The timely side of the query flow: one operator a file, each an extension trait named as the
//! operator is in the dataflow, over the pure steps of `ragstream_core::query`.
//!
//! The chain they form is drawn once, in ARCHITECTURE.md, "Query flow" (wired by
//! `topologies/src/query.rs`); each file's module doc says what its operator does and, for those
//! of several stages (Retrieve, Neighbours), the stages' timely names.
//!
//! - [`job`]: the records the operators pass along and the services they share;
//! - [`search`]: the lanes against one shard, which SearchShard runs on every worker;
//! - [`remote`]: the stage [`hyde`] and [`rerank_endpoint`] build on, which calls model endpoints off
//!   the worker;
//! - [`invalidation`]: what published contexts cite, and the invalidations when those chunks change.
//!
//! A query is answered (gathered, packed and published) on the worker that received it, so an HTTP
//! caller's reply is delivered by the process holding its connection. Each step records its latency on
//! the job; the context carries them all. The wiring is `topologies/src/query.rs`.

pub mod cache_lookup;
pub mod caches;
pub mod consistency;
pub mod dedup;
pub mod embed_query;
#[doc(hidden)]
pub mod example;
pub mod fuse;
pub mod hyde;
pub mod intent;
pub mod invalidation;
pub mod job;
pub mod lookup;
pub mod mmr;
pub mod neighbours;
pub mod pack;
pub mod publish;
pub mod refuse;
pub mod remote;
pub mod rerank;
pub mod rerank_endpoint;
pub mod retrieve;
pub mod search;

#[cfg(test)]
mod dataflow_tests;
