//! EmbedQuery: the query texts of each batch (and their HyDE passages) embedded in one call to the
//! inference service, off the worker; a repeated text is embedded once. When the embedder fails the
//! BM25 lane still answers and the context says the dense lane was out.

use std::collections::BTreeMap;
use std::time::Instant;

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Operator;
use timely::dataflow::StreamVec;

use super::job::{QueryJob, QueryServices};
use crate::embed::service::{Embedded, Priority};
use crate::embed::EmbedError;
use crate::offload::{operator_waker, Parked};
use ragstream_core::query::cache::LruTtl;
use ragstream_core::query::Stage;
use timely::dataflow::operators::Capability;

/// Query jobs waiting for their vectors from the inference service.
struct PendingEmbedding {
    jobs: Vec<QueryJob>,
    /// Jobs that need a dense vector.
    wanted: Vec<usize>,
    /// Texts whose vector was not cached (the request's texts, in order): the job, and which of its
    /// HyDE passages the text is (`None`: its query).
    missing: Vec<(usize, Option<usize>)>,
    /// HyDE passage vectors (found in the cache, then embedded), by job.
    passages: BTreeMap<usize, Vec<Vec<f32>>>,
    started: Instant,
}

impl PendingEmbedding {
    /// Takes the service's answer: each job's query vector (cached by its text) and HyDE passage
    /// mixed in, or, when the embedder failed, a note that the dense lane (or the passage) was out.
    fn take_result(
        &mut self,
        result: Result<Embedded, EmbedError>,
        vectors: &mut LruTtl<String, Vec<f32>>,
    ) {
        let pending = self;
        let jobs = &mut pending.jobs;
        match result {
            Ok(embedded) => {
                for (&(i, passage), vector) in pending.missing.iter().zip(embedded.vectors) {
                    vectors.put(text_of(&jobs[i], passage).to_string(), vector.clone(), 0);
                    match passage {
                        Some(_) => pending.passages.entry(i).or_default().push(vector),
                        None => jobs[i].vectors.dense = vector,
                    }
                }
            }
            Err(error) => {
                // The BM25 lane still answers; the context says the dense lane was
                // out. A passage not embedded leaves the query's own vector.
                let mut told = std::collections::BTreeSet::new();
                for &(i, passage) in &pending.missing {
                    match passage {
                        Some(_) => {
                            pending.passages.remove(&i);
                            jobs[i].degraded = true;
                            if told.insert(i) {
                                jobs[i].notes.push(format!(
                                    "hyde passages not embedded ({error}): the query's own vector was used"
                                ));
                            }
                        }
                        None => jobs[i]
                            .notes
                            .push(format!("dense lane unavailable: {error}")),
                    }
                }
            }
        }
        for (i, passages) in std::mem::take(&mut pending.passages) {
            mix_passages(&mut jobs[i], &passages);
        }
    }
}

/// The text a request entry stands for: the job's query, or one of its HyDE passages.
fn text_of(job: &QueryJob, passage: Option<usize>) -> &str {
    match (passage, &job.hyde) {
        (Some(p), Some(hyde)) => &hyde.texts[p],
        _ => &job.query.text,
    }
}

/// Mixes the mean of a job's HyDE passage vectors into its dense query by its strategy and says so
/// (a job whose query vector is missing keeps none: the dense lane is out either way, and its note
/// says that).
fn mix_passages(job: &mut QueryJob, passages: &[Vec<f32>]) {
    let Some(hyde) = &mut job.hyde else {
        return;
    };
    let passage = ragstream_core::query::endpoints::mean(passages);
    if job.vectors.dense.len() == passage.len() && !passage.is_empty() {
        job.vectors.dense =
            ragstream_core::query::endpoints::mix(&job.vectors.dense, &passage, hyde.weight);
        hyde.joined = true;
        job.notes.push(format!(
            "hyde ({}): {} hypothetical passage(s) joined the dense query{}",
            hyde.strategy.as_str(),
            passages.len(),
            if hyde.cached { " (cached)" } else { "" }
        ));
    }
}

/// Extension trait: the `EmbedQuery` operator.
///
/// # Examples
///
/// A bounded query gets its text's vector (the example's service embeds every text to two zeros)
/// and the step's latency; a `list_sources` query retrieves nothing and gets neither:
///
/// ```
/// use ragstream_core::query::Stage;
/// use ragstream_operators::query::embed_query::EmbedQuery;
/// use ragstream_operators::query::example::{job, services};
/// use timely::dataflow::operators::capture::{Capture, Extract};
/// use timely::dataflow::operators::vec::{Map, ToStream};
///
/// let embedded = timely::example(|scope| {
///     vec![
///         job(r#"{"query_id": "q1", "tenant": "t", "text": "tide pools"}"#),
///         job(r#"{"query_id": "q2", "tenant": "t", "mode": "list_sources"}"#),
///     ]
///     .to_stream(scope)
///     .embed_query(services())
///     .map(|job| {
///         let embedded = job.latency.contains_key(&Stage::Embed);
///         (job.query.query_id, job.vectors.dense.len(), embedded)
///     })
///     .capture()
/// });
/// let embedded: Vec<_> = embedded.extract().into_iter().flat_map(|(_, jobs)| jobs).collect();
/// assert_eq!(
///     embedded,
///     [("q1".to_string(), 2, true), ("q2".to_string(), 0, false)]
/// );
/// ```
pub trait EmbedQuery<'scope> {
    /// Embeds the query texts of each batch in one call (dense) and encodes BM25 terms.
    fn embed_query(self, services: QueryServices) -> StreamVec<'scope, u64, QueryJob>;
}

impl<'scope> EmbedQuery<'scope> for StreamVec<'scope, u64, QueryJob> {
    fn embed_query(self, services: QueryServices) -> StreamVec<'scope, u64, QueryJob> {
        // Repeated query texts (other budgets, other modes) are embedded once.
        let cached = services.config.embedding_cache;
        let mut vectors: LruTtl<String, Vec<f32>> =
            LruTtl::new(cached.entries.get(), cached.ttl_secs);
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
                        let mut missing: Vec<(usize, Option<usize>)> = Vec::new();
                        let mut passages: BTreeMap<usize, Vec<Vec<f32>>> = BTreeMap::new();
                        for &i in &wanted {
                            match vectors.get(&jobs[i].query.text, 0) {
                                Some(vector) => jobs[i].vectors.dense = vector,
                                None => missing.push((i, None)),
                            }
                            let texts = jobs[i].hyde.as_ref().map_or(&[][..], |h| &h.texts);
                            for (p, text) in texts.iter().enumerate() {
                                match vectors.get(text, 0) {
                                    Some(vector) => passages.entry(i).or_default().push(vector),
                                    None => missing.push((i, Some(p))),
                                }
                            }
                        }
                        if missing.is_empty() {
                            for (i, passages) in passages {
                                mix_passages(&mut jobs[i], &passages);
                            }
                            for &i in &wanted {
                                jobs[i].record(Stage::Embed, started);
                            }
                            output.session(&cap).give_iterator(jobs.into_iter());
                            return;
                        }
                        let texts = missing
                            .iter()
                            .map(|&(i, passage)| text_of(&jobs[i], passage).to_string())
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
                        pending.take_result(result, &mut vectors);
                        for &i in &pending.wanted {
                            pending.jobs[i].record(Stage::Embed, pending.started);
                        }
                        output.session(&cap).give_iterator(pending.jobs.into_iter());
                    }
                }
            },
        )
    }
}
