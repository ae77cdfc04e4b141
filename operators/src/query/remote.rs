//! Calls to model endpoints (a reranker, a HyDE writer) off the dataflow worker: the stage the
//! [`Hyde`](super::hyde) and [`RerankEndpoint`](super::rerank_endpoint) operators are built on.
//!
//! A [`remote`] stage hands each record's call to a small pool of threads and holds the record's
//! capability until the answer is back; the pool wakes the operator, which then finishes the record
//! and sends it on. Meanwhile the worker runs the rest of the dataflow: a slow endpoint delays the
//! queries that wait for it, never ingest or other queries. Each call is bounded by the endpoint
//! client's own timeout; an error is handed to `finish` like an answer, which falls back.

use std::time::{Duration, Instant};

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::{Capability, Operator};
use timely::dataflow::StreamVec;

use crate::metrics::{metrics, Endpoint, EndpointOutcome};
use crate::offload::{operator_waker, promise, CallPool, Parked};
use ragstream_core::query::endpoints::EndpointError;

/// An endpoint call: its answer, or why there is none.
pub(crate) type EndpointCall<R> = Box<dyn FnOnce() -> Result<R, EndpointError> + Send>;

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
    mut finish: impl FnMut(&mut T, Result<R, EndpointError>, Duration) + 'static,
) -> StreamVec<'scope, u64, T> {
    let scope = stream.scope();
    stream.unary::<CapacityContainerBuilder<Vec<T>>, _, _, _>(Pipeline, name, move |_, info| {
        let waker = operator_waker(scope.worker(), &info.address);
        let pool = CallPool::new(&name.to_lowercase(), threads);
        let mut waiting: Parked<Capability<u64>, (T, Instant), Result<R, EndpointError>> =
            Parked::default();
        move |input, output| {
            input.for_each(|cap, data| {
                let mut ready = Vec::new();
                for mut record in data.drain(..) {
                    let Some(call) = prepare(&mut record) else {
                        ready.push(record);
                        continue;
                    };
                    let (answer, ticket) = promise(&waker);
                    let queued = Instant::now();
                    let queued_call = Box::new(move || {
                        answer.keep(if queued.elapsed() >= timeout {
                            Err(EndpointError::NotCalled(format!(
                                "no call slot free within the timeout ({} ms)",
                                timeout.as_millis()
                            )))
                        } else {
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(call))
                                .unwrap_or_else(|_| {
                                    Err(EndpointError::Reply("the endpoint call panicked".into()))
                                })
                        });
                    });
                    if pool.run(queued_call) {
                        let held = cap.retain_least(0).expect("time of the batch");
                        waiting.park(held, (record, queued), ticket);
                    } else {
                        finish(
                            &mut record,
                            Err(EndpointError::NotCalled("no endpoint call thread".into())),
                            Duration::ZERO,
                        );
                        ready.push(record);
                    }
                }
                if !ready.is_empty() {
                    output.session(&cap).give_iterator(ready.into_iter());
                }
            });
            for (cap, (mut record, sent), result) in waiting.ready() {
                finish(&mut record, result, sent.elapsed());
                output.session(&cap).give(record);
            }
        }
    })
}

/// Counts an endpoint call's outcome and time (`ragstream_endpoint_calls_total`,
/// `ragstream_endpoint_seconds`).
pub(crate) fn outcome(endpoint: Endpoint, outcome: EndpointOutcome, took: Duration) {
    metrics().endpoint_call(endpoint, outcome, Some(took));
}
