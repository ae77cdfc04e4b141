//! IndexWrite: applies index work to this worker's shard and acknowledges it.
//!
//! Each input batch is written (deletes, upserts) and flushed before the operator returns, so once the
//! operator's frontier passes a time, everything of that time is durable in the index: the Kafka source
//! stores offsets only then (it probes this operator's output). Outages are retried with capped backoff,
//! blocking this worker; refusals (a bug, not an outage) are logged and counted, never silently dropped.

use std::sync::Arc;
use std::time::Instant;

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Operator;
use timely::dataflow::StreamVec;

use super::embed::{with_backoff, IndexDelta};
use crate::metrics::metrics;
use crate::store::{PointWrite, StoreError, VectorStore};

/// What one write batch did.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct IndexAck {
    /// Points upserted.
    pub upserted: usize,
    /// Points deleted.
    pub deleted: usize,
}

/// Writes one batch of index work durably.
pub fn write_batch(store: &dyn VectorStore, batch: &[IndexDelta]) -> Result<IndexAck, StoreError> {
    let deletes: Vec<uuid::Uuid> = batch
        .iter()
        .flat_map(|d| d.deletes.iter().copied())
        .collect();
    let points: Vec<PointWrite> = batch
        .iter()
        .flat_map(|d| d.points.iter().cloned())
        .collect();
    let retryable = |error: &StoreError| matches!(error, StoreError::Unavailable(_));
    let started = Instant::now();
    with_backoff("index", retryable, || {
        store.delete(&deletes)?;
        if !deletes.is_empty() {
            crate::faults::fail_point(crate::faults::AFTER_INDEX_DELETE);
        }
        store.upsert(&points)?;
        store.flush()
    })?;
    metrics()
        .index_write_seconds
        .observe(started.elapsed().as_secs_f64());
    metrics().chunks_upserted.inc_by(points.len() as u64);
    metrics().chunks_deleted.inc_by(deletes.len() as u64);
    if !deletes.is_empty() || !points.is_empty() {
        metrics().index_generation.inc();
    }
    Ok(IndexAck {
        upserted: points.len(),
        deleted: deletes.len(),
    })
}

/// Extension trait: write index work.
pub trait WriteIndex<'scope> {
    /// Writes and flushes each batch; emits one ack per batch at the batch's time.
    fn write_index(self, store: Arc<dyn VectorStore>) -> StreamVec<'scope, u64, IndexAck>;
}

impl<'scope> WriteIndex<'scope> for StreamVec<'scope, u64, IndexDelta> {
    fn write_index(self, store: Arc<dyn VectorStore>) -> StreamVec<'scope, u64, IndexAck> {
        self.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(Pipeline, "IndexWrite", move |_cap, _info| {
            move |input, output| {
                input.for_each(|cap, data| {
                    match write_batch(store.as_ref(), data) {
                        Ok(ack) => {
                            crate::faults::fail_point(crate::faults::AFTER_INDEX_WRITE);
                            let now = crate::now_millis();
                            for delta in data.iter() {
                                let seconds = now.saturating_sub(delta.time) as f64 / 1000.0;
                                metrics().event_to_searchable_seconds.observe(seconds);
                            }
                            output.session(&cap).give(ack);
                        }
                        Err(error) => {
                            tracing::error!(%error, documents = data.len(), "index refused a write batch");
                        }
                    }
                    data.clear();
                });
            }
        })
    }
}
