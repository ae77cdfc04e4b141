//! Retrieve: WireQuery (the BM25 vector weighed by the tenant's corpus statistics), a broadcast to
//! every worker, SearchShard (each worker's shard: `search`) and Gather (the answers joined on the
//! query's origin worker).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::vec::Broadcast;
use timely::dataflow::operators::Operator;
use timely::dataflow::StreamVec;

use super::job::{QueryJob, QueryServices, Working};
use super::search::{gather, probe, search_shard, ShardAnswer};
use crate::stage::map_stage;
use crate::wire::Wire;
use ragstream_core::query::depth::{lane_depths, lane_pool};
use ragstream_core::query::{Depth, HydeTrace, Stage, Trace};

/// Extension trait: the `Retrieve` operator.
///
/// # Examples
///
/// One worker, one shard (an embedded index) holding two documents: the dense lane ranks both
/// (nearest first), the BM25 lane only the one whose text has the query's words:
///
/// ```
/// use std::sync::Arc;
/// use ragstream_core::testing::{sample_point, DIMENSION};
/// use ragstream_operators::query::example::{job, services};
/// use ragstream_operators::query::retrieve::Retrieve;
/// use ragstream_operators::store::edge::EdgeStore;
/// use ragstream_operators::store::{Bm25Encoder, VectorStore};
/// use timely::dataflow::operators::capture::{Capture, Extract};
/// use timely::dataflow::operators::vec::{Map, ToStream};
///
/// let dir = tempfile::tempdir().expect("a directory");
/// let shard = EdgeStore::open(dir.path(), DIMENSION).expect("an index");
/// let points = [
///     sample_point("t", "tides", 1, "Tide pools hold sea water at low tide.", &[]),
///     sample_point("t", "stars", 1, "The night sky is full of stars.", &[]),
/// ];
/// shard.upsert(&points).expect("written");
/// shard.flush().expect("flushed");
/// let near_tides = points[0].dense.clone();
/// let lanes = timely::example(move |scope| {
///     let mut services = services();
///     services.shards = Arc::new(vec![Arc::new(shard) as Arc<dyn VectorStore>]);
///     let mut query = job(r#"{"query_id": "q1", "tenant": "t", "text": "tide pools"}"#);
///     query.vectors.dense = near_tides;
///     query.vectors.sparse = Bm25Encoder::default().encode_query(&query.query.text);
///     let docs = |hits: &[ragstream_operators::store::Hit]| -> Vec<String> {
///         hits.iter().map(|hit| hit.stored.key.doc_id.clone()).collect()
///     };
///     vec![query]
///         .to_stream(scope)
///         .retrieve(services)
///         .map(move |working| (docs(&working.answer.dense), docs(&working.answer.bm25)))
///         .capture()
/// });
/// let (dense, bm25) = lanes.extract()[0].1[0].clone();
/// assert_eq!(dense, ["tides", "stars"]);
/// assert_eq!(bm25, ["tides"]);
/// ```
pub trait Retrieve<'scope> {
    /// Broadcasts to every worker, searches each shard and gathers the answers on the origin worker.
    fn retrieve(self, services: QueryServices) -> StreamVec<'scope, u64, Working>;
}

