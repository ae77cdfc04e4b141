//! The README's run command: the local preset (`topologies/presets/local.toml`, what
//! `deploy/scripts/run-local.sh` runs) indexes a directory and answers the README's quickstart
//! query, `DLQ headers`, with the struct of that name first.

use std::path::Path;
use std::time::Duration;

use crate::common::job::{answer_context, http_post_json, Job};

/// Files of this repository the quickstart's answer comes from, and two it must be told apart from.
const FILES: [&str; 3] = [
    "operators/core/src/ingest/dlq.rs",
    "docs/query.md",
    "docs/operations.md",
];

#[test]
fn the_local_preset_serves_the_readme_quickstart_query() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("tempdir");
    let corpus = dir.path().join("corpus");
    for file in FILES {
        let to = corpus.join(file);
        std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
        std::fs::copy(root.join(file), &to).expect("copy");
    }
    // The preset as it ships, on another port and directory; its relative index and DLQ paths
    // land in the job's working directory.
    let preset =
        std::fs::read_to_string(root.join("topologies/presets/local.toml")).expect("preset");
    let config = preset
        .replace("path = \".\"", &format!("path = \"{}\"", corpus.display()))
        .replace("listen = \"127.0.0.1:9464\"", "listen = \"{http}\"");
    assert_ne!(
        config, preset,
        "the preset's source path and listen address"
    );
    let mut job = Job::start(dir.path(), &config, 1);
    job.wait_ready(Duration::from_secs(120));
    // The README's request, as written there, once the three files are in.
    let body = r#"{"query_id":"q1","tenant":"local","text":"DLQ headers","token_budget":500}"#;
    job.wait_indexed(FILES.len());
    let (status, answer) = http_post_json(job.http_port, "/v1/query", body).expect("answered");
    let context = answer_context(status, &answer);
    let first = context
        .items
        .first()
        .unwrap_or_else(|| panic!("{context:?}"));
    assert!(
        first.source.ends_with("operators/core/src/ingest/dlq.rs"),
        "first: {} ({:?})",
        first.source,
        first.section_path
    );
    assert!(
        context.context.contains("DlqHeaders"),
        "{}",
        context.context
    );
    assert!(context.tokens_used <= 500, "{}", context.tokens_used);
    job.stop();
}
