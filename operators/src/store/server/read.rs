//! The server backend's reads: the lanes' requests, a query's retrieval in one round trip
//! (`query_batch`: both lanes, their hits' payloads and vectors), the neighbour fetch filtered on
//! position in the request, and scrolls.

use qdrant_client::qdrant::vector_output::Vector as VectorOutputKind;
use qdrant_client::qdrant::{
    Condition, Filter, PointId, PrefetchQueryBuilder, QuantizationSearchParamsBuilder, Query,
    QueryBatchPointsBuilder, QueryPointsBuilder, Range, ScoredPoint, ScrollPointsBuilder,
    SearchParams, SearchParamsBuilder, VectorInput, VectorsOutput, VectorsSelector,
};

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use qdrant_client::qdrant::value::Kind;
use qdrant_client::qdrant::{GetPointsBuilder, Value};

use super::convert::{point_id, server_filter, store_error, stored_chunk, uuid_of};
use super::{ServerStore, SCROLL_PAGE, UNITS_FIELD};
use crate::model::DocKey;
use crate::store::lanes::document_filter;
use crate::store::{
    Hit, IndexTuning, LaneHits, LaneQuery, SearchFilter, SearchVector, StoreError, StoredChunk,
    StoredVectors, DENSE_VECTOR, EVIDENCE_VECTOR, SPARSE_VECTOR,
};
use ragstream_core::query::Stage;

/// The vectors of a point as the server returned them; `None` without a dense vector.
pub(super) fn stored_vectors(vectors: VectorsOutput) -> Option<StoredVectors> {
    let VectorOutputKind::Dense(dense) = vectors.get_vector_by_name(DENSE_VECTOR)? else {
        return None;
    };
    let evidence = match vectors.get_vector_by_name(EVIDENCE_VECTOR) {
        Some(VectorOutputKind::MultiDense(multi)) => {
            multi.vectors.into_iter().map(|v| v.data).collect()
        }
        _ => Vec::new(),
    };
    Some(StoredVectors {
        dense: dense.data,
        evidence,
    })
}

/// The points an evidence request returned, by id: each one's chunk (until a hit takes it) and
/// dense vector.
type Chunks = HashMap<uuid::Uuid, (Option<StoredChunk>, Vec<f32>)>;

/// What a lane's request returns of each hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Returns {
    /// Ids and scores.
    Scores,
    /// The payload too.
    Payload,
    /// The payload and the dense vector.
    PayloadAndDense,
}

/// The [`UNITS_FIELD`] of a point's payload: its number of evidence units, `None` where the point
/// was written without it.
pub(super) fn unit_count(payload: &HashMap<String, Value>) -> Option<i64> {
    match payload.get(UNITS_FIELD)?.kind.as_ref()? {
        Kind::IntegerValue(count) => Some(*count),
        Kind::DoubleValue(count) => Some(*count as i64),
        _ => None,
    }
}

impl ServerStore {
    /// The stored vectors a query reads: the dense one and, where the collection has them, the
    /// evidence units.
    pub(super) fn vector_selector(&self) -> VectorsSelector {
        let mut names = vec![DENSE_VECTOR.to_string()];
        if self.evidence.load(Ordering::Relaxed) {
            names.push(EVIDENCE_VECTOR.to_string());
        }
        VectorsSelector::new(names)
    }

    /// One lane's search: its query, vector name, search parameters and engine threshold.
    fn lane_parts(
        &self,
        vector: &SearchVector,
        limit: usize,
        score_threshold: Option<f32>,
    ) -> (Query, &'static str, Option<SearchParams>, Option<f32>) {
        match vector {
            SearchVector::Dense(dense) => {
                let mut params =
                    SearchParamsBuilder::default().hnsw_ef(self.tuning.ef_for(limit) as u64);
                if self.tuning.quantized {
                    params = params.quantization(
                        QuantizationSearchParamsBuilder::default()
                            .rescore(true)
                            .oversampling(IndexTuning::OVERSAMPLING),
                    );
                }
                (
                    Query::new_nearest(self.tuning.distance.prepare(dense)),
                    DENSE_VECTOR,
                    Some(params.build()),
                    score_threshold.map(|t| self.tuning.distance.engine_threshold(t)),
                )
            }
            SearchVector::Sparse(sparse) => (
                Query::new_nearest(VectorInput::new_sparse(
                    sparse.indices.clone(),
                    sparse.values.clone(),
                )),
                SPARSE_VECTOR,
                None,
                score_threshold,
            ),
        }
    }

