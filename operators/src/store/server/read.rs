//! The server backend's reads: the lanes' requests, a query's retrieval in one round trip
//! (`query_batch`: both lanes, their hits' payloads and vectors), the neighbour fetch filtered on
//! position in the request, and scrolls.

use qdrant_client::qdrant::vector_output::Vector as VectorOutputKind;
use qdrant_client::qdrant::{
    Condition, Filter, PointId, QuantizationSearchParamsBuilder, Query, QueryBatchPointsBuilder,
    QueryPointsBuilder, Range, ScoredPoint, ScrollPointsBuilder, SearchParamsBuilder, VectorInput,
    VectorsOutput, VectorsSelector,
};

use super::convert::{server_filter, store_error, stored_chunk};
use super::{ServerStore, SCROLL_PAGE};
use crate::model::DocKey;
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

    /// One lane's search request: payload always, the stored vectors when `with_vectors`.
    pub(super) fn lane_request(
        &self,
        vector: &SearchVector,
        filter: Option<Filter>,
        limit: usize,
        score_threshold: Option<f32>,
        with_vectors: bool,
    ) -> QueryPointsBuilder {
        let dense = matches!(vector, SearchVector::Dense(_));
        let (query, using) = match vector {
            SearchVector::Dense(dense) => (
                Query::new_nearest(self.tuning.distance.prepare(dense)),
                DENSE_VECTOR,
            ),
            SearchVector::Sparse(sparse) => (
                Query::new_nearest(VectorInput::new_sparse(
                    sparse.indices.clone(),
                    sparse.values.clone(),
                )),
                SPARSE_VECTOR,
            ),
        };
        let mut request = QueryPointsBuilder::new(&self.collection)
            .query(query)
            .using(using)
            .limit(limit as u64)
            .with_payload(true);
        request = if with_vectors {
            request.with_vectors(self.vector_selector())
        } else {
            request.with_vectors(false)
        };
        if dense {
            let mut params =
                SearchParamsBuilder::default().hnsw_ef(self.tuning.ef_for(limit) as u64);
            if self.tuning.quantized {
                params = params.quantization(
                    QuantizationSearchParamsBuilder::default()
                        .rescore(true)
                        .oversampling(IndexTuning::OVERSAMPLING),
                );
            }
            request = request.params(params);
        }
        if let Some(filter) = filter {
            request = request.filter(filter);
        }
        if let Some(threshold) = score_threshold {
            request = request.score_threshold(if dense {
                self.tuning.distance.engine_threshold(threshold)
            } else {
                threshold
            });
        }
        request
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

    /// Both lanes and their hits' vectors in one `query_batch` request.
    pub(super) fn lanes_in_one(
        &self,
        lanes: &LaneQuery,
        filter: &SearchFilter,
    ) -> Result<LaneHits, StoreError> {
        let filter = server_filter(filter, &self.declared())?;
        let mut requests = Vec::new();
        let mut order = Vec::new();
        if let Some(lane) = lanes.dense.as_ref().filter(|lane| lane.limit > 0) {
            let vector = SearchVector::Dense(lane.vector.clone());
            requests.push(
                self.lane_request(
                    &vector,
                    filter.clone(),
                    lane.limit,
                    lane.score_threshold,
                    true,
                )
                .build(),
            );
            order.push(true);
        }
        if let Some(lane) = lanes.bm25.as_ref().filter(|lane| lane.limit > 0) {
            let vector = SearchVector::Sparse(lane.vector.clone());
            requests.push(
                self.lane_request(
                    &vector,
                    filter.clone(),
                    lane.limit,
                    lane.score_threshold,
                    true,
                )
                .build(),
            );
            order.push(false);
        }
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
        hits.timings
            .push(("retrieve_batch", started.elapsed().as_secs_f64()));
        let mut seen = std::collections::HashSet::new();
        for (dense, batch) in order.into_iter().zip(response.result) {
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
        let document = SearchFilter {
            tenant: Some(key.tenant.clone()),
            doc_ids: vec![key.doc_id.clone()],
            ..SearchFilter::default()
        };
        let mut must = server_filter(&document, &self.declared())?
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
