//! Shared helpers of the integration tests: the model directory, a Tansu broker on loopback, the job
//! process, and small HTTP/Kafka utilities.
#![allow(dead_code)]

pub mod broker;
pub mod job;
pub mod oracle;

use std::path::PathBuf;

/// The MiniLM model directory (fetched by `deploy/scripts/fetch-model.sh`, which the test command runs).
pub fn model_dir() -> PathBuf {
    let dir = std::env::var_os("RAGSTREAM_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME"))
                .join(".cache/ragstream/models/all-MiniLM-L6-v2")
        });
    assert!(
        dir.join("model.safetensors").is_file(),
        "model missing at {}: run deploy/scripts/fetch-model.sh (the test command does)",
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
