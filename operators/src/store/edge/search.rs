//! Searches of a shard: one lane (dense or BM25) under a filter, the dense lane with the tuning's beam
//! and int8 re-scoring, or in the other ways `bench volume` compares it with.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use serde_json::{Map, Value};

use qdrant_edge::{
    NamedQuery, PointId, QuantizationSearchParams, QueryEnum, QueryRequest, ScoringQuery,
    SearchParams, VectorInternal, WithPayloadInterface, WithVector,
};

use super::error::engine_error;
use super::filter::engine_filter;
use super::ids::{point_id, uuid_of};
use super::{scored_vectors, EdgeStore};
use crate::store::lanes::{pool_cut, Pool};
use crate::store::{
    chunk_from_payload, Hit, IndexTuning, LaneHits, LaneQuery, SearchFilter, SearchVector,
    StoreError, StoredChunk, StoredVectors, DENSE_VECTOR, EVIDENCE_VECTOR, SPARSE_VECTOR,
};
use ragstream_core::query::Stage;

/// Lanes read to a pool take their hits in batches of the tokens still wanted at this many a hit
/// (about an indexed prose chunk's mean: a batch seldom reads far past the pool)…
const POOL_READ_TOKENS: usize = 128;
/// … and at least this many hits a lane.
const POOL_READ_MIN: usize = 8;

/// The points a query's lanes read: their chunks, their vectors with the sentence evidence, and
/// every id asked for (found or not).
#[derive(Default)]
struct PointsRead {
    found: HashMap<uuid::Uuid, StoredChunk>,
    vectors: Vec<(uuid::Uuid, (StoredVectors, Option<f32>))>,
    tried: HashSet<uuid::Uuid>,
}

/// How [`EdgeStore::search_dense`] searches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenseSearch {
    /// As the job does: HNSW with the tuning's beam, int8 candidates re-scored when quantised.
    Configured,
    /// HNSW with the same beam on the float vectors only.
    FloatHnsw,
    /// Every point scored with its float vector: the reference.
    Exact,
}

impl EdgeStore {
    /// Dense search in one of the [`DenseSearch`] ways (what `bench volume` measures the recall of the
    /// configured search with).
    pub fn search_dense(
        &self,
        vector: &[f32],
        filter: &SearchFilter,
        limit: usize,
        way: DenseSearch,
    ) -> Result<Vec<Hit>, StoreError> {
        let float_only = Some(QuantizationSearchParams {
            ignore: true,
            rescore: None,
            oversampling: None,
        });
        let params = match way {
            DenseSearch::Configured => self.dense_params(limit),
            DenseSearch::FloatHnsw => SearchParams {
                quantization: float_only,
                ..self.dense_params(limit)
            },
            DenseSearch::Exact => SearchParams {
                exact: true,
                quantization: float_only,
                ..SearchParams::default()
            },
        };
        let vector = SearchVector::Dense(vector.to_vec());
        self.query(&vector, filter, limit, None, Some(params))
    }

    /// Searches one lane (the vector's) under `filter`, with the engine's search parameters.
    pub(super) fn query(
        &self,
        vector: &SearchVector,
        filter: &SearchFilter,
        limit: usize,
        score_threshold: Option<f32>,
        params: Option<SearchParams>,
    ) -> Result<Vec<Hit>, StoreError> {
        let request = self.request(vector, filter, limit, score_threshold, params)?;
        self.scored(vector, request, |id, payload, score| {
            Some(Hit {
                stored: chunk_from_payload(id, payload?)?,
                score,
            })
        })
    }

    /// Runs one lane's `request` and makes each point into a `T` from its id, payload (where asked
    /// for) and score (a cosine for the dense lane), best first.
    fn scored<T>(
        &self,
        vector: &SearchVector,
        request: QueryRequest,
        make: impl Fn(uuid::Uuid, Option<Map<String, Value>>, f32) -> Option<T>,
    ) -> Result<Vec<T>, StoreError> {
        let distance = self.tuning.distance;
        let dense = matches!(vector, SearchVector::Dense(_));
        let points = self.shard.query(request).map_err(engine_error)?;
        Ok(points
            .into_iter()
            .filter_map(|point| {
                let score = if dense {
                    distance.to_cosine(point.score)
                } else {
                    point.score
                };
                make(
                    uuid_of(&point.id)?,
                    point.payload.map(|payload| payload.0),
                    score,
                )
            })
            .collect())
    }

