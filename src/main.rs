//! ragstream: keeps a retrieval index fresh from a stream of documents.
//!
//! `ragstream run --config topologies/presets/local.toml` indexes a directory into the embedded index;
//! `ragstream validate --config …` checks a configuration without starting anything.

#[cfg(feature = "bench")]
mod bench;
mod cli;
mod eval;
mod http;
#[cfg(feature = "mcp")]
mod mcp;
mod runtime;
mod standing;

/// mimalloc: the query steps allocate and free many small strings per query (BENCHMARKS.md has its
/// effect on them, measured against the system allocator).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    cli::run()
}
