//! The pure steps of ingest: decoding document events, extracting files (HTML, PDF, DOCX),
//! dead-letter records, the chunkers and language detection.

pub mod chunk;
pub mod decode;
pub mod dlq;
pub mod extract;
pub mod lang;
