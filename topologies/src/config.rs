//! The job's configuration: TOML files loaded with the `config` crate, `RAGSTREAM_<SECTION>__<KEY>`
//! environment overrides, unknown keys rejected by name, cross-field checks in [`Config::validate`].
//!
//! Secrets never live here: the Kafka SASL password, the Qdrant API key and the embedder API key are
//! read from environment variables (whose *names* are configurable) and never printed.

use std::path::PathBuf;

use ragstream_operators::store::IndexTuning;
use serde::Deserialize;

/// Which input feeds the ingest flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// A directory, rescanned on an interval.
    Dir,
    /// A JSONL file of document events, read once.
    Jsonl,
    /// The Kafka documents topic.
    Kafka,
}

/// The ingest input.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// `dir`, `jsonl` or `kafka`.
    pub kind: SourceKind,
    /// Directory or JSONL file (for `dir` and `jsonl`).
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// Tenant of documents from a directory.
    #[serde(default = "default_tenant")]
    pub tenant: String,
    /// Seconds between directory rescans.
    #[serde(default = "default_rescan_secs")]
    pub rescan_secs: u64,
}

fn default_tenant() -> String {
    "local".into()
}
fn default_rescan_secs() -> u64 {
    5
}

/// Kafka connection and topics.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// Bootstrap servers.
    #[serde(default = "default_brokers")]
    pub brokers: String,
    /// Document events topic.
    #[serde(default = "default_documents_topic")]
    pub documents_topic: String,
    /// Dead-letter topic (refused documents and queries).
    #[serde(default = "default_dlq_topic")]
    pub dlq_topic: String,
    /// Query events topic.
    #[serde(default = "default_queries_topic")]
    pub queries_topic: String,
    /// Contexts topic (answers, keyed by query id).
    #[serde(default = "default_contexts_topic")]
    pub contexts_topic: String,
    /// Consumer group of the job.
    #[serde(default = "default_group")]
    pub group_id: String,
    /// `security.protocol` (`plaintext`, `ssl`, `sasl_plaintext`, `sasl_ssl`).
    #[serde(default)]
    pub security_protocol: Option<String>,
    /// `sasl.mechanism` (e.g. `SCRAM-SHA-512`).
    #[serde(default)]
    pub sasl_mechanism: Option<String>,
    /// `sasl.username`.
    #[serde(default)]
    pub sasl_username: Option<String>,
    /// Name of the environment variable holding the SASL password.
    #[serde(default = "default_sasl_password_env")]
    pub sasl_password_env: String,
    /// Static group membership id (`group.instance.id` prefix; each worker appends `-<index>`). Give each
    /// job instance its own; a restarted instance then reclaims its partitions at once.
    #[serde(default)]
    pub instance_id: Option<String>,
    /// Most messages per poll batch.
    #[serde(default = "default_max_batch")]
    pub max_batch: usize,
    /// librdkafka's prefetch per documents consumer, in KiB (`queued.max.messages.kbytes`): what can be
    /// buffered besides `max_in_flight` messages. It also caps a fetch, so it must exceed the largest
    /// document event (with brokers that do not return an oversized first batch anyway, as Tansu).
    #[serde(default = "default_prefetch_kbytes")]
    pub prefetch_kbytes: usize,
    /// Unacknowledged messages per worker above which that worker's consumption pauses (until it is
    /// down to half).
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("documents_topic", &self.documents_topic)
            .field("dlq_topic", &self.dlq_topic)
            .field("queries_topic", &self.queries_topic)
            .field("contexts_topic", &self.contexts_topic)
            .field("group_id", &self.group_id)
            .field("security_protocol", &self.security_protocol)
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("sasl_username", &self.sasl_username)
            .field("sasl_password_env", &self.sasl_password_env)
            .finish_non_exhaustive()
    }
}

