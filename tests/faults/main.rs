//! Fault-injection suite. Each case prints a `FAULT <case>: …` line with its figures.

#[path = "../common/mod.rs"]
mod common;

mod crashes;
mod duplicates;
mod files;
mod handover;
mod hostile;
mod outages;
mod poison;
mod queries;
mod rebalance;
mod security;
mod server;
mod soak;
mod support;
