//! `-w 2` gives the same index contents as `-w 1`: documents are routed to the shard of their key
//! whichever worker reads them. Uses the JSONL source (the job exits when its input is acknowledged).

use std::time::{Duration, Instant};

use crate::common::job::Job;
use crate::common::oracle::{compare, default_chunker, index_contents, squad, Oracle};
use ragstream_operators::model::DocKey;

const CONFIG: &str = r#"
[source]
kind = "jsonl"
path = "{dir}/events.jsonl"
[index]
path = "{dir}/index"
[http]
listen = "{http}"
[runtime]
dlq_path = "{dir}/dlq.jsonl"
"#;

fn run(events: &[u8], workers: usize) -> (tempfile::TempDir, f64) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("events.jsonl"), events).expect("events");
    let started = Instant::now();
    let mut job = Job::start(dir.path(), CONFIG, workers);
    let status = job.wait_exit(Duration::from_secs(900));
    assert!(
        status.success(),
        "job with {workers} workers failed: {status}; log:\n{}",
        job.log()
    );
    (dir, started.elapsed().as_secs_f64())
}

#[test]
fn two_workers_index_what_one_worker_indexes() {
    let paragraphs: Vec<_> = squad().into_iter().take(240).collect();
    let mut oracle = Oracle::default();
    let mut lines = Vec::new();
    for p in &paragraphs {
        lines.push(
            oracle
                .upsert("squad", &p.id, 1, &p.title, &p.text)
                .1
                .expect("value"),
        );
    }
    for p in &paragraphs[0..40] {
        lines.push(
            oracle
                .upsert(
                    "squad",
                    &p.id,
                    2,
                    &p.title,
                    "A replacement paragraph. It is short.",
                )
                .1
                .expect("value"),
        );
    }
    for p in &paragraphs[40..60] {
        lines.push(oracle.delete("squad", &p.id, 2).1.expect("value"));
    }
    lines.push(b"{not json".to_vec());
    let events = lines.join(&b'\n');

    let (one, one_secs) = run(&events, 1);
    let (two, two_secs) = run(&events, 2);
    eprintln!("1 worker: {one_secs:.1}s, 2 workers: {two_secs:.1}s (wall, model time included)");
    let expected = oracle.expected(&default_chunker());
    let single = index_contents(&one.path().join("index"));
    let double = index_contents(&two.path().join("index"));
    assert_eq!(
        compare(&expected, &single).0 + compare(&expected, &single).1,
        0,
        "-w 1 equals the oracle"
    );
    assert_eq!(single, double, "-w 2 holds exactly what -w 1 holds");
    // Each shard of the two-worker index holds only the documents routed to it.
    for shard in 0..2u64 {
        let path = two.path().join("index").join(format!("shard-{shard}"));
        let keys = crate::common::oracle::shard_keys(&path);
        assert!(!keys.is_empty(), "shard {shard} is used");
        for key in keys {
            let (tenant, doc_id) = key.split_once('/').expect("key");
            assert_eq!(
                DocKey::new(tenant, doc_id).route() % 2,
                shard,
                "{key} in shard {shard}"
            );
        }
    }
    let dlq = std::fs::read_to_string(two.path().join("dlq.jsonl")).expect("dlq file");
    assert_eq!(
        dlq.lines().count(),
        1,
        "the malformed line is dead-lettered once"
    );
}

