//! The embedders and the inference service that runs them.
//!
//! The [`Embedder`] trait, its error and the vector arithmetic are the core's
//! (`ragstream_core::embed`, re-exported here); this module adds the implementations and the service:
//! - [`minilm::MiniLm`]: all-MiniLM-L6-v2 in-process with ONNX Runtime, int8 or fp32 (the embedded
//!   default).
//! - [`http::HttpEmbedder`]: any OpenAI-compatible `/v1/embeddings` server (GPU or production setups).
//! - [`service::InferenceService`]: runs the embedders on threads of their own; the dataflow only
//!   submits to it.

pub use ragstream_core::embed::*;

pub mod http;
pub mod minilm;
pub mod service;
