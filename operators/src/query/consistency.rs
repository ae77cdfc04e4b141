//! AwaitConsistency: holds a `read_your_writes` query until the index reflects every document event
//! it must see (or its timeout passes, and its context says so).

use std::time::{Duration, Instant};

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::{Capability, Operator};
use timely::dataflow::StreamVec;

use super::job::{QueryJob, QueryServices};
use crate::metrics::metrics;
use ragstream_core::query::Consistency;

/// Extension trait: the `AwaitConsistency` operator.
pub trait AwaitConsistency<'scope> {
    /// Holds `read_your_writes` queries until the index reflects every earlier document event.
    fn await_consistency(self, services: QueryServices) -> StreamVec<'scope, u64, QueryJob>;
}

impl<'scope> AwaitConsistency<'scope> for StreamVec<'scope, u64, QueryJob> {
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
}
