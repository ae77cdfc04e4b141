//! EmbedQuery: the query texts of each batch (and their HyDE passages) embedded in one call to the
//! inference service, off the worker; a repeated text is embedded once. When the embedder fails the
//! BM25 lane still answers and the context says the dense lane was out.

use std::time::{Duration, Instant};

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Operator;
use timely::dataflow::StreamVec;

use super::job::{QueryJob, QueryServices};
use crate::embed::service::{Embedded, Priority};
use crate::embed::EmbedError;
use crate::offload::{operator_waker, Parked};
use ragstream_core::query::cache::LruTtl;
use timely::dataflow::operators::Capability;

/// Query jobs waiting for their vectors from the inference service.
struct PendingEmbedding {
    jobs: Vec<QueryJob>,
    /// Jobs that need a dense vector.
    wanted: Vec<usize>,
    /// Texts whose vector was not cached (the request's texts, in order): the job, and whether the
    /// text is its HyDE passage rather than its query.
    missing: Vec<(usize, bool)>,
    /// HyDE passage vectors found in the cache, by job.
    passages: Vec<(usize, Vec<f32>)>,
    started: Instant,
}

impl PendingEmbedding {
    /// Takes the service's answer: each job's query vector (cached by its text) and HyDE passage
    /// mixed in, or, when the embedder failed, a note that the dense lane (or the passage) was out.
    fn take_result(
        &mut self,
        result: Result<Embedded, EmbedError>,
        vectors: &mut LruTtl<String, Vec<f32>>,
        hyde_weight: f32,
    ) {
        let pending = self;
        let jobs = &mut pending.jobs;
        match result {
            Ok(embedded) => {
                for (&(i, passage), vector) in pending.missing.iter().zip(embedded.vectors) {
                    if passage {
                        let text = jobs[i].hyde.as_ref().expect("a passage").text.clone();
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
    }
}

/// Mixes a job's HyDE passage vector into its dense query and says so (a job whose query vector is
/// missing keeps none: the dense lane is out either way, and its note says that).
fn mix_passage(job: &mut QueryJob, passage: &[f32], weight: f32) {
    if job.vectors.dense.len() == passage.len() && !passage.is_empty() {
        job.vectors.dense =
            ragstream_core::query::endpoints::mix(&job.vectors.dense, passage, weight);
        let cached = job.hyde.as_ref().is_some_and(|h| h.cached);
        job.notes.push(format!(
            "hyde: hypothetical passage joined the dense query{}",
            if cached { " (cached)" } else { "" }
        ));
    }
}

/// Extension trait: the `EmbedQuery` operator.
pub trait EmbedQuery<'scope> {
    /// Embeds the query texts of each batch in one call (dense) and encodes BM25 terms.
    fn embed_query(self, services: QueryServices) -> StreamVec<'scope, u64, QueryJob>;
}

impl<'scope> EmbedQuery<'scope> for StreamVec<'scope, u64, QueryJob> {
    fn embed_query(self, services: QueryServices) -> StreamVec<'scope, u64, QueryJob> {
        // Repeated query texts (other budgets, other modes) are embedded once.
        let cached = services.config.embedding_cache;
        let mut vectors: LruTtl<String, Vec<f32>> =
            LruTtl::new(cached.entries.max(1), Duration::from_secs(cached.ttl_secs));
        let hyde_weight = services.config.hyde.weight;
        let scope = self.scope();
        self.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(
            Pipeline,
            "EmbedQuery",
            move |_, info| {
                // The service wakes this operator from its own thread when a query's vector is ready;
                // meanwhile the worker runs the rest of the query flow and ingest.
                let waker = operator_waker(scope.worker(), &info.address);
                // Batches waiting for their vectors, each holding its capability.
                let mut waiting: Parked<Capability<u64>, PendingEmbedding, _> = Parked::default();
                move |input, output| {
                    input.for_each(|cap, data| {
                        let started = Instant::now();
                        let mut jobs: Vec<QueryJob> = std::mem::take(data);
                        let wanted: Vec<usize> = (0..jobs.len())
                            .filter(|&i| jobs[i].query.mode.retrieves())
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
                        let ticket = services.embedder.submit(texts, Priority::Query, &waker);
                        let pending = PendingEmbedding {
                            jobs,
                            wanted,
                            missing,
                            passages,
                            started,
                        };
                        let cap = cap.retain_least(0).expect("time of the batch");
                        waiting.park(cap, pending, ticket);
                    });
                    for (cap, mut pending, result) in waiting.ready() {
                        pending.take_result(result, &mut vectors, hyde_weight);
                        for &i in &pending.wanted {
                            pending.jobs[i].record("embed", pending.started);
                        }
                        output.session(&cap).give_iterator(pending.jobs.into_iter());
                    }
                }
            },
        )
    }
}
