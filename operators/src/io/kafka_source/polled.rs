//! A polled message decoded into its document event or DLQ record; a file's event waits as a
//! [`Polled::File`] for the source's helper thread to extract it.

use rdkafka::Message;

use crate::ingest::decode::{decode_deferred, DecodeConfig, Decoded, PendingFile};
use crate::ingest::dlq::{DlqRecord, Origin};
use crate::model::DocOp;

/// The document events (or DLQ records) of one poll batch.
pub(super) type Batch = Vec<Result<DocOp, DlqRecord>>;

/// A polled message, decoded, or a file still to extract with what its DLQ record would need.
pub(super) enum Polled {
    Done(Result<DocOp, DlqRecord>),
    File(Box<FileEvent>),
}

/// A file's event: its pending upsert and the message it came in.
pub(super) struct FileEvent {
    file: PendingFile,
    origin: Origin,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
}

impl Polled {
    /// Every event of a batch resolved, in order.
    #[allow(clippy::result_large_err)]
    pub(super) fn resolve_all(batch: Vec<Self>, decode: &DecodeConfig) -> Batch {
        batch.into_iter().map(|p| p.resolve(decode)).collect()
    }

    /// The event's operation, a file's extracted (on the helper thread), or its DLQ record.
    // The `Err` side is a DLQ record flowing through the dataflow as data, not an error path.
    #[allow(clippy::result_large_err)]
    fn resolve(self, decode: &DecodeConfig) -> Result<DocOp, DlqRecord> {
        match self {
            Self::Done(done) => done,
            Self::File(event) => {
                let FileEvent {
                    file,
                    origin,
                    key,
                    payload,
                } = *event;
                let tenant = file.key().tenant.clone();
                file.extract(decode).map_err(|error| {
                    DlqRecord::new(
                        error.reason,
                        error.to_string(),
                        origin,
                        Some(tenant),
                        key.as_deref(),
                        Some(&payload),
                    )
                })
            }
        }
    }
}

/// Decodes a polled message into its document event, or its DLQ record (tenant from the key).
// The `Err` side is a DLQ record flowing through the dataflow as data, not an error path.
#[allow(clippy::result_large_err)]
pub(super) fn decode_message<M: Message>(message: &M, decode: &DecodeConfig) -> Polled {
    let origin = Origin::Kafka {
        topic: message.topic().to_string(),
        partition: message.partition(),
        offset: message.offset(),
    };
    let decoded = decode_deferred(message.key(), message.payload(), decode);
    let decoded = match decoded {
        Ok(Decoded::Ready(op)) => Ok(op),
        Ok(Decoded::File(file)) => {
            return Polled::File(Box::new(FileEvent {
                file,
                origin,
                key: message.key().map(<[u8]>::to_vec),
                payload: message.payload().map(<[u8]>::to_vec).unwrap_or_default(),
            }))
        }
        Err(error) => Err(error),
    };
    Polled::Done(decoded.map_err(|error| {
        let tenant = message
            .key()
            .and_then(|k| std::str::from_utf8(k).ok())
            .and_then(|k| k.split_once('/'))
            .map(|(t, _)| t.to_string());
        DlqRecord::new(
            error.reason,
            error.to_string(),
            origin,
            tenant,
            message.key(),
            message.payload(),
        )
    }))
}
