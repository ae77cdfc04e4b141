//! Rerank: the answer-focused rerank of the fused window (`ragstream_core::query::rerank`); with
//! `trace`, the reranked candidates are recorded.

use std::sync::Arc;

use timely::dataflow::StreamVec;

use super::job::{ranked_step, Working};
use crate::store::Bm25Encoder;
use ragstream_core::query::rerank::rerank;
use ragstream_core::query::QueryConfig;

/// Extension trait: the `Rerank` operator.
pub trait Rerank<'scope> {
    /// Answer-focused rerank of the top window.
    fn rerank(self, config: Arc<QueryConfig>) -> StreamVec<'scope, u64, Working>;
}

impl<'scope> Rerank<'scope> for StreamVec<'scope, u64, Working> {
    fn rerank(self, config: Arc<QueryConfig>) -> StreamVec<'scope, u64, Working> {
        let bm25 = Bm25Encoder::default();
        ranked_step(self, "Rerank", move |working| {
            working.score_floor = match &working.job.plan {
                Some(plan) => rerank(&mut working.candidates, plan, &config.rerank, &bm25),
                None => working
                    .candidates
                    .iter()
                    .map(|c| c.score)
                    .fold(f32::INFINITY, f32::min),
            };
            working.trace_ranking();
        })
    }
}
