//! One query's retrieval against one index: both lanes and the stored vectors of their hits
//! ([`super::VectorStore::search_lanes`]). The embedded index answers it with three calls in
//! process ([`sequential`]); the Qdrant server in one request, so a query pays one network round
//! trip for retrieval instead of three.

use super::{
    Hit, SearchFilter, SearchVector, SparseVector, StoreError, StoredChunk, StoredVectors,
    VectorStore,
};
use crate::model::DocKey;

/// One lane to search: its query vector, how many hits, the engine's score threshold.
#[derive(Debug, Clone)]
pub struct Lane<V> {
    /// The query vector.
    pub vector: V,
    /// Hits wanted.
    pub limit: usize,
    /// Hits scoring below it are left out (a cosine for the dense lane, a BM25 score for the other).
    pub score_threshold: Option<f32>,
}

/// Both lanes of one query, either absent (a query without words or without an embedding).
#[derive(Debug, Clone, Default)]
pub struct LaneQuery {
    /// The dense lane.
    pub dense: Option<Lane<Vec<f32>>>,
    /// The BM25 lane.
    pub bm25: Option<Lane<SparseVector>>,
    /// A filled query's pool: each lane cut where [`Pool`] says (`None`: every hit up to the
    /// limit).
    pub pool: Option<Pool>,
}

/// A filled query's pool: the lanes keep their best hits, taken in turn, until the distinct chunks
/// they hold have `tokens` stored tokens and each lane numbers at least its floor ([`pool_cut`]), at
/// most its `limit`. A shard's cut keeps every hit of the lanes cut again after the shards are
/// merged (a shard's lanes hold no more than the merged lanes' hits at the same ranks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Pool {
    /// Stored tokens the lanes' distinct hits hold.
    pub tokens: usize,
    /// Hits the dense lane keeps at least (its depth without the pool).
    pub dense: usize,
    /// Hits the BM25 lane keeps at least.
    pub bm25: usize,
}

/// What [`super::VectorStore::search_lanes`] returns.
#[derive(Debug, Clone, Default)]
pub struct LaneHits {
    /// The dense lane, best first.
    pub dense: Vec<Hit>,
    /// The BM25 lane, best first.
    pub bm25: Vec<Hit>,
    /// The stored vectors of every hit of either lane, each point once (without the evidence
    /// units where `evidence` holds their scores).
    pub vectors: Vec<(uuid::Uuid, StoredVectors)>,
    /// The sentence evidence of the hits with evidence units, as the engine scored it
    /// ([`StoredVectors::evidence_score`] of the dense query: its highest cosine to a unit); `None`
    /// where the units are in `vectors` instead. A hit without units has no score here.
    pub evidence: Option<Vec<(uuid::Uuid, f32)>>,
    /// Seconds per request made, by stage (`RetrieveDense`, `RetrieveBm25`, `RetrieveVectors` one
    /// after another; `RetrieveBatch` for one request, `RetrievePoints` for the points it left to
    /// read).
    pub timings: Vec<(crate::query::Stage, f64)>,
}

/// A walk of the lanes for a pool that met a hit whose stored tokens are not known yet: the hits
/// walked in each lane before it and the tokens they hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unread {
    /// Dense hits walked.
    pub dense: usize,
    /// BM25 hits walked.
    pub bm25: usize,
    /// Stored tokens of the distinct hits walked.
    pub held: usize,
}

