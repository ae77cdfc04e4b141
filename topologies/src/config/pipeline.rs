//! How documents become vectors: `[ingest]`, `[chunking]` and `[embedder]`.

use std::path::PathBuf;

use ragstream_operators::ingest::sandbox::SandboxLimits;
use ragstream_operators::model::EvidenceUnits;
use serde::{Deserialize, Serialize};

/// Ingest limits.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct IngestConfig {
    /// Largest accepted document event in bytes.
    #[serde(default = "default_max_document_bytes")]
    pub max_document_bytes: usize,
    /// When non-empty, only these tenants are accepted.
    #[serde(default)]
    pub allowed_tenants: Vec<String>,
    /// The child processes that read HTML, PDF and DOCX files, each file in a fresh one.
    #[serde(default)]
    pub sandbox: SandboxConfig,
    /// Tenants take turns: documents posted in local mode queue per tenant and leave by deficit
    /// round robin over their bytes, and every tenant's chunks are embedded in a lane of its own, so a
    /// tenant's large document or flood delays that tenant, not the others. Off: one queue, first in
    /// first out.
    #[serde(default = "default_fair")]
    pub fair: bool,
    /// In local mode, a tenant's documents emitted into the flow and not yet written, in MiB, at
    /// which its next request waits (a tenant's first request always goes; 1 to 1024).
    #[serde(default = "default_tenant_in_flight_mib")]
    pub tenant_in_flight_mib: usize,
    /// What one tenant may hold in this process's index; a document past a quota is refused
    /// (`quota_exceeded`: the HTTP API answers 403, or 413 for a document that could never fit, and
    /// the dataflow dead-letters it with its value).
    #[serde(default)]
    pub quotas: QuotasConfig,
}

/// Per-tenant quotas; 0: none.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct QuotasConfig {
    /// Documents of one tenant.
    #[serde(default)]
    pub max_documents: u64,
    /// Chunks of one tenant.
    #[serde(default)]
    pub max_chunks: u64,
    /// Text bytes of one tenant's documents (a file's extracted text).
    #[serde(default)]
    pub max_bytes: u64,
    /// Chunks one document may give (a page of thousands of headings gives a chunk each).
    #[serde(default = "default_max_chunks_per_document")]
    pub max_chunks_per_document: u64,
}

fn default_max_chunks_per_document() -> u64 {
    20_000
}

impl Default for QuotasConfig {
    fn default() -> Self {
        serde_json::from_str("{}").expect("defaults")
    }
}

impl QuotasConfig {
    /// The quotas the ingest flow and the HTTP API check.
    pub fn quotas(&self) -> ragstream_operators::ingest::quota::Quotas {
        ragstream_operators::ingest::quota::Quotas {
            max_documents: self.max_documents,
            max_chunks: self.max_chunks,
            max_bytes: self.max_bytes,
            max_chunks_per_document: self.max_chunks_per_document,
        }
    }
}

fn default_fair() -> bool {
    true
}
fn default_tenant_in_flight_mib() -> usize {
    8
}

/// Limits of the processes that read files (HTML, PDF, DOCX): a file that passes one is refused
/// (`unparseable`, naming the limit), and the job itself never holds what a file costs.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxConfig {
    /// Address space of one reader process, in MiB (its binary's mappings included; 128 to 65536).
    #[serde(default = "default_sandbox_memory_mib")]
    pub memory_mib: u64,
    /// CPU seconds one file may take (1 to 3600).
    #[serde(default = "default_sandbox_cpu_secs")]
    pub cpu_secs: u64,
    /// Seconds from a reader's start to its answer (at least `cpu_secs`).
    #[serde(default = "default_sandbox_wall_secs")]
    pub wall_secs: u64,
    /// Reader processes at once, across the job's sources and its HTTP API (1 to 64).
    #[serde(default = "default_sandbox_max_parallel")]
    pub max_parallel: usize,
}

