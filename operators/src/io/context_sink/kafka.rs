//! The contexts topic: an idempotent producer keyed by query id whose delivery reports keep each
//! batch's promise (see the parent module).

use std::collections::BTreeMap;
use std::sync::Mutex;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientConfig, ClientContext};

use super::HANDOVER_FLUSH;
use crate::io::kafka_log::{log_client_error, ErrorDedup};
use crate::metrics::{metrics, Sink};
use crate::offload::{lock, promise, Promise, Ticket, Waker};
use ragstream_core::query::Context;

/// The contexts topic and its producer.
pub(super) struct ContextsTopic {
    producer: ThreadedProducer<Deliveries>,
    topic: String,
}

impl ContextsTopic {
    pub(super) fn new(client: &ClientConfig, topic: &str) -> Result<Self, KafkaError> {
        let producer: ThreadedProducer<Deliveries> = client
            .clone()
            .set("enable.idempotence", "true")
            .set("linger.ms", "0")
            .create_with_context(Deliveries::default())?;
        Ok(Self {
            producer,
            topic: topic.to_string(),
        })
    }

    pub(super) fn topic(&self) -> &str {
        &self.topic
    }

    /// Flushes the contexts sent so far (at most [`HANDOVER_FLUSH`]); true once all are on the broker.
    pub(super) fn flusher(&self) -> impl Fn() -> bool + Send + Sync + 'static {
        let producer = self.producer.clone();
        move || producer.flush(HANDOVER_FLUSH).is_ok()
    }

    /// Sends again the contexts whose delivery failed or that found the producer's queue full; never
    /// blocks (a queue still full keeps the rest for the next wake-up).
    pub(super) fn send_again(&self) {
        let deliveries = self.producer.context();
        let failed = std::mem::take(&mut *lock(&deliveries.failed));
        let mut failed = failed.into_iter();
        for (time, key, payload) in failed.by_ref() {
            // Still counted on its way: the first try failed.
            if let Err(full) = send(&self.producer, &self.topic, time, &key, &payload) {
                lock(&deliveries.failed).push(full);
                break;
            }
        }
        lock(&deliveries.failed).extend(failed);
    }

    /// Sends the contexts of batch `time`; the ticket's promise is kept, waking the operator by
    /// `waker`, once all of them are on the broker.
    pub(super) fn publish(&self, time: u64, contexts: &[&Context], waker: &Waker) -> Ticket<()> {
        let deliveries = self.producer.context();
        lock(&deliveries.waker).get_or_insert_with(|| waker.clone());
        let (delivered, ticket) = promise(waker);
        // Counted before the first is sent: the reports cannot run ahead of the count.
        let mut on_their_way = lock(&deliveries.on_their_way);
        let batch = on_their_way.entry(time).or_default();
        batch.count += contexts.len();
        batch.promises.push(delivered);
        drop(on_their_way);
        for context in contexts {
            let payload = serde_json::to_vec(context).expect("contexts serialise");
            let key = context.query_id.as_bytes();
            if let Err(full) = send(&self.producer, &self.topic, time, key, &payload) {
                deliveries.retry(full);
            }
            metrics().context_published(Sink::Kafka);
        }
        ticket
    }
}

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
        mode: head.and_then(|h| serde_json::from_value(h.mode.into()).ok()),
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
        let kafka = ContextsTopic::new(&client, "contexts").expect("producer");
        let (producer, topic) = (&kafka.producer, kafka.topic.as_str());
        let context = Context {
            query_id: "q-big".into(),
            tenant: "acme".into(),
            mode: Some(ragstream_core::query::Mode::ListSources),
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
                sent.mode_name()
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
