//! Case 6, rebalance mid-stream: while documents stream in, a second job instance (with its own
//! embedded index) joins the consumer group and takes some partitions, then leaves. The first
//! instance gets them back and resumes each at its own index checkpoint rather than at the offsets the
//! second instance committed, so its index still ends equal to the oracle: nothing the second instance
//! consumed is missing from it, and no chunk those events retracted survives.

use std::time::{Duration, Instant};

use super::common::broker::Broker;
use super::common::job::{metric, Job};
use super::common::oracle::{compare, default_chunker};
use super::common::qdrant::QdrantServer;
use super::support::{
    broker_with_topics, group_config, lost_stale, wait_committed, Workload, DOCS,
};

const PARTITIONS: i32 = 4;
const GROUP: &str = "rebalance";

/// A job in `group` (a dynamic member: it leaves the group at once when it stops).
fn config(broker: &Broker, group: &str) -> String {
    group_config(broker, group, "", "")
}

/// Produces `total` events of `workload` in slices of 20, one slice every 250 ms (a stream, not a
/// burst), until `until` says stop or all were produced; returns how many were produced.
fn stream(
    broker: &Broker,
    workload: &mut Workload,
    total: usize,
    mut until: impl FnMut() -> bool,
) -> usize {
    let mut produced = 0;
    while produced < total && !until() {
        broker.produce(DOCS, &workload.batch(20));
        produced += 20;
        std::thread::sleep(Duration::from_millis(250));
    }
    produced
}

/// Starts a second instance in `dir` with `config` and streams events until it has consumed 40 of
/// them and 8 s have passed since it was ready (at most 400 events).
fn join_mid_stream(
    broker: &Broker,
    workload: &mut Workload,
    dir: &std::path::Path,
    config: &str,
) -> Job {
    let mut second = Job::start(dir, config, 1);
    second.wait_ready(Duration::from_secs(60));
    let joined = Instant::now();
    stream(broker, workload, 400, || {
        metric(&second.metrics(), "ragstream_source_events_total") >= 40.0
            && joined.elapsed() > Duration::from_secs(8)
    });
    second
}

#[test]
fn an_instance_joining_and_leaving_mid_stream_loses_nothing() {
    let broker = broker_with_topics(PARTITIONS);
    let mut workload = Workload::new(23, 900);
    broker.produce(DOCS, &workload.batch(100));
    let first_dir = tempfile::tempdir().expect("tempdir");
    let mut first = Job::start(first_dir.path(), &config(&broker, GROUP), 1);
    first.wait_ready(Duration::from_secs(60));
    wait_committed(&broker, GROUP, DOCS, PARTITIONS, &first);

    // A second instance joins while events stream in; it must take part.
    let second_dir = tempfile::tempdir().expect("tempdir");
    let mut second = join_mid_stream(
        &broker,
        &mut workload,
        second_dir.path(),
        &config(&broker, GROUP),
    );
    wait_committed(&broker, GROUP, DOCS, PARTITIONS, &first);
    let second_consumed = metric(&second.metrics(), "ragstream_source_events_total");
    let second_upserted = metric(&second.metrics(), "ragstream_chunks_upserted_total");

    // It leaves while events keep coming; its partitions go back to the first instance.
    assert!(second.stop().success(), "{}", second.log());
    let left = Instant::now();
    stream(&broker, &mut workload, 200, || false);
    wait_committed(&broker, GROUP, DOCS, PARTITIONS, &first);
    let recovery = left.elapsed().as_secs_f64();
    let log = first.log();
    let resumed = log.matches("resuming at the index checkpoint").count();
    let dlq = metric(&first.metrics(), "ragstream_dlq_records_total");
    let rss = first.peak_rss_bytes().unwrap_or(0);
    assert!(first.stop().success());
    let (lost, stale, example) = lost_stale(&workload.oracle, first_dir.path());
    println!(
        "FAULT rebalance: {} events over {PARTITIONS} partitions; the second instance consumed {second_consumed} events ({second_upserted} chunks into its own index) and left; the first resumed {resumed} partition assignment(s) at its index checkpoint; all committed {recovery:.1} s after the leave; lost {lost}, stale {stale}, DLQ {dlq}; peak RSS {:.0} MiB",
        workload.produced,
        rss as f64 / 1048576.0
    );
    assert!(
        second_consumed > 0.0,
        "the second instance never got a partition"
    );
    assert!(resumed > 0, "no partition came back through the checkpoint");
    assert_eq!((lost, stale), (0, 0), "{example}");
    assert_eq!(dlq, 0.0);
}

/// The same rebalance with the production backend: two instances share one Qdrant server collection
/// and one consumer group. Each instance's upsert state is only its own view of the collection: at
/// every assignment it reads the collection again (the documents' stored chunks and versions), so the
/// updates, shrinks and deletes that follow a rebalance retract what the other instance wrote. A small
/// pool of documents makes most events touch a document the other instance wrote last.
#[test]
fn two_instances_on_one_qdrant_collection_rebalance_without_stale_chunks() {
    let Some(server) = QdrantServer::start() else {
        return;
    };
    const SHARED_GROUP: &str = "rebalance-server";
    const COLLECTION: &str = "rebalance";
    let broker = broker_with_topics(PARTITIONS);
    let config = server.index_config(&config(&broker, SHARED_GROUP), COLLECTION);
    let mut workload = Workload::new(29, 120);
    broker.produce(DOCS, &workload.batch(100));
    let first_dir = tempfile::tempdir().expect("tempdir");
    let mut first = Job::start(first_dir.path(), &config, 1);
    first.wait_ready(Duration::from_secs(60));
    wait_committed(&broker, SHARED_GROUP, DOCS, PARTITIONS, &first);

    // The second instance joins while events stream in.
    let second_dir = tempfile::tempdir().expect("tempdir");
    let mut second = join_mid_stream(&broker, &mut workload, second_dir.path(), &config);
    wait_committed(&broker, SHARED_GROUP, DOCS, PARTITIONS, &first);
    let second_consumed = metric(&second.metrics(), "ragstream_source_events_total");
    let (lost_joined, stale_joined, example_joined) = compare(
        &workload.oracle.expected(&default_chunker()),
        &server.contents(COLLECTION),
    );

    // It leaves; the first instance takes every partition back and events keep coming.
    assert!(second.stop().success(), "{}", second.log());
    stream(&broker, &mut workload, 200, || false);
    wait_committed(&broker, SHARED_GROUP, DOCS, PARTITIONS, &first);
    let rehydrations = metric(&first.metrics(), "ragstream_rehydrations_total");
    let dlq = metric(&first.metrics(), "ragstream_dlq_records_total");
    assert!(first.stop().success());
    let (lost, stale, example) = compare(
        &workload.oracle.expected(&default_chunker()),
        &server.contents(COLLECTION),
    );
    println!(
        "FAULT rebalance, Qdrant server: {} events over {PARTITIONS} partitions into one collection; the second instance consumed {second_consumed} events and left; after the join lost {lost_joined}, stale {stale_joined}; after the leave lost {lost}, stale {stale}; the first instance read the collection again {rehydrations} time(s); DLQ {dlq}",
        workload.produced,
    );
    assert!(
        second_consumed > 0.0,
        "the second instance never got a partition"
    );
    assert_eq!(
        (lost_joined, stale_joined),
        (0, 0),
        "after the join: {example_joined}"
    );
    assert_eq!((lost, stale), (0, 0), "after the leave: {example}");
    assert_eq!(dlq, 0.0);
}
