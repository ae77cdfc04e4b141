use super::*;
use ragstream_operators::model::EvidenceUnits;
use std::path::PathBuf;

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
fn a_config_needing_a_component_this_build_lacks_is_refused_naming_its_feature() {
    let (_dir, path) = write("[source]\nkind = \"dir\"\npath = \".\"\n");
    let local = Config::load(&path).expect("valid");
    let bare = Features {
        kafka: false,
        qdrant_server: false,
    };
    let full = Features {
        kafka: true,
        qdrant_server: true,
    };
    assert!(
        local.check_features(bare).is_ok(),
        "the local job needs none"
    );
    let mut kafka = local.clone();
    kafka.source.kind = SourceKind::Kafka;
    let err = kafka.check_features(bare).unwrap_err().to_string();
    assert!(
        err.contains("`source.kind = \"kafka\"`") && err.contains("--features kafka"),
        "{err}"
    );
    assert!(kafka
        .check_features(Features {
            qdrant_server: true,
            ..bare
        })
        .is_err());
    let mut server = local.clone();
    server.index.kind = IndexKind::Server;
    let err = server.check_features(bare).unwrap_err().to_string();
    assert!(
        err.contains("`index.kind = \"server\"`") && err.contains("`qdrant-server` feature"),
        "{err}"
    );
    for config in [&local, &kafka, &server] {
        assert!(config.check_features(full).is_ok());
    }
}

#[test]
#[cfg(feature = "kafka")]
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
    // The writer optimizes after 2 s idle by default; 0 turns that off; more than an hour is refused.
    assert_eq!(
        Config::load(&write(dir).1)
            .expect("valid")
            .index
            .tuning
            .optimize_when_idle(),
        Some(std::time::Duration::from_secs(2))
    );
    let (_dir, path) = write(&format!("{dir}[index.tuning]\noptimize_idle_ms = 0\n"));
    let tuning = Config::load(&path).expect("valid").index.tuning;
    assert_eq!(tuning.optimize_when_idle(), None);
    let err = load_error(&format!(
        "{dir}[index.tuning]\noptimize_idle_ms = 3600001\n"
    ));
    assert!(err.contains("index.tuning.optimize_idle_ms"), "{err}");
    // A stop's grace: an hour at most; the local preset stops within 5 s.
    let err = load_error(&format!("{dir}[runtime]\nstop_grace_secs = 3601\n"));
    assert!(err.contains("runtime.stop_grace_secs"), "{err}");
    let local = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("presets/local.toml");
    let runtime = Config::load(&local).expect("valid").runtime;
    assert_eq!(
        (
            runtime.stop_grace_secs,
            Config::load(&write(dir).1).unwrap().runtime.stop_grace_secs
        ),
        (std::time::Duration::from_secs(5), std::time::Duration::ZERO)
    );
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
    let err = load_error("[source]\nkind = \"kafka\"\n[index.metadata]\n\"a.b\" = \"keyword\"\n");
    assert!(err.contains("index.metadata"), "{err}");
    let (_dir, path) = write(
        "[source]\nkind = \"kafka\"\n[index.metadata]\nyear = \"integer\"\nwhen = \"datetime\"\n",
    );
    let config = Config::load(&path).expect("declared metadata keys");
    assert_eq!(config.index.metadata.len(), 2);
    for timeout in [0, 2999, 300_001] {
        let err = load_error(&format!(
            "[source]\nkind = \"kafka\"\n[kafka]\nsession_timeout_ms = {timeout}\n"
        ));
        assert!(err.contains("kafka.session_timeout_ms"), "{err}");
    }
    // The prefetch: within librdkafka's limit.
    for prefetch in ["0", "2000001", "9223372036854775807"] {
        let err = load_error(&format!(
            "[source]\nkind = \"kafka\"\n[kafka]\nprefetch_kbytes = {prefetch}\n[ingest]\nmax_document_bytes = 8388608\n"
        ));
        assert!(err.contains("kafka.prefetch_kbytes"), "{prefetch}: {err}");
    }
    // The bytes in flight must hold the largest document event.
    let err = load_error(
        "[source]\nkind = \"kafka\"\n[kafka]\nmax_in_flight_mib = 4\n[ingest]\nmax_document_bytes = 8388608\n",
    );
    assert!(err.contains("kafka.max_in_flight_mib"), "{err}");
    // Pooled evidence vectors need the local model; the http embedder is refused them.
    let err = load_error(
        "[source]\nkind = \"kafka\"\n[embedder]\nkind = \"http\"\nurl = \"http://e\"\nevidence_vectors = \"pooled\"\n",
    );
    assert!(err.contains("embedder.evidence_vectors"), "{err}");
    let (_dir, path) =
        write("[source]\nkind = \"kafka\"\n[embedder]\nevidence_vectors = \"pooled\"\n");
    let config = Config::load(&path).expect("pooled on the local model");
    assert_eq!(config.embedder.evidence(), EvidenceUnits::Pooled);
    assert_eq!(EmbedderConfig::default().evidence(), EvidenceUnits::Alone);
}