    /// The engine's request for one lane under `filter`, payloads included.
    fn request(
        &self,
        vector: &SearchVector,
        filter: &SearchFilter,
        limit: usize,
        score_threshold: Option<f32>,
        params: Option<SearchParams>,
    ) -> Result<QueryRequest, StoreError> {
        let distance = self.tuning.distance;
        let dense = matches!(vector, SearchVector::Dense(_));
        let (query, using) = match vector {
            SearchVector::Dense(dense) => {
                (VectorInternal::Dense(distance.prepare(dense)), DENSE_VECTOR)
            }
            SearchVector::Sparse(sparse) => {
                let sparse = qdrant_edge::SparseVector {
                    indices: sparse.indices.clone(),
                    values: sparse.values.clone(),
                };
                (VectorInternal::from(sparse), SPARSE_VECTOR)
            }
        };
        Ok(QueryRequest {
            prefetches: vec![],
            query: Some(ScoringQuery::Vector(QueryEnum::Nearest(NamedQuery::new(
                query, using,
            )))),
            filter: engine_filter(filter, &self.declared())?,
            score_threshold: score_threshold
                .map(|t| {
                    if dense {
                        distance.engine_threshold(t)
                    } else {
                        t
                    }
                })
                .map(qdrant_edge::external::ordered_float::OrderedFloat),
            limit,
            offset: 0,
            params,
            with_vector: WithVector::Bool(false),
            with_payload: WithPayloadInterface::Bool(true),
        })
    }

    /// Both lanes of a query and the stored vectors of their hits: each lane's ids and scores
    /// first, then the hits' payloads and vectors (a point in both lanes is read once, and no
    /// payload is decoded twice): every hit at once, or with a pool each lane's best first, a batch
    /// at a time, until they hold the pool ([`LaneQuery::pool`]).
    pub(super) fn lanes_then_points(
        &self,
        lanes: &LaneQuery,
        filter: &SearchFilter,
    ) -> Result<LaneHits, StoreError> {
        let timed = |stage: Stage, started: Instant| (stage, started.elapsed().as_secs_f64());
        let mut timings = Vec::new();
        let mut dense = Vec::new();
        if let Some(lane) = &lanes.dense {
            let started = Instant::now();
            let vector = SearchVector::Dense(lane.vector.clone());
            let params = Some(self.dense_params(lane.limit));
            let request =
                self.request(&vector, filter, lane.limit, lane.score_threshold, params)?;
            dense = self.ids_and_scores(&vector, request)?;
            timings.push(timed(Stage::RetrieveDense, started));
        }
        let mut bm25 = Vec::new();
        if let Some(lane) = &lanes.bm25 {
            let started = Instant::now();
            let vector = SearchVector::Sparse(lane.vector.clone());
            let request = self.request(&vector, filter, lane.limit, lane.score_threshold, None)?;
            bm25 = self.ids_and_scores(&vector, request)?;
            timings.push(timed(Stage::RetrieveBm25, started));
        }
        // With a dense query, the evidence units are scored here, where the engine returned them.
        let query = lanes.dense.as_ref().map(|lane| lane.vector.as_slice());
        let mut read = PointsRead::default();
        let started = Instant::now();
        match lanes.pool {
            None => {
                let ids: Vec<uuid::Uuid> = dense.iter().chain(&bm25).map(|(id, _)| *id).collect();
                self.read_points(&ids, query, &mut read)?;
            }
            Some(pool) => {
                let (kept_dense, kept_bm25) =
                    self.read_pool([&dense, &bm25], pool, query, &mut read)?;
                dense.truncate(kept_dense);
                bm25.truncate(kept_bm25);
            }
        }
        if !read.tried.is_empty() {
            timings.push(timed(Stage::RetrievePoints, started));
        }
        // A point deleted between the lane search and the read is left out of both. A chunk is
        // copied only for a point in both lanes; otherwise it moves into its hit.
        let mut hits = LaneHits::default();
        let in_bm25: HashSet<uuid::Uuid> = bm25.iter().map(|(id, _)| *id).collect();
        hits.dense = dense
            .into_iter()
            .filter_map(|(id, score)| {
                let stored = if in_bm25.contains(&id) {
                    read.found.get(&id)?.clone()
                } else {
                    read.found.remove(&id)?
                };
                Some(Hit { stored, score })
            })
            .collect();
        hits.bm25 = bm25
            .into_iter()
            .filter_map(|(id, score)| {
                Some(Hit {
                    stored: read.found.remove(&id)?,
                    score,
                })
            })
            .collect();
        // The vectors of the hits kept (a pool's last batch may have read a few more).
        let kept = hits.hit_ids();
        read.vectors
            .retain(|(id, _)| kept.binary_search(id).is_ok());
        read.vectors.sort_by_key(|(id, _)| *id);
        hits.evidence = query.map(|_| {
            read.vectors
                .iter()
                .filter_map(|(id, (_, score))| Some((*id, (*score)?)))
                .collect()
        });
        hits.vectors = read
            .vectors
            .into_iter()
            .map(|(id, (vectors, _))| (id, vectors))
            .collect();
        hits.timings = timings;
        Ok(hits)
    }