/// How many hits of each lane (`[dense, bm25]`, best first) `pool` keeps: the lanes are walked in
/// turn, rank by rank (dense first), each chunk's tokens counted once whichever lanes hold it, until
/// the hits walked hold `pool.tokens` (the one reaching it included); a lane then goes on alone
/// to its floor. All hits where they hold less. `hit` gives a hit's id and its stored tokens, `None`
/// where they are not known yet: the walk then stops there ([`Unread`]), for the caller to read
/// them and walk again.
pub fn pool_cut<T>(
    lanes: [&[T]; 2],
    pool: Pool,
    hit: impl Fn(&T) -> (uuid::Uuid, Option<u32>),
) -> Result<(usize, usize), Unread> {
    let [dense, bm25] = lanes;
    let (mut walked, mut held) = ([0usize; 2], 0usize);
    let mut seen = std::collections::HashSet::new();
    loop {
        let full = held >= pool.tokens;
        let wants = |lane: usize, length: usize, floor: usize| {
            walked[lane] < length && (!full || walked[lane] < floor)
        };
        let (dense_wants, bm25_wants) = (
            wants(0, dense.len(), pool.dense),
            wants(1, bm25.len(), pool.bm25),
        );
        let lane = match (dense_wants, bm25_wants) {
            (false, false) => return Ok((walked[0], walked[1])),
            (true, true) => usize::from(walked[1] < walked[0]),
            (dense_wants, _) => usize::from(!dense_wants),
        };
        let (id, tokens) = hit(&[dense, bm25][lane][walked[lane]]);
        let Some(tokens) = tokens else {
            return Err(Unread {
                dense: walked[0],
                bm25: walked[1],
                held,
            });
        };
        if seen.insert(id) {
            held = held.saturating_add(tokens as usize);
        }
        walked[lane] += 1;
    }
}

impl LaneHits {
    /// Cuts the lanes to what `pool` keeps ([`pool_cut`]) and drops the vectors and evidence of
    /// the hits cut.
    pub fn cut_to_pool(&mut self, pool: Pool) {
        let (dense, bm25) = cut_hits(&self.dense, &self.bm25, pool);
        self.dense.truncate(dense);
        self.bm25.truncate(bm25);
        self.retain_hits_vectors();
    }

    /// Drops the vectors and evidence of points no longer in either lane.
    pub fn retain_hits_vectors(&mut self) {
        let kept = self.hit_ids();
        self.vectors
            .retain(|(id, _)| kept.binary_search(id).is_ok());
        if let Some(evidence) = &mut self.evidence {
            evidence.retain(|(id, _)| kept.binary_search(id).is_ok());
        }
    }

    /// The ids of every hit of either lane, each once, sorted.
    pub fn hit_ids(&self) -> Vec<uuid::Uuid> {
        let mut ids: Vec<uuid::Uuid> = self
            .dense
            .iter()
            .chain(&self.bm25)
            .map(|hit| hit.stored.id)
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }
}

/// How many hits of each lane `pool` keeps ([`pool_cut`] of hits read with their payloads).
pub fn cut_hits(dense: &[Hit], bm25: &[Hit], pool: Pool) -> (usize, usize) {
    let known = |hit: &Hit| (hit.stored.id, Some(hit.stored.chunk.tokens));
    // Every token is known, so the walk never stops at an unread hit.
    pool_cut([dense, bm25], pool, known).unwrap_or_else(|walked| (walked.dense, walked.bm25))
}

/// Each lane with [`VectorStore::search`], cut to the pool, then the hits' vectors with
/// [`VectorStore::vectors`]: the default of [`VectorStore::search_lanes`].
pub fn sequential(
    store: &(impl VectorStore + ?Sized),
    lanes: &LaneQuery,
    filter: &SearchFilter,
) -> Result<LaneHits, StoreError> {
    let mut hits = LaneHits::default();
    let timed = |stage: crate::query::Stage, started: std::time::Instant| {
        (stage, started.elapsed().as_secs_f64())
    };
    if let Some(lane) = &lanes.dense {
        let started = std::time::Instant::now();
        hits.dense = store.search(
            &SearchVector::Dense(lane.vector.clone()),
            filter,
            lane.limit,
            lane.score_threshold,
        )?;
        hits.timings
            .push(timed(crate::query::Stage::RetrieveDense, started));
    }
    if let Some(lane) = &lanes.bm25 {
        let started = std::time::Instant::now();
        hits.bm25 = store.search(
            &SearchVector::Sparse(lane.vector.clone()),
            filter,
            lane.limit,
            lane.score_threshold,
        )?;
        hits.timings
            .push(timed(crate::query::Stage::RetrieveBm25, started));
    }
    if let Some(pool) = lanes.pool {
        hits.cut_to_pool(pool);
    }
    let ids = hits.hit_ids();
    if !ids.is_empty() {
        let started = std::time::Instant::now();
        hits.vectors = store.vectors(&ids)?;
        hits.timings
            .push(timed(crate::query::Stage::RetrieveVectors, started));
    }
    Ok(hits)
}

