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

/// A filled query's pool: each lane keeps its best hits until they hold `tokens` stored tokens
/// and number at least the lane's floor ([`pool_len`]), at most its `limit`. Counted per lane, so a
/// shard's cut keeps every hit of the lanes cut again after the shards are merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    /// Stored tokens each lane's hits hold.
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
    /// Seconds per request made, named for the `query_stage_seconds` metric (`retrieve_dense`,
    /// `retrieve_bm25`, `retrieve_vectors` one after another; `retrieve_batch` for one request).
    pub timings: Vec<(&'static str, f64)>,
}

/// How many of a lane's hits, best first, a pool of `pool` stored tokens keeps: the fewest whose
/// `tokens` reach it (the one reaching it included) and number at least `floor`, or all of them.
pub fn pool_len(tokens: impl IntoIterator<Item = u32>, pool: usize, floor: usize) -> usize {
    let mut held = 0usize;
    let mut kept = 0;
    for chunk in tokens {
        if held >= pool && kept >= floor {
            break;
        }
        held = held.saturating_add(chunk as usize);
        kept += 1;
    }
    kept
}

impl LaneHits {
    /// Cuts each lane to what `pool` keeps ([`pool_len`]) and drops the vectors and evidence of
    /// the hits cut.
    pub fn cut_to_pool(&mut self, pool: Pool) {
        for (lane, floor) in [(&mut self.dense, pool.dense), (&mut self.bm25, pool.bm25)] {
            let tokens = lane.iter().map(|hit| hit.stored.chunk.tokens);
            let kept = pool_len(tokens, pool.tokens, floor);
            lane.truncate(kept);
        }
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

/// Each lane with [`VectorStore::search`], cut to the pool, then the hits' vectors with
/// [`VectorStore::vectors`]: the default of [`VectorStore::search_lanes`].
pub fn sequential(
    store: &(impl VectorStore + ?Sized),
    lanes: &LaneQuery,
    filter: &SearchFilter,
) -> Result<LaneHits, StoreError> {
    let mut hits = LaneHits::default();
    let timed =
        |name: &'static str, started: std::time::Instant| (name, started.elapsed().as_secs_f64());
    if let Some(lane) = &lanes.dense {
        let started = std::time::Instant::now();
        hits.dense = store.search(
            &SearchVector::Dense(lane.vector.clone()),
            filter,
            lane.limit,
            lane.score_threshold,
        )?;
        hits.timings.push(timed("retrieve_dense", started));
    }
    if let Some(lane) = &lanes.bm25 {
        let started = std::time::Instant::now();
        hits.bm25 = store.search(
            &SearchVector::Sparse(lane.vector.clone()),
            filter,
            lane.limit,
            lane.score_threshold,
        )?;
        hits.timings.push(timed("retrieve_bm25", started));
    }
    if let Some(pool) = lanes.pool {
        hits.cut_to_pool(pool);
    }
    let ids = hits.hit_ids();
    if !ids.is_empty() {
        let started = std::time::Instant::now();
        hits.vectors = store.vectors(&ids)?;
        hits.timings.push(timed("retrieve_vectors", started));
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
    use super::pool_len;

    #[test]
    fn a_pool_keeps_the_fewest_hits_that_hold_it() {
        assert_eq!(
            pool_len([100, 50, 70, 10], 150, 0),
            2,
            "the one reaching it included"
        );
        assert_eq!(pool_len([100, 50, 70, 10], 151, 0), 3);
        assert_eq!(pool_len([100, 50, 70, 10], 150, 3), 3, "at least the floor");
        assert_eq!(pool_len([100, 50], 1_000, 0), 2, "all when they hold less");
        assert_eq!(pool_len([100, 50], 10, 5), 2, "all when there are fewer");
        assert_eq!(pool_len([0, 0, 40], 30, 0), 3, "empty hits hold nothing");
        assert_eq!(pool_len([], 30, 0), 0);
        let huge = [u32::MAX, u32::MAX, 5];
        assert_eq!(pool_len(huge, usize::MAX, 0), 3, "no overflow");
    }
}
