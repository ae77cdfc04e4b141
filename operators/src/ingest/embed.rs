//! Embed: chunk deltas → index batches with dense and BM25 vectors.
//!
//! The stream is exchanged by [`DocKey::route`], so each document is embedded and written by the worker
//! owning its shard. The model never runs on the worker: upserts go to the process's
//! [`InferenceService`] in requests of whole documents (about [`REQUEST_TEXTS`] texts, at most
//! [`MAX_IN_FLIGHT`] requests at once, so the service always has the next one), while the operator
//! holds their capabilities and the worker goes on with queries; the service wakes the operator when a
//! request is done.
//!
//! # Guarantees
//! - A document's change is written whole, in the order the changes arrived (requests complete in
//!   submission order here, whatever order the service finishes them in).
//! - Outages of the embedder are retried inside the service, off the worker; the capability of the
//!   waiting request holds the frontier, so offsets are not committed and consumption pauses at its
//!   in-flight bound: nothing is dropped.
//! - Any other failure of a request of several documents embeds them again one by one, so only the
//!   documents that fail on their own are dead-lettered; their retractions still apply, so no stale chunk
//!   survives.

use std::collections::{HashSet, VecDeque};

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::{Capability, Operator};
use timely::dataflow::StreamVec;

use super::acked::SharedAcked;
use super::diff::ChunkDelta;
use super::dlq::{DlqReason, DlqRecord, Origin};
use crate::embed::service::{Embedded, InferenceService, Priority, Ticket};
use crate::embed::{EmbedError, Spans};
use crate::ingest::decode::encode_event;
use crate::model::{Chunk, DocKey, EvidenceUnits};
use crate::offload::Parked;
use crate::store::{Bm25Encoder, Bm25Params, PointWrite};

/// The index work of one document, ready to write.
#[derive(Debug, Clone)]
pub struct IndexDelta {
    /// The document.
    pub key: DocKey,
    /// Points to delete.
    pub deletes: Vec<uuid::Uuid>,
    /// Points to upsert.
    pub points: Vec<PointWrite>,
    /// Points to rewrite at a new version with the vectors the index already holds: their `dense`
    /// is empty here and is read back from the store by the index writer (nothing is embedded).
    pub restamp: Vec<PointWrite>,
    /// Ids deleted or rewritten with a new layout ([`ChunkDelta::changed`]).
    pub changed: Vec<uuid::Uuid>,
    /// Ingestion time of the change.
    pub time: u64,
    /// The document of an upsert (what a refusal dead-letters as its value).
    pub document: Option<std::sync::Arc<crate::model::Document>>,
    /// The embedder refused the document: its upserts were dead-lettered, only its retractions are
    /// written (the writer then reads back what the index holds of it, [`super::acked`]).
    pub refused: bool,
}

impl IndexDelta {
    /// Every point id the delta touches: deletes, upserts and restamps.
    pub fn ids(&self) -> impl Iterator<Item = uuid::Uuid> + '_ {
        self.deletes
            .iter()
            .copied()
            .chain(self.points.iter().chain(&self.restamp).map(|p| p.id))
    }
}

/// Texts per request to the inference service (whole documents: a request may hold more).
pub const REQUEST_TEXTS: usize = 64;
/// Requests of one Embed operator in the service at once.
pub const MAX_IN_FLIGHT: usize = 2;

pub use crate::offload::Waker;

/// DLQ records for the upserts of `deltas`, whose embedding failed with `error`, each with its
/// document event as value ([`encode_event`]); their retractions still apply.
fn dead_letter(
    version: &str,
    bm25: &Bm25Encoder,
    deltas: Vec<ChunkDelta>,
    error: &EmbedError,
) -> (Vec<IndexDelta>, Vec<DlqRecord>) {
    let reason = if matches!(error, EmbedError::Dimension { .. }) {
        DlqReason::EmbeddingDimension
    } else {
        DlqReason::EmbeddingFailed
    };
    let dlq = deltas
        .iter()
        .filter(|d| !d.upserts.is_empty())
        .map(|delta| {
            DlqRecord::new(
                reason,
                error.to_string(),
                Origin::File {
                    path: delta.key.to_string(),
                    line: None,
                },
                Some(delta.key.tenant.clone()),
                Some(delta.key.to_string().as_bytes()),
                delta.document.as_deref().map(encode_event).as_deref(),
            )
        })
        .collect();
    (
        index_work(version, bm25, deltas, None, EvidenceUnits::Off),
        dlq,
    )
}

