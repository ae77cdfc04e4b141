//! The query operators that hold capabilities or cross workers, each in a small dataflow of its own:
//! AwaitConsistency (holds read-your-writes queries until the ingest frontier passes them), Gather
//! (one answer per query from every worker's shard, on the worker that received it) and Neighbours
//! (the top hit's neighbours fetched from the worker owning its shard).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use timely::dataflow::operators::vec::Input;
use timely::dataflow::operators::{Inspect, Probe};
use timely::dataflow::ProbeHandle;

use super::consistency::AwaitConsistency;
use super::job::{QueryJob, QueryServices, Reply, Working};
use super::neighbours::Neighbours;
use super::retrieve::Retrieve;
use crate::embed::service::{InferenceService, ServiceConfig};
use crate::embed::{EmbedError, Embedder};
use crate::store::contract::{sample_point, DIMENSION};
use crate::store::edge::EdgeStore;
use crate::store::stats::CorpusStats;
use crate::store::{PointWrite, VectorStore};
use ragstream_core::query::decode::decode_query;
use ragstream_core::query::{Candidate, QueryConfig, Stage, Trace};

/// An embedder these tests never call (their jobs carry their vectors).
struct Unused;

impl Embedder for Unused {
    fn version(&self) -> &str {
        "unused"
    }
    fn dimension(&self) -> usize {
        DIMENSION
    }
    fn embed(&mut self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        Ok(vec![vec![0.0; DIMENSION]; texts.len()])
    }
    fn last_token_count(&self) -> usize {
        0
    }
}

fn services(
    shards: Arc<Vec<Arc<dyn VectorStore>>>,
    peers: usize,
    acks: ProbeHandle<u64>,
    config: QueryConfig,
) -> QueryServices {
    QueryServices {
        shards,
        first_worker: 0,
        peers,
        shared_index: false,
        embedder: InferenceService::start(
            vec![Box::new(Unused)],
            ServiceConfig {
                slice_word_pieces: 1000,
                query_batch: 8,
                query_executor: false,
                version_tag: None,
                query_headroom: None,
            },
        )
        .expect("service"),
        config: Arc::new(config),
        encoding: crate::tokens::Encoding::O200kBase,
        progress: Arc::default(),
        acks,
        stats: Arc::new(CorpusStats::default()),
        reranker: None,
        writer: None,
        access: Arc::new(std::sync::Mutex::new(
            ragstream_core::query::surrogate::AccessCounts::new(16),
        )),
    }
}

/// A job for `body` received by worker `origin` at dataflow time `arrived_ms`.
fn job(body: &str, origin: usize, id: u64, arrived_ms: u64) -> QueryJob {
    let query = decode_query(body.as_bytes(), 8192).expect("query");
    QueryJob::new(
        query,
        arrived_ms,
        origin,
        id,
        Reply::Http(id),
        BTreeMap::new(),
    )
}

/// Shards in temporary directories, each holding `points[i]`.
fn shards(dir: &std::path::Path, points: &[Vec<PointWrite>]) -> Arc<Vec<Arc<dyn VectorStore>>> {
    let shards = points
        .iter()
        .enumerate()
        .map(|(i, points)| {
            let store = EdgeStore::open(&dir.join(format!("shard-{i}")), DIMENSION).expect("shard");
            store.upsert(points).expect("upsert");
            Arc::new(store) as Arc<dyn VectorStore>
        })
        .collect();
    Arc::new(shards)
}

/// What a read-your-writes test drives: the ingest side (its frontier is what such queries wait for),
/// the queries, and what AwaitConsistency released.
type Consistency = (
    timely::dataflow::InputHandleVec<u64, ()>,
    timely::dataflow::InputHandleVec<u64, QueryJob>,
    Rc<RefCell<Vec<QueryJob>>>,
);

/// AwaitConsistency over one empty shard, with read-your-writes queries timing out after `timeout_ms`.
fn await_consistency(
    worker: &mut timely::worker::Worker,
    dir: &std::path::Path,
    timeout_ms: u64,
) -> Consistency {
    let acks = ProbeHandle::new();
    let out = Rc::new(RefCell::new(Vec::new()));
    let seen = out.clone();
    let config = QueryConfig {
        consistency_timeout_ms: Duration::from_millis(timeout_ms),
        ..QueryConfig::default()
    };
    let services = services(shards(dir, &[vec![]]), 1, acks.clone(), config);
    let (documents, queries) = worker.dataflow::<u64, _, _>(|scope| {
        let (documents, ingest) = scope.new_input::<()>();
        ingest.probe_with(&acks);
        let (queries, stream) = scope.new_input::<QueryJob>();
        stream
            .await_consistency(services)
            .inspect(move |job: &QueryJob| seen.borrow_mut().push(job.clone()));
        (documents, queries)
    });
    (documents, queries, out)
}

