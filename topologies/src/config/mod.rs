//! The job's configuration: TOML files loaded with the `config` crate, `RAGSTREAM_<SECTION>__<KEY>`
//! environment overrides, unknown keys rejected by name, cross-field checks in [`Config::validate`].
//!
//! Secrets never live here: the Kafka SASL password, the Qdrant API key and the embedder API key are
//! read from environment variables (whose *names* are configurable) and never printed.

mod pipeline;
mod serving;
mod sources;
mod validate;

pub use pipeline::*;
pub use serving::*;
pub use sources::*;

use serde::{Deserialize, Serialize};

/// The whole configuration.
#[derive(Debug, Clone, Deserialize, Serialize)]
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
    pub query: ragstream_core::query::QueryConfig,
    /// Standing queries.
    #[serde(default)]
    pub standing: StandingConfig,
}

/// A configuration error, naming the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file or environment could not be read or parsed (unknown keys land here, named).
    #[error("{0}")]
    Load(String),
    /// The config needs a component this build of ragstream was compiled without.
    #[error(
        "`{key} = \"{value}\"` needs the `{feature}` feature, which this build of ragstream lacks: \
         build it with `cargo build --features {feature}` (or `--features full`)"
    )]
    Feature {
        /// Dotted key.
        key: &'static str,
        /// Its value.
        value: &'static str,
        /// The cargo feature it needs.
        feature: &'static str,
    },
    /// A value is out of range or inconsistent with another.
    #[error("invalid `{key}`: {message}")]
    Invalid {
        /// Dotted key.
        key: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// Most prefetch a documents consumer may be given, KiB (librdkafka's `queued.max.messages.kbytes`
/// is at most 2097151; a fetch of this size stays under its 2 GiB limits).
const MAX_PREFETCH_KBYTES: usize = 2_000_000;

/// The list-valued keys an environment override may set, as comma-separated values.
const LIST_KEYS: [&str; 6] = [
    "source.include_extensions",
    "source.exclude_extensions",
    "ingest.allowed_tenants",
    "http.allowed_hosts",
    "http.mcp_allowed_hosts",
    "query.hyde.intents",
];

impl Config {
    /// Loads `path` (TOML), then `RAGSTREAM_<SECTION>__<KEY>` environment overrides, then validates.
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let overrides: std::collections::HashMap<String, String> = std::env::vars()
            .filter(|(name, _)| name.starts_with("RAGSTREAM_") && name.contains("__"))
            .collect();
        Self::load_with(path, overrides)
    }

    /// [`Self::load`] with the overrides given (`RAGSTREAM_<SECTION>__<KEY>` → value). A scalar key
    /// takes its value as written (numbers and booleans parsed); a key of [`LIST_KEYS`] a
    /// comma-separated list. Tables (`http.tokens`) are set in the file only.
    pub(crate) fn load_with(
        path: &std::path::Path,
        overrides: std::collections::HashMap<String, String>,
    ) -> Result<Self, ConfigError> {
        let environment = LIST_KEYS.iter().fold(
            config::Environment::with_prefix("RAGSTREAM")
                .prefix_separator("_")
                .separator("__")
                .list_separator(",")
                .source(Some(overrides))
                .try_parsing(true),
            |environment, key| environment.with_list_parse_key(key),
        );
        let loaded = config::Config::builder()
            .add_source(config::File::from(path).format(config::FileFormat::Toml))
            .add_source(environment)
            .build()
            .map_err(|e| ConfigError::Load(e.to_string()))?;
        let mut config: Config = loaded
            .try_deserialize()
            .map_err(|e| ConfigError::Load(e.to_string()))?;
        config.validate()?;
        config.query = config
            .query
            .with_presets()
            .map_err(|message| ConfigError::Invalid {
                key: "query.presets",
                message,
            })?;
        Ok(config)
    }

    /// Cross-field checks.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_features(Features::BUILT)?;
        self.validate_pipeline()?;
        self.validate_query()?;
        self.validate_http()
    }

    /// Refuses a source or index whose component `built` lacks (the binary's cargo features).
    pub fn check_features(&self, built: Features) -> Result<(), ConfigError> {
        let needs = [
            (
                self.source.kind == SourceKind::Kafka && !built.kafka,
                "source.kind",
                "kafka",
                "kafka",
            ),
            (
                self.index.kind == IndexKind::Server && !built.qdrant_server,
                "index.kind",
                "server",
                "qdrant-server",
            ),
        ];
        match needs.into_iter().find(|(missing, ..)| *missing) {
            Some((_, key, value, feature)) => Err(ConfigError::Feature {
                key,
                value,
                feature,
            }),
            None => Ok(()),
        }
    }
}

/// The error of a value out of range at `key`.
/// The components of this build that a config may need (the cargo features of the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// `kafka`: the Kafka source and the topics around it.
    pub kafka: bool,
    /// `qdrant-server`: the Qdrant server backend.
    pub qdrant_server: bool,
}

impl Features {
    /// What this build has.
    pub const BUILT: Features = Features {
        kafka: cfg!(feature = "kafka"),
        qdrant_server: cfg!(feature = "qdrant-server"),
    };
}

#[cfg(test)]
mod tests;
