//! IndexWrite: applies index work to this worker's shard and acknowledges it.
//!
//! The writes run on a writer thread of the shard's own ([`shard_writer`] on a
//! [`Background`](crate::offload::Background) thread), never on the worker: the
//! operator hands each input batch over, keeps the batch's capability, and is woken when the batch is
//! written (deletes, upserts) and flushed; then it gives the ack at the batch's time and drops the
//! capability.
//!
//! # Guarantees
//! - Once the operator's frontier passes a time, everything of that time is durable in the index: the
//!   Kafka source stores offsets only then (it probes this operator's output).
//! - Batches are written and acknowledged in arrival order.
//! - Outages are retried with capped backoff on the writer thread; the worker keeps serving queries, and
//!   consumption pauses at the source's in-flight bound.
//! - A batch the index refuses (not an outage: a point it will never take) is written again one
//!   document at a time; each document still refused is dead-lettered (reason `index_refused`) at the
//!   batch's time, so offsets pass it only once its DLQ record is written. Nothing is dropped silently.
//! - Every `optimize_every` writes ([`crate::store::IndexTuning::optimize_every`]), and when no batch came for
//!   `optimize_idle_ms` after a write ([`crate::store::IndexTuning::optimize_idle_ms`]),
//!   the writer optimizes the shard after acknowledging; the index answers searches meanwhile (see
//!   `store::edge`), and writes wait for it on the writer thread.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Operator;
use timely::dataflow::StreamVec;

use super::acked::{held_by_index, SharedAcked};
use super::dlq::{DlqReason, DlqRecord, Origin};
use super::embed::IndexDelta;
use super::written::{DocChange, Finished};
use crate::events::{InternalEvent, ShardOptimized};
use crate::metrics::metrics;
use crate::model::{ChunkIds, DocKey};
use crate::offload::{with_backoff, Background, Deliver, Parked};
use crate::store::stats::StatsDelta;
use crate::store::{Bm25Encoder, PointWrite, SparseVector, StoreError, StoredVectors, VectorStore};

/// What one write batch did.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IndexAck {
    /// Points upserted.
    pub upserted: usize,
    /// Points deleted.
    pub deleted: usize,
    /// What the batch changed in the corpus's BM25 statistics ([`crate::store::stats`]).
    pub stats: StatsDelta,
    /// Chunks of the written documents deleted or rewritten with a new layout
    /// ([`IndexDelta::changed`]; none of a refused document).
    #[serde(default)]
    pub changed: Vec<uuid::Uuid>,
    /// In a cluster, the documents the batch finished and their chunks, for every process's change
    /// feed ([`Finished::ship`]).
    #[serde(default)]
    pub shipped: Option<super::written::ShippedChanges>,
}

/// What the writer did with one batch: what it wrote, and the documents the index refused.
#[derive(Debug, Default)]
pub struct BatchOutcome {
    /// Points written.
    pub ack: IndexAck,
    /// Documents the index refused, with the refusal.
    pub refused: Vec<(DocKey, StoreError)>,
    /// Their DLQ records, each with the document event as value (filled by [`shard_writer`]).
    pub dead_letters: Vec<DlqRecord>,
    /// The documents of the batch, in order (filled by [`shard_writer`]).
    pub written: Vec<(DocKey, u64)>,
    /// What the index holds of each document refused here or by the embedder, read back after the
    /// write (filled by [`shard_writer`]; see [`super::acked`]).
    pub held: HashMap<DocKey, ChunkIds>,
}

/// Writes a batch; if the index refuses it, writes its documents one by one and reports those it still
/// refuses. Outages are retried inside [`write_batch`] until the index is back. The ack's statistics
/// delta is what the shard holds after the writes minus what it held before, for the batch's points
/// (none for an index that applies IDF itself, [`VectorStore::engine_idf`]).
pub fn write_isolating(store: &dyn VectorStore, batch: &[IndexDelta]) -> BatchOutcome {
    let before = if store.engine_idf() {
        None
    } else {
        points_held(store, batch.iter())
    };
    let mut outcome = match write_batch(store, batch) {
        Ok(ack) => BatchOutcome {
            ack,
            ..BatchOutcome::default()
        },
        Err(error @ StoreError::Gone(_)) => gone(&error),
        Err(error) if batch.len() == 1 => BatchOutcome {
            refused: vec![(batch[0].key.clone(), error)],
            ..BatchOutcome::default()
        },
        Err(error) => {
            tracing::warn!(%error, documents = batch.len(), "index refused a batch; writing its documents one by one");
            let mut outcome = BatchOutcome::default();
            for delta in batch {
                match write_batch(store, std::slice::from_ref(delta)) {
                    Ok(ack) => {
                        outcome.ack.upserted += ack.upserted;
                        outcome.ack.deleted += ack.deleted;
                    }
                    Err(error @ StoreError::Gone(_)) => gone(&error),
                    Err(error) => outcome.refused.push((delta.key.clone(), error)),
                }
            }
            outcome
        }
    };
    outcome.ack.changed = batch
        .iter()
        .filter(|delta| outcome.refused.iter().all(|(key, _)| key != &delta.key))
        .flat_map(|delta| delta.changed.iter().copied())
        .collect();
    outcome.ack.stats = match before {
        Some(before) => stats_change(store, batch, before, &outcome.refused),
        None => StatsDelta::default(),
    };
    outcome
}