fn default_brokers() -> String {
    "127.0.0.1:9092".into()
}
fn default_documents_topic() -> String {
    "ragstream.documents".into()
}
fn default_dlq_topic() -> String {
    "ragstream.dlq".into()
}
fn default_queries_topic() -> String {
    "ragstream.queries".into()
}
fn default_contexts_topic() -> String {
    "ragstream.contexts".into()
}
fn default_group() -> String {
    "ragstream".into()
}
fn default_sasl_password_env() -> String {
    "RAGSTREAM_KAFKA_SASL_PASSWORD".into()
}
fn default_max_batch() -> usize {
    500
}
fn default_prefetch_kbytes() -> usize {
    // librdkafka's default; room for a 50 MB document event.
    65536
}
fn default_max_in_flight() -> usize {
    5000
}

impl Default for KafkaConfig {
    fn default() -> Self {
        serde_json::from_str("{}").expect("defaults")
    }
}

impl KafkaConfig {
    /// librdkafka client settings, the password taken from the environment.
    pub fn client_config(&self) -> rdkafka::ClientConfig {
        let mut client = rdkafka::ClientConfig::new();
        client.set("bootstrap.servers", &self.brokers);
        if let Some(protocol) = &self.security_protocol {
            client.set("security.protocol", protocol);
        }
        if let Some(mechanism) = &self.sasl_mechanism {
            client.set("sasl.mechanism", mechanism);
        }
        if let Some(username) = &self.sasl_username {
            client.set("sasl.username", username);
        }
        if let Ok(password) = std::env::var(&self.sasl_password_env) {
            client.set("sasl.password", password);
        }
        // librdkafka's debug contexts for troubleshooting (e.g. `cgrp` for group membership); its
        // messages are logged at debug level under the `librdkafka` target.
        if let Ok(contexts) = std::env::var(KAFKA_DEBUG_ENV) {
            if !contexts.trim().is_empty() {
                client.set("debug", contexts.trim());
            }
        }
        client
    }
}

/// Environment variable naming librdkafka debug contexts for every Kafka client of the job.
pub const KAFKA_DEBUG_ENV: &str = "RAGSTREAM_KAFKA_DEBUG";

/// Ingest limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngestConfig {
    /// Largest accepted document event in bytes.
    #[serde(default = "default_max_document_bytes")]
    pub max_document_bytes: usize,
    /// When non-empty, only these tenants are accepted.
    #[serde(default)]
    pub allowed_tenants: Vec<String>,
}

fn default_max_document_bytes() -> usize {
    ragstream_operators::ingest::decode::DEFAULT_MAX_DOCUMENT_BYTES
}

impl Default for IngestConfig {
    fn default() -> Self {
        Self {
            max_document_bytes: default_max_document_bytes(),
            allowed_tenants: Vec::new(),
        }
    }
}

/// Chunk sizes.
#[derive(Debug, Clone, Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EmbedderKind {
    /// all-MiniLM-L6-v2 in-process (ONNX Runtime).
    Minilm,
    /// An OpenAI-compatible `/v1/embeddings` server.
    Http,
}

/// Embedder settings.
#[derive(Debug, Clone, Deserialize)]
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
    pub timeout_secs: u64,
    /// Allow writing vectors of another embedder into an existing index (re-embed).
    #[serde(default)]
    pub reembed: bool,
    /// Graph of the local model (minilm): `int8` (default; quantised weights, within the quality gate of
    /// BENCHMARKS.md) or `fp32` (the reference vectors). The two write different embedder versions.
    #[serde(default = "default_precision")]
    pub precision: EmbedderPrecision,
    /// ONNX Runtime threads of the local model (minilm).
    #[serde(default = "default_inference_threads")]
    pub threads: usize,
    /// The ONNX Runtime library (minilm); default `$ORT_DYLIB_PATH`, else
    /// `$RAGSTREAM_CACHE/onnxruntime/libonnxruntime.so` (`~/.cache/ragstream/…`), where
    /// `deploy/scripts/fetch-model.sh` puts it.
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
    /// Estimated word pieces per ingest slice: a query waits behind at most one slice of model time.
    #[serde(default = "default_slice_word_pieces")]
    pub slice_word_pieces: usize,
}