    /// Reads the lanes' hits best first, a batch of each at a time, until [`pool_cut`] can cut
    /// them (a hit deleted since the search holding none); returns how many hits of each lane the
    /// pool keeps.
    fn read_pool(
        &self,
        lanes: [&[(uuid::Uuid, f32)]; 2],
        pool: Pool,
        query: Option<&[f32]>,
        read: &mut PointsRead,
    ) -> Result<(usize, usize), StoreError> {
        loop {
            let known = |(id, _): &(uuid::Uuid, f32)| {
                let tokens = read.found.get(id).map_or(0, |s| s.chunk.tokens);
                (*id, read.tried.contains(id).then_some(tokens))
            };
            let unread = match pool_cut(lanes, pool, known) {
                Ok(kept) => return Ok(kept),
                Err(unread) => unread,
            };
            // Each lane's next batch: the tokens still wanted at a chunk per `POOL_READ_TOKENS`,
            // shared by the two lanes; at least what its floor still wants and `POOL_READ_MIN`.
            // The hit the walk stopped at is the first of its lane's batch.
            let wanted = (pool.tokens.saturating_sub(unread.held)).div_ceil(2 * POOL_READ_TOKENS);
            let mut ids = Vec::new();
            for (lane, walked, floor) in [
                (lanes[0], unread.dense, pool.dense),
                (lanes[1], unread.bm25, pool.bm25),
            ] {
                let batch = wanted.max(floor.saturating_sub(walked)).max(POOL_READ_MIN);
                ids.extend(lane.iter().skip(walked).take(batch).map(|(id, _)| *id));
            }
            self.read_points(&ids, query, read)?;
        }
    }

    /// Reads the payloads and vectors of the `ids` not read yet into `read` (the evidence scored
    /// against `query`).
    fn read_points(
        &self,
        ids: &[uuid::Uuid],
        query: Option<&[f32]>,
        read: &mut PointsRead,
    ) -> Result<(), StoreError> {
        let mut ids: Vec<uuid::Uuid> = ids
            .iter()
            .copied()
            .filter(|id| !read.tried.contains(id))
            .collect();
        ids.sort();
        ids.dedup();
        if ids.is_empty() {
            return Ok(());
        }
        read.tried.extend(&ids);
        let points: Vec<PointId> = ids.iter().map(|id| point_id(*id)).collect();
        let records = self
            .shard
            .retrieve(
                &points,
                Some(WithPayloadInterface::Bool(true)),
                Some(WithVector::Selector(vec![
                    DENSE_VECTOR.to_string(),
                    EVIDENCE_VECTOR.to_string(),
                ])),
            )
            .map_err(engine_error)?;
        for record in records {
            let Some(id) = uuid_of(&record.id) else {
                continue;
            };
            let Some(stored) = record
                .payload
                .and_then(|payload| chunk_from_payload(id, payload.0))
            else {
                continue;
            };
            if let Some(scored) = record
                .vector
                .and_then(|vectors| scored_vectors(vectors, query))
            {
                read.vectors.push((id, scored));
            }
            read.found.insert(id, stored);
        }
        Ok(())
    }

    /// One lane's ids and scores (cosines for the dense lane), best first: `request` without
    /// payloads.
    fn ids_and_scores(
        &self,
        vector: &SearchVector,
        mut request: QueryRequest,
    ) -> Result<Vec<(uuid::Uuid, f32)>, StoreError> {
        request.with_payload = WithPayloadInterface::Bool(false);
        self.scored(vector, request, |id, _, score| Some((id, score)))
    }

    /// Search parameters of the dense lane: the beam width, and int8 candidates re-scored with the
    /// float originals.
    pub(super) fn dense_params(&self, limit: usize) -> SearchParams {
        SearchParams {
            hnsw_ef: Some(self.tuning.ef_for(limit)),
            quantization: self.tuning.quantized.then_some(QuantizationSearchParams {
                ignore: false,
                rescore: Some(true),
                oversampling: Some(IndexTuning::OVERSAMPLING),
            }),
            ..SearchParams::default()
        }
    }
}
