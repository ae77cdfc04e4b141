//! AwaitConsistency: holds a `read_your_writes` query until the index reflects every document event
//! it must see (or its timeout passes, and its context says so).

use std::time::{Duration, Instant};

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::{Capability, Operator};
use timely::dataflow::StreamVec;

use super::job::{QueryJob, QueryServices};
use crate::metrics::metrics;
use ragstream_core::query::{Consistency, Stage};

/// Extension trait: the `AwaitConsistency` operator.
///
/// # Examples
///
/// Documents come from Kafka, and the index has acknowledged nothing of partition 0 yet: an
/// `eventual` query goes on at once; a `read_your_writes` one that must see offset 4 of partition 0
/// waits for it, here until its timeout, and its context will say so:
///
/// ```
/// use std::sync::atomic::Ordering;
/// use std::sync::Arc;
/// use std::time::Duration;
/// use ragstream_operators::query::consistency::AwaitConsistency;
/// use ragstream_operators::query::example::{job, services};
/// use timely::dataflow::operators::capture::{Capture, Extract};
/// use timely::dataflow::operators::vec::{Map, ToStream};
///
/// let answered = timely::example(|scope| {
///     let mut services = services();
///     services.progress.kafka.store(true, Ordering::SeqCst);
///     Arc::make_mut(&mut services.config).consistency_timeout_ms = Duration::from_millis(20);
///     let eventual = job(r#"{"query_id": "q1", "tenant": "t", "text": "tide pools"}"#);
///     let mut waits = job(
///         r#"{"query_id": "q2", "tenant": "t", "text": "tide pools", "consistency": "read_your_writes"}"#,
///     );
///     waits.wait_for.insert(0, 5);
///     vec![waits, eventual]
///         .to_stream(scope)
///         .await_consistency(services)
///         .map(|job| (job.query.query_id, job.notes))
///         .capture()
/// });
/// let answered: Vec<(String, Vec<String>)> =
///     answered.extract().into_iter().flat_map(|(_, jobs)| jobs).collect();
/// assert_eq!(answered[0], ("q1".to_string(), Vec::new()));
/// assert_eq!(answered[1].0, "q2");
/// assert!(answered[1].1[0].starts_with("read_your_writes: the index had not caught up after 20 ms"));
/// ```
pub trait AwaitConsistency<'scope> {
    /// Holds `read_your_writes` queries until the index reflects every earlier document event.
    fn await_consistency(self, services: QueryServices) -> StreamVec<'scope, u64, QueryJob>;
}

impl<'scope> AwaitConsistency<'scope> for StreamVec<'scope, u64, QueryJob> {
    fn await_consistency(self, services: QueryServices) -> StreamVec<'scope, u64, QueryJob> {
        let timeout = services.config.consistency_timeout_ms;
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
                    job.record(Stage::ConsistencyWait, *since);
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
}
