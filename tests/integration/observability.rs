//! Observability against a real Prometheus (Debian package `prometheus`, made available by
//! `deploy/scripts/install/prometheus.sh`, which the test command runs).
//!
//! The project's scrape config (`deploy/prometheus/prometheus.yml`, with its alert rules) is pointed
//! at a running job on loopback; the job ingests documents and answers queries through a real
//! Kafka-protocol broker (Tansu); then every panel expression of every dashboard in `dashboards/` is
//! evaluated through Prometheus's HTTP API and must return data. `promtool check config` and
//! `promtool check rules` must pass, every metric the dashboards and alert rules name must be in the
//! job's `/metrics`, and no metric may carry an unbounded label.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::broker::{free_port, Broker};
use crate::common::job::{http_get, http_post_json, metric, Job};
use serde_json::{json, Value};

const DOCS: &str = "docs";
const QUERIES: &str = "queries";
const CONTEXTS: &str = "contexts";
const DLQ: &str = "dlq";
/// What `$__rate_interval` stands for when the test evaluates panel expressions.
const RATE_WINDOW: &str = "1m";
/// Label names a ragstream metric may carry: each has a small, fixed set of values (`tenant`: the
/// first 64 tenants holding documents, the job labels no more).
const BOUNDED_LABELS: [&str; 19] = [
    "op",
    "dependency",
    "outcome",
    "reason",
    "partition",
    "mode",
    "intent",
    "rule",
    "stage",
    "lane",
    "tier",
    "result",
    "sink",
    "component",
    "version",
    "operator",
    "limit",
    "tenant",
    "le",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The directory holding `prometheus` and `promtool`.
fn prometheus_bin() -> PathBuf {
    if let Some(dir) = std::env::var_os("RAGSTREAM_PROMETHEUS_BIN") {
        return PathBuf::from(dir);
    }
    let output = Command::new(repo().join("deploy/scripts/install/prometheus.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("running install/prometheus.sh");
    assert!(output.status.success(), "install/prometheus.sh failed");
    PathBuf::from(String::from_utf8(output.stdout).expect("utf-8").trim())
}

fn promtool(bin: &Path, args: &[&str]) {
    let output = Command::new(bin.join("promtool"))
        .args(args)
        .output()
        .expect("running promtool");
    assert!(
        output.status.success(),
        "promtool {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A Prometheus server on loopback, killed on drop.
struct Prometheus {
    child: Child,
    port: u16,
}

impl Prometheus {
    /// Starts Prometheus with the project's config and rules, scraping `target` every second.
    fn start(bin: &Path, dir: &Path, target: &str) -> Self {
        let config = std::fs::read_to_string(repo().join("deploy/prometheus/prometheus.yml"))
            .expect("prometheus.yml");
        assert!(
            config.contains("127.0.0.1:9464"),
            "the scrape config targets the job's default address"
        );
        let config = config
            .replace("127.0.0.1:9464", target)
            .replace("scrape_interval: 15s", "scrape_interval: 1s")
            .replace("evaluation_interval: 15s", "evaluation_interval: 1s");
        std::fs::write(dir.join("prometheus.yml"), config).expect("config");
        std::fs::copy(
            repo().join("deploy/prometheus/alerts.yml"),
            dir.join("alerts.yml"),
        )
        .expect("alerts.yml");
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("log");
        let child = Command::new(bin.join("prometheus"))
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting prometheus");
        let prometheus = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !matches!(http_get(port, "/-/ready"), Some((200, _))) {
            assert!(
                Instant::now() < deadline,
                "prometheus not ready; log:\n{}",
                std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        prometheus
    }

    /// Evaluates `expr` now; returns the result vector.
    fn query(&self, expr: &str) -> Vec<Value> {
        let (status, body) = get(
            self.port,
            &format!("/api/v1/query?query={}", url_encode(expr)),
        );
        let value: Value = serde_json::from_str(&body).expect("prometheus JSON");
        assert_eq!(status, 200, "{expr}: {body}");
        assert_eq!(value["status"], "success", "{expr}: {body}");
        value["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// GET `path` from a local server; panics when it does not answer.
fn get(port: u16, path: &str) -> (u16, String) {
    http_get(port, path).unwrap_or_else(|| panic!("no answer from 127.0.0.1:{port}{path}"))
}

fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `(dashboard, panel title, expression)` of every panel target of every dashboard.
fn panel_expressions() -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("dashboards"))
        .expect("dashboards/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "one dashboard per role: {files:?}");
    for file in files {
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        let dashboard: Value =
            serde_json::from_str(&std::fs::read_to_string(&file).expect("read")).expect("JSON");
        let variables: Vec<&str> = dashboard["templating"]["list"]
            .as_array()
            .expect("templating")
            .iter()
            .filter_map(|v| v["name"].as_str())
            .collect();
        assert!(
            variables.contains(&"datasource"),
            "{name}: datasource variable"
        );
        let mut panels = 0;
        for panel in dashboard["panels"].as_array().expect("panels") {
            if panel["type"] == "row" {
                continue;
            }
            panels += 1;
            let title = panel["title"].as_str().expect("title").to_string();
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "{name}/{title}: panel datasource is the variable"
            );
            assert!(
                panel["fieldConfig"]["defaults"]["unit"].is_string(),
                "{name}/{title}: unit"
            );
            let targets = panel["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{name}/{title}: targets");
            for target in targets {
                let expr = target["expr"].as_str().expect("expr");
                out.push((name.clone(), title.clone(), expr.to_string()));
            }
        }
        assert!(panels >= 6, "{name}: {panels} panels");
    }
    out
}

/// `(alert, expression)` of every rule in `alerts.yml` (one-line `expr:` values).
fn alert_expressions() -> Vec<(String, String)> {
    let text =
        std::fs::read_to_string(repo().join("deploy/prometheus/alerts.yml")).expect("alerts.yml");
    let mut out = Vec::new();
    let mut alert = String::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix("- alert:") {
            alert = name.trim().to_string();
        } else if let Some(expr) = line.strip_prefix("expr:") {
            let expr = expr.trim();
            assert!(
                !expr.is_empty() && !expr.starts_with(['|', '>']),
                "{alert}: keep expressions on one line"
            );
            out.push((alert.clone(), expr.to_string()));
        }
    }
    out
}

/// Metric names in a PromQL expression (histogram series mapped to their family).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut word = String::new();
    for c in expr.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
            continue;
        }
        if word.starts_with("ragstream_") || word.starts_with("process_") {
            names.insert(word.clone());
        }
        word.clear();
    }
    names
}

/// Families and series of a Prometheus text exposition: family → (type, series lines).
fn families(text: &str) -> BTreeMap<String, (String, Vec<String>)> {
    let mut out: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            out.insert(name.to_string(), (kind.to_string(), Vec::new()));
        } else if !line.starts_with('#') && !line.is_empty() {
            let series = line.split(['{', ' ']).next().unwrap();
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    let base = series.strip_suffix(suffix)?;
                    out.contains_key(base).then(|| base.to_string())
                })
                .unwrap_or_else(|| series.to_string());
            out.entry(family).or_default().1.push(line.to_string());
        }
    }
    out
}

