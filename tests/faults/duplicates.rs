//! Case 4, duplicate delivery: after everything was indexed and committed, the whole topic is delivered
//! again (a consumer group starting from the earliest offsets, as after a group reset, with the index's
//! own checkpoint removed so it cannot skip what it already holds). The index must be unchanged: the same points, nothing rewritten, nothing re-embedded, nothing stale or lost.

use std::time::Duration;

use super::common::broker::Broker;
use super::common::job::{metric, Job};
use super::common::oracle::{compare, default_chunker, index_contents, squad, Oracle};
use super::support::{broker_with_topics, group_config, wait_committed, DOCS};

const PARTITIONS: i32 = 2;

fn config(broker: &Broker, group: &str) -> String {
    group_config(broker, group, "", "")
}

#[test]
fn redelivering_the_whole_topic_leaves_the_index_unchanged() {
    let broker = broker_with_topics(PARTITIONS);
    let paragraphs: Vec<_> = squad().into_iter().take(80).collect();
    let mut oracle = Oracle::default();
    let mut events: Vec<_> = paragraphs
        .iter()
        .map(|p| oracle.upsert("squad", &p.id, 1, &p.title, &p.text))
        .collect();
    // Shrinks and deletes, so a replay of the old versions would resurrect stale chunks.
    for p in &paragraphs[..10] {
        let short = p.text.split(". ").next().unwrap_or(&p.text).to_string();
        events.push(oracle.upsert("squad", &p.id, 2, &p.title, &short));
    }
    for p in &paragraphs[10..15] {
        events.push(oracle.delete("squad", &p.id, 2));
    }
    broker.produce(DOCS, &events);

    let dir = tempfile::tempdir().expect("tempdir");
    let mut job = Job::start(dir.path(), &config(&broker, "first"), 1);
    job.wait_ready(Duration::from_secs(60));
    wait_committed(&broker, "first", DOCS, PARTITIONS, &job);
    assert!(job.stop().success());
    let before = index_contents(&dir.path().join("index"));
    let expected = oracle.expected(&default_chunker());
    assert_eq!(
        compare(&expected, &before).0 + compare(&expected, &before).1,
        0
    );

    // Every event again, to the same index, through a group that starts from the earliest offsets.
    std::fs::remove_file(
        dir.path()
            .join("index")
            .join(format!("checkpoint-{DOCS}.json")),
    )
    .expect("the index kept a checkpoint");
    let mut job = Job::start(dir.path(), &config(&broker, "replay"), 1);
    job.wait_ready(Duration::from_secs(60));
    let seconds = wait_committed(&broker, "replay", DOCS, PARTITIONS, &job);
    let metrics = job.metrics();
    let delivered = metric(&metrics, "ragstream_source_events_total");
    let upserted = metric(&metrics, "ragstream_chunks_upserted_total");
    let deleted = metric(&metrics, "ragstream_chunks_deleted_total");
    let embedded = metric(&metrics, "ragstream_embed_texts_total");
    assert!(job.stop().success());
    let after = index_contents(&dir.path().join("index"));
    let (lost, stale, example) = compare(&expected, &after);
    println!(
        "FAULT duplicate delivery: {delivered} events delivered again in {seconds:.1} s; points {} before, {} after; upserted {upserted}, deleted {deleted}, re-embedded {embedded}; lost {lost}, stale {stale}",
        before.len(),
        after.len()
    );
    assert_eq!(
        delivered as usize,
        events.len(),
        "the whole topic was delivered again"
    );
    assert_eq!(after, before, "index changed by duplicates");
    assert_eq!((lost, stale), (0, 0), "{example}");
    assert_eq!((upserted, deleted, embedded), (0.0, 0.0, 0.0));
}