/// Graph of the local model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
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
/// (BENCHMARKS.md, "Executors of one thread and a query executor"; README).
fn default_inference_threads() -> usize {
    1
}
/// Chosen on 2 cores with `bench load` (BENCHMARKS.md, "Query latency under ingest"; README).
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
fn default_embed_timeout() -> u64 {
    30
}

impl Default for EmbedderConfig {
    fn default() -> Self {
        serde_json::from_str("{}").expect("defaults")
    }
}

impl EmbedderConfig {
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

    /// Whether the inference service has an executor of its own for queries.
    pub fn query_executor(&self) -> bool {
        self.query_executor
            .unwrap_or(self.kind == EmbedderKind::Minilm)
    }
}

/// Which index backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IndexKind {
    /// qdrant-edge in-process, one shard directory per worker.
    Edge,
    /// A Qdrant server.
    Server,
}

/// Index settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexConfig {
    /// `edge` or `server`.
    #[serde(default = "default_index_kind")]
    pub kind: IndexKind,
    /// Directory of the shards (edge).
    #[serde(default = "default_index_path")]
    pub path: PathBuf,
    /// Qdrant gRPC URL (server).
    #[serde(default)]
    pub url: Option<String>,
    /// Collection name (server).
    #[serde(default = "default_collection")]
    pub collection: String,
    /// Name of the environment variable holding the Qdrant API key (server).
    #[serde(default = "default_qdrant_key_env")]
    pub api_key_env: String,
    /// HNSW, quantisation and indexing threads of the dense index (`[index.tuning]`), both backends.
    #[serde(default)]
    pub tuning: IndexTuning,
}

fn default_index_kind() -> IndexKind {
    IndexKind::Edge
}
fn default_index_path() -> PathBuf {
    PathBuf::from(".ragstream/index")
}
fn default_collection() -> String {
    "ragstream".into()
}
fn default_qdrant_key_env() -> String {
    "QDRANT_API_KEY".into()
}

impl Default for IndexConfig {
    fn default() -> Self {
        serde_json::from_str("{}").expect("defaults")
    }
}

/// HTTP endpoints (metrics, health).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Listen address; loopback by default.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Name of the environment variable holding a bearer token that may query every tenant. No token is
    /// required while it is unset or empty and `tokens` names none that is set. Tokens themselves never
    /// live in the configuration.
    #[serde(default = "default_query_token_env")]
    pub query_token_env: String,
    /// Tenant-bound bearer tokens: environment variable name → the tenants its token may query
    /// (`POST /query` for another tenant is answered 403).
    #[serde(default)]
    pub tokens: std::collections::BTreeMap<String, Vec<String>>,
}

fn default_query_token_env() -> String {
    "RAGSTREAM_QUERY_TOKEN".into()
}

fn default_listen() -> String {
    "127.0.0.1:9464".into()
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            query_token_env: default_query_token_env(),
            tokens: Default::default(),
        }
    }
}

/// Process and worker settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Timely worker threads.
    #[serde(default = "default_workers")]
    pub workers: usize,
    /// DLQ file, used when the source is not Kafka.
    #[serde(default = "default_dlq_path")]
    pub dlq_path: PathBuf,
    /// Exit after this many seconds without input and with nothing in flight (0 = never).
    #[serde(default)]
    pub exit_when_idle_secs: u64,
    /// Keep answering queries after a finite (JSONL) input is indexed, until stopped.
    #[serde(default)]
    pub serve: bool,
    /// Processes of a timely cluster (each runs `workers` threads); 1 = a single process.
    #[serde(default = "default_processes")]
    pub processes: usize,
    /// This process's index in the cluster (0-based).
    #[serde(default)]
    pub process: usize,
    /// The cluster's hostfile: one `host:port` per process, in process order (timely's format).
    #[serde(default)]
    pub hostfile: Option<PathBuf>,
}

fn default_processes() -> usize {
    1
}

impl RuntimeConfig {
    /// Workers of the whole cluster (= shards of an embedded index).
    pub fn total_workers(&self) -> usize {
        self.workers * self.processes
    }

    /// The global index of this process's first worker.
    pub fn first_worker(&self) -> usize {
        self.process * self.workers
    }
}

