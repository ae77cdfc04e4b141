//! Retrieve: the dense and BM25 lanes against one shard, with every filter inside the index query.
//!
//! A query is broadcast to every worker; each searches its own shard ([`search_shard`]) and the
//! answers are gathered by query id ([`gather`]). With the Qdrant server backend all workers share one
//! collection, so only worker 0 searches it. Besides the lanes, a shard answers the non-retrieval modes
//! (`list_sources`: its documents and chunk counts; `read_chunk`: the chunk if it holds it) and returns
//! the stored vectors of its hits for dedup and MMR.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::metrics::metrics;
use crate::model::DocKind;
use crate::store::lanes::{cut_hits, Pool};
use crate::store::{
    Hit, Lane, LaneHits, LaneQuery, SearchFilter, SparseVector, StoreError, StoredChunk,
    VectorStore,
};
use ragstream_core::query::pattern::{literal_prefix, SourcePattern, PATTERN_DEPTH_FACTOR};
use ragstream_core::query::{
    Depth, IndexStats, Mode, Query, SourceEntry, LIST_MAX_PAGE, LIST_PAGE,
};

/// The filter of a query: tenant, ACL, source prefix, kinds and documents, all inside the search
/// (a source pattern's literal directories as the prefix when the query gives none; the rest of the
/// pattern is [`pattern_of`]'s).
pub fn filter_for(query: &Query) -> SearchFilter {
    let mut kinds = query.filters.kinds.clone();
    if matches!(query.mode, Mode::SqlCompact | Mode::SqlFull) {
        kinds = vec![DocKind::SqlSchema];
    }
    let source_prefix = query.filters.source_prefix.clone().or_else(|| {
        let pattern = query.filters.source_pattern.as_deref()?;
        Some(literal_prefix(pattern)).filter(|p| !p.is_empty())
    });
    SearchFilter {
        tenant: Some(query.tenant.clone()),
        acl: query.acl.clone(),
        kinds,
        doc_ids: query.filters.doc_ids.clone(),
        source_prefix,
        langs: query.filters.langs.clone(),
        metadata: query.filters.metadata.0.clone(),
    }
}

/// The query's source pattern (checked when the query was decoded).
pub fn pattern_of(query: &Query) -> Option<SourcePattern> {
    query
        .filters
        .source_pattern
        .as_deref()
        .and_then(|p| SourcePattern::parse(p).ok())
}

/// The query's vectors.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueryVectors {
    /// Dense embedding of the query text (empty for modes that do not retrieve).
    pub dense: Vec<f32>,
    /// BM25 query vector.
    pub sparse: SparseVector,
    /// The BM25 query vector's weights before the corpus's IDF was applied (empty until then).
    #[serde(default)]
    pub sparse_raw: Vec<f32>,
}

/// One shard's answer to one query.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ShardAnswer {
    /// Dense lane, best first.
    pub dense: Vec<Hit>,
    /// BM25 lane, best first.
    pub bm25: Vec<Hit>,
    /// Stored vectors of the hits.
    pub vectors: Vec<(uuid::Uuid, Vec<f32>)>,
    /// Sentence evidence of the hits ([`crate::store::StoredVectors::evidence_score`]), computed
    /// where the vectors are (only a number per hit leaves the shard).
    pub evidence: Vec<(uuid::Uuid, f32)>,
    /// Documents and chunk counts (`list_sources`, `files`, unknown `read_chunk` ids).
    pub sources: Vec<SourceEntry>,
    /// The chunk asked for (`read_chunk`).
    pub chunk: Option<StoredChunk>,
    /// What the shard holds for the query (`index_stats`).
    #[serde(default)]
    pub stats: Option<IndexStats>,
    /// Set when the shard failed.
    pub error: Option<String>,
    /// Per lane (dense, BM25), whether the merged lane was cut ([`gather`]): a chunk scoring below
    /// its lowest member would not enter it.
    #[serde(skip)]
    pub cut: [bool; 2],
    /// What the retrieval saw, for standing queries (set on the query's origin worker).
    #[serde(skip)]
    pub probe: Option<std::sync::Arc<ragstream_core::query::probe::Probe>>,
}

