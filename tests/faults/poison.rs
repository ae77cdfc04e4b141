//! Case 7, poison input: malformed JSON, invalid UTF-8, an oversized document, missing fields, an unknown
//! tenant and kind, and a document the embedder answers with vectors of the wrong dimension. Each lands
//! in the DLQ topic with its reason, the stream goes on, and ingest throughput afterwards is within 10%
//! of before.
//!
//! The embedder is the suite's OpenAI-compatible `/v1/embeddings` stand-in ([`EmbeddingServer`]):
//! it answers 7-d vectors for any request holding the text `WRONG-DIMENSION`, as a misconfigured or
//! broken server would.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use super::common::broker::Broker;
use super::common::job::{metric, Job};
use super::common::oracle::{squad, Oracle};
use super::support::{median, wait_committed, EmbeddingServer, DIMENSION};

const DOCS: &str = "docs";
const DLQ: &str = "dlq";
const PARTITIONS: i32 = 2;
/// Throughput rounds before and after the poison, and documents per round.
const ROUNDS: usize = 3;
const ROUND: usize = 1500;
const GROUP: &str = "poison";
/// The job's document limit here. A 50 MB event was accepted by Tansu 0.6 but never fetched back (its
/// partition stalled, nothing after it arrived), so the oversize case uses 640 KB over a 256 KiB limit.
const MAX_DOCUMENT_BYTES: usize = 256 << 10;

fn config(broker: &Broker, embedder: &str) -> String {
    super::common::kafka_config(
        &broker.bootstrap(),
        &format!(
            "documents_topic = \"{DOCS}\"\ndlq_topic = \"{DLQ}\"\ngroup_id = \"{GROUP}\""
        ),
        &format!(
            "[ingest]\nallowed_tenants = [\"squad\"]\nmax_document_bytes = {MAX_DOCUMENT_BYTES}\n[embedder]\nkind = \"http\"\nurl = \"{embedder}\"\ndimension = {DIMENSION}\nbatch_size = 64\n"
        ),
    )
}

/// Produces `count` new documents (SQuAD paragraphs under fresh ids) and returns documents per second
/// until all were applied. The metrics are read every 20 ms: a round lasts one to three seconds here.
fn throughput(
    broker: &Broker,
    job: &mut Job,
    oracle: &mut Oracle,
    paragraphs: &mut impl Iterator<Item = (usize, super::common::oracle::Paragraph)>,
    count: usize,
) -> f64 {
    let applied = |text: &str| {
        super::common::job::metric_labeled(text, "ragstream_documents_total", "outcome=\"applied\"")
    };
    let before = applied(&job.metrics());
    let events: Vec<_> = paragraphs
        .take(count)
        .map(|(n, p)| oracle.upsert("squad", &format!("{}-{n}", p.id), 1, &p.title, &p.text))
        .collect();
    assert_eq!(events.len(), count);
    let started = Instant::now();
    broker.produce(DOCS, &events);
    let deadline = started + Duration::from_secs(300);
    while applied(&job.metrics()) < before + count as f64 {
        assert!(Instant::now() < deadline, "the batch was never applied");
        std::thread::sleep(Duration::from_millis(20));
    }
    count as f64 / started.elapsed().as_secs_f64()
}

