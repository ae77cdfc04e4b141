//! Hostile files against the real job: PDFs whose content streams and object streams amplify, a
//! PDF nested 200 000 arrays deep, Flate and zip bombs, a "billion laughs" DOCX, deeply nested and
//! unclosed HTML, a page of 2 000 headings, a million-byte word with no whitespace. Each is posted
//! (`POST /v1/documents`) and dropped into the watched directory. Throughout, `/healthz` is timed
//! every 50 ms (every probe answered, the 99th percentile within 100 ms, none past a second) and
//! the job's resident memory sampled (at most 200 MiB above where it started); after all of them
//! the job is alive, a normal query is answered, every hostile document was refused with its
//! reason or indexed, and a normal document posted after them is searchable.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use ragstream_core::testing::hostile;
use serde_json::{json, Value};

use super::common::job::{http_get_with, http_post_json_with, post_documents, Job};
use super::support::docs_with_runbook;

const TOKEN: &str = "tok-files-5f0c93ad27";

/// One `GET /healthz` on a fresh connection: its time, if answered 200.
fn healthz(port: u16) -> Option<Duration> {
    let started = Instant::now();
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream
        .write_all(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .ok()?;
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let status: u16 = answer.split_whitespace().nth(1)?.parse().ok()?;
    (status == 200).then(|| started.elapsed())
}

/// `VmRSS` of a process, in bytes.
fn rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// What the watcher saw: each `/healthz` time (`None`: not answered) and the highest RSS sampled.
struct Watched {
    probes: Vec<Option<Duration>>,
    peak_rss: u64,
}

/// Times `/healthz` every 50 ms and samples the job's RSS until `stop`.
fn watch(port: u16, pid: u32, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Watched> {
    std::thread::spawn(move || {
        let mut watched = Watched {
            probes: Vec::new(),
            peak_rss: 0,
        };
        while !stop.load(Ordering::SeqCst) {
            watched.probes.push(healthz(port));
            watched.peak_rss = watched.peak_rss.max(rss(pid).unwrap_or(0));
            std::thread::sleep(Duration::from_millis(50));
        }
        watched
    })
}

/// The hostile files, by name.
fn files() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        // 60 MiB of path operators in about 60 KiB: gigabytes once parsed into operations.
        ("amplify.pdf", hostile::pdf_amplifying_content(60 << 20)),
        // 4000 object-stream entries that all parse the same 200 KB array.
        (
            "copies.pdf",
            hostile::pdf_object_stream_copies(4000, 100_000),
        ),
        ("nested.pdf", hostile::pdf_nested_arrays(200_000)),
        // A content stream inflating past the 64 MiB bound.
        (
            "flate-bomb.pdf",
            hostile::pdf_with_content(&vec![b' '; 80 << 20]),
        ),
        (
            "zip-bomb.docx",
            ragstream_core::testing::zip_file(&[("word/document.xml", &vec![b' '; 65 << 20])]),
        ),
        ("laughs.docx", hostile::docx_billion_laughs()),
        ("nested.html", hostile::html_nested(400_000)),
        ("unclosed.html", hostile::html_unclosed(20_000)),
        ("headings.html", hostile::html_headings(2_000)),
        ("one-word.html", hostile::html_one_word(1 << 20)),
    ]
}

/// Files whose refusal must name the limit that stopped them.
const EXPECTED: [(&str, &str); 3] = [
    ("amplify.pdf", "memory limit"),
    ("copies.pdf", "memory limit"),
    ("flate-bomb.pdf", "exceeded the 67108864-byte limit"),
];

