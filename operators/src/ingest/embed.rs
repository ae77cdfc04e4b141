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
pub fn embed_deltas(
    embedder: &mut dyn Embedder,
    bm25: &Bm25Encoder,
    deltas: Vec<ChunkDelta>,
) -> (Vec<IndexDelta>, Vec<DlqRecord>) {
    let inputs: Vec<String> = deltas
        .iter()
        .flat_map(|d| d.upserts.iter().map(|c| c.embedding_input()))
        .collect();
    let mut dlq = Vec::new();
    let vectors: Result<Vec<Vec<f32>>, EmbedError> = if inputs.is_empty() {
        Ok(Vec::new())
    } else {
        let texts: Vec<&str> = inputs.iter().map(String::as_str).collect();
        let started = Instant::now();
        let result = with_backoff("embedder", EmbedError::is_retryable, || {
            embedder.embed(&texts)
        });
        if result.is_ok() {
            metrics()
                .embed_seconds
                .observe(started.elapsed().as_secs_f64());
            let tokens = embedder.last_token_count();
            metrics().embed_tokens.inc_by(tokens as u64);
            metrics().embed_batch_tokens.observe(tokens as f64);
            metrics().embed_texts.inc_by(texts.len() as u64);
        }
        result
    };
    let version = embedder.version().to_string();
    let mut vectors = match vectors {
        Ok(vectors) => Some(vectors.into_iter()),
        Err(error) => {
            let reason = if matches!(error, EmbedError::Dimension { .. }) {
                "embedding_dimension"
            } else {
                "embedding_failed"
            };
            for delta in deltas.iter().filter(|d| !d.upserts.is_empty()) {
                metrics().record_dlq(reason);
                dlq.push(DlqRecord::new(
                    reason,
                    error.to_string(),
                    Origin::File {
                        path: delta.key.to_string(),
                        line: None,
                    },
                    Some(delta.key.tenant.clone()),
                    Some(delta.key.to_string().as_bytes()),
                    None,
                ));
            }
            None
        }
    };
    let out = deltas
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
            IndexDelta {
                key: delta.key,
                deletes: delta.deletes,
                points,
                time: delta.time,
            }
        })
        .collect();
    (out, dlq)
}

/// Extension trait: embed chunk deltas.
pub trait EmbedChunks<'scope> {
    /// Embeds each batch; `Ok` index work, `Err` DLQ records.
    fn embed_chunks(
        self,
        embedder: Box<dyn Embedder>,
    ) -> StreamVec<'scope, u64, Result<IndexDelta, DlqRecord>>;
}

impl<'scope> EmbedChunks<'scope> for StreamVec<'scope, u64, ChunkDelta> {
    fn embed_chunks(
        self,
        mut embedder: Box<dyn Embedder>,
    ) -> StreamVec<'scope, u64, Result<IndexDelta, DlqRecord>> {
        let pact = Exchange::new(|delta: &ChunkDelta| delta.key.route());
        let bm25 = Bm25Encoder::default();
        self.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(
            pact,
            "Embed",
            move |_cap, _info| {
                move |input, output| {
                    input.for_each(|cap, data| {
                        let (work, dlq) =
                            embed_deltas(embedder.as_mut(), &bm25, std::mem::take(data));
                        if work.iter().any(|delta| !delta.points.is_empty()) {
                            crate::faults::fail_point(crate::faults::AFTER_EMBED);
                        }
                        let mut session = output.session(&cap);
                        session.give_iterator(work.into_iter().map(Ok));
                        session.give_iterator(dlq.into_iter().map(Err));
                    });
                }
            },
        )
    }
}
