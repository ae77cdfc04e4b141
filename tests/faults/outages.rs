//! Case 2, the broker killed for 30 s and restarted, case 3, the index unavailable (writes fail
//! through the store trait while a marker file exists, `RAGSTREAM_FAULT_INDEX_DOWN`), case 3b, the
//! index refusing one document for good and another for 20 s (`RAGSTREAM_FAULT_INDEX_RULES`), and
//! case 4, the embedding server down for 20 s while queries are served. The job must not crash, must not advance
//! offsets past what the index holds, must keep memory bounded, and must drain the lag afterwards with
//! nothing lost; during an embedder outage queries keep answering without waiting on it.

use std::time::{Duration, Instant};

use ragstream_operators::faults;

use super::common::broker::Broker;
use super::common::job::{http_get, http_post_json, metric, metric_labeled, Job};
use super::common::oracle::{compare, default_chunker, index_contents, squad, Oracle};
use super::common::qdrant::QdrantServer;
use super::support::{
    broker_with_topics, docs_with_runbook, embedder_section, group_config, hold_outage, lost_stale,
    wait_committed, EmbeddingServer, Workload, DLQ, DOCS,
};

const PARTITIONS: i32 = 2;

/// librdkafka's prefetch is 4 MiB (these documents are ~1 KiB; the 64 MiB default is sized for 50 MB documents): while
/// the index is down the workers do not poll, and the prefetch is what fills.
/// `sections`: further TOML sections (the embedder).
fn config(broker: &Broker, group: &str, sections: &str) -> String {
    group_config(broker, group, "prefetch_kbytes = 4096", sections)
}

fn setup() -> Broker {
    broker_with_topics(PARTITIONS)
}

#[test]
fn broker_down_for_30_seconds_then_back_loses_nothing() {
    let mut broker = setup();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut workload = Workload::new(11, 600);
    broker.produce(DOCS, &workload.batch(60));
    // One worker: this case is about the outage, not about group membership
    // (tests/faults/rebalance.rs covers that).
    let mut job = Job::start(dir.path(), &config(&broker, "outage", ""), 1);
    job.wait_ready(Duration::from_secs(60));
    wait_committed(&broker, "outage", DOCS, PARTITIONS, &job);

    // A read-your-writes query fetches the documents topic's watermarks; with the broker down that
    // takes seconds of timeouts, off the worker, so a query sent after it is answered meanwhile. One
    // before the outage lists the topic's partitions.
    let ask = |port: u16, id: &str, consistency: &str| {
        let body = serde_json::json!({"query_id": id, "tenant": "squad", "text": "when was the university founded",
            "token_budget": 300, "consistency": consistency})
        .to_string();
        let started = Instant::now();
        let (status, answer) = http_post_json(port, "/v1/query", &body).expect("query answered");
        assert_eq!(status, 200, "{answer}");
        started.elapsed().as_secs_f64()
    };
    assert!(ask(job.http_port, "ryw-up", "read_your_writes") < 10.0);
    broker.kill();
    let down = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let port = job.http_port;
    let ryw = std::thread::spawn(move || ask(port, "ryw-down", "read_your_writes"));
    std::thread::sleep(Duration::from_millis(300));
    let eventual_seconds = ask(port, "eventual-down", "eventual");
    let ryw_seconds = ryw.join().expect("read_your_writes answered");
    let mut saw_unready = false;
    while down.elapsed() < Duration::from_secs(30) {
        assert!(
            job.running(),
            "the job died with the broker:\n{}",
            job.log()
        );
        assert_eq!(http_get(job.http_port, "/healthz").map(|r| r.0), Some(200));
        saw_unready |= http_get(job.http_port, "/readyz").is_some_and(|r| r.0 == 503);
        std::thread::sleep(Duration::from_millis(500));
    }
    broker.restart();
    let back = Instant::now();
    broker.produce(DOCS, &workload.batch(60));
    wait_committed(&broker, "outage", DOCS, PARTITIONS, &job);
    let recovery = back.elapsed().as_secs_f64();
    let rss = job.peak_rss_bytes().unwrap_or(0);
    let dlq = metric(&job.metrics(), "ragstream_dlq_records_total");
    assert!(job.stop().success());
    let (lost, stale, example) = lost_stale(&workload.oracle, dir.path());
    println!(
        "FAULT broker down 30 s: {} events; job alive throughout, /readyz 503 while down: {saw_unready}; a read_your_writes query answered in {ryw_seconds:.2} s, an eventual one sent 0.3 s after it in {eventual_seconds:.2} s; lag drained {recovery:.1} s after the restart; lost {lost}, stale {stale}, DLQ {dlq}; peak RSS {:.0} MiB",
        workload.produced,
        rss as f64 / 1048576.0
    );
    assert!(
        eventual_seconds < 1.5,
        "an eventual query waited {eventual_seconds:.2} s behind a read_your_writes query's watermark fetch"
    );
    assert!(saw_unready, "/readyz never reported the broker down");
    assert_eq!((lost, stale), (0, 0), "{example}");
    assert_eq!(dlq, 0.0);
}

