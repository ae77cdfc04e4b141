//! Invalidation of published contexts, end to end through a real Kafka-protocol broker (Tansu): a
//! context is published; a change to a chunk it does not cite invalidates nothing; a change to a chunk
//! it cites publishes exactly one invalidation naming that chunk, on the invalidations topic and at
//! `GET /v1/invalidations`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::common::broker::Broker;
use crate::common::job::{http_get, metric, Job};
use ragstream_core::query::invalidate::Invalidation;
use ragstream_core::query::Context;
use serde_json::{json, Value};

const DOCS: &str = "inv-docs";
const QUERIES: &str = "inv-queries";
const CONTEXTS: &str = "inv-contexts";
const INVALIDATIONS: &str = "inv-invalidations";
const DLQ: &str = "inv-dlq";

const OFFICE: &str = "The Acme office is located in Lisbon, near the river. Visitors sign in at the front desk and wait for their host.";
const CAFETERIA: &str = "The cafeteria serves lunch from noon. Coffee is free for employees, and the kitchen closes at three.";

fn document(doc_id: &str, version: u64, text: &str) -> (String, Option<Vec<u8>>) {
    let value = json!({
        "op": "upsert", "tenant": "acme", "doc_id": doc_id, "version": version,
        "source": format!("acme/{doc_id}"), "kind": "prose", "title": doc_id, "text": text,
    });
    (
        format!("acme/{doc_id}"),
        Some(value.to_string().into_bytes()),
    )
}

fn query(id: &str, text: &str, extra: Value) -> (String, Option<Vec<u8>>) {
    let mut value = json!({"query_id": id, "tenant": "acme", "text": text});
    for (k, v) in extra.as_object().expect("object") {
        value[k] = v.clone();
    }
    (id.to_string(), Some(value.to_string().into_bytes()))
}

/// Waits until the contexts topic holds `wanted`; returns them by query id.
fn contexts(broker: &Broker, wanted: &[&str], total: usize) -> HashMap<String, Context> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let by_id: HashMap<String, Context> = broker
            .read_all(CONTEXTS, total)
            .into_iter()
            .map(|(_, value, _)| {
                let context: Context = serde_json::from_slice(&value.expect("value")).unwrap();
                (context.query_id.clone(), context)
            })
            .collect();
        if wanted.iter().all(|id| by_id.contains_key(*id)) {
            return by_id;
        }
        assert!(Instant::now() < deadline, "contexts missing: {wanted:?}");
    }
}

fn logged(port: u16, since: u64) -> (Vec<Invalidation>, u64) {
    let (status, body) = http_get(port, &format!("/v1/invalidations?since={since}")).expect("GET");
    assert_eq!(status, 200, "{body}");
    let body: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(body["truncated"], false);
    (
        serde_json::from_value(body["invalidations"].clone()).expect("invalidations"),
        body["last"].as_u64().expect("last"),
    )
}

