//! Shared helpers of the integration tests: the model directory, a Tansu broker on loopback, the job
//! process, and small HTTP/Kafka utilities.
#![allow(dead_code)]

pub mod broker;
pub mod contexts;
pub mod endpoints;
pub mod job;
pub mod oracle;
pub mod qdrant;

use std::path::PathBuf;

/// The local embedder of the tests: ONNX Runtime from the test command's cache, `precision` graph.
pub fn minilm(
    precision: ragstream_operators::embed::minilm::Precision,
) -> ragstream_operators::embed::minilm::MiniLm {
    minilm_pooling(precision, false)
}

/// [`minilm`], pooling spans from their texts' passes where `pool_spans`.
pub fn minilm_pooling(
    precision: ragstream_operators::embed::minilm::Precision,
    pool_spans: bool,
) -> ragstream_operators::embed::minilm::MiniLm {
    let config = ragstream_topologies::config::EmbedderConfig::default();
    ragstream_operators::embed::minilm::MiniLm::load(
        &ragstream_operators::embed::minilm::MiniLmOptions {
            model_dir: model_dir(),
            runtime_library: config.runtime_library(),
            precision,
            threads: 2,
            batch_size: 8,
            spinning: config.spinning,
            pool_spans,
        },
    )
    .expect("model loads (deploy/scripts/install/model.sh installs the runtime and graphs)")
}

/// The MiniLM model directory (fetched by `deploy/scripts/install/model.sh`, which the test command runs).
pub fn model_dir() -> PathBuf {
    let dir = std::env::var_os("RAGSTREAM_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME"))
                .join(".cache/ragstream/models/all-MiniLM-L6-v2")
        });
    assert!(
        dir.join("model.safetensors").is_file(),
        "model missing at {}: run deploy/scripts/install/model.sh (the test command does)",
        dir.display()
    );
    dir
}

/// The evaluation data directory (`../shared/data` next to the repository, or `$RAGSTREAM_DATA`).
pub fn data_dir() -> PathBuf {
    let dir = std::env::var_os("RAGSTREAM_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data"));
    assert!(
        dir.join("squad-v1.1/corpus.jsonl").is_file(),
        "evaluation data missing at {}",
        dir.display()
    );
    dir
}

/// A job configuration (with the `{dir}` and `{http}` placeholders [`job::Job::start`] fills) reading
/// documents from Kafka at `brokers`: `kafka` holds the `[kafka]` lines besides `brokers` (topics, group,
/// instance id, batching), `sections` any further TOML sections. Index, HTTP and DLQ file live in `{dir}`.
pub fn kafka_config(brokers: &str, kafka: &str, sections: &str) -> String {
    format!(
        "[source]\nkind = \"kafka\"\n[kafka]\nbrokers = \"{brokers}\"\n{kafka}\n{sections}\n[index]\npath = \"{{dir}}/index\"\n[http]\nlisten = \"{{http}}\"\n[runtime]\ndlq_path = \"{{dir}}/dlq.jsonl\"\n"
    )
}

/// A job that indexes `{dir}/events.jsonl` and stays up serving queries.
pub const JSONL_SERVING: &str = r#"
[source]
kind = "jsonl"
path = "{dir}/events.jsonl"
[index]
path = "{dir}/index"
[http]
listen = "{http}"
[runtime]
serve = true
dlq_path = "{dir}/dlq.jsonl"
"#;