#[test]
fn hostile_files_are_refused_or_read_without_stopping_stalling_or_swelling_the_job() {
    let dir = tempfile::tempdir().expect("tempdir");
    let docs = docs_with_runbook(dir.path());
    let config = r#"
[source]
kind = "dir"
path = "{dir}/docs"
tenant = "acme"
rescan_secs = 1
[index]
path = "{dir}/index"
[http]
listen = "{http}"
[runtime]
dlq_path = "{dir}/dlq.jsonl"
"#;
    let mut job = Job::start_with_env(dir.path(), config, 1, &[("RAGSTREAM_QUERY_TOKEN", TOKEN)]);
    job.wait_ready(Duration::from_secs(120));
    job.wait_indexed(1);
    let port = job.http_port;
    let pid = job.pid().expect("running");
    let files = files();
    for (name, bytes) in &files {
        println!("FAULT hostile files: {name}: {} KiB", bytes.len() >> 10);
    }
    let before = rss(pid).expect("rss");
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch(port, pid, stop.clone());
    let started = Instant::now();

    // Posted, one request each, to the tenant the directory does not own.
    let mut posted = Vec::new();
    for (name, bytes) in &files {
        let at = Instant::now();
        let body = json!({"documents": [{"tenant": "globex", "doc_id": name, "version": 1,
            "content_base64": base64::engine::general_purpose::STANDARD.encode(bytes)}]});
        let (status, answer) = post_documents(port, TOKEN, &body);
        let outcome = match status {
            200 => "indexed".to_string(),
            422 => format!(
                "{}: {}",
                answer["errors"][0]["reason"].as_str().unwrap_or("?"),
                answer["errors"][0]["detail"].as_str().unwrap_or("?")
            ),
            other => panic!("{name} posted: {other} {answer}"),
        };
        println!(
            "FAULT hostile files: posted {name}: {outcome} ({:.1} s)",
            at.elapsed().as_secs_f64()
        );
        posted.push((*name, outcome));
    }

    // Dropped into the watched directory, all at once.
    for (name, bytes) in &files {
        std::fs::write(docs.join(name), bytes).expect("dropped");
    }
    let dlq = dir.path().join("dlq.jsonl");
    let deadline = Instant::now() + Duration::from_secs(300);
    let dropped: Vec<(&str, String)> = loop {
        let records: Vec<Value> = std::fs::read_to_string(&dlq)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect();
        let indexed = sources(port, "acme");
        let outcomes: Vec<Option<String>> = files
            .iter()
            .map(|(name, _)| {
                if indexed.iter().any(|id| id == name) {
                    return Some("indexed".to_string());
                }
                records
                    .iter()
                    .find(|r| r["origin"].as_str() == Some(*name))
                    .map(|r| {
                        format!(
                            "{}: {}",
                            r["reason"].as_str().unwrap_or("?"),
                            r["error"].as_str().unwrap_or("?")
                        )
                    })
            })
            .collect();
        if outcomes.iter().all(Option::is_some) {
            break files
                .iter()
                .zip(outcomes)
                .map(|((name, _), outcome)| (*name, outcome.expect("all")))
                .collect();
        }
        assert!(
            Instant::now() < deadline,
            "not every dropped file was indexed or refused: {outcomes:?}"
        );
        assert!(job.running(), "the job died; log:\n{}", job.log());
        std::thread::sleep(Duration::from_millis(500));
    };
    for (name, outcome) in &dropped {
        println!("FAULT hostile files: dropped {name}: {outcome}");
    }
    stop.store(true, Ordering::SeqCst);
    let watched = watcher.join().expect("watcher");
    let elapsed = started.elapsed();

    assert!(job.running(), "the job died; log:\n{}", job.log());
    let unanswered = watched.probes.iter().filter(|p| p.is_none()).count();
    let mut times: Vec<Duration> = watched.probes.iter().flatten().copied().collect();
    times.sort();
    let slowest = times.last().copied().unwrap_or_default();
    let median = times.get(times.len() / 2).copied().unwrap_or_default();
    let p99 = times
        .get((times.len() * 99 / 100).min(times.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default();
    let over = times
        .iter()
        .filter(|t| **t > Duration::from_millis(100))
        .count();
    let growth = watched.peak_rss.saturating_sub(before);
    println!(
        "FAULT hostile files: {} files posted and dropped in {:.1} s: /healthz {} probes, median {:?}, \
         p99 {:?}, slowest {:?}, {over} over 100 ms, unanswered {unanswered}; job RSS {} MiB before, \
         peak {} MiB (+{} MiB)",
        files.len(),
        elapsed.as_secs_f64(),
        watched.probes.len(),
        median,
        p99,
        slowest,
        before >> 20,
        watched.peak_rss >> 20,
        growth >> 20
    );
    // Every probe answered; 99 in 100 within 100 ms and none past a second (a liveness probe's
    // default timeout): on this shared 2-core machine the slowest of about 370 probes took 70-86 ms.
    assert_eq!(unanswered, 0, "/healthz went unanswered");
    assert!(
        p99 <= Duration::from_millis(100) && slowest <= Duration::from_secs(1),
        "/healthz p99 {p99:?}, slowest {slowest:?}"
    );
    assert!(
        growth <= 200 << 20,
        "the job's RSS grew {} MiB",
        growth >> 20
    );
    for (name, expected) in EXPECTED {
        for (way, outcomes) in [("posted", &posted), ("dropped", &dropped)] {
            let outcome = &outcomes.iter().find(|(n, _)| *n == name).expect("listed").1;
            assert!(
                outcome.starts_with("unparseable") && outcome.contains(expected),
                "{way} {name}: {outcome}"
            );
        }
    }
    for (way, outcomes) in [("posted", &posted), ("dropped", &dropped)] {
        for (name, outcome) in outcomes {
            assert!(
                outcome == "indexed" || outcome.starts_with("unparseable: "),
                "{way} {name}: {outcome}"
            );
        }
    }

    // Nothing else lost: the directory's runbook answers, and a document posted now is searchable.
    let auth = format!("Bearer {TOKEN}");
    let ask = |tenant: &str, text: &str| {
        let body = json!({"query_id": format!("after-{tenant}"), "tenant": tenant, "text": text});
        let (status, answer) = http_post_json_with(
            port,
            "/v1/query",
            &body.to_string(),
            &[("Authorization", auth.as_str())],
        )
        .expect("answered");
        assert_eq!(status, 200, "{answer}");
        answer
    };
    assert!(ask("acme", "how to roll back").contains("deployctl rollback"));
    let (status, answer) = post_documents(
        port,
        TOKEN,
        &json!({"documents": [{"tenant": "globex", "doc_id": "after.md", "version": 1,
            "text": "Globex rolls back with shipit revert."}]}),
    );
    assert_eq!(status, 200, "{answer}");
    assert!(ask("globex", "how does globex roll back").contains("shipit revert"));
}

/// The doc ids of a tenant (`GET /v1/sources`).
fn sources(port: u16, tenant: &str) -> Vec<String> {
    let auth = format!("Bearer {TOKEN}");
    let Some((200, body)) = http_get_with(
        port,
        &format!("/v1/sources?tenant={tenant}&limit=1000"),
        &[("Authorization", &auth)],
    ) else {
        return Vec::new();
    };
    let page: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    page["sources"]
        .as_array()
        .map(|sources| {
            sources
                .iter()
                .filter_map(|s| s["doc_id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}