/// What is embedded for chunks: each chunk's embedding input and where the evidence units it gets
/// lie in it ([`EvidenceUnits::spans_in_input`]), as the inference service takes them
/// ([`InferenceService::submit_spans`]).
#[derive(Debug, Clone, Default)]
pub struct ChunkInputs {
    /// Each chunk's embedding input.
    pub texts: Vec<String>,
    /// Each chunk's evidence units, as byte ranges of its input.
    pub spans: Vec<Spans>,
}

impl ChunkInputs {
    /// Adds what is embedded for `chunk`: its embedding input and the evidence units `evidence`
    /// gives it ([`EvidenceUnits::spans`]).
    pub fn push(&mut self, chunk: &Chunk, evidence: EvidenceUnits) {
        let input = chunk.embedding_input();
        self.spans.push(evidence.spans_in_input(chunk, &input));
        self.texts.push(input);
    }

    /// No chunk added.
    pub fn is_empty(&self) -> bool {
        self.texts.is_empty()
    }

    /// Vectors the chunks get: one each and one an evidence unit.
    pub fn vectors(&self) -> usize {
        self.texts.len() + self.spans.iter().map(Vec::len).sum::<usize>()
    }
}

/// Takes `chunk`'s vectors from `vectors`, in the order the service gives back [`ChunkInputs`]: the
/// chunk's own, then its evidence units'.
pub fn take_vectors(
    chunk: &Chunk,
    evidence: EvidenceUnits,
    vectors: &mut impl Iterator<Item = Vec<f32>>,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let dense = vectors.next().expect("one vector per input");
    let units = evidence.spans(chunk).len();
    let evidence = (0..units)
        .map(|_| vectors.next().expect("one vector per evidence unit"))
        .collect();
    (dense, evidence)
}

/// Index work of `deltas`: their deletes, and their upserts with `vectors` (none: deletes only), laid
/// out as [`take_vectors`] takes them.
fn index_work(
    version: &str,
    bm25: &Bm25Encoder,
    deltas: Vec<ChunkDelta>,
    vectors: Option<Vec<Vec<f32>>>,
    evidence: EvidenceUnits,
) -> Vec<IndexDelta> {
    let mut vectors = vectors.map(Vec::into_iter);
    deltas
        .into_iter()
        .map(|delta| {
            let refused = vectors.is_none() && !delta.upserts.is_empty();
            let points = match vectors.as_mut() {
                Some(vectors) => delta
                    .upserts
                    .into_iter()
                    .map(|chunk| {
                        let (dense, units) = take_vectors(&chunk, evidence, vectors);
                        PointWrite {
                            id: chunk.point_id(&delta.key),
                            key: delta.key.clone(),
                            version: delta.version,
                            sparse: bm25.encode_document(&chunk.embedding_input()),
                            dense,
                            evidence: units,
                            chunk,
                            embedder_version: version.to_string(),
                        }
                    })
                    .collect(),
                None => Vec::new(),
            };
            let restamp = delta
                .restamp
                .into_iter()
                .map(|chunk| PointWrite {
                    id: chunk.point_id(&delta.key),
                    key: delta.key.clone(),
                    version: delta.version,
                    sparse: bm25.encode_document(&chunk.embedding_input()),
                    dense: Vec::new(),
                    evidence: Vec::new(),
                    chunk,
                    embedder_version: version.to_string(),
                })
                .collect();
            IndexDelta {
                key: delta.key,
                deletes: delta.deletes,
                points,
                restamp,
                changed: delta.changed,
                time: delta.time,
                document: delta.document,
                refused,
            }
        })
        .collect()
}

