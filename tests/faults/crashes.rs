//! Case 1, SIGKILL at fail points, and case 5, out-of-order versions and shrink-then-crash.
//!
//! Case 1: for each fail point (after consume, after embed, after the index write before the offset
//! store, after the offset store) and each cycle, a batch of events (upserts, grows, shrinks, deletes,
//! tombstones, late stale versions) is produced, the job starts with that fail point armed and kills
//! itself with SIGKILL when it gets there; a clean job then recovers (recovery = start until the group
//! committed the end of the topic) and is killed too; the index is then compared with the oracle.
//! `RAGSTREAM_FAULT_CYCLES` sets the cycles per fail point (20 by default).

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use ragstream_operators::faults;

use super::common::broker::Broker;
use super::common::job::Job;
use super::common::oracle::{default_chunker, Oracle};
use super::support::{lost_stale, median, tail, wait_committed, Workload};

const DLQ: &str = "dlq";
const PARTITIONS: i32 = 2;

/// One crash scenario's topic and consumer group (scenarios run side by side on one broker).
#[derive(Clone, Copy)]
struct Lane<'a> {
    broker: &'a Broker,
    name: &'a str,
}

impl Lane<'_> {
    fn topic(&self) -> String {
        format!("docs-{}", self.name)
    }

    fn group(&self) -> String {
        format!("crash-{}", self.name)
    }

    fn config(&self) -> String {
        super::common::kafka_config(
            &self.broker.bootstrap(),
            &format!(
                "documents_topic = \"{}\"\ndlq_topic = \"{DLQ}\"\ngroup_id = \"{}\"",
                self.topic(),
                self.group(),
            ),
            "",
        )
    }

    fn setup(&self) {
        self.broker.create_topic(&self.topic(), PARTITIONS);
    }

    fn produce(&self, events: &[(String, Option<Vec<u8>>)]) {
        self.broker.produce(&self.topic(), events);
    }
}