#[test]
fn read_your_writes_waits_for_the_ingest_frontier_and_eventual_queries_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let released = timely::execute_directly(move |worker| {
        let (mut documents, mut queries, out) = await_consistency(worker, &path, 60_000);
        let ryw = r#"{"query_id":"ryw","tenant":"t","text":"x","consistency":"read_your_writes"}"#;
        let eventual = r#"{"query_id":"eventual","tenant":"t","text":"x"}"#;
        queries.advance_to(5);
        queries.send(job(ryw, 0, 1, 5));
        queries.send(job(eventual, 0, 2, 5));
        queries.advance_to(6);
        documents.advance_to(5);
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(200) {
            worker.step();
        }
        let early: Vec<String> = out
            .borrow()
            .iter()
            .map(|j| j.query.query_id.clone())
            .collect();
        assert_eq!(early, ["eventual"], "ingest has not passed time 5");
        // The writes of time 5 are acknowledged: the frontier moves past the query's arrival.
        documents.advance_to(6);
        let deadline = Instant::now() + Duration::from_secs(10);
        while out.borrow().len() < 2 && Instant::now() < deadline {
            worker.step();
        }
        out.take()
    });
    assert_eq!(released.len(), 2);
    let ryw = &released[1];
    assert_eq!(ryw.query.query_id, "ryw");
    assert!(ryw.latency.contains_key(&Stage::ConsistencyWait));
    assert!(ryw.notes.is_empty(), "{:?}", ryw.notes);
}

#[test]
fn read_your_writes_answers_with_a_note_after_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let released = timely::execute_directly(move |worker| {
        // The ingest input never moves: only the timeout releases the query.
        let (_documents, mut queries, out) = await_consistency(worker, &path, 100);
        let ryw = r#"{"query_id":"ryw","tenant":"t","text":"x","consistency":"read_your_writes"}"#;
        queries.send(job(ryw, 0, 1, 0));
        queries.advance_to(1);
        let deadline = Instant::now() + Duration::from_secs(10);
        while out.borrow().is_empty() && Instant::now() < deadline {
            worker.step();
        }
        out.take()
    });
    assert_eq!(released.len(), 1);
    assert!(
        released[0].notes[0].contains("had not caught up after 100 ms"),
        "{:?}",
        released[0].notes
    );
}

/// Runs `build` on two workers; returns what each worker's output saw.
fn on_two_workers<T: Send + 'static>(
    build: impl Fn(&mut timely::worker::Worker) -> Vec<T> + Send + Sync + 'static,
) -> Vec<Vec<T>> {
    timely::execute(timely::Config::process(2), build)
        .expect("workers")
        .join()
        .into_iter()
        .map(|result| result.expect("worker"))
        .collect()
}