/// Takes whole deltas from the front of `queue` until they hold at least `texts` upserts (or the queue
/// is empty); deltas without upserts ride along for free.
pub fn take_request(queue: &mut VecDeque<ChunkDelta>, texts: usize) -> Vec<ChunkDelta> {
    let mut taken = Vec::new();
    let mut count = 0;
    while let Some(front) = queue.front() {
        if count >= texts && !front.upserts.is_empty() {
            break;
        }
        count += front.upserts.len();
        taken.push(queue.pop_front().expect("front exists"));
    }
    taken
}

/// The Embed operator's state, free of timely: deltas queued per lane (a tenant, or one lane for
/// all where the queue is not fair) and per capability (`C`), requests in flight per lane, each
/// lane's results handed out in its submission order.
pub struct EmbedQueue<C> {
    lanes: std::collections::BTreeMap<std::sync::Arc<str>, Lane<C>>,
    request_texts: usize,
    max_in_flight: usize,
    evidence: EvidenceUnits,
    fair: bool,
}

/// One lane of the [`EmbedQueue`].
struct Lane<C> {
    queued: VecDeque<(C, VecDeque<ChunkDelta>)>,
    /// Requests in the service: each request's deltas, parked at their capability.
    in_flight: Parked<C, Vec<ChunkDelta>, Result<Embedded, EmbedError>>,
}

impl<C> Default for Lane<C> {
    fn default() -> Self {
        Self {
            queued: VecDeque::new(),
            in_flight: Parked::default(),
        }
    }
}

impl<C: Clone> EmbedQueue<C> {
    /// Requests of about `request_texts` chunks, at most `max_in_flight` at once per lane; one lane
    /// per tenant; chunks only (see [`Self::with_evidence`]).
    pub fn new(request_texts: usize, max_in_flight: usize) -> Self {
        Self {
            lanes: Default::default(),
            request_texts: request_texts.max(1),
            max_in_flight: max_in_flight.max(1),
            evidence: EvidenceUnits::Off,
            fair: true,
        }
    }

    /// Each chunk with the evidence units `evidence` gives it ([`ChunkInputs`]).
    pub fn with_evidence(mut self, evidence: EvidenceUnits) -> Self {
        self.evidence = evidence;
        self
    }

    /// `fair`: a lane per tenant, taking turns in the inference service (the default); else one
    /// lane, first in first out (a tenant's large document then delays every other tenant).
    pub fn fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// Queues `deltas` of the time `cap` stands for.
    pub fn push(&mut self, cap: C, deltas: Vec<ChunkDelta>) {
        let mut by_lane: Vec<(std::sync::Arc<str>, VecDeque<ChunkDelta>)> = Vec::new();
        for delta in deltas {
            let lane: &str = if self.fair { &delta.key.tenant } else { "" };
            match by_lane.iter_mut().find(|(name, _)| &**name == lane) {
                Some((_, queued)) => queued.push_back(delta),
                None => by_lane.push((lane.into(), VecDeque::from([delta]))),
            }
        }
        for (lane, deltas) in by_lane {
            let lane = self.lanes.entry(lane).or_default();
            lane.queued.push_back((cap.clone(), deltas));
        }
    }

    /// Nothing queued and nothing in flight.
    pub fn is_idle(&self) -> bool {
        self.lanes
            .values()
            .all(|lane| lane.queued.is_empty() && lane.in_flight.is_empty())
    }

    /// Submits queued deltas, a request per lane in turn, while fewer than `max_in_flight` requests
    /// of that lane are in the service.
    pub fn submit(&mut self, service: &InferenceService, waker: &Waker) {
        loop {
            let mut submitted = false;
            for (name, lane) in &mut self.lanes {
                if lane.in_flight.len() >= self.max_in_flight {
                    continue;
                }
                let Some((cap, deltas)) = lane.queued.front_mut() else {
                    continue;
                };
                let cap = cap.clone();
                let taken = take_request(deltas, self.request_texts);
                if deltas.is_empty() {
                    lane.queued.pop_front();
                }
                let ticket = Self::request(service, waker, name, &taken, self.evidence);
                lane.in_flight.park(cap, taken, ticket);
                submitted = true;
            }
            if !submitted {
                break;
            }
        }
        self.lanes
            .retain(|_, lane| !lane.queued.is_empty() || !lane.in_flight.is_empty());
    }