/// Label names and values of one series line.
fn labels(line: &str) -> Vec<(String, String)> {
    let Some(start) = line.find('{') else {
        return Vec::new();
    };
    let end = line
        .rfind('}')
        .unwrap_or_else(|| panic!("closing brace in {line}"));
    line[start + 1..end]
        .split("\",")
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').expect("label pair");
            (
                name.trim().to_string(),
                value.trim_matches(['"', ',']).to_string(),
            )
        })
        .collect()
}

fn config(broker: &Broker) -> String {
    crate::common::kafka_config(
        &broker.bootstrap(),
        &format!(
            "documents_topic = \"{DOCS}\"\nqueries_topic = \"{QUERIES}\"\ncontexts_topic = \"{CONTEXTS}\"\ndlq_topic = \"{DLQ}\"\ngroup_id = \"ragstream-observability-it\""
        ),
        "",
    )
}

fn record(key: &str, value: Value) -> (String, Option<Vec<u8>>) {
    (key.to_string(), Some(value.to_string().into_bytes()))
}

fn document(tenant: &str, doc_id: &str, version: u64, text: &str) -> (String, Option<Vec<u8>>) {
    record(
        &format!("{tenant}/{doc_id}"),
        json!({
            "op": "upsert", "tenant": tenant, "doc_id": doc_id, "version": version,
            "source": format!("{tenant}/{doc_id}.md"), "kind": "markdown",
            "title": doc_id, "text": text,
        }),
    )
}