#[test]
fn a_change_to_a_cited_chunk_invalidates_the_context_once_and_an_uncited_change_never() {
    let broker = Broker::start();
    broker.create_topic(DOCS, 1);
    for topic in [QUERIES, CONTEXTS, INVALIDATIONS, DLQ] {
        broker.create_topic(topic, 1);
    }
    let config = crate::common::kafka_config(
        &broker.bootstrap(),
        &format!(
            "documents_topic = \"{DOCS}\"\nqueries_topic = \"{QUERIES}\"\ncontexts_topic = \"{CONTEXTS}\"\ninvalidations_topic = \"{INVALIDATIONS}\"\ndlq_topic = \"{DLQ}\"\ngroup_id = \"ragstream-invalidations-it\""
        ),
        "",
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let mut job = Job::start(dir.path(), &config, 1);
    job.wait_ready(Duration::from_secs(120));
    broker.produce(
        DOCS,
        &[
            document("office", 1, OFFICE),
            document("cafeteria", 1, CAFETERIA),
        ],
    );
    job.wait_for(Duration::from_secs(120), "both documents indexed", |m| {
        metric(m, "ragstream_chunks_upserted_total") >= 2.0
    });

    // The context under watch cites the office document only.
    broker.produce(
        QUERIES,
        &[query(
            "watched",
            "Where is the Acme office?",
            json!({"filters": {"doc_ids": ["office"]}}),
        )],
    );
    let watched = contexts(&broker, &["watched"], 1)
        .remove("watched")
        .unwrap();
    assert!(watched.error.is_none(), "{:?}", watched.error);
    let cited: Vec<String> = watched.items.iter().map(|i| i.chunk_id.clone()).collect();
    assert!(!cited.is_empty());
    assert!(watched.items.iter().all(|i| i.doc_id == "office"));

    // A change to a chunk it does not cite: once the index has it (a read-your-writes query on that
    // document answers), nothing is invalidated.
    broker.produce(
        DOCS,
        &[document(
            "cafeteria",
            2,
            "The cafeteria serves lunch from one. Tea is free for everyone, and the kitchen closes at four.",
        )],
    );
    broker.produce(
        QUERIES,
        &[query(
            "probe-cafeteria",
            "When does the cafeteria serve lunch?",
            json!({"consistency": "read_your_writes", "filters": {"doc_ids": ["cafeteria"]}}),
        )],
    );
    let probe = contexts(&broker, &["probe-cafeteria"], 2)
        .remove("probe-cafeteria")
        .unwrap();
    assert!(probe.context.contains("from one"), "{}", probe.context);
    std::thread::sleep(Duration::from_secs(2));
    let (entries, last) = logged(job.http_port, 0);
    assert!(
        entries.is_empty(),
        "an uncited change invalidated {entries:?}"
    );
    assert_eq!(last, 0);

    // A change to the cited chunk: exactly one invalidation, naming it.
    broker.produce(
        DOCS,
        &[document(
            "office",
            2,
            "The Acme office moved to Porto, next to the quokka statue. Visitors sign in upstairs.",
        )],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let entries = loop {
        let (entries, _) = logged(job.http_port, 0);
        if !entries.is_empty() || Instant::now() > deadline {
            break entries;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(entries.len(), 1, "{entries:?}");
    let invalidation = &entries[0];
    assert_eq!(invalidation.seq, 1);
    assert_eq!(invalidation.query_id, "watched");
    assert_eq!(invalidation.tenant, "acme");
    let mut expected = cited.clone();
    expected.sort();
    expected.dedup();
    assert_eq!(invalidation.stale_chunk_ids, expected);
    assert!(invalidation.index_watermark.frontier_ms > 0);
    assert!(logged(job.http_port, 1).0.is_empty(), "since=1 skips it");

    // The same record on the invalidations topic, keyed by the query id.
    let published = broker.read_all(INVALIDATIONS, 1);
    assert_eq!(published.len(), 1);
    let (key, value, _) = &published[0];
    assert_eq!(key.as_deref(), Some(b"watched".as_slice()));
    let on_topic: Invalidation = serde_json::from_slice(value.as_ref().unwrap()).unwrap();
    assert_eq!(&on_topic, invalidation);
    let instance: Value = serde_json::from_slice(value.as_ref().unwrap()).unwrap();
    let case = crate::api::topic_case("invalidation", instance, "invalidation".into(), true);
    crate::api::check_schemas(&job.dir, None, &[case]);

    // Told once: the context's citations are gone, so another change finds nobody.
    broker.produce(DOCS, &[document("office", 3, OFFICE)]);
    broker.produce(
        QUERIES,
        &[query(
            "probe-office",
            "Where is the Acme office?",
            json!({"consistency": "read_your_writes", "filters": {"doc_ids": ["cafeteria"]}}),
        )],
    );
    contexts(&broker, &["probe-office"], 3);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(logged(job.http_port, 0).0.len(), 1);
    let metrics = job.metrics();
    assert_eq!(metric(&metrics, "ragstream_invalidations_total"), 1.0);
}
