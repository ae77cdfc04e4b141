//! Ingest through a real Kafka-protocol broker (Tansu) into the real index engine with the real model:
//! the SQuAD paragraphs, then shrinking updates, deletes, tombstones, out-of-order old versions and
//! malformed events, then edits at the head, middle and tail of long documents. The index must equal
//! the oracle exactly, unchanged chunks must not be re-embedded (an edit embeds at most 3 chunks),
//! bad events must land in the DLQ with their reasons, and committed offsets must reach the end of
//! every partition. The same test runs into a Qdrant server (`index.kind = "server"`), which is then
//! SIGKILLed and restarted: it must still hold the same chunks. Another test kills the job with SIGKILL
//! mid-stream and restarts it.

use std::time::{Duration, Instant};

use crate::common::broker::Broker;
use crate::common::job::{metric, metric_labeled, Job};
use crate::common::oracle::{compare, default_chunker, index_contents, squad, Oracle};
use crate::common::qdrant::QdrantServer;

const DOCS: &str = "docs";
const DLQ: &str = "dlq";
const PARTITIONS: i32 = 3;
const GROUP: &str = "ragstream-it";

fn config(broker: &Broker) -> String {
    crate::common::kafka_config(
        &broker.bootstrap(),
        &format!(
            "documents_topic = \"{DOCS}\"\ndlq_topic = \"{DLQ}\"\ngroup_id = \"{GROUP}\"\nmax_batch = 256\nmax_in_flight = 2048"
        ),
        "[ingest]\nmax_document_bytes = 20000",
    )
}

fn first_sentence(text: &str) -> String {
    match text.find(". ") {
        Some(end) => text[..=end].to_string(),
        None => text.to_string(),
    }
}

/// Waits until the job has consumed `events` source events and has nothing in flight.
fn wait_consumed(job: &mut Job, events: usize, timeout: Duration) -> String {
    job.wait_for(
        timeout,
        &format!("{events} events consumed and acknowledged"),
        |m| {
            metric(m, "ragstream_source_events_total") as usize >= events
                && metric(m, "ragstream_in_flight_messages") == 0.0
        },
    )
}

#[test]
fn squad_through_kafka_equals_the_oracle() {
    squad_through_kafka(None);
}

/// The same with `index.kind = "server"`: the production backend, a Qdrant server on loopback.
#[test]
fn squad_through_kafka_into_a_qdrant_server_equals_the_oracle() {
    let Some(mut server) = QdrantServer::start() else {
        return;
    };
    squad_through_kafka(Some(&server));
    // What the server acknowledged survives a SIGKILL of the server.
    let before = server.contents(SERVER_COLLECTION);
    server.kill_and_restart();
    let after = server.contents(SERVER_COLLECTION);
    assert_eq!(
        before, after,
        "the server's contents after a SIGKILL and restart"
    );
    eprintln!(
        "Qdrant server SIGKILLed and restarted: {} chunks, unchanged",
        after.len()
    );
}

/// The collection of the server variant.
const SERVER_COLLECTION: &str = "squad_oracle";