fn default_workers() -> usize {
    1
}
fn default_dlq_path() -> PathBuf {
    PathBuf::from(".ragstream/dlq.jsonl")
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        serde_json::from_str("{}").expect("defaults")
    }
}

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Ingest input.
    pub source: SourceConfig,
    /// Kafka (required when any flow uses it).
    #[serde(default)]
    pub kafka: KafkaConfig,
    /// Ingest limits.
    #[serde(default)]
    pub ingest: IngestConfig,
    /// Chunk sizes.
    #[serde(default)]
    pub chunking: ChunkingConfig,
    /// Embedder.
    #[serde(default)]
    pub embedder: EmbedderConfig,
    /// Index.
    #[serde(default)]
    pub index: IndexConfig,
    /// HTTP endpoints.
    #[serde(default)]
    pub http: HttpConfig,
    /// Runtime.
    #[serde(default)]
    pub runtime: RuntimeConfig,
    /// Query pipeline tunables.
    #[serde(default)]
    pub query: ragstream_operators::query::QueryConfig,
}

/// A configuration error, naming the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file or environment could not be read or parsed (unknown keys land here, named).
    #[error("{0}")]
    Load(String),
    /// A value is out of range or inconsistent with another.
    #[error("invalid `{key}`: {message}")]
    Invalid {
        /// Dotted key.
        key: &'static str,
        /// What is wrong.
        message: String,
    },
}

