//! ContextSink: contexts to the HTTP caller waiting for them and to the contexts topic.
//!
//! The Kafka producer is idempotent (retries never duplicate or reorder) and keys each context by its
//! query id. Publishing never waits for the broker: each context is sent tagged with its batch's time,
//! the producer's delivery reports (served on the producer's own thread) count down the contexts of
//! each time still on their way and keep the batch's [`Promise`] when none is left, and the publish
//! operator holds a time until then, so a query's offset is stored only then. A context the broker
//! did not take (its delivery failed after the producer's own retries, or the producer's queue was
//! full) is sent again when the operator is next woken; it is never dropped.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::query_ledger::{Handover, QueryLedger};

use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};

use super::kafka_log::{log_client_error, ErrorDedup};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{ClientConfig, ClientContext};

use super::query_source::HttpIngress;
use crate::metrics::metrics;
use crate::offload::{lock, promise, Promise, Ticket, Waker};
use crate::query::job::Reply;
use crate::query::publish::{ContextSink, Published};
use ragstream_core::query::Context;

/// The longest a revocation waits for the contexts sent to reach the broker.
pub const HANDOVER_FLUSH: Duration = Duration::from_secs(5);

/// The contexts producer's context: client errors logged once per interval, and the delivery reports.
#[derive(Default)]
struct Deliveries {
    errors: ErrorDedup,
    /// Contexts sent and not yet on the broker, by batch time.
    on_their_way: Mutex<BTreeMap<u64, OnTheirWay>>,
    /// Contexts whose delivery failed (or that found the producer's queue full), to send again.
    failed: Mutex<Vec<Failed>>,
    /// Wakes the publish operator to send the failed contexts again.
    waker: Mutex<Option<Waker>>,
}

/// The contexts of one batch time not yet on the broker, and the promises of its batches.
#[derive(Default)]
struct OnTheirWay {
    count: usize,
    promises: Vec<Promise<()>>,
}

impl Deliveries {
    /// Queues a context to send again and wakes the publish operator.
    fn retry(&self, failed: Failed) {
        lock(&self.failed).push(failed);
        self.wake();
    }

    fn wake(&self) {
        let waker = lock(&self.waker).clone();
        if let Some(waker) = waker {
            waker();
        }
    }
}

/// A context whose delivery failed: its batch time, key and payload.
type Failed = (u64, Vec<u8>, Vec<u8>);

impl ClientContext for Deliveries {
    fn error(&self, error: KafkaError, reason: &str) {
        log_client_error(&self.errors, "contexts producer", error, reason);
    }
}

impl ProducerContext for Deliveries {
    /// The batch time of the context.
    type DeliveryOpaque = Box<u64>;

    fn delivery(&self, report: &DeliveryResult<'_>, time: Box<u64>) {
        match report {
            Ok(_) => {
                let mut on_their_way = lock(&self.on_their_way);
                let delivered = on_their_way.get_mut(&time).and_then(|batch| {
                    batch.count = batch.count.saturating_sub(1);
                    (batch.count == 0).then(|| std::mem::take(&mut batch.promises))
                });
                if delivered.is_some() {
                    on_their_way.remove(&time);
                }
                drop(on_their_way);
                for promise in delivered.into_iter().flatten() {
                    promise.keep(());
                }
                // A delivery made room in the producer's queue for contexts that found it full.
                if !lock(&self.failed).is_empty() {
                    self.wake();
                }
            }
            Err((error, message)) => {
                log_client_error(
                    &self.errors,
                    "contexts producer",
                    error.clone(),
                    "delivery failed; sending again",
                );
                let key = message.key().unwrap_or_default().to_vec();
                let payload = message.payload().unwrap_or_default();
                // Over the broker's limit (lower than the producer's): an error context instead.
                let payload = if too_large(error) {
                    too_large_context(&key, payload)
                } else {
                    payload.to_vec()
                };
                self.retry((*time, key, payload));
            }
        }
    }
}