/// One page of the documents matching `filter` (and `pattern`) with their chunk counts: the first
/// `limit` document ids after `after`, in id order, plus the next one when there is one (so the
/// caller knows a next page exists). Memory stays within `limit + 1` entries whatever the tenant's
/// size.
pub fn list_sources(
    store: &dyn VectorStore,
    (filter, pattern): (&SearchFilter, Option<&SourcePattern>),
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<SourceEntry>, StoreError> {
    let mut by_doc: BTreeMap<String, SourceEntry> = BTreeMap::new();
    store.scroll(filter, &mut |stored| {
        let doc_id = stored.key.doc_id.as_str();
        if after.is_some_and(|after| doc_id <= after)
            || pattern.is_some_and(|p| !p.matches(&stored.chunk.source))
        {
            return;
        }
        if let Some(entry) = by_doc.get_mut(doc_id) {
            entry.chunks += 1;
            return;
        }
        // Full: an id past the last kept one is on a later page (the last kept id only decreases,
        // so a document left out is never counted partially).
        if by_doc.len() > limit
            && by_doc
                .last_key_value()
                .is_some_and(|(last, _)| doc_id > last.as_str())
        {
            return;
        }
        by_doc.insert(
            doc_id.to_string(),
            SourceEntry {
                doc_id: doc_id.to_string(),
                source: stored.chunk.source.clone(),
                title: stored.chunk.doc_title.clone(),
                chunks: 1,
                hits: None,
                score: None,
                group: None,
                documents: None,
            },
        );
        if by_doc.len() > limit + 1 {
            by_doc.pop_last();
        }
    })?;
    Ok(by_doc.into_values().collect())
}

/// The chunk kinds `index_stats` counts.
const COUNTED_KINDS: [DocKind; 4] = [
    DocKind::Prose,
    DocKind::Markdown,
    DocKind::Code,
    DocKind::SqlSchema,
];

/// What one shard holds within `filter`: its chunks, by kind (five counts inside the index, no
/// scan).
pub fn index_stats(
    store: &dyn VectorStore,
    filter: &SearchFilter,
) -> Result<IndexStats, StoreError> {
    let mut chunks_by_kind = BTreeMap::new();
    for kind in COUNTED_KINDS {
        if !filter.kinds.is_empty() && !filter.kinds.contains(&kind) {
            continue;
        }
        let mut one = filter.clone();
        one.kinds = vec![kind];
        chunks_by_kind.insert(kind.as_str().to_string(), store.count(&one)?);
    }
    Ok(IndexStats {
        chunks: store.count(filter)?,
        chunks_by_kind,
        shards: 1,
        backend: store.backend().to_string(),
    })
}

/// Documents per `list_sources` page: `k`, [`LIST_PAGE`] by default, at most [`LIST_MAX_PAGE`].
pub fn list_page(query: &Query) -> usize {
    query.k.unwrap_or(LIST_PAGE).clamp(1, LIST_MAX_PAGE)
}

/// The dense and BM25 lanes of `query` on one shard, best first, cut to the query's
/// [`lane_pool`], and the stored vectors of their hits (one request on a backend that can:
/// [`VectorStore::search_lanes`]). A source pattern filters the hits, each lane reading
/// [`PATTERN_DEPTH_FACTOR`] times deeper so that as many pass (and the pool is cut from the hits
/// that pass).
fn search_lanes(
    store: &dyn VectorStore,
    query: &Query,
    vectors: &QueryVectors,
    (filter, pattern): (&SearchFilter, Option<&SourcePattern>),
    (wanted, pool): (Depth, Option<Pool>),
) -> Result<LaneHits, StoreError> {
    let factor = if pattern.is_some() {
        PATTERN_DEPTH_FACTOR
    } else {
        1
    };
    let lanes = LaneQuery {
        dense: (!vectors.dense.is_empty()).then(|| Lane {
            vector: vectors.dense.clone(),
            limit: wanted.dense * factor,
            score_threshold: query.score_threshold,
        }),
        bm25: (!vectors.sparse.indices.is_empty()).then(|| Lane {
            vector: vectors.sparse.clone(),
            limit: wanted.bm25 * factor,
            score_threshold: query.bm25_score_threshold,
        }),
        pool: pool.filter(|_| pattern.is_none()),
    };
    let mut hits = store.search_lanes(&lanes, filter)?;
    for (stage, seconds) in &hits.timings {
        metrics().observe_stage(*stage, *seconds);
    }
    if let Some(pattern) = pattern {
        for (lane, most) in [
            (&mut hits.dense, wanted.dense),
            (&mut hits.bm25, wanted.bm25),
        ] {
            lane.retain(|hit| pattern.matches(&hit.stored.chunk.source));
            lane.truncate(most);
        }
        match pool {
            Some(pool) => hits.cut_to_pool(pool),
            None => hits.retain_hits_vectors(),
        }
    }
    Ok(hits)
}

/// Runs `query` against one shard, its lanes read to `depth` and cut to `pool` ([`lane_pool`]).
pub fn search_shard(
    store: &dyn VectorStore,
    query: &Query,
    vectors: &QueryVectors,
    (depth, pool): (Depth, Option<Pool>),
) -> ShardAnswer {
    let filter = filter_for(query);
    let pattern = pattern_of(query);
    let pattern = pattern.as_ref();
    let result = (|| -> Result<ShardAnswer, StoreError> {
        let mut answer = ShardAnswer::default();
        match query.mode {
            Mode::ListSources => {
                answer.sources = list_sources(
                    store,
                    (&filter, pattern),
                    query.cursor.as_deref(),
                    list_page(query),
                )?;
            }
            Mode::IndexStats => answer.stats = Some(index_stats(store, &filter)?),
            Mode::ReadChunk => {
                let id = uuid::Uuid::parse_str(query.text.trim()).ok();
                let found = match id {
                    Some(id) => store.get(&[id])?,
                    None => Vec::new(),
                };
                // The chunk must belong to the tenant and pass the ACL like any search result.
                answer.chunk = found.into_iter().find(|stored| {
                    stored.key.tenant == query.tenant
                        && (stored.chunk.acl.is_empty()
                            || query.acl.as_ref().is_none_or(|labels| {
                                stored.chunk.acl.iter().any(|l| labels.contains(l))
                            }))
                });
                if answer.chunk.is_none() {
                    // What the caller could read instead: the first page of documents.
                    answer.sources = list_sources(store, (&filter, pattern), None, LIST_PAGE)?;
                }
            }
            _ => {
                let hits = search_lanes(store, query, vectors, (&filter, pattern), (depth, pool))?;
                // Scored by the engine where it did (a hit without units: its own cosine).
                let scored: Option<std::collections::HashMap<uuid::Uuid, f32>> =
                    hits.evidence.map(|scores| scores.into_iter().collect());
                for (id, stored) in hits.vectors {
                    if !vectors.dense.is_empty() {
                        let score = scored
                            .as_ref()
                            .and_then(|scores| scores.get(&id).copied())
                            .unwrap_or_else(|| stored.evidence_score(&vectors.dense));
                        answer.evidence.push((id, score));
                    }
                    answer.vectors.push((id, stored.dense));
                }
                (answer.dense, answer.bm25) = (hits.dense, hits.bm25);
                if query.mode == Mode::Files {
                    // Chunk counts of the files found here (a document lives on one shard).
                    let mut files = filter.clone();
                    files.doc_ids = answer
                        .dense
                        .iter()
                        .chain(&answer.bm25)
                        .map(|hit| hit.stored.key.doc_id.clone())
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .collect();
                    if !files.doc_ids.is_empty() {
                        let count = files.doc_ids.len();
                        answer.sources = list_sources(store, (&files, None), None, count)?;
                    }
                }
            }
        }
        Ok(answer)
    })();
    result.unwrap_or_else(|error| ShardAnswer {
        error: Some(error.to_string()),
        ..ShardAnswer::default()
    })
}

/// Merges the answers of every shard: lanes re-sorted by score and cut to their depth and `pool`
/// (each shard cut its own lanes to the pool, so they hold every hit the merged cut keeps), sources
/// summed.
pub fn gather(answers: Vec<ShardAnswer>, (depth, pool): (Depth, Option<Pool>)) -> ShardAnswer {
    let mut merged = ShardAnswer::default();
    let mut sources: BTreeMap<String, SourceEntry> = BTreeMap::new();
    for answer in answers {
        merged.dense.extend(answer.dense);
        merged.bm25.extend(answer.bm25);
        merged.vectors.extend(answer.vectors);
        merged.evidence.extend(answer.evidence);
        merged.chunk = merged.chunk.or(answer.chunk);
        merged.stats = match (merged.stats.take(), answer.stats) {
            (Some(mut total), Some(shard)) => {
                total.chunks += shard.chunks;
                total.shards += shard.shards;
                for (kind, chunks) in shard.chunks_by_kind {
                    *total.chunks_by_kind.entry(kind).or_default() += chunks;
                }
                Some(total)
            }
            (total, shard) => total.or(shard),
        };
        if merged.error.is_none() {
            merged.error = answer.error;
        }
        for source in answer.sources {
            match sources.get_mut(&source.doc_id) {
                Some(entry) => entry.chunks += source.chunks,
                None => {
                    sources.insert(source.doc_id.clone(), source);
                }
            }
        }
    }
    let read = [merged.dense.len(), merged.bm25.len()];
    for (lane, depth) in [
        (&mut merged.dense, depth.dense),
        (&mut merged.bm25, depth.bm25),
    ] {
        lane.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then_with(|| a.stored.id.cmp(&b.stored.id))
        });
        lane.truncate(depth);
    }
    if let Some(pool) = pool {
        let (dense, bm25) = cut_hits(&merged.dense, &merged.bm25, pool);
        merged.dense.truncate(dense);
        merged.bm25.truncate(bm25);
    }
    // A lane is cut where a chunk scoring below its lowest member would stay out: the merge
    // dropped hits of it, it read as deep as it asks (the shards may hold more), or a pool was
    // filled with the lane past its floor (the walk wants no more of it). A lane otherwise holds
    // every chunk the query can reach.
    let filled = pool.is_some_and(|pool| {
        let mut seen = std::collections::HashSet::new();
        let held: usize = merged
            .dense
            .iter()
            .chain(&merged.bm25)
            .filter(|hit| seen.insert(hit.stored.id))
            .map(|hit| hit.stored.chunk.tokens as usize)
            .sum();
        held >= pool.tokens
    });
    let floors = pool.map_or([usize::MAX; 2], |pool| [pool.dense, pool.bm25]);
    merged.cut = [
        merged.dense.len() < read[0]
            || read[0] >= depth.dense
            || (filled && merged.dense.len() >= floors[0]),
        merged.bm25.len() < read[1]
            || read[1] >= depth.bm25
            || (filled && merged.bm25.len() >= floors[1]),
    ];
    merged.sources = sources.into_values().collect();
    merged
}