fn post_query(port: u16, body: &Value) -> (u16, Value) {
    let (status, body) = http_post_json(port, "/v1/query", &body.to_string()).expect("answer");
    (status, serde_json::from_str(&body).expect("context JSON"))
}

/// One wave of work: documents of two tenants, an update that shrinks one, a delete, a stale version
/// and a malformed record; then queries in the common modes (a read_your_writes one, a repeat for the
/// cache, a refused one) on the topic and one over HTTP. Returns the ids used, which must never appear
/// as label values.
fn wave(broker: &Broker, job: &mut Job, wave: usize) -> Vec<String> {
    let topics = [
        "Deployment",
        "Rollback",
        "On-call",
        "Billing",
        "Invoices",
        "Backups",
        "Alerts",
        "Search",
    ];
    let mut docs: Vec<(String, Option<Vec<u8>>)> = Vec::new();
    let mut ids = Vec::new();
    for (i, topic) in topics.iter().enumerate() {
        let tenant = if i % 2 == 0 { "acme" } else { "globex" };
        let doc_id = format!("handbook-{wave}-{i}");
        ids.push(doc_id.clone());
        let text = format!(
            "# {topic}\n\n## Overview\n\n{topic} is owned by team {i}. The {topic} runbook was revised in 202{i}.\n\n## Steps\n\nRun `opsctl {topic} --check` first, then page the owner if it fails. It takes {i} minutes.\n"
        );
        docs.push(document(tenant, &doc_id, 1, &text));
    }
    let first = format!("handbook-{wave}-0");
    docs.push(document(
        "acme",
        &first,
        2,
        "# Deployment\n\nReleases ship on Tuesdays.",
    ));
    docs.push(record(
        &format!("acme/handbook-{wave}-2"),
        json!({"op": "delete", "tenant": "acme", "doc_id": format!("handbook-{wave}-2"), "version": 2}),
    ));
    docs.push(document("acme", &first, 1, "# Deployment\n\nOld text."));
    docs.push((
        "acme/broken".to_string(),
        Some(b"{\"op\": \"upsert\", \"tenant\": ".to_vec()),
    ));
    let documents_before = metric(&job.metrics(), "ragstream_documents_total");
    broker.produce(DOCS, &docs);
    job.wait_for(Duration::from_secs(120), "documents indexed", |m| {
        metric(m, "ragstream_documents_total") >= documents_before + 11.0
            && metric(m, "ragstream_in_flight_messages") == 0.0
    });

    let mut queries = Vec::new();
    let texts = [
        ("acme", "How do I roll back a release?", json!({})),
        ("acme", "Who owns billing?", json!({"token_budget": 60})),
        (
            "globex",
            "what does opsctl Rollback --check do",
            json!({"trace": true}),
        ),
        (
            "acme",
            "When was the Search runbook revised?",
            json!({"consistency": "read_your_writes"}),
        ),
        (
            "acme",
            "backups and alerts",
            json!({"mode": "deep", "k": 3}),
        ),
        ("globex", "", json!({"mode": "list_sources"})),
        ("acme", "How do I roll back a release?", json!({})),
        ("acme", "", json!({"mode": "psychic"})),
    ];
    let answered_before = metric(&job.metrics(), "ragstream_queries_total");
    for (i, (tenant, text, extra)) in texts.iter().enumerate() {
        let id = format!("obs-query-{wave}-{i}");
        let mut value = json!({"query_id": id, "tenant": tenant, "text": text});
        for (k, v) in extra.as_object().expect("object") {
            value[k] = v.clone();
        }
        queries.push(record(&id, value));
        ids.push(id);
    }
    broker.produce(QUERIES, &queries);
    let http_id = format!("obs-http-{wave}");
    let (status, context) = post_query(
        job.http_port,
        &json!({"query_id": http_id, "tenant": "acme", "text": "on-call paging", "token_budget": 200}),
    );
    ids.push(http_id);
    assert_eq!(status, 200, "{context}");
    assert!(context["tokens_used"].as_u64().expect("tokens") <= 200);
    job.wait_for(Duration::from_secs(120), "queries answered", |m| {
        metric(m, "ragstream_queries_total") >= answered_before + texts.len() as f64 + 1.0
    });
    ids
}

