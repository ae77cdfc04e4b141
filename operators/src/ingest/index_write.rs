//! IndexWrite: applies index work to this worker's shard and acknowledges it.
//!
//! Each input batch is written (deletes, upserts) and flushed before the operator returns, so once the
//! operator's frontier passes a time, everything of that time is durable in the index: the Kafka source
//! stores offsets only then (it probes this operator's output). Outages are retried with capped backoff,
//! blocking this worker; refusals (a bug, not an outage) are logged and counted, never silently dropped.

use std::collections::HashMap;
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
    let mut points: Vec<PointWrite> = batch
        .iter()
        .flat_map(|d| d.points.iter().cloned())
        .collect();
    let retryable = |error: &StoreError| matches!(error, StoreError::Unavailable(_));
    let started = Instant::now();
    let restamp: Vec<&PointWrite> = batch.iter().flat_map(|d| d.restamp.iter()).collect();
    if !restamp.is_empty() {
        let ids: Vec<uuid::Uuid> = restamp.iter().map(|point| point.id()).collect();
        let stored: HashMap<uuid::Uuid, Vec<f32>> =
            with_backoff("index", retryable, || store.dense_vectors(&ids))?
                .into_iter()
                .collect();
        for point in restamp {
            match stored.get(&point.id()) {
                Some(dense) => points.push(PointWrite {
                    dense: dense.clone(),
                    ..point.clone()
                }),
                // Not in the index (its embedding was dead-lettered): nothing to carry the version.
                None => tracing::warn!(document = %point.key, "no stored vector to restamp"),
            }
        }
    }
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

/// Points written (upserted or deleted) to a shard between two optimizations. The embedded engine has
/// no background optimizer: deleted points stay in its segments (memory and disk grow with churn, not
/// with the live index) and searches stay brute force until the shard is optimized. At this many
/// writes the pause is short (about a second per 10 000 points here) and bounded by the live size.
pub const OPTIMIZE_EVERY: usize = 20_000;

impl<'scope> WriteIndex<'scope> for StreamVec<'scope, u64, IndexDelta> {
    fn write_index(self, store: Arc<dyn VectorStore>) -> StreamVec<'scope, u64, IndexAck> {
        self.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(Pipeline, "IndexWrite", move |_cap, _info| {
            let mut since_optimize = 0usize;
            move |input, output| {
                input.for_each(|cap, data| {
                    match write_batch(store.as_ref(), data) {
                        Ok(ack) => {
                            since_optimize += ack.upserted + ack.deleted;
                            if since_optimize >= OPTIMIZE_EVERY {
                                since_optimize = 0;
                                let started = Instant::now();
                                // Written and flushed already: a failure here loses nothing.
                                match store.optimize() {
                                    Ok(()) => tracing::info!(seconds = started.elapsed().as_secs_f64(), "index shard optimized"),
                                    Err(error) => tracing::warn!(%error, "index optimization failed"),
                                }
                            }
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
