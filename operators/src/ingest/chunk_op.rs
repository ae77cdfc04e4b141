//! The timely wrapper of the chunker: upserts of documents → upserts of chunk sets, in bounded steps.
//!
//! Chunking counts tokens with the real tokenizer, about 0.1–0.3 ms a paragraph here: a Kafka poll of
//! 500 documents chunked in one go kept the worker from queries for up to ~100 ms. The operator takes
//! at most [`CHUNK_STEP`] of chunking per activation; the rest of its input waits, capability held, and
//! the operator activates itself again, so the worker answers queries in between.
//!
//! A document over [`LARGE_DOCUMENT_BYTES`] is chunked on the operator's helper thread instead (one
//! such document takes seconds at 8 MiB, far more than a step): the operator hands it over, yields the
//! worker, and is woken when its chunks are ready. Documents after it wait for it, so chunk sets leave
//! in the order their documents arrived.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::{Capability, Operator};
use timely::dataflow::StreamVec;

use super::chunk::Chunker;
use crate::model::{Chunk, ChunkSet, DocKey, Document};
use crate::offload::{Background, Ticket};

/// Chunking time one activation of the operator may take before it yields the worker.
pub const CHUNK_STEP: Duration = Duration::from_millis(5);

/// Documents whose text is longer than this are chunked on the helper thread, off the worker.
pub const LARGE_DOCUMENT_BYTES: usize = 64 * 1024;

type Upsert = (DocKey, Option<Document>, u64);

/// A large document on the Chunk operator's helper thread: its key, event time, and the ticket its
/// chunks come back in.
struct OnHelper {
    key: DocKey,
    document: Arc<Document>,
    time: u64,
    ticket: Ticket<Vec<Chunk>>,
}

/// Extension trait: chunk upserted documents.
pub trait ChunkDocuments<'scope> {
    /// Maps `(key, Some(doc), t)` to `(key, Some(chunks), t)`; deletes pass through.
    fn chunk_documents(
        self,
        chunker: Chunker,
    ) -> StreamVec<'scope, u64, (DocKey, Option<ChunkSet>, u64)>;
}