/// Two waves a few scrapes apart (rates need two samples that differ), then the consumer lag that
/// librdkafka reports every 5 s.
fn workload(broker: &Broker, job: &mut Job) -> Vec<String> {
    let mut ids = wave(broker, job, 1);
    // A standing query that the second wave's documents move: its versions and their latency.
    let subscription = json!({"query": {"tenant": "acme", "text": "when do releases ship", "token_budget": 200}, "min_interval_ms": 0});
    let (status, body) = http_post_json(
        job.http_port,
        "/v1/subscriptions",
        &subscription.to_string(),
    )
    .expect("answered");
    assert_eq!(status, 201, "{body}");
    std::thread::sleep(Duration::from_secs(4));
    ids.extend(wave(broker, job, 2));
    // Last, so that its latency is within the panels' rate window.
    broker.produce(
        DOCS,
        &[document(
            "acme",
            "release-calendar",
            1,
            "# Release calendar\n\nReleases ship every second Thursday on the release train.",
        )],
    );
    job.wait_for(
        Duration::from_secs(60),
        "a second version of the standing query",
        |m| metric(m, "ragstream_standing_versions_total") >= 2.0,
    );
    job.wait_for(Duration::from_secs(30), "consumer lag", |m| {
        m.contains("ragstream_consumer_lag_messages{")
    });
    ids
}

