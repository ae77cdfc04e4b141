//! The server backend's reads: the lanes' requests, a query's retrieval in one round trip
//! (`query_batch`: both lanes, their hits' payloads and vectors), the neighbour fetch filtered on
//! position in the request, and scrolls.

use qdrant_client::qdrant::vector_output::Vector as VectorOutputKind;
use qdrant_client::qdrant::{
    Condition, Filter, PointId, PrefetchQueryBuilder, QuantizationSearchParamsBuilder, Query,
    QueryBatchPointsBuilder, QueryPointsBuilder, Range, ScoredPoint, ScrollPointsBuilder,
    SearchParams, SearchParamsBuilder, VectorInput, VectorsOutput, VectorsSelector,
};

use super::convert::{server_filter, store_error, stored_chunk, uuid_of};
use super::{ServerStore, SCROLL_PAGE};
use crate::model::DocKey;
use crate::store::lanes::document_filter;
use crate::store::{
    Hit, IndexTuning, LaneHits, LaneQuery, SearchFilter, SearchVector, StoreError, StoredChunk,
    StoredVectors, DENSE_VECTOR, EVIDENCE_VECTOR, SPARSE_VECTOR,
};

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

impl ServerStore {
    /// The stored vectors a query reads: the dense one and, where the collection has them, the
    /// evidence units.
    pub(super) fn vector_selector(&self) -> VectorsSelector {
        let mut names = vec![DENSE_VECTOR.to_string()];
        if self.evidence.load(std::sync::atomic::Ordering::Relaxed) {
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

    /// One lane's search request: payload always, the dense vector when `with_vectors`.
    pub(super) fn lane_request(
        &self,
        vector: &SearchVector,
        filter: Option<Filter>,
        limit: usize,
        score_threshold: Option<f32>,
        with_vectors: bool,
    ) -> QueryPointsBuilder {
        let (query, using, params, threshold) = self.lane_parts(vector, limit, score_threshold);
        let mut request = QueryPointsBuilder::new(&self.collection)
            .query(query)
            .using(using)
            .limit(limit as u64)
            .with_payload(true);
        request = if with_vectors {
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
    pub(super) fn hit(&self, point: &ScoredPoint, dense: bool) -> Option<Hit> {
        let stored = stored_chunk(point.id.as_ref(), &point.payload)?;
        Some(Hit {
            stored,
            score: if dense {
                self.tuning.distance.to_cosine(point.score)
            } else {
                point.score
            },
        })
    }

    /// Both lanes, their hits' dense vectors and sentence evidence in one `query_batch` request:
    /// a request per lane, and one that searches both lanes again as prefetches and scores their
    /// hits against the evidence units (the engine's MaxSim of the one query vector: its highest
    /// cosine to a unit), so the units themselves never leave the server.
    pub(super) fn lanes_in_one(
        &self,
        lanes: &LaneQuery,
        filter: &SearchFilter,
    ) -> Result<LaneHits, StoreError> {
        let filter = server_filter(filter, &self.declared())?;
        let mut requests = Vec::new();
        let mut kinds = Vec::new();
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
                self.lane_request(&vector, filter.clone(), limit, threshold, true)
                    .build(),
            );
            prefetches.push(self.lane_prefetch(&vector, filter.clone(), limit, threshold));
            depth += limit as u64;
            kinds.push(Some(matches!(vector, SearchVector::Dense(_))));
        }
        let mut hits = LaneHits::default();
        if requests.is_empty() {
            return Ok(hits);
        }
        let query_vector = lanes.dense.as_ref().map(|lane| &lane.vector);
        let evidence = self.evidence.load(std::sync::atomic::Ordering::Relaxed);
        if let (Some(query_vector), true) = (query_vector, evidence) {
            let mut request = QueryPointsBuilder::new(&self.collection)
                .query(Query::new_nearest(VectorInput::new_multi(vec![
                    query_vector.clone(),
                ])))
                .using(EVIDENCE_VECTOR)
                .limit(depth)
                .with_payload(false)
                .with_vectors(false);
            for prefetch in prefetches {
                request = request.add_prefetch(prefetch);
            }
            requests.push(request.build());
            kinds.push(None);
            hits.evidence = Some(Vec::new());
        }
        let started = std::time::Instant::now();
        let response = self
            .runtime
            .block_on(
                self.client
                    .query_batch(QueryBatchPointsBuilder::new(&self.collection, requests)),
            )
            .map_err(store_error)?;
        hits.timings
            .push(("retrieve_batch", started.elapsed().as_secs_f64()));
        let mut seen = std::collections::HashSet::new();
        for (kind, batch) in kinds.into_iter().zip(response.result) {
            let Some(dense) = kind else {
                let scores = hits.evidence.get_or_insert_with(Vec::new);
                scores.extend(
                    batch
                        .result
                        .iter()
                        .filter_map(|point| Some((uuid_of(point.id.as_ref())?, point.score))),
                );
                continue;
            };
            for point in batch.result {
                let Some(hit) = self.hit(&point, dense) else {
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
        hits.vectors.sort_by_key(|(id, _)| *id);
        if let Some(pool) = lanes.pool {
            hits.cut_to_pool(pool);
        }
        Ok(hits)
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
            for point in &page.result {
                if let Some(stored) = stored_chunk(point.id.as_ref(), &point.payload) {
                    visit(stored);
                }
            }
            match page.next_page_offset {
                Some(next) => offset = Some(next),
                None => return Ok(()),
            }
        }
    }
}