/// What the gathered lanes of `query` (searched with `vectors`) saw ([`Probe`]).
///
/// [`Probe`]: ragstream_core::query::probe::Probe
/// `seen`: per BM25 query term, whether a chunk of the tenant held it.
pub fn probe(
    vectors: &QueryVectors,
    answer: &ShardAnswer,
    seen: Vec<bool>,
) -> ragstream_core::query::probe::Probe {
    let floor = |lane: &[Hit], cut: bool| match lane.last() {
        Some(hit) if cut => Some(hit.score),
        _ => None,
    };
    let mut docs: Vec<String> = answer
        .dense
        .iter()
        .chain(&answer.bm25)
        .map(|hit| hit.stored.key.doc_id.clone())
        .collect();
    docs.sort_unstable();
    docs.dedup();
    ragstream_core::query::probe::Probe {
        dense: vectors.dense.clone(),
        dense_floor: floor(&answer.dense, answer.cut[0]),
        bm25: vectors.sparse.clone(),
        bm25_raw: match vectors.sparse_raw.len() == vectors.sparse.values.len() {
            true => vectors.sparse_raw.clone(),
            false => vectors.sparse.values.clone(),
        },
        bm25_seen: seen,
        bm25_floor: floor(&answer.bm25, answer.cut[1]),
        bm25_top: answer.bm25.first().map_or(0.0, |hit| hit.score),
        docs,
        // Their texts, for the standing queries' registry to weigh off the worker.
        bm25_members: match answer.cut[1] {
            true => answer
                .bm25
                .iter()
                .map(|hit| ragstream_core::query::probe::Member {
                    id: hit.stored.id,
                    score: hit.score,
                    text: Some(hit.stored.chunk.embedding_input()),
                    weights: Vec::new(),
                })
                .collect(),
            false => Vec::new(),
        },
    }
}

#[cfg(test)]
mod tests;