impl<'scope> ChunkDocuments<'scope> for StreamVec<'scope, u64, Upsert> {
    fn chunk_documents(
        self,
        chunker: Chunker,
    ) -> StreamVec<'scope, u64, (DocKey, Option<ChunkSet>, u64)> {
        let scope = self.scope();
        self.unary::<CapacityContainerBuilder<Vec<_>>, _, _, _>(
            Pipeline,
            "Chunk",
            move |_cap, info| {
                let activator = scope.activator_for(info.address.clone());
                let waker = crate::offload::operator_waker(scope.worker(), &info.address);
                let helper_chunker = chunker.clone();
                let helper: Background<Arc<Document>, Vec<Chunk>> = Background::start(
                    "chunk",
                    move |document: Arc<Document>, deliver| {
                        deliver.send(helper_chunker.chunk(&document))
                    },
                    waker,
                );
                let mut pending: VecDeque<(Capability<u64>, std::vec::IntoIter<Upsert>)> =
                    VecDeque::new();
                // The front batch's document on the helper thread.
                let mut on_helper: Option<OnHelper> = None;
                move |input, output| {
                    input.for_each(|cap, data| {
                        let cap = cap.retain_least(0).expect("time of the batch");
                        pending.push_back((cap, std::mem::take(data).into_iter()));
                    });
                    let started = Instant::now();
                    while let Some((cap, upserts)) = pending.front_mut() {
                        if let Some(OnHelper {
                            key,
                            document,
                            time,
                            ticket,
                        }) = on_helper.take()
                        {
                            match ticket.try_take() {
                                Some(chunks) => {
                                    let set = ChunkSet {
                                        version: document.version,
                                        chunks,
                                        document: Some(document),
                                    };
                                    output.session(cap).give((key, Some(set), time));
                                }
                                None => {
                                    // Still chunking: the helper wakes the operator when done.
                                    on_helper = Some(OnHelper {
                                        key,
                                        document,
                                        time,
                                        ticket,
                                    });
                                    return;
                                }
                            }
                        }
                        let mut session = output.session(cap);
                        for (key, document, time) in upserts.by_ref() {
                            match document {
                                Some(doc) if doc.text.len() > LARGE_DOCUMENT_BYTES => {
                                    let doc = Arc::new(doc);
                                    let ticket = helper.submit(doc.clone());
                                    on_helper = Some(OnHelper {
                                        key,
                                        document: doc,
                                        time,
                                        ticket,
                                    });
                                    break;
                                }
                                document => {
                                    let set = document.map(|doc| ChunkSet {
                                        version: doc.version,
                                        chunks: chunker.chunk(&doc),
                                        document: Some(Arc::new(doc)),
                                    });
                                    session.give((key, set, time));
                                }
                            }
                            if started.elapsed() >= CHUNK_STEP {
                                break;
                            }
                        }
                        drop(session);
                        if on_helper.is_some() {
                            continue;
                        }
                        if upserts.len() > 0 {
                            break;
                        }
                        pending.pop_front();
                    }
                    if !pending.is_empty() && on_helper.is_none() {
                        activator.activate();
                    }
                }
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use timely::dataflow::operators::vec::Input;
    use timely::dataflow::operators::{Inspect, Probe};

    use super::*;
    use crate::ingest::chunk::ChunkerConfig;
    use crate::model::DocKind;

    fn upsert(i: usize) -> Upsert {
        let key = DocKey::new("t", format!("d{i}"));
        let text = format!("Paragraph {i} says one thing. ").repeat(40);
        let doc = Document {
            key: key.clone(),
            version: 1,
            source: format!("d{i}.txt"),
            kind: DocKind::Prose,
            title: None,
            text,
            acl: vec![],
            updated_ms: 0,
            metadata: Default::default(),
        };
        (key, Some(doc), 0)
    }

    #[test]
    fn a_large_batch_is_chunked_in_steps_that_yield_the_worker() {
        const DOCUMENTS: usize = 2000;
        timely::execute_directly(|worker| {
            let seen = Rc::new(RefCell::new(Vec::new()));
            let sink = seen.clone();
            let (mut input, probe) = worker.dataflow(|scope| {
                let (input, stream) = scope.new_input::<Upsert>();
                let probe = stream
                    .chunk_documents(Chunker::new(ChunkerConfig::default()))
                    .inspect(move |(key, set, _)| {
                        sink.borrow_mut().push((key.doc_id.clone(), set.is_some()))
                    })
                    .probe()
                    .0;
                (input, probe)
            });
            // One batch, as a Kafka poll delivers it; a delete passes through in its place.
            for i in 0..DOCUMENTS {
                input.send(upsert(i));
            }
            input.send((DocKey::new("t", "gone"), None, 0));
            input.advance_to(1);
            worker.step();
            worker.step();
            let after_two_steps = seen.borrow().len();
            assert!(
                (1..DOCUMENTS).contains(&after_two_steps),
                "chunking {DOCUMENTS} documents takes more than two steps of {CHUNK_STEP:?}: {after_two_steps} done"
            );
            while probe.less_than(&1) {
                worker.step();
            }
            let seen = seen.borrow();
            let expected: Vec<(String, bool)> = (0..DOCUMENTS)
                .map(|i| (format!("d{i}"), true))
                .chain([("gone".to_string(), false)])
                .collect();
            assert_eq!(*seen, expected, "every document once, in order");
        });
    }

    #[test]
    fn a_large_document_is_chunked_off_the_worker_and_keeps_its_place() {
        timely::execute_directly(|worker| {
            let seen = Rc::new(RefCell::new(Vec::new()));
            let sink = seen.clone();
            let (mut input, probe) = worker.dataflow(|scope| {
                let (input, stream) = scope.new_input::<Upsert>();
                let probe = stream
                    .chunk_documents(Chunker::new(ChunkerConfig::default()))
                    .inspect(move |(key, set, _)| {
                        let chunks = set.as_ref().map_or(0, |s| s.chunks.len());
                        sink.borrow_mut().push((key.doc_id.clone(), chunks))
                    })
                    .probe()
                    .0;
                (input, probe)
            });
            let (key, large, time) = upsert(1);
            let mut large = large.expect("an upsert");
            large.text = "One long line of words without an end ".repeat(4000);
            assert!(large.text.len() > LARGE_DOCUMENT_BYTES);
            input.send(upsert(0));
            input.send((key, Some(large), time));
            input.send(upsert(2));
            input.advance_to(1);
            while probe.less_than(&1) {
                worker.step();
            }
            let seen = seen.borrow();
            let order: Vec<&str> = seen.iter().map(|(id, _)| id.as_str()).collect();
            assert_eq!(
                order,
                ["d0", "d1", "d2"],
                "chunk sets leave in arrival order"
            );
            assert!(seen[1].1 > 10, "the large document was chunked: {seen:?}");
        });
    }
}
