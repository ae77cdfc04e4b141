//! The query flow up to the shards' answers: AwaitConsistency, CacheLookup, Intent, EmbedQuery,
//! SearchShard and Gather, one extension trait ([`QuerySteps`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::{Exchange, Pipeline};
use timely::dataflow::operators::vec::Broadcast;
use timely::dataflow::operators::{Capability, Operator};
use timely::dataflow::StreamVec;

use super::cache::LruTtl;
use super::intent::analyze;
use super::retrieve::{gather, lane_depths, search_shard, ShardAnswer};
use crate::stage::map_stage;

use super::job::*;
use super::{Consistency, Context, Depth, Query, Trace};
use crate::embed::service::{Priority, Ticket};
use crate::metrics::metrics;
use crate::store::Bm25Encoder;
use crate::wire::Wire;
use ragstream_core::progress::IngestProgress;

/// Query jobs waiting for their vectors from the inference service.
struct PendingEmbedding {
    cap: timely::dataflow::operators::Capability<u64>,
    jobs: Vec<QueryJob>,
    /// Jobs that need a dense vector.
    wanted: Vec<usize>,
    /// Texts whose vector was not cached (the request's texts, in order): the job, and whether the
    /// text is its HyDE passage rather than its query.
    missing: Vec<(usize, bool)>,
    /// HyDE passage vectors found in the cache, by job.
    passages: Vec<(usize, Vec<f32>)>,
    ticket: Ticket,
    started: Instant,
}

/// Mixes a job's HyDE passage vector into its dense query and says so (a job whose query vector is
/// missing keeps none: the dense lane is out either way, and its note says that).
fn mix_passage(job: &mut QueryJob, passage: &[f32], weight: f32) {
    if job.vectors.dense.len() == passage.len() && !passage.is_empty() {
        job.vectors.dense = super::endpoints::mix(&job.vectors.dense, passage, weight);
        let cached = job.hyde.as_ref().is_some_and(|h| h.cached);
        job.notes.push(format!(
            "hyde: hypothetical passage joined the dense query{}",
            if cached { " (cached)" } else { "" }
        ));
    }
}

/// Extension trait: every step of the query flow.
pub trait QuerySteps<'scope> {
    /// Holds `read_your_writes` queries until the index reflects every earlier document event.
    fn await_consistency(self, services: QueryServices) -> StreamVec<'scope, u64, QueryJob>;
    /// Answers a query from the cache when a context for it was computed at the current index state.
    fn cache_lookup(
        self,
        cache: Arc<Mutex<LruTtl<String, Context>>>,
        progress: Arc<IngestProgress>,
    ) -> StreamVec<'scope, u64, QueryJob>;
    /// Chooses the intent, weights and pool.
    fn intent(self) -> StreamVec<'scope, u64, QueryJob>;
    /// Embeds the query texts of each batch in one call (dense) and encodes BM25 terms.
    fn embed_query(self, services: QueryServices) -> StreamVec<'scope, u64, QueryJob>;
    /// Broadcasts to every worker, searches each shard and gathers the answers on the origin worker.
    fn retrieve(self, services: QueryServices) -> StreamVec<'scope, u64, Working>;
}

pub(crate) fn cache_key(query: &Query) -> String {
    let mut key = query.clone();
    key.query_id.clear();
    serde_json::to_string(&key).expect("queries serialise")
}