/// The collection was deleted under the job: writing on would leave the index missing everything
/// written before, so the job stops (nothing of the batch is acknowledged; the next start creates the
/// collection again and reads the batch again).
fn gone(error: &StoreError) -> ! {
    crate::outage::stop_job(&format!(
        "{error}; the next start creates it empty: re-send the documents indexed before, or reset the \
         consumer group to the start of the documents topic, to rebuild it"
    ))
}

/// The batch's points the shard holds, with their BM25 vectors (re-encoded from the stored text, as
/// the embed step encoded them); `None` (logged) when the index cannot say.
fn points_held<'a>(
    store: &dyn VectorStore,
    batch: impl Iterator<Item = &'a IndexDelta>,
) -> Option<HashMap<uuid::Uuid, (String, SparseVector)>> {
    let ids: Vec<uuid::Uuid> = batch.flat_map(IndexDelta::ids).collect();
    if ids.is_empty() {
        return Some(HashMap::new());
    }
    match with_backoff(
        crate::outage::Dependency::Index,
        StoreError::is_retryable,
        || store.get(&ids),
    ) {
        Ok(stored) => {
            let encoder = Bm25Encoder::default();
            Some(
                stored
                    .into_iter()
                    .map(|s| {
                        let sparse = encoder.encode_document(&s.chunk.embedding_input());
                        (s.id, (s.key.tenant, sparse))
                    })
                    .collect(),
            )
        }
        Err(error) => {
            tracing::warn!(%error, "index refused to read a batch's points; BM25 statistics miss the batch");
            None
        }
    }
}

/// The statistics delta of a written batch: its points held after the writes minus those held
/// before (`before`). Written documents end as [`write_batch`] leaves them (deletes, then upserts; a
/// restamp only where the point was held); a refused document's points are read back (and, where
/// the index cannot say, counted as before the batch).
fn stats_change(
    store: &dyn VectorStore,
    batch: &[IndexDelta],
    before: HashMap<uuid::Uuid, (String, SparseVector)>,
    refused: &[(DocKey, StoreError)],
) -> StatsDelta {
    let mut stats = StatsDelta::default();
    for (tenant, sparse) in before.values() {
        stats.count(tenant, sparse, -1);
    }
    let mut after = before.clone();
    let written = |d: &&IndexDelta| refused.iter().all(|(key, _)| key != &d.key);
    for delta in batch.iter().filter(written) {
        for id in &delta.deletes {
            after.remove(id);
        }
    }
    for delta in batch.iter().filter(written) {
        let restamped = delta.restamp.iter().filter(|p| before.contains_key(&p.id));
        for point in delta.points.iter().chain(restamped) {
            after.insert(point.id, (point.key.tenant.clone(), point.sparse.clone()));
        }
    }
    let refused_docs: Vec<&IndexDelta> = batch.iter().filter(|d| !written(d)).collect();
    if !refused_docs.is_empty() {
        match points_held(store, refused_docs.iter().copied()) {
            Some(held) => {
                for id in refused_docs.iter().flat_map(|d| d.ids()) {
                    after.remove(&id);
                }
                after.extend(held);
            }
            // The refused documents count as they were before; the written ones' changes still count.
            None => tracing::warn!(
                documents = refused_docs.len(),
                "BM25 statistics keep the refused documents as they were before the batch"
            ),
        }
    }
    for (tenant, sparse) in after.values() {
        stats.count(tenant, sparse, 1);
    }
    stats
}

