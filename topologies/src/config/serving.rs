//! Where chunks are kept and how the job is served and run: `[index]`, `[http]` and `[runtime]`.

use std::path::PathBuf;

use ragstream_operators::store::IndexTuning;
use serde::{Deserialize, Serialize};

/// Which index backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IndexKind {
    /// qdrant-edge in-process, one shard directory per worker.
    Edge,
    /// A Qdrant server.
    Server,
}

/// Index settings.
#[derive(Debug, Clone, Deserialize, Serialize)]
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
    /// Metadata keys with a payload index, by type (`[index.metadata]`, e.g. `year = "integer"`):
    /// `keyword`, `integer`, `float`, `bool` or `datetime`. Undeclared keys filter too, by a scan of
    /// what the other conditions leave.
    #[serde(default)]
    pub metadata: std::collections::BTreeMap<String, ragstream_operators::metadata::MetaIndex>,
    /// BM25's document-side weighting (`[index.bm25]`: `variant`, `k1`, `b`, `delta`). A setting
    /// other than the default is stamped on every point with the embedder version: an index written
    /// with another refuses to open (`embedder.reembed` re-encodes it).
    #[serde(default)]
    pub bm25: ragstream_operators::store::Bm25Params,
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
#[derive(Debug, Clone, Deserialize, Serialize)]
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
    /// (`POST /v1/query` for another tenant is answered 403).
    #[serde(default)]
    pub tokens: std::collections::BTreeMap<String, Vec<String>>,
    /// The ACL labels of a tenant-bound token (environment variable name of `tokens` → labels): its
    /// queries and MCP calls carry these labels; a request may name fewer, never others. A
    /// tenant-bound token not listed here sees chunks without labels only, also under
    /// `query.absent_acl = "all"`.
    #[serde(default)]
    pub token_labels: std::collections::BTreeMap<String, Vec<String>>,
    /// `Host` header values that the `/v1/` data routes and `/mcp` accept (DNS-rebinding
    /// protection; `name` or `name:port`, `*` for any). Empty: loopback names only (`localhost`,
    /// `127.0.0.1`, `[::1]`), right for a laptop; a job served under other names lists them here.
    /// `/healthz`, `/readyz` and `/metrics` answer any `Host`. Formerly `mcp_allowed_hosts`.
    #[serde(default, alias = "mcp_allowed_hosts")]
    pub allowed_hosts: Vec<String>,
    /// Serve without bearer tokens on a non-loopback address. A job listening beyond loopback with
    /// no token set refuses to start unless this says so in so many words.
    #[serde(default)]
    pub anonymous: bool,
    /// Open connections at once; a connection over the cap is closed at once.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Requests a second of one credential (a bearer token) on the data routes and `/mcp`; beyond,
    /// 429 `rate_limited` with `Retry-After`. 0: no limit. A job without tokens limits none.
    #[serde(default = "default_token_requests_per_second")]
    pub token_requests_per_second: f64,
    /// Requests one credential may send at once after a quiet spell (at least 1).
    #[serde(default = "default_token_burst")]
    pub token_burst: std::num::NonZeroU32,
    /// `POST /v1/query`, `/v1/sources`, `/v1/chunks` and `/mcp` requests waiting for their contexts at
    /// once (a query whose caller went away counts until the dataflow answers it); beyond, 503 with
    /// `Retry-After`.
    #[serde(default = "default_max_queries_in_flight")]
    pub max_queries_in_flight: usize,
    /// Seconds a client has to send a request's head, and again its body; a response that the
    /// client reads nothing of for as long is dropped with its connection.
    #[serde(default = "default_read_timeout_secs")]
    #[serde(with = "ragstream_core::duration::secs")]
    pub read_timeout_secs: std::time::Duration,
}

fn default_token_requests_per_second() -> f64 {
    200.0
}
fn default_token_burst() -> std::num::NonZeroU32 {
    std::num::NonZeroU32::new(400).expect("not zero")
}
fn default_max_connections() -> usize {
    1024
}

fn default_max_queries_in_flight() -> usize {
    256
}

fn default_read_timeout_secs() -> std::time::Duration {
    std::time::Duration::from_secs(10)
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
            token_labels: Default::default(),
            allowed_hosts: Vec::new(),
            anonymous: false,
            max_connections: default_max_connections(),
            token_requests_per_second: default_token_requests_per_second(),
            token_burst: default_token_burst(),
            max_queries_in_flight: default_max_queries_in_flight(),
            read_timeout_secs: default_read_timeout_secs(),
        }
    }
}

