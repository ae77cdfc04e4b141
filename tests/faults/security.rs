//! Secrets and access: the bearer tokens of `POST /v1/query` (one for every tenant, and tenant-bound ones),
//! and secrets (query tokens, Kafka SASL password) never in logs nor in `ragstream validate` output; a
//! secret written into the config file is refused.

use std::process::Command;
use std::time::Duration;

use super::common::job::{http_get, http_post_json_with, Job};
use super::common::JSONL_SERVING;
use super::support::two_tenant_runbooks;
use serde_json::json;

const TOKEN: &str = "tok-3f9c1d0e7b2a4c58";
/// A token bound to the tenant `acme`.
const ACME_TOKEN: &str = "tok-acme-5d27e90b13";
const PASSWORD: &str = "sasl-pw-91b7e2c4d6";

#[test]
fn bearer_token_guards_queries_and_secrets_stay_out_of_logs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let labelled = json!({"op": "upsert", "tenant": "acme", "doc_id": "escalation", "version": 1,
        "source": "acme/escalation.md", "kind": "markdown", "title": "Escalation", "acl": ["eng"],
        "text": "# Escalation\n\nTo roll back a failed release at night, page the on-call SRE with pagerctl."});
    std::fs::write(
        dir.path().join("events.jsonl"),
        format!("{}{labelled}\n", two_tenant_runbooks()),
    )
    .expect("events");
    let mut job = Job::start_with_env(
        dir.path(),
        &format!("{JSONL_SERVING}\n[http.tokens]\nRAGSTREAM_ACME_TOKEN = [\"acme\"]\n[http.token_labels]\nRAGSTREAM_ACME_TOKEN = [\"eng\"]\n"),
        1,
        &[
            ("RAGSTREAM_QUERY_TOKEN", TOKEN),
            ("RAGSTREAM_ACME_TOKEN", ACME_TOKEN),
            ("RAGSTREAM_KAFKA_SASL_PASSWORD", PASSWORD),
        ],
    );
    job.wait_ready(Duration::from_secs(120));
    job.wait_indexed(3);
    let body = json!({"query_id": "q1", "tenant": "acme", "text": "how to roll back"}).to_string();
    let post = |headers: &[(&str, &str)]| {
        http_post_json_with(job.http_port, "/v1/query", &body, headers).expect("answer")
    };
    let (status, answer) = post(&[]);
    assert_eq!(status, 401, "{answer}");
    let (status, _) = post(&[("Authorization", "Bearer wrong-token-0000000")]);
    assert_eq!(status, 401);
    let (status, _) = post(&[("Authorization", TOKEN)]);
    assert_eq!(status, 401, "the Bearer scheme is required");
    let bearer = format!("Bearer {TOKEN}");
    let (status, answer) = post(&[("Authorization", bearer.as_str())]);
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("deployctl rollback"), "{answer}");
    // A tenant-bound token opens its tenant and no other.
    let acme = format!("Bearer {ACME_TOKEN}");
    let (status, answer) = post(&[("Authorization", acme.as_str())]);
    assert_eq!(status, 200, "{answer}");
    let globex =
        json!({"query_id": "q2", "tenant": "globex", "text": "how to roll back"}).to_string();
    let globex_as = |bearer: &str| {
        http_post_json_with(
            job.http_port,
            "/v1/query",
            &globex,
            &[("Authorization", bearer)],
        )
        .expect("answer")
    };
    // The acme token's queries carry its label `eng`: the labelled page is found without naming it.
    let page = |acl: Option<serde_json::Value>, bearer: &str| {
        let mut body = json!({"query_id": "q3", "tenant": "acme", "text": "who to page at night with pagerctl", "fill": true});
        if let Some(acl) = acl {
            body["acl"] = acl;
        }
        http_post_json_with(
            job.http_port,
            "/v1/query",
            &body.to_string(),
            &[("Authorization", bearer)],
        )
        .expect("answer")
    };
    let (status, answer) = page(None, &acme);
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("pagerctl"), "{answer}");
    let (status, answer) = page(None, &bearer);
    assert_eq!(status, 200, "{answer}");
    assert!(
        !answer.contains("pagerctl"),
        "a query without acl sees public chunks only: {answer}"
    );
    // A request may narrow the token's labels, never widen them.
    let with_acl = |acl: serde_json::Value| page(Some(acl), &acme);
    let (status, answer) = with_acl(json!(["finance"]));
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("finance"), "{answer}");
    let (status, answer) = with_acl(json!([]));
    assert_eq!(status, 200, "{answer}");
    assert!(
        !answer.contains("pagerctl"),
        "narrowed to no label: {answer}"
    );
    let (status, answer) = globex_as(&acme);
    assert_eq!(status, 403, "{answer}");
    assert!(!answer.contains("shipit"), "{answer}");
    let (status, answer) = globex_as(&bearer);
    assert_eq!(status, 200, "the every-tenant token opens globex: {answer}");
    assert!(answer.contains("shipit"), "{answer}");
    // Metrics and health stay open (loopback only by default).
    assert_eq!(http_get(job.http_port, "/metrics").map(|r| r.0), Some(200));
    let log = job.log();
    job.stop();
    assert!(
        log.contains("missing or wrong bearer token"),
        "refusals are logged"
    );
    assert!(!log.contains(TOKEN), "token in the log");
    assert!(!log.contains(ACME_TOKEN), "token in the log");
    assert!(!log.contains(PASSWORD), "password in the log");

    // `validate` prints the configuration without the password it will use.
    let kafka = dir.path().join("kafka.toml");
    std::fs::write(
        &kafka,
        "[source]\nkind = \"kafka\"\n[kafka]\nbrokers = \"127.0.0.1:9\"\nsecurity_protocol = \"sasl_ssl\"\nsasl_mechanism = \"SCRAM-SHA-512\"\nsasl_username = \"ragstream\"\n",
    )
    .expect("config");
    let output = Command::new(env!("CARGO_BIN_EXE_ragstream"))
        .args(["validate", "--config"])
        .arg(&kafka)
        .env("RAGSTREAM_KAFKA_SASL_PASSWORD", PASSWORD)
        .env("RAGSTREAM_QUERY_TOKEN", TOKEN)
        .output()
        .expect("validate runs");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{printed}");
    assert!(printed.contains("SCRAM-SHA-512") && printed.contains("RAGSTREAM_KAFKA_SASL_PASSWORD"));
    assert!(
        !printed.contains(PASSWORD) && !printed.contains(TOKEN),
        "{printed}"
    );

    // A secret written into the file is refused, and the refusal does not echo it.
    std::fs::write(
        &kafka,
        format!("[source]\nkind = \"kafka\"\n[kafka]\nsasl_username = \"ragstream\"\nsasl_password = \"{PASSWORD}\"\n"),
    )
    .expect("config");
    let output = Command::new(env!("CARGO_BIN_EXE_ragstream"))
        .args(["validate", "--config"])
        .arg(&kafka)
        .output()
        .expect("validate runs");
    let printed = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(!output.status.success());
    assert!(printed.contains("sasl_password"), "{printed}");
    assert!(!printed.contains(PASSWORD), "{printed}");
    println!("FAULT security: POST /v1/query without/with wrong token → 401, with token → 200; a token bound to acme → 200 for acme, 403 for globex; its label eng carried into its queries, a wider label 403; tokens and SASL password absent from log and validate output; inline secret refused");
}
