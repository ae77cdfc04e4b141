//! ragstream topologies: dataflow wiring (no algorithms) and configuration presets.
#![forbid(missing_docs)]

pub mod config;
pub mod factory;
pub mod ingest;
pub mod job;
pub mod query;