    /// One lane's search request, returning `returns` of its hits.
    pub(super) fn lane_request(
        &self,
        vector: &SearchVector,
        filter: Option<Filter>,
        limit: usize,
        score_threshold: Option<f32>,
        returns: Returns,
    ) -> QueryPointsBuilder {
        let (query, using, params, threshold) = self.lane_parts(vector, limit, score_threshold);
        let mut request = QueryPointsBuilder::new(&self.collection)
            .query(query)
            .using(using)
            .limit(limit as u64)
            .with_payload(returns != Returns::Scores);
        request = if returns == Returns::PayloadAndDense {
            request.with_vectors(VectorsSelector::new(vec![DENSE_VECTOR.to_string()]))
        } else {
            request.with_vectors(false)
        };
        if let Some(params) = params {
            request = request.params(params);
        }
        if let Some(filter) = filter {
            request = request.filter(filter);
        }
        if let Some(threshold) = threshold {
            request = request.score_threshold(threshold);
        }
        request
    }

    /// The same lane as a prefetch of another request.
    fn lane_prefetch(
        &self,
        vector: &SearchVector,
        filter: Option<Filter>,
        limit: usize,
        score_threshold: Option<f32>,
    ) -> PrefetchQueryBuilder {
        let (query, using, params, threshold) = self.lane_parts(vector, limit, score_threshold);
        let mut prefetch = PrefetchQueryBuilder::default()
            .query(query)
            .using(using)
            .limit(limit as u64);
        if let Some(params) = params {
            prefetch = prefetch.params(params);
        }
        if let Some(filter) = filter {
            prefetch = prefetch.filter(filter);
        }
        if let Some(threshold) = threshold {
            prefetch = prefetch.score_threshold(threshold);
        }
        prefetch
    }

    /// A scored point as a hit (a dense score as a cosine); `None` for a point that is not a chunk.
    pub(super) fn hit(&self, point: &mut ScoredPoint, dense: bool) -> Option<Hit> {
        let stored = stored_chunk(point.id.as_ref(), std::mem::take(&mut point.payload))?;
        Some(Hit {
            stored,
            score: if dense {
                self.tuning.distance.to_cosine(point.score)
            } else {
                point.score
            },
        })
    }

    /// Both lanes, their hits' chunks, dense vectors and sentence evidence in one `query_batch`
    /// request. With evidence units in the collection and a dense query: a request per lane
    /// returning ids and scores, and one that searches both lanes again as prefetches, scores
    /// their hits against the evidence units (the engine's MaxSim of the one query vector: its
    /// highest cosine to a unit) and returns each hit's payload and dense vector once, so the units
    /// never leave the server and no payload is sent twice. A point written before every point held
    /// a multi-vector is not in that request's answer; such points are read in one more request.
    /// Without evidence: the lanes returning their hits' payloads and dense vectors.
    pub(super) fn lanes_in_one(
        &self,
        lanes: &LaneQuery,
        filter: &SearchFilter,
    ) -> Result<LaneHits, StoreError> {
        let filter = server_filter(filter, &self.declared())?;
        let evidence_query = lanes
            .dense
            .as_ref()
            .map(|lane| &lane.vector)
            .filter(|_| self.evidence.load(Ordering::Relaxed));
        let (requests, dense_lanes) = self.batch_requests(lanes, filter, evidence_query);
        let mut hits = LaneHits::default();
        if requests.is_empty() {
            return Ok(hits);
        }
        let started = std::time::Instant::now();
        let response = self
            .runtime
            .block_on(
                self.client
                    .query_batch(QueryBatchPointsBuilder::new(&self.collection, requests)),
            )
            .map_err(store_error)?;
        tracing::debug!(
            server_ms = response.time * 1e3,
            took_ms = started.elapsed().as_secs_f64() * 1e3,
            "query batch"
        );
        let batches: Vec<Vec<ScoredPoint>> = response
            .result
            .into_iter()
            .map(|batch| batch.result)
            .collect();
        hits.timings
            .push((Stage::RetrieveBatch, started.elapsed().as_secs_f64()));
        match evidence_query {
            None => self.plain_hits(batches, dense_lanes, &mut hits),
            Some(_) => self.evidence_hits(batches, dense_lanes, &mut hits)?,
        }
        hits.vectors.sort_by_key(|(id, _)| *id);
        if let Some(pool) = lanes.pool {
            hits.cut_to_pool(pool);
        }
        Ok(hits)
    }

