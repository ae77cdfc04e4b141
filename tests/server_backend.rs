//! The production backend against the embedded one: a SQuAD sample indexed by a job on the embedded
//! index and by a job on a Qdrant server on loopback (`index.kind = "server"`), then the same queries
//! in every mode through `POST /query`; twice, on inserted documents and after shrinking updates and
//! deletes. Both indexes must hold exactly the oracle's chunks each time. On inserted documents every
//! context must be the same (items, order, packed text): with one tenant, the server's IDF over its
//! collection and the embedded index's corpus-wide statistics count the same chunks, and below the
//! engines' indexing thresholds both dense lanes are exact.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::contexts::{comparable, queries};
use common::job::{http_post_json, metric, Job};
use common::oracle::{compare, default_chunker, index_contents, squad, Oracle};
use common::qdrant::QdrantServer;
use ragstream_operators::query::Context;

/// One run: `lines` indexed by a job on the embedded index and by one on `server` (in `collection`),
/// `asked` answered by both; each index checked against `expected`. Returns the ids of the contexts
/// that differ, with both versions of the first.
fn run_both(
    server: &QdrantServer,
    collection: &str,
    lines: &[Vec<u8>],
    expected: &std::collections::BTreeSet<common::oracle::ChunkId>,
    asked: &[(String, serde_json::Value)],
) -> (Vec<String>, Option<String>) {
    let mut answers: Vec<BTreeMap<String, Context>> = Vec::new();
    for on_server in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("events.jsonl"), lines.join(&b'\n')).expect("events");
        let config = if on_server {
            server.index_config(common::JSONL_SERVING, collection)
        } else {
            common::JSONL_SERVING.to_string()
        };
        let mut job = Job::start(dir.path(), &config, 1);
        job.wait_ready(Duration::from_secs(120));
        job.wait_for(Duration::from_secs(600), "the sample indexed", |m| {
            metric(m, "ragstream_documents_total") >= lines.len() as f64
                && metric(m, "ragstream_in_flight_messages") == 0.0
        });
        let mut contexts = BTreeMap::new();
        for (id, query) in asked {
            let mut query = query.clone();
            query["query_id"] = serde_json::json!(id);
            let (status, body) =
                http_post_json(job.http_port, "/query", &query.to_string()).expect("answered");
            assert_eq!(status, 200, "{body}");
            let context: Context = serde_json::from_str(&body).expect("context JSON");
            contexts.insert(id.clone(), context);
        }
        assert!(job.stop().success(), "{}", job.log());
        let held = if on_server {
            server.contents(collection)
        } else {
            index_contents(&dir.path().join("index"))
        };
        let (lost, stale, example) = compare(expected, &held);
        assert_eq!((lost, stale), (0, 0), "server: {on_server}; {example}");
        assert!(contexts
            .values()
            .filter(|c| c.mode == "bounded")
            .all(|c| c.error.is_none() && !c.items.is_empty()));
        answers.push(contexts);
    }
    let (embedded, served) = (&answers[0], &answers[1]);
    let differing: Vec<String> = embedded
        .iter()
        .filter(|(id, context)| comparable(context) != comparable(&served[*id]))
        .map(|(id, _)| id.clone())
        .collect();
    let first = differing.first().map(|id| {
        format!(
            "context {id} differs:\nembedded: {}\nserver:   {}",
            comparable(&embedded[id]),
            comparable(&served[id])
        )
    });
    (differing, first)
}

#[test]
fn a_qdrant_server_indexes_and_answers_like_the_embedded_index() {
    let Some(server) = QdrantServer::start() else {
        return;
    };
    let paragraphs: Vec<_> = squad().into_iter().take(300).collect();
    let asked = queries(&paragraphs[30..]);
    let mut oracle = Oracle::default();
    let mut lines: Vec<Vec<u8>> = paragraphs
        .iter()
        .map(|p| {
            oracle
                .upsert("squad", &p.id, 1, &p.title, &p.text)
                .1
                .expect("value")
        })
        .collect();
    let inserted = oracle.expected(&default_chunker());
    let (differing, first) = run_both(&server, "squad_inserts", &lines, &inserted, &asked);
    println!(
        "server backend, inserts only: {} chunks in each index, equal to the oracle; {} queries in every mode; {} contexts differ from the embedded index's",
        inserted.len(),
        asked.len(),
        differing.len()
    );
    assert_eq!(first, None);

    // Shrinking updates and deletes: both indexes still hold exactly the oracle's chunks. Contexts may
    // differ (README, "Notes and limits": the server's IDF under churn): counted, not asserted.
    for p in &paragraphs[..20] {
        let short = p.text.split(". ").next().unwrap_or(&p.text).to_string();
        lines.push(
            oracle
                .upsert("squad", &p.id, 2, &p.title, &short)
                .1
                .expect("value"),
        );
    }
    for p in &paragraphs[20..30] {
        lines.push(oracle.delete("squad", &p.id, 2).1.expect("value"));
    }
    let churned = oracle.expected(&default_chunker());
    let (differing, _) = run_both(&server, "squad_churn", &lines, &churned, &asked);
    println!(
        "server backend, after 20 shrinks and 10 deletes: {} chunks in each index, equal to the oracle; {} of {} contexts differ from the embedded index's",
        churned.len(),
        differing.len(),
        asked.len()
    );
}
