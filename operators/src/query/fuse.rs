//! Fuse: the lanes' evidence may first adapt the intent's weights (`ragstream_core::query::adapt`),
//! then weighted reciprocal-rank fusion (`ragstream_core::query::fuse`) joins the dense and BM25 lanes
//! with their stored vectors and sentence evidence.

use timely::dataflow::StreamVec;

use super::job::{ranked_step, Working};
use crate::metrics::{metrics, Lane};
use ragstream_core::query::adapt::adapt;
use ragstream_core::query::fuse::{attach_evidence, attach_vectors, fuse};
use ragstream_core::query::{Action, Cause, Decision, Stage};

/// Extension trait: the `Fuse` operator.
///
/// # Examples
///
/// A chunk both lanes found goes ahead of chunks only one lane found:
///
/// ```
/// use ragstream_operators::query::example::{documents, gathered, hit, job};
/// use timely::dataflow::operators::capture::{Capture, Extract};
/// use timely::dataflow::operators::vec::{Map, ToStream};
/// use ragstream_operators::query::fuse::Fuse;
///
/// let ranked = timely::example(|scope| {
///     let query = job(r#"{"query_id": "q1", "tenant": "t", "text": "tide pools"}"#);
///     let dense = vec![
///         hit("a", "rock pools at low tide", 0.9, &[1.0, 0.0]),
///         hit("b", "tide pools and what lives in them", 0.8, &[0.9, 0.1]),
///     ];
///     let bm25 = vec![
///         hit("b", "tide pools and what lives in them", 7.0, &[0.9, 0.1]),
///         hit("c", "pools of sea water", 5.0, &[0.5, 0.5]),
///     ];
///     vec![gathered(query, dense, bm25)]
///         .to_stream(scope)
///         .fuse()
///         .map(|working| documents(&working))
///         .capture()
/// });
/// assert_eq!(ranked.extract()[0].1, [vec!["b", "a", "c"]]);
/// ```
pub trait Fuse<'scope> {
    /// Weighted reciprocal-rank fusion of the gathered lanes.
    fn fuse(self) -> StreamVec<'scope, u64, Working>;
}

impl<'scope> Fuse<'scope> for StreamVec<'scope, u64, Working> {
    fn fuse(self) -> StreamVec<'scope, u64, Working> {
        ranked_step(self, "Fuse", Stage::Fuse, move |working| {
            let config = &working.settings;
            if let Some(plan) = working.job.plan.as_mut().filter(|_| config.adapt_fusion) {
                if let Some(reason) = adapt(plan, &working.answer.dense, &config.code_search) {
                    metrics()
                        .fusion_adapted
                        .with_label_values(&[plan.intent.as_str()])
                        .inc();
                    working.trace.decisions.push(Decision::new(
                        "",
                        Action::Adapted,
                        Cause::EvidenceRule,
                        reason,
                    ));
                }
            }
            let weights = working
                .job
                .plan
                .as_ref()
                .map(|p| p.weights)
                .unwrap_or_default();
            // The weights fusion uses, after any adaptation (the intent's preset where none).
            metrics().observe_fusion_weight(Lane::Dense, weights.dense);
            metrics().observe_fusion_weight(Lane::Bm25, weights.bm25);
            let (mut candidates, decisions) = fuse(
                std::mem::take(&mut working.answer.dense),
                std::mem::take(&mut working.answer.bm25),
                weights,
                config.rrf_k,
            );
            attach_vectors(&mut candidates, std::mem::take(&mut working.answer.vectors));
            attach_evidence(
                &mut candidates,
                std::mem::take(&mut working.answer.evidence),
            );
            working.available = candidates.len();
            working.candidates = candidates;
            working.trace.decisions.extend(decisions);
        })
    }
}
