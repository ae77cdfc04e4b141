//! Searches of a shard: one lane (dense or BM25) under a filter, the dense lane with the tuning's beam
//! and int8 re-scoring, or in the other ways `bench volume` compares it with.

use qdrant_edge::{
    NamedQuery, QuantizationSearchParams, QueryEnum, QueryRequest, ScoringQuery, SearchParams,
    VectorInternal, WithPayloadInterface, WithVector,
};

use super::error::engine_error;
use super::filter::engine_filter;
use super::ids::uuid_of;
use super::EdgeStore;
use crate::store::{
    chunk_from_payload, Hit, IndexTuning, SearchFilter, SearchVector, StoreError, DENSE_VECTOR,
    SPARSE_VECTOR,
};

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
        let request = QueryRequest {
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
        };
        let points = self.shard.query(request).map_err(engine_error)?;
        Ok(points
            .into_iter()
            .filter_map(|point| {
                let id = uuid_of(&point.id)?;
                let stored = chunk_from_payload(id, &point.payload.as_ref()?.0)?;
                Some(Hit {
                    stored,
                    score: if dense {
                        distance.to_cosine(point.score)
                    } else {
                        point.score
                    },
                })
            })
            .collect())
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
