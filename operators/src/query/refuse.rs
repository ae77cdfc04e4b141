//! RefuseQueries: a refused query's DLQ record is written (on a helper thread, retried while the DLQ
//! is down) and, once it is durable, its error context goes to Publish.

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::{Capability, Operator};
use timely::dataflow::StreamVec;

use super::job::{Refusal, Reply};
use crate::events::{InternalEvent, QueryRefused};
use crate::ingest::dlq::{DlqError, DlqRecord, DlqSink};
use crate::offload::{with_backoff, Background, Parked};
use ragstream_core::query::Context;

/// A refused query's error context (and its DLQ record, written here).
pub fn refusal_context(refusal: &Refusal) -> Context {
    Context {
        query_id: refusal.error.query_id.clone().unwrap_or_default(),
        tenant: refusal.error.tenant.clone().unwrap_or_default(),
        error: Some(refusal.error.to_string()),
        error_type: Some(refusal.error.reason.as_str().into()),
        ..Context::default()
    }
}

/// Extension trait: write refused queries to the DLQ and turn them into error contexts.
///
/// # Examples
///
/// A request that is not JSON is written to the DLQ (a JSONL file here) before its error context
/// leaves for its client:
///
/// ```
/// use ragstream_core::query::decode::{DlqReason, QueryError};
/// use ragstream_operators::ingest::dlq::{DlqRecord, Origin};
/// use ragstream_operators::io::dlq_sink::FileDlq;
/// use ragstream_operators::query::job::{Refusal, Reply};
/// use ragstream_operators::query::refuse::RefuseQueries;
/// use timely::dataflow::operators::capture::{Capture, Extract};
/// use timely::dataflow::operators::vec::{Map, ToStream};
///
/// let dir = tempfile::tempdir().expect("a directory");
/// let path = dir.path().join("dlq.jsonl");
/// let dlq = path.clone();
/// let refusal = Refusal {
///     error: QueryError {
///         reason: DlqReason::MalformedJson,
///         message: "query is not JSON".into(),
///         query_id: Some("q9".into()),
///         tenant: Some("t".into()),
///     },
///     dlq: DlqRecord::new(
///         DlqReason::MalformedJson,
///         "query is not JSON".into(),
///         Origin::Http { endpoint: "/v1/query".into() },
///         Some("t".into()),
///         None,
///         Some(b"{not json"),
///     ),
///     reply: Reply::Http(7),
/// };
/// let contexts = timely::example(move |scope| {
///     vec![refusal]
///         .to_stream(scope)
///         .refuse_queries(Box::new(FileDlq::new(dlq)))
///         .map(|(context, reply)| (context.query_id, context.error_type, reply == Reply::Http(7)))
///         .capture()
/// });
/// assert_eq!(
///     contexts.extract()[0].1,
///     [("q9".to_string(), Some("malformed_json".to_string()), true)]
/// );
/// let written = std::fs::read_to_string(&path).expect("the DLQ file");
/// assert_eq!(written.lines().count(), 1);
/// assert!(written.contains(r#""reason":"malformed_json""#), "{written}");
/// ```
pub trait RefuseQueries<'scope> {
    /// DLQ records written (durably) per batch; error contexts out.
    fn refuse_queries(self, dlq: Box<dyn DlqSink>) -> StreamVec<'scope, u64, (Context, Reply)>;
}

