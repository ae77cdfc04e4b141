//! Calls to model endpoints (a reranker, a HyDE writer) off the dataflow worker.
//!
//! A [`remote`] stage hands each record's call to a small pool of threads and holds the record's
//! capability until the answer is back; the pool wakes the operator, which then finishes the record
//! and sends it on. Meanwhile the worker runs the rest of the dataflow: a slow endpoint delays the
//! queries that wait for it, never ingest or other queries. Each call is bounded by the endpoint
//! client's own timeout; an error is handed to `finish` like an answer, which falls back.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::{Capability, Operator};
use timely::dataflow::StreamVec;

use super::endpoints::{apply_scores, PassageWriter, RerankKind, Reranker};
use super::job::{HydePassage, QueryJob, Working};
use super::{cache::LruTtl, Action, Cause, Decision, Mode};
use crate::metrics::metrics;

type Call = Box<dyn FnOnce() + Send>;
/// Where the pool's threads hand back each call's result, by call id.
type Answers<R> = (Sender<(u64, R)>, Receiver<(u64, R)>);

/// Threads that run calls, in arrival order, as many at once as there are threads.
struct CallPool {
    jobs: Sender<Call>,
}

impl CallPool {
    fn new(name: &str, threads: usize) -> Self {
        let (jobs, queue) = channel::<Call>();
        let queue = Arc::new(Mutex::new(queue));
        for index in 0..threads.max(1) {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("{name}-{index}"))
                .spawn(move || loop {
                    // The pool is dropped with its operator: the channel closes and the thread ends.
                    let next = queue.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    match next {
                        Ok(call) => call(),
                        Err(_) => break,
                    }
                })
                .expect("endpoint call thread starts");
        }
        Self { jobs }
    }

    /// Queues `call`; false when no thread is left to run it.
    fn run(&self, call: Call) -> bool {
        self.jobs.send(call).is_ok()
    }
}

/// An endpoint call: its answer, or why there is none.
pub(crate) type EndpointCall<R> = Box<dyn FnOnce() -> Result<R, String> + Send>;

/// A stage whose records may wait for an endpoint: `prepare` returns the call a record needs (or
/// `None`: the record goes on at once); its result is handed to `finish` on the worker. A call
/// still queued when `timeout` has passed is not made, and a call that panics is an error: every
/// record comes back.
pub(crate) fn remote<'scope, T: 'static, R: Send + 'static>(
    stream: StreamVec<'scope, u64, T>,
    name: &'static str,
    threads: usize,
    timeout: Duration,
    mut prepare: impl FnMut(&mut T) -> Option<EndpointCall<R>> + 'static,
    mut finish: impl FnMut(&mut T, Result<R, String>, Duration) + 'static,
) -> StreamVec<'scope, u64, T> {
    let scope = stream.scope();
    stream.unary::<CapacityContainerBuilder<Vec<T>>, _, _, _>(Pipeline, name, move |_, info| {
        let waker = crate::background::operator_waker(scope.worker(), &info.address);
        let pool = CallPool::new(&name.to_lowercase(), threads);
        let (results, answered): Answers<Result<R, String>> = channel();
        let mut waiting: HashMap<u64, (Capability<u64>, T, Instant)> = HashMap::new();
        let mut next = 0u64;
        move |input, output| {
            input.for_each(|cap, data| {
                let mut ready = Vec::new();
                for mut record in data.drain(..) {
                    match prepare(&mut record) {
                        Some(call) => {
                            let id = next;
                            next += 1;
                            let results = results.clone();
                            let waker = waker.clone();
                            let queued = Instant::now();
                            let queued_call: Call = Box::new(move || {
                                let result = if queued.elapsed() >= timeout {
                                    Err(format!(
                                        "no call slot free within the timeout ({} ms)",
                                        timeout.as_millis()
                                    ))
                                } else {
                                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call))
                                        .unwrap_or_else(
                                            |_| Err("the endpoint call panicked".into()),
                                        )
                                };
                                if results.send((id, result)).is_ok() {
                                    waker();
                                }
                            });
                            if pool.run(queued_call) {
                                let held = cap.retain_least(0).expect("time of the batch");
                                waiting.insert(id, (held, record, queued));
                            } else {
                                finish(
                                    &mut record,
                                    Err("no endpoint call thread".into()),
                                    Duration::ZERO,
                                );
                                ready.push(record);
                            }
                        }
                        None => ready.push(record),
                    }
                }
                if !ready.is_empty() {
                    output.session(&cap).give_iterator(ready.into_iter());
                }
            });
            while let Ok((id, result)) = answered.try_recv() {
                if let Some((cap, mut record, sent)) = waiting.remove(&id) {
                    finish(&mut record, result, sent.elapsed());
                    output.session(&cap).give(record);
                }
            }
        }
    })
}

/// Extension trait: the endpoint stages of the query flow.
pub trait RemoteSteps<'scope> {
    /// Asks the HyDE writer for a hypothetical passage for queries of the configured intents.
    fn hyde(
        self,
        writer: Arc<dyn PassageWriter>,
        config: super::endpoints::HydeConfig,
    ) -> StreamVec<'scope, u64, QueryJob>;
}