impl<'scope> Retrieve<'scope> for StreamVec<'scope, u64, QueryJob> {
    fn retrieve(self, services: QueryServices) -> StreamVec<'scope, u64, Working> {
        let search = services.clone();
        let worker = self.scope().index();
        // Jobs and answers cross processes in a cluster: as JSON (see `crate::wire`).
        // The BM25 vector carries each term's IDF over the tenant's whole corpus, weighed once here so
        // every shard scores with the same weights.
        // (An index created with the engine's own per-shard IDF gets the bare query vector.)
        let stats = services.stats.clone();
        let engine_idf = services.shards.iter().any(|shard| shard.engine_idf());
        // How deep the lanes read is decided once, here, and travels with the job.
        let config = services.config.clone();
        let wired = map_stage(self, "WireQuery", move |mut job: QueryJob| {
            if !engine_idf && !job.vectors.sparse.indices.is_empty() {
                job.vectors.sparse_raw = job.vectors.sparse.values.clone();
                job.vectors.sparse = stats.weigh(&job.query.tenant, &job.vectors.sparse);
            }
            let settings = config.preset(job.query.preset.as_deref());
            let reads: Reads = (
                lane_depths(&job.query, intent_depth(&job), settings),
                lane_pool(&job.query, intent_depth(&job), settings),
            );
            Wire((job, reads))
        })
        .broadcast();
        let answers = map_stage(
            wired,
            "SearchShard",
            move |Wire((job, reads)): Wire<(QueryJob, Reads)>| {
                let started = Instant::now();
                let skip = search.shared_index && worker != 0;
                let answer = match search.local_shard(worker) {
                    Some(shard) if !skip => {
                        search_shard(shard.as_ref(), &job.query, &job.vectors, reads)
                    }
                    _ => ShardAnswer::default(),
                };
                Wire((job, reads, answer, started.elapsed().as_secs_f64()))
            },
        );
        let peers = services.peers;
        answers.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(
            Exchange::new(
                |Wire((job, ..)): &Wire<(QueryJob, Reads, ShardAnswer, f64)>| job.origin as u64,
            ),
            "Gather",
            move |_, _| {
                let mut parts: HashMap<u64, (QueryJob, Reads, Vec<ShardAnswer>, f64)> =
                    HashMap::new();
                move |input, output| {
                    input.for_each(|cap, data| {
                        for Wire((job, reads, answer, seconds)) in data.drain(..) {
                            let id = job.id;
                            let complete = {
                                let entry = parts
                                    .entry(id)
                                    .or_insert_with(|| (job, reads, Vec::new(), 0.0));
                                entry.2.push(answer);
                                entry.3 = entry.3.max(seconds);
                                entry.2.len() == peers
                            };
                            if !complete {
                                continue;
                            }
                            let (mut job, (depth, pool), answers, seconds) =
                                parts.remove(&id).expect("complete entry");
                            job.watermark = services.watermark();
                            job.record_seconds(Stage::Retrieve, seconds);
                            let hyde = job.hyde.as_ref().map(|hyde| HydeTrace {
                                strategy: hyde.strategy,
                                hypotheses: hyde.texts.len(),
                                weight: hyde.weight,
                                cached: hyde.cached,
                                joined: hyde.joined,
                            });
                            let mut answer = gather(answers, (depth, pool));
                            if job.query.mode.retrieves() && answer.error.is_none() {
                                let seen = job
                                    .vectors
                                    .sparse
                                    .indices
                                    .iter()
                                    .map(|term| {
                                        services.stats.frequency(&job.query.tenant, *term).1 > 0
                                    })
                                    .collect();
                                answer.probe = Some(Arc::new(probe(&job.vectors, &answer, seen)));
                            }
                            output.session(&cap).give(Working {
                                answer,
                                settings: services.config.settings(job.query.preset.as_deref()),
                                job,
                                candidates: Vec::new(),
                                deferred: Vec::new(),
                                score_floor: 0.0,
                                trace: Trace {
                                    depth: Some(depth),
                                    pool: pool.map(|pool| pool.tokens),
                                    hyde,
                                    ..Trace::default()
                                },
                                available: 0,
                                neighbours: Vec::new(),
                            });
                        }
                    });
                }
            },
        )
    }
}

/// How deep a query's lanes read ([`lane_depths`]) and, for a filled budget, their pool
/// ([`lane_pool`]): decided once by WireQuery, used by every shard and by Gather.
type Reads = (Depth, Option<crate::store::lanes::Pool>);

/// The lane depths the query's intent asks for (a job without a plan reads 16 a lane, raised to the
/// query's floor by [`lane_depths`]).
fn intent_depth(job: &QueryJob) -> Depth {
    job.plan.as_ref().map_or(
        Depth {
            dense: 16,
            bm25: 16,
        },
        |plan| plan.depth,
    )
}