/// The chunks of `key`'s document within `radius` positions of `order`, by scrolling the document:
/// the default of [`VectorStore::neighbours`].
pub fn scrolled_neighbours(
    store: &(impl VectorStore + ?Sized),
    key: &DocKey,
    order: u32,
    radius: u32,
) -> Result<Vec<StoredChunk>, StoreError> {
    let mut out = Vec::new();
    store.scroll(&document_filter(key), &mut |stored| {
        if stored.chunk.order_index.abs_diff(order) <= radius {
            out.push(stored);
        }
    })?;
    Ok(out)
}

/// Every chunk of `key`'s document.
pub fn document_filter(key: &DocKey) -> SearchFilter {
    SearchFilter {
        tenant: Some(key.tenant.clone()),
        doc_ids: vec![key.doc_id.clone()],
        ..SearchFilter::default()
    }
}

#[cfg(test)]
mod tests {
    use super::{pool_cut, Pool, Unread};

    /// The lanes' hits as ids (ids are numbers here) with their tokens, cut for `pool`.
    fn cut(dense: &[(u128, u32)], bm25: &[(u128, u32)], pool: Pool) -> (usize, usize) {
        let hit = |&(id, tokens): &(u128, u32)| (uuid::Uuid::from_u128(id), Some(tokens));
        pool_cut([dense, bm25], pool, hit).expect("every token known")
    }

    fn pool(tokens: usize, dense: usize, bm25: usize) -> Pool {
        Pool {
            tokens,
            dense,
            bm25,
        }
    }

    #[test]
    fn a_pool_walks_the_lanes_in_turn_until_they_hold_it() {
        let dense = [(1, 100), (2, 50), (3, 70), (4, 10)];
        let bm25 = [(5, 40), (1, 100), (6, 30), (7, 20)];
        // dense 1 (100), bm25 5 (140), dense 2 (190): the one reaching it included.
        assert_eq!(cut(&dense, &bm25, pool(150, 0, 0)), (2, 1));
        assert_eq!(cut(&dense, &bm25, pool(190, 0, 0)), (2, 1));
        // bm25 1 is dense 1 again: it holds nothing new, so dense 3 follows (260).
        assert_eq!(cut(&dense, &bm25, pool(191, 0, 0)), (3, 2));
        assert_eq!(
            cut(&dense, &bm25, pool(150, 0, 3)),
            (2, 3),
            "a lane to its floor"
        );
        assert_eq!(
            cut(&dense, &bm25, pool(150, 4, 0)),
            (4, 1),
            "the dense floor"
        );
        assert_eq!(cut(&dense, &bm25, pool(10_000, 0, 0)), (4, 4), "all");
        assert_eq!(cut(&dense, &[], pool(150, 0, 0)), (2, 0), "one lane");
        assert_eq!(cut(&[], &bm25, pool(60, 0, 0)), (0, 2));
        assert_eq!(cut(&[], &[], pool(60, 1, 1)), (0, 0));
        assert_eq!(cut(&dense, &bm25, pool(0, 0, 0)), (0, 0), "an empty pool");
        let huge = [(1, u32::MAX), (2, u32::MAX), (3, 5)];
        assert_eq!(
            cut(&huge, &huge, pool(usize::MAX, 0, 0)),
            (3, 3),
            "no overflow"
        );
    }

    #[test]
    fn a_walk_stops_at_the_first_hit_not_read() {
        let dense = [(1, Some(100)), (2, None)];
        let bm25 = [(5, Some(40)), (6, Some(30))];
        let hit = |&(id, tokens): &(u128, Option<u32>)| (uuid::Uuid::from_u128(id), tokens);
        assert_eq!(
            pool_cut([&dense[..], &bm25[..]], pool(1_000, 0, 0), hit),
            Err(Unread {
                dense: 1,
                bm25: 1,
                held: 140,
            })
        );
        assert_eq!(
            pool_cut([&dense[..], &bm25[..]], pool(140, 0, 0), hit),
            Ok((1, 1))
        );
    }
}
