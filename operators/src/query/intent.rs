//! Intent: analyses the query (`ragstream_core::query::intent`): its intent, fusion weights, lane
//! depths and pool, and the BM25 terms of retrieving modes.

use std::time::Instant;

use timely::dataflow::StreamVec;

use super::job::QueryJob;
use crate::metrics::metrics;
use crate::stage::map_stage;
use crate::store::Bm25Encoder;
use ragstream_core::query::intent::{analyze, IntentPresets};
use ragstream_core::query::Stage;

/// Extension trait: the `Intent` operator.
///
/// # Examples
///
/// A question about code leans on the BM25 lane (identifiers match exactly); a plain question leans on
/// the dense lane:
///
/// ```
/// use std::collections::BTreeMap;
/// use ragstream_core::query::decode::decode_query;
/// use ragstream_core::query::intent::IntentPresets;
/// use ragstream_operators::query::intent::Intent;
/// use ragstream_operators::query::job::{QueryJob, Reply};
/// use timely::dataflow::operators::capture::{Capture, Extract};
/// use timely::dataflow::operators::vec::{Map, ToStream};
///
/// let plans = timely::example(|scope| {
///     let jobs = [
///         r#"{"query_id": "q1", "tenant": "t", "text": "where is parse_config_file defined"}"#,
///         r#"{"query_id": "q2", "tenant": "t", "text": "why do tides rise and fall"}"#,
///     ]
///     .map(|body| {
///         let query = decode_query(body.as_bytes(), 8192).unwrap();
///         QueryJob::new(query, 0, 0, 0, Reply::Http(0), BTreeMap::new())
///     });
///     jobs.to_vec()
///         .to_stream(scope)
///         .intent(IntentPresets::default())
///         .map(|job| {
///             let plan = job.plan.expect("analysed");
///             (job.query.query_id, plan.weights.bm25 > plan.weights.dense)
///         })
///         .capture()
/// });
/// let plans = &plans.extract()[0].1;
/// assert_eq!(plans, &[("q1".to_string(), true), ("q2".to_string(), false)]);
/// ```
pub trait Intent<'scope> {
    /// Chooses the intent, weights and pool from the configured presets.
    fn intent(self, presets: IntentPresets) -> StreamVec<'scope, u64, QueryJob>;
}

impl<'scope> Intent<'scope> for StreamVec<'scope, u64, QueryJob> {
    fn intent(self, presets: IntentPresets) -> StreamVec<'scope, u64, QueryJob> {
        let bm25 = Bm25Encoder::default();
        map_stage(self, "Intent", move |mut job: QueryJob| {
            let started = Instant::now();
            let plan = analyze(&job.query.text, &bm25, &presets);
            if job.query.mode.retrieves() {
                job.vectors.sparse = bm25.encode_query(&job.query.text);
            }
            metrics()
                .queries_by_intent
                .with_label_values(&[plan.intent.as_str()])
                .inc();
            job.plan = Some(plan);
            job.record(Stage::Intent, started);
            job
        })
    }
}