#[test]
fn index_unavailable_pauses_consumption_and_loses_nothing() {
    let broker = setup();
    let dir = tempfile::tempdir().expect("tempdir");
    let marker = dir.path().join("index-down");
    let marker_env = marker.display().to_string();
    let mut workload = Workload::new(13, 1500);
    broker.produce(DOCS, &workload.batch(300));
    // The suite's embedding stand-in, so memory figures are the pipeline's, not the model's working set
    // (which varies with the longest text of a batch).
    let embedder = EmbeddingServer::start();
    let sections = embedder_section(&embedder.url);
    let mut job = Job::start_with_env(
        dir.path(),
        &config(&broker, "index", &sections),
        2,
        &[(faults::INDEX_DOWN_ENV, &marker_env)],
    );
    job.wait_ready(Duration::from_secs(60));
    wait_committed(&broker, "index", DOCS, PARTITIONS, &job);
    let committed_before = broker.committed("index", DOCS, PARTITIONS);
    // The high-water mark so far.
    let rss_before = job.peak_rss_bytes().unwrap_or(0);

    // The index goes down; ten times as many events arrive as before.
    std::fs::write(&marker, "").expect("marker");
    let down = Instant::now();
    broker.produce(DOCS, &workload.batch(600));
    let mut rss_down = 0u64;
    while down.elapsed() < Duration::from_secs(30) {
        assert!(job.running(), "the job died with the index:\n{}", job.log());
        rss_down = rss_down.max(job.rss_bytes().unwrap_or(0));
        assert_eq!(
            broker.committed("index", DOCS, PARTITIONS),
            committed_before,
            "offsets advanced while the index was down"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let metrics = job.metrics();
    let retries = metric(&metrics, "ragstream_retries_total");
    let in_flight = metric(&metrics, "ragstream_in_flight_messages");
    std::fs::remove_file(&marker).expect("index back");
    let back = Instant::now();
    wait_committed(&broker, "index", DOCS, PARTITIONS, &job);
    let recovery = back.elapsed().as_secs_f64();
    let dlq = metric(&job.metrics(), "ragstream_dlq_records_total");
    assert!(job.stop().success());
    let (lost, stale, example) = lost_stale(&workload.oracle, dir.path());
    println!(
        "FAULT index unavailable 30 s: {} events; offsets held at {committed_before:?}; {retries} write retries, {in_flight} messages in flight while down; peak RSS {:.0} MiB before, at most {:.0} MiB while down; drained {recovery:.1} s after the index came back; lost {lost}, stale {stale}, DLQ {dlq}",
        workload.produced,
        rss_before as f64 / 1048576.0,
        rss_down as f64 / 1048576.0
    );
    assert!(retries > 0.0, "writes were retried");
    assert!(
        rss_down < rss_before + 128 * 1024 * 1024,
        "memory grew by more than 128 MiB over its earlier peak while the index was down"
    );
    assert_eq!((lost, stale), (0, 0), "{example}");
    assert_eq!(dlq, 0.0);
}

#[test]
fn index_refusing_documents_dead_letters_one_retries_the_other_and_loses_nothing() {
    const REFUSED: &str = "doc-7";
    const DELAYED: &str = "doc-21";
    let broker = setup();
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("index-rules");
    std::fs::write(&rules, format!("refuse {REFUSED}\nunavailable {DELAYED}\n")).expect("rules");
    let embedder = EmbeddingServer::start();
    let sections = embedder_section(&embedder.url);
    let rules_env = rules.display().to_string();
    let mut job = Job::start_with_env(
        dir.path(),
        &config(&broker, "refuse", &sections),
        2,
        &[(faults::INDEX_RULES_ENV, &rules_env)],
    );
    job.wait_ready(Duration::from_secs(60));
    // One event at a time, so each document's partition and offset are known.
    let mut oracle = Oracle::default();
    let mut offsets = std::collections::BTreeMap::new();
    for (n, paragraph) in squad().iter().take(40).enumerate() {
        let doc_id = format!("doc-{n}");
        let event = oracle.upsert("squad", &doc_id, 1, &paragraph.title, &paragraph.text);
        offsets.insert(doc_id, produce_located(&broker, event));
    }
    let (refused_partition, refused_offset) = offsets[REFUSED];
    let (delayed_partition, delayed_offset) = offsets[DELAYED];

    // 20 s of the delayed document's outage: offsets never pass it, and pass the refused one only
    // once its DLQ record is written.
    let outage = Instant::now();
    let mut dlq_seen_before_commit = None;
    while outage.elapsed() < Duration::from_secs(20) {
        assert!(job.running(), "the job died:\n{}", job.log());
        let committed = broker.committed("refuse", DOCS, PARTITIONS);
        assert!(
            committed[delayed_partition] <= delayed_offset,
            "offsets passed {DELAYED} while the index refused it as unavailable: {committed:?}"
        );
        if dlq_seen_before_commit.is_none() && committed[refused_partition] > refused_offset {
            dlq_seen_before_commit = Some(!broker.read_all(DLQ, 1).is_empty());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let retries = metric(&job.metrics(), "ragstream_retries_total");
    std::fs::write(&rules, format!("refuse {REFUSED}\n")).expect("rules");
    let back = Instant::now();
    wait_committed(&broker, "refuse", DOCS, PARTITIONS, &job);
    let drained = back.elapsed().as_secs_f64();
    if dlq_seen_before_commit.is_none() {
        dlq_seen_before_commit = Some(!broker.read_all(DLQ, 1).is_empty());
    }
    let metrics = job.metrics();
    let refused_metric = metric_labeled(
        &metrics,
        "ragstream_dlq_records_total",
        "reason=\"index_refused\"",
    );
    let records = broker.read_all(DLQ, 1);
    // The refusal lifted, the same event sent again: it must be indexed now. The ingest state follows
    // what the index holds, not what was sent: an identical re-send is not "unchanged".
    std::fs::write(&rules, "").expect("rules");
    let paragraph = &squad()[7];
    let resent = oracle.upsert("squad", REFUSED, 1, &paragraph.title, &paragraph.text);
    broker.produce(DOCS, &[resent]);
    wait_committed(&broker, "refuse", DOCS, PARTITIONS, &job);
    assert!(job.stop().success());

    let refused_key = format!("squad/{REFUSED}");
    let expected = oracle.expected(&default_chunker());
    let actual = index_contents(&dir.path().join("index"));
    let (lost, stale, example) = compare(&expected, &actual);
    let reasons: Vec<(Option<String>, String)> = records
        .iter()
        .map(|(key, _, headers)| {
            let reason = headers
                .iter()
                .find(|(name, _)| name == "reason")
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default();
            (
                key.as_ref()
                    .map(|k| String::from_utf8_lossy(k).into_owned()),
                reason,
            )
        })
        .collect();
    println!(
        "FAULT index refuses {REFUSED} for good and {DELAYED} for 20 s: 40 documents; {retries} write retries; offsets held before {DELAYED} for 20 s; DLQ {reasons:?} (written before the offsets passed {REFUSED}: {dlq_seen_before_commit:?}); drained {drained:.1} s after the outage; {REFUSED} sent again once the index took it: lost {lost}, stale {stale}"
    );
    assert_eq!(
        reasons,
        vec![(Some(refused_key.clone()), "index_refused".to_string())]
    );
    let value: serde_json::Value =
        serde_json::from_slice(records[0].1.as_deref().unwrap_or_default()).expect("an event");
    assert_eq!(
        (value["doc_id"].as_str(), value["text"].as_str()),
        (Some(REFUSED), Some(squad()[7].text.as_str())),
        "the refused document's event is its value"
    );
    assert_eq!(refused_metric, 1.0);
    assert_eq!(dlq_seen_before_commit, Some(true));
    assert!(retries > 0.0, "the delayed document's writes were retried");
    assert!(
        actual.iter().any(|(key, _, _, _)| key == &refused_key),
        "the refused document, sent again, is in the index"
    );
    assert_eq!((lost, stale), (0, 0), "{example}");
}

/// Round trip of one `POST /v1/query` in ms, with the context.
fn query(job: &Job, id: &str, text: &str, budget: usize) -> (f64, serde_json::Value) {
    let body = serde_json::json!({"query_id": id, "tenant": "squad", "text": text, "token_budget": budget})
        .to_string();
    let started = Instant::now();
    let (status, answer) =
        http_post_json(job.http_port, "/v1/query", &body).expect("query answered");
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(status, 200, "{answer}");
    (ms, serde_json::from_str(&answer).expect("context JSON"))
}

#[test]
fn embedder_down_for_20_seconds_while_queries_are_served() {
    let broker = setup();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut workload = Workload::new(17, 600);
    broker.produce(DOCS, &workload.batch(100));
    let embedder = EmbeddingServer::start();
    let sections = embedder_section(&embedder.url);
    let mut job = Job::start(dir.path(), &config(&broker, "embedder", &sections), 1);
    job.wait_ready(Duration::from_secs(60));
    wait_committed(&broker, "embedder", DOCS, PARTITIONS, &job);
    // Queries whose vectors the job has seen: they need no embedder from now on.
    let texts = [
        "Which team won the Super Bowl?",
        "Where was the game played?",
        "Who performed at halftime?",
        "What did the league announce?",
    ];
    for (i, text) in texts.iter().enumerate() {
        query(&job, &format!("warm-{i}"), text, 400);
    }
    let committed_before = broker.committed("embedder", DOCS, PARTITIONS);

    embedder.set_down(true);
    let down = Instant::now();
    broker.produce(DOCS, &workload.batch(200));
    let mut cached = Vec::new();
    let mut serial = 0;
    while down.elapsed() < Duration::from_secs(20) {
        assert!(
            job.running(),
            "the job died with the embedder:\n{}",
            job.log()
        );
        // Another budget each time: no context-cache hit, the vector from the embedding cache.
        let text = texts[serial % texts.len()];
        let (ms, context) = query(&job, &format!("down-{serial}"), text, 500 + serial);
        assert!(context["error"].is_null(), "{context}");
        cached.push(ms);
        serial += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    // A query the job has never seen answers at once from the BM25 lane and says why.
    let (new_ms, context) = query(&job, "down-new", "When did the stadium open?", 500);
    let notes = context["note"].as_str().unwrap_or_default().to_string();
    assert_eq!(
        broker.committed("embedder", DOCS, PARTITIONS),
        committed_before,
        "offsets advanced past documents that were not embedded"
    );
    let retries = metric(&job.metrics(), "ragstream_retries_total");
    embedder.set_down(false);
    let back = Instant::now();
    wait_committed(&broker, "embedder", DOCS, PARTITIONS, &job);
    let recovery = back.elapsed().as_secs_f64();
    let dlq = metric(&job.metrics(), "ragstream_dlq_records_total");
    assert!(job.stop().success());
    let (lost, stale, example) = lost_stale(&workload.oracle, dir.path());
    let p99 = {
        let mut sorted = cached.clone();
        sorted.sort_by(f64::total_cmp);
        sorted[((sorted.len() - 1) as f64 * 0.99).round() as usize]
    };
    let p50 = super::support::median(&mut cached.clone());
    println!(
        "FAULT embedder down 20 s: {} events; {} cached queries answered while down, p50 {p50:.1} ms, p99 {p99:.1} ms; a new query {new_ms:.0} ms (BM25 lane); {retries} embedder retries; drained {recovery:.1} s after it came back; lost {lost}, stale {stale}, DLQ {dlq}",
        workload.produced,
        cached.len()
    );
    assert!(
        cached.len() >= 100,
        "only {} queries answered in 20 s",
        cached.len()
    );
    assert!(
        p99 <= 100.0,
        "cached queries p99 {p99:.1} ms while the embedder was down"
    );
    assert!(
        new_ms < 1000.0,
        "a new query waited {new_ms:.0} ms on the outage"
    );
    assert!(notes.contains("dense lane unavailable"), "note: {notes:?}");
    assert!(retries > 0.0, "ingest was retried");
    assert_eq!((lost, stale), (0, 0), "{example}");
    assert_eq!(dlq, 0.0);
}

/// `read_your_writes` proves its wait: an update is produced while the embedder takes 3 s a text, then at
/// once a `read_your_writes` and an `eventual` query (their vectors cached, so no model on their path).
/// The first must hold the update and report its wait; the second must answer at once without it.
#[test]
fn read_your_writes_waits_for_an_update_still_being_embedded_and_eventual_does_not() {
    read_your_writes(None);
}

/// The same on the production index, a Qdrant server.
#[test]
fn read_your_writes_on_a_qdrant_server() {
    if let Some(server) = QdrantServer::start() {
        read_your_writes(Some(&server));
    }
}

fn read_your_writes(server: Option<&QdrantServer>) {
    let broker = setup();
    let dir = tempfile::tempdir().expect("tempdir");
    let embedder = EmbeddingServer::start();
    let sections = embedder_section(&embedder.url);
    let mut config = config(&broker, "ryw", &sections);
    if let Some(server) = server {
        config = server.index_config(&config, "ryw");
    }
    let mut job = Job::start(dir.path(), &config, 1);
    job.wait_ready(Duration::from_secs(60));
    let event = |version: u64, text: &str| {
        let body = serde_json::json!({"op": "upsert", "tenant": "squad", "doc_id": "office",
            "version": version, "source": "office.txt", "kind": "prose", "title": "Office", "text": text});
        (
            "squad/office".to_string(),
            Some(body.to_string().into_bytes()),
        )
    };
    broker.produce(
        DOCS,
        &[event(
            1,
            "The Acme office is near the river, by the old mill.",
        )],
    );
    // One document: one partition gets it and the other is never committed, so wait on the index.
    job.wait_for(Duration::from_secs(60), "the first version indexed", |m| {
        metric(m, "ragstream_chunks_upserted_total") >= 1.0
    });
    let question = "Where is the Acme office?";
    let (_, warm) = query(&job, "warm", question, 500);
    assert!(
        warm["context"]
            .as_str()
            .unwrap_or_default()
            .contains("old mill"),
        "{warm}"
    );

    embedder.throttle(Duration::from_secs(3));
    broker.produce(
        DOCS,
        &[event(
            2,
            "The Acme office moved to Porto, next to the quokka statue.",
        )],
    );
    let body = |id: &str, budget: usize, consistency: &str| {
        serde_json::json!({"query_id": id, "tenant": "squad", "text": question,
            "token_budget": budget, "consistency": consistency})
        .to_string()
    };
    let ryw_body = body("ryw", 600, "read_your_writes");
    let port = job.http_port;
    let ryw = std::thread::spawn(move || {
        let started = Instant::now();
        let (status, answer) = http_post_json(port, "/v1/query", &ryw_body).expect("answered");
        (status, answer, started.elapsed().as_secs_f64())
    });
    let started = Instant::now();
    let (status, answer) =
        http_post_json(port, "/v1/query", &body("eventual", 700, "eventual")).expect("answered");
    let eventual_seconds = started.elapsed().as_secs_f64();
    assert_eq!(status, 200, "{answer}");
    let eventual: serde_json::Value = serde_json::from_str(&answer).expect("context");
    let (status, answer, ryw_seconds) = ryw.join().expect("ryw query");
    assert_eq!(status, 200, "{answer}");
    let ryw: serde_json::Value = serde_json::from_str(&answer).expect("context");
    embedder.throttle(Duration::ZERO);
    assert!(job.stop().success());
    let text =
        |context: &serde_json::Value| context["context"].as_str().unwrap_or_default().to_string();
    let waited_ms = ryw["latency_ms"]["consistency_wait"]
        .as_f64()
        .unwrap_or(0.0);
    println!(
        "FAULT read_your_writes under a 3 s/text embedder{}: eventual answered in {eventual_seconds:.2} s without the update; read_your_writes waited {waited_ms:.0} ms (round trip {ryw_seconds:.2} s) and holds it",
        if server.is_some() { ", Qdrant server" } else { "" }
    );
    assert!(
        text(&eventual).contains("old mill") && !text(&eventual).contains("quokka"),
        "eventual saw the update before it was indexed: {eventual}"
    );
    assert!(
        eventual_seconds < 2.0,
        "eventual waited: {eventual_seconds:.2} s"
    );
    assert!(
        text(&ryw).contains("quokka") && !text(&ryw).contains("old mill"),
        "read_your_writes missed the update or served the stale chunk: {ryw}"
    );
    assert!(
        waited_ms >= 2000.0,
        "read_your_writes reported a wait of {waited_ms} ms; the update took 3 s to embed"
    );
}

/// The partition and offset `record` lands at (the high watermarks before and after producing it).
fn produce_located(broker: &Broker, record: (String, Option<Vec<u8>>)) -> (usize, i64) {
    let before = broker.high_watermarks(DOCS, PARTITIONS);
    broker.produce(DOCS, &[record]);
    let after = broker.high_watermarks(DOCS, PARTITIONS);
    let partition = (0..PARTITIONS as usize)
        .find(|&p| after[p] > before[p])
        .expect("one partition grew");
    (partition, before[partition])
}

/// The DLQ topic missing (provisioned by its owner, and not yet: `create_topics = false`; Tansu
/// cannot delete one topic alone): a malformed event must wait for it (its offset and
/// every later one uncommitted, the outage shown by the gauge and `/readyz`) instead of being lost,
/// and once the topic is back the record lands once, with its value, and everything is indexed.
#[test]
fn dlq_topic_missing_pauses_ingest_until_it_is_back_and_loses_nothing() {
    const GROUP: &str = "dlq-missing";
    let broker = Broker::start();
    broker.create_topic(DOCS, PARTITIONS);
    let dir = tempfile::tempdir().expect("tempdir");
    let embedder = EmbeddingServer::start();
    let mut workload = Workload::new(23, 300);
    broker.produce(DOCS, &workload.batch(40));
    let config = group_config(
        &broker,
        GROUP,
        "prefetch_kbytes = 4096\ncreate_topics = false",
        &embedder_section(&embedder.url),
    );
    let mut job = Job::start(dir.path(), &config, 1);
    job.wait_ready(Duration::from_secs(60));
    wait_committed(&broker, GROUP, DOCS, PARTITIONS, &job);

    let malformed = b"{\"op\": \"upsert\", not json".to_vec();
    let (partition, offset) =
        produce_located(&broker, ("squad/malformed".into(), Some(malformed.clone())));
    broker.produce(DOCS, &workload.batch(40));
    let down = Instant::now();
    let (mut gauge, mut readyz) = (0.0, String::new());
    while down.elapsed() < Duration::from_secs(35) {
        assert!(job.running(), "the job died:\n{}", job.log());
        let committed = broker.committed(GROUP, DOCS, PARTITIONS);
        assert!(
            committed[partition] <= offset,
            "offsets passed the malformed event while its DLQ record had nowhere to go: {committed:?}"
        );
        let metrics = job.metrics();
        gauge = metric_labeled(&metrics, "ragstream_outage", "dependency=\"dlq\"");
        if gauge > 0.0 {
            readyz = http_get(job.http_port, "/readyz").expect("readyz").1;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(gauge > 0.0, "no DLQ outage shown:\n{}", job.log());
    assert!(readyz.contains("outage: dlq"), "{readyz}");

    broker.create_topic(DLQ, 1);
    let back = Instant::now();
    wait_committed(&broker, GROUP, DOCS, PARTITIONS, &job);
    let drained = back.elapsed().as_secs_f64();
    let after = metric_labeled(&job.metrics(), "ragstream_outage", "dependency=\"dlq\"");
    let records = broker.read_all(DLQ, 2);
    assert!(job.stop().success());
    let (lost, stale, example) = lost_stale(&workload.oracle, dir.path());
    println!(
        "FAULT DLQ topic missing 35 s: offsets held before the malformed event, outage gauge {gauge}, /readyz {:?}; drained {drained:.1} s after the topic was back; DLQ records {}; lost {lost}, stale {stale}",
        readyz.lines().find(|line| line.starts_with("outage")).unwrap_or_default(),
        records.len()
    );
    assert_eq!(after, 0.0, "the outage ended");
    assert_eq!(records.len(), 1, "one record, delivered once");
    assert_eq!(
        records[0].1.as_deref(),
        Some(&malformed[..]),
        "with its value"
    );
    assert_eq!((lost, stale), (0, 0), "{example}");
}

/// The embedding server answering 401 for 20 s (its key revoked, then restored) while documents
/// arrive: an outage, not a refusal of the documents: offsets held, nothing dead-lettered, the outage
/// shown, everything indexed once it answers again.
#[test]
fn embedder_answering_401_for_20_seconds_pauses_ingest_and_loses_nothing() {
    const GROUP: &str = "embedder-401";
    let broker = setup();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut workload = Workload::new(29, 600);
    broker.produce(DOCS, &workload.batch(60));
    let embedder = EmbeddingServer::start();
    let sections = embedder_section(&embedder.url);
    let mut job = Job::start(dir.path(), &config(&broker, GROUP, &sections), 1);
    job.wait_ready(Duration::from_secs(60));
    wait_committed(&broker, GROUP, DOCS, PARTITIONS, &job);

    embedder.answer_all(401);
    broker.produce(DOCS, &workload.batch(100));
    let gauge = hold_outage(&mut job, &broker, GROUP, PARTITIONS, "embedder", 20);
    let dlq_during = metric(&job.metrics(), "ragstream_dlq_records_total");
    embedder.answer_all(0);
    let back = Instant::now();
    wait_committed(&broker, GROUP, DOCS, PARTITIONS, &job);
    let recovery = back.elapsed().as_secs_f64();
    let dlq = metric(&job.metrics(), "ragstream_dlq_records_total");
    assert!(job.stop().success());
    let (lost, stale, example) = lost_stale(&workload.oracle, dir.path());
    println!(
        "FAULT embedder answering 401 for 20 s: {} events; offsets held, outage gauge {gauge}, DLQ {dlq_during} meanwhile; drained {recovery:.1} s after it answered again; lost {lost}, stale {stale}, DLQ {dlq}",
        workload.produced
    );
    assert!(gauge > 0.0, "no embedder outage shown");
    assert_eq!(
        dlq, 0.0,
        "a document was dead-lettered for the embedder's 401"
    );
    assert_eq!((lost, stale), (0, 0), "{example}");
}

#[test]
fn a_dlq_that_can_never_take_records_stops_the_job_and_the_next_start_writes_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let docs = docs_with_runbook(dir.path());
    // A PDF no reader can open: refused as `unparseable`, so it goes to the DLQ.
    std::fs::write(docs.join("broken.pdf"), b"%PDF-1.7\nnot a pdf at all\n").expect("pdf");
    // The DLQ path is a directory: no write can ever succeed there.
    std::fs::create_dir_all(dir.path().join("dlq-is-a-directory")).expect("a directory");
    let config = |dlq: &str| {
        format!(
            r#"
[source]
kind = "dir"
path = "{{dir}}/docs"
tenant = "acme"
[index]
path = "{{dir}}/index"
[http]
listen = "{{http}}"
[runtime]
dlq_path = "{{dir}}/{dlq}"
"#
        )
    };
    let mut job = Job::start(dir.path(), &config("dlq-is-a-directory"), 1);
    let started = Instant::now();
    let status = job.wait_exit(Duration::from_secs(180));
    let log = job.log();
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(log.contains("the DLQ cannot take records"), "{log}");
    assert!(log.contains("dlq-is-a-directory"), "{log}");
    let stopped = started.elapsed().as_secs_f64();

    // Fixed, the next start reads the refused file again and writes its record.
    let fixed = config("dlq.jsonl")
        .replace("{dir}", &dir.path().display().to_string())
        .replace("{http}", &format!("127.0.0.1:{}", job.http_port));
    std::fs::write(dir.path().join("ragstream.toml"), fixed).expect("config");
    job.restart(1);
    job.wait_ready(Duration::from_secs(120));
    job.wait_indexed(2);
    let records: Vec<serde_json::Value> = std::fs::read_to_string(dir.path().join("dlq.jsonl"))
        .expect("the DLQ file")
        .lines()
        .map(|line| serde_json::from_str(line).expect("a record"))
        .collect();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["origin"], "broken.pdf", "{records:?}");
    assert_eq!(records[0]["reason"], "unparseable", "{records:?}");
    let (status, body) = http_post_json(
        job.http_port,
        "/v1/query",
        r#"{"query_id": "q", "tenant": "acme", "text": "how do I roll back a release"}"#,
    )
    .expect("an answer");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("deployctl rollback"), "{body}");
    job.stop();
    println!(
        "FAULT DLQ path a directory: the job stopped (exit 3, \"the DLQ cannot take records\") {stopped:.1} s after its start, nothing committed; restarted with a file DLQ, the refused PDF's record written once and the good file answered"
    );
}
