//! Embed: chunk deltas → index batches with dense and BM25 vectors.
//!
//! The stream is exchanged by [`DocKey::route`], so each document is embedded and written by the worker
//! owning its shard. Upserts are embedded about [`EMBED_SLICE`] at a time, small documents together and
//! a large one over several activations (the embedder sorts each call by length and batches), so
//! queries on the same worker are not held behind a long embedding call. Outages of the embedder ([`EmbedError::is_retryable`]) are retried with capped
//! exponential backoff, blocking this worker: consumption pauses, nothing is dropped. Any other failure
//! dead-letters the affected documents' new chunks while their retractions still apply, so no stale
//! chunk survives.

use std::time::{Duration, Instant};

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::Operator;
use timely::dataflow::StreamVec;

use super::diff::ChunkDelta;
use super::dlq::{DlqRecord, Origin};
use crate::embed::{EmbedError, Embedder};
use crate::metrics::metrics;
use crate::model::DocKey;
use crate::store::{Bm25Encoder, PointWrite};

/// The index work of one document, ready to write.
#[derive(Debug, Clone)]
pub struct IndexDelta {
    /// The document.
    pub key: DocKey,
    /// Points to delete.
    pub deletes: Vec<uuid::Uuid>,
    /// Points to upsert.
    pub points: Vec<PointWrite>,
    /// Points to rewrite at a new version with the dense vector the index already holds: their `dense`
    /// is empty here and is read back from the store by the index writer (nothing is embedded).
    pub restamp: Vec<PointWrite>,
    /// Ingestion time of the change.
    pub time: u64,
}

/// Longest wait between retries of an outage.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Runs `attempt` until it succeeds or fails with a non-retryable error, backing off exponentially.
pub fn with_backoff<T, E: std::fmt::Display>(
    component: &str,
    retryable: impl Fn(&E) -> bool,
    mut attempt: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let mut delay = Duration::from_millis(100);
    loop {
        match attempt() {
            Err(error) if retryable(&error) => {
                metrics().retries.with_label_values(&[component]).inc();
                tracing::warn!(component, %error, retry_in_ms = delay.as_millis() as u64, "outage; retrying");
                std::thread::sleep(delay);
                delay = (delay * 2).min(MAX_BACKOFF);
            }
            other => return other,
        }
    }
}

/// Embeds the upserts of `deltas`; returns index work and, for failed embeddings, DLQ records.
///
/// A batch that fails for a reason other than an outage (a wrong vector dimension, a text the server
/// refuses) is embedded again document by document, so only the documents that fail on their own are
/// dead-lettered; the retractions of every document still apply.
pub fn embed_deltas(
    embedder: &mut dyn Embedder,
    bm25: &Bm25Encoder,
    deltas: Vec<ChunkDelta>,
) -> (Vec<IndexDelta>, Vec<DlqRecord>) {
    let inputs = deltas
        .iter()
        .flat_map(|d| d.upserts.iter().map(|c| c.embedding_input()))
        .collect();
    let error = match embed_texts(embedder, inputs) {
        Ok(vectors) => {
            return (
                index_work(embedder, bm25, deltas, Some(vectors)),
                Vec::new(),
            )
        }
        Err(error) => error,
    };
    if deltas.iter().filter(|d| !d.upserts.is_empty()).count() > 1 {
        tracing::warn!(%error, documents = deltas.len(), "embedding a batch failed: isolating the failing documents");
        let mut work = Vec::new();
        let mut dlq = Vec::new();
        for delta in deltas {
            let (one_work, one_dlq) = embed_deltas(embedder, bm25, vec![delta]);
            work.extend(one_work);
            dlq.extend(one_dlq);
        }
        return (work, dlq);
    }
    dead_letter(embedder, bm25, deltas, &error)
}

/// DLQ records for the upserts of `deltas`, whose embedding failed with `error`; their retractions
/// still apply.
fn dead_letter(
    embedder: &dyn Embedder,
    bm25: &Bm25Encoder,
    deltas: Vec<ChunkDelta>,
    error: &EmbedError,
) -> (Vec<IndexDelta>, Vec<DlqRecord>) {
    let reason = if matches!(error, EmbedError::Dimension { .. }) {
        "embedding_dimension"
    } else {
        "embedding_failed"
    };
    let dlq = deltas
        .iter()
        .filter(|d| !d.upserts.is_empty())
        .map(|delta| {
            metrics().record_dlq(reason);
            DlqRecord::new(
                reason,
                error.to_string(),
                Origin::File {
                    path: delta.key.to_string(),
                    line: None,
                },
                Some(delta.key.tenant.clone()),
                Some(delta.key.to_string().as_bytes()),
                None,
            )
        })
        .collect();
    (index_work(embedder, bm25, deltas, None), dlq)
}