/// The DLQ record of a document the index refused, with its document event as value.
fn refused_record(delta: &IndexDelta, error: &StoreError) -> DlqRecord {
    let key = &delta.key;
    tracing::error!(document = %key, %error, "index refused a document; dead-lettered");
    DlqRecord::new(
        DlqReason::IndexRefused,
        error.to_string(),
        Origin::File {
            path: key.to_string(),
            line: None,
        },
        Some(key.tenant.clone()),
        Some(key.to_string().as_bytes()),
        delta
            .document
            .as_deref()
            .map(crate::ingest::decode::encode_event)
            .as_deref(),
    )
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
    let started = Instant::now();
    let restamp: Vec<&PointWrite> = batch.iter().flat_map(|d| d.restamp.iter()).collect();
    if !restamp.is_empty() {
        let ids: Vec<uuid::Uuid> = restamp.iter().map(|point| point.id).collect();
        let stored: HashMap<uuid::Uuid, StoredVectors> = with_backoff(
            crate::outage::Dependency::Index,
            StoreError::is_retryable,
            || store.vectors(&ids),
        )?
        .into_iter()
        .collect();
        for point in restamp {
            match stored.get(&point.id) {
                Some(vectors) => points.push(PointWrite {
                    dense: vectors.dense.clone(),
                    evidence: vectors.evidence.clone(),
                    ..point.clone()
                }),
                // Not in the index (its embedding was dead-lettered): nothing to carry the version.
                None => tracing::warn!(document = %point.key, "no stored vector to restamp"),
            }
        }
    }
    with_backoff(
        crate::outage::Dependency::Index,
        StoreError::is_retryable,
        || {
            store.delete(&deletes)?;
            if !deletes.is_empty() {
                crate::faults::fail_point(crate::faults::AFTER_INDEX_DELETE);
            }
            store.upsert(&points)?;
            store.flush()
        },
    )?;
    metrics()
        .index_write_seconds
        .observe(started.elapsed().as_secs_f64());
    metrics().chunks_upserted.inc_by(points.len() as u64);
    metrics().chunks_deleted.inc_by(deletes.len() as u64);
    if !deletes.is_empty() || !points.is_empty() {
        metrics().index_generation.inc();
    }
    Ok(IndexAck {
        stats: StatsDelta::default(),
        upserted: points.len(),
        deleted: deletes.len(),
        changed: Vec::new(),
        shipped: None,
    })
}

/// When a shard's writer optimizes: every `every` points written, and after `when_idle` without a
/// batch following a write, so an index at rest is searched through indexed segments (the engine
/// indexes a segment once it holds more than about 10 MB of vectors; below that an optimization finds
/// nothing to do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Optimize {
    /// Points written (upserted or deleted) between two optimizations.
    pub every: usize,
    /// Idle time after a write that starts one (`None`: never on idling).
    pub when_idle: Option<Duration>,
}

impl From<&crate::store::IndexTuning> for Optimize {
    fn from(tuning: &crate::store::IndexTuning) -> Self {
        Self {
            every: tuning.optimize_every,
            when_idle: tuning.optimize_when_idle(),
        }
    }
}

/// The work of a shard's writer thread: writes each batch, delivers its result, then optimizes the shard
/// when `optimize_every` points were written since the last optimization, or when idle (`None`) after
/// any write. The embedded engine has no background optimizer: deleted points stay in its segments
/// (memory and disk grow with churn, not with the live index) and new points are searched one by one
/// until the shard is optimized.
pub fn shard_writer(
    store: Arc<dyn VectorStore>,
    optimize_every: usize,
) -> impl FnMut(Option<Vec<IndexDelta>>, &Deliver<BatchOutcome>) + Send + 'static {
    let mut since_optimize = 0usize;
    move |batch, deliver| {
        if let Some(batch) = batch {
            let mut outcome = write_isolating(store.as_ref(), &batch);
            outcome.dead_letters = outcome
                .refused
                .iter()
                .filter_map(|(key, error)| {
                    let delta = batch.iter().find(|delta| &delta.key == key)?;
                    Some(refused_record(delta, error))
                })
                .collect();
            outcome.written = batch
                .iter()
                .map(|delta| (delta.key.clone(), delta.time))
                .collect();
            for delta in &batch {
                let refused =
                    delta.refused || outcome.refused.iter().any(|(key, _)| key == &delta.key);
                if refused {
                    if let Some(held) = held_by_index(store.as_ref(), &delta.key) {
                        outcome.held.insert(delta.key.clone(), held);
                    }
                }
            }
            crate::faults::fail_point(crate::faults::AFTER_INDEX_WRITE);
            let now = crate::now_millis();
            for delta in &batch {
                if outcome.refused.iter().all(|(key, _)| key != &delta.key) {
                    let seconds = now.saturating_sub(delta.time) as f64 / 1000.0;
                    metrics().event_to_searchable_seconds.observe(seconds);
                }
            }
            since_optimize += outcome.ack.upserted + outcome.ack.deleted;
            deliver.send(outcome);
            if since_optimize < optimize_every {
                return;
            }
        } else if since_optimize == 0 {
            return;
        }
        since_optimize = 0;
        let started = Instant::now();
        metrics().index_optimizations_running.inc();
        // Written, flushed and acknowledged already: a failure here loses nothing.
        let result = store.optimize();
        metrics().index_optimizations_running.dec();
        ShardOptimized {
            seconds: started.elapsed().as_secs_f64(),
            error: result.as_ref().err().map(|e| e as &dyn std::fmt::Display),
        }
        .emit();
    }
}

