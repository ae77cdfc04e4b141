//! Query partitions moving mid-stream: queries stream in on a 4-partition queries topic while each
//! query's embedding takes a while (a throttled embedder), so many are in flight at any moment; a
//! second job instance joins the queries group (the group takes partitions from the first), then
//! leaves (they come back). Queries finish in the order they were read (one embedding request at a
//! time), and every query must get exactly one context on the contexts topic: the
//! queries in flight on a revoked partition are dropped by the instance that read them (counted as
//! `handed_over`) and answered by the partition's next owner, which starts at the offset committed
//! at the revocation.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::common::broker::Broker;
use super::common::job::{metric_labeled, Job};
use super::common::oracle::Oracle;
use super::support::{embedder_section, EmbeddingServer};
use serde_json::json;

const DOCS: &str = "docs";
const QUERIES: &str = "queries";
const CONTEXTS: &str = "contexts";
const DLQ: &str = "dlq";
const GROUP: &str = "handover";
/// Model time of each text: a query waits this long for its embedding.
const PER_TEXT: Duration = Duration::from_millis(40);

fn config(broker: &Broker, embedder: &EmbeddingServer) -> String {
    super::common::kafka_config(
        &broker.bootstrap(),
        &format!(
            "documents_topic = \"{DOCS}\"\nqueries_topic = \"{QUERIES}\"\ncontexts_topic = \"{CONTEXTS}\"\ndlq_topic = \"{DLQ}\"\ngroup_id = \"{GROUP}\""
        ),
        // One embedding request at a time: queries finish in the order they were read. Out of order,
        // a later query sent before an earlier one still in flight at a revocation is answered again
        // by the next owner, which starts at the earlier one (the exception the ledger documents).
        &format!("{}executors = 1\n", embedder_section(&embedder.url)),
    )
}

/// Produces queries `q0, q1, …` (each text its own so no cache answers it), 8 every 200 ms (40/s,
/// more than the throttled embedder answers), until `stop` is set; returns how many it produced.
/// Queries therefore stand in flight at every moment of the joins and leaves, whatever the timing.
fn ask_until(broker: &Broker, stop: &AtomicBool) -> usize {
    let producer = broker.producer();
    let mut produced = 0;
    while !stop.load(Ordering::Relaxed) {
        let events: Vec<(String, Option<Vec<u8>>)> = (produced..produced + 8)
            .map(|n| {
                let query = json!({"query_id": format!("q{n}"), "tenant": "t",
                    "text": format!("what does paragraph {n} say about topic {}", n % 7), "k": 3});
                (format!("q{n}"), Some(query.to_string().into_bytes()))
            })
            .collect();
        Broker::produce_with(&producer, QUERIES, &events);
        produced += events.len();
        std::thread::sleep(Duration::from_millis(200));
    }
    produced
}

fn handed_over(job: &Job) -> f64 {
    metric_labeled(
        &job.metrics(),
        "ragstream_queries_total",
        "outcome=\"handed_over\"",
    )
}

#[test]
fn queries_in_flight_when_their_partition_moves_get_one_context() {
    let broker = Broker::start();
    broker.create_topic(DOCS, 1);
    broker.create_topic(QUERIES, 4);
    broker.create_topic(CONTEXTS, 1);
    broker.create_topic(DLQ, 1);
    let mut oracle = Oracle::default();
    let docs: Vec<(String, Option<Vec<u8>>)> = (0..20)
        .map(|d| {
            let text = format!(
                "Paragraph {d} says that topic {} matters for reason {d}.",
                d % 7
            );
            oracle.upsert("t", &format!("d{d}"), 1, &format!("Paragraph {d}"), &text)
        })
        .collect();
    broker.produce(DOCS, &docs);
    let embedder = EmbeddingServer::start();
    let first_dir = tempfile::tempdir().expect("tempdir");
    let mut first = Job::start(first_dir.path(), &config(&broker, &embedder), 1);
    first.wait_ready(Duration::from_secs(60));
    embedder.throttle(PER_TEXT);
    let stop = AtomicBool::new(false);
    let (total, second_handed_over) = std::thread::scope(|scope| {
        let producer = scope.spawn(|| ask_until(&broker, &stop));
        std::thread::sleep(Duration::from_secs(2));
        // A second instance joins the group (partitions move while queries are in flight), then
        // leaves (its partitions go back to the first). Whether a query is mid-embedding at the
        // instant of a revocation is up to the scheduler, so the join and leave repeat (at most
        // three times) until one was.
        let mut second_handed_over = 0.0;
        for _ in 0..3 {
            let second_dir = tempfile::tempdir().expect("tempdir");
            let mut second = Job::start(second_dir.path(), &config(&broker, &embedder), 1);
            second.wait_ready(Duration::from_secs(60));
            std::thread::sleep(Duration::from_secs(3));
            second_handed_over += handed_over(&second);
            assert!(second.stop().success(), "{}", second.log());
            std::thread::sleep(Duration::from_secs(2));
            if handed_over(&first) + second_handed_over > 0.0 {
                break;
            }
        }
        stop.store(true, Ordering::Relaxed);
        (producer.join().expect("producer"), second_handed_over)
    });

    let started = Instant::now();
    let mut contexts: BTreeMap<String, usize> = BTreeMap::new();
    while contexts.len() < total && started.elapsed() < Duration::from_secs(180) {
        contexts.clear();
        for (key, _, _) in broker.read_all(CONTEXTS, total + 1) {
            let id = String::from_utf8(key.expect("key")).expect("utf-8");
            *contexts.entry(id).or_default() += 1;
        }
    }
    let first_handed_over = handed_over(&first);
    assert!(first.stop().success(), "{}", first.log());
    let twice: Vec<_> = contexts.iter().filter(|(_, &n)| n > 1).collect();
    println!(
        "FAULT query handover: {total} queries over 4 partitions, an instance joined and left mid-stream; {} answered, {} answered twice; contexts dropped at a revocation: {} (first), {} (second)",
        contexts.len(),
        twice.len(),
        first_handed_over + 0.0,
        second_handed_over + 0.0
    );
    assert_eq!(contexts.len(), total, "every query answered");
    assert!(twice.is_empty(), "answered twice: {twice:?}");
    assert!(
        first_handed_over + second_handed_over > 0.0,
        "no query was in flight at a revocation: the case did not happen"
    );
}
