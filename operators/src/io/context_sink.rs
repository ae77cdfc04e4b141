//! ContextSink: contexts to the HTTP caller waiting for them and to the contexts topic.
//!
//! The Kafka producer is idempotent (retries never duplicate or reorder) and keys each context by its
//! query id. Publishing never waits for the broker: each context is sent tagged with its batch's time,
//! the producer's delivery reports (served on the producer's own thread) count down the contexts of
//! each time still on their way and keep the batch's [`Promise`] when none is left, and the publish
//! operator holds a time until then, so a query's offset is stored only then. A context the broker
//! did not take (its delivery failed after the producer's own retries, or the producer's queue was
//! full) is sent again when the operator is next woken; it is never dropped.

use std::sync::Arc;
use std::time::Duration;

use super::query_ledger::{Handover, QueryLedger};

use super::query_source::HttpIngress;
use crate::metrics::{metrics, QueryOutcome, Sink};
use crate::offload::{Ticket, Waker};
use crate::query::job::Reply;
use crate::query::publish::{ContextSink, Published};
use ragstream_core::query::Context;

/// The longest a revocation waits for the contexts sent to reach the broker.
pub const HANDOVER_FLUSH: Duration = Duration::from_secs(5);

#[cfg(feature = "kafka")]
mod kafka;
#[cfg(feature = "kafka")]
use kafka::ContextsTopic;

/// Where contexts go.
pub struct ContextPublisher {
    http: Option<Arc<HttpIngress>>,
    /// The contexts topic (the `kafka` feature).
    #[cfg(feature = "kafka")]
    kafka: Option<ContextsTopic>,
    ledger: Arc<QueryLedger>,
}

impl std::fmt::Debug for ContextPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut debug = f.debug_struct("ContextPublisher");
        #[cfg(feature = "kafka")]
        debug.field(
            "kafka_topic",
            &self.kafka.as_ref().map(ContextsTopic::topic),
        );
        debug.finish()
    }
}

impl ContextSink for ContextPublisher {
    fn publish(&mut self, time: u64, contexts: Vec<(Context, Reply)>, waker: &Waker) -> Published {
        ContextPublisher::publish(self, time, contexts, waker)
    }

    fn send_again(&mut self) {
        ContextPublisher::send_again(self)
    }
}

impl ContextPublisher {
    /// Replies to HTTP callers through `http`.
    pub fn new(http: Option<Arc<HttpIngress>>) -> Self {
        Self {
            http,
            #[cfg(feature = "kafka")]
            kafka: None,
            ledger: Arc::default(),
        }
    }

    /// Publishes every context to `topic` as well, through an idempotent producer of `client`.
    #[cfg(feature = "kafka")]
    pub fn to_topic(
        mut self,
        client: &rdkafka::ClientConfig,
        topic: &str,
    ) -> Result<Self, rdkafka::error::KafkaError> {
        self.kafka = Some(ContextsTopic::new(client, topic)?);
        Ok(self)
    }

    /// What the queries consumer of this worker needs when its partitions are revoked: the ledger
    /// of its queries' leases, and a flush of this publisher's producer (at most [`HANDOVER_FLUSH`]).
    pub fn handover(&self) -> Handover {
        #[cfg(feature = "kafka")]
        let flush = self.kafka.as_ref().map(ContextsTopic::flusher);
        #[cfg(not(feature = "kafka"))]
        let flush: Option<fn() -> bool> = None;
        Handover {
            ledger: self.ledger.clone(),
            flush: Arc::new(move || flush.as_ref().is_none_or(|flush| flush())),
        }
    }

    /// Sends again the contexts whose delivery failed or that found the producer's queue full; never
    /// blocks (a queue still full keeps the rest for the next wake-up).
    pub fn send_again(&mut self) {
        #[cfg(feature = "kafka")]
        if let Some(kafka) = &self.kafka {
            kafka.send_again();
        }
    }

    /// Publishes a batch of contexts and returns those published (a context whose query's partition
    /// was revoked since it was read is not: its next owner answers the query; counted as
    /// `handed_over`), and the ticket whose promise is kept, waking the operator by `waker`, once all
    /// of them are on the broker (at once without Kafka).
    pub fn publish(
        &mut self,
        time: u64,
        contexts: Vec<(Context, Reply)>,
        waker: &Waker,
    ) -> Published {
        let published: Vec<(Context, Reply)> = contexts
            .into_iter()
            .filter(|(context, reply)| {
                let Reply::Kafka(lease) = reply else {
                    return true;
                };
                let ours = self.ledger.settle(lease);
                if !ours {
                    tracing::debug!(query = %context.query_id, "partition revoked: the next owner answers");
                    metrics().query_ended(context.mode, QueryOutcome::HandedOver);
                }
                ours
            })
            .collect();
        // The job's own questions (standing queries' evaluations) are answered to it only.
        #[cfg(feature = "kafka")]
        let ticket = match &self.kafka {
            Some(kafka) => {
                let to_topic: Vec<&Context> = published
                    .iter()
                    .filter(|(_, reply)| match (reply, &self.http) {
                        (Reply::Http(ticket), Some(http)) => !http.is_internal(*ticket),
                        _ => true,
                    })
                    .map(|(context, _)| context)
                    .collect();
                match to_topic.is_empty() {
                    true => Ticket::ready(()),
                    false => kafka.publish(time, &to_topic, waker),
                }
            }
            None => Ticket::ready(()),
        };
        #[cfg(not(feature = "kafka"))]
        let ticket = {
            let _ = (time, waker);
            Ticket::ready(())
        };
        if let Some(http) = &self.http {
            for (context, reply) in &published {
                if let Reply::Http(request) = reply {
                    http.reply(*request, context.clone());
                    metrics().context_published(Sink::Http);
                }
            }
        }
        (published, ticket)
    }
}