fn default_sandbox_memory_mib() -> u64 {
    SandboxLimits::default().memory_mib
}
fn default_sandbox_cpu_secs() -> u64 {
    SandboxLimits::default().cpu_secs
}
fn default_sandbox_wall_secs() -> u64 {
    SandboxLimits::default().wall_secs
}
fn default_sandbox_max_parallel() -> usize {
    SandboxLimits::default().max_parallel
}

impl Default for SandboxConfig {
    fn default() -> Self {
        serde_json::from_str("{}").expect("defaults")
    }
}

impl SandboxConfig {
    /// The limits of each reader process.
    pub fn limits(&self) -> SandboxLimits {
        SandboxLimits {
            memory_mib: self.memory_mib,
            cpu_secs: self.cpu_secs,
            wall_secs: self.wall_secs,
            max_parallel: self.max_parallel,
        }
    }
}

fn default_max_document_bytes() -> usize {
    ragstream_operators::ingest::decode::DEFAULT_MAX_DOCUMENT_BYTES
}

impl Default for IngestConfig {
    fn default() -> Self {
        Self {
            max_document_bytes: default_max_document_bytes(),
            allowed_tenants: Vec::new(),
            sandbox: SandboxConfig::default(),
            fair: default_fair(),
            tenant_in_flight_mib: default_tenant_in_flight_mib(),
            quotas: QuotasConfig::default(),
        }
    }
}

/// Chunk sizes.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChunkingConfig {
    /// `o200k_base` (default) or `cl100k_base`.
    #[serde(default = "default_tokenizer")]
    pub tokenizer: String,
    /// Prose and markdown chunk budget in tokens.
    #[serde(default = "default_prose_tokens")]
    pub prose_tokens: usize,
    /// Code chunk budget in tokens.
    #[serde(default = "default_code_tokens")]
    pub code_tokens: usize,
    /// Schema (table) chunk budget in tokens.
    #[serde(default = "default_schema_tokens")]
    pub schema_tokens: usize,
    /// Overlap between prose chunks, as a fraction of the budget.
    #[serde(default = "default_overlap")]
    pub overlap_ratio: f32,
}

fn default_tokenizer() -> String {
    "o200k_base".into()
}
fn default_prose_tokens() -> usize {
    ragstream_operators::ingest::chunk::DEFAULT_PROSE_TOKENS
}
fn default_code_tokens() -> usize {
    ragstream_operators::ingest::chunk::DEFAULT_CODE_TOKENS
}
fn default_schema_tokens() -> usize {
    ragstream_operators::ingest::chunk::DEFAULT_SCHEMA_TOKENS
}
fn default_overlap() -> f32 {
    ragstream_operators::ingest::chunk::DEFAULT_OVERLAP_RATIO
}

impl Default for ChunkingConfig {
    fn default() -> Self {
        serde_json::from_str("{}").expect("defaults")
    }
}

/// Which embedder runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EmbedderKind {
    /// all-MiniLM-L6-v2 in-process (ONNX Runtime).
    Minilm,
    /// An OpenAI-compatible `/v1/embeddings` server.
    Http,
}

