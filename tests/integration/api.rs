//! The versioned HTTP API against its OpenAPI document: a running job serves the document it commits
//! (`docs/openapi.json`), the document passes a real validator (PyPI `openapi-spec-validator`), every
//! operation it lists is called, each answer's status is one the document lists for that operation,
//! and each JSON body validates (PyPI `jsonschema`) against the schema the document gives it. Both
//! packages come from `deploy/scripts/install/python-tools.sh`, which the test command runs.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::job::Job;
use serde_json::{json, Value};

const ADMIN: &str = "api-admin-5b1c09e2";
const ACME: &str = "api-acme-77d0a4f1";

/// The python of the test tools' environment.
pub fn tools_python() -> PathBuf {
    PathBuf::from(std::env::var_os("RAGSTREAM_PY_TOOLS").expect(
        "RAGSTREAM_PY_TOOLS unset: run deploy/scripts/install/python-tools.sh (the test command does)",
    ))
}

/// Validates `cases` (each `{schema, pointer, instance, what}`) and, when given, the OpenAPI document
/// at `openapi`, with `tests/integration/python/check_schemas.py`; panics with its report when any fails.
pub fn check_schemas(dir: &Path, openapi: Option<&Path>, cases: &[Value]) -> String {
    let job = dir.join("schema-cases.json");
    std::fs::write(
        &job,
        json!({"openapi": openapi, "cases": cases}).to_string(),
    )
    .expect("cases written");
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/python/check_schemas.py");
    let output = Command::new(tools_python())
        .arg(script)
        .arg(&job)
        .output()
        .expect("the schema checker runs");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "schema check failed:\n{report}");
    report
}

/// A case for [`check_schemas`]: `instance` against the committed topic schema `name`
/// (`docs/schemas/<name>.schema.json`), expected to pass or (`valid` false) to fail.
pub fn topic_case(name: &str, instance: Value, what: String, valid: bool) -> Value {
    let schema = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/schemas")
        .join(format!("{name}.schema.json"));
    json!({"schema": schema, "pointer": "", "instance": instance, "what": what, "valid": valid})
}

/// A message's headers as the object the DLQ headers schema describes.
pub fn headers_object(headers: &[(String, Vec<u8>)]) -> Value {
    Value::Object(
        headers
            .iter()
            .map(|(key, value)| (key.clone(), json!(String::from_utf8_lossy(value))))
            .collect(),
    )
}

/// One answer: status, media type (without parameters) and body.
struct Answer {
    status: u16,
    media: String,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("JSON body ({e}): {}", self.body))
    }

    /// The problem's name (`type` after `urn:ragstream:problem:`), checking the problem's shape.
    fn problem(&self) -> String {
        assert_eq!(self.media, "application/problem+json", "{}", self.body);
        let problem = self.json();
        assert_eq!(problem["status"].as_u64(), Some(u64::from(self.status)));
        assert!(problem["title"].is_string() && problem["detail"].is_string());
        problem["type"]
            .as_str()
            .and_then(|t| t.strip_prefix("urn:ragstream:problem:"))
            .unwrap_or_else(|| panic!("a problem type: {}", self.body))
            .to_string()
    }
}

/// A job serving `events` (written to its JSONL input) with `http` added to its `[http]` section and
/// `more` after the configuration, the admin and acme tokens set; started, ready and indexed.
fn serving_job(dir: &Path, events: &[String], http: &str, more: &str) -> Job {
    std::fs::write(dir.join("events.jsonl"), events.join("\n") + "\n").expect("events");
    let config = crate::common::JSONL_SERVING.replace(
        "[http]\n",
        &format!(
            "[http]\nquery_token_env = \"API_ADMIN_TOKEN\"\ntokens = {{ API_ACME_TOKEN = [\"acme\"] }}\n{http}"
        ),
    ) + more;
    let mut job = Job::start_with_env(
        dir,
        &config,
        1,
        &[("API_ADMIN_TOKEN", ADMIN), ("API_ACME_TOKEN", ACME)],
    );
    job.wait_ready(Duration::from_secs(120));
    job.wait_indexed(events.len());
    job
}

