//! Fault-injection suite. Each case prints a `FAULT <case>: …` line with its figures.

#[path = "../common/mod.rs"]
mod common;

mod duplicates;
mod queries;
mod security;
