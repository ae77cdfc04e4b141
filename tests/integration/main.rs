//! Every integration test but the fault suite, one module per file, in one test binary: one link of
//! the job's dependencies instead of thirteen (minutes of a cold CI build on two cores).
//! `cargo test --test integration <file>::` runs one file's tests.

#[path = "../common/mod.rs"]
mod common;

mod api;
mod cluster;
mod documents;
mod embedder;
mod endpoints;
mod evidence;
mod formats;
mod ingest_kafka;
mod invalidations;
mod mcp;
mod observability;
mod python_client;
mod query_kafka;
mod quickstart;
mod server_backend;
mod sharding;
mod standing;
mod surrogates;
mod tokenizer;