/// Extension trait: the reranker endpoint over the rerank window.
pub trait RemoteRerank<'scope> {
    /// Reorders the head of the built-in rerank by the endpoint's scores.
    fn rerank_endpoint(
        self,
        reranker: Arc<dyn Reranker>,
        window: usize,
        threads: usize,
        timeout: Duration,
    ) -> StreamVec<'scope, u64, Working>;
}

fn outcome(endpoint: &str, outcome: &str, took: Duration) {
    metrics()
        .endpoint_calls
        .with_label_values(&[endpoint, outcome])
        .inc();
    metrics()
        .endpoint_seconds
        .with_label_values(&[endpoint])
        .observe(took.as_secs_f64());
}

impl<'scope> RemoteSteps<'scope> for StreamVec<'scope, u64, QueryJob> {
    fn hyde(
        self,
        writer: Arc<dyn PassageWriter>,
        config: super::endpoints::HydeConfig,
    ) -> StreamVec<'scope, u64, QueryJob> {
        // Passages by query text; a cached one needs no call.
        let cache: Arc<Mutex<LruTtl<String, String>>> = Arc::new(Mutex::new(LruTtl::new(
            config.cache_entries.max(1),
            Duration::from_secs(3600),
        )));
        let lookup = cache.clone();
        let intents = config.intents.clone();
        remote(
            self,
            "Hyde",
            config.endpoint.concurrency,
            Duration::from_millis(config.endpoint.timeout_ms),
            move |job: &mut QueryJob| {
                let wanted = job.cached.is_none()
                    && matches!(job.query.mode, Mode::Bounded | Mode::Deep)
                    && job
                        .plan
                        .as_ref()
                        .is_some_and(|plan| intents.contains(&plan.intent));
                if !wanted {
                    return None;
                }
                if let Some(passage) = lookup.lock().expect("hyde cache").get(&job.query.text, 0) {
                    job.hyde = Some(HydePassage {
                        text: passage,
                        cached: true,
                    });
                    metrics()
                        .endpoint_calls
                        .with_label_values(&["hyde", "cached"])
                        .inc();
                    return None;
                }
                let writer = writer.clone();
                let text = job.query.text.clone();
                Some(Box::new(move || writer.write(&text)) as EndpointCall<String>)
            },
            move |job: &mut QueryJob, result: Result<String, String>, took| {
                job.record("hyde", Instant::now() - took);
                match result {
                    Ok(passage) => {
                        outcome("hyde", "ok", took);
                        cache.lock().expect("hyde cache").put(
                            job.query.text.clone(),
                            passage.clone(),
                            0,
                        );
                        job.hyde = Some(HydePassage {
                            text: passage,
                            cached: false,
                        });
                    }
                    Err(error) => {
                        outcome("hyde", "fallback", took);
                        job.degraded = true;
                        job.notes.push(format!(
                            "hyde endpoint unavailable ({error}): the query's own vector was used"
                        ));
                    }
                }
            },
        )
    }
}

impl<'scope> RemoteRerank<'scope> for StreamVec<'scope, u64, Working> {
    fn rerank_endpoint(
        self,
        reranker: Arc<dyn Reranker>,
        window: usize,
        threads: usize,
        timeout: Duration,
    ) -> StreamVec<'scope, u64, Working> {
        let kind: RerankKind = reranker.kind();
        let label = match kind {
            RerankKind::Llm => "rerank_llm",
            RerankKind::Cohere => "rerank_cohere",
            _ => "rerank_http",
        };
        remote(
            self,
            "RerankEndpoint",
            threads,
            timeout,
            move |working: &mut Working| {
                let ranked = working.job.cached.is_none()
                    && working.answer.error.is_none()
                    && matches!(working.job.query.mode, Mode::Bounded | Mode::Deep)
                    && working.candidates.len() > 1;
                if !ranked {
                    return None;
                }
                let texts: Vec<String> = working
                    .candidates
                    .iter()
                    .take(window)
                    .map(|c| c.stored.chunk.text.clone())
                    .collect();
                let query = working.job.query.text.clone();
                let reranker = reranker.clone();
                Some(Box::new(move || reranker.score(&query, &texts)) as EndpointCall<Vec<f32>>)
            },
            move |working: &mut Working, result: Result<Vec<f32>, String>, took| {
                working.job.record("rerank_endpoint", Instant::now() - took);
                match result {
                    Ok(scores) => {
                        outcome(label, "ok", took);
                        apply_scores(&mut working.candidates, window, &scores);
                        if working.job.query.trace {
                            working.trace.candidates = working
                                .candidates
                                .iter()
                                .map(super::TraceCandidate::from)
                                .collect();
                        }
                    }
                    Err(error) => {
                        outcome(label, "fallback", took);
                        working.job.degraded = true;
                        working.trace.decisions.push(Decision::new(
                            "",
                            Action::Adapted,
                            Cause::EndpointFallback,
                            format!("rerank endpoint ({}) unavailable: {error}", kind.as_str()),
                        ));
                        working.job.notes.push(format!(
                            "rerank endpoint ({}) unavailable ({error}): the built-in rerank order was kept",
                            kind.as_str()
                        ));
                    }
                }
            },
        )
    }
}