/// The vectors of `inputs`, in order; outages are retried with backoff.
fn embed_texts(
    embedder: &mut dyn Embedder,
    inputs: Vec<String>,
) -> Result<Vec<Vec<f32>>, EmbedError> {
    if inputs.is_empty() {
        return Ok(Vec::new());
    }
    let texts: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let started = Instant::now();
    let vectors = with_backoff("embedder", EmbedError::is_retryable, || {
        embedder.embed(&texts)
    })?;
    metrics()
        .embed_seconds
        .observe(started.elapsed().as_secs_f64());
    let tokens = embedder.last_token_count();
    metrics().embed_tokens.inc_by(tokens as u64);
    metrics().embed_batch_tokens.observe(tokens as f64);
    metrics().embed_texts.inc_by(texts.len() as u64);
    Ok(vectors)
}

/// Index work of `deltas`: their deletes, and their upserts with `vectors` (none: deletes only).
fn index_work(
    embedder: &dyn Embedder,
    bm25: &Bm25Encoder,
    deltas: Vec<ChunkDelta>,
    vectors: Option<Vec<Vec<f32>>>,
) -> Vec<IndexDelta> {
    let version = embedder.version().to_string();
    let mut vectors = vectors.map(Vec::into_iter);
    deltas
        .into_iter()
        .map(|delta| {
            let points = match vectors.as_mut() {
                Some(vectors) => delta
                    .upserts
                    .into_iter()
                    .map(|chunk| PointWrite {
                        key: delta.key.clone(),
                        version: delta.version,
                        sparse: bm25.encode_document(&chunk.embedding_input()),
                        dense: vectors.next().expect("one vector per input"),
                        chunk,
                        embedder_version: version.clone(),
                    })
                    .collect(),
                None => Vec::new(),
            };
            let restamp = delta
                .restamp
                .into_iter()
                .map(|chunk| PointWrite {
                    key: delta.key.clone(),
                    version: delta.version,
                    sparse: bm25.encode_document(&chunk.embedding_input()),
                    dense: Vec::new(),
                    chunk,
                    embedder_version: version.clone(),
                })
                .collect();
            IndexDelta {
                key: delta.key,
                deletes: delta.deletes,
                points,
                restamp,
                time: delta.time,
            }
        })
        .collect()
}

/// Extension trait: embed chunk deltas.
pub trait EmbedChunks<'scope> {
    /// Embeds each batch; `Ok` index work, `Err` DLQ records.
    fn embed_chunks(
        self,
        embedder: Box<dyn Embedder>,
    ) -> StreamVec<'scope, u64, Result<IndexDelta, DlqRecord>>;
}

/// Most chunks embedded per activation of the Embed operator. A worker runs one operator at a time, so
/// a large ingest batch (or one large document) embedded in one call would hold its queries for as
/// long as the call takes (hundreds of chunks on a CPU: minutes); in slices of this size a query waits
/// at most about one slice.
pub const EMBED_SLICE: usize = 32;

/// Takes whole deltas from the front of `queue` until they hold at least `slice` upserts (or the queue
/// is empty); deltas without upserts ride along for free. A delta of more than `slice` upserts is
/// taken only first (then alone); [`Slicer`] embeds such a delta over several calls.
pub fn take_slice(
    queue: &mut std::collections::VecDeque<ChunkDelta>,
    slice: usize,
) -> Vec<ChunkDelta> {
    let mut taken = Vec::new();
    let mut texts = 0;
    while let Some(front) = queue.front() {
        let upserts = front.upserts.len();
        if upserts > 0 && !taken.is_empty() && (texts >= slice || upserts > slice) {
            break;
        }
        texts += upserts;
        taken.push(queue.pop_front().expect("front exists"));
    }
    taken
}

/// Embeds queued deltas about one slice at a time: small documents together (see [`take_slice`]), a
/// document of more than a slice of upserts over several calls, its index work given only once all
/// of its upserts are embedded (a document's change is written whole).
#[derive(Debug)]
pub struct Slicer {
    slice: usize,
    /// Vectors of the first upserts of the front delta, while it is embedded over several calls.
    partial: Vec<Vec<f32>>,
}

impl Slicer {
    /// Slices of `slice` texts.
    pub fn new(slice: usize) -> Self {
        Self {
            slice: slice.max(1),
            partial: Vec::new(),
        }
    }