/// Starts the job with `point` armed and waits until it killed itself there.
fn crash_at(lane: Lane, dir: &std::path::Path, point: &str, workers: usize) {
    let arm = format!("{point}:1");
    let earlier = std::fs::read_to_string(dir.join("job.log")).map_or(0, |log| log.len());
    let mut job = Job::start_with_env(
        dir,
        &lane.config(),
        workers,
        &[(faults::FAILPOINT_ENV, &arm)],
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while job.running() {
        assert!(
            Instant::now() < deadline,
            "fail point {point} never reached; log tail:\n{}",
            tail(&job.log()[earlier..])
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = job.wait_exit(Duration::from_secs(1));
    let log = job.log()[earlier..].to_string();
    assert_eq!(
        status.signal(),
        Some(9),
        "the job should die by SIGKILL at {point}, got {status}; log tail:\n{}",
        tail(&log)
    );
    assert!(
        log.contains(&format!("fail point {point} reached")),
        "{}",
        tail(&log)
    );
}

/// Starts a clean job, waits until it committed the end of the topic, kills it; (seconds, peak RSS).
/// Recovery is timed from the restart: the restart itself waits out the killed job's group session
/// (see `wait_out_killed_session`).
fn recover(lane: Lane, dir: &std::path::Path, workers: usize) -> (f64, u64) {
    super::common::job::wait_out_killed_session(dir);
    let started = Instant::now();
    let job = Job::start(dir, &lane.config(), workers);
    wait_committed(lane.broker, &lane.group(), &lane.topic(), PARTITIONS, &job);
    let seconds = started.elapsed().as_secs_f64();
    let rss = job.peak_rss_bytes().unwrap_or(0);
    drop(job); // SIGKILL: a crash while idle must lose nothing either
    (seconds, rss)
}

fn setup() -> Broker {
    let broker = Broker::start();
    broker.create_topic(DLQ, 1);
    broker
}

#[test]
fn sigkill_at_every_fail_point_loses_nothing_and_leaves_nothing_stale() {
    let cycles: usize = std::env::var("RAGSTREAM_FAULT_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let broker = setup();
    let points = [
        faults::AFTER_CONSUME,
        faults::AFTER_EMBED,
        faults::AFTER_INDEX_WRITE,
        faults::AFTER_OFFSET_STORE,
    ];
    // The fail points run side by side (own topic, group and index each): most of a cycle is spent
    // waiting for the broker's group join, not computing.
    std::thread::scope(|scope| {
        for (seed, point) in points.into_iter().enumerate() {
            let lane = Lane {
                broker: &broker,
                name: point,
            };
            scope.spawn(move || sigkill_cycles(lane, point, cycles, seed as u64 + 7));
        }
    });
}

fn sigkill_cycles(lane: Lane, point: &str, cycles: usize, seed: u64) {
    lane.setup();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut workload = Workload::new(seed, 1200);
    let mut recovery = Vec::new();
    let mut peak_rss = 0u64;
    for cycle in 0..cycles {
        lane.produce(&workload.batch(12));
        crash_at(lane, dir.path(), point, 2);
        let (seconds, rss) = recover(lane, dir.path(), 2);
        recovery.push(seconds);
        peak_rss = peak_rss.max(rss);
        let (lost, stale, example) = lost_stale(&workload.oracle, dir.path());
        assert_eq!(
            (lost, stale),
            (0, 0),
            "{point}, cycle {cycle}: lost {lost}, stale {stale}: {example}"
        );
    }
    let max = recovery.iter().copied().fold(0.0, f64::max);
    println!(
        "FAULT sigkill {point}: {cycles} cycles, {} events, {} live chunks; lost 0, stale 0, duplicates 0; recovery median {:.1} s, max {max:.1} s; peak RSS {:.0} MiB",
        workload.produced,
        workload.oracle.expected(&default_chunker()).len(),
        median(&mut recovery),
        peak_rss as f64 / 1048576.0
    );
}

/// Prose of `paragraphs` joined, cut to the fewest paragraphs that chunk into at least `chunks` chunks.
fn text_with_chunks(paragraphs: &[String], chunks: usize) -> String {
    let chunker = default_chunker();
    let mut text = String::new();
    for paragraph in paragraphs {
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        text.push_str(paragraph);
        let document = ragstream_operators::model::Document {
            key: ragstream_operators::model::DocKey::new("squad", "probe"),
            version: 1,
            source: "probe".into(),
            kind: ragstream_operators::model::DocKind::Prose,
            title: Some("Shrinking".into()),
            text: text.clone(),
            acl: vec![],
            updated_ms: 0,
            metadata: Default::default(),
        };
        if chunker.chunk(&document).len() >= chunks {
            return text;
        }
    }
    panic!("not enough text for {chunks} chunks");
}

// One worker, so the fail points meet the writes in the order the events were produced.
#[test]
fn shrink_then_crash_and_out_of_order_versions_leave_nothing_stale() {
    let broker = setup();
    let lane = Lane {
        broker: &broker,
        name: "shrink",
    };
    lane.setup();
    let dir = tempfile::tempdir().expect("tempdir");
    let paragraphs: Vec<String> = super::common::oracle::squad()
        .into_iter()
        .take(60)
        .map(|p| p.text)
        .collect();
    let long = text_with_chunks(&paragraphs, 10);
    let short = text_with_chunks(&paragraphs[30..], 3);
    let mut oracle = Oracle::default();
    let started = Instant::now();
    // v1: ten chunks, then a crash after it is durable but before its offset is stored.
    lane.produce(&[
        oracle.upsert("squad", "shrinking", 1, "Shrinking", &long),
        oracle.upsert("squad", "late", 5, "Late", &paragraphs[50]),
        oracle.upsert(
            "squad",
            "late",
            3,
            "Late",
            "version 3 arrives after version 5",
        ),
    ]);
    crash_at(lane, dir.path(), faults::AFTER_INDEX_WRITE, 1);
    // v2: three chunks; killed after the seven surplus chunks were deleted, before the upserts.
    lane.produce(&[oracle.upsert("squad", "shrinking", 2, "Shrinking", &short)]);
    crash_at(lane, dir.path(), faults::AFTER_INDEX_DELETE, 1);
    // v3: deleted; killed between the delete and the offset store, then a late version 4.
    lane.produce(&[
        oracle.delete("squad", "shrinking", 3),
        oracle.upsert(
            "squad",
            "late",
            4,
            "Late",
            "version 4 arrives after version 5",
        ),
    ]);
    crash_at(lane, dir.path(), faults::AFTER_INDEX_DELETE, 1);
    let (seconds, rss) = recover(lane, dir.path(), 1);
    let (lost, stale, example) = lost_stale(&oracle, dir.path());
    let expected = oracle.expected(&default_chunker());
    println!(
        "FAULT shrink-then-crash: 10 → 3 → delete with 3 kills, versions 5, 3, 4 of another document; lost {lost}, stale {stale}; {} chunks expected; recovery {seconds:.1} s, total {:.1} s; peak RSS {:.0} MiB",
        expected.len(),
        started.elapsed().as_secs_f64(),
        rss as f64 / 1048576.0
    );
    assert_eq!((lost, stale), (0, 0), "{example}");
    assert!(
        expected.iter().all(|(key, _, _, _)| key == "squad/late"),
        "only the late document is live"
    );
}
