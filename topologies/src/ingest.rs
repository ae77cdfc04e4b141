//! The ingest topology: wiring only.
//!
//! ```text
//!   assignments ─┐
//! source ─ok─► VersionGuard ─► Chunk ─┐
//!                   └─ ids read again at assignments (shared index) ─┐
//!             hydrated chunk ids @0 ─┴─────────────────────────────┴► arrange_from_upsert(DocKey → ChunkIds) ─► ChunkDiff ─► Embed ─ok─► IndexWrite ─ok─┐
//!   └─err──────────────────────────────────────────────────────────────────────────────────────────┴err──────────┴err─► DlqWrite ─┴► acks probe
//!                                                                                     changed chunk ids (returned) ◄──────┤
//!                                                                  hydrated BM25 statistics @0 ─┐   AckStats ◄───────────┘
//!                                                                                               └─────┴► ShareStats (first worker of each process)
//!                                                          in a cluster with standing queries: IndexWrite ─► ShareChanges (first worker of each process)
//! ```

use std::sync::Arc;

use differential_dataflow::operators::arrange::upsert::arrange_from_upsert;
use differential_dataflow::trace::implementations::{ValBuilder, ValSpine};
use timely::dataflow::operators::vec::{Map, ToStream};
use timely::dataflow::operators::{Concat, OkErr, Probe};
use timely::dataflow::{ProbeHandle, Scope, StreamVec};

use ragstream_operators::embed::service::InferenceService;
use ragstream_operators::ingest::acked::Acked;
use ragstream_operators::ingest::chunk::Chunker;
use ragstream_operators::ingest::chunk_op::ChunkDocuments;
use ragstream_operators::ingest::diff::{DiffChunks, HYDRATION_TIME};
use ragstream_operators::ingest::dlq::DlqRecord;
use ragstream_operators::ingest::embed::{EmbedChunks, EmbedOptions, IndexDelta};
use ragstream_operators::ingest::guard::Assigned;
use ragstream_operators::ingest::guard::{GuardVersions, Rehydration};
use ragstream_operators::ingest::hydrate::Hydrated;
use ragstream_operators::ingest::index_write::{IndexAck, Optimize, WriteIndex};
use ragstream_operators::ingest::quota::{refused_record, Usage};
use ragstream_operators::ingest::stats::{ShareChanges, ShareStats};
use ragstream_operators::ingest::written::Finished;
use ragstream_operators::io::dlq_sink::{DlqSink, WriteDlq};
use ragstream_operators::model::{ChunkIds, ChunkSet, DocKey, DocOp, EvidenceUnits};
use ragstream_operators::stage::map_stage;
use ragstream_operators::store::stats::{CorpusStats, StatsDelta};
use ragstream_operators::store::{Bm25Params, VectorStore};

/// A document's chunks (`None`: a delete) at its time.
type Chunked = (DocKey, Option<ChunkSet>, u64);

/// Everything one worker's ingest flow needs.
pub struct IngestParts {
    /// What this worker's shard held at start.
    pub hydrated: Hydrated,
    /// The chunker.
    pub chunker: Chunker,
    /// The process's inference service.
    pub embedder: InferenceService,
    /// Which evidence units of each chunk get vectors (`embedder.evidence_units`, `evidence_vectors`).
    pub evidence_units: EvidenceUnits,
    /// BM25's document-side weighting (`index.bm25`).
    pub bm25: Bm25Params,
    /// This worker's shard.
    pub store: Arc<dyn VectorStore>,
    /// When the shard's writer optimizes (`index.tuning.optimize_every`, `optimize_idle_ms`).
    pub optimize: Optimize,
    /// Where refused events go.
    pub dlq: Box<dyn DlqSink>,
    /// The process's BM25 statistics (applied here when this worker is a leader).
    pub stats: Arc<CorpusStats>,
    /// The first worker of every process: each applies every shard's statistics deltas.
    pub stats_leaders: Vec<usize>,
    /// With a shared index: how the version guard reads it again at every partition assignment.
    pub rehydration: Option<Rehydration>,
    /// A lane per tenant in the inference service (`ingest.fair`).
    pub fair: bool,
    /// Where the index writers record the documents they finish (a local source's log, the
    /// standing queries' change feed).
    pub finished: Finished,
    /// What each tenant holds in this process's index, under `ingest.quotas`.
    pub usage: Arc<Usage>,
}