#[test]
fn poison_records_are_dead_lettered_and_the_stream_goes_on_at_full_speed() {
    let broker = Broker::start();
    broker.create_topic(DOCS, PARTITIONS);
    broker.create_topic(DLQ, 1);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut job = Job::start(
        dir.path(),
        &config(&broker, &EmbeddingServer::start().url),
        2,
    );
    job.wait_ready(Duration::from_secs(60));
    let mut oracle = Oracle::default();
    // Cycled with a counter in the id: more documents than SQuAD has paragraphs.
    let mut paragraphs = squad().into_iter().cycle().enumerate();
    // Warm up, then measure.
    throughput(&broker, &mut job, &mut oracle, &mut paragraphs, 300);
    let mut before: Vec<f64> = (0..ROUNDS)
        .map(|_| throughput(&broker, &mut job, &mut oracle, &mut paragraphs, ROUND))
        .collect();

    let upsert = |tenant: &str, id: &str, kind: &str, text: &str| {
        serde_json::json!({
            "op": "upsert", "tenant": tenant, "doc_id": id, "version": 1, "source": id,
            "kind": kind, "text": text,
        })
        .to_string()
        .into_bytes()
    };
    let huge = upsert(
        "squad",
        "huge",
        "prose",
        &"an oversized document of prose. ".repeat(20_000),
    );
    let poison: Vec<(&str, &str, Vec<u8>)> = vec![
        (
            "malformed_json",
            "squad/malformed",
            b"{\"op\": \"upsert\", \"tenant\": ".to_vec(),
        ),
        ("invalid_utf8", "squad/utf8", {
            let mut bytes = upsert("squad", "utf8", "prose", "ok");
            bytes.splice(10..10, [0xff, 0xfe, 0xfd]);
            bytes
        }),
        ("oversize", "squad/huge", huge),
        (
            "missing_field",
            "squad/missing",
            br#"{"op":"upsert","tenant":"squad","doc_id":"missing","version":1}"#.to_vec(),
        ),
        (
            "unknown_tenant",
            "intruder/doc",
            upsert("intruder", "doc", "prose", "Not our tenant."),
        ),
        (
            "unknown_kind",
            "squad/kind",
            upsert("squad", "kind", "spreadsheet", "A1;B2"),
        ),
        (
            "embedding_dimension",
            "squad/dimension",
            upsert(
                "squad",
                "dimension",
                "prose",
                "WRONG-DIMENSION makes the embedder answer 7-d vectors.",
            ),
        ),
    ];
    let producer: BaseProducer = broker
        .client()
        .set("message.max.bytes", "60000000")
        .create()
        .expect("producer");
    for (_, key, value) in &poison {
        producer
            .send(BaseRecord::to(DOCS).key(*key).payload(value.as_slice()))
            .expect("queued");
    }
    producer.flush(Duration::from_secs(120)).expect("flushed");
    // Good documents in the same stream, after the poison.
    let mut after: Vec<f64> = (0..ROUNDS)
        .map(|_| throughput(&broker, &mut job, &mut oracle, &mut paragraphs, ROUND))
        .collect();
    wait_committed(&broker, GROUP, DOCS, PARTITIONS, &job);
    let metrics = job.metrics();
    let rss = job.peak_rss_bytes().unwrap_or(0);
    let log = job.log();
    assert!(job.stop().success());

    let records = broker.read_all(DLQ, poison.len());
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for (key, value, headers) in &records {
        let reason = headers
            .iter()
            .find(|(name, _)| name == "reason")
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default();
        *reasons.entry(reason).or_default() += 1;
        assert!(
            value.as_ref().map_or(0, Vec::len) <= 1 << 20,
            "the DLQ record of {key:?} keeps at most a bounded prefix"
        );
    }
    let expected: BTreeMap<String, usize> = poison
        .iter()
        .map(|(reason, _, _)| (reason.to_string(), 1))
        .collect();
    // Other work on a shared machine only ever slows a round down, so the fastest round of each phase
    // is the closest reading of the job's capacity; the medians are printed alongside.
    let fastest = |rounds: &[f64]| rounds.iter().copied().fold(0.0, f64::max);
    let (before_best, after_best) = (fastest(&before), fastest(&after));
    let (before_median, after_median) = (median(&mut before), median(&mut after));
    let ratio = after_best / before_best;
    println!(
        "FAULT poison input: {} poison records, DLQ reasons {reasons:?}; throughput (fastest of {ROUNDS} rounds of {ROUND}) {before_best:.0} docs/s before, {after_best:.0} docs/s after (ratio {ratio:.2}; medians {before_median:.0} and {after_median:.0}); dlq metric {}; peak RSS {:.0} MiB",
        poison.len(),
        metric(&metrics, "ragstream_dlq_records_total"),
        rss as f64 / 1048576.0
    );
    assert_eq!(
        reasons, expected,
        "each poison record in the DLQ once, with its reason"
    );
    assert!(
        ratio >= 0.9,
        "throughput after the poison fell by more than 10%"
    );
    assert!(
        !log.contains(
            "an oversized document of prose. an oversized document of prose. an oversized document of prose. an"
        ),
        "the log echoes the oversized document"
    );
    let (lost, stale, example) = super::support::lost_stale(&oracle, dir.path());
    assert_eq!((lost, stale), (0, 0), "{example}");
}
