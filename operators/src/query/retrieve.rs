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
use super::search::{gather, lane_depths, lane_pool, probe, search_shard, ShardAnswer};
use crate::metrics::metrics;
use crate::stage::map_stage;
use crate::wire::Wire;
use ragstream_core::query::{Depth, HydeTrace, Trace};

/// Extension trait: the `Retrieve` operator.
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
        let wired = map_stage(self, "WireQuery", move |mut job: QueryJob| {
            if !engine_idf && !job.vectors.sparse.indices.is_empty() {
                job.vectors.sparse_raw = job.vectors.sparse.values.clone();
                job.vectors.sparse = stats.weigh(&job.query.tenant, &job.vectors.sparse);
            }
            Wire(job)
        })
        .broadcast();
        let answers = map_stage(wired, "SearchShard", move |Wire(job): Wire<QueryJob>| {
            let started = Instant::now();
            let skip = search.shared_index && worker != 0;
            let answer = match search.local_shard(worker) {
                Some(shard) if !skip => {
                    let depth = lane_depths(&job.query, intent_depth(&job), &search.config);
                    let pool = lane_pool(&job.query, intent_depth(&job), &search.config);
                    search_shard(shard.as_ref(), &job.query, &job.vectors, (depth, pool))
                }
                _ => ShardAnswer::default(),
            };
            Wire((job, answer, started.elapsed().as_secs_f64()))
        });
        let peers = services.peers;
        answers.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(
            Exchange::new(|Wire((job, _, _)): &Wire<(QueryJob, ShardAnswer, f64)>| {
                job.origin as u64
            }),
            "Gather",
            move |_, _| {
                let mut parts: HashMap<u64, (QueryJob, Vec<ShardAnswer>, f64)> = HashMap::new();
                move |input, output| {
                    input.for_each(|cap, data| {
                        for Wire((job, answer, seconds)) in data.drain(..) {
                            let id = job.id;
                            let complete = {
                                let entry =
                                    parts.entry(id).or_insert_with(|| (job, Vec::new(), 0.0));
                                entry.1.push(answer);
                                entry.2 = entry.2.max(seconds);
                                entry.1.len() == peers
                            };
                            if !complete {
                                continue;
                            }
                            let (mut job, answers, seconds) =
                                parts.remove(&id).expect("complete entry");
                            let depth =
                                lane_depths(&job.query, intent_depth(&job), &services.config);
                            let pool = lane_pool(&job.query, intent_depth(&job), &services.config);
                            job.watermark = services.watermark();
                            *job.latency.entry("retrieve".into()).or_default() += seconds * 1000.0;
                            metrics()
                                .query_stage_seconds
                                .with_label_values(&["retrieve"])
                                .observe(seconds);
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
