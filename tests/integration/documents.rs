//! Documents in over HTTP and from the command line: `POST /v1/documents` and
//! `DELETE /v1/documents/{doc_id}` in local mode (answered once indexed) and in Kafka mode (answered
//! once on the documents topic, then indexed from it), a batch with a refused document (nothing of it
//! written), the version guard, and `ragstream ingest` of a directory, of JSONL on standard input and
//! straight to the topic.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::broker::Broker;
use crate::common::job::{http_get, http_post_json_with, metric, Job};
use serde_json::{json, Value};

const ADMIN: &str = "docs-admin-0c4e7a21";
const ACME: &str = "docs-acme-5d2b9f60";

fn post(port: u16, token: &str, body: &Value) -> (u16, Value) {
    crate::common::job::post_documents(port, token, body)
}

/// `DELETE path` with the token; (status, body).
fn delete(port: u16, token: &str, path: &str) -> (u16, Value) {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let request = format!(
        "DELETE {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// The doc ids of a tenant, read with `GET /v1/sources` (the every-tenant token).
fn doc_ids(port: u16, tenant: &str) -> Vec<String> {
    let auth = format!("Bearer {ADMIN}");
    let (status, body) = crate::common::job::http_get_with(
        port,
        &format!("/v1/sources?tenant={tenant}"),
        &[("Authorization", &auth)],
    )
    .expect("answered");
    assert_eq!(status, 200, "{body}");
    let page: Value = serde_json::from_str(&body).expect("page");
    page["sources"]
        .as_array()
        .expect("sources")
        .iter()
        .filter_map(|s| s["doc_id"].as_str().map(str::to_string))
        .collect()
}

/// The text of the top item of a deep query for `text`.
fn top_text(port: u16, tenant: &str, text: &str) -> String {
    let auth = format!("Bearer {ADMIN}");
    let body = json!({"query_id": format!("q-{text}"), "tenant": tenant, "text": text, "mode": "deep", "k": 1});
    let (status, answer) = http_post_json_with(
        port,
        "/v1/query",
        &body.to_string(),
        &[("Authorization", &auth)],
    )
    .expect("answered");
    assert_eq!(status, 200, "{answer}");
    let context: Value = serde_json::from_str(&answer).expect("context");
    context["items"][0]["text"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

fn tokens(config: &str) -> String {
    config.replace(
        "[http]\n",
        "[http]\nquery_token_env = \"DOCS_ADMIN_TOKEN\"\ntokens = { DOCS_ACME_TOKEN = [\"acme\"] }\n",
    )
}

const TOKENS: [(&str, &str); 2] = [("DOCS_ADMIN_TOKEN", ADMIN), ("DOCS_ACME_TOKEN", ACME)];

/// `ragstream ingest` with `args`, `stdin` on its standard input; (exit status, stdout, stderr).
fn ingest(args: &[&str], stdin: &str, token: &str) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ragstream"))
        .arg("ingest")
        .args(args)
        .env("RAGSTREAM_QUERY_TOKEN", token)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ragstream ingest runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("stdin written");
    let output = child.wait_with_output().expect("ingest ends");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn documents_posted_in_local_mode_are_indexed_before_the_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seed = json!({"tenant": "acme", "doc_id": "seed", "version": 1, "kind": "prose",
                      "text": "The seed document talks about lighthouses on the northern coast."});
    std::fs::write(dir.path().join("events.jsonl"), format!("{seed}\n")).expect("events");
    let mut job = Job::start_with_env(
        dir.path(),
        &tokens(crate::common::JSONL_SERVING),
        1,
        &TOKENS,
    );
    job.wait_ready(Duration::from_secs(120));
    job.wait_indexed(1);
    let port = job.http_port;

    // Two upserts, the tenant from the token; searchable as soon as the answer came.
    let batch = json!({"documents": [
        {"doc_id": "rollback.md", "version": 1, "kind": "markdown", "title": "Rollback",
         "text": "# Rollback\n\nRun deployctl rollback from the ops bastion to roll back a release.",
         "metadata": {"team": "ops"}},
        {"doc_id": "office.txt", "version": 1, "text": "The Acme office is in Lisbon, near the river."},
    ]});
    let started = Instant::now();
    let (status, answer) = post(port, ACME, &batch);
    let took = started.elapsed();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer, json!({"accepted": 2, "indexed": true}));
    assert_eq!(doc_ids(port, "acme"), ["office.txt", "rollback.md", "seed"]);
    assert!(top_text(port, "acme", "how to roll back a release").contains("deployctl rollback"));
    println!(
        "DOCUMENTS local: 2 documents posted and indexed in {:.0} ms",
        took.as_secs_f64() * 1000.0
    );

    // A batch with a refused document: 400 naming it, and nothing of the batch written.
    let mixed = json!({"documents": [
        {"doc_id": "good.txt", "version": 1, "text": "A good document about tides."},
        {"doc_id": "bad.txt", "version": 1, "text": "x", "kind": "poetry"},
    ]});
    let (status, problem) = post(port, ACME, &mixed);
    assert_eq!(status, 400, "{problem}");
    assert_eq!(problem["type"], "urn:ragstream:problem:unknown_kind");
    assert_eq!(problem["errors"][0]["index"], 1);
    assert!(!doc_ids(port, "acme").contains(&"good.txt".to_string()));

    // Another tenant than the token's: 403; the version guard: an older version changes nothing.
    let globex =
        json!({"documents": [{"tenant": "globex", "doc_id": "x", "version": 1, "text": "x"}]});
    assert_eq!(post(port, ACME, &globex).0, 403);
    let newer = json!({"documents": [{"doc_id": "office.txt", "version": 3, "text": "The Acme office moved to Porto, by the bridge."}]});
    assert_eq!(post(port, ACME, &newer).0, 200);
    let older = json!({"documents": [{"doc_id": "office.txt", "version": 2, "text": "The Acme office is in Faro."}]});
    assert_eq!(post(port, ACME, &older).0, 200);
    let office = top_text(port, "acme", "where is the Acme office");
    assert!(
        office.contains("Porto") && !office.contains("Faro"),
        "{office}"
    );

    // A delete, by path; then the document is gone.
    let (status, answer) = delete(port, ACME, "/v1/documents/rollback.md");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(doc_ids(port, "acme"), ["office.txt", "seed"]);

    // `ragstream ingest` of a directory (a binary file skipped), then of JSONL on standard input with
    // a malformed line: exit 1, the rest accepted.
    let files = tempfile::tempdir().expect("files");
    std::fs::create_dir_all(files.path().join("guides")).expect("dir");
    std::fs::write(
        files.path().join("guides/deploy.md"),
        "# Deploy\n\nDeploys go out every Tuesday.\n",
    )
    .expect("file");
    std::fs::write(
        files.path().join("notes.txt"),
        "Notes about the quarterly planning meeting.\n",
    )
    .expect("file");
    std::fs::write(files.path().join("image.bin"), [0u8, 159, 146, 150]).expect("file");
    let url = format!("http://127.0.0.1:{port}");
    let root = files.path().to_str().expect("path");
    let (code, out, err) = ingest(&["--url", &url, root], "", ACME);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("2 of 2 documents accepted"), "{out}");
    let ids = doc_ids(port, "acme");
    assert!(
        ids.contains(&"guides/deploy.md".to_string()) && ids.contains(&"notes.txt".to_string()),
        "{ids:?}"
    );
    let lines = format!(
        "{}\nnot json\n{}\n",
        json!({"doc_id": "a.txt", "version": 1, "text": "Alpha text about glaciers."}),
        json!({"doc_id": "b.txt", "version": 1, "text": "Beta text about deserts.", "kind": "sonnet"}),
    );
    let (code, out, err) = ingest(&["--url", &url, "-"], &lines, ACME);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        out.contains("1 of 3 documents accepted, 2 refused"),
        "{out}"
    );
    assert!(
        err.contains("malformed_json") && err.contains("unknown_kind"),
        "{err}"
    );
    assert!(doc_ids(port, "acme").contains(&"a.txt".to_string()));
    // The job unreachable: exit 2.
    let (code, _, err) = ingest(&["--url", "http://127.0.0.1:9", root], "", ACME);
    assert_eq!(code, 2, "{err}");
    assert_eq!(http_get(port, "/healthz").map(|r| r.0), Some(200));
    job.stop();
}