impl Config {
    /// Loads `path` (TOML), then `RAGSTREAM_<SECTION>__<KEY>` environment overrides, then validates.
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let overrides: std::collections::HashMap<String, String> = std::env::vars()
            .filter(|(name, _)| name.starts_with("RAGSTREAM_") && name.contains("__"))
            .collect();
        let loaded = config::Config::builder()
            .add_source(config::File::from(path).format(config::FileFormat::Toml))
            .add_source(
                config::Environment::with_prefix("RAGSTREAM")
                    .prefix_separator("_")
                    .separator("__")
                    .source(Some(overrides))
                    .try_parsing(true),
            )
            .build()
            .map_err(|e| ConfigError::Load(e.to_string()))?;
        let config: Config = loaded
            .try_deserialize()
            .map_err(|e| ConfigError::Load(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Cross-field checks.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &'static str, message: &str| {
            Err(ConfigError::Invalid {
                key,
                message: message.into(),
            })
        };
        if matches!(self.source.kind, SourceKind::Dir | SourceKind::Jsonl)
            && self.source.path.is_none()
        {
            return invalid("source.path", "required for dir and jsonl sources");
        }
        if ragstream_operators::tokens::Encoding::parse(&self.chunking.tokenizer).is_none() {
            return invalid("chunking.tokenizer", "must be o200k_base or cl100k_base");
        }
        for (key, value) in [
            ("chunking.prose_tokens", self.chunking.prose_tokens),
            ("chunking.code_tokens", self.chunking.code_tokens),
            ("chunking.schema_tokens", self.chunking.schema_tokens),
        ] {
            if !(16..=8192).contains(&value) {
                return Err(ConfigError::Invalid {
                    key,
                    message: format!("{value} is outside 16..=8192"),
                });
            }
        }
        if !(0.0..0.5).contains(&self.chunking.overlap_ratio) {
            return invalid("chunking.overlap_ratio", "must be in [0, 0.5)");
        }
        if self.embedder.threads == 0 {
            return invalid("embedder.threads", "must be at least 1");
        }
        if self.embedder.slice_word_pieces == 0 {
            return invalid("embedder.slice_word_pieces", "must be at least 1");
        }
        if self.embedder.executors == Some(0) {
            return invalid("embedder.executors", "must be at least 1");
        }
        if self.embedder.kind == EmbedderKind::Http && self.embedder.url.is_none() {
            return invalid("embedder.url", "required for the http embedder");
        }
        if self.index.kind == IndexKind::Server && self.index.url.is_none() {
            return invalid("index.url", "required for the server index");
        }
        let tuning = &self.index.tuning;
        for (key, value, least) in [
            ("index.tuning.m", tuning.m, 2),
            ("index.tuning.ef_construct", tuning.ef_construct, 4),
            ("index.tuning.ef", tuning.ef, 1),
            ("index.tuning.optimize_every", tuning.optimize_every, 1),
        ] {
            if value < least {
                return Err(ConfigError::Invalid {
                    key,
                    message: format!("{value} is below {least}"),
                });
            }
        }
        if self.runtime.workers == 0 || self.runtime.workers > 256 {
            return invalid("runtime.workers", "must be 1..=256");
        }
        if self.runtime.processes == 0 || self.runtime.process >= self.runtime.processes {
            return invalid(
                "runtime.process",
                "must be below runtime.processes (which must be at least 1)",
            );
        }
        if self.runtime.processes > 1 {
            if self.source.kind != SourceKind::Kafka {
                return invalid(
                    "runtime.processes",
                    "a cluster reads its documents from Kafka (source.kind = \"kafka\")",
                );
            }
            if self.runtime.hostfile.is_none() {
                return invalid("runtime.hostfile", "required when runtime.processes > 1");
            }
        }
        if self.kafka.max_batch == 0 || self.kafka.max_in_flight < self.kafka.max_batch {
            return invalid(
                "kafka.max_in_flight",
                "must be at least kafka.max_batch (> 0)",
            );
        }
        if self.ingest.max_document_bytes == 0 {
            return invalid("ingest.max_document_bytes", "must be positive");
        }
        let query = &self.query;
        if !(0.0..=1.0).contains(&query.mmr_lambda) {
            return invalid("query.mmr_lambda", "must be in [0, 1]");
        }
        if !(query.near_duplicate > 0.0 && query.near_duplicate <= 1.0) {
            return invalid("query.near_duplicate", "must be in (0, 1]");
        }
        if query.rrf_k <= 0.0 {
            return invalid("query.rrf_k", "must be positive");
        }
        if query.per_document_cap == 0 || query.per_section_cap == 0 {
            return invalid("query.per_document_cap", "caps must be at least 1");
        }
        let pack = &query.pack;
        if pack.surrogate_tokens == 0
            || pack.snippet_tokens < pack.surrogate_tokens
            || pack.expanded_tokens < pack.snippet_tokens
        {
            return invalid(
                "query.pack",
                "need 0 < surrogate_tokens <= snippet_tokens <= expanded_tokens",
            );
        }
        if query.max_query_bytes < 64 {
            return invalid("query.max_query_bytes", "must be at least 64");
        }
        for (env, tenants) in &self.http.tokens {
            if env.is_empty() || tenants.is_empty() || tenants.iter().any(String::is_empty) {
                return invalid(
                    "http.tokens",
                    "maps environment variable names to non-empty lists of tenants",
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.toml");
        std::fs::write(&path, text).expect("write");
        (dir, path)
    }

    /// The error of loading a config of `text`.
    fn load_error(text: &str) -> String {
        let (_dir, path) = write(text);
        Config::load(&path).unwrap_err().to_string()
    }

    #[test]
    fn presets_load_and_validate() {
        for preset in ["local.toml", "kafka.toml", "cluster.toml"] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("presets")
                .join(preset);
            Config::load(&path).unwrap_or_else(|e| panic!("{preset}: {e}"));
        }
    }

    #[test]
    fn cluster_settings_are_checked() {
        let kafka = "[source]\nkind = \"kafka\"\n";
        let err = load_error(&format!("{kafka}[runtime]\nprocesses = 2\nprocess = 2\n"));
        assert!(err.contains("runtime.process"), "{err}");
        let err = load_error(&format!("{kafka}[runtime]\nprocesses = 2\nprocess = 1\n"));
        assert!(err.contains("runtime.hostfile"), "{err}");
        let err = load_error(
            "[source]\nkind = \"dir\"\npath = \".\"\n[runtime]\nprocesses = 2\nhostfile = \"h\"\n",
        );
        assert!(err.contains("runtime.processes"), "{err}");
        let (_dir, path) = write(&format!(
            "{kafka}[runtime]\nworkers = 3\nprocesses = 2\nprocess = 1\nhostfile = \"h\"\n"
        ));
        let runtime = Config::load(&path).expect("valid").runtime;
        assert_eq!((runtime.total_workers(), runtime.first_worker()), (6, 3));
    }

    #[test]
    fn sasl_ssl_with_scram_is_accepted_by_librdkafka() {
        use rdkafka::consumer::BaseConsumer;
        use rdkafka::producer::BaseProducer;
        let (_dir, path) = write(
            "[source]\nkind = \"kafka\"\n[kafka]\nbrokers = \"127.0.0.1:9\"\nsecurity_protocol = \"sasl_ssl\"\nsasl_mechanism = \"SCRAM-SHA-512\"\nsasl_username = \"ragstream\"\n",
        );
        let config = Config::load(&path).expect("valid");
        let mut client = config.kafka.client_config();
        client.set("sasl.password", "not-a-real-password");
        // librdkafka refuses at creation a protocol or mechanism it was built without.
        client
            .create::<BaseProducer>()
            .expect("SASL_SSL + SCRAM producer");
        client
            .set("group.id", "sasl-check")
            .create::<BaseConsumer>()
            .expect("SASL_SSL + SCRAM consumer");
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = load_error("[source]\nkind = \"dir\"\npath = \".\"\n[index]\npth = \"x\"\n");
        assert!(err.contains("pth"), "{err}");
        let err = load_error("[source]\nkind = \"dir\"\npath = \".\"\n[bogus]\nx = 1\n");
        assert!(err.contains("bogus"), "{err}");
    }

    #[test]
    fn index_tuning_defaults_and_overrides() {
        let dir = "[source]\nkind = \"dir\"\npath = \".\"\n";
        let (_dir, path) = write(dir);
        let tuning = Config::load(&path).expect("valid").index.tuning;
        assert!(tuning.quantized && tuning.indexes_on_disk);
        assert_eq!((tuning.m, tuning.ef_construct, tuning.ef), (16, 100, 100));
        let (_dir, path) = write(&format!(
            "{dir}[index.tuning]\nef = 128\nquantized = false\nindexing_threads = 3\nindexes_on_disk = false\n"
        ));
        let tuning = Config::load(&path).expect("valid").index.tuning;
        assert_eq!(
            (
                tuning.ef,
                tuning.quantized,
                tuning.threads(),
                tuning.indexes_on_disk
            ),
            (128, false, 3, false)
        );
        assert_eq!(
            tuning.ef_for(200),
            200,
            "the beam is at least the results asked for"
        );
        let err = load_error(&format!("{dir}[index.tuning]\nef_construct = 2\n"));
        assert!(err.contains("index.tuning.ef_construct"), "{err}");
        let err = load_error(&format!("{dir}[index.tuning]\nefs = 2\n"));
        assert!(err.contains("efs"), "{err}");
    }

    #[test]
    fn cross_field_checks_name_the_key() {
        let err = load_error("[source]\nkind = \"dir\"\n");
        assert!(err.contains("source.path"), "{err}");
        let (_dir, path) = write("[source]\nkind = \"kafka\"\n[chunking]\nprose_tokens = 4\n");
        assert!(Config::load(&path)
            .unwrap_err()
            .to_string()
            .contains("chunking.prose_tokens"));
    }

    #[test]
    fn debug_never_shows_the_password() {
        std::env::set_var("RAGSTREAM_TEST_SASL_SECRET", "hunter2-secret");
        let (_dir, path) = write("[source]\nkind = \"kafka\"\n[kafka]\nsasl_username = \"u\"\nsasl_password_env = \"RAGSTREAM_TEST_SASL_SECRET\"\n");
        let config = Config::load(&path).expect("valid");
        assert!(!format!("{config:?}").contains("hunter2-secret"));
        let client = config.kafka.client_config();
        assert_eq!(client.get("sasl.password"), Some("hunter2-secret"));
        assert!(!format!("{:?}", config.kafka).contains("hunter2"));
    }
}