/// `POST /v1/query` (top 10, deep mode: the ranked chunks themselves, no packing) → chunk ids in order.
fn top_ten(port: u16, id: &str, text: &str) -> Vec<String> {
    let body = serde_json::json!({"query_id": id, "tenant": "scifact", "text": text, "mode": "deep", "k": 10});
    let (status, reply) = crate::common::job::http_post_json(port, "/v1/query", &body.to_string())
        .expect("query answered");
    assert_eq!(status, 200, "{reply}");
    let context: serde_json::Value = serde_json::from_str(&reply).expect("context JSON");
    context["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| item["chunk_id"].as_str().expect("chunk id").to_string())
        .collect()
}

/// BM25 statistics are the whole tenant corpus's, not a shard's: the same SciFact sample (with
/// updates and deletes) indexed by 1, 2 and 4 workers gives the same top 10 for every query, and
/// the statistics count exactly the live chunks.
#[test]
fn one_two_and_four_workers_rank_the_same_top_ten() {
    let data = crate::common::data_dir().join("scifact");
    let read = |name: &str| -> Vec<serde_json::Value> {
        std::fs::read_to_string(data.join(name))
            .expect("SciFact file")
            .lines()
            .map(|line| serde_json::from_str(line).expect("JSON line"))
            .collect()
    };
    let field = |v: &serde_json::Value, k: &str| v[k].as_str().unwrap_or_default().to_string();
    let corpus: Vec<_> = read("corpus.jsonl").into_iter().take(360).collect();
    let queries: Vec<(String, String)> = read("queries.jsonl")
        .into_iter()
        .take(60)
        .map(|q| (field(&q, "_id"), field(&q, "text")))
        .collect();
    let mut oracle = Oracle::default();
    let mut lines = Vec::new();
    for doc in &corpus {
        let (id, title, text) = (field(doc, "_id"), field(doc, "title"), field(doc, "text"));
        lines.push(
            oracle
                .upsert("scifact", &id, 1, &title, &text)
                .1
                .expect("value"),
        );
    }
    for doc in &corpus[..30] {
        let (id, title, text) = (field(doc, "_id"), field(doc, "title"), field(doc, "text"));
        let first = text.split(". ").next().unwrap_or(&text).to_string();
        lines.push(
            oracle
                .upsert("scifact", &id, 2, &title, &first)
                .1
                .expect("value"),
        );
    }
    for doc in &corpus[30..50] {
        lines.push(
            oracle
                .delete("scifact", &field(doc, "_id"), 2)
                .1
                .expect("value"),
        );
    }
    let live_chunks = oracle.expected(&default_chunker()).len();
    let events = lines.join(&b'\n');

    let mut rankings: Vec<(usize, Vec<Vec<String>>)> = Vec::new();
    for workers in [1, 2, 4] {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("events.jsonl"), &events).expect("events");
        let mut job = Job::start(dir.path(), crate::common::JSONL_SERVING, workers);
        job.wait_ready(Duration::from_secs(120));
        job.wait_for(
            Duration::from_secs(600),
            "the sample indexed and counted",
            |m| {
                crate::common::job::metric(m, "ragstream_documents_total") >= lines.len() as f64
                    && crate::common::job::metric(m, "ragstream_in_flight_messages") == 0.0
                    && crate::common::job::metric(m, "ragstream_bm25_corpus_chunks")
                        == live_chunks as f64
            },
        );
        let lists = queries
            .iter()
            .map(|(id, text)| top_ten(job.http_port, &format!("{workers}-{id}"), text))
            .collect();
        assert!(job.stop().success(), "{}", job.log());
        rankings.push((workers, lists));
    }
    let (_, one) = &rankings[0];
    assert!(one.iter().all(|list| list.len() == 10), "10 results each");
    let mut first_difference = None;
    for (workers, lists) in &rankings[1..] {
        let differing: Vec<usize> = (0..queries.len()).filter(|&q| lists[q] != one[q]).collect();
        println!(
            "{workers} workers vs 1: {} of {} top-10 lists differ ({} live chunks)",
            differing.len(),
            queries.len(),
            live_chunks
        );
        if let Some(&q) = differing.first() {
            first_difference.get_or_insert(format!(
                "query {:?}: 1 worker {:?}, {workers} workers {:?}",
                queries[q].1, one[q], lists[q]
            ));
        }
    }
    assert_eq!(first_difference, None);
}
