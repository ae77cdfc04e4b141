//! The DLQ topic (see the parent module for what a record carries and how a batch is retried).

use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;

use super::super::kafka_log::{idempotent_producer, DeliveryContext};
use super::{DlqError, DlqSink};
use crate::ingest::dlq::{DlqRecord, Origin};

/// Kafka topic DLQ.
pub struct KafkaDlq {
    producer: BaseProducer<DeliveryContext>,
    topic: String,
    /// The batch a failed write left undelivered: its identity (address and length of the slice,
    /// the same while the caller retries it) and the records still to deliver.
    undelivered: Option<(BatchId, Vec<(usize, bool)>)>,
}

/// A batch's identity while its writer retries it: the address and length of its records.
type BatchId = (usize, usize);

/// How long the producer tries to deliver a record before reporting it failed (librdkafka's
/// `message.timeout.ms`); shorter than the flush deadline, so a flush sees every report.
pub const DELIVERY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a write waits for its records' delivery reports.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(30);

impl std::fmt::Debug for KafkaDlq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaDlq")
            .field("topic", &self.topic)
            .finish()
    }
}

impl KafkaDlq {
    /// Creates an idempotent producer for `topic` with the given client settings.
    pub fn new(client: &ClientConfig, topic: &str) -> Result<Self, KafkaError> {
        let producer = idempotent_producer(client, DELIVERY_TIMEOUT, "dlq producer")?;
        Ok(Self {
            producer,
            topic: topic.to_string(),
            undelivered: None,
        })
    }
}

impl KafkaDlq {
    /// Queues `record` (index `index` of its batch); `whole` = false leaves its value out.
    fn send(&self, index: usize, record: &DlqRecord, whole: bool) -> Result<(), KafkaError> {
        let mut headers = OwnedHeaders::new()
            .insert(Header {
                key: "error",
                value: Some(record.message.as_bytes()),
            })
            .insert(Header {
                key: "reason",
                value: Some(record.reason.as_str().as_bytes()),
            });
        if let Origin::Kafka {
            topic,
            partition,
            offset,
        } = &record.origin
        {
            headers = headers
                .insert(Header {
                    key: "topic",
                    value: Some(topic.as_bytes()),
                })
                .insert(Header {
                    key: "partition",
                    value: Some(partition.to_string().as_bytes()),
                })
                .insert(Header {
                    key: "offset",
                    value: Some(offset.to_string().as_bytes()),
                });
        } else {
            headers = headers.insert(Header {
                key: "origin",
                value: Some(record.origin.to_string().as_bytes()),
            });
        }
        if let Some(tenant) = &record.tenant {
            headers = headers.insert(Header {
                key: "tenant",
                value: Some(tenant.as_bytes()),
            });
        }
        if record.truncated || (!whole && record.value.is_some()) {
            headers = headers.insert(Header {
                key: "truncated",
                value: Some("true".as_bytes()),
            });
        }
        let mut message =
            BaseRecord::<[u8], [u8], usize>::with_opaque_to(&self.topic, index).headers(headers);
        if let Some(key) = record.key.as_deref() {
            message = message.key(key);
        }
        if let Some(value) = record.value.as_deref().filter(|_| whole) {
            message = message.payload(value);
        }
        let mut pending = message;
        loop {
            match self.producer.send(pending) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    self.producer.poll(Duration::from_millis(50));
                    pending = back;
                }
                Err((error, _)) => return Err(error),
            }
        }
    }
}

/// Whether the broker (or the producer, before sending) refused a record for its size.
fn too_large(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::MessageSizeTooLarge)
    )
}

/// Whether the broker refused the topic's name (`InvalidTopic`: a name it cannot hold, or one it
/// keeps for itself): no retry can deliver to it. A missing topic, an authorization or a broker away is an
/// outage (the topic can be created, the ACL granted).
fn refused(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::InvalidTopic)
    )
}

impl DlqSink for KafkaDlq {
    fn write(&mut self, records: &[DlqRecord]) -> Result<(), DlqError> {
        let batch = (records.as_ptr() as usize, records.len());
        // The records to send, each whole or without its value (once the broker refused it whole).
        let mut pending: Vec<(usize, bool)> = match self.undelivered.take() {
            Some((retried, left)) if retried == batch => left,
            _ => (0..records.len()).map(|index| (index, true)).collect(),
        };
        while !pending.is_empty() {
            let mut next = Vec::new();
            let mut outage = None;
            for (position, &(index, whole)) in pending.iter().enumerate() {
                match self.send(index, &records[index], whole) {
                    Ok(()) => {}
                    Err(error) if whole && too_large(&error) => next.push((index, false)),
                    Err(error) => {
                        // Queued ones are flushed below; this one and the rest are sent again.
                        next.extend(&pending[position..]);
                        outage = Some(error);
                        break;
                    }
                }
            }
            if let Err(error) = self.producer.flush(FLUSH_TIMEOUT) {
                self.undelivered = Some((batch, pending));
                return Err(DlqError::Unavailable(format!("DLQ flush: {error}")));
            }
            for (index, error) in self.producer.context().take_failed() {
                let whole = pending
                    .iter()
                    .find(|(i, _)| *i == index)
                    .is_none_or(|(_, whole)| *whole);
                if whole && too_large(&error) {
                    next.push((index, false));
                } else {
                    next.push((index, whole));
                    outage.get_or_insert(error);
                }
            }
            next.sort_unstable();
            next.dedup_by_key(|(index, _)| *index);
            if let Some(error) = outage {
                let left = next.len();
                self.undelivered = Some((batch, next));
                let message = format!("{left} DLQ record(s) not delivered: {error}");
                return Err(if refused(&error) {
                    DlqError::Refused(message)
                } else {
                    DlqError::Unavailable(message)
                });
            }
            pending = next;
        }
        Ok(())
    }
}
