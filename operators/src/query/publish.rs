//! Publish: hands contexts to a [`ContextSink`] (the contexts topic and HTTP replies:
//! `io::context_sink`) and holds each batch's time until its contexts are delivered: the sink keeps
//! the batch's promise ([`crate::offload`]) from its delivery reports, which wakes the operator.

use std::time::Instant;

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::{Capability, Operator};
use timely::dataflow::StreamVec;

use super::job::Reply;
use crate::metrics::{metrics, QueryOutcome};
use crate::offload::{operator_waker, Parked, Ticket, Waker};
use ragstream_core::query::{Context, Stage};

/// The contexts a sink published, and the ticket whose promise is kept once all are delivered.
pub type Published = (Vec<(Context, Reply)>, Ticket<()>);

/// Where published contexts go (implemented by `io::context_sink::ContextPublisher`).
pub trait ContextSink {
    /// Publishes a batch of contexts tagged with its dataflow `time` and returns those published (a
    /// context whose query was handed to another consumer since it was read is not) and the ticket
    /// whose promise is kept, calling `waker`, once every one of them is delivered; never blocks.
    fn publish(&mut self, time: u64, contexts: Vec<(Context, Reply)>, waker: &Waker) -> Published;
    /// Sends again what was not delivered (the sink wakes the operator for it); never blocks.
    fn send_again(&mut self);
}

/// Extension trait: publish contexts.
///
/// # Examples
///
/// A sink that delivers each batch at once (a real one keeps the promise from the broker's delivery
/// reports); the batch's time completes once it has, and so the example's dataflow finishes:
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use ragstream_core::query::Context;
/// use ragstream_operators::offload::{promise, Waker};
/// use ragstream_operators::query::job::Reply;
/// use ragstream_operators::query::publish::{ContextSink, Publish, Published};
/// use timely::dataflow::operators::vec::ToStream;
///
/// /// Keeps the query ids it was handed and delivers them at once.
/// struct Kept(Arc<Mutex<Vec<String>>>);
///
/// impl ContextSink for Kept {
///     fn publish(&mut self, _time: u64, contexts: Vec<(Context, Reply)>, waker: &Waker) -> Published {
///         self.0.lock().unwrap().extend(contexts.iter().map(|(c, _)| c.query_id.clone()));
///         let (delivered, ticket) = promise(waker);
///         delivered.keep(());
///         (contexts, ticket)
///     }
///     fn send_again(&mut self) {}
/// }
///
/// let kept = Arc::new(Mutex::new(Vec::new()));
/// let sink = kept.clone();
/// timely::example(move |scope| {
///     let context = |id: &str| (Context { query_id: id.into(), ..Context::default() }, Reply::Http(1));
///     vec![context("q1"), context("q2")]
///         .to_stream(scope)
///         .publish(Kept(sink));
/// });
/// assert_eq!(*kept.lock().unwrap(), ["q1", "q2"]);
/// ```
pub trait Publish<'scope> {
    /// Publishes each batch (HTTP replies, contexts topic); a batch's time completes (for the probe
    /// that gates query offsets) once its contexts are acknowledged by the broker.
    fn publish(self, publisher: impl ContextSink + 'static) -> StreamVec<'scope, u64, ()>;
}

impl<'scope> Publish<'scope> for StreamVec<'scope, u64, (Context, Reply)> {
    fn publish(self, mut publisher: impl ContextSink + 'static) -> StreamVec<'scope, u64, ()> {
        let scope = self.scope();
        self.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(
            Pipeline,
            "Publish",
            move |_, info| {
                let waker = operator_waker(scope.worker(), &info.address);
                // Batches whose contexts may still be on their way to the broker, at their time.
                let mut held: Parked<Capability<u64>, (), ()> = Parked::default();
                move |input, _output| {
                    input.for_each(|cap, data| {
                        let started = Instant::now();
                        let cap = cap.retain_least(0).expect("time of the batch");
                        let (contexts, delivered) =
                            publisher.publish(*cap.time(), std::mem::take(data), &waker);
                        metrics().observe_stage(Stage::Publish, started.elapsed().as_secs_f64());
                        for (context, _) in &contexts {
                            let outcome = if context.error.is_some() {
                                QueryOutcome::Error
                            } else {
                                QueryOutcome::Ok
                            };
                            if context.mode.is_some() {
                                metrics().query_ended(context.mode, outcome);
                            }
                            if let Some(total) = context.latency_ms.get("total") {
                                metrics().query_seconds.observe(total / 1000.0);
                            }
                            metrics().record_context(context);
                        }
                        held.park(cap, (), delivered);
                    });
                    publisher.send_again();
                    // A time completes once all of its contexts are on the broker.
                    drop(held.ready());
                }
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::time::Duration;

    use crate::offload::{promise, Promise};

    use timely::dataflow::operators::vec::Input;
    use timely::dataflow::operators::Probe;

    use super::*;

    /// Records what it is given; a batch is delivered once the test keeps its promise.
    struct HeldSink {
        published: Rc<RefCell<Vec<(u64, String)>>>,
        promises: Rc<RefCell<Vec<Promise<()>>>>,
    }

    impl ContextSink for HeldSink {
        fn publish(
            &mut self,
            time: u64,
            contexts: Vec<(Context, Reply)>,
            waker: &Waker,
        ) -> Published {
            let mut published = self.published.borrow_mut();
            published.extend(contexts.iter().map(|(c, _)| (time, c.query_id.clone())));
            let (delivered, ticket) = promise(waker);
            self.promises.borrow_mut().push(delivered);
            (contexts, ticket)
        }
        fn send_again(&mut self) {}
    }

    fn context(id: &str) -> (Context, Reply) {
        let context = Context {
            query_id: id.into(),
            ..Context::default()
        };
        (context, Reply::Http(1))
    }

    #[test]
    fn publish_holds_a_time_until_its_contexts_are_delivered() {
        timely::execute_directly(|worker| {
            let published = Rc::new(RefCell::new(Vec::new()));
            let promises = Rc::new(RefCell::new(Vec::new()));
            let sink = HeldSink {
                published: published.clone(),
                promises: promises.clone(),
            };
            let (mut input, probe) = worker.dataflow(|scope| {
                let (input, stream) = scope.new_input::<(Context, Reply)>();
                (input, stream.publish(sink).probe().0)
            });
            input.send(context("q1"));
            input.send(context("q2"));
            input.advance_to(1);
            for _ in 0..20 {
                worker.step();
            }
            assert_eq!(
                *published.borrow(),
                vec![(0, "q1".to_string()), (0, "q2".to_string())]
            );
            assert!(
                probe.less_equal(&0),
                "time 0 completes only once its contexts are delivered"
            );
            let kept: Vec<Promise<()>> = promises.borrow_mut().drain(..).collect();
            assert_eq!(kept.len(), 1, "one batch, one promise");
            // Keeping the promise on another thread wakes the operator.
            std::thread::spawn(move || kept.into_iter().for_each(|p| p.keep(())))
                .join()
                .expect("deliveries");
            let deadline = Instant::now() + Duration::from_secs(5);
            while probe.less_equal(&0) && Instant::now() < deadline {
                worker.step();
            }
            assert!(!probe.less_equal(&0), "time 0 completed after delivery");
        });
    }
}
