//! The pure steps of ingest: decoding document events, dead-letter records, the chunkers and language
//! detection.

pub mod chunk;
pub mod decode;
pub mod dlq;
pub mod lang;