impl<'scope> RefuseQueries<'scope> for StreamVec<'scope, u64, Refusal> {
    fn refuse_queries(self, mut dlq: Box<dyn DlqSink>) -> StreamVec<'scope, u64, (Context, Reply)> {
        let scope = self.scope();
        self.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(
            Pipeline,
            "RefuseQueries",
            move |_, info| {
                // The DLQ writes (retried while the DLQ is down) run on a helper thread; a batch's
                // error contexts leave once its records are durable.
                let waker = crate::offload::operator_waker(scope.worker(), &info.address);
                let writer: Background<Vec<DlqRecord>, ()> = Background::start(
                    "query-dlq",
                    move |records: Vec<DlqRecord>, deliver| {
                        crate::outage::stop_if_refused(with_backoff(
                            crate::outage::Dependency::QueryDlq,
                            DlqError::is_retryable,
                            || dlq.write(&records),
                        ));
                        deliver.send(());
                    },
                    waker,
                );
                let mut pending: Parked<Capability<u64>, Vec<Refusal>, ()> = Parked::default();
                move |input, output| {
                    input.for_each(|cap, data| {
                        let cap = cap.retain_least(0).expect("time of the batch");
                        let ticket = writer.submit(data.iter().map(|r| r.dlq.clone()).collect());
                        pending.park(cap, std::mem::take(data), ticket);
                    });
                    for (cap, refusals, ()) in pending.ready_in_order() {
                        for refusal in &refusals {
                            QueryRefused {
                                reason: refusal.error.reason.as_str(),
                                record: &refusal.dlq,
                            }
                            .emit();
                        }
                        output.session(&cap).give_iterator(
                            refusals.into_iter().map(|r| (refusal_context(&r), r.reply)),
                        );
                    }
                }
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::sync::Arc;

    use timely::dataflow::operators::vec::Input;
    use timely::dataflow::operators::{Inspect, Probe};

    use super::*;
    use crate::ingest::dlq::Origin;
    use ragstream_core::query::decode::{DlqReason, QueryError};

    /// Fails its first `failures` writes, then keeps the records.
    struct FlakyDlq {
        failures: usize,
        written: Arc<std::sync::Mutex<Vec<DlqRecord>>>,
    }

    impl DlqSink for FlakyDlq {
        fn write(&mut self, records: &[DlqRecord]) -> Result<(), DlqError> {
            if self.failures > 0 {
                self.failures -= 1;
                return Err(DlqError::Unavailable("down".into()));
            }
            self.written.lock().unwrap().extend_from_slice(records);
            Ok(())
        }
    }

    #[test]
    fn refused_queries_are_dead_lettered_before_their_error_contexts_go_out() {
        let written = Arc::new(std::sync::Mutex::new(Vec::new()));
        let dlq = FlakyDlq {
            failures: 1,
            written: written.clone(),
        };
        let seen = timely::execute_directly(move |worker| {
            let seen = Rc::new(RefCell::new(Vec::new()));
            let out = seen.clone();
            let written = written.clone();
            let (mut input, probe) = worker.dataflow(|scope| {
                let (input, stream) = scope.new_input::<Refusal>();
                let probe = stream
                    .refuse_queries(Box::new(dlq))
                    .inspect(move |(context, reply): &(Context, Reply)| {
                        // The record is durable before its context leaves.
                        assert_eq!(written.lock().unwrap().len(), 1);
                        out.borrow_mut().push((context.clone(), *reply));
                    })
                    .probe()
                    .0;
                (input, probe)
            });
            input.send(Refusal {
                error: QueryError {
                    reason: DlqReason::MalformedJson,
                    message: "query is not JSON".into(),
                    query_id: Some("q9".into()),
                    tenant: Some("acme".into()),
                },
                dlq: DlqRecord::new(
                    DlqReason::MalformedJson,
                    "query is not JSON".into(),
                    Origin::Http {
                        endpoint: "/v1/query".into(),
                    },
                    Some("acme".into()),
                    None,
                    Some(b"{not json"),
                ),
                reply: Reply::Http(7),
            });
            input.advance_to(1);
            while probe.less_equal(&0) {
                worker.step();
            }
            seen.take()
        });
        assert_eq!(seen.len(), 1);
        let (context, reply) = &seen[0];
        assert_eq!(context.query_id, "q9");
        assert_eq!(context.tenant, "acme");
        assert!(context
            .error
            .as_deref()
            .unwrap()
            .starts_with("malformed_json"));
        assert_eq!(*reply, Reply::Http(7));
    }
}
