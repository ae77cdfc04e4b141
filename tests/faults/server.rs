//! The production index under faults: a Qdrant server SIGKILLed mid-stream and restarted 10 s later,
//! and a server that answers slowly (a delaying proxy in front of it). The job must not crash, must
//! retry rather than dead-letter what was only unavailable, must keep answering queries, and its
//! collection must end equal to the oracle.

use std::time::{Duration, Instant};

use super::common::broker::Broker;
use super::common::job::{http_post_json, metric, Job};
use super::common::oracle::{compare, default_chunker, squad};
use super::common::qdrant::{DelayProxy, QdrantServer};
use super::support::{
    broker_with_topics, group_config, hold_outage, median, wait_committed, Workload, DOCS,
};

const PARTITIONS: i32 = 2;

fn config(broker: &Broker, group: &str) -> String {
    group_config(broker, group, "", "")
}

fn setup() -> Broker {
    broker_with_topics(PARTITIONS)
}

#[test]
fn qdrant_server_killed_mid_stream_and_restarted_loses_nothing() {
    let Some(mut server) = QdrantServer::start() else {
        return;
    };
    const GROUP: &str = "server-killed";
    const COLLECTION: &str = "killed";
    let broker = setup();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut workload = Workload::new(31, 600);
    broker.produce(DOCS, &workload.batch(60));
    let mut job = Job::start(
        dir.path(),
        &server.index_config(&config(&broker, GROUP), COLLECTION),
        1,
    );
    job.wait_ready(Duration::from_secs(60));
    wait_committed(&broker, GROUP, DOCS, PARTITIONS, &job);

    // Events keep coming; the server is killed while they are embedded and written.
    broker.produce(DOCS, &workload.batch(100));
    std::thread::sleep(Duration::from_secs(1));
    let upserted_at_kill = metric(&job.metrics(), "ragstream_chunks_upserted_total");
    server.kill();
    let down = Instant::now();
    broker.produce(DOCS, &workload.batch(100));
    while down.elapsed() < Duration::from_secs(10) {
        assert!(
            job.running(),
            "the job died with the server:\n{}",
            job.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let retries = metric(&job.metrics(), "ragstream_retries_total");
    server.restart();
    let back = Instant::now();
    broker.produce(DOCS, &workload.batch(60));
    wait_committed(&broker, GROUP, DOCS, PARTITIONS, &job);
    let recovery = back.elapsed().as_secs_f64();
    let metrics = job.metrics();
    let dlq = metric(&metrics, "ragstream_dlq_records_total");
    let upserted = metric(&metrics, "ragstream_chunks_upserted_total");
    assert!(job.stop().success(), "{}", job.log());
    let (lost, stale, example) = compare(
        &workload.oracle.expected(&default_chunker()),
        &server.contents(COLLECTION),
    );
    println!(
        "FAULT Qdrant server SIGKILLed mid-stream, down 10 s: {} events; {upserted_at_kill} of {upserted} chunks written at the kill; {retries} retries while down; all committed {recovery:.1} s after the restart; lost {lost}, stale {stale}, DLQ {dlq}",
        workload.produced
    );
    assert!(
        retries > 0.0,
        "nothing was retried: the kill missed the stream"
    );
    assert!(
        upserted_at_kill < upserted,
        "everything was written before the kill"
    );
    assert_eq!((lost, stale), (0, 0), "{example}");
    assert_eq!(dlq, 0.0, "something only unavailable was dead-lettered");
}

/// Round trip of one `POST /v1/query` in ms; the context must hold items.
fn ask(job: &Job, id: &str, text: &str) -> f64 {
    let body =
        serde_json::json!({"query_id": id, "tenant": "squad", "text": text, "token_budget": 500})
            .to_string();
    let started = Instant::now();
    let (status, answer) =
        http_post_json(job.http_port, "/v1/query", &body).expect("query answered");
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(status, 200, "{answer}");
    let context: serde_json::Value = serde_json::from_str(&answer).expect("context JSON");
    assert!(
        context["items"]
            .as_array()
            .is_some_and(|items| !items.is_empty()),
        "an empty context: {context}"
    );
    ms
}

#[test]
fn a_slow_qdrant_server_slows_queries_and_loses_nothing() {
    let Some(server) = QdrantServer::start() else {
        return;
    };
    const GROUP: &str = "server-slow";
    const COLLECTION: &str = "slow";
    // The server 100 ms away: 50 ms each way.
    const ROUND_TRIP: Duration = Duration::from_millis(100);
    let proxy = DelayProxy::start(server.grpc_port());
    let broker = setup();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut workload = Workload::new(37, 600);
    broker.produce(DOCS, &workload.batch(60));
    let mut job = Job::start(
        dir.path(),
        &server.index_config_at(&config(&broker, GROUP), COLLECTION, &proxy.url()),
        1,
    );
    job.wait_ready(Duration::from_secs(60));
    wait_committed(&broker, GROUP, DOCS, PARTITIONS, &job);
    // Forty different questions, so no context comes from the job's cache.
    let questions: Vec<String> = squad()
        .iter()
        .take(40)
        .map(|p| {
            p.text
                .split_whitespace()
                .take(8)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let mut fast: Vec<f64> = questions[..20]
        .iter()
        .enumerate()
        .map(|(i, q)| ask(&job, &format!("fast{i}"), q))
        .collect();

    // Every byte to and from the server now takes 50 ms each way; events keep coming.
    proxy.set_delay(ROUND_TRIP / 2);
    let slowed = Instant::now();
    broker.produce(DOCS, &workload.batch(100));
    let mut slow: Vec<f64> = questions[20..]
        .iter()
        .enumerate()
        .map(|(i, q)| ask(&job, &format!("slow{i}"), q))
        .collect();
    let upserted_slow = metric(&job.metrics(), "ragstream_chunks_upserted_total");
    let slow_for = slowed.elapsed().as_secs_f64();
    proxy.set_delay(Duration::ZERO);
    wait_committed(&broker, GROUP, DOCS, PARTITIONS, &job);
    let dlq = metric(&job.metrics(), "ragstream_dlq_records_total");
    assert!(job.stop().success(), "{}", job.log());
    let (lost, stale, example) = compare(
        &workload.oracle.expected(&default_chunker()),
        &server.contents(COLLECTION),
    );
    let (fast_p50, slow_p50) = (median(&mut fast), median(&mut slow));
    let slow_max = slow.iter().copied().fold(0.0, f64::max);
    println!(
        "FAULT Qdrant server 100 ms round trip away, {slow_for:.1} s: {} events; 20 queries answered, round trip p50 {fast_p50:.1} ms at full speed, p50 {slow_p50:.1} ms (max {slow_max:.0} ms) slowed, while {upserted_slow} chunks were written; lost {lost}, stale {stale}, DLQ {dlq}",
        workload.produced
    );
    // A query's reads are one request for both lanes and their vectors, and one for the top
    // result's neighbours: two round trips, never three.
    let round_trip = ROUND_TRIP.as_secs_f64() * 1000.0;
    assert!(
        slow_p50 > fast_p50 + round_trip,
        "the delay did not reach the queries"
    );
    assert!(
        slow_p50 < fast_p50 + 3.0 * round_trip,
        "a query waited for three round trips or more: p50 {slow_p50:.0} ms"
    );
    assert_eq!((lost, stale), (0, 0), "{example}");
    assert_eq!(dlq, 0.0);
}

/// What a fault case's recovery showed: seconds until everything was committed, DLQ records, and
/// the collection against the oracle.
struct Drained {
    recovery: f64,
    dlq: f64,
    lost: usize,
    stale: usize,
    example: String,
}

/// Waits until `group` committed everything, stops the job and compares `collection` with
/// `workload`'s oracle.
fn drain(
    job: &mut Job,
    broker: &Broker,
    group: &str,
    server: &QdrantServer,
    collection: &str,
    workload: &Workload,
) -> Drained {
    let back = Instant::now();
    wait_committed(broker, group, DOCS, PARTITIONS, job);
    let recovery = back.elapsed().as_secs_f64();
    let dlq = metric(&job.metrics(), "ragstream_dlq_records_total");
    assert!(job.stop().success(), "{}", job.log());
    let (lost, stale, example) = compare(
        &workload.oracle.expected(&default_chunker()),
        &server.contents(collection),
    );
    Drained {
        recovery,
        dlq,
        lost,
        stale,
        example,
    }
}

/// The server's API key rotated under the running job (the server restarted with another key) for
/// 20 s, then back to the job's: every write meanwhile is refused as unauthenticated, which is an
/// outage: nothing dead-lettered, no offset committed, the outage shown, and once the key matches
/// again everything is written.
#[test]
fn a_wrong_api_key_pauses_ingest_until_the_right_one_and_loses_nothing() {
    let Some(mut server) = QdrantServer::start() else {
        return;
    };
    const GROUP: &str = "server-key";
    const COLLECTION: &str = "keyed";
    const KEY: &str = "the-job-key";
    server.restart_with_key(Some(KEY));
    let broker = setup();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut workload = Workload::new(37, 600);
    broker.produce(DOCS, &workload.batch(60));
    let mut job = Job::start_with_env(
        dir.path(),
        &server.index_config(&config(&broker, GROUP), COLLECTION),
        1,
        &[("QDRANT_API_KEY", KEY)],
    );
    job.wait_ready(Duration::from_secs(60));
    wait_committed(&broker, GROUP, DOCS, PARTITIONS, &job);

    server.restart_with_key(Some("rotated-elsewhere"));
    broker.produce(DOCS, &workload.batch(100));
    let gauge = hold_outage(&mut job, &broker, GROUP, PARTITIONS, "index", 20);
    let dlq_during = metric(&job.metrics(), "ragstream_dlq_records_total");
    server.restart_with_key(Some(KEY));
    let Drained {
        recovery,
        dlq,
        lost,
        stale,
        example,
    } = drain(&mut job, &broker, GROUP, &server, COLLECTION, &workload);
    println!(
        "FAULT Qdrant server API key wrong for 20 s: {} events; offsets held, outage gauge {gauge}, DLQ {dlq_during} meanwhile; all committed {recovery:.1} s after the key matched again; lost {lost}, stale {stale}, DLQ {dlq}",
        workload.produced
    );
    assert!(gauge > 0.0, "no index outage shown");
    assert_eq!(dlq, 0.0, "a document was dead-lettered for the key");
    assert_eq!((lost, stale), (0, 0), "{example}");
}

/// The job's collection deleted under it: the job must not write around the hole (a fresh collection
/// missing everything before) nor dead-letter what follows. It stops with a clear error, commits
/// nothing after the deletion, and the next start creates the collection and indexes every event
/// that came after (those before were deleted with the collection).
#[test]
fn a_deleted_collection_stops_the_job_and_the_restart_loses_nothing_sent_after() {
    let Some(server) = QdrantServer::start() else {
        return;
    };
    const GROUP: &str = "server-deleted";
    const COLLECTION: &str = "deleted";
    let broker = setup();
    let dir = tempfile::tempdir().expect("tempdir");
    broker.produce(DOCS, &Workload::new(41, 600).batch(60));
    let mut job = Job::start(
        dir.path(),
        &server.index_config(&config(&broker, GROUP), COLLECTION),
        1,
    );
    job.wait_ready(Duration::from_secs(60));
    wait_committed(&broker, GROUP, DOCS, PARTITIONS, &job);
    let committed = broker.committed(GROUP, DOCS, PARTITIONS);

    server.delete_collection(COLLECTION);
    // What follows the deletion: a workload of its own, the only one the new collection must hold.
    let mut after = Workload::new(43, 600);
    broker.produce(DOCS, &after.batch(80));
    let status = job.wait_exit(Duration::from_secs(60));
    let log = job.log();
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(log.contains("collection is gone"), "{log}");
    assert_eq!(
        broker.committed(GROUP, DOCS, PARTITIONS),
        committed,
        "offsets moved past writes into a deleted collection"
    );
    job.restart(1);
    let Drained {
        recovery,
        dlq,
        lost,
        stale,
        example,
    } = drain(&mut job, &broker, GROUP, &server, COLLECTION, &after);
    println!(
        "FAULT Qdrant collection deleted mid-stream: the job stopped (exit 3, \"collection is gone\") with offsets where they were; restarted, {} events after the deletion committed in {recovery:.1} s; lost {lost}, stale {stale}, DLQ {dlq}",
        after.produced
    );
    assert_eq!(dlq, 0.0);
    assert_eq!((lost, stale), (0, 0), "{example}");
}
