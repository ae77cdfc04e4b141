//! DLQ sinks: where refused events go, durably, before their offsets are stored.
//!
//! - [`KafkaDlq`]: the DLQ topic; the original bytes as value and key, headers `error`, `reason`, `topic`,
//!   `partition`, `offset`, `tenant`, `truncated`. Idempotent producer; each batch is flushed and
//!   every delivery report checked: a record the broker did not take (a missing topic, a broker
//!   away longer than [`DELIVERY_TIMEOUT`]) fails the write, which is retried (only the records not
//!   delivered yet) while the batch's offsets wait. A record over the broker's message limit is
//!   sent again without its value (header `truncated`), so no record can block the queue.
//! - [`FileDlq`]: a JSONL file (directory and JSONL sources, or when no broker is configured); each batch
//!   is appended and fsynced.
//!
//! The DlqWrite operator writes on a helper thread ([`Background`]), never on the worker: a flood of bad
//! records (each batch flushed, outages retried) never holds the worker's queries. The batch's
//! capability is kept until its records are durable, so offsets wait for them.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Operator;
use timely::dataflow::StreamVec;

use super::kafka_log::{idempotent_producer, DeliveryContext};
use crate::events::{DeadLettered, InternalEvent};
use crate::ingest::dlq::{DlqLine, DlqRecord, Origin};
use crate::offload::{with_backoff, Background, Deliver, Parked};

pub use crate::ingest::dlq::DlqSink;

/// JSONL file DLQ.
#[derive(Debug)]
pub struct FileDlq {
    path: PathBuf,
}

impl FileDlq {
    /// Appends to `path` (created with its parent directories on first write).
    pub fn new(path: PathBuf) -> Self {
        Self { path }
    }
}

impl DlqSink for FileDlq {
    fn write(&mut self, records: &[DlqRecord]) -> Result<(), String> {
        if records.is_empty() {
            return Ok(());
        }
        if let Some(parent) = self.path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| e.to_string())?;
        let mut buffer = Vec::new();
        for record in records {
            let line = serde_json::to_vec(&DlqLine::from(record)).map_err(|e| e.to_string())?;
            buffer.extend_from_slice(&line);
            buffer.push(b'\n');
        }
        file.write_all(&buffer).map_err(|e| e.to_string())?;
        file.sync_data().map_err(|e| e.to_string())
    }
}

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
    pub fn new(client: &ClientConfig, topic: &str) -> Result<Self, String> {
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

impl DlqSink for KafkaDlq {
    fn write(&mut self, records: &[DlqRecord]) -> Result<(), String> {
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
                        outage = Some(error.to_string());
                        break;
                    }
                }
            }
            if let Err(error) = self.producer.flush(FLUSH_TIMEOUT) {
                self.undelivered = Some((batch, pending));
                return Err(format!("DLQ flush: {error}"));
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
                    outage.get_or_insert_with(|| error.to_string());
                }
            }
            next.sort_unstable();
            next.dedup_by_key(|(index, _)| *index);
            if let Some(error) = outage {
                let left = next.len();
                self.undelivered = Some((batch, next));
                return Err(format!("{left} DLQ record(s) not delivered: {error}"));
            }
            pending = next;
        }
        Ok(())
    }
}

/// Extension trait: write DLQ records.
pub trait WriteDlq<'scope> {
    /// Writes each batch durably (retrying outages); emits the number written, for the ack probe.
    fn write_dlq(self, sink: Box<dyn DlqSink>) -> StreamVec<'scope, u64, usize>;
}

impl<'scope> WriteDlq<'scope> for StreamVec<'scope, u64, DlqRecord> {
    fn write_dlq(self, mut sink: Box<dyn DlqSink>) -> StreamVec<'scope, u64, usize> {
        let scope = self.scope();
        self.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(
            Pipeline,
            "DlqWrite",
            move |_cap, info| {
                let waker = crate::offload::operator_waker(scope.worker(), &info.address);
                let writer = Background::start(
                    "ragstream-dlq-writer",
                    move |records: Vec<DlqRecord>, deliver: &Deliver<usize>| {
                        // A DLQ outage is an outage: retry until written; offsets wait for it.
                        let written =
                            with_backoff("dlq", |_: &String| true, || sink.write(&records));
                        for record in &records {
                            DeadLettered(record).emit();
                        }
                        deliver.send(if written.is_ok() { records.len() } else { 0 });
                    },
                    waker,
                );
                // The batches with the writer, oldest first, each at its capability.
                let mut pending: Parked<timely::dataflow::operators::Capability<u64>, (), usize> =
                    Parked::default();
                move |input, output| {
                    input.for_each(|cap, data| {
                        let ticket = writer.submit(std::mem::take(data));
                        pending.park(cap.retain_least(0).expect("time of the batch"), (), ticket);
                    });
                    for (cap, (), written) in pending.ready_in_order() {
                        output.session(&cap).give(written);
                    }
                }
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_dlq_appends_jsonl_with_reason_and_origin() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("dlq").join("dlq.jsonl");
        let mut sink = FileDlq::new(path.clone());
        let record = DlqRecord::new(
            crate::ingest::dlq::DlqReason::MalformedJson,
            "malformed JSON: expected value".into(),
            Origin::File {
                path: "events.jsonl".into(),
                line: Some(3),
            },
            None,
            None,
            Some(b"{oops"),
        );
        sink.write(std::slice::from_ref(&record)).expect("write");
        sink.write(&[record]).expect("append");
        let text = std::fs::read_to_string(path).expect("read");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["reason"], "malformed_json");
        assert_eq!(lines[0]["origin"], "events.jsonl:3");
        assert_eq!(lines[0]["value_prefix"], "{oops");
    }
}
