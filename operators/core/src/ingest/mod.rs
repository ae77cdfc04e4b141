//! The pure steps of ingest: decoding document events, dead-letter records, and the chunkers.

pub mod chunk;
pub mod decode;
pub mod dlq;