/// [`serving_job`] holding one document of acme's (`rollback`), in a directory of its own (the job
/// first: it stops before its directory goes).
fn rollback_job(http: &str, more: &str) -> (Job, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let events = [event(
        "acme",
        "rollback",
        "Rollback",
        "To roll back a release, run deployctl rollback.",
        json!({}),
    )];
    (serving_job(dir.path(), &events, http, more), dir)
}

/// `method path` on loopback over HTTP/1.0, with a bearer token and a JSON body when given.
fn send(port: u16, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> Answer {
    let mut request = format!("{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n");
    if let Some(token) = token {
        request.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    if let Some(body) = body {
        request.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ));
    } else {
        request.push_str("\r\n");
    }
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    stream.write_all(request.as_bytes()).expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    answer(&response)
}

/// The first event of `GET /v1/subscriptions/{id}/events` (the stream stays open: read until one
/// event is in).
fn first_event(port: u16, id: &str, token: &str) -> Answer {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    write!(
        stream,
        "GET /v1/subscriptions/{id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n"
    )
    .expect("request");
    let mut response = String::new();
    let mut buffer = [0u8; 16384];
    // The body is chunked: one event is in once a blank line follows its `event:` line.
    while !response
        .split_once("event: version")
        .is_some_and(|(_, rest)| rest.contains("\n\n"))
    {
        let n = stream.read(&mut buffer).expect("the stream goes on");
        assert!(n > 0, "the stream ended: {response}");
        response.push_str(&String::from_utf8_lossy(&buffer[..n]));
    }
    answer(&response)
}

/// An answer from the text of a response.
fn answer(response: &str) -> Answer {
    let (head, body) = response.split_once("\r\n\r\n").expect("a head");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    let media = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.split(';').next().unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    Answer {
        status,
        media,
        body: body.to_string(),
    }
}

/// A JSON pointer token.
fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

fn event(tenant: &str, doc_id: &str, title: &str, text: &str, metadata: Value) -> String {
    json!({"op": "upsert", "tenant": tenant, "doc_id": doc_id, "version": 1, "kind": "prose",
           "source": format!("{tenant}/{doc_id}.txt"), "title": title, "text": text, "metadata": metadata})
    .to_string()
}

