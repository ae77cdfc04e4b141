//! Surrogate tiers end to end (docs/query.md, "Surrogate tiers"): under the age policy a context shows
//! a recent document's chunk in full, an older one's as its gist and an old one's as key phrases, a
//! query naming what an old chunk holds raises it a tier, and under the importance policy the tiers
//! follow how often this job packed each chunk. The tier and its reason are in the trace.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::job::{http_post_json, Job};
use serde_json::{json, Value};

const DAY_MS: u64 = 86_400_000;

const DOCS: [(&str, u64, &str); 3] = [
    ("recent", 1, "The harbour ferry to the island leaves every hour from pier four. Tickets for the ferry are sold at the pier kiosk, and the ferry crossing takes twenty minutes."),
    ("older", 12, "The ferry timetable changes in winter, when the ferry leaves every two hours. The winter ferry also stops at the lighthouse pier on request."),
    ("old", 90, "The old ferry pier at Castlebay closed for repairs. Ferry passengers used the temporary pontoon while the Castlebay pier was rebuilt, and the ferry company refunded tickets."),
];

fn start(dir: &std::path::Path, policy: &str) -> Job {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let events: Vec<String> = DOCS
        .iter()
        .map(|(id, age_days, text)| {
            json!({"op": "upsert", "tenant": "port", "doc_id": id, "version": 1, "kind": "prose",
                   "source": format!("port/{id}"), "title": id, "text": text,
                   "updated_at": now - age_days * DAY_MS})
            .to_string()
        })
        .collect();
    std::fs::write(dir.join("events.jsonl"), events.join("\n") + "\n").expect("events");
    let config = format!(
        "{}[query.pack.surrogates]\npolicy = \"{policy}\"\n",
        crate::common::JSONL_SERVING
    );
    let mut job = Job::start(dir, &config, 1);
    job.wait_ready(Duration::from_secs(120));
    job.wait_indexed(DOCS.len());
    job
}

fn ask(job: &Job, id: &str, text: &str, budget: usize) -> Value {
    let body = json!({"query_id": id, "tenant": "port", "text": text, "token_budget": budget,
                      "trace": true, "fill": true});
    let (status, reply) =
        http_post_json(job.http_port, "/v1/query", &body.to_string()).expect("answered");
    assert_eq!(status, 200, "{reply}");
    serde_json::from_str(&reply).expect("context JSON")
}

/// The tier of each document's item.
fn tiers(context: &Value) -> Vec<(String, String, String)> {
    context["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| {
            (
                i["doc_id"].as_str().unwrap().to_string(),
                i["tier"].as_str().unwrap().to_string(),
                i["text"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn tier_of(context: &Value, doc: &str) -> String {
    tiers(context)
        .into_iter()
        .find(|(d, _, _)| d == doc)
        .unwrap_or_else(|| panic!("{doc} not packed: {context}"))
        .1
}

#[test]
fn the_age_policy_shows_older_documents_smaller_and_the_query_raises_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut job = start(dir.path(), "age");
    let context = ask(&job, "a1", "when does the ferry leave the pier", 3000);
    let recent = tier_of(&context, "recent");
    assert!(!["gist", "micro"].contains(&recent.as_str()), "{recent}");
    assert_eq!(tier_of(&context, "older"), "gist", "{context}");
    assert_eq!(tier_of(&context, "old"), "micro", "{context}");
    let (_, _, micro) = tiers(&context)
        .into_iter()
        .find(|(d, _, _)| d == "old")
        .unwrap();
    assert!(micro.starts_with("old: "), "labelled: {micro}");
    assert!(
        micro.contains("Castlebay") && micro.contains("; "),
        "key phrases: {micro}"
    );
    assert!(micro.len() < DOCS[2].2.len() / 2, "{micro}");
    let decisions = context["trace"]["decisions"].as_array().expect("decisions");
    let reasons: Vec<&str> = decisions
        .iter()
        .filter(|d| d["cause"] == "surrogate_policy")
        .map(|d| d["reason"].as_str().unwrap())
        .collect();
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("surrogate tier gist: age 12.0 days")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("surrogate tier micro: age 90.0 days")),
        "{reasons:?}"
    );
    // Naming what the old chunk holds raises it one tier.
    let named = ask(
        &job,
        "a2",
        "when does the ferry leave the Castlebay pier",
        3000,
    );
    assert_eq!(tier_of(&named, "old"), "gist", "{named}");
    assert!(named.to_string().contains("raised: holds the query's"));
    job.stop();
}

#[test]
fn the_importance_policy_follows_what_the_job_packed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut job = start(dir.path(), "importance");
    let question = "when does the ferry leave the pier";
    // Nothing of the tenant packed yet: no scale, every chunk in full.
    let first = ask(&job, "i1", question, 3000);
    assert_eq!(tiers(&first).len(), 3);
    assert!(
        tiers(&first)
            .iter()
            .all(|(_, t, _)| t != "micro" && t != "gist"),
        "{first}"
    );
    // The winter timetable is read three more times (a doc_ids filter keeps the others out).
    for (i, budget) in [2900, 2800, 2700].into_iter().enumerate() {
        let body = json!({"query_id": format!("w{i}"), "tenant": "port", "text": question,
                          "token_budget": budget, "filters": {"doc_ids": ["older"]}});
        let (status, reply) =
            http_post_json(job.http_port, "/v1/query", &body.to_string()).expect("answered");
        assert_eq!(status, 200, "{reply}");
    }
    // Packed 4 times against 1: the winter timetable in full, the other two as key phrases.
    let later = ask(&job, "i2", question, 2500);
    assert!(
        !["gist", "micro"].contains(&tier_of(&later, "older").as_str()),
        "{later}"
    );
    assert_eq!(tier_of(&later, "recent"), "micro", "{later}");
    assert_eq!(tier_of(&later, "old"), "micro", "{later}");
    assert!(
        later
            .to_string()
            .contains("surrogate tier micro: access frequency 0.25"),
        "{later}"
    );
    job.stop();
}
