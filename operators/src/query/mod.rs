//! The query side's timely operators: [`ops`] (decode to publish) and [`retrieve`] (both lanes on a
//! shard). The pure steps and the records they run on are the core's (`ragstream_core::query`,
//! re-exported here).

pub use ragstream_core::query::*;

pub mod ops;
pub mod retrieve;