#[test]
fn prometheus_scrapes_the_job_and_every_dashboard_panel_has_data() {
    let bin = prometheus_bin();
    let scrape_config = repo().join("deploy/prometheus/prometheus.yml");
    promtool(&bin, &["check", "config", scrape_config.to_str().unwrap()]);
    let rules = repo().join("deploy/prometheus/alerts.yml");
    promtool(&bin, &["check", "rules", rules.to_str().unwrap()]);

    let broker = Broker::start();
    broker.create_topic(DOCS, 2);
    for topic in [QUERIES, CONTEXTS, DLQ] {
        broker.create_topic(topic, 1);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut job = Job::start(dir.path(), &config(&broker), 1);
    job.wait_ready(Duration::from_secs(120));
    assert_eq!(http_get(job.http_port, "/healthz").map(|r| r.0), Some(200));
    let prometheus_dir = tempfile::tempdir().expect("tempdir");
    let prometheus = Prometheus::start(
        &bin,
        prometheus_dir.path(),
        &format!("127.0.0.1:{}", job.http_port),
    );

    let ids = workload(&broker, &mut job);
    let (status, exposition) = get(job.http_port, "/metrics");
    assert_eq!(status, 200);

    // Prometheus has scraped the job after the workload.
    let answered = metric(&exposition, "ragstream_queries_total");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen = prometheus.query("sum(ragstream_queries_total)");
        let value = seen
            .first()
            .and_then(|s| s["value"][1].as_str())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        if value >= answered {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "prometheus did not scrape the job"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let up = prometheus.query(r#"up{job="ragstream"}"#);
    assert_eq!(up.len(), 1, "{up:?}");
    assert_eq!(up[0]["value"][1], "1");

    // Every panel expression returns at least one finite sample.
    let panels = panel_expressions();
    let mut empty = Vec::new();
    for (dashboard, title, expr) in &panels {
        let expr = expr.replace("$__rate_interval", RATE_WINDOW);
        let result = prometheus.query(&expr);
        let finite = result.iter().any(|series| {
            series["value"][1]
                .as_str()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(f64::is_finite)
        });
        if !finite {
            empty.push(format!("{dashboard} / {title}: {expr} → {result:?}"));
        }
    }
    assert!(
        empty.is_empty(),
        "{} of {} panel expressions returned no data:\n{}",
        empty.len(),
        panels.len(),
        empty.join("\n")
    );
    // Every alert rule is loaded and evaluates (healthy) against the live job.
    let (_, body) = get(prometheus.port, "/api/v1/rules");
    let rules: Value = serde_json::from_str(&body).expect("rules JSON");
    let loaded: Vec<&Value> = rules["data"]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .collect();
    let alerts = alert_expressions();
    assert_eq!(loaded.len(), alerts.len(), "every rule loaded");
    for (alert, expr) in &alerts {
        prometheus.query(expr);
        let rule = loaded
            .iter()
            .find(|r| r["name"] == alert.as_str())
            .unwrap_or_else(|| panic!("{alert} loaded"));
        assert_ne!(rule["health"], "err", "{alert}: {rule}");
    }
    // No budget overrun fired; the job is up.
    let firing: Vec<&str> = loaded
        .iter()
        .filter(|r| r["state"] == "firing")
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert!(firing.is_empty(), "alerts firing: {firing:?}");

    // Every metric the dashboards and alert rules name is exposed by the job.
    let exposed = families(&exposition);
    let mut named = BTreeSet::new();
    for (_, _, expr) in &panels {
        named.extend(metric_names(expr));
    }
    for (_, expr) in &alerts {
        named.extend(metric_names(expr));
    }
    assert!(named.len() >= 30, "{named:?}");
    let missing: Vec<&String> = named
        .iter()
        .filter(|name| {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|b| exposed.contains_key(*b)))
                .unwrap_or(name.as_str());
            exposed
                .get(family)
                .is_none_or(|(_, lines)| lines.is_empty())
        })
        .collect();
    assert!(missing.is_empty(), "named but not in /metrics: {missing:?}");

    // No unbounded label: only known label names, no id among the values, few series per family.
    for (family, (_, lines)) in exposed.iter().filter(|(f, _)| f.starts_with("ragstream_")) {
        let mut combinations = BTreeSet::new();
        for line in lines {
            let pairs = labels(line);
            for (name, value) in &pairs {
                assert!(
                    BOUNDED_LABELS.contains(&name.as_str()),
                    "{family}: label {name} is not a bounded one"
                );
                assert!(
                    !ids.iter().any(|id| value.contains(id.as_str())),
                    "{family}: label value {value} carries an id"
                );
            }
            combinations.insert(
                pairs
                    .into_iter()
                    .filter(|(n, _)| n != "le")
                    .collect::<Vec<_>>(),
            );
        }
        // One series per operator name of the dataflow: bounded by the program, not by the data.
        let bound = if family == "ragstream_operator_activation_seconds"
            || family.starts_with("ragstream_tenant_")
        {
            64
        } else {
            40
        };
        assert!(
            combinations.len() <= bound,
            "{family}: {} label combinations",
            combinations.len()
        );
    }
    assert!(
        exposed.contains_key("process_resident_memory_bytes")
            && exposed.contains_key("ragstream_build_info"),
        "process collector and build info"
    );

    // Each bad record is logged once, with its reason and where it came from (topic/partition@offset).
    let log = job.log();
    let dead_lettered: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("dead-lettered"))
        .collect();
    assert_eq!(dead_lettered.len(), 2, "{dead_lettered:?}");
    assert!(dead_lettered
        .iter()
        .all(|l| l.contains("reason=malformed_json") && l.contains(&format!("{DOCS}/"))));
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("query refused"))
        .collect();
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(refused.iter().all(|l| l.contains(&format!("{QUERIES}/0@"))));

    // /readyz follows the broker: 503 while it is down, 200 again once it is back.
    let (status, body) = get(job.http_port, "/readyz");
    assert_eq!((status, body.contains("broker: ok")), (200, true), "{body}");
    let mut broker = broker;
    broker.kill();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = get(job.http_port, "/readyz");
        if status == 503 && body.contains("broker: unreachable") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "readyz ignores the broker: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    broker.restart();
    let deadline = Instant::now() + Duration::from_secs(60);
    while get(job.http_port, "/readyz").0 != 200 {
        assert!(Instant::now() < deadline, "readyz did not recover");
        std::thread::sleep(Duration::from_millis(500));
    }
    job.stop();
}