#[test]
fn documents_posted_in_kafka_mode_go_through_the_topic() {
    const DOCS: &str = "posted-docs";
    let broker = Broker::start();
    broker.create_topic(DOCS, 2);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = tokens(&crate::common::kafka_config(
        &broker.bootstrap(),
        &format!("documents_topic = \"{DOCS}\"\ngroup_id = \"posted-it\""),
        "",
    ));
    let mut job = Job::start_with_env(dir.path(), &config, 1, &TOKENS);
    job.wait_ready(Duration::from_secs(120));
    let port = job.http_port;
    let batch = json!({"documents": [
        {"doc_id": "tides.txt", "version": 1, "text": "Tides rise twice a day on the Atlantic coast."},
        {"doc_id": "dunes.txt", "version": 1, "text": "Dunes move with the wind across the desert."},
        {"doc_id": "reefs.html", "version": 1, "text": "<html><title>Reefs</title><script>x()</script><h1>Reefs</h1><p>Coral reefs grow in warm shallow seas.</p></html>"},
    ]});
    let (status, answer) = post(port, ACME, &batch);
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer, json!({"accepted": 3, "indexed": false}));
    // On the topic, keyed tenant/doc_id, in the topic's schema; the HTML page as its extracted text.
    let messages = broker.read_all(DOCS, 3);
    let reefs: Value = messages
        .iter()
        .filter(|(key, _, _)| key.as_deref() == Some(b"acme/reefs.html".as_slice()))
        .map(|(_, value, _)| {
            serde_json::from_slice(value.as_deref().expect("value")).expect("JSON")
        })
        .next()
        .expect("the HTML page on the topic");
    assert_eq!(
        (
            &reefs["kind"],
            &reefs["extracted"],
            &reefs["title"],
            &reefs["text"]
        ),
        (
            &json!("html"),
            &json!(true),
            &json!("Reefs"),
            &json!("# Reefs\n\nCoral reefs grow in warm shallow seas.\n")
        ),
        "{reefs}"
    );
    let mut keys: Vec<String> = messages
        .iter()
        .map(|(key, _, _)| String::from_utf8_lossy(key.as_deref().unwrap_or_default()).into_owned())
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        ["acme/dunes.txt", "acme/reefs.html", "acme/tides.txt"]
    );
    let cases: Vec<Value> = messages
        .iter()
        .map(|(_, value, _)| {
            let event: Value =
                serde_json::from_slice(value.as_deref().expect("value")).expect("JSON");
            crate::api::topic_case("document-event", event, "a posted event".into(), true)
        })
        .collect();
    crate::api::check_schemas(dir.path(), None, &cases);
    job.wait_for(Duration::from_secs(120), "posted documents indexed", |m| {
        metric(m, "ragstream_source_events_total") >= 3.0
            && metric(m, "ragstream_in_flight_messages") == 0.0
    });
    assert!(top_text(port, "acme", "when do tides rise").contains("twice a day"));
    assert!(top_text(port, "acme", "where do coral reefs grow").contains("warm shallow seas"));
    // `ragstream ingest` straight to the topic.
    let lines = format!(
        "{}\n",
        json!({"tenant": "acme", "doc_id": "caves.txt", "version": 1, "text": "Caves form where water dissolves limestone."})
    );
    let (code, out, err) = ingest(
        &["--brokers", &broker.bootstrap(), "--topic", DOCS, "-"],
        &lines,
        "",
    );
    assert_eq!(code, 0, "{out}\n{err}");
    job.wait_for(Duration::from_secs(120), "ingested document indexed", |m| {
        metric(m, "ragstream_source_events_total") >= 4.0
            && metric(m, "ragstream_in_flight_messages") == 0.0
    });
    assert!(doc_ids(port, "acme").contains(&"caves.txt".to_string()));
    // A document over librdkafka's default message size (1 MB) but within ingest.max_document_bytes
    // is taken by the broker: the documents producer is sized by the document limit.
    let large = "Tides rise twice a day. ".repeat(50_000);
    let batch = json!({"documents": [{"doc_id": "large.txt", "version": 1, "text": large}]});
    let (status, answer) = post(port, ACME, &batch);
    assert_eq!(status, 202, "{answer}");
    let on_topic = broker.read_all(DOCS, 5);
    assert!(
        on_topic
            .iter()
            .any(|(_, value, _)| value.as_ref().is_some_and(|v| v.len() > 1_200_000)),
        "the large event on the topic"
    );
    job.stop();
}
