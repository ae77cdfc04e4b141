//! Where documents come from: `[source]` and `[kafka]`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Which input feeds the ingest flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
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
#[derive(Debug, Clone, Deserialize, Serialize)]
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
    #[serde(with = "ragstream_core::duration::secs")]
    pub rescan_secs: std::time::Duration,
    /// `dir`: read only files with these extensions (`md`, `.rs`, `tar.gz`; case-insensitive);
    /// empty: every file.
    #[serde(default)]
    pub include_extensions: Vec<String>,
    /// `dir`: never read files with these extensions; a file excluded after it was indexed is
    /// deleted from the index at the next scan.
    #[serde(default)]
    pub exclude_extensions: Vec<String>,
    /// `dir`: bytes at the start of a file searched for a NUL byte, the sign of a binary file that
    /// is skipped (HTML, PDF and DOCX are recognised first); 512 to 16 MiB.
    #[serde(default = "default_preview_window")]
    pub preview_window: usize,
}

fn default_preview_window() -> usize {
    ragstream_operators::io::dir_source::DEFAULT_PREVIEW_WINDOW
}

fn default_tenant() -> String {
    "local".into()
}
fn default_rescan_secs() -> std::time::Duration {
    std::time::Duration::from_secs(5)
}

/// Kafka connection and topics.
#[derive(Clone, Deserialize, Serialize)]
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
    /// Invalidations topic (a published context cites a chunk since deleted or changed; key = query
    /// id).
    #[serde(default = "default_invalidations_topic")]
    pub invalidations_topic: String,
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
    /// Unacknowledged bytes of document events per worker (MiB) above which that worker's
    /// consumption pauses too (until it is down to half), and past half of which a poll batch ends:
    /// large documents are bounded by their size, not their count.
    #[serde(default = "default_max_in_flight_mib")]
    pub max_in_flight_mib: usize,
    /// Group session timeout, ms (`session.timeout.ms` of the documents and queries consumers;
    /// heartbeats every tenth of it, at most every 3 s). A member whose coordinator has not answered
    /// for this long drops its partitions and rejoins; a killed job's partitions move after it.
    #[serde(default = "default_session_timeout_ms")]
    #[serde(with = "ragstream_core::duration::millis")]
    pub session_timeout_ms: std::time::Duration,
    /// Whether the job creates the queries, contexts, invalidations and DLQ topics it misses at
    /// start (one partition each). Set `false` where topics are provisioned by their owners: a
    /// missing topic is then an outage, retried until it exists (a document waiting for a missing
    /// DLQ topic holds its offset).
    #[serde(default = "default_true")]
    pub create_topics: bool,
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("documents_topic", &self.documents_topic)
            .field("dlq_topic", &self.dlq_topic)
            .field("queries_topic", &self.queries_topic)
            .field("contexts_topic", &self.contexts_topic)
            .field("invalidations_topic", &self.invalidations_topic)
            .field("group_id", &self.group_id)
            .field("security_protocol", &self.security_protocol)
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("sasl_username", &self.sasl_username)
            .field("sasl_password_env", &self.sasl_password_env)
            .finish_non_exhaustive()
    }
}

fn default_true() -> bool {
    true
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
fn default_invalidations_topic() -> String {
    "ragstream.invalidations".into()
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
fn default_max_in_flight_mib() -> usize {
    256
}
fn default_max_in_flight() -> usize {
    5000
}
fn default_session_timeout_ms() -> std::time::Duration {
    std::time::Duration::from_secs(10)
}

impl Default for KafkaConfig {
    fn default() -> Self {
        serde_json::from_str("{}").expect("defaults")
    }
}

impl KafkaConfig {
    /// librdkafka client settings, the password taken from the environment.
    #[cfg(feature = "kafka")]
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