    /// The requests of [`Self::lanes_in_one`]: one per lane with a depth (ids and scores with
    /// `evidence_query`, else payloads and dense vectors), each lane's flag of being the dense one,
    /// and with `evidence_query` the request that scores both lanes' hits against the evidence
    /// units and returns their payloads and dense vectors once.
    fn batch_requests(
        &self,
        lanes: &LaneQuery,
        filter: Option<Filter>,
        evidence_query: Option<&Vec<f32>>,
    ) -> (Vec<qdrant_client::qdrant::QueryPoints>, Vec<bool>) {
        let lane_returns = match evidence_query {
            Some(_) => Returns::Scores,
            None => Returns::PayloadAndDense,
        };
        let mut requests = Vec::new();
        let mut dense_lanes = Vec::new();
        let mut prefetches = Vec::new();
        let mut depth = 0u64;
        let searches = [
            lanes
                .dense
                .as_ref()
                .filter(|lane| lane.limit > 0)
                .map(|lane| {
                    (
                        SearchVector::Dense(lane.vector.clone()),
                        lane.limit,
                        lane.score_threshold,
                    )
                }),
            lanes
                .bm25
                .as_ref()
                .filter(|lane| lane.limit > 0)
                .map(|lane| {
                    (
                        SearchVector::Sparse(lane.vector.clone()),
                        lane.limit,
                        lane.score_threshold,
                    )
                }),
        ];
        for (vector, limit, threshold) in searches.into_iter().flatten() {
            requests.push(
                self.lane_request(&vector, filter.clone(), limit, threshold, lane_returns)
                    .build(),
            );
            prefetches.push(self.lane_prefetch(&vector, filter.clone(), limit, threshold));
            depth += limit as u64;
            dense_lanes.push(matches!(vector, SearchVector::Dense(_)));
        }
        if let (Some(query_vector), false) = (evidence_query, requests.is_empty()) {
            let mut request = QueryPointsBuilder::new(&self.collection)
                .query(Query::new_nearest(VectorInput::new_multi(vec![
                    query_vector.clone(),
                ])))
                .using(EVIDENCE_VECTOR)
                .limit(depth)
                .with_payload(true)
                .with_vectors(VectorsSelector::new(vec![DENSE_VECTOR.to_string()]));
            for prefetch in prefetches {
                request = request.add_prefetch(prefetch);
            }
            requests.push(request.build());
        }
        (requests, dense_lanes)
    }

    /// The lanes' hits from requests that returned their payloads and dense vectors (no evidence).
    fn plain_hits(
        &self,
        batches: Vec<Vec<ScoredPoint>>,
        dense_lanes: Vec<bool>,
        hits: &mut LaneHits,
    ) {
        let mut seen = std::collections::HashSet::new();
        for (dense, batch) in dense_lanes.into_iter().zip(batches) {
            for mut point in batch {
                let Some(hit) = self.hit(&mut point, dense) else {
                    continue;
                };
                if seen.insert(hit.stored.id) {
                    if let Some(vectors) = point.vectors.and_then(stored_vectors) {
                        hits.vectors.push((hit.stored.id, vectors));
                    }
                }
                if dense {
                    hits.dense.push(hit);
                } else {
                    hits.bm25.push(hit);
                }
            }
        }
    }

    /// The lanes' hits from their ids and scores and the evidence request's payloads, dense
    /// vectors and evidence scores (the last batch); points it did not return are read.
    fn evidence_hits(
        &self,
        mut batches: Vec<Vec<ScoredPoint>>,
        dense_lanes: Vec<bool>,
        hits: &mut LaneHits,
    ) -> Result<(), StoreError> {
        let scored = batches.pop().unwrap_or_default();
        let mut chunks: Chunks = HashMap::new();
        let mut scores = Vec::new();
        for point in scored {
            self.take_point(point, &mut chunks, Some(&mut scores));
        }
        let lanes: Vec<(bool, Vec<(uuid::Uuid, f32)>)> = dense_lanes
            .into_iter()
            .zip(batches)
            .map(|(dense, batch)| {
                let points = batch
                    .iter()
                    .filter_map(|point| {
                        let score = if dense {
                            self.tuning.distance.to_cosine(point.score)
                        } else {
                            point.score
                        };
                        Some((uuid_of(point.id.as_ref())?, score))
                    })
                    .collect();
                (dense, points)
            })
            .collect();
        self.read_missing(&lanes, &mut chunks, hits)?;
        let mut uses: HashMap<uuid::Uuid, usize> = HashMap::new();
        for (id, _) in lanes.iter().flat_map(|(_, points)| points) {
            *uses.entry(*id).or_default() += 1;
        }
        for (dense, points) in lanes {
            for (id, score) in points {
                // Gone between the requests: deleted meanwhile.
                let (Some((stored, _)), Some(left)) = (chunks.get_mut(&id), uses.get_mut(&id))
                else {
                    continue;
                };
                // A chunk in both lanes is copied into its first hit and moved into its last.
                *left = left.saturating_sub(1);
                let stored = if *left == 0 {
                    stored.take()
                } else {
                    stored.clone()
                };
                let Some(stored) = stored else {
                    continue;
                };
                let hit = Hit { stored, score };
                if dense {
                    hits.dense.push(hit);
                } else {
                    hits.bm25.push(hit);
                }
            }
        }
        let kept: std::collections::HashSet<uuid::Uuid> = hits
            .dense
            .iter()
            .chain(&hits.bm25)
            .map(|hit| hit.stored.id)
            .collect();
        hits.vectors = chunks
            .into_iter()
            .filter(|(id, _)| kept.contains(id))
            .map(|(id, (_, dense))| {
                (
                    id,
                    StoredVectors {
                        dense,
                        evidence: Vec::new(),
                    },
                )
            })
            .collect();
        scores.retain(|(id, _)| kept.contains(id));
        hits.evidence = Some(scores);
        Ok(())
    }