/// Extension trait: write index work.
pub trait WriteIndex<'scope> {
    /// Writes and flushes each batch off the worker; emits, at the batch's time, one ack per batch and
    /// a DLQ record per document the index refused.
    /// The writer optimizes the shard as `optimize` says. Each document finished is recorded in
    /// `finished` ([`Finished`]).
    fn write_index(
        self,
        store: Arc<dyn VectorStore>,
        optimize: Optimize,
        acked: SharedAcked,
        finished: Finished,
    ) -> StreamVec<'scope, u64, Result<IndexAck, DlqRecord>>;
}

impl<'scope> WriteIndex<'scope> for StreamVec<'scope, u64, IndexDelta> {
    fn write_index(
        self,
        store: Arc<dyn VectorStore>,
        optimize: Optimize,
        acked: SharedAcked,
        finished: Finished,
    ) -> StreamVec<'scope, u64, Result<IndexAck, DlqRecord>> {
        let scope = self.scope();
        self.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(
            Pipeline,
            "IndexWrite",
            move |_cap, info| {
                let waker = crate::offload::operator_waker(scope.worker(), &info.address);
                let writer = Background::start_idle(
                    "ragstream-index-writer",
                    optimize.when_idle,
                    shard_writer(store, optimize.every),
                    waker,
                );
                // The batches with the writer, oldest first, each at its capability: a time stays
                // incomplete downstream (offsets uncommitted) until its batches are durable.
                // Each batch's new chunks ride with it while standing queries want them.
                let mut pending: Parked<
                    timely::dataflow::operators::Capability<u64>,
                    Vec<DocChange>,
                    BatchOutcome,
                > = Parked::default();
                move |input, output| {
                    input.for_each(|cap, data| {
                        let details = match finished.detailed() {
                            true => data
                                .iter()
                                .map(|delta| {
                                    DocChange::of(
                                        &delta.key,
                                        delta.time,
                                        (&delta.points, &delta.restamp),
                                    )
                                })
                                .collect(),
                            false => Vec::new(),
                        };
                        let ticket = writer.submit(std::mem::take(data));
                        pending.park(
                            cap.retain_least(0).expect("time of the batch"),
                            details,
                            ticket,
                        );
                    });
                    for (cap, details, mut outcome) in pending.ready_in_order() {
                        let mut ledger = acked.borrow_mut();
                        for (key, _) in &outcome.written {
                            ledger.finished(key, outcome.held.remove(key));
                        }
                        ledger.wake_embed();
                        drop(ledger);
                        outcome.ack.shipped = finished.record(outcome.written, details);
                        let mut session = output.session(&cap);
                        session.give_iterator(outcome.dead_letters.into_iter().map(Err));
                        session.give(Ok(outcome.ack));
                    }
                }
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DocKey;
    use crate::offload::Waker;
    use crate::store::edge::EdgeStore;
    use std::sync::mpsc::channel;
    use std::sync::Mutex;
    use std::time::Duration;

    fn delta(doc: &str) -> IndexDelta {
        IndexDelta {
            key: DocKey::new("t", doc),
            deletes: vec![],
            points: vec![],
            restamp: vec![],
            changed: vec![],
            time: 0,
            document: None,
            refused: false,
        }
    }

    #[test]
    fn batches_are_acknowledged_in_order_from_the_writer_thread() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn VectorStore> = Arc::new(EdgeStore::open(dir.path(), 4).unwrap());
        let (sender, woken) = channel();
        let sender = Mutex::new(sender);
        let waker: Waker = Arc::new(move || {
            let _ = sender
                .lock()
                .unwrap()
                .send(std::thread::current().name().map(str::to_string));
        });
        let optimize = Optimize::from(&crate::store::IndexTuning::default());
        let writer = Background::start_idle(
            "ragstream-index-writer",
            optimize.when_idle,
            shard_writer(store, optimize.every),
            waker,
        );
        let mut pending = crate::offload::Parked::default();
        for doc in ["a", "b", "c"] {
            pending.park(doc, (), writer.submit(vec![delta(doc)]));
        }
        let mut acks = Vec::new();
        while acks.len() < 3 {
            let thread = woken.recv_timeout(Duration::from_secs(10)).expect("woken");
            assert_eq!(thread.as_deref(), Some("ragstream-index-writer"));
            for (doc, (), outcome) in pending.ready_in_order() {
                assert!(outcome.refused.is_empty());
                acks.push((doc, outcome.ack));
            }
        }
        let docs: Vec<&str> = acks.iter().map(|(doc, _)| *doc).collect();
        assert_eq!(docs, ["a", "b", "c"]);
        let acks: Vec<IndexAck> = acks.into_iter().map(|(_, ack)| ack).collect();
        assert_eq!(acks, vec![IndexAck::default(); 3]);
    }

    /// The statistics delta of each batch is what the shard gained minus what it lost: a replayed
    /// batch and a repeated delete change nothing, a refused document counts nothing.
    #[test]
    fn the_statistics_delta_is_what_the_shard_gained_and_lost() {
        use crate::store::contract::{sample_point, DIMENSION};
        let dir = tempfile::tempdir().unwrap();
        let inner: Arc<dyn VectorStore> =
            Arc::new(EdgeStore::open(&dir.path().join("shard"), DIMENSION).unwrap());
        let rules = dir.path().join("rules");
        std::fs::write(&rules, "refuse c\n").unwrap();
        let store = crate::faults::FaultyStore::with_rules(inner, rules);
        let point = |doc: &str, text: &str| sample_point("t", doc, 1, text, &[]);
        let upsert = |point: &PointWrite| IndexDelta {
            points: vec![point.clone()],
            ..delta(&point.key.doc_id)
        };
        let counted = |points: &[&PointWrite], sign: i64| {
            let mut stats = StatsDelta::default();
            for point in points {
                stats.count("t", &point.sparse, sign);
            }
            stats
        };
        let (a, b, c) = (
            point("a", "alpha beta"),
            point("b", "beta gamma"),
            point("c", "gamma delta"),
        );
        let batch = [upsert(&a), upsert(&b), upsert(&c)];
        let first = write_isolating(&store, &batch);
        assert_eq!(first.refused.len(), 1, "c is refused");
        assert_eq!(first.ack.stats, counted(&[&a, &b], 1));
        let replay = write_isolating(&store, &batch[..2]);
        assert!(replay.ack.stats.is_empty(), "{:?}", replay.ack.stats);
        let delete_a = IndexDelta {
            deletes: vec![a.id],
            ..delta("a")
        };
        let gone = write_isolating(&store, std::slice::from_ref(&delete_a));
        assert_eq!(gone.ack.stats, counted(&[&a], -1));
        let again = write_isolating(&store, &[delete_a]);
        assert!(again.ack.stats.is_empty(), "{:?}", again.ack.stats);
    }

    #[test]
    fn a_refused_document_is_reported_and_the_rest_of_its_batch_is_written() {
        use crate::store::contract::{sample_point, DIMENSION};
        use crate::store::SearchFilter;
        let dir = tempfile::tempdir().unwrap();
        let inner: Arc<dyn VectorStore> =
            Arc::new(EdgeStore::open(&dir.path().join("shard"), DIMENSION).unwrap());
        let rules = dir.path().join("rules");
        std::fs::write(&rules, "refuse b\n").unwrap();
        let store = crate::faults::FaultyStore::with_rules(inner.clone(), rules);
        let batch: Vec<IndexDelta> = ["a", "b", "c"]
            .iter()
            .map(|doc| IndexDelta {
                points: vec![sample_point("t", doc, 1, &format!("text of {doc}"), &[])],
                document: Some(Arc::new(crate::model::Document {
                    key: DocKey::new("t", *doc),
                    version: 1,
                    source: format!("{doc}.md"),
                    kind: crate::model::DocKind::Markdown,
                    title: Some(doc.to_string()),
                    text: format!("text of {doc}"),
                    acl: vec!["ops".into()],
                    updated_ms: 1_700_000_000_000,
                    metadata: Default::default(),
                })),
                ..delta(doc)
            })
            .collect();
        let outcome = write_isolating(&store, &batch);
        assert_eq!(outcome.ack.upserted, 2);
        let refused: Vec<&str> = outcome
            .refused
            .iter()
            .map(|(key, _)| key.doc_id.as_str())
            .collect();
        assert_eq!(refused, ["b"]);
        assert!(matches!(outcome.refused[0].1, StoreError::Invalid(_)));
        let mut stored = Vec::new();
        inner
            .scroll(&SearchFilter::default(), &mut |chunk| {
                stored.push(chunk.key.doc_id)
            })
            .unwrap();
        stored.sort();
        assert_eq!(stored, ["a", "c"]);
        let record = refused_record(&batch[1], &outcome.refused[0].1);
        assert_eq!(record.reason, DlqReason::IndexRefused);
        assert_eq!(record.key.as_deref(), Some(&b"t/b"[..]));
        let value = record
            .value
            .as_deref()
            .expect("the document event as value");
        assert_eq!(
            crate::ingest::decode::decode_event(
                record.key.as_deref(),
                Some(value),
                &Default::default()
            ),
            Ok(crate::model::DocOp::Upsert(
                batch[1].document.as_deref().expect("a document").clone()
            ))
        );
    }

    /// In a small dataflow: while the index refuses writes as unavailable, the batch's time stays
    /// incomplete and the worker keeps stepping (the writer retries on its own thread); once the index
    /// is back the batch is written, acknowledged at its time, and the time completes.
    #[test]
    fn a_time_completes_only_once_its_batch_is_durable_and_the_worker_never_waits() {
        use crate::store::contract::{sample_point, DIMENSION};
        use crate::store::SearchFilter;
        use std::cell::RefCell;
        use std::rc::Rc;
        use timely::dataflow::operators::vec::Input;
        use timely::dataflow::operators::{Inspect, Probe};

        let dir = tempfile::tempdir().unwrap();
        let inner: Arc<dyn VectorStore> =
            Arc::new(EdgeStore::open(&dir.path().join("shard"), DIMENSION).unwrap());
        let down = dir.path().join("down");
        std::fs::write(&down, "").unwrap();
        let store: Arc<dyn VectorStore> = Arc::new(crate::faults::FaultyStore::with_down(
            inner.clone(),
            down.clone(),
        ));
        let (steps_while_down, outputs) = timely::execute_directly(move |worker| {
            let outputs = Rc::new(RefCell::new(Vec::new()));
            let seen = outputs.clone();
            let (mut input, probe) = worker.dataflow(|scope| {
                let (input, stream) = scope.new_input::<IndexDelta>();
                let probe = stream
                    .write_index(
                        store,
                        Optimize {
                            every: 1_000_000,
                            when_idle: None,
                        },
                        crate::ingest::acked::Acked::shared(),
                        Finished::default(),
                    )
                    .inspect(move |result| seen.borrow_mut().push(result.clone()))
                    .probe()
                    .0;
                (input, probe)
            });
            input.send(IndexDelta {
                points: vec![sample_point("t", "a", 1, "alpha beta", &[])],
                ..delta("a")
            });
            input.advance_to(1);
            let (started, mut steps) = (Instant::now(), 0);
            while started.elapsed() < Duration::from_millis(400) {
                worker.step();
                steps += 1;
            }
            assert!(
                probe.less_equal(&0),
                "time 0 is held while the index is down"
            );
            assert!(outputs.borrow().is_empty(), "nothing acknowledged");
            std::fs::remove_file(&down).unwrap();
            let deadline = Instant::now() + Duration::from_secs(20);
            while probe.less_equal(&0) && Instant::now() < deadline {
                worker.step();
            }
            assert!(!probe.less_equal(&0), "time 0 completed once written");
            (steps, outputs.take())
        });
        // A worker that slept in the writer's backoff (100 ms, then 200 ms) would step a few times.
        assert!(steps_while_down > 50, "{steps_while_down} steps in 400 ms");
        assert_eq!(outputs.len(), 1, "{outputs:?}");
        let ack = outputs[0].as_ref().expect("acknowledged");
        assert_eq!(ack.upserted, 1);
        assert_eq!(inner.count(&SearchFilter::default()).unwrap(), 1);
    }
}
