//! RerankEndpoint: reorders the head of the built-in rerank by a reranker endpoint's scores (TEI,
//! Cohere/Jina or a chat model), off the worker through [`remote`](super::remote); when the endpoint
//! is out the built-in order is kept and the context says so.

use std::sync::Arc;
use std::time::{Duration, Instant};

use timely::dataflow::StreamVec;

use super::job::Working;
use super::remote::{outcome, remote, EndpointCall};
use crate::metrics::{Endpoint, EndpointOutcome};
use ragstream_core::query::endpoints::{apply_scores, EndpointError, RerankKind, Reranker};
use ragstream_core::query::{Action, Cause, Decision, Mode, Stage};

/// Extension trait: the `RerankEndpoint` operator.
///
/// # Examples
///
/// An endpoint that grades the passages about crabs highest puts them first; when the endpoint is
/// out, the built-in order stays and the context says so:
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use ragstream_core::query::endpoints::{EndpointError, RerankKind, Reranker};
/// use ragstream_operators::query::example::{documents, gathered, hit, job};
/// use ragstream_operators::query::fuse::Fuse;
/// use ragstream_operators::query::rerank_endpoint::RerankEndpoint;
/// use timely::dataflow::operators::capture::{Capture, Extract};
/// use timely::dataflow::operators::vec::{Map, ToStream};
///
/// /// Grades a passage 1 when it names crabs, else 0; or is out.
/// struct Crabs(bool);
///
/// impl Reranker for Crabs {
///     fn kind(&self) -> RerankKind {
///         RerankKind::Http
///     }
///     fn score(&self, _query: &str, texts: &[String]) -> Result<Vec<f32>, EndpointError> {
///         if !self.0 {
///             return Err(EndpointError::Unreachable {
///                 path: "/rerank".into(),
///                 message: "connection refused".into(),
///             });
///         }
///         Ok(texts.iter().map(|t| f32::from(u8::from(t.contains("crab")))).collect())
///     }
/// }
///
/// let reranked = |up: bool| {
///     timely::example(move |scope| {
///         let dense = vec![
///             hit("a", "Tide pools hold sea water at low tide.", 0.9, &[1.0, 0.0]),
///             hit("b", "Shore crabs hide in tide pools.", 0.8, &[0.0, 1.0]),
///         ];
///         let query = job(r#"{"query_id": "q1", "tenant": "t", "text": "tide pools"}"#);
///         vec![gathered(query, dense, Vec::new())]
///             .to_stream(scope)
///             .fuse()
///             .rerank_endpoint(Arc::new(Crabs(up)), 10, 1, Duration::from_secs(5))
///             .map(|working| (documents(&working), working.job.degraded))
///             .capture()
///     })
///     .extract()
///     .remove(0)
///     .1
///     .remove(0)
/// };
/// assert_eq!(reranked(true), (vec!["b".to_string(), "a".to_string()], false));
/// assert_eq!(reranked(false), (vec!["a".to_string(), "b".to_string()], true));
/// ```
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
        let endpoint = Endpoint::of_rerank(kind);
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
            move |working: &mut Working, result: Result<Vec<f32>, EndpointError>, took| {
                working
                    .job
                    .record(Stage::RerankEndpoint, Instant::now() - took);
                match result {
                    Ok(scores) => {
                        outcome(endpoint, EndpointOutcome::Ok, took);
                        apply_scores(&mut working.candidates, window, &scores);
                        working.trace_ranking();
                    }
                    Err(error) => {
                        outcome(endpoint, EndpointOutcome::Fallback, took);
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