/// The SQuAD oracle test into the embedded index, or into `server`.
fn squad_through_kafka(server: Option<&QdrantServer>) {
    let broker = Broker::start();
    broker.create_topic(DOCS, PARTITIONS);
    broker.create_topic(DLQ, 1);
    let paragraphs = squad();
    assert_eq!(paragraphs.len(), 2067);
    let mut oracle = Oracle::default();
    let mut events = Vec::new();
    for p in &paragraphs {
        events.push(oracle.upsert("squad", &p.id, 1, &p.title, &p.text));
    }
    // Shrinking updates, then out-of-order old versions of the same documents (ignored).
    for p in &paragraphs[0..100] {
        events.push(oracle.upsert("squad", &p.id, 2, &p.title, &first_sentence(&p.text)));
    }
    for p in &paragraphs[0..30] {
        events.push(oracle.upsert(
            "squad",
            &p.id,
            1,
            &p.title,
            "STALE text that must never be indexed.",
        ));
    }
    // Versioned deletes, then older upserts of deleted documents (ignored); tombstones.
    for p in &paragraphs[100..150] {
        events.push(oracle.delete("squad", &p.id, 3));
    }
    for p in &paragraphs[100..110] {
        events.push(oracle.upsert("squad", &p.id, 2, &p.title, "STALE resurrection."));
    }
    for p in &paragraphs[150..200] {
        events.push(oracle.tombstone("squad", &p.id));
    }
    // Long documents (16 paragraphs each, under the 20 kB limit), edited in phase 2 at the head, the middle and the tail.
    let long: Vec<Vec<String>> = (0..3)
        .map(|i| {
            paragraphs[1000 + 16 * i..1016 + 16 * i]
                .iter()
                .map(|p| p.text.clone())
                .collect()
        })
        .collect();
    for (i, blocks) in long.iter().enumerate() {
        events.push(oracle.upsert(
            "squad",
            &format!("long-{i}"),
            1,
            "Long",
            &blocks.join("\n\n"),
        ));
    }
    let stale_expected = 30 + 10;
    // Malformed events: each must reach the DLQ with its reason.
    let bad: Vec<(String, Option<Vec<u8>>, &str)> = vec![
        (
            "squad/bad-json".into(),
            Some(b"{\"tenant\": \"squad\", oops".to_vec()),
            "malformed_json",
        ),
        (
            "squad/bad-utf8".into(),
            Some(b"{\"tenant\":\"squad\",\"doc_id\":\"bad-utf8\",\"text\":\"\xff\xfe\"}".to_vec()),
            "invalid_utf8",
        ),
        (
            "squad/no-version".into(),
            Some(br#"{"tenant":"squad","doc_id":"no-version","text":"x"}"#.to_vec()),
            "missing_field",
        ),
        (
            "squad/sheet".into(),
            Some(
                br#"{"tenant":"squad","doc_id":"sheet","version":1,"kind":"spreadsheet","text":"x"}"#
                    .to_vec(),
            ),
            "unknown_kind",
        ),
        (
            "squad/report.pdf".into(),
            Some(
                br#"{"tenant":"squad","doc_id":"report.pdf","version":1,"content_base64":"JVBERi0xLjcgYnJva2Vu"}"#
                    .to_vec(),
            ),
            "unparseable",
        ),
        (
            "squad/huge".into(),
            Some(
                format!(
                    r#"{{"tenant":"squad","doc_id":"huge","version":1,"text":"{}"}}"#,
                    "word ".repeat(6000)
                )
                .into_bytes(),
            ),
            "oversize",
        ),
        (
            "squad/other".into(),
            Some(br#"{"tenant":"squad","doc_id":"mismatch","version":1,"text":"x"}"#.to_vec()),
            "bad_key",
        ),
    ];
    for (key, value, _) in &bad {
        events.push((key.clone(), value.clone()));
    }
    let started = Instant::now();
    broker.produce(DOCS, &events);
    eprintln!(
        "produced {} events in {:.1}s",
        events.len(),
        started.elapsed().as_secs_f64()
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let job_config = match server {
        Some(server) => server.index_config(&config(&broker), SERVER_COLLECTION),
        None => config(&broker),
    };
    let mut job = Job::start(dir.path(), &job_config, 1);
    job.wait_ready(Duration::from_secs(60));
    let started = Instant::now();
    let phase1 = wait_consumed(&mut job, events.len(), Duration::from_secs(1200));
    let seconds = started.elapsed().as_secs_f64();
    let upserted = metric(&phase1, "ragstream_chunks_upserted_total");
    eprintln!(
        "phase 1: {} events, {upserted} chunks upserted in {seconds:.1}s ({:.1} chunks/s); embed {:.1}s total, {} word pieces",
        events.len(),
        upserted / seconds,
        metric(&phase1, "ragstream_embed_batch_seconds_sum"),
        metric(&phase1, "ragstream_embed_tokens_total"),
    );
    assert_eq!(
        metric(&phase1, "ragstream_stale_versions_total") as usize,
        stale_expected,
        "stale versions counted"
    );
    for (_, _, reason) in &bad {
        assert_eq!(
            metric_labeled(
                &phase1,
                "ragstream_dlq_records_total",
                &format!("reason=\"{reason}\"")
            ),
            1.0,
            "{reason}"
        );
    }

    // Phase 2: identical re-sends (newer versions, same text) are not re-embedded; real changes are.
    let embedded_before = metric(&phase1, "ragstream_chunks_embedded_total");
    let unchanged_before = metric(&phase1, "ragstream_chunks_unchanged_total");
    let chunker = default_chunker();
    let mut resend = Vec::new();
    let mut identical_chunks = 0;
    let mut changed_new_chunks = 0;
    for p in &paragraphs[200..300] {
        resend.push(oracle.upsert("squad", &p.id, 5, &p.title, &p.text));
        identical_chunks += chunker
            .chunk(
                oracle
                    .live(&ragstream_operators::model::DocKey::new("squad", &p.id))
                    .expect("live"),
            )
            .len();
    }
    for p in &paragraphs[300..305] {
        let key = ragstream_operators::model::DocKey::new("squad", &p.id);
        let before: std::collections::BTreeSet<String> = chunker
            .chunk(oracle.live(&key).expect("live"))
            .into_iter()
            .map(|c| c.content_hash)
            .collect();
        resend.push(oracle.upsert(
            "squad",
            &p.id,
            5,
            &p.title,
            &format!("{} An appended closing sentence changes the tail.", p.text),
        ));
        changed_new_chunks += chunker
            .chunk(oracle.live(&key).expect("live"))
            .into_iter()
            .filter(|c| !before.contains(&c.content_hash))
            .count();
    }
    // One edit per long document: a paragraph inserted at the head, one deleted in the middle, a
    // sentence added to the last. Only the chunks next to an edit are new (at most 3).
    for (i, blocks) in long.iter().enumerate() {
        let key = ragstream_operators::model::DocKey::new("squad", format!("long-{i}"));
        let ids = |oracle: &Oracle| {
            chunker
                .chunk(oracle.live(&key).expect("live"))
                .iter()
                .map(|c| c.point_id(&key))
                .collect::<std::collections::BTreeSet<_>>()
        };
        let before = ids(&oracle);
        let mut edited = blocks.clone();
        match i {
            0 => edited.insert(
                0,
                "A paragraph inserted at the head. It moves every chunk.".into(),
            ),
            1 => {
                edited.remove(10);
            }
            _ => {
                let last = edited.last_mut().expect("paragraphs");
                let cut = last.find(". ").map_or(last.len(), |e| e + 1);
                last.insert_str(cut, " A sentence added near the end.");
            }
        }
        resend.push(oracle.upsert(
            "squad",
            &format!("long-{i}"),
            5,
            "Long",
            &edited.join("\n\n"),
        ));
        let new = ids(&oracle).difference(&before).count();
        assert!(new <= 3, "long-{i}: {new} chunks to embed for one edit");
        changed_new_chunks += new;
    }
    broker.produce(DOCS, &resend);
    let phase2 = wait_consumed(
        &mut job,
        events.len() + resend.len(),
        Duration::from_secs(300),
    );
    let embedded = metric(&phase2, "ragstream_chunks_embedded_total") - embedded_before;
    let unchanged = metric(&phase2, "ragstream_chunks_unchanged_total") - unchanged_before;
    eprintln!("phase 2: {embedded} chunks re-embedded (expected {changed_new_chunks}), {unchanged} unchanged (>= {identical_chunks})");
    assert_eq!(
        embedded as usize, changed_new_chunks,
        "only changed chunks are embedded"
    );
    assert!(
        unchanged as usize >= identical_chunks,
        "identical re-sends are counted unchanged"
    );

    // Stop gracefully; committed offsets reach the end of every partition.
    let status = job.stop();
    assert!(status.success(), "job exit {status}; log:\n{}", job.log());
    let high = broker.high_watermarks(DOCS, PARTITIONS);
    let committed = broker.committed(GROUP, DOCS, PARTITIONS);
    assert_eq!(
        committed, high,
        "committed offsets at the end of each partition"
    );

    // The index equals the oracle exactly.
    let expected = oracle.expected(&chunker);
    let actual = match server {
        Some(server) => server.contents(SERVER_COLLECTION),
        None => index_contents(&dir.path().join("index")),
    };
    let (lost, stale, example) = compare(&expected, &actual);
    assert_eq!((lost, stale), (0, 0), "{example}");
    eprintln!(
        "index ({}): {} chunks, equal to the oracle",
        if server.is_some() {
            "Qdrant server"
        } else {
            "embedded"
        },
        actual.len()
    );

    // DLQ records carry reason, error and source offset.
    let dlq = broker.read_all(DLQ, bad.len());
    assert_eq!(dlq.len(), bad.len());
    let mut reasons: Vec<String> = dlq
        .iter()
        .map(|(_, _, headers)| {
            let header = |name: &str| {
                headers
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            };
            assert!(
                header("offset").is_some()
                    && header("partition").is_some()
                    && header("error").is_some(),
                "{headers:?}"
            );
            assert_eq!(header("topic").as_deref(), Some(DOCS));
            header("reason").expect("reason")
        })
        .collect();
    reasons.sort();
    let mut wanted: Vec<String> = bad.iter().map(|(_, _, r)| r.to_string()).collect();
    wanted.sort();
    assert_eq!(reasons, wanted);
}

#[test]
fn sigkill_mid_stream_then_updates_leave_nothing_stale() {
    let broker = Broker::start();
    broker.create_topic(DOCS, PARTITIONS);
    broker.create_topic(DLQ, 1);
    let paragraphs: Vec<_> = squad().into_iter().take(600).collect();
    let mut oracle = Oracle::default();
    let events: Vec<_> = paragraphs
        .iter()
        .map(|p| oracle.upsert("squad", &p.id, 1, &p.title, &p.text))
        .collect();
    broker.produce(DOCS, &events);

    let dir = tempfile::tempdir().expect("tempdir");
    let mut job = Job::start(dir.path(), &config(&broker), 1);
    job.wait_ready(Duration::from_secs(60));
    job.wait_for(Duration::from_secs(300), "some chunks indexed", |m| {
        metric(m, "ragstream_chunks_upserted_total") >= 150.0
    });
    job.kill();
    let killed_at = Instant::now();
    job.restart(1);
    job.wait_ready(Duration::from_secs(60));
    eprintln!(
        "restarted and ready in {:.2}s after SIGKILL",
        killed_at.elapsed().as_secs_f64()
    );
    job.wait_for(
        Duration::from_secs(60),
        "hydration of what was indexed before the kill",
        |m| metric(m, "ragstream_chunks_hydrated_total") >= 150.0,
    );
    // The restarted job consumes what was not committed; wait until the group reaches the end.
    let high = broker.high_watermarks(DOCS, PARTITIONS);
    let deadline = Instant::now() + Duration::from_secs(600);
    while broker.committed(GROUP, DOCS, PARTITIONS) != high {
        assert!(
            Instant::now() < deadline,
            "committed offsets never reached the end; log:\n{}",
            job.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Updates and deletes of documents indexed before the kill.
    let mut updates = Vec::new();
    for p in &paragraphs[0..60] {
        updates.push(oracle.upsert("squad", &p.id, 2, &p.title, &first_sentence(&p.text)));
    }
    for p in &paragraphs[60..100] {
        updates.push(oracle.delete("squad", &p.id, 2));
    }
    for p in &paragraphs[100..120] {
        updates.push(oracle.tombstone("squad", &p.id));
    }
    broker.produce(DOCS, &updates);
    let high = broker.high_watermarks(DOCS, PARTITIONS);
    while broker.committed(GROUP, DOCS, PARTITIONS) != high {
        assert!(
            Instant::now() < deadline,
            "updates never committed; log:\n{}",
            job.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let status = job.stop();
    assert!(status.success(), "job exit {status}");
    let expected = oracle.expected(&default_chunker());
    let actual = index_contents(&dir.path().join("index"));
    let (lost, stale, example) = compare(&expected, &actual);
    assert_eq!((lost, stale), (0, 0), "{example}");
}
