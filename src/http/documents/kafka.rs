//! The documents topic as `POST /v1/documents` and `ragstream ingest --brokers` write it.

use std::sync::Mutex;
use std::time::Duration;

use ragstream_operators::io::kafka_log::{idempotent_producer, DeliveryContext};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;

/// How long a batch waits for the broker's acknowledgements.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// Headroom over the largest admitted event in the producer's `message.max.bytes` (a tenant added
/// to the event, a file's extracted text written as JSON).
const EVENT_HEADROOM: usize = 1 << 20;
/// librdkafka's ceiling for `message.max.bytes`.
const MAX_MESSAGE_BYTES: usize = 1_000_000_000;

/// Why a batch was not written whole.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The producer or the broker refused one document as too large: sending it again cannot help.
    #[error("document {index} is too large for the documents topic: {error}")]
    TooLarge {
        /// Its position in the batch.
        index: usize,
        /// What refused it.
        error: KafkaError,
    },
    /// The broker did not take the batch (unreachable, or no acknowledgement in time): the batch
    /// may be sent again (the version guard makes a repeat harmless).
    #[error("{0}")]
    Unavailable(String),
}

impl SendError {
    /// Whether sending the batch again may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }

    fn of(index: usize, error: KafkaError) -> Self {
        match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::InvalidMessageSize) => {
                Self::TooLarge { index, error }
            }
            _ => Self::Unavailable(format!("document {index}: {error}")),
        }
    }
}

/// A producer of document events to the documents topic, one batch at a time.
pub struct KafkaDocuments {
    producer: Mutex<BaseProducer<DeliveryContext>>,
    topic: String,
}

impl KafkaDocuments {
    /// A producer for `topic`, idempotent (retries never duplicate or reorder an event), that
    /// takes events of up to `max_event_bytes` (`ingest.max_document_bytes`; librdkafka's own
    /// default is 1 MB).
    pub fn new(
        client: &ClientConfig,
        topic: &str,
        max_event_bytes: usize,
    ) -> Result<Self, KafkaError> {
        // Reports come before the flush deadline.
        let reported = DELIVERY_TIMEOUT - Duration::from_secs(5);
        let largest = max_event_bytes
            .saturating_add(EVENT_HEADROOM)
            .min(MAX_MESSAGE_BYTES);
        let mut client = client.clone();
        client.set("message.max.bytes", largest.to_string());
        let producer = idempotent_producer(&client, reported, "documents producer")?;
        Ok(Self {
            producer: Mutex::new(producer),
            topic: topic.to_string(),
        })
    }

    /// Sends `events` (key, value) and waits until the broker acknowledged every one.
    pub fn send(&self, events: &[(String, Vec<u8>)]) -> Result<(), SendError> {
        let producer = self.producer.lock().unwrap_or_else(|p| p.into_inner());
        // Reports of an earlier batch that gave up are not this batch's.
        producer.context().take_failed();
        for (index, (key, value)) in events.iter().enumerate() {
            let mut record = BaseRecord::<str, [u8], usize>::with_opaque_to(&self.topic, index)
                .key(key.as_str())
                .payload(value.as_slice());
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        producer.poll(Duration::from_millis(50));
                        record = back;
                    }
                    Err((error, _)) => return Err(SendError::of(index, error)),
                }
            }
        }
        producer.flush(DELIVERY_TIMEOUT).map_err(|error| {
            SendError::Unavailable(format!("the broker did not acknowledge the batch: {error}"))
        })?;
        match producer.context().take_failed().into_iter().next() {
            Some((index, error)) => Err(SendError::of(index, error)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No broker is needed: librdkafka checks an event's size against `message.max.bytes` when it
    /// is queued.
    fn unreachable() -> ClientConfig {
        let mut client = ClientConfig::new();
        client.set("bootstrap.servers", "127.0.0.1:1");
        client
    }

    #[test]
    fn an_event_over_the_producers_limit_is_too_large_and_not_retryable() {
        let producer = KafkaDocuments::new(&unreachable(), "docs", 1 << 20).expect("producer");
        let events = vec![
            ("t/a".to_string(), vec![b'x'; 10]),
            ("t/b".to_string(), vec![b'x'; (2 << 20) + EVENT_HEADROOM]),
        ];
        let error = producer.send(&events).expect_err("too large");
        assert!(
            matches!(error, SendError::TooLarge { index: 1, .. }),
            "{error}"
        );
        assert!(!error.is_retryable());
    }

    #[test]
    fn the_producer_takes_events_up_to_the_document_limit() {
        // librdkafka's default (1 MB) would refuse this 3 MiB event at once; with the document
        // limit it is queued, and only the missing broker keeps it from being acknowledged.
        let max_document_bytes = 8 << 20;
        let producer =
            KafkaDocuments::new(&unreachable(), "docs", max_document_bytes).expect("producer");
        let event = ("t/a".to_string(), vec![b'x'; 3 << 20]);
        let guard = producer.producer.lock().expect("producer");
        let record = BaseRecord::<str, [u8], usize>::with_opaque_to("docs", 0)
            .key(event.0.as_str())
            .payload(event.1.as_slice());
        assert!(guard.send(record).is_ok(), "queued");
        guard.purge(rdkafka::producer::PurgeConfig::default().queue());
    }
}