#[test]
fn every_operation_of_the_openapi_document_answers_as_documented() {
    let dir = tempfile::tempdir().expect("tempdir");
    let events = [
        event("acme", "rollback", "Rollback", "To roll back a release, run deployctl rollback from the ops bastion. A rollback takes about four minutes.", json!({"team": "ops", "year": 2024})),
        event("acme", "office", "Office", "The Acme office is in Lisbon, near the river. Visitors sign in at the front desk.", json!({"team": "facilities", "year": 2022})),
        event("globex", "launch", "Launch", "Project zebra-quasar is the launch codename of Globex.", json!({})),
    ];
    let mut job = serving_job(dir.path(), &events, "", "");
    let port = job.http_port;

    // The served document is the committed one.
    let served = send(port, "GET", "/v1/openapi.json", None, None);
    assert_eq!(served.status, 200);
    let document = served.json();
    let committed: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json"))
            .expect("docs/openapi.json"),
    )
    .expect("committed JSON");
    assert_eq!(document, committed, "served and committed documents differ");

    // (path template, method, answer) of every call.
    let mut calls: Vec<(&str, &str, Answer)> = Vec::new();
    let query = |token: Option<&str>, body: &Value| {
        send(port, "POST", "/v1/query", token, Some(&body.to_string()))
    };

    for path in ["/healthz", "/readyz", "/metrics", "/v1/openapi.json"] {
        let answer = send(port, "GET", path, None, None);
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        calls.push((path, "get", answer));
    }

    // A query filtered on metadata, answered with the matching document only.
    let answer = query(
        Some(ADMIN),
        &json!({"query_id": "api-1", "tenant": "acme", "text": "how do I roll back a release",
                "filters": {"metadata": {"team": "ops", "year": {"gte": 2023}}}}),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let context = answer.json();
    let items = context["items"].as_array().expect("items").clone();
    assert!(!items.is_empty(), "{context}");
    assert!(items
        .iter()
        .all(|item| item["doc_id"] == "rollback" && item["metadata"]["team"] == "ops"));
    let chunk_id = items[0]["chunk_id"].as_str().expect("chunk id").to_string();
    calls.push(("/v1/query", "post", answer));
    // Problems: a wrong tenant for the token, no token, a bad field, no JSON, a wrong method.
    let answer = query(
        Some(ACME),
        &json!({"query_id": "api-2", "tenant": "globex", "text": "codename"}),
    );
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (403, "forbidden")
    );
    calls.push(("/v1/query", "post", answer));
    let answer = query(
        None,
        &json!({"query_id": "api-3", "tenant": "acme", "text": "rollback"}),
    );
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (401, "unauthorized")
    );
    calls.push(("/v1/query", "post", answer));
    let answer = query(
        Some(ADMIN),
        &json!({"query_id": "api-4", "tenant": "acme", "text": "x", "k": -1}),
    );
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (400, "invalid_query")
    );
    assert_eq!(
        answer.json()["query_id"],
        "api-4",
        "the problem names the query"
    );
    calls.push(("/v1/query", "post", answer));
    let answer = send(port, "POST", "/v1/query", Some(ADMIN), Some("{not json"));
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (400, "malformed_json")
    );
    calls.push(("/v1/query", "post", answer));
    let answer = send(port, "GET", "/v1/query", Some(ADMIN), None);
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (405, "method_not_allowed")
    );

    // Sources: the bound token's one tenant by default, paged.
    let answer = send(port, "GET", "/v1/sources", Some(ACME), None);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let page = answer.json();
    assert_eq!(page["tenant"], "acme");
    let ids: Vec<&str> = page["sources"]
        .as_array()
        .expect("sources")
        .iter()
        .filter_map(|s| s["doc_id"].as_str())
        .collect();
    assert_eq!(ids, ["office", "rollback"], "{page}");
    calls.push(("/v1/sources", "get", answer));
    let answer = send(
        port,
        "GET",
        "/v1/sources?tenant=acme&limit=1",
        Some(ADMIN),
        None,
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let first = answer.json();
    assert_eq!(first["sources"].as_array().map(Vec::len), Some(1));
    let cursor = first["next_cursor"]
        .as_str()
        .expect("a next page")
        .to_string();
    calls.push(("/v1/sources", "get", answer));
    let answer = send(
        port,
        "GET",
        &format!("/v1/sources?tenant=acme&limit=1&cursor={cursor}"),
        Some(ADMIN),
        None,
    );
    let second = answer.json();
    assert_eq!(second["sources"][0]["doc_id"], "rollback", "{second}");
    assert!(
        second.get("next_cursor").is_none(),
        "the last page: {second}"
    );
    calls.push(("/v1/sources", "get", answer));
    let answer = send(port, "GET", "/v1/sources", Some(ADMIN), None);
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (400, "bad_request"),
        "the every-tenant token names its tenant"
    );
    calls.push(("/v1/sources", "get", answer));
    let answer = send(port, "GET", "/v1/sources?tenant=globex", Some(ACME), None);
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (403, "forbidden")
    );
    calls.push(("/v1/sources", "get", answer));

    // A chunk, whole; an unknown one; one of a tenant the token does not open.
    let path = format!("/v1/chunks/{chunk_id}");
    let answer = send(port, "GET", &path, Some(ACME), None);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let chunk = answer.json();
    assert_eq!(chunk["chunk_id"], chunk_id.as_str());
    assert!(
        chunk["text"]
            .as_str()
            .is_some_and(|t| t.contains("deployctl rollback")),
        "{chunk}"
    );
    assert_eq!(chunk["metadata"]["year"], 2024);
    calls.push(("/v1/chunks/{chunk_id}", "get", answer));
    let answer = send(
        port,
        "GET",
        "/v1/chunks/00000000-0000-0000-0000-000000000000?tenant=acme",
        Some(ADMIN),
        None,
    );
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (404, "unknown_chunk")
    );
    calls.push(("/v1/chunks/{chunk_id}", "get", answer));
    let answer = send(
        port,
        "GET",
        &format!("{path}?tenant=globex"),
        Some(ADMIN),
        None,
    );
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (404, "unknown_chunk"),
        "another tenant's chunk is not found"
    );
    calls.push(("/v1/chunks/{chunk_id}", "get", answer));

    // Documents: a batch (local mode: answered once indexed), a refused one, a delete.
    let batch = json!({"documents": [{"doc_id": "harbour", "version": 1, "text": "The harbour opens at dawn."}]});
    let answer = send(
        port,
        "POST",
        "/v1/documents",
        Some(ACME),
        Some(&batch.to_string()),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.json(), json!({"accepted": 1, "indexed": true}));
    calls.push(("/v1/documents", "post", answer));
    let unversioned = json!({"documents": [{"doc_id": "harbour", "text": "no version"}]});
    let answer = send(
        port,
        "POST",
        "/v1/documents",
        Some(ACME),
        Some(&unversioned.to_string()),
    );
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (400, "missing_field")
    );
    calls.push(("/v1/documents", "post", answer));
    // Past its wait (0 s): 202 with the batch's status link, which reads `indexed` once it is.
    let later = json!({"documents": [{"doc_id": "pier", "version": 1, "text": "The pier closes at dusk."}]});
    let answer = send(
        port,
        "POST",
        "/v1/documents?wait=0",
        Some(ACME),
        Some(&later.to_string()),
    );
    assert_eq!(answer.status, 202, "{}", answer.body);
    let link = answer.json()["status"]
        .as_str()
        .expect("a status link")
        .to_string();
    assert!(link.starts_with("/v1/batches/"), "{link}");
    calls.push(("/v1/documents", "post", answer));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let answer = send(port, "GET", &link, Some(ACME), None);
        assert_eq!(answer.status, 200, "{}", answer.body);
        let state = answer.json()["state"].as_str().unwrap_or("").to_string();
        calls.push(("/v1/batches/{id}", "get", answer));
        if state == "indexed" {
            break;
        }
        assert_eq!(state, "queued");
        assert!(
            std::time::Instant::now() < deadline,
            "batch not indexed within 60 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for (path, status, name) in [
        ("/v1/batches/999999", 404, "not_found"),
        ("/v1/batches/x", 404, "not_found"),
    ] {
        let answer = send(port, "GET", path, Some(ACME), None);
        assert_eq!((answer.status, answer.problem().as_str()), (status, name));
        calls.push(("/v1/batches/{id}", "get", answer));
    }
    let answer = send(
        port,
        "POST",
        "/v1/documents?wait=soon",
        Some(ACME),
        Some(&later.to_string()),
    );
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (400, "bad_request")
    );
    calls.push(("/v1/documents", "post", answer));
    let answer = send(port, "DELETE", "/v1/documents/pier", Some(ACME), None);
    assert_eq!(answer.status, 200, "{}", answer.body);
    calls.push(("/v1/documents/{doc_id}", "delete", answer));
    let answer = send(port, "DELETE", "/v1/documents/harbour", Some(ACME), None);
    assert_eq!(answer.status, 200, "{}", answer.body);
    calls.push(("/v1/documents/{doc_id}", "delete", answer));
    let answer = send(
        port,
        "DELETE",
        "/v1/documents/harbour?tenant=globex",
        Some(ACME),
        None,
    );
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (403, "forbidden")
    );
    calls.push(("/v1/documents/{doc_id}", "delete", answer));

    // Invalidations.
    let answer = send(port, "GET", "/v1/invalidations?since=0", Some(ACME), None);
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(answer.json()["invalidations"].is_array());
    calls.push(("/v1/invalidations", "get", answer));
    let answer = send(
        port,
        "GET",
        "/v1/invalidations?since=soon",
        Some(ACME),
        None,
    );
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (400, "bad_request")
    );
    calls.push(("/v1/invalidations", "get", answer));

    // Operations: the index's counts, this process's cached contexts, clearing them by pattern.
    let answer = send(port, "GET", "/v1/stats/index", Some(ACME), None);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let stats = answer.json();
    assert_eq!(stats["tenant"], "acme");
    assert_eq!(
        (
            stats["stats"]["chunks"].as_u64(),
            stats["stats"]["shards"].as_u64()
        ),
        (Some(2), Some(1)),
        "rollback and office, one chunk each (harbour deleted): {stats}"
    );
    calls.push(("/v1/stats/index", "get", answer));
    let answer = send(
        port,
        "GET",
        "/v1/stats/index?tenant=globex",
        Some(ACME),
        None,
    );
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (403, "forbidden")
    );
    calls.push(("/v1/stats/index", "get", answer));
    let answer = send(port, "GET", "/v1/cache", Some(ACME), None);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let cached = answer.json();
    assert!(cached["entries"].as_u64() >= Some(1), "{cached}");
    calls.push(("/v1/cache", "get", answer));
    let answer = send(port, "GET", "/v1/cache?tenant=globex", Some(ACME), None);
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (403, "forbidden")
    );
    calls.push(("/v1/cache", "get", answer));
    let answer = send(port, "DELETE", "/v1/cache?pattern=*ROLL*", Some(ACME), None);
    assert_eq!(answer.status, 200, "{}", answer.body);
    let cleared = answer.json()["cleared"].as_u64().expect("cleared");
    assert!(
        cleared >= 1,
        "the roll-back question's context: {}",
        answer.body
    );
    calls.push(("/v1/cache", "delete", answer));
    let after = send(port, "GET", "/v1/cache", Some(ACME), None).json();
    assert_eq!(
        after["entries"].as_u64(),
        cached["entries"].as_u64().map(|n| n - cleared),
        "{after}"
    );
    let answer = send(
        port,
        "DELETE",
        "/v1/cache?pattern=%5Bunclosed",
        Some(ACME),
        None,
    );
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (400, "bad_request")
    );
    calls.push(("/v1/cache", "delete", answer));

    // force_reindex: nothing of acme's run yet; a run re-embeds both chunks in place; a bad pattern
    // and another tenant are refused.
    let answer = send(port, "GET", "/v1/reindex", Some(ACME), None);
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (404, "not_found")
    );
    calls.push(("/v1/reindex", "get", answer));
    let answer = send(port, "POST", "/v1/reindex", Some(ACME), None);
    assert_eq!(answer.status, 202, "{}", answer.body);
    assert_eq!(answer.json()["tenant"], "acme");
    calls.push(("/v1/reindex", "post", answer));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let ended = loop {
        let answer = send(port, "GET", "/v1/reindex", Some(ACME), None);
        assert_eq!(answer.status, 200, "{}", answer.body);
        if answer.json()["running"] == false {
            break answer;
        }
        assert!(std::time::Instant::now() < deadline, "{}", answer.body);
        std::thread::sleep(Duration::from_millis(100));
    };
    let run = ended.json();
    assert_eq!(
        (
            run["documents"].as_u64(),
            run["chunks"].as_u64(),
            run["rewritten"].as_u64(),
            run["skipped"].as_u64()
        ),
        (Some(2), Some(2), Some(2), Some(0)),
        "{run}"
    );
    assert!(run.get("error").is_none(), "{run}");
    calls.push(("/v1/reindex", "get", ended));
    let answer = send(
        port,
        "POST",
        "/v1/reindex?source_pattern=%5Bunclosed",
        Some(ACME),
        None,
    );
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (400, "bad_request")
    );
    calls.push(("/v1/reindex", "post", answer));
    let answer = send(port, "POST", "/v1/reindex?tenant=globex", Some(ACME), None);
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (403, "forbidden")
    );
    calls.push(("/v1/reindex", "post", answer));
    // The index answers as before: the same chunk first for the same question.
    let answer = send(
        port,
        "POST",
        "/v1/query",
        Some(ACME),
        Some(r#"{"query_id":"after-reindex","text":"how do I roll back a release"}"#),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert!(
        answer.json()["context"]
            .as_str()
            .is_some_and(|c| c.to_lowercase().contains("roll")),
        "{}",
        answer.body
    );

    // Standing queries: a refusal, a subscription, its latest version, its event stream, its end.
    let subscribe = |body: Value| {
        send(
            port,
            "POST",
            "/v1/subscriptions",
            Some(ACME),
            Some(&body.to_string()),
        )
    };
    let answer =
        subscribe(json!({"query": {"text": "how do I roll back a release"}, "ttl_secs": 0}));
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (400, "bad_request")
    );
    calls.push(("/v1/subscriptions", "post", answer));
    let answer = subscribe(json!({"query": {"text": "how do I roll back a release"}}));
    assert_eq!(answer.status, 201, "{}", answer.body);
    let version = answer.json();
    assert_eq!(
        (&version["version"], &version["context"]["tenant"]),
        (&json!(1), &json!("acme")),
        "the token's tenant: {version}"
    );
    let id = version["subscription_id"]
        .as_str()
        .expect("an id")
        .to_string();
    calls.push(("/v1/subscriptions", "post", answer));
    let path = format!("/v1/subscriptions/{id}");
    let answer = send(port, "GET", &path, Some(ACME), None);
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.json()["latest"]["version"], 1);
    calls.push(("/v1/subscriptions/{id}", "get", answer));
    let answer = send(port, "GET", &path, None, None);
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (401, "unauthorized")
    );
    calls.push(("/v1/subscriptions/{id}", "get", answer));
    let answer = first_event(port, &id, ACME);
    assert_eq!(answer.status, 200);
    assert!(
        answer.body.contains("id: 1\nevent: version\ndata: {"),
        "{}",
        answer.body
    );
    calls.push(("/v1/subscriptions/{id}/events", "get", answer));
    let answer = send(port, "DELETE", &path, Some(ACME), None);
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.json()["ended"], true);
    calls.push(("/v1/subscriptions/{id}", "delete", answer));
    let answer = send(port, "DELETE", &path, Some(ACME), None);
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (404, "not_found")
    );
    calls.push(("/v1/subscriptions/{id}", "delete", answer));
    let answer = send(port, "GET", &format!("{path}/events"), Some(ACME), None);
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (404, "not_found")
    );
    calls.push(("/v1/subscriptions/{id}/events", "get", answer));

    // No such route: a problem too.
    let answer = send(port, "GET", "/query", Some(ADMIN), None);
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (404, "not_found"),
        "the unversioned routes are gone"
    );

    // Every operation of the document was called, each answer is documented, each body validates.
    let mut operations: BTreeSet<(String, String)> = BTreeSet::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            operations.insert((path.clone(), method.clone()));
        }
    }
    let called: BTreeSet<(String, String)> = calls
        .iter()
        .map(|(path, method, _)| (path.to_string(), method.to_string()))
        .collect();
    assert_eq!(
        called, operations,
        "every operation of the document is called, and only those"
    );
    let mut cases = Vec::new();
    let mut statuses: BTreeMap<String, BTreeSet<u16>> = BTreeMap::new();
    let openapi = dir.path().join("openapi.json");
    std::fs::write(&openapi, served.body.as_bytes()).expect("document written");
    for (path, method, answer) in &calls {
        let responses = &document["paths"][path][method]["responses"];
        let status = answer.status.to_string();
        let media = &responses[&status]["content"][&answer.media];
        assert!(
            media.is_object(),
            "{method} {path}: {status} {} is not documented",
            answer.media
        );
        statuses
            .entry(format!("{method} {path}"))
            .or_default()
            .insert(answer.status);
        if answer.media.contains("json") {
            cases.push(json!({
                "schema": openapi,
                "pointer": format!("/paths/{}/{method}/responses/{status}/content/{}/schema", escape(path), escape(&answer.media)),
                "instance": answer.json(),
                "what": format!("{method} {path} → {status}"),
            }));
        }
    }
    // The JSONL source's events and the file DLQ's records against their topic schemas.
    for line in &events {
        let event: Value = serde_json::from_str(line).expect("event");
        cases.push(topic_case(
            "document-event",
            event,
            "a JSONL event".into(),
            true,
        ));
    }
    let dlq = std::fs::read_to_string(dir.path().join("dlq.jsonl")).expect("the DLQ file");
    let records: Vec<Value> = dlq
        .lines()
        .map(|line| serde_json::from_str(line).expect("a DLQ line"))
        .collect();
    assert_eq!(
        records.len(),
        2,
        "the invalid and the malformed query: {dlq}"
    );
    for record in records {
        let what = format!("DLQ line {}", record["reason"]);
        cases.push(topic_case("dlq-line", record, what, true));
    }
    let report = check_schemas(dir.path(), Some(&openapi), &cases);
    println!("API: {} calls over {} operations, statuses {statuses:?}; {} JSON bodies validated\n{report}", calls.len(), operations.len(), cases.len());
    job.stop();
}

