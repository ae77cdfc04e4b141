//! RerankEndpoint: reorders the head of the built-in rerank by a reranker endpoint's scores (TEI,
//! Cohere/Jina or a chat model), off the worker through [`remote`](super::remote); when the endpoint
//! is out the built-in order is kept and the context says so.

use std::sync::Arc;
use std::time::{Duration, Instant};

use timely::dataflow::StreamVec;

use super::job::Working;
use super::remote::{outcome, remote, EndpointCall};
use ragstream_core::query::endpoints::{apply_scores, RerankKind, Reranker};
use ragstream_core::query::{Action, Cause, Decision, Mode};

/// Extension trait: the `RerankEndpoint` operator.
pub trait RerankEndpoint<'scope> {
    /// Reorders the head of the built-in rerank by the endpoint's scores.
    fn rerank_endpoint(
        self,
        reranker: Arc<dyn Reranker>,
        window: usize,
        threads: usize,
        timeout: Duration,
    ) -> StreamVec<'scope, u64, Working>;
}

impl<'scope> RerankEndpoint<'scope> for StreamVec<'scope, u64, Working> {
    fn rerank_endpoint(
        self,
        reranker: Arc<dyn Reranker>,
        window: usize,
        threads: usize,
        timeout: Duration,
    ) -> StreamVec<'scope, u64, Working> {
        let kind: RerankKind = reranker.kind();
        let label = match kind {
            RerankKind::Llm => "rerank_llm",
            RerankKind::Cohere => "rerank_cohere",
            _ => "rerank_http",
        };
        remote(
            self,
            "RerankEndpoint",
            threads,
            timeout,
            move |working: &mut Working| {
                let ranked = working.answer.error.is_none()
                    && matches!(working.job.query.mode, Mode::Bounded | Mode::Deep)
                    && working.candidates.len() > 1;
                if !ranked {
                    return None;
                }
                let texts: Vec<String> = working
                    .candidates
                    .iter()
                    .take(window)
                    .map(|c| c.stored.chunk.text.clone())
                    .collect();
                let query = working.job.query.text.clone();
                let reranker = reranker.clone();
                Some(Box::new(move || reranker.score(&query, &texts)) as EndpointCall<Vec<f32>>)
            },
            move |working: &mut Working, result: Result<Vec<f32>, String>, took| {
                working.job.record("rerank_endpoint", Instant::now() - took);
                match result {
                    Ok(scores) => {
                        outcome(label, "ok", took);
                        apply_scores(&mut working.candidates, window, &scores);
                        working.trace_ranking();
                    }
                    Err(error) => {
                        outcome(label, "fallback", took);
                        working.job.degraded = true;
                        working.trace.decisions.push(Decision::new(
                            "",
                            Action::Adapted,
                            Cause::EndpointFallback,
                            format!("rerank endpoint ({}) unavailable: {error}", kind.as_str()),
                        ));
                        working.job.notes.push(format!(
                            "rerank endpoint ({}) unavailable ({error}): the built-in rerank order was kept",
                            kind.as_str()
                        ));
                    }
                }
            },
        )
    }
}
