//! `-w 2` gives the same index contents as `-w 1`: documents are routed to the shard of their key
//! whichever worker reads them. Uses the JSONL source (the job exits when its input is acknowledged).

mod common;

use std::time::{Duration, Instant};

use common::job::Job;
use common::oracle::{compare, default_chunker, index_contents, squad, Oracle};
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
        let keys = common::oracle::shard_keys(&path);
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