#[test]
fn a_credential_over_its_rate_is_answered_429_and_the_others_are_not() {
    let (job, _dir) = rollback_job("token_requests_per_second = 0.5\ntoken_burst = 3\n", "");
    let port = job.http_port;
    let sources = |token| send(port, "GET", "/v1/sources", Some(token), None);
    // The burst, then 429 with Retry-After (one request every 2 s).
    for _ in 0..3 {
        assert_eq!(sources(ACME).status, 200);
    }
    let refused = sources(ACME);
    assert_eq!(
        (refused.status, refused.problem().as_str()),
        (429, "rate_limited")
    );
    assert!(refused.body.contains("API_ACME_TOKEN"), "{}", refused.body);
    assert!(
        !refused.body.contains(ACME),
        "the token itself is never shown"
    );
    let retry = raw_head(port, "/v1/sources", ACME);
    assert!(
        retry.contains("Retry-After: 2") || retry.contains("retry-after: 2"),
        "{retry}"
    );
    // The MCP endpoint counts against the same credential.
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let mcp = send(
        port,
        "POST",
        "/mcp",
        Some(ACME),
        Some(&initialize.to_string()),
    );
    assert_eq!((mcp.status, mcp.problem().as_str()), (429, "rate_limited"));
    // Another credential is served meanwhile; health is never counted.
    let admin = send(port, "GET", "/v1/sources?tenant=acme", Some(ADMIN), None);
    assert_eq!(admin.status, 200, "{}", admin.body);
    assert_eq!(send(port, "GET", "/healthz", None, None).status, 200);
    // Once its rate allows, the credential is served again.
    std::thread::sleep(Duration::from_millis(2100));
    assert_eq!(sources(ACME).status, 200);
    let metrics = send(port, "GET", "/metrics", None, None).body;
    let limited = metrics
        .lines()
        .find_map(|line| line.strip_prefix("ragstream_http_rate_limited_total "))
        .and_then(|value| value.trim().parse::<f64>().ok());
    assert_eq!(limited, Some(3.0), "the three refusals are counted");
}