#[test]
fn gather_answers_once_on_the_receiving_worker_with_both_shards_hits() {
    let dir = tempfile::tempdir().unwrap();
    let points = vec![
        vec![
            sample_point("t", "a", 1, "alpha one", &[]),
            sample_point("t", "a2", 1, "alpha two", &[]),
        ],
        vec![sample_point("t", "b", 1, "beta three", &[])],
    ];
    let shards = shards(dir.path(), &points);
    let seen = on_two_workers(move |worker| {
        let index = worker.index();
        let acks = ProbeHandle::new();
        let services = services(shards.clone(), 2, acks.clone(), QueryConfig::default());
        let out = Rc::new(RefCell::new(Vec::new()));
        let sink = out.clone();
        let (mut input, probe) = worker.dataflow::<u64, _, _>(|scope| {
            let (ingest_input, ingest) = scope.new_input::<()>();
            ingest.probe_with(&acks);
            drop(ingest_input);
            let (input, stream) = scope.new_input::<QueryJob>();
            let probe = stream
                .retrieve(services)
                .inspect(move |working: &Working| {
                    let docs: Vec<(String, u32)> = working
                        .answer
                        .dense
                        .iter()
                        .map(|hit| (hit.stored.key.doc_id.clone(), (hit.score * 1e4) as u32))
                        .collect();
                    sink.borrow_mut()
                        .push((index, working.job.query.query_id.clone(), docs));
                })
                .probe()
                .0;
            (input, probe)
        });
        if index == 1 {
            let mut query = job(r#"{"query_id":"q","tenant":"t","text":"alpha"}"#, 1, 7, 0);
            query.vectors.dense = vec![(1.0 / DIMENSION as f32).sqrt(); DIMENSION];
            input.send(query);
        }
        input.advance_to(1);
        while probe.less_equal(&0) {
            worker.step();
        }
        out.take()
    });
    assert!(
        seen[0].is_empty(),
        "worker 0 received nothing: {:?}",
        seen[0]
    );
    assert_eq!(seen[1].len(), 1, "one answer: {:?}", seen[1]);
    let (worker, query_id, hits) = &seen[1][0];
    assert_eq!((*worker, query_id.as_str()), (1, "q"));
    let mut docs: Vec<&str> = hits.iter().map(|(doc, _)| doc.as_str()).collect();
    let scores: Vec<u32> = hits.iter().map(|(_, score)| *score).collect();
    assert!(
        scores.windows(2).all(|w| w[0] >= w[1]),
        "merged by score: {hits:?}"
    );
    docs.sort();
    assert_eq!(docs, ["a", "a2", "b"], "every shard's hits");
}

#[test]
fn neighbours_come_from_the_worker_owning_the_top_hit_unless_the_preset_turns_them_off() {
    // A document whose shard belongs to worker 1, with chunks at positions 0..8.
    let doc = (0..)
        .map(|i| format!("d{i}"))
        .find(|doc| crate::model::DocKey::new("t", doc).route() % 2 == 1)
        .expect("a document of worker 1");
    let chunks: Vec<PointWrite> = (0..8)
        .map(|order| {
            let mut point = sample_point("t", &doc, 1, &format!("part {order} of it"), &[]);
            point.chunk.order_index = order;
            point
        })
        .collect();
    let top = chunks[5].clone();
    let first = chunks[0].clone();
    let dir = tempfile::tempdir().unwrap();
    let shards = shards(dir.path(), &[vec![], chunks]);
    let seen = on_two_workers(move |worker| {
        let index = worker.index();
        let acks = ProbeHandle::new();
        let config = QueryConfig::default().with_presets().expect("presets");
        let settings = Arc::new(config.clone());
        let services = services(shards.clone(), 2, acks, config);
        let out = Rc::new(RefCell::new(Vec::new()));
        let sink = out.clone();
        let top = shards[1].get(&[top.id]).expect("get").remove(0);
        // The first chunk as if it were its document's only one: its neighbours are not read.
        let mut whole = shards[1].get(&[first.id]).expect("get").remove(0);
        whole.chunk.last = true;
        let (mut input, probe) = worker.dataflow::<u64, _, _>(|scope| {
            let (input, stream) = scope.new_input::<Working>();
            let probe = stream
                .neighbours(services)
                .inspect(move |working: &Working| {
                    let mut orders: Vec<u32> = working
                        .neighbours
                        .iter()
                        .map(|c| c.chunk.order_index)
                        .collect();
                    orders.sort();
                    let id = working.job.query.query_id.clone();
                    sink.borrow_mut().push((index, id, orders));
                })
                .probe()
                .0;
            (input, probe)
        });
        if index == 0 {
            for (id, body, top) in [
                (3, r#"{"query_id":"q","tenant":"t","text":"x"}"#, &top),
                (
                    4,
                    r#"{"query_id":"fast","tenant":"t","text":"x","preset":"fast"}"#,
                    &top,
                ),
                (5, r#"{"query_id":"whole","tenant":"t","text":"x"}"#, &whole),
            ] {
                let job = job(body, 0, id, 0);
                input.send(Working {
                    settings: settings.settings(job.query.preset.as_deref()),
                    job,
                    answer: Default::default(),
                    candidates: vec![Candidate::new(top.clone())],
                    deferred: Vec::new(),
                    score_floor: 0.0,
                    trace: Trace::default(),
                    available: 1,
                    neighbours: Vec::new(),
                });
            }
        }
        input.advance_to(1);
        while probe.less_equal(&0) {
            worker.step();
        }
        out.take()
    });
    let mut seen_0 = seen[0].clone();
    seen_0.sort();
    assert_eq!(
        seen_0,
        [
            (0, "fast".to_string(), vec![]),
            (0, "q".to_string(), vec![2, 3, 4, 5, 6, 7]),
            (0, "whole".to_string(), vec![]),
        ],
        "within 3 of 5; none under the fast preset (no section reunification), none read for a \
         document's only chunk"
    );
    assert!(seen[1].is_empty(), "{:?}", seen[1]);
}
