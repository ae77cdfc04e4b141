//! The Python client (`clients/python`) and its LangChain and LlamaIndex retrievers against a running
//! job: its unittest suite, run with the real PyPI packages (`langchain-core`, `llama-index-core`,
//! pinned in `deploy/scripts/install/python-tools.sh`, which the test command runs).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::job::Job;
use serde_json::{json, Value};

const ADMIN: &str = "py-admin-3f9a0c17";
const ACME: &str = "py-acme-b84e21d5";

fn event(tenant: &str, doc_id: &str, text: &str, metadata: Value) -> String {
    json!({"op": "upsert", "tenant": tenant, "doc_id": doc_id, "version": 1, "kind": "markdown",
           "source": format!("{tenant}/{doc_id}.md"), "title": doc_id, "text": text, "metadata": metadata})
    .to_string()
}

#[test]
fn the_python_client_and_its_retrievers_pass_their_suite_against_the_job() {
    let dir = tempfile::tempdir().expect("tempdir");
    let events = [
        event("acme", "rollback", "# Rollback\n\nTo roll back a release, run `deployctl rollback --to <version>` from the ops bastion. A rollback takes about four minutes and pages the on-call engineer.\n", json!({"team": "ops", "year": 2024})),
        event("acme", "office", "# Office\n\nThe Acme office is in Lisbon, near the river. Visitors sign in at the front desk; a release party is held there every quarter.\n", json!({"team": "facilities", "year": 2022})),
        event("globex", "launch", "# Launch\n\nProject zebra-quasar is the launch codename of Globex. To roll back at Globex, call the launch desk.\n", json!({})),
    ];
    std::fs::write(dir.path().join("events.jsonl"), events.join("\n") + "\n").expect("events");
    let config = crate::common::JSONL_SERVING.replace(
        "[http]\n",
        "[http]\nquery_token_env = \"PY_ADMIN_TOKEN\"\ntokens = { PY_ACME_TOKEN = [\"acme\"] }\n",
    );
    let mut job = Job::start_with_env(
        dir.path(),
        &config,
        1,
        &[("PY_ADMIN_TOKEN", ADMIN), ("PY_ACME_TOKEN", ACME)],
    );
    job.wait_ready(Duration::from_secs(120));
    job.wait_indexed(events.len());
    let pdf = dir.path().join("tides.pdf");
    std::fs::write(
        &pdf,
        ragstream_core::testing::pdf_file(&[
            "Harbour notes\n\nThe harbour master keeps the keys of the boat sheds.",
            "Tide table\n\nHigh tide at the pier is at 14:20 today and 02:45 tonight.",
            "Parking\n\nCars park behind the fish market after six.",
        ]),
    )
    .expect("pdf");
    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/python");
    let output = Command::new(crate::api::tools_python())
        .arg(client.join("tests/test_client.py"))
        .env("PYTHONPATH", client.join("src"))
        .env(
            "RAGSTREAM_URL",
            format!("http://127.0.0.1:{}", job.http_port),
        )
        .env("RAGSTREAM_TEST_ADMIN_TOKEN", ADMIN)
        .env("RAGSTREAM_TEST_ACME_TOKEN", ACME)
        .env("RAGSTREAM_TEST_PDF", &pdf)
        .env_remove("RAGSTREAM_QUERY_TOKEN")
        .output()
        .expect("python runs");
    let report = String::from_utf8_lossy(&output.stderr);
    println!("Python client suite:\n{report}");
    assert!(
        output.status.success(),
        "the Python client's suite failed:\n{report}\n{}",
        job.log()
    );
    assert!(report.contains("OK"), "{report}");
    job.stop();
}