/// The head of a `GET path` with `token`.
fn raw_head(port: u16, path: &str, token: &str) -> String {
    let request =
        format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n");
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.write_all(request.as_bytes()).expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    response.split("\r\n\r\n").next().unwrap_or("").to_string()
}

#[test]
fn a_tenant_past_its_quotas_is_refused_and_keeps_what_it_holds() {
    let (job, dir) = rollback_job(
        "",
        "[ingest.quotas]\nmax_documents = 3\nmax_bytes = 4000\nmax_chunks_per_document = 4\n",
    );
    let port = job.http_port;
    let post = |documents: Value| {
        send(
            port,
            "POST",
            "/v1/documents",
            Some(ADMIN),
            Some(&json!({ "documents": documents }).to_string()),
        )
    };
    let doc = |id: &str, version: u64, text: &str| json!({"tenant": "acme", "doc_id": id, "version": version, "text": text});
    // Two more documents: three, the quota.
    let answer = post(json!([
        doc("office", 1, "The office is in Lisbon."),
        doc("ferry", 1, "The ferry leaves at noon.")
    ]));
    assert_eq!(answer.status, 200, "{}", answer.body);
    // A fourth: 403, nothing of the batch written.
    let answer = post(json!([
        doc("ferry", 2, "The ferry leaves at one."),
        doc("pier", 1, "The pier closes at dusk.")
    ]));
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (403, "quota_exceeded"),
        "{}",
        answer.body
    );
    assert!(
        answer.body.contains("document 1") && answer.body.contains("max_documents"),
        "{}",
        answer.body
    );
    // A document that could never fit the bytes quota: 413.
    let answer = post(json!([doc("ferry", 3, &"x".repeat(5000))]));
    assert_eq!(
        (answer.status, answer.problem().as_str()),
        (413, "quota_exceeded"),
        "{}",
        answer.body
    );
    // A delete makes room, in the same batch.
    let answer = post(json!([
        {"tenant": "acme", "doc_id": "office", "op": "delete"},
        doc("pier", 1, "The pier closes at dusk.")
    ]));
    assert_eq!(answer.status, 200, "{}", answer.body);
    // Chunks are known once chunked: a version of many sections is dead-lettered with its value,
    // and the version the index holds stays.
    let sections: String = (0..8)
        .map(|n| format!("# Part {n}\n\nThe ferry timetable part {n} lists the crossings.\n\n"))
        .collect();
    let answer = post(
        json!([{"tenant": "acme", "doc_id": "ferry", "version": 4, "kind": "markdown", "text": sections}]),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    let sources = send(port, "GET", "/v1/sources?tenant=acme", Some(ADMIN), None).json();
    let ids: Vec<&str> = sources["sources"]
        .as_array()
        .expect("sources")
        .iter()
        .filter_map(|s| s["doc_id"].as_str())
        .collect();
    assert_eq!(ids, ["ferry", "pier", "rollback"], "{sources}");
    let context = send(
        port,
        "POST",
        "/v1/query",
        Some(ADMIN),
        Some(&json!({"query_id": "quota-1", "tenant": "acme", "text": "when does the ferry leave", "mode": "deep", "k": 1}).to_string()),
    )
    .json();
    assert!(
        context["items"][0]["text"]
            .as_str()
            .unwrap_or("")
            .contains("noon"),
        "{context}"
    );
    let dlq = std::fs::read_to_string(dir.path().join("dlq.jsonl")).unwrap_or_default();
    let record = dlq
        .lines()
        .find(|line| line.contains("quota_exceeded"))
        .unwrap_or_else(|| panic!("a quota_exceeded record: {dlq}"));
    assert!(
        record.contains("max_chunks_per_document") && record.contains("Part 0"),
        "{record}"
    );
    let metrics = send(port, "GET", "/metrics", None, None).body;
    assert!(
        metrics.contains("ragstream_tenant_documents{tenant=\"acme\"} 3"),
        "per-tenant gauge"
    );
    assert!(metrics.contains("ragstream_quota_refusals_total{limit=\"chunks_per_document\"} 1"));
}
