//! DLQ sinks: where refused events go, durably, before their offsets are stored.
//!
//! - `KafkaDlq` (the `kafka` feature): the DLQ topic; the original bytes as value and key, headers `error`, `reason`, `topic`,
//!   `partition`, `offset`, `tenant`, `truncated`. Idempotent producer; each batch is flushed and
//!   every delivery report checked: a record the broker did not take (a missing topic, a broker
//!   away longer than `DELIVERY_TIMEOUT`) fails the write, which is retried (only the records not
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
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Operator;
use timely::dataflow::StreamVec;

use crate::events::{DeadLettered, InternalEvent};
use crate::ingest::dlq::{DlqLine, DlqRecord};
use crate::offload::{with_backoff, Background, Deliver, Parked};

pub use crate::ingest::dlq::{DlqError, DlqSink};

#[cfg(feature = "kafka")]
mod kafka;
#[cfg(feature = "kafka")]
pub use kafka::{KafkaDlq, DELIVERY_TIMEOUT};

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
    fn write(&mut self, records: &[DlqRecord]) -> Result<(), DlqError> {
        if records.is_empty() {
            return Ok(());
        }
        let path = self.path.display();
        if let Some(parent) = self.path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| DlqError::from_io(&format!("creating {}", parent.display()), &e))?;
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| DlqError::from_io(&format!("opening {path}"), &e))?;
        let mut buffer = Vec::new();
        for record in records {
            let line = serde_json::to_vec(&DlqLine::from(record))
                .map_err(|e| DlqError::Refused(format!("encoding a record: {e}")))?;
            buffer.extend_from_slice(&line);
            buffer.push(b'\n');
        }
        file.write_all(&buffer)
            .and_then(|()| file.sync_data())
            .map_err(|e| DlqError::from_io(&format!("writing {path}"), &e))
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
                        // A DLQ outage is an outage: retry until written; offsets wait for it. A
                        // DLQ that can never take them stops the job (`stop_if_refused`).
                        crate::outage::stop_if_refused(with_backoff(
                            crate::outage::Dependency::Dlq,
                            DlqError::is_retryable,
                            || sink.write(&records),
                        ));
                        for record in &records {
                            DeadLettered(record).emit();
                        }
                        deliver.send(records.len());
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
    use crate::ingest::dlq::Origin;

    fn record() -> DlqRecord {
        DlqRecord::new(
            crate::ingest::dlq::DlqReason::MalformedJson,
            "malformed JSON".into(),
            Origin::File {
                path: "events.jsonl".into(),
                line: Some(1),
            },
            None,
            None,
            Some(b"{"),
        )
    }

    #[test]
    fn a_path_that_cannot_be_a_file_is_refused_a_full_disk_is_an_outage() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("a-file");
        std::fs::write(&file, "x").expect("a file");
        for path in [dir.path().to_path_buf(), file.join("dlq.jsonl")] {
            let error = FileDlq::new(path.clone())
                .write(&[record()])
                .expect_err("not a writable file");
            assert!(
                matches!(error, DlqError::Refused(_)) && !error.is_retryable(),
                "{}: {error}",
                path.display()
            );
            assert!(error.to_string().contains(&*dir.path().to_string_lossy()));
        }
        if cfg!(target_os = "linux") {
            let error = FileDlq::new("/dev/full".into())
                .write(&[record()])
                .expect_err("no space");
            assert!(error.is_retryable(), "{error}");
        }
    }

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