    /// Embeds about one slice from the front of `queue`; returns the work of the deltas completed.
    pub fn step(
        &mut self,
        embedder: &mut dyn Embedder,
        bm25: &Bm25Encoder,
        queue: &mut std::collections::VecDeque<ChunkDelta>,
    ) -> (Vec<IndexDelta>, Vec<DlqRecord>) {
        let Some(front) = queue.front() else {
            return (Vec::new(), Vec::new());
        };
        let total = front.upserts.len();
        if total <= self.slice {
            return embed_deltas(embedder, bm25, take_slice(queue, self.slice));
        }
        let done = self.partial.len();
        let end = (done + self.slice).min(total);
        let inputs = front.upserts[done..end]
            .iter()
            .map(|c| c.embedding_input())
            .collect();
        match embed_texts(embedder, inputs) {
            Ok(vectors) => {
                self.partial.extend(vectors);
                if self.partial.len() < total {
                    return (Vec::new(), Vec::new());
                }
                let delta = queue.pop_front().expect("front exists");
                let vectors = std::mem::take(&mut self.partial);
                (
                    index_work(embedder, bm25, vec![delta], Some(vectors)),
                    Vec::new(),
                )
            }
            Err(error) => {
                self.partial.clear();
                let delta = queue.pop_front().expect("front exists");
                dead_letter(embedder, bm25, vec![delta], &error)
            }
        }
    }
}

