//! ContextSink: contexts to the HTTP caller waiting for them and to the contexts topic.
//!
//! The Kafka producer is idempotent (retries never duplicate or reorder) and keys each context by its
//! query id. Publishing does not wait for the broker: the publish operator holds the time of every
//! batch until the producer has nothing in flight (or flushes once a held time is a second old), so a
//! query's offset is stored only after its context is on the broker, without a broker round trip per
//! batch.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use super::kafka_log::QuietContext;
use rdkafka::ClientConfig;

use super::query_source::HttpIngress;
use crate::metrics::metrics;
use crate::query::ops::Reply;
use crate::query::Context;

/// Where contexts go.
pub struct ContextPublisher {
    http: Option<Arc<HttpIngress>>,
    kafka: Option<(BaseProducer<QuietContext>, String)>,
}

impl std::fmt::Debug for ContextPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContextPublisher")
            .field("kafka_topic", &self.kafka.as_ref().map(|(_, t)| t))
            .finish()
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
                let producer: BaseProducer<QuietContext> = client
                    .clone()
                    .set("enable.idempotence", "true")
                    .set("linger.ms", "0")
                    .create_with_context(QuietContext::new("contexts producer"))
                    .map_err(|e| e.to_string())?;
                Some((producer, topic.to_string()))
            }
            None => None,
        };
        Ok(Self { http, kafka })
    }

    /// Whether contexts sent to Kafka still wait for the broker's acknowledgement.
    pub fn in_flight(&self) -> bool {
        self.kafka.as_ref().is_some_and(|(producer, _)| {
            producer.poll(Duration::ZERO);
            producer.in_flight_count() > 0
        })
    }

    /// Waits until every context sent is acknowledged by the broker (retrying through outages).
    pub fn flush(&self) {
        if let Some((producer, _)) = &self.kafka {
            while let Err(error) = producer.flush(Duration::from_secs(10)) {
                tracing::warn!(%error, "contexts not yet acknowledged; retrying");
            }
        }
    }

    /// Publishes a batch of contexts (Kafka sends are acknowledged later; see [`Self::in_flight`]).
    pub fn publish(&mut self, contexts: &[(Context, Reply)]) {
        for (context, reply) in contexts {
            if let Some((producer, topic)) = &self.kafka {
                let payload = serde_json::to_vec(context).expect("contexts serialise");
                let mut record = BaseRecord::to(topic)
                    .key(&context.query_id)
                    .payload(&payload);
                // A full local queue is an outage of the broker: wait and retry, never drop.
                loop {
                    match producer.send(record) {
                        Ok(()) => {
                            metrics()
                                .contexts_published
                                .with_label_values(&["kafka"])
                                .inc();
                            break;
                        }
                        Err((error, returned)) => {
                            tracing::warn!(%error, "contexts producer queue full; retrying");
                            producer.poll(Duration::from_millis(100));
                            record = returned;
                        }
                    }
                }
            }
            if let (Reply::Http(ticket), Some(http)) = (reply, &self.http) {
                http.reply(*ticket, context.clone());
                metrics()
                    .contexts_published
                    .with_label_values(&["http"])
                    .inc();
            }
        }
        if let Some((producer, _)) = &self.kafka {
            producer.poll(Duration::ZERO);
        }
    }
}
