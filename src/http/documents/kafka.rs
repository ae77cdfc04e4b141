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

/// A producer of document events to the documents topic, one batch at a time.
pub struct KafkaDocuments {
    producer: Mutex<BaseProducer<DeliveryContext>>,
    topic: String,
}

impl KafkaDocuments {
    /// A producer for `topic`, idempotent (retries never duplicate or reorder an event).
    pub fn new(client: &ClientConfig, topic: &str) -> Result<Self, String> {
        // Reports come before the flush deadline.
        let reported = DELIVERY_TIMEOUT - Duration::from_secs(5);
        let producer = idempotent_producer(client, reported, "documents producer")?;
        Ok(Self {
            producer: Mutex::new(producer),
            topic: topic.to_string(),
        })
    }

    /// Sends `events` (key, value) and waits until the broker acknowledged every one. `Err`: what
    /// failed (the broker unreachable, a message refused); the caller may send the batch again (the
    /// version guard makes a repeat harmless).
    pub fn send(&self, events: &[(String, Vec<u8>)]) -> Result<(), String> {
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
                    Err((error, _)) => return Err(format!("document {index}: {error}")),
                }
            }
        }
        producer
            .flush(DELIVERY_TIMEOUT)
            .map_err(|error| format!("the broker did not acknowledge the batch: {error}"))?;
        match producer.context().take_failed().first() {
            Some((index, error)) => Err(format!("document {index} was not delivered: {error}")),
            None => Ok(()),
        }
    }
}
