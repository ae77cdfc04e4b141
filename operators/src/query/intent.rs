//! Intent: analyses the query (`ragstream_core::query::intent`): its intent, fusion weights, lane
//! depths and pool, and the BM25 terms of retrieving modes.

use std::time::Instant;

use timely::dataflow::StreamVec;

use super::job::QueryJob;
use crate::metrics::metrics;
use crate::stage::map_stage;
use crate::store::Bm25Encoder;
use ragstream_core::query::intent::{analyze, IntentPresets};

/// Extension trait: the `Intent` operator.
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
            job.record("intent", started);
            job
        })
    }
}