    fn request(
        service: &InferenceService,
        waker: &Waker,
        lane: &str,
        deltas: &[ChunkDelta],
        evidence: EvidenceUnits,
    ) -> Ticket {
        let mut inputs = ChunkInputs::default();
        for chunk in deltas.iter().flat_map(|d| &d.upserts) {
            inputs.push(chunk, evidence);
        }
        service.submit_in_lane(lane, inputs.texts, inputs.spans, Priority::Ingest, waker)
    }

    /// The work of the completed requests at the front of each lane, each with its capability, in
    /// the lane's submission order. A request of several documents that failed (not an outage) is
    /// split into one request per document, submitted again.
    pub fn drain_ready(
        &mut self,
        service: &InferenceService,
        waker: &Waker,
        bm25: &Bm25Encoder,
    ) -> Vec<(C, Vec<IndexDelta>, Vec<DlqRecord>)> {
        let mut ready = Vec::new();
        for (name, lane) in &mut self.lanes {
            while let Some((cap, deltas, result)) = lane.in_flight.next_in_order() {
                match result {
                    Ok(embedded) => {
                        let chunks: usize = deltas.iter().map(|d| d.upserts.len()).sum();
                        crate::metrics::metrics()
                            .chunks_embedded
                            .inc_by(chunks as u64);
                        let work = index_work(
                            service.version(),
                            bm25,
                            deltas,
                            Some(embedded.vectors),
                            self.evidence,
                        );
                        ready.push((cap, work, Vec::new()));
                    }
                    Err(error) if deltas.iter().filter(|d| !d.upserts.is_empty()).count() > 1 => {
                        tracing::warn!(%error, documents = deltas.len(), "embedding a request failed: isolating the failing documents");
                        for delta in deltas.into_iter().rev() {
                            let one = vec![delta];
                            let ticket = Self::request(service, waker, name, &one, self.evidence);
                            lane.in_flight.park_first(cap.clone(), one, ticket);
                        }
                    }
                    Err(error) => {
                        let (work, dlq) = dead_letter(service.version(), bm25, deltas, &error);
                        ready.push((cap, work, dlq));
                    }
                }
            }
        }
        ready
    }
}

/// How the Embed operator embeds.
#[derive(Debug, Clone, Copy)]
pub struct EmbedOptions {
    /// The evidence units each chunk gets a vector for.
    pub evidence: EvidenceUnits,
    /// How BM25 weighs a chunk's terms.
    pub bm25: Bm25Params,
    /// A lane per tenant in the inference service ([`EmbedQueue::fair`]).
    pub fair: bool,
}

/// Extension trait: embed chunk deltas.
pub trait EmbedChunks<'scope> {
    /// Embeds each batch through `service` (each chunk with the evidence units `options.evidence`
    /// gives it, each tenant in a lane of its own where `options.fair`) and weighs its terms with
    /// `options.bm25`; `Ok` index work, `Err` DLQ records.
    fn embed_chunks(
        self,
        service: InferenceService,
        options: EmbedOptions,
        acked: SharedAcked,
    ) -> StreamVec<'scope, u64, Result<IndexDelta, DlqRecord>>;
}

