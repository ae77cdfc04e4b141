//! CacheLookup: answers a query from the cache when a context for it was computed at the current
//! index state (the process's writes and the group's commits). A hit leaves the flow here, as its
//! context, and joins it again at Publish (through Cite); only misses go on to Intent.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use timely::dataflow::operators::OkErr;
use timely::dataflow::StreamVec;

use super::job::{QueryJob, Reply};
use crate::metrics::metrics;
use crate::stage::map_stage;
use ragstream_core::progress::IngestProgress;
use ragstream_core::query::cache::LruTtl;
use ragstream_core::query::{Context, Query};

pub(crate) fn cache_key(query: &Query) -> String {
    let mut key = query.clone();
    key.query_id.clear();
    serde_json::to_string(&key).expect("queries serialise")
}

/// The misses to answer and the hits' contexts to publish.
pub type Looked<'scope> = (
    StreamVec<'scope, u64, QueryJob>,
    StreamVec<'scope, u64, (Context, Reply)>,
);

/// Extension trait: the `CacheLookup` operator.
pub trait CacheLookup<'scope> {
    /// Answers a query from the cache when a context for it was computed at the current index
    /// state: `(misses, hits)`, the misses to answer and the hits' contexts to publish.
    fn cache_lookup(
        self,
        cache: Arc<Mutex<LruTtl<String, Context>>>,
        progress: Arc<IngestProgress>,
    ) -> Looked<'scope>;
}

impl<'scope> CacheLookup<'scope> for StreamVec<'scope, u64, QueryJob> {
    // The `Err` side is a hit's context travelling as data, not an error path.
    #[allow(clippy::result_large_err)]
    fn cache_lookup(
        self,
        cache: Arc<Mutex<LruTtl<String, Context>>>,
        progress: Arc<IngestProgress>,
    ) -> Looked<'scope> {
        let looked_up = map_stage(self, "CacheLookup", move |mut job: QueryJob| {
            // This process's writes, and the group's commits (writes acknowledged anywhere).
            let generation = progress.generation(metrics().index_generation.get());
            job.generation = generation;
            if let Some(mut context) = cache
                .lock()
                .expect("cache")
                .get(&cache_key(&job.query), generation)
            {
                context.query_id = job.query.query_id.clone();
                context.latency_ms = BTreeMap::from([("cache".to_string(), 0.0)]);
                let m = metrics();
                m.query_cache.with_label_values(&["hit"]).inc();
                m.queries
                    .with_label_values(&[job.query.mode.as_str(), "cached"])
                    .inc();
                return Err((context, job.reply));
            }
            metrics().query_cache.with_label_values(&["miss"]).inc();
            Ok(job)
        });
        looked_up.ok_err(|looked_up| looked_up)
    }
}
