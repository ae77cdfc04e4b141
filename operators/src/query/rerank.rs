//! Rerank: the answer-focused rerank of the fused window (`ragstream_core::query::rerank`); with
//! `trace`, the reranked candidates are recorded.

use timely::dataflow::StreamVec;

use super::job::{ranked_step, Working};
use crate::store::Bm25Encoder;
use ragstream_core::query::depth::fills;
use ragstream_core::query::depth::results_for;
use ragstream_core::query::rerank::{rerank, RerankConfig};
use ragstream_core::query::Stage;

/// Extension trait: the `Rerank` operator.
///
/// # Examples
///
/// The rerank reads the window for the answer: a chunk that holds the query's words together goes
/// ahead of one the dense lane ranked first for its topic alone:
///
/// ```
/// use ragstream_operators::query::example::{documents, gathered, hit, job};
/// use timely::dataflow::operators::capture::{Capture, Extract};
/// use timely::dataflow::operators::vec::{Map, ToStream};
/// use ragstream_operators::query::fuse::Fuse;
/// use ragstream_operators::query::rerank::Rerank;
///
/// let reranked = timely::example(|scope| {
///     let query = job(r#"{"query_id": "q1", "tenant": "t", "text": "when was the eiffel tower completed"}"#);
///     let dense = vec![
///         hit("paris", "Paris has many famous towers and monuments.", 0.9, &[1.0, 0.0]),
///         hit("eiffel", "The Eiffel Tower was completed in 1889.", 0.8, &[0.9, 0.1]),
///     ];
///     vec![gathered(query, dense, Vec::new())]
///         .to_stream(scope)
///         .fuse()
///         .rerank()
///         .map(|working| documents(&working))
///         .capture()
/// });
/// assert_eq!(reranked.extract()[0].1, [vec!["eiffel", "paris"]]);
/// ```
pub trait Rerank<'scope> {
    /// Answer-focused rerank of the top window.
    fn rerank(self) -> StreamVec<'scope, u64, Working>;
}

impl<'scope> Rerank<'scope> for StreamVec<'scope, u64, Working> {
    fn rerank(self) -> StreamVec<'scope, u64, Working> {
        let bm25 = Bm25Encoder::default();
        ranked_step(self, "Rerank", Stage::Rerank, move |working| {
            let query = &working.job.query;
            let config = &working.settings;
            // A filled budget's results all go through the rerank: its window widens to them.
            let widened;
            let rerank_config = if fills(query) {
                let wanted = results_for(query, config, &working.candidates);
                widened = RerankConfig {
                    window: config.rerank.window.max(wanted),
                    ..config.rerank.clone()
                };
                &widened
            } else {
                &config.rerank
            };
            working.score_floor = match &working.job.plan {
                Some(plan) => rerank(&mut working.candidates, plan, rerank_config, &bm25),
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