/// Embedder settings.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EmbedderConfig {
    /// `minilm` or `http`.
    #[serde(default = "default_embedder_kind")]
    pub kind: EmbedderKind,
    /// Model directory (minilm); default `$RAGSTREAM_MODEL_DIR` or `~/.cache/ragstream/models/all-MiniLM-L6-v2`.
    #[serde(default)]
    pub model_dir: Option<PathBuf>,
    /// Texts per forward pass or request.
    #[serde(default = "default_embed_batch")]
    pub batch_size: usize,
    /// Server base URL (http).
    #[serde(default)]
    pub url: Option<String>,
    /// Model name sent to the server (http).
    #[serde(default = "default_http_model")]
    pub model: String,
    /// Vector dimension (http).
    #[serde(default = "default_dimension")]
    pub dimension: usize,
    /// Name of the environment variable holding the server's API key (http).
    #[serde(default = "default_embedder_key_env")]
    pub api_key_env: String,
    /// Request timeout in seconds (http).
    #[serde(default = "default_embed_timeout")]
    #[serde(with = "ragstream_core::duration::secs")]
    pub timeout_secs: std::time::Duration,
    /// Allow writing vectors of another embedder into an existing index (re-embed).
    #[serde(default)]
    pub reembed: bool,
    /// Serve an index that holds vectors of another embedder version of the same dimension without
    /// re-embedding it (the design's "unless flagged"): old chunks keep their vectors until their
    /// documents change, new ones get this embedder's. Off: the job refuses to start on such an
    /// index. Another dimension is always refused.
    #[serde(default)]
    pub allow_mixed_versions: bool,
    /// Graph of the local model (minilm): `int8` (default; quantised weights, within the quality gate of
    /// docs/decisions/0010-int8-quality-gate.md) or `fp32` (the reference vectors). The two write
    /// different embedder versions.
    #[serde(default = "default_precision")]
    pub precision: EmbedderPrecision,
    /// ONNX Runtime threads of the local model (minilm).
    #[serde(default = "default_inference_threads")]
    pub threads: usize,
    /// The ONNX Runtime library (minilm); default `$ORT_DYLIB_PATH`, else
    /// `$RAGSTREAM_CACHE/onnxruntime/libonnxruntime.so` (`~/.cache/ragstream/…`), where
    /// `deploy/scripts/install/model.sh` puts it.
    #[serde(default)]
    pub runtime_library: Option<PathBuf>,
    /// Let the ONNX Runtime threads spin briefly between parallel steps instead of sleeping at once
    /// (minilm): faster inference, at the price of cycles the dataflow workers could use.
    #[serde(default = "default_spinning")]
    pub spinning: bool,
    /// Embedders the inference service runs side by side for ingest: model instances of `threads`
    /// threads each (minilm, default one per core, at most 4) or concurrent requests (http, default 4).
    #[serde(default)]
    pub executors: Option<usize>,
    /// One more executor that serves queries only, while the others serve ingest only at a lower CPU
    /// priority, so a query never waits behind an ingest slice (minilm default true: one more model
    /// instance, ~135 MiB; http default false: queries go first among the concurrent requests).
    #[serde(default)]
    pub query_executor: Option<bool>,
    /// Seconds after a query during which one ingest executor sits out (with two or more), so
    /// ingest never holds every core while queries come in: a host that runs the machine beside
    /// others throttles it once all its cores are busy, in stalls of up to 100 ms that land on
    /// queries (docs/decisions/0055-query-headroom.md). Ingest runs on every executor again once
    /// no query came for this long. 0 turns it off; default 5 (minilm), 0 (http: the model's
    /// cores are elsewhere).
    #[serde(default)]
    pub query_headroom_secs: Option<u64>,
    /// Estimated word pieces per ingest slice: a query waits behind at most one slice of model time.
    #[serde(default = "default_slice_word_pieces")]
    pub slice_word_pieces: usize,
    /// Also give each chunk's sentences (in code, its lines) vectors of their own, for the rerank's
    /// sentence evidence (`query.rerank.sentence_evidence`). Embedded alone (the default
    /// `evidence_vectors`) they about double the model time of ingest; off, the evidence of every
    /// chunk is its own vector's cosine.
    #[serde(default = "default_evidence_units")]
    pub evidence_units: bool,
    /// How the evidence units get their vectors (minilm): `alone` (each unit embedded as a text of
    /// its own) or `pooled` (the mean of the unit's word pieces in its chunk's own pass: next to no
    /// model time; units past the chunk's 256 word pieces are embedded alone, and code and SQL-schema
    /// chunks get no units, as with `evidence_units = false`). Pooled ingests faster for a little
    /// ranking quality (docs/decisions/0048-pooled-evidence-units.md). The two write different
    /// embedder versions, so switching needs a re-index (`reembed = true`). The http embedder
    /// embeds units alone.
    #[serde(default = "default_evidence_vectors")]
    pub evidence_vectors: EvidenceVectors,
}

fn default_evidence_units() -> bool {
    true
}

/// How the evidence units get their vectors (`embedder.evidence_vectors`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EvidenceVectors {
    /// Pooled from the chunk's own pass.
    Pooled,
    /// Each unit embedded as a text of its own.
    Alone,
}