impl<'scope> QuerySteps<'scope> for StreamVec<'scope, u64, QueryJob> {
    fn await_consistency(self, services: QueryServices) -> StreamVec<'scope, u64, QueryJob> {
        let timeout = Duration::from_millis(services.config.consistency_timeout_ms);
        let scope = self.scope();
        self.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(Pipeline, "AwaitConsistency", move |_, info| {
            let activator = scope.activator_for(info.address.clone());
            let mut waiting: Vec<(Capability<u64>, QueryJob, Instant)> = Vec::new();
            move |input, output| {
                input.for_each(|cap, data| {
                    for job in data.drain(..) {
                        let read_your_writes = job.query.consistency == Consistency::ReadYourWrites;
                        if read_your_writes && !services.consistent(&job) {
                            services.progress.waiting(true);
                            waiting.push((cap.retain_least(0).expect("time of the batch"), job, Instant::now()));
                        } else {
                            if read_your_writes {
                                metrics().read_your_writes_wait_seconds.observe(0.0);
                            }
                            output.session(&cap).give(job);
                        }
                    }
                });
                waiting.retain_mut(|(cap, job, since)| {
                    let ready = services.consistent(job);
                    let expired = since.elapsed() >= timeout;
                    if !(ready || expired) {
                        return true;
                    }
                    services.progress.waiting(false);
                    let mut job = job.clone();
                    job.record("consistency_wait", *since);
                    metrics()
                        .read_your_writes_wait_seconds
                        .observe(since.elapsed().as_secs_f64());
                    if !ready {
                        job.notes.push(format!(
                            "read_your_writes: the index had not caught up after {} ms; answered from what it holds",
                            timeout.as_millis()
                        ));
                    }
                    output.session(cap).give(job);
                    false
                });
                if !waiting.is_empty() {
                    activator.activate_after(Duration::from_millis(2));
                }
            }
        })
    }

    fn cache_lookup(
        self,
        cache: Arc<Mutex<LruTtl<String, Context>>>,
        progress: Arc<IngestProgress>,
    ) -> StreamVec<'scope, u64, QueryJob> {
        map_stage(self, "CacheLookup", move |mut job: QueryJob| {
            // This process's writes, and the group's commits (writes acknowledged anywhere).
            let generation = progress.generation(metrics().index_generation.get());
            job.generation = generation;
            if let Some(mut context) = cache
                .lock()
                .expect("cache")
                .get(&cache_key(&job.query), generation)
            {
                context.query_id = job.query.query_id.clone();
                context.latency_ms = BTreeMap::from([("cache".to_string(), 0.0)]);
                job.cached = Some(Box::new(context));
                metrics().query_cache.with_label_values(&["hit"]).inc();
            } else {
                metrics().query_cache.with_label_values(&["miss"]).inc();
            }
            job
        })
    }

    fn intent(self) -> StreamVec<'scope, u64, QueryJob> {
        let bm25 = Bm25Encoder::default();
        map_stage(self, "Intent", move |mut job: QueryJob| {
            if job.cached.is_none() {
                let started = Instant::now();
                let plan = analyze(&job.query.text, &bm25);
                if job.query.mode.retrieves() {
                    job.vectors.sparse = bm25.encode_query(&job.query.text);
                }
                metrics()
                    .queries_by_intent
                    .with_label_values(&[plan.intent.as_str()])
                    .inc();
                job.plan = Some(plan);
                job.record("intent", started);
            }
            job
        })
    }

    fn embed_query(self, services: QueryServices) -> StreamVec<'scope, u64, QueryJob> {
        // Repeated query texts (other budgets, other modes) are embedded once.
        let mut vectors: LruTtl<String, Vec<f32>> = LruTtl::new(16_384, Duration::from_secs(3600));
        let hyde_weight = services.config.hyde.weight;
        let scope = self.scope();
        self.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(
            Pipeline,
            "EmbedQuery",
            move |_, info| {
                // The service wakes this operator from its own thread when a query's vector is ready;
                // meanwhile the worker runs the rest of the query flow and ingest.
                let waker = crate::background::operator_waker(scope.worker(), &info.address);
                // Batches waiting for their vectors, each holding its capability.
                let mut waiting: Vec<PendingEmbedding> = Vec::new();
                move |input, output| {
                    input.for_each(|cap, data| {
                        let started = Instant::now();
                        let mut jobs: Vec<QueryJob> = std::mem::take(data);
                        let wanted: Vec<usize> = (0..jobs.len())
                            .filter(|&i| jobs[i].cached.is_none() && jobs[i].query.mode.retrieves())
                            .collect();
                        let mut missing: Vec<(usize, bool)> = Vec::new();
                        let mut passages: Vec<(usize, Vec<f32>)> = Vec::new();
                        for &i in &wanted {
                            match vectors.get(&jobs[i].query.text, 0) {
                                Some(vector) => jobs[i].vectors.dense = vector,
                                None => missing.push((i, false)),
                            }
                            if let Some(passage) = &jobs[i].hyde {
                                match vectors.get(&passage.text, 0) {
                                    Some(vector) => passages.push((i, vector)),
                                    None => missing.push((i, true)),
                                }
                            }
                        }
                        if missing.is_empty() {
                            for (i, passage) in passages {
                                mix_passage(&mut jobs[i], &passage, hyde_weight);
                            }
                            for &i in &wanted {
                                jobs[i].record("embed", started);
                            }
                            output.session(&cap).give_iterator(jobs.into_iter());
                            return;
                        }
                        let texts = missing
                            .iter()
                            .map(|&(i, passage)| match passage {
                                true => jobs[i].hyde.as_ref().expect("a passage").text.clone(),
                                false => jobs[i].query.text.clone(),
                            })
                            .collect();
                        let waker = waker.clone();
                        let ticket = services
                            .embedder
                            .submit(texts, Priority::Query, move || waker());
                        waiting.push(PendingEmbedding {
                            cap: cap.retain_least(0).expect("time of the batch"),
                            jobs,
                            wanted,
                            missing,
                            passages,
                            ticket,
                            started,
                        });
                    });
                    waiting.retain_mut(|pending| {
                        let Some(result) = pending.ticket.try_take() else {
                            return true;
                        };
                        let jobs = &mut pending.jobs;
                        match result {
                            Ok(embedded) => {
                                for (&(i, passage), vector) in
                                    pending.missing.iter().zip(embedded.vectors)
                                {
                                    if passage {
                                        let text =
                                            jobs[i].hyde.as_ref().expect("a passage").text.clone();
                                        vectors.put(text, vector.clone(), 0);
                                        pending.passages.push((i, vector));
                                    } else {
                                        vectors.put(jobs[i].query.text.clone(), vector.clone(), 0);
                                        jobs[i].vectors.dense = vector;
                                    }
                                }
                                for (i, passage) in std::mem::take(&mut pending.passages) {
                                    mix_passage(&mut jobs[i], &passage, hyde_weight);
                                }
                            }
                            Err(error) => {
                                // The BM25 lane still answers; the context says the dense lane was
                                // out. A passage not embedded leaves the query's own vector.
                                for &(i, passage) in &pending.missing {
                                    if passage {
                                        jobs[i].degraded = true;
                                        jobs[i].notes.push(format!(
                                            "hyde passage not embedded ({error}): the query's own vector was used"
                                        ));
                                    } else {
                                        jobs[i]
                                            .notes
                                            .push(format!("dense lane unavailable: {error}"));
                                    }
                                }
                                for (i, passage) in std::mem::take(&mut pending.passages) {
                                    mix_passage(&mut jobs[i], &passage, hyde_weight);
                                }
                            }
                        }
                        for &i in &pending.wanted {
                            jobs[i].record("embed", pending.started);
                        }
                        output
                            .session(&pending.cap)
                            .give_iterator(std::mem::take(jobs).into_iter());
                        false
                    });
                }
            },
        )
    }

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
                job.vectors.sparse = stats.weigh(&job.query.tenant, &job.vectors.sparse);
            }
            Wire(job)
        })
        .broadcast();
        let answers = map_stage(wired, "SearchShard", move |Wire(job): Wire<QueryJob>| {
            let started = Instant::now();
            let skip = job.cached.is_some() || (search.shared_index && worker != 0);
            let answer = match search.local_shard(worker) {
                Some(shard) if !skip => {
                    let depth = lane_depths(&job.query, intent_depth(&job), search.config.min_pool);
                    search_shard(shard.as_ref(), &job.query, &job.vectors, depth)
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
                            let depth = lane_depths(
                                &job.query,
                                intent_depth(&job),
                                services.config.min_pool,
                            );
                            job.watermark = services.watermark();
                            *job.latency.entry("retrieve".into()).or_default() += seconds * 1000.0;
                            metrics()
                                .query_stage_seconds
                                .with_label_values(&["retrieve"])
                                .observe(seconds);
                            output.session(&cap).give(Working {
                                answer: gather(answers, depth),
                                job,
                                candidates: Vec::new(),
                                deferred: Vec::new(),
                                score_floor: 0.0,
                                trace: Trace {
                                    depth: Some(depth),
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