impl<'scope> EmbedChunks<'scope> for StreamVec<'scope, u64, ChunkDelta> {
    fn embed_chunks(
        self,
        mut embedder: Box<dyn Embedder>,
    ) -> StreamVec<'scope, u64, Result<IndexDelta, DlqRecord>> {
        let pact = Exchange::new(|delta: &ChunkDelta| delta.key.route());
        let bm25 = Bm25Encoder::default();
        let scope = self.scope();
        self.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(pact, "Embed", move |_cap, info| {
            let activator = scope.activator_for(info.address.clone());
            let mut slicer = Slicer::new(EMBED_SLICE);
            // Input batches in arrival order, each with its capability: a document's deltas stay in
            // time order, and a time is not complete downstream until all of its slices were given.
            let mut queue: std::collections::VecDeque<(
                timely::dataflow::operators::Capability<u64>,
                std::collections::VecDeque<ChunkDelta>,
            )> = std::collections::VecDeque::new();
            move |input, output| {
                input.for_each(|cap, data| {
                    let cap = cap.retain_least(0).expect("time of the batch");
                    queue.push_back((cap, std::mem::take(data).into()));
                });
                let Some((cap, deltas)) = queue.front_mut() else {
                    return;
                };
                let (work, dlq) = slicer.step(embedder.as_mut(), &bm25, deltas);
                if work.iter().any(|delta| !delta.points.is_empty()) {
                    crate::faults::fail_point(crate::faults::AFTER_EMBED);
                }
                let mut session = output.session(&*cap);
                session.give_iterator(work.into_iter().map(Ok));
                session.give_iterator(dlq.into_iter().map(Err));
                drop(session);
                if deltas.is_empty() {
                    queue.pop_front();
                }
                if !queue.is_empty() {
                    activator.activate();
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::chunk::{Chunker, ChunkerConfig};
    use crate::ingest::diff::diff_chunk_sets;
    use crate::model::{ChunkSet, DocKind, Document};

    /// Answers 4-d vectors, or 3-d ones for a whole request holding a text with `BAD` in it.
    struct Picky;

    impl Embedder for Picky {
        fn version(&self) -> &str {
            "picky"
        }
        fn dimension(&self) -> usize {
            4
        }
        fn embed(&mut self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
            if texts.iter().any(|t| t.contains("BAD")) {
                return Err(EmbedError::Dimension {
                    expected: 4,
                    got: 3,
                });
            }
            Ok(texts.iter().map(|_| vec![0.5; 4]).collect())
        }
        fn last_token_count(&self) -> usize {
            0
        }
    }

    fn insert(id: &str, text: &str) -> ChunkDelta {
        let key = DocKey::new("t", id);
        let document = Document {
            key: key.clone(),
            version: 1,
            source: id.into(),
            kind: DocKind::Prose,
            title: None,
            text: text.into(),
            acl: vec![],
        };
        let set = ChunkSet {
            version: 1,
            chunks: Chunker::new(ChunkerConfig::default()).chunk(&document),
        };
        diff_chunk_sets(&key, None, Some(&set), 1)
    }

    #[test]
    fn slices_hold_whole_deltas_in_order_and_at_least_the_slice_size() {
        let mut queue: std::collections::VecDeque<ChunkDelta> = (0..10)
            .map(|i| insert(&format!("d{i}"), "One sentence here."))
            .collect();
        queue[3].upserts.clear();
        let first = take_slice(&mut queue, 4);
        let ids: Vec<&str> = first.iter().map(|d| d.key.doc_id.as_str()).collect();
        assert_eq!(
            ids,
            ["d0", "d1", "d2", "d3", "d4"],
            "4 upserts, the empty delta rides along"
        );
        let rest = take_slice(&mut queue, 100);
        assert_eq!(rest.len(), 5);
        assert!(queue.is_empty() && take_slice(&mut queue, 4).is_empty());
    }

    #[test]
    fn a_failing_document_is_isolated_and_only_it_is_dead_lettered() {
        let deltas = vec![
            insert("a", "A good document."),
            insert("b", "A BAD document."),
            insert("c", "Another good one."),
        ];
        let (work, dlq) = embed_deltas(&mut Picky, &Bm25Encoder::default(), deltas);
        assert_eq!(dlq.len(), 1);
        assert_eq!(dlq[0].reason, "embedding_dimension");
        let written: Vec<(&str, usize)> = work
            .iter()
            .map(|d| (d.key.doc_id.as_str(), d.points.len()))
            .collect();
        assert_eq!(written, [("a", 1), ("b", 0), ("c", 1)]);
    }

    /// Records the size of each call; answers `[position in the call, call number]`.
    #[derive(Default)]
    struct Counting {
        calls: Vec<usize>,
        fail_on_call: Option<usize>,
    }

    impl Embedder for Counting {
        fn version(&self) -> &str {
            "counting"
        }
        fn dimension(&self) -> usize {
            2
        }
        fn embed(&mut self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
            let call = self.calls.len();
            self.calls.push(texts.len());
            if self.fail_on_call == Some(call) {
                return Err(EmbedError::Dimension {
                    expected: 2,
                    got: 3,
                });
            }
            Ok((0..texts.len())
                .map(|i| vec![i as f32, call as f32])
                .collect())
        }
        fn last_token_count(&self) -> usize {
            0
        }
    }

    fn long_document(id: &str) -> ChunkDelta {
        let text: String = (0..1500)
            .map(|i| format!("Sentence {i} describes topic number {i} at some length. "))
            .collect();
        insert(id, &text)
    }

    #[test]
    fn a_large_document_is_embedded_over_several_slices_and_written_whole() {
        let large = long_document("large");
        let upserts = large.upserts.len();
        assert!(upserts > 20, "{upserts} chunks");
        let mut queue: std::collections::VecDeque<ChunkDelta> = [
            insert("small", "A short one."),
            large,
            insert("after", "Another."),
        ]
        .into();
        let (mut slicer, mut embedder, bm25) =
            (Slicer::new(8), Counting::default(), Bm25Encoder::default());
        // The small document goes alone: the large one is not taken behind it.
        let (work, _) = slicer.step(&mut embedder, &bm25, &mut queue);
        assert_eq!(work.len(), 1);
        assert_eq!(work[0].key.doc_id, "small");
        let mut steps = 0;
        let large = loop {
            let (work, dlq) = slicer.step(&mut embedder, &bm25, &mut queue);
            assert!(dlq.is_empty());
            steps += 1;
            if let Some(done) = work.into_iter().next() {
                break done;
            }
        };
        assert_eq!(steps, upserts.div_ceil(8));
        assert!(
            embedder.calls.iter().all(|&n| n <= 8),
            "{:?}",
            embedder.calls
        );
        assert_eq!(large.key.doc_id, "large");
        assert_eq!(large.points.len(), upserts);
        // Vectors stay with their chunks: point i got position i % 8 of call 1 + i / 8.
        for (i, point) in large.points.iter().enumerate() {
            assert_eq!(point.dense, vec![(i % 8) as f32, (1 + i / 8) as f32]);
        }
        let (work, _) = slicer.step(&mut embedder, &bm25, &mut queue);
        assert_eq!(work[0].key.doc_id, "after");
        assert!(queue.is_empty());
    }

    #[test]
    fn a_large_document_failing_midway_is_dead_lettered_once_with_its_retractions() {
        let mut queue: std::collections::VecDeque<ChunkDelta> = [long_document("large")].into();
        queue[0].deletes.push(uuid::Uuid::nil());
        let mut embedder = Counting {
            fail_on_call: Some(1),
            ..Counting::default()
        };
        let mut slicer = Slicer::new(8);
        let bm25 = Bm25Encoder::default();
        let (work, dlq) = slicer.step(&mut embedder, &bm25, &mut queue);
        assert!(work.is_empty() && dlq.is_empty());
        let (work, dlq) = slicer.step(&mut embedder, &bm25, &mut queue);
        assert_eq!(dlq.len(), 1);
        assert_eq!(dlq[0].reason, "embedding_dimension");
        assert_eq!(work.len(), 1);
        assert!(work[0].points.is_empty());
        assert_eq!(work[0].deletes, vec![uuid::Uuid::nil()]);
        assert!(queue.is_empty() && slicer.partial.is_empty());
    }
}