/// Where contexts go.
pub struct ContextPublisher {
    http: Option<Arc<HttpIngress>>,
    kafka: Option<(ThreadedProducer<Deliveries>, String)>,
    ledger: Arc<QueryLedger>,
}

impl std::fmt::Debug for ContextPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContextPublisher")
            .field("kafka_topic", &self.kafka.as_ref().map(|(_, t)| t))
            .finish()
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
    /// Replies to HTTP callers through `http` and, with `kafka = (client, topic)`, publishes every
    /// context to the contexts topic.
    pub fn new(
        http: Option<Arc<HttpIngress>>,
        kafka: Option<(&ClientConfig, &str)>,
    ) -> Result<Self, String> {
        let kafka = match kafka {
            Some((client, topic)) => {
                let producer: ThreadedProducer<Deliveries> = client
                    .clone()
                    .set("enable.idempotence", "true")
                    .set("linger.ms", "0")
                    .create_with_context(Deliveries::default())
                    .map_err(|e| e.to_string())?;
                Some((producer, topic.to_string()))
            }
            None => None,
        };
        Ok(Self {
            http,
            kafka,
            ledger: Arc::default(),
        })
    }

    /// What the queries consumer of this worker needs when its partitions are revoked: the ledger
    /// of its queries' leases, and a flush of this publisher's producer (at most [`HANDOVER_FLUSH`]).
    pub fn handover(&self) -> Handover {
        let producer = self.kafka.as_ref().map(|(producer, _)| producer.clone());
        Handover {
            ledger: self.ledger.clone(),
            flush: Arc::new(move || {
                producer
                    .as_ref()
                    .is_none_or(|producer| producer.flush(HANDOVER_FLUSH).is_ok())
            }),
        }
    }

    /// Sends again the contexts whose delivery failed or that found the producer's queue full; never
    /// blocks (a queue still full keeps the rest for the next wake-up).
    pub fn send_again(&mut self) {
        let Some((producer, topic)) = &self.kafka else {
            return;
        };
        let deliveries = producer.context();
        let failed = std::mem::take(&mut *lock(&deliveries.failed));
        let mut failed = failed.into_iter();
        for (time, key, payload) in failed.by_ref() {
            // Still counted on its way: the first try failed.
            if let Err(full) = send(producer, topic, time, &key, &payload) {
                lock(&deliveries.failed).push(full);
                break;
            }
        }
        lock(&deliveries.failed).extend(failed);
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
                    metrics()
                        .queries
                        .with_label_values(&[&context.mode, "handed_over"])
                        .inc();
                }
                ours
            })
            .collect();
        // The job's own questions (standing queries' evaluations) are answered to it only.
        let to_topic: Vec<&Context> = published
            .iter()
            .filter(|(_, reply)| match (reply, &self.http) {
                (Reply::Http(ticket), Some(http)) => !http.is_internal(*ticket),
                _ => true,
            })
            .map(|(context, _)| context)
            .collect();
        let ticket = match &self.kafka {
            Some((producer, topic)) if !to_topic.is_empty() => {
                let deliveries = producer.context();
                lock(&deliveries.waker).get_or_insert_with(|| waker.clone());
                let (delivered, ticket) = promise(waker);
                // Counted before the first is sent: the reports cannot run ahead of the count.
                let mut on_their_way = lock(&deliveries.on_their_way);
                let batch = on_their_way.entry(time).or_default();
                batch.count += to_topic.len();
                batch.promises.push(delivered);
                drop(on_their_way);
                for context in &to_topic {
                    let payload = serde_json::to_vec(context).expect("contexts serialise");
                    let key = context.query_id.as_bytes();
                    if let Err(full) = send(producer, topic, time, key, &payload) {
                        deliveries.retry(full);
                    }
                    metrics()
                        .contexts_published
                        .with_label_values(&["kafka"])
                        .inc();
                }
                ticket
            }
            _ => Ticket::ready(()),
        };
        if let Some(http) = &self.http {
            for (context, reply) in &published {
                if let Reply::Http(request) = reply {
                    http.reply(*request, context.clone());
                    metrics()
                        .contexts_published
                        .with_label_values(&["http"])
                        .inc();
                }
            }
        }
        (published, ticket)
    }
}

