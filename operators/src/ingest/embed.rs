//! Embed: chunk deltas → index batches with dense and BM25 vectors.
//!
//! The stream is exchanged by [`DocKey::route`], so each document is embedded and written by the worker
//! owning its shard. All upserts of an input batch are embedded together (the embedder sorts by length
//! and batches). Outages of the embedder ([`EmbedError::is_retryable`]) are retried with capped
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
    let error = match embed_all(embedder, &deltas) {
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

/// The vectors of every upsert of `deltas`, in order; outages are retried with backoff.
fn embed_all(
    embedder: &mut dyn Embedder,
    deltas: &[ChunkDelta],
) -> Result<Vec<Vec<f32>>, EmbedError> {
    let inputs: Vec<String> = deltas
        .iter()
        .flat_map(|d| d.upserts.iter().map(|c| c.embedding_input()))
        .collect();
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
/// a large ingest batch embedded in one call would hold its queries for as long as the call takes (a
/// hundred chunks on a CPU: tens of seconds); in slices of this size a query waits at most one slice.
pub const EMBED_SLICE: usize = 32;

/// Takes whole deltas from the front of `queue` until they hold at least `slice` upserts (or the queue
/// is empty); deltas without upserts ride along for free.
pub fn take_slice(
    queue: &mut std::collections::VecDeque<ChunkDelta>,
    slice: usize,
) -> Vec<ChunkDelta> {
    let mut taken = Vec::new();
    let mut texts = 0;
    while let Some(front) = queue.front() {
        if texts >= slice && !front.upserts.is_empty() {
            break;
        }
        texts += front.upserts.len();
        taken.push(queue.pop_front().expect("front exists"));
    }
    taken
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
                let slice = take_slice(deltas, EMBED_SLICE);
                let (work, dlq) = embed_deltas(embedder.as_mut(), &bm25, slice);
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
}
