//! Calls to model endpoints (a reranker, a HyDE writer) off the dataflow worker: the stage the
//! [`Hyde`](super::hyde) and [`RerankEndpoint`](super::rerank_endpoint) operators are built on.
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

/// Counts an endpoint call's outcome and time (`ragstream_endpoint_calls_total`,
/// `ragstream_endpoint_seconds`).
pub(crate) fn outcome(endpoint: &str, outcome: &str, took: Duration) {
    metrics()
        .endpoint_calls
        .with_label_values(&[endpoint, outcome])
        .inc();
    metrics()
        .endpoint_seconds
        .with_label_values(&[endpoint])
        .observe(took.as_secs_f64());
}