    /// Reads, in one more request, the lanes' points the evidence request did not return (points
    /// written before every point held a multi-vector) into `chunks`.
    fn read_missing(
        &self,
        lanes: &[(bool, Vec<(uuid::Uuid, f32)>)],
        chunks: &mut Chunks,
        hits: &mut LaneHits,
    ) -> Result<(), StoreError> {
        let missing: std::collections::BTreeSet<uuid::Uuid> = lanes
            .iter()
            .flat_map(|(_, points)| points)
            .map(|(id, _)| *id)
            .filter(|id| !chunks.contains_key(id))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let missing: Vec<PointId> = missing.into_iter().map(point_id).collect();
        let started = std::time::Instant::now();
        let request = GetPointsBuilder::new(&self.collection, missing)
            .with_payload(true)
            .with_vectors(VectorsSelector::new(vec![DENSE_VECTOR.to_string()]));
        let found = self
            .runtime
            .block_on(self.client.get_points(request))
            .map_err(store_error)?
            .result;
        hits.timings
            .push((Stage::RetrievePoints, started.elapsed().as_secs_f64()));
        for point in found {
            let point = ScoredPoint {
                id: point.id,
                payload: point.payload,
                vectors: point.vectors,
                ..ScoredPoint::default()
            };
            self.take_point(point, chunks, None);
        }
        Ok(())
    }

    /// Keeps a returned point's chunk and dense vector in `chunks` and, with `scores`, its
    /// evidence score where it has units of its own.
    fn take_point(
        &self,
        point: ScoredPoint,
        chunks: &mut Chunks,
        scores: Option<&mut Vec<(uuid::Uuid, f32)>>,
    ) {
        let own_units = unit_count(&point.payload) != Some(0);
        let Some(stored) = stored_chunk(point.id.as_ref(), point.payload) else {
            return;
        };
        let Some(vectors) = point.vectors.and_then(stored_vectors) else {
            return;
        };
        if let Some(scores) = scores {
            if own_units {
                scores.push((stored.id, point.score));
            }
        }
        chunks.insert(stored.id, (Some(stored), vectors.dense));
    }

    /// The chunks of `key`'s document within `radius` positions of `order`: one scroll whose filter
    /// holds the position range.
    pub(super) fn neighbours_in_one(
        &self,
        key: &DocKey,
        order: u32,
        radius: u32,
    ) -> Result<Vec<StoredChunk>, StoreError> {
        let mut must = server_filter(&document_filter(key), &self.declared())?
            .map(|filter| filter.must)
            .unwrap_or_default();
        must.push(Condition::range(
            "order_index",
            Range {
                gte: Some(f64::from(order.saturating_sub(radius))),
                lte: Some(f64::from(order.saturating_add(radius))),
                ..Range::default()
            },
        ));
        let mut out = Vec::new();
        self.scroll_where(Some(Filter::must(must)), &mut |stored| out.push(stored))?;
        Ok(out)
    }

    /// Visits every chunk matching `filter`, payload only, in id order, a page per request.
    pub(super) fn scroll_where(
        &self,
        filter: Option<Filter>,
        visit: &mut dyn FnMut(StoredChunk),
    ) -> Result<(), StoreError> {
        let mut offset: Option<PointId> = None;
        loop {
            // No `order_by`: the server's scroll is in id order, and only then paginates by offset.
            let mut request = ScrollPointsBuilder::new(&self.collection)
                .limit(SCROLL_PAGE)
                .with_payload(true)
                .with_vectors(false);
            if let Some(filter) = &filter {
                request = request.filter(filter.clone());
            }
            if let Some(offset) = offset.take() {
                request = request.offset(offset);
            }
            let page = self
                .runtime
                .block_on(self.client.scroll(request))
                .map_err(store_error)?;
            let next = page.next_page_offset;
            for point in page.result {
                if let Some(stored) = stored_chunk(point.id.as_ref(), point.payload) {
                    visit(stored);
                }
            }
            match next {
                Some(next) => offset = Some(next),
                None => return Ok(()),
            }
        }
    }
}
