//! ContextSink: contexts to the HTTP caller waiting for them and to the contexts topic.
//!
//! The Kafka producer is idempotent (retries never duplicate or reorder) and keys each context by its
//! query id. Publishing never waits for the broker: each context is sent tagged with its batch's time,
//! the producer's delivery reports count down the contexts of each time still on their way
//! ([`ContextPublisher::delivered`]), and the publish operator holds a time until all of its contexts
//! are on the broker, so a query's offset is stored only then. A context the broker did not take (its
//! delivery failed after the producer's own retries) is sent again; it is never dropped.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::query_ledger::{Handover, QueryLedger};

use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};

use super::kafka_log::{log_client_error, ErrorDedup};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{ClientConfig, ClientContext};

use super::query_source::HttpIngress;
use crate::metrics::metrics;
use crate::query::job::Reply;
use crate::query::publish::ContextSink;
use ragstream_core::query::Context;

/// The longest a revocation waits for the contexts sent to reach the broker.
pub const HANDOVER_FLUSH: Duration = Duration::from_secs(5);

/// The contexts producer's context: client errors logged once per interval, and the delivery reports.
#[derive(Default)]
struct Deliveries {
    errors: ErrorDedup,
    /// Contexts sent and not yet on the broker, by batch time.
    on_their_way: Mutex<BTreeMap<u64, usize>>,
    /// Contexts whose delivery failed, to send again.
    failed: Mutex<Vec<Failed>>,
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
                let mut on_their_way = self.on_their_way.lock().expect("deliveries");
                if let Some(count) = on_their_way.get_mut(&time) {
                    *count -= 1;
                    if *count == 0 {
                        on_their_way.remove(&time);
                    }
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
                self.failed
                    .lock()
                    .expect("deliveries")
                    .push((*time, key, payload));
            }
        }
    }
}

/// Where contexts go.
pub struct ContextPublisher {
    http: Option<Arc<HttpIngress>>,
    kafka: Option<(Arc<BaseProducer<Deliveries>>, String)>,
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
    fn publish(&mut self, time: u64, contexts: Vec<(Context, Reply)>) -> Vec<(Context, Reply)> {
        ContextPublisher::publish(self, time, contexts)
    }

    fn delivered(&self, time: u64) -> bool {
        ContextPublisher::delivered(self, time)
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
                let producer: BaseProducer<Deliveries> = client
                    .clone()
                    .set("enable.idempotence", "true")
                    .set("linger.ms", "0")
                    .create_with_context(Deliveries::default())
                    .map_err(|e| e.to_string())?;
                Some((Arc::new(producer), topic.to_string()))
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

    /// Whether every context of batch `time` is on the broker. Serves the producer's delivery reports
    /// and sends again the contexts whose delivery failed; never blocks.
    pub fn delivered(&self, time: u64) -> bool {
        let Some((producer, topic)) = &self.kafka else {
            return true;
        };
        producer.poll(Duration::ZERO);
        let failed = std::mem::take(&mut *producer.context().failed.lock().expect("deliveries"));
        for (time, key, payload) in failed {
            // Still counted on its way: the first delivery failed.
            let _ = send(producer, topic, time, &key, &payload);
        }
        !producer
            .context()
            .on_their_way
            .lock()
            .expect("deliveries")
            .contains_key(&time)
    }

    /// Publishes a batch of contexts (Kafka sends are acknowledged later; see [`Self::in_flight`]) and
    /// returns those published: a context whose query's partition was revoked since it was read is
    /// not (its next owner answers the query; counted as `handed_over`).
    pub fn publish(&mut self, time: u64, contexts: Vec<(Context, Reply)>) -> Vec<(Context, Reply)> {
        let mut published = Vec::with_capacity(contexts.len());
        for (context, reply) in contexts {
            if let Reply::Kafka(lease) = &reply {
                if !self.ledger.settle(lease) {
                    tracing::debug!(query = %context.query_id, "partition revoked: the next owner answers");
                    metrics()
                        .queries
                        .with_label_values(&[&context.mode, "handed_over"])
                        .inc();
                    continue;
                }
            }
            if let Some((producer, topic)) = &self.kafka {
                let payload = serde_json::to_vec(&context).expect("contexts serialise");
                *producer
                    .context()
                    .on_their_way
                    .lock()
                    .expect("deliveries")
                    .entry(time)
                    .or_default() += 1;
                let _ = send(producer, topic, time, context.query_id.as_bytes(), &payload);
                metrics()
                    .contexts_published
                    .with_label_values(&["kafka"])
                    .inc();
            }
            if let (Reply::Http(ticket), Some(http)) = (&reply, &self.http) {
                http.reply(*ticket, context.clone());
                metrics()
                    .contexts_published
                    .with_label_values(&["http"])
                    .inc();
            }
            published.push((context, reply));
        }
        if let Some((producer, _)) = &self.kafka {
            producer.poll(Duration::ZERO);
        }
        published
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
/// sent in its place when it is over the producer's message limit. A full local queue is an outage
/// of the broker: waits and retries, never drops.
fn send(
    producer: &BaseProducer<Deliveries>,
    topic: &str,
    time: u64,
    key: &[u8],
    payload: &[u8],
) -> Option<Vec<u8>> {
    let mut replaced: Option<Vec<u8>> = None;
    loop {
        let record = BaseRecord::with_opaque_to(topic, Box::new(time))
            .key(key)
            .payload(replaced.as_deref().unwrap_or(payload));
        match producer.send(record) {
            Ok(()) => return replaced,
            Err((error, _)) if replaced.is_none() && too_large(&error) => {
                replaced = Some(too_large_context(key, payload));
            }
            Err((error, _)) => {
                tracing::warn!(%error, "contexts producer queue full; retrying");
                producer.poll(Duration::from_millis(100));
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
        let sent = send(producer, topic, 1, b"q-big", &payload).expect("replaced");
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
        assert_eq!(send(producer, topic, 1, b"q-small", &small), None);
    }
}