#[test]
#[cfg(feature = "kafka")]
fn debug_never_shows_the_password() {
    std::env::set_var("RAGSTREAM_TEST_SASL_SECRET", "hunter2-secret");
    let (_dir, path) = write("[source]\nkind = \"kafka\"\n[kafka]\nsasl_username = \"u\"\nsasl_password_env = \"RAGSTREAM_TEST_SASL_SECRET\"\n");
    let config = Config::load(&path).expect("valid");
    assert!(!format!("{config:?}").contains("hunter2-secret"));
    let client = config.kafka.client_config();
    assert_eq!(client.get("sasl.password"), Some("hunter2-secret"));
    assert!(!format!("{:?}", config.kafka).contains("hunter2"));
}

#[test]
fn query_endpoint_and_packing_settings_are_checked() {
    let kafka = "[source]\nkind = \"kafka\"\n";
    for (section, key) in [
        ("[query.pack]\nevidence_ratio = 1.5\n", "query.pack.evidence_ratio"),
        ("[query.pack]\nsentence_ratio = -0.1\n", "query.pack.sentence_ratio"),
        (
            "[query.pack.surrogates]\nage_full_days = 30.0\nage_gist_days = 7.0\n",
            "query.pack.surrogates.age_gist_days",
        ),
        (
            "[query.pack.surrogates]\nimportance_full = 0.2\nimportance_gist = 0.5\n",
            "query.pack.surrogates.importance_full",
        ),
        ("[query.rerank]\nkind = \"http\"\n", "query.rerank.endpoint.url"),
        ("[query.hyde]\nenabled = true\n", "query.hyde.endpoint.url"),
        (
            "[query.rerank]\nkind = \"llm\"\n[query.rerank.endpoint]\nurl = \"http://x\"\ntimeout_ms = 0\n",
            "query.rerank.endpoint",
        ),
        // Intent names are checked at load: a typo is an error, not HyDE silently off.
        ("[query.hyde]\nintents = [\"exploratry\"]\n", "exploratry"),
        ("[query.intents.procedur]\n", "procedur"),
        (
            "[query.intents.claim]\nweights = { dense = 0.0, bm25 = 0.0 }\ndepth = { dense = 16, bm25 = 16 }\n",
            "query.intents",
        ),
        ("[query.code_search]\nshare = 2.0\n", "query.code_search"),
        ("[query.window]\nreserve_ratio = 1.0\n", "query.window.reserve_ratio"),
        ("[query.embedding_cache]\nentries = 0\n", "query.embedding_cache.entries"),
        ("[standing]\nevaluations_in_flight = 0\n", "standing.evaluations_in_flight"),
        ("[standing]\nevaluations_per_core_sec = -1.0\n", "standing.evaluations_per_core_sec"),
        ("[standing]\nevaluations_per_core_sec = nan\n", "standing.evaluations_per_core_sec"),
        ("[standing]\nrest_drift = 0.9\n", "standing.rest_drift"),
        ("[query.pack]\ndeferred_value = 2.0\n", "query.pack.deferred_value"),
        ("[query]\ndefault_k = 0\n", "query.default_k"),
        ("[query]\ndeep_k = 51\n", "query.deep_k"),
        ("[query]\ndefault_token_budget = 0\n", "query.default_token_budget"),
        ("[query]\ndefault_token_budget = 1000001\n", "query.default_token_budget"),
        ("[query]\nsimilarity_threshold = 1.5\n", "query.similarity_threshold"),
        ("include_extensions = [\"\"]\n", "source.include_extensions"),
        ("preview_window = 100\n", "source.preview_window"),
        ("[index.bm25]\nk1 = 5.0\n", "index.bm25"),
        ("[index.bm25]\nvariant = \"adpt\"\n", "per-term k1"),
        ("[query.hyde]\nnum_hypotheses = 9\n", "query.hyde.num_hypotheses"),
        ("[query.hyde]\nstrategy = \"both\"\n", "both"),
        ("[query.pack]\nheader_format = \"{source} {author}\"\n", "{author}"),
        ("[query.pack]\nheader_format = \"{source\"\n", "query.pack.header_format"),
    ] {
        let err = load_error(&format!("{kafka}{section}"));
        assert!(err.contains(key), "{section}: {err}");
    }
    let (_dir, path) = write(&format!(
        "{kafka}[query.rerank]\nkind = \"http\"\n[query.rerank.endpoint]\nurl = \"http://127.0.0.1:8080\"\n[query.pack.surrogates]\npolicy = \"age\"\n"
    ));
    let config = Config::load(&path).expect("valid");
    assert_eq!(
        config.query.rerank.endpoint.timeout_ms,
        std::time::Duration::from_secs(2)
    );
    let (_dir, path) = write(&format!(
        "{kafka}[query.intents.procedure]\nweights = {{ dense = 0.9, bm25 = 0.1 }}\ndepth = {{ dense = 40, bm25 = 8 }}\n[query.code_search]\nhead = 5\n"
    ));
    let config = Config::load(&path).expect("valid");
    assert_eq!(config.query.intents.procedure.weights.dense, 0.9);
    assert_eq!(config.query.intents.procedure.depth.bm25, 8);
    assert_eq!(config.query.code_search.head, 5);
    assert_eq!(config.query.code_search.share, 0.6);
}

