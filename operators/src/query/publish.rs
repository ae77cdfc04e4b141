//! The ends of the query flow: RefuseQueries (DLQ record and error context) and Publish, which hands
//! contexts to a [`ContextSink`] (the contexts topic and HTTP replies: `io::context_sink`) and holds
//! each batch's time until its contexts are delivered.

use std::time::{Duration, Instant};

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::{Capability, Operator};
use timely::dataflow::StreamVec;

use super::job::*;
use super::Context;
use crate::ingest::dlq::{DlqRecord, DlqSink};
use crate::metrics::metrics;

/// Where published contexts go (implemented by `io::context_sink::ContextPublisher`).
pub trait ContextSink {
    /// Publishes a batch of contexts tagged with its dataflow `time` and returns those published: a
    /// context whose query was handed to another consumer since it was read is not.
    fn publish(&mut self, time: u64, contexts: Vec<(Context, Reply)>) -> Vec<(Context, Reply)>;
    /// Whether every context of batch `time` is delivered; never blocks.
    fn delivered(&self, time: u64) -> bool;
}

/// A refused query's error context (and its DLQ record, written here).
pub fn refusal_context(refusal: &Refusal) -> Context {
    Context {
        query_id: refusal.error.query_id.clone().unwrap_or_default(),
        tenant: refusal.error.tenant.clone().unwrap_or_default(),
        error: Some(refusal.error.to_string()),
        ..Context::default()
    }
}

/// Extension trait: write refused queries to the DLQ and turn them into error contexts.
pub trait RefuseQueries<'scope> {
    /// DLQ records written (durably) per batch; error contexts out.
    fn refuse(self, dlq: Box<dyn DlqSink>) -> StreamVec<'scope, u64, (Context, Reply)>;
}

impl<'scope> RefuseQueries<'scope> for StreamVec<'scope, u64, Refusal> {
    fn refuse(self, mut dlq: Box<dyn DlqSink>) -> StreamVec<'scope, u64, (Context, Reply)> {
        self.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(
            Pipeline,
            "RefuseQueries",
            move |_, _| {
                move |input, output| {
                    input.for_each(|cap, data| {
                        let records: Vec<DlqRecord> = data.iter().map(|r| r.dlq.clone()).collect();
                        let mut delay = Duration::from_millis(100);
                        while let Err(error) = dlq.write(&records) {
                            tracing::warn!(%error, "query DLQ write failed; retrying");
                            std::thread::sleep(delay);
                            delay = (delay * 2).min(Duration::from_secs(5));
                        }
                        for refusal in data.iter() {
                            metrics()
                                .queries
                                .with_label_values(&["unknown", "refused"])
                                .inc();
                            tracing::warn!(
                                reason = refusal.error.reason.as_str(),
                                origin = %refusal.dlq.origin,
                                error = %refusal.dlq.message,
                                "query refused"
                            );
                        }
                        output
                            .session(&cap)
                            .give_iterator(data.drain(..).map(|r| (refusal_context(&r), r.reply)));
                    });
                }
            },
        )
    }
}

/// Extension trait: publish contexts.
pub trait PublishContexts<'scope> {
    /// Publishes each batch (HTTP replies, contexts topic); a batch's time completes (for the probe
    /// that gates query offsets) once its contexts are acknowledged by the broker.
    fn publish(self, publisher: impl ContextSink + 'static) -> StreamVec<'scope, u64, ()>;
}

impl<'scope> PublishContexts<'scope> for StreamVec<'scope, u64, (Context, Reply)> {
    fn publish(self, mut publisher: impl ContextSink + 'static) -> StreamVec<'scope, u64, ()> {
        let scope = self.scope();
        self.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(
            Pipeline,
            "Publish",
            move |_, info| {
                let activator = scope.activator_for(info.address.clone());
                // Times whose contexts may still be on their way to the broker.
                let mut held: Vec<Capability<u64>> = Vec::new();
                move |input, _output| {
                    input.for_each(|cap, data| {
                        let started = Instant::now();
                        let cap = cap.retain_least(0).expect("time of the batch");
                        let contexts = publisher.publish(*cap.time(), std::mem::take(data));
                        metrics()
                            .query_stage_seconds
                            .with_label_values(&["publish"])
                            .observe(started.elapsed().as_secs_f64());
                        for (context, _) in &contexts {
                            let outcome = if context.error.is_some() {
                                "error"
                            } else {
                                "ok"
                            };
                            if !context.mode.is_empty() {
                                metrics()
                                    .queries
                                    .with_label_values(&[&context.mode, outcome])
                                    .inc();
                            }
                            if let Some(total) = context.latency_ms.get("total") {
                                metrics().query_seconds.observe(total / 1000.0);
                            }
                            metrics().record_context(context);
                        }
                        held.push(cap);
                    });
                    // A time completes once all of its contexts are on the broker.
                    held.retain(|cap| !publisher.delivered(*cap.time()));
                    if !held.is_empty() {
                        activator.activate_after(Duration::from_millis(2));
                    }
                }
            },
        )
    }
}