/// Process and worker settings.
#[derive(Debug, Clone, Deserialize, Serialize)]
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
    #[serde(with = "ragstream_core::duration::secs")]
    pub exit_when_idle_secs: std::time::Duration,
    /// Keep answering queries after a finite (JSONL) input is indexed, until stopped.
    #[serde(default)]
    pub serve: bool,
    /// Seconds a stop signal waits for in-flight work before the job stops as a second signal
    /// stops it (at once; unacknowledged work is redone on restart, nothing is lost); 0 = wait
    /// until it is done. At most 3600.
    #[serde(default)]
    #[serde(with = "ragstream_core::duration::secs")]
    pub stop_grace_secs: std::time::Duration,
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

/// The longest `min_interval_ms` a subscription may ask for: an hour.
pub const MAX_MIN_INTERVAL_MS: u64 = 3_600_000;

/// Standing queries: subscriptions whose contexts the job keeps current (`[standing]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StandingConfig {
    /// Serve `/v1/subscriptions` and keep the subscriptions' contexts current (in a cluster, every
    /// process takes subscriptions; each shard's writer ships what it finished to all of them).
    pub enabled: bool,
    /// Subscriptions one tenant may hold at once; beyond, 403 `quota_exceeded`.
    pub max_per_tenant: usize,
    /// Subscriptions the process holds at once (all tenants); beyond, 503 `busy`.
    pub max_total: usize,
    /// Versions kept per subscription for `Last-Event-ID` resumption (a client further behind
    /// resumes from the latest).
    pub versions_kept: usize,
    /// A subscription's `ttl_secs` when it gives none.
    pub default_ttl_secs: u64,
    /// The longest `ttl_secs` a subscription may ask for.
    pub max_ttl_secs: u64,
    /// A subscription's `min_interval_ms` when it gives none: the least time between two of its
    /// evaluations, so a burst of writes costs one.
    pub default_min_interval_ms: u64,
    /// Re-evaluations in the dataflow at once (all subscriptions); the rest wait their turn.
    pub evaluations_in_flight: usize,
    /// Re-evaluations started per second at most, per core of the machine (all subscriptions; 0:
    /// no cap). Each one is a query's CPU taken from ingest and one-shot queries (about 5 ms on a
    /// slow core): under the cap, changes wait and are folded into fewer evaluations (later
    /// versions, fewer of them).
    pub evaluations_per_core_sec: f64,
    /// How far corpus statistics may move a subscription's BM25 scores since its last evaluation,
    /// as a share of its best BM25 score, before it is re-evaluated while documents stream (its
    /// BM25 candidates may have changed places; new chunks are judged with the drift allowed for).
    pub drift: f32,
    /// The same once the tenant is quiet: past it, a subscription is evaluated once more, so at
    /// rest only BM25 scores closer than twice this share of the best may keep an earlier order
    /// (0: every move is re-evaluated, exact at rest whatever the ties).
    pub rest_drift: f32,
    /// Keep subscriptions across restarts: each one's parameters and latest version in a file
    /// under `path`, taken back when the job starts again.
    pub durable: bool,
    /// Where subscriptions are kept (default: `subscriptions` under `index.path`).
    pub path: Option<std::path::PathBuf>,
}

impl StandingConfig {
    /// Re-evaluations started per second at most on this machine (`None`: no cap).
    pub fn evaluations_per_sec(&self) -> Option<f64> {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        (self.evaluations_per_core_sec > 0.0)
            .then_some(self.evaluations_per_core_sec * cores as f64)
    }

    /// The directory of the subscriptions kept across restarts, if they are kept.
    pub fn kept(&self, index_path: &std::path::Path) -> Option<std::path::PathBuf> {
        self.durable.then(|| {
            self.path
                .clone()
                .unwrap_or_else(|| index_path.join("subscriptions"))
        })
    }
}

impl Default for StandingConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_per_tenant: 100,
            max_total: 10_000,
            versions_kept: 32,
            default_ttl_secs: 3600,
            max_ttl_secs: 7 * 24 * 3600,
            default_min_interval_ms: 250,
            evaluations_in_flight: 4,
            evaluations_per_core_sec: 20.0,
            drift: 0.5,
            rest_drift: 0.001,
            durable: true,
            path: None,
        }
    }
}