#[test]
fn environment_overrides_set_scalars_and_comma_separated_lists() {
    let (_dir, path) = write("[source]\nkind = \"jsonl\"\npath = \"e.jsonl\"\n");
    let overrides = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<std::collections::HashMap<_, _>>()
    };
    let config = Config::load_with(
        &path,
        overrides(&[
            ("RAGSTREAM_INGEST__ALLOWED_TENANTS", "acme,globex"),
            (
                "RAGSTREAM_HTTP__MCP_ALLOWED_HOSTS",
                "localhost,rag.example.com",
            ),
            ("RAGSTREAM_QUERY__HYDE__INTENTS", "exploratory"),
            ("RAGSTREAM_SOURCE__INCLUDE_EXTENSIONS", "md,rs"),
            ("RAGSTREAM_SOURCE__EXCLUDE_EXTENSIONS", "lock"),
            ("RAGSTREAM_QUERY__MMR_LAMBDA", "0.7"),
            ("RAGSTREAM_QUERY__ADAPT_FUSION", "false"),
        ]),
    )
    .expect("loads");
    assert_eq!(config.ingest.allowed_tenants, ["acme", "globex"]);
    assert_eq!(config.http.allowed_hosts, ["localhost", "rag.example.com"]);
    assert_eq!(
        config.query.hyde.intents,
        [ragstream_core::query::intent::Intent::Exploratory]
    );
    assert_eq!(config.source.include_extensions, ["md", "rs"]);
    assert_eq!(config.source.exclude_extensions, ["lock"]);
    assert!((config.query.mmr_lambda - 0.7).abs() < 1e-6);
    assert!(!config.query.adapt_fusion);
}

#[test]
fn retrieval_presets_load_from_the_file_and_the_environment_and_job_keys_are_refused() {
    let dir = "[source]\nkind = \"dir\"\npath = \".\"\n";
    let (_dir, path) = write(&format!(
        "{dir}[query]\nmmr_lambda = 0.7\n[query.presets.fast.rerank]\nwindow = 12\n[query.presets.wide]\nmin_pool = 40\n"
    ));
    let config = Config::load_with(
        &path,
        [("RAGSTREAM_QUERY__PRESETS__WIDE__PER_DOCUMENT_CAP", "3")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into_iter()
            .collect(),
    )
    .expect("loads");
    let query = &config.query;
    assert_eq!(
        query.preset_names(),
        ["default", "conservative", "fast", "wide"]
    );
    let fast = query.preset(Some("fast"));
    assert_eq!((fast.rerank.window, fast.min_pool), (12, 10));
    assert!((fast.mmr_lambda - 0.7).abs() < 1e-6, "the section's value");
    let wide = query.preset(Some("wide"));
    assert_eq!((wide.min_pool, wide.per_document_cap), (40, 3));
    // A job-level key, an unknown one and a value out of range are refused at load, by name.
    let err = load_error(&format!(
        "{dir}[query.presets.open]\nabsent_acl = \"all\"\n"
    ));
    assert!(
        err.contains("query.presets") && err.contains("absent_acl"),
        "{err}"
    );
    let err = load_error(&format!("{dir}[query.presets.x]\nmin_pol = 3\n"));
    assert!(err.contains("min_pol"), "{err}");
    let err = load_error(&format!("{dir}[query.presets.x]\nmmr_lambda = 2.0\n"));
    assert!(
        err.contains("preset x") && err.contains("query.mmr_lambda"),
        "{err}"
    );
}

#[test]
fn query_headroom_defaults_by_embedder_and_is_bounded() {
    let dir = "[source]\nkind = \"dir\"\npath = \".\"\n";
    let load = |extra: &str| {
        let (_dir, path) = write(&format!("{dir}{extra}"));
        Config::load(&path)
            .expect("valid")
            .embedder
            .query_headroom()
    };
    assert_eq!(load(""), Some(std::time::Duration::from_secs(5)));
    let http = "[embedder]\nkind = \"http\"\nurl = \"http://127.0.0.1:1/v1/embeddings\"\n";
    assert_eq!(load(http), None, "the http embedder's model runs elsewhere");
    assert_eq!(load("[embedder]\nquery_headroom_secs = 0\n"), None);
    assert_eq!(
        load("[embedder]\nquery_headroom_secs = 30\n"),
        Some(std::time::Duration::from_secs(30))
    );
    let err = load_error(&format!("{dir}[embedder]\nquery_headroom_secs = 100000\n"));
    assert!(err.contains("embedder.query_headroom_secs"), "{err}");
}