fn default_evidence_vectors() -> EvidenceVectors {
    EvidenceVectors::Alone
}

/// Graph of the local model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EmbedderPrecision {
    /// int8 weights, activations quantised at run time.
    Int8,
    /// Float weights and arithmetic.
    Fp32,
}

fn default_precision() -> EmbedderPrecision {
    EmbedderPrecision::Int8
}
/// One thread an executor, an executor a core: chosen on 2 cores with `bench ingest` and `bench load`
/// (docs/decisions/0019-executors-and-query-executor.md; docs/configuration.md,
/// "The local embedder").
fn default_inference_threads() -> usize {
    1
}
/// Chosen on 2 cores with `bench load`
/// (docs/decisions/0009-queries-under-ingest-threads-spinning.md; docs/configuration.md,
/// "The local embedder").
fn default_spinning() -> bool {
    true
}
fn default_slice_word_pieces() -> usize {
    ragstream_operators::embed::service::DEFAULT_SLICE_WORD_PIECES
}

fn default_embedder_kind() -> EmbedderKind {
    EmbedderKind::Minilm
}
fn default_embed_batch() -> usize {
    32
}
fn default_http_model() -> String {
    "all-MiniLM-L6-v2".into()
}
fn default_dimension() -> usize {
    384
}
fn default_embedder_key_env() -> String {
    "RAGSTREAM_EMBEDDER_API_KEY".into()
}
fn default_embed_timeout() -> std::time::Duration {
    std::time::Duration::from_secs(30)
}

impl Default for EmbedderConfig {
    fn default() -> Self {
        serde_json::from_str("{}").expect("defaults")
    }
}

impl EmbedderConfig {
    /// Which evidence units get vectors, and how (`evidence_units`, `evidence_vectors`).
    pub fn evidence(&self) -> EvidenceUnits {
        match (self.evidence_units, self.evidence_vectors) {
            (false, _) => EvidenceUnits::Off,
            (true, EvidenceVectors::Alone) => EvidenceUnits::Alone,
            (true, EvidenceVectors::Pooled) => EvidenceUnits::Pooled,
        }
    }

    /// The model directory, resolved.
    pub fn model_dir(&self) -> PathBuf {
        if let Some(dir) = &self.model_dir {
            return dir.clone();
        }
        if let Some(dir) = std::env::var_os("RAGSTREAM_MODEL_DIR") {
            return PathBuf::from(dir);
        }
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("."));
        home.join(".cache/ragstream/models/all-MiniLM-L6-v2")
    }

    /// The ONNX Runtime library, resolved.
    pub fn runtime_library(&self) -> PathBuf {
        if let Some(path) = &self.runtime_library {
            return path.clone();
        }
        if let Some(path) = std::env::var_os("ORT_DYLIB_PATH") {
            return PathBuf::from(path);
        }
        let cache = std::env::var_os("RAGSTREAM_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                std::env::var_os("HOME")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| PathBuf::from("."))
                    .join(".cache/ragstream")
            });
        cache.join("onnxruntime/libonnxruntime.so")
    }

    /// Ingest executors of the inference service.
    pub fn executors(&self) -> usize {
        self.executors
            .unwrap_or(match self.kind {
                EmbedderKind::Minilm => std::thread::available_parallelism()
                    .map_or(1, |cores| cores.get())
                    .min(4),
                EmbedderKind::Http => 4,
            })
            .max(1)
    }

    /// How long after a query one ingest executor sits out (`None`: never).
    pub fn query_headroom(&self) -> Option<std::time::Duration> {
        let secs = self.query_headroom_secs.unwrap_or(match self.kind {
            EmbedderKind::Minilm => 5,
            EmbedderKind::Http => 0,
        });
        (secs > 0).then(|| std::time::Duration::from_secs(secs))
    }

    /// Whether the inference service has an executor of its own for queries.
    pub fn query_executor(&self) -> bool {
        self.query_executor
            .unwrap_or(self.kind == EmbedderKind::Minilm)
    }
}