impl<'scope> EmbedChunks<'scope> for StreamVec<'scope, u64, ChunkDelta> {
    fn embed_chunks(
        self,
        service: InferenceService,
        EmbedOptions {
            evidence,
            bm25,
            fair,
        }: EmbedOptions,
        acked: SharedAcked,
    ) -> StreamVec<'scope, u64, Result<IndexDelta, DlqRecord>> {
        let pact = Exchange::new(|delta: &ChunkDelta| delta.key.route());
        let bm25 = Bm25Encoder::with_params(bm25);
        let scope = self.scope();
        self.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(pact, "Embed", move |_cap, info| {
            // Called on a service thread: a `SyncActivator` schedules this operator on its worker.
            let waker = crate::offload::operator_waker(scope.worker(), &info.address);
            // Each batch keeps its capability until its work is given: a time is not complete
            // downstream (and its offsets not committed) while any of its documents is being embedded.
            let mut queue = EmbedQueue::new(REQUEST_TEXTS, MAX_IN_FLIGHT)
                .with_evidence(evidence)
                .fair(fair);
            acked
                .borrow_mut()
                .set_embed(scope.activator_for(info.address.clone()));
            // Deltas in arrival order, each with its capability, until their document has no write
            // in flight (see `super::acked`).
            let mut waiting: VecDeque<(Capability<u64>, ChunkDelta)> = VecDeque::new();
            move |input, output| {
                input.for_each(|cap, data| {
                    let cap = cap.retain_least(0).expect("time of the batch");
                    waiting.extend(data.drain(..).map(|delta| (cap.clone(), delta)));
                });
                let mut ledger = acked.borrow_mut();
                let mut blocked: HashSet<DocKey> = HashSet::new();
                let mut group: Option<(Capability<u64>, Vec<ChunkDelta>)> = None;
                for (cap, delta) in std::mem::take(&mut waiting) {
                    if blocked.contains(&delta.key) || ledger.in_flight(&delta.key) {
                        blocked.insert(delta.key.clone());
                        waiting.push_back((cap, delta));
                        continue;
                    }
                    let Some(delta) = ledger.admit(delta) else {
                        continue;
                    };
                    match &mut group {
                        Some((at, deltas)) if at.time() == cap.time() => deltas.push(delta),
                        _ => {
                            if let Some((at, deltas)) = group.replace((cap, vec![delta])) {
                                queue.push(at, deltas);
                            }
                        }
                    }
                }
                if let Some((at, deltas)) = group {
                    queue.push(at, deltas);
                }
                drop(ledger);
                for (cap, work, dlq) in queue.drain_ready(&service, &waker, &bm25) {
                    if work.iter().any(|delta| !delta.points.is_empty()) {
                        crate::faults::fail_point(crate::faults::AFTER_EMBED);
                    }
                    let mut session = output.session(&cap);
                    session.give_iterator(work.into_iter().map(Ok));
                    session.give_iterator(dlq.into_iter().map(Err));
                }
                queue.submit(&service, &waker);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embed::service::ServiceConfig;
    use crate::embed::Embedder;
    use crate::ingest::chunk::{Chunker, ChunkerConfig};
    use crate::ingest::diff::diff_chunk_sets;
    use crate::model::ChunkSet;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// Answers `[bytes of the text, number of 'e's]`, or a wrong dimension for a whole call holding a
    /// text with `BAD` in it.
    struct Picky;

    fn expected_vector(text: &str) -> Vec<f32> {
        vec![text.len() as f32, text.matches('e').count() as f32]
    }

    impl Embedder for Picky {
        fn version(&self) -> &str {
            "picky"
        }
        fn dimension(&self) -> usize {
            2
        }
        fn embed(&mut self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
            if texts.iter().any(|t| t.contains("BAD")) {
                return Err(EmbedError::Dimension {
                    expected: 2,
                    got: 3,
                });
            }
            Ok(texts.iter().map(|t| expected_vector(t)).collect())
        }
        fn last_token_count(&self) -> usize {
            0
        }
    }

    fn insert(id: &str, text: &str) -> ChunkDelta {
        let key = DocKey::new("t", id);
        let document = ragstream_core::testing::prose("t", id, text);
        let set = ChunkSet {
            version: 1,
            chunks: Chunker::new(ChunkerConfig::default()).chunk(&document),
            document: Some(Arc::new(document.clone())),
        };
        diff_chunk_sets(&key, None, Some(&set), 1)
    }

    fn long_document(id: &str) -> ChunkDelta {
        let text: String = (0..1500)
            .map(|i| format!("Sentence {i} describes topic number {i} at some length. "))
            .collect();
        insert(id, &text)
    }

    /// Runs the queue to completion the way the operator does: submit, wait for a wake-up, drain.
    fn run(
        queue: &mut EmbedQueue<u64>,
        service: &InferenceService,
    ) -> Vec<(u64, Vec<IndexDelta>, Vec<DlqRecord>)> {
        let (sender, woken) = std::sync::mpsc::channel();
        let sender = Mutex::new(sender);
        let waker: Waker = Arc::new(move || {
            let _ = sender.lock().unwrap().send(());
        });
        let bm25 = Bm25Encoder::default();
        let mut out = Vec::new();
        queue.submit(service, &waker);
        while !queue.is_idle() {
            woken
                .recv_timeout(Duration::from_secs(10))
                .expect("the service wakes the operator");
            out.extend(queue.drain_ready(service, &waker, &bm25));
            queue.submit(service, &waker);
        }
        out
    }

    fn service(executors: usize, slice: usize) -> InferenceService {
        let executors = (0..executors)
            .map(|_| Box::new(Picky) as Box<dyn Embedder>)
            .collect();
        InferenceService::start(
            executors,
            ServiceConfig {
                slice_word_pieces: slice,
                query_batch: 8,
                query_executor: false,
                version_tag: None,
                query_headroom: None,
            },
        )
        .unwrap()
    }

    #[test]
    fn each_tenant_has_its_own_lane_and_its_own_requests_in_flight() {
        let of = |tenant: &str, id: &str| {
            let mut delta = insert(id, "One sentence here.");
            delta.key = DocKey::new(tenant, id);
            delta
        };
        let service = service(1, 1000);
        let (nobody, bm25): (Waker, _) = (Arc::new(|| {}), Bm25Encoder::default());
        // Tenant a's work queued first, one request in flight at most per lane.
        let mut fair = EmbedQueue::new(1, 1);
        let mut fifo = EmbedQueue::new(1, 1).fair(false);
        for queue in [&mut fair, &mut fifo] {
            queue.push(1, vec![of("a", "a1"), of("a", "a2"), of("a", "a3")]);
            queue.push(2, vec![of("b", "b1")]);
            queue.submit(&service, &nobody);
        }
        let in_flight = |queue: &EmbedQueue<u64>| -> Vec<(String, usize)> {
            queue
                .lanes
                .iter()
                .map(|(lane, l)| (lane.to_string(), l.in_flight.len()))
                .collect()
        };
        assert_eq!(
            in_flight(&fair),
            [("a".to_string(), 1), ("b".to_string(), 1)],
            "b's document is in the service beside a's first"
        );
        assert_eq!(in_flight(&fifo), [(String::new(), 1)], "b waits behind a");
        // Everything still comes out, each lane in its order.
        let mut done = Vec::new();
        while !fair.is_idle() {
            std::thread::sleep(Duration::from_millis(5));
            done.extend(fair.drain_ready(&service, &nobody, &bm25));
            fair.submit(&service, &nobody);
        }
        let keys: Vec<String> = done
            .iter()
            .flat_map(|(_, work, _)| work.iter().map(|d| d.key.to_string()))
            .collect();
        assert_eq!(keys.len(), 4, "{keys:?}");
        let a: Vec<&String> = keys.iter().filter(|k| k.starts_with("a/")).collect();
        assert_eq!(a, ["a/a1", "a/a2", "a/a3"]);
    }

    #[test]
    fn requests_hold_whole_deltas_in_order_and_at_least_the_request_size() {
        let mut queue: VecDeque<ChunkDelta> = (0..10)
            .map(|i| insert(&format!("d{i}"), "One sentence here."))
            .collect();
        queue[4].upserts.clear();
        let first = take_request(&mut queue, 4);
        let ids: Vec<&str> = first.iter().map(|d| d.key.doc_id.as_str()).collect();
        assert_eq!(
            ids,
            ["d0", "d1", "d2", "d3", "d4"],
            "4 upserts, the empty delta rides along"
        );
        let rest = take_request(&mut queue, 100);
        assert_eq!(rest.len(), 5);
        assert!(queue.is_empty() && take_request(&mut queue, 4).is_empty());
    }

    #[test]
    fn a_failing_document_is_isolated_and_only_it_is_dead_lettered() {
        let service = service(1, 1000);
        let mut queue = EmbedQueue::new(100, 2);
        queue.push(
            7,
            vec![
                insert("a", "A good document."),
                insert("b", "A BAD document."),
                insert("c", "Another good one."),
            ],
        );
        let results = run(&mut queue, &service);
        let dlq: Vec<&DlqRecord> = results.iter().flat_map(|(_, _, d)| d).collect();
        assert_eq!(dlq.len(), 1);
        assert_eq!(dlq[0].reason, DlqReason::EmbeddingDimension);
        let value = dlq[0]
            .value
            .as_deref()
            .expect("the document event as value");
        match crate::ingest::decode::decode_event(None, Some(value), &Default::default()) {
            Ok(crate::model::DocOp::Upsert(doc)) => {
                assert_eq!(
                    (doc.key.doc_id.as_str(), doc.text.as_str()),
                    ("b", "A BAD document.")
                )
            }
            other => panic!("{other:?}"),
        }
        let written: Vec<(u64, &str, usize)> = results
            .iter()
            .flat_map(|(cap, work, _)| {
                work.iter()
                    .map(move |d| (*cap, d.key.doc_id.as_str(), d.points.len()))
            })
            .collect();
        assert_eq!(written, [(7, "a", 1), (7, "b", 0), (7, "c", 1)]);
    }

    #[test]
    fn a_large_document_is_written_whole_with_each_vector_on_its_own_chunk() {
        let large = long_document("large");
        let upserts = large.upserts.len();
        assert!(upserts > 20, "{upserts} chunks");
        // Three executors and small slices: the service finishes slices out of order.
        let service = service(3, 64);
        let mut queue = EmbedQueue::new(8, 2);
        queue.push(1, vec![insert("small", "A short one.")]);
        queue.push(2, vec![large, insert("after", "Another.")]);
        let results = run(&mut queue, &service);
        let order: Vec<(u64, &str)> = results
            .iter()
            .flat_map(|(cap, work, _)| work.iter().map(move |d| (*cap, d.key.doc_id.as_str())))
            .collect();
        assert_eq!(order, [(1, "small"), (2, "large"), (2, "after")]);
        let large = &results[1].1[0];
        assert_eq!(large.points.len(), upserts);
        for point in &large.points {
            assert_eq!(point.dense, expected_vector(&point.chunk.embedding_input()));
        }
    }

    #[test]
    fn evidence_units_get_their_own_vectors_beside_their_chunks() {
        let large = long_document("large");
        let upserts = large.upserts.len();
        let service = service(3, 64);
        let mut queue = EmbedQueue::new(8, 2).with_evidence(EvidenceUnits::Alone);
        queue.push(
            1,
            vec![
                insert(
                    "two",
                    "The ferry leaves at noon. Tickets are sold at the pier.",
                ),
                insert("one", "A single sentence."),
                large,
            ],
        );
        let results = run(&mut queue, &service);
        let points: Vec<&PointWrite> = results
            .iter()
            .flat_map(|(_, work, _)| work.iter().flat_map(|d| &d.points))
            .collect();
        assert_eq!(points.len(), 2 + upserts);
        let mut with_units = 0;
        for point in points {
            assert_eq!(point.dense, expected_vector(&point.chunk.embedding_input()));
            let units = point.chunk.evidence_units();
            let expected: Vec<Vec<f32>> = units.iter().map(|u| expected_vector(u)).collect();
            assert_eq!(point.evidence, expected, "{}", point.key);
            with_units += usize::from(!units.is_empty());
        }
        assert!(with_units > 1, "{with_units} chunks with evidence units");
    }

    #[test]
    fn a_document_that_fails_in_a_request_of_its_own_keeps_its_retractions() {
        let mut bad = insert("bad", "A BAD document.");
        bad.deletes.push(uuid::Uuid::nil());
        let service = service(1, 1000);
        let mut queue = EmbedQueue::new(100, 2);
        queue.push(3, vec![bad]);
        let results = run(&mut queue, &service);
        assert_eq!(results.len(), 1);
        let (_, work, dlq) = &results[0];
        assert_eq!(dlq.len(), 1);
        assert!(work[0].points.is_empty());
        assert_eq!(work[0].deletes, vec![uuid::Uuid::nil()]);
    }

    /// [`Picky`] behind a gate: each call waits until the gate opens.
    struct Gated(Arc<std::sync::atomic::AtomicBool>);

    impl Embedder for Gated {
        fn version(&self) -> &str {
            Picky.version()
        }
        fn dimension(&self) -> usize {
            Picky.dimension()
        }
        fn embed(&mut self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
            while !self.0.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            Picky.embed(texts)
        }
        fn last_token_count(&self) -> usize {
            0
        }
    }

    /// In a small dataflow: while the model is busy, a batch's time stays incomplete and the worker
    /// keeps stepping; once the vectors are back the batch's index work and DLQ records leave at its
    /// time, and the time completes.
    #[test]
    fn a_time_completes_only_once_its_batch_is_embedded_and_the_worker_never_waits() {
        use std::cell::RefCell;
        use std::rc::Rc;
        use std::time::Instant;
        use timely::dataflow::operators::vec::Input;
        use timely::dataflow::operators::{Inspect, Probe};

        let open = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let service = InferenceService::start(
            vec![Box::new(Gated(open.clone()))],
            ServiceConfig {
                slice_word_pieces: 1000,
                query_batch: 8,
                query_executor: false,
                version_tag: None,
                query_headroom: None,
            },
        )
        .unwrap();
        let (steps_while_busy, outputs) = timely::execute_directly(move |worker| {
            let outputs = Rc::new(RefCell::new(Vec::new()));
            let seen = outputs.clone();
            let (mut input, probe) = worker.dataflow(|scope| {
                let (input, stream) = scope.new_input::<ChunkDelta>();
                let probe = stream
                    .embed_chunks(
                        service,
                        EmbedOptions {
                            evidence: EvidenceUnits::Off,
                            bm25: Default::default(),
                            fair: true,
                        },
                        crate::ingest::acked::Acked::shared(),
                    )
                    .inspect_core(move |event| {
                        if let Ok((stamp, data)) = event {
                            let time: u64 = *stamp.elements().first().expect("a time");
                            let results: &Vec<Result<IndexDelta, DlqRecord>> = data;
                            seen.borrow_mut()
                                .extend(results.iter().map(|result| (time, result.clone())));
                        }
                    })
                    .probe()
                    .0;
                (input, probe)
            });
            input.send(insert("a", "A good document."));
            input.send(insert("b", "A BAD document."));
            input.advance_to(1);
            let (started, mut steps) = (Instant::now(), 0);
            while started.elapsed() < Duration::from_millis(300) {
                worker.step();
                steps += 1;
            }
            assert!(probe.less_equal(&0), "time 0 is held while the model works");
            assert!(outputs.borrow().is_empty(), "nothing emitted");
            open.store(true, std::sync::atomic::Ordering::SeqCst);
            let deadline = Instant::now() + Duration::from_secs(20);
            while probe.less_equal(&0) && Instant::now() < deadline {
                worker.step();
            }
            assert!(!probe.less_equal(&0), "time 0 completed once embedded");
            (steps, outputs.take())
        });
        assert!(steps_while_busy > 50, "{steps_while_busy} steps in 300 ms");
        let mut written: Vec<(u64, &str, usize)> = Vec::new();
        let mut dead: Vec<(u64, &str)> = Vec::new();
        for (time, result) in &outputs {
            match result {
                Ok(delta) => written.push((*time, delta.key.doc_id.as_str(), delta.points.len())),
                Err(record) => dead.push((*time, record.reason.as_str())),
            }
        }
        written.sort();
        assert_eq!(written, [(0, "a", 1), (0, "b", 0)]);
        assert_eq!(dead, [(0, "embedding_dimension")]);
    }
}
