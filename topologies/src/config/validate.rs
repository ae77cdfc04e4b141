//! The configuration's cross-field checks, section by section ([`Config::validate`]).

use super::*;

impl Config {
    /// Sources, chunking, embedder, index, runtime and Kafka.
    pub(super) fn validate_pipeline(&self) -> Result<(), ConfigError> {
        self.validate_sources()?;
        self.validate_embedder()?;
        self.validate_index()?;
        self.validate_runtime()?;
        self.validate_intake()
    }

    /// The source and chunking: extensions, preview window, path, tokenizer, chunk sizes.
    fn validate_sources(&self) -> Result<(), ConfigError> {
        for (key, list) in [
            ("source.include_extensions", &self.source.include_extensions),
            ("source.exclude_extensions", &self.source.exclude_extensions),
        ] {
            if list.len() > 256 || list.iter().any(|e| e.is_empty() || e.len() > 32) {
                return invalid(key, "at most 256 extensions of 1 to 32 bytes each");
            }
        }
        if let Err(message) = self.index.bm25.check() {
            return invalid("index.bm25", &message);
        }
        if !(512..=16 << 20).contains(&self.source.preview_window) {
            return invalid("source.preview_window", "512 to 16777216 bytes");
        }
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
        Ok(())
    }

    /// The embedder: its threads, slices, executors and what its kind needs.
    fn validate_embedder(&self) -> Result<(), ConfigError> {
        if self.embedder.threads == 0 {
            return invalid("embedder.threads", "must be at least 1");
        }
        if self
            .embedder
            .query_headroom_secs
            .is_some_and(|secs| secs > 86_400)
        {
            return invalid(
                "embedder.query_headroom_secs",
                "must be at most 86400 (0 turns it off)",
            );
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
        if self.embedder.kind == EmbedderKind::Http
            && self.embedder.evidence_vectors == EvidenceVectors::Pooled
        {
            return invalid(
                "embedder.evidence_vectors",
                "pooled needs the local model's word pieces; the http embedder embeds units alone",
            );
        }
        Ok(())
    }

    /// The index: what its kind needs and its HNSW and optimization tuning.
    fn validate_index(&self) -> Result<(), ConfigError> {
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
        if tuning.optimize_idle_ms > std::time::Duration::from_secs(3_600) {
            return invalid(
                "index.tuning.optimize_idle_ms",
                "must be at most 3600000 (an hour; 0 = not on idling)",
            );
        }
        Ok(())
    }

    /// The runtime: workers, processes of a cluster, the stop grace.
    fn validate_runtime(&self) -> Result<(), ConfigError> {
        if self.runtime.stop_grace_secs > std::time::Duration::from_secs(3_600) {
            return invalid(
                "runtime.stop_grace_secs",
                "must be at most 3600 (an hour; 0 = until in-flight work is done)",
            );
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
        Ok(())
    }

    /// What comes in: Kafka flow control, metadata keys, document and request limits, the file sandbox.
    fn validate_intake(&self) -> Result<(), ConfigError> {
        if self.kafka.max_batch == 0 || self.kafka.max_in_flight < self.kafka.max_batch {
            return invalid(
                "kafka.max_in_flight",
                "must be at least kafka.max_batch (> 0)",
            );
        }
        if self.index.metadata.len() > ragstream_operators::metadata::MAX_KEYS {
            return invalid(
                "index.metadata",
                &format!("at most {} keys", ragstream_operators::metadata::MAX_KEYS),
            );
        }
        if let Some(error) = self
            .index
            .metadata
            .keys()
            .find_map(|key| ragstream_operators::metadata::check_key(key).err())
        {
            return invalid("index.metadata", &error);
        }
        let session = std::time::Duration::from_secs(3)..=std::time::Duration::from_secs(300);
        if !session.contains(&self.kafka.session_timeout_ms) {
            return invalid(
                "kafka.session_timeout_ms",
                "must be between 3000 and 300000 (3 s to 5 min)",
            );
        }
        if self.ingest.max_document_bytes == 0 {
            return invalid("ingest.max_document_bytes", "must be positive");
        }
        let rate = self.http.token_requests_per_second;
        if !(rate.is_finite() && rate >= 0.0) {
            return invalid(
                "http.token_requests_per_second",
                "must be a number of requests a second, 0 or more (0: no limit)",
            );
        }
        if !(1..=1024).contains(&self.ingest.tenant_in_flight_mib) {
            return invalid("ingest.tenant_in_flight_mib", "must be 1 to 1024 MiB");
        }
        let sandbox = &self.ingest.sandbox;
        if !(128..=65_536).contains(&sandbox.memory_mib) {
            return invalid("ingest.sandbox.memory_mib", "must be 128 to 65536 MiB");
        }
        if !(1..=3_600).contains(&sandbox.cpu_secs) {
            return invalid("ingest.sandbox.cpu_secs", "must be 1 to 3600 seconds");
        }
        if !(sandbox.cpu_secs..=7_200).contains(&sandbox.wall_secs) {
            return invalid(
                "ingest.sandbox.wall_secs",
                "must be at least ingest.sandbox.cpu_secs and at most 7200 seconds",
            );
        }
        if !(1..=64).contains(&sandbox.max_parallel) {
            return invalid("ingest.sandbox.max_parallel", "must be 1 to 64");
        }
        if self.kafka.max_in_flight_mib.saturating_mul(1 << 20) < self.ingest.max_document_bytes {
            return invalid(
                "kafka.max_in_flight_mib",
                &format!(
                    "must hold the largest document event (ingest.max_document_bytes = {})",
                    self.ingest.max_document_bytes
                ),
            );
        }
        // librdkafka takes at most 2097151 KiB of prefetch (and 2 GiB a fetch).
        if !(1..=MAX_PREFETCH_KBYTES).contains(&self.kafka.prefetch_kbytes) {
            return invalid(
                "kafka.prefetch_kbytes",
                &format!("must be 1 to {MAX_PREFETCH_KBYTES} KiB"),
            );
        }
        Ok(())
    }

    /// The query section and each of its presets.
    pub(super) fn validate_query(&self) -> Result<(), ConfigError> {
        check_query(&self.query)?;
        let presets = ragstream_core::query::presets::resolve(&self.query).map_err(|message| {
            ConfigError::Invalid {
                key: "query.presets",
                message,
            }
        })?;
        for (name, preset) in &presets {
            check_query(preset).map_err(|error| ConfigError::Invalid {
                key: "query.presets",
                message: format!("preset {name}: {error}"),
            })?;
        }
        Ok(())
    }

    /// The HTTP server.
    pub(super) fn validate_http(&self) -> Result<(), ConfigError> {
        let standing = &self.standing;
        if !(1..=1_000_000).contains(&standing.max_total)
            || !(1..=standing.max_total).contains(&standing.max_per_tenant)
        {
            return invalid(
                "standing.max_per_tenant",
                "1 ≤ standing.max_per_tenant ≤ standing.max_total ≤ 1000000",
            );
        }
        if !(1..=1024).contains(&standing.versions_kept) {
            return invalid("standing.versions_kept", "must be in 1..=1024");
        }
        if !(1..=standing.max_ttl_secs).contains(&standing.default_ttl_secs)
            || standing.max_ttl_secs > 365 * 24 * 3600
        {
            return invalid(
                "standing.default_ttl_secs",
                "1 ≤ standing.default_ttl_secs ≤ standing.max_ttl_secs ≤ one year",
            );
        }
        if standing.default_min_interval_ms > MAX_MIN_INTERVAL_MS {
            return invalid("standing.default_min_interval_ms", "at most one hour");
        }
        if !(1..=256).contains(&standing.evaluations_in_flight) {
            return invalid("standing.evaluations_in_flight", "must be in 1..=256");
        }
        if !(0.0..=10_000.0).contains(&standing.evaluations_per_core_sec) {
            return invalid(
                "standing.evaluations_per_core_sec",
                "must be in 0..=10000 (0: no cap)",
            );
        }
        if !(0.0..=1.0).contains(&standing.drift) {
            return invalid("standing.drift", "must be in 0..=1");
        }
        if !(0.0..=standing.drift).contains(&standing.rest_drift) {
            return invalid("standing.rest_drift", "must be in 0..=standing.drift");
        }
        let http = &self.http;
        for (env, labels) in &http.token_labels {
            if !http.tokens.contains_key(env) || labels.iter().any(String::is_empty) {
                return invalid(
                    "http.token_labels",
                    "maps variable names of http.tokens to lists of non-empty labels",
                );
            }
        }
        if !(1..=65_536).contains(&http.max_connections) {
            return invalid("http.max_connections", "must be in 1..=65536");
        }
        if !(1..=4096).contains(&http.max_queries_in_flight) {
            return invalid("http.max_queries_in_flight", "must be in 1..=4096");
        }
        let read = std::time::Duration::from_secs(1)..=std::time::Duration::from_secs(600);
        if !read.contains(&http.read_timeout_secs) {
            return invalid("http.read_timeout_secs", "must be in 1..=600");
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

/// The checks of a query section (the job's, or a resolved preset).
fn check_query(query: &ragstream_core::query::QueryConfig) -> Result<(), ConfigError> {
    use ragstream_core::query::DEEP_MAX_K;
    for (key, k) in [
        ("query.default_k", query.default_k),
        ("query.deep_k", query.deep_k),
    ] {
        if !(1..=DEEP_MAX_K).contains(&k) {
            return invalid(key, "must be in 1..=50");
        }
    }
    if !(1..=1_000_000).contains(&query.default_token_budget) {
        return invalid("query.default_token_budget", "must be in 1..=1000000");
    }
    let pack = &query.pack;
    if let Err((key, message)) = pack.validate() {
        return Err(ConfigError::Invalid { key, message });
    }
    let surrogates = &pack.surrogates;
    if !(surrogates.age_full_days >= 0.0 && surrogates.age_gist_days >= surrogates.age_full_days) {
        return invalid(
            "query.pack.surrogates.age_gist_days",
            "must be at least age_full_days (both at least 0)",
        );
    }
    if !(0.0..=1.0).contains(&surrogates.importance_gist)
        || !(surrogates.importance_gist..=1.0).contains(&surrogates.importance_full)
    {
        return invalid(
            "query.pack.surrogates.importance_full",
            "need 0 <= importance_gist <= importance_full <= 1",
        );
    }
    let rerank = &query.rerank;
    if rerank.kind != ragstream_core::query::endpoints::RerankKind::None
        && rerank.endpoint.url.is_empty()
    {
        return invalid(
            "query.rerank.endpoint.url",
            "required for a rerank endpoint",
        );
    }
    if query.hyde.enabled && query.hyde.endpoint.url.is_empty() {
        return invalid("query.hyde.endpoint.url", "required when hyde is enabled");
    }
    let most = ragstream_core::query::endpoints::MAX_HYPOTHESES;
    if !(1..=most).contains(&query.hyde.num_hypotheses) {
        return invalid("query.hyde.num_hypotheses", "must be in 1..=8");
    }
    for (key, endpoint) in [
        ("query.rerank.endpoint", &rerank.endpoint),
        ("query.hyde.endpoint", &query.hyde.endpoint),
    ] {
        if endpoint.timeout_ms.is_zero() {
            return Err(ConfigError::Invalid {
                key,
                message: "timeout_ms must be at least 1".into(),
            });
        }
    }
    if !(0.0..=1.0).contains(&query.mmr_lambda) {
        return invalid("query.mmr_lambda", "must be in [0, 1]");
    }
    if !(0.0..=1.0).contains(&query.mmr_file_penalty) {
        return invalid("query.mmr_file_penalty", "must be in [0, 1]");
    }
    if !(query.near_duplicate > 0.0 && query.near_duplicate <= 1.0) {
        return invalid("query.near_duplicate", "must be in (0, 1]");
    }
    if !(-1.0..=1.0).contains(&query.similarity_threshold) {
        return invalid("query.similarity_threshold", "must be in [-1, 1]");
    }
    if query.rrf_k <= 0.0 {
        return invalid("query.rrf_k", "must be positive");
    }
    if query.per_document_cap == 0 || query.per_section_cap == 0 {
        return invalid("query.per_document_cap", "caps must be at least 1");
    }
    if !(64..=(1 << 24)).contains(&query.max_query_bytes) {
        return invalid("query.max_query_bytes", "must be in 64..=16777216");
    }
    if !(0.0..1.0).contains(&query.window.reserve_ratio) {
        return invalid("query.window.reserve_ratio", "must be in [0, 1)");
    }
    if let Err(message) = query.intents.validate() {
        return Err(ConfigError::Invalid {
            key: "query.intents",
            message,
        });
    }
    if let Err(message) = query.code_search.validate() {
        return Err(ConfigError::Invalid {
            key: "query.code_search",
            message,
        });
    }
    Ok(())
}

fn invalid(key: &'static str, message: &str) -> Result<(), ConfigError> {
    Err(ConfigError::Invalid {
        key,
        message: message.into(),
    })
}