/// Wires the ingest flow behind `events`; the index and DLQ writers report to `acks`. Returns the ids
/// of the chunks each acknowledged write deleted or changed (for the invalidation of the contexts that
/// cite them).
// `Result<_, DlqRecord>` streams carry refused events as data to the DLQ, not error paths.
#[allow(clippy::result_large_err)]
pub fn ingest<'scope>(
    scope: Scope<'scope, u64>,
    events: StreamVec<'scope, u64, Result<DocOp, DlqRecord>>,
    assigned: StreamVec<'scope, u64, Assigned>,
    parts: IngestParts,
    acks: &ProbeHandle<u64>,
) -> StreamVec<'scope, u64, uuid::Uuid> {
    let IngestParts {
        hydrated,
        chunker,
        embedder,
        evidence_units,
        bm25,
        store,
        optimize,
        dlq,
        stats,
        stats_leaders,
        rehydration,
        fair,
        finished,
        usage,
    } = parts;
    let shared_changes = finished.changes.clone().filter(|_| finished.ship);
    let guard = hydrated.guard();
    let (ops, refused): (
        StreamVec<'scope, u64, DocOp>,
        StreamVec<'scope, u64, DlqRecord>,
    ) = events.ok_err(|event| event);
    let (admitted, rehydrated) = ops.guard_versions(guard, assigned, rehydration);
    for (key, chunks) in &hydrated.documents {
        let bytes = chunks
            .iter()
            .map(|c| c.chunk.char_range.1)
            .max()
            .unwrap_or(0);
        usage.seed(key, chunks.len() as u64, u64::from(bytes));
    }
    let (sets, over_quota) = within_quotas(admitted.chunk_documents(chunker), usage);
    let ids = map_stage(sets.clone(), "ChunkIds", |(key, set, time)| {
        let ids = set.as_ref().map(|set| set.ids(&key));
        (key, ids, time)
    });
    let hydration = hydrated
        .ids()
        .map(|(key, ids)| (key, Some(ids), HYDRATION_TIME))
        .collect::<Vec<_>>()
        .to_stream(scope);
    // An index that applies IDF itself (the server's shared collection) needs no statistics.
    let initial_stats = if store.engine_idf() {
        StatsDelta::default()
    } else {
        hydrated.stats()
    };
    let hydrated_stats = vec![initial_stats].to_stream(scope);
    drop(hydrated);
    let arranged = arrange_from_upsert::<
        ValBuilder<DocKey, ChunkIds, u64, isize>,
        ValSpine<DocKey, ChunkIds, u64, isize>,
        DocKey,
        ChunkIds,
    >(hydration.concat(rehydrated).concat(ids), "DocUpsert");
    let deltas = arranged
        .as_collection(|key: &DocKey, ids: &ChunkIds| (key.clone(), ids.clone()))
        .inner
        .diff_chunks(sets);
    // What Embed and IndexWrite of this worker share: documents in flight, and what the index holds
    // of those it refused.
    let acked = Acked::shared();
    let (work, embed_refused): (
        StreamVec<'scope, u64, IndexDelta>,
        StreamVec<'scope, u64, DlqRecord>,
    ) = deltas
        .embed_chunks(
            embedder,
            EmbedOptions {
                evidence: evidence_units,
                bm25,
                fair,
            },
            acked.clone(),
        )
        .ok_err(|result| result);
    let (written, index_refused): (
        StreamVec<'scope, u64, IndexAck>,
        StreamVec<'scope, u64, DlqRecord>,
    ) = work
        .write_index(store, optimize, acked, finished)
        .ok_err(|result| result);
    let changed = written.clone().flat_map(|ack: IndexAck| ack.changed);
    if let Some(changes) = shared_changes {
        written
            .clone()
            .flat_map(|ack: IndexAck| ack.shipped)
            .share_changes(changes, stats_leaders.clone());
    }
    let stats_deltas = map_stage(written, "AckStats", |ack: IndexAck| ack.stats).probe_with(acks);
    hydrated_stats
        .concat(stats_deltas)
        .share_stats(stats, stats_leaders);
    refused
        .concat(over_quota)
        .concat(embed_refused)
        .concat(index_refused)
        .write_dlq(dlq)
        .probe_with(acks);
    changed
}

/// The chunked documents within their tenant's quotas, and the DLQ records of those past them (the
/// index keeps what it held of those).
// `Result<_, DlqRecord>` streams carry refused events as data to the DLQ, not error paths.
#[allow(clippy::result_large_err)]
fn within_quotas<'scope>(
    chunked: StreamVec<'scope, u64, Chunked>,
    usage: Arc<Usage>,
) -> (
    StreamVec<'scope, u64, Chunked>,
    StreamVec<'scope, u64, DlqRecord>,
) {
    map_stage(chunked, "Quota", move |(key, set, time)| {
        match usage.admit(&key, set.as_ref()) {
            Ok(()) => Ok((key, set, time)),
            Err(refusal) => Err(refused_record(
                &key,
                set.as_ref().expect("a delete is never refused"),
                &refusal,
            )),
        }
    })
    .ok_err(|result| result)
}