/// Whether the producer or the broker refused a record for its size.
fn too_large(error: &KafkaError) -> bool {
    matches!(
        error,
        KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge)
    )
}

/// The error context published in place of one over the message limit: the query's id, tenant and
/// mode, and what to ask for instead. Never larger than the query id and tenant it repeats.
fn too_large_context(key: &[u8], payload: &[u8]) -> Vec<u8> {
    #[derive(serde::Deserialize)]
    struct Head {
        #[serde(default)]
        tenant: String,
        #[serde(default)]
        mode: String,
    }
    let head = serde_json::from_slice::<Head>(payload).ok();
    let context = Context {
        query_id: String::from_utf8_lossy(key).into_owned(),
        tenant: head.as_ref().map(|h| h.tenant.clone()).unwrap_or_default(),
        mode: head.map(|h| h.mode).unwrap_or_default(),
        error: Some(format!(
            "the context of {} bytes exceeds the contexts topic's message limit; ask for fewer \
             results (k), a smaller token_budget, or page list_sources with a smaller k",
            payload.len()
        )),
        error_type: Some("too_large_context".into()),
        ..Context::default()
    };
    tracing::warn!(
        query = %context.query_id,
        bytes = payload.len(),
        "context over the message limit: an error context is published instead"
    );
    serde_json::to_vec(&context).expect("contexts serialise")
}

/// Hands one context to the producer, tagged with its batch `time`, and returns the error context
/// sent in its place when it is over the producer's message limit; a full local queue (an outage of
/// the broker) hands the context back, to send again when deliveries have made room.
fn send(
    producer: &ThreadedProducer<Deliveries>,
    topic: &str,
    time: u64,
    key: &[u8],
    payload: &[u8],
) -> Result<Option<Vec<u8>>, Failed> {
    let mut replaced: Option<Vec<u8>> = None;
    loop {
        let record = BaseRecord::with_opaque_to(topic, Box::new(time))
            .key(key)
            .payload(replaced.as_deref().unwrap_or(payload));
        match producer.send(record) {
            Ok(()) => return Ok(replaced),
            Err((error, _)) if replaced.is_none() && too_large(&error) => {
                replaced = Some(too_large_context(key, payload));
            }
            Err((error, _)) => {
                tracing::warn!(%error, "contexts producer queue full; sending again later");
                let payload = replaced.unwrap_or_else(|| payload.to_vec());
                return Err((time, key.to_vec(), payload));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_over_the_message_limit_is_replaced_by_an_error_context() {
        // No broker is needed: the producer checks the size before queueing.
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", "127.0.0.1:9")
            .set("message.max.bytes", "4096");
        let publisher = ContextPublisher::new(None, Some((&client, "contexts"))).expect("producer");
        let (producer, topic) = publisher.kafka.as_ref().expect("kafka");
        let context = Context {
            query_id: "q-big".into(),
            tenant: "acme".into(),
            mode: "list_sources".into(),
            context: "x".repeat(20_000),
            ..Context::default()
        };
        let payload = serde_json::to_vec(&context).expect("serialise");
        let sent = send(producer, topic, 1, b"q-big", &payload)
            .expect("queued")
            .expect("replaced");
        let sent: Context = serde_json::from_slice(&sent).expect("a context");
        assert_eq!(
            (
                sent.query_id.as_str(),
                sent.tenant.as_str(),
                sent.mode.as_str()
            ),
            ("q-big", "acme", "list_sources")
        );
        assert!(
            sent.error.as_deref().is_some_and(|e| e.contains("exceeds")),
            "{:?}",
            sent.error
        );
        // A context within the limit goes as it is.
        let small = serde_json::to_vec(&Context::default()).expect("serialise");
        assert_eq!(send(producer, topic, 1, b"q-small", &small), Ok(None));
    }
}
