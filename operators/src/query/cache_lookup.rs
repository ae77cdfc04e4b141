//! CacheLookup: answers a query from the cache when a context for it was computed at the current
//! index state (the process's writes and the group's commits). A hit leaves the flow here, as its
//! context, and joins it again at Publish (through Cite); only misses go on to Intent.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use timely::dataflow::operators::OkErr;
use timely::dataflow::StreamVec;

use super::job::{QueryJob, Reply};
use crate::metrics::{metrics, CacheResult, QueryOutcome};
use crate::stage::map_stage;
use ragstream_core::progress::IngestProgress;
use ragstream_core::query::cache::LruTtl;
use ragstream_core::query::{Context, Query};

/// The cache's key for `query`: the query without its id (every setting that shapes its context).
pub fn cache_key(query: &Query) -> String {
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
///
/// # Examples
///
/// A context Pack cached for "tide pools" at the index's current state (generation 0, nothing
/// written yet) answers the same query again, under the new query's id; another text misses and goes
/// on to be answered:
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use std::time::Duration;
/// use ragstream_core::query::cache::LruTtl;
/// use ragstream_core::query::Context;
/// use ragstream_operators::query::cache_lookup::{cache_key, CacheLookup};
/// use ragstream_operators::query::example::job;
/// use timely::dataflow::operators::capture::{Capture, Extract};
/// use timely::dataflow::operators::vec::{Map, ToStream};
///
/// let (misses, hits) = timely::example(|scope| {
///     let asked = job(r#"{"query_id": "q1", "tenant": "t", "text": "tide pools"}"#);
///     let cached = Context { query_id: "q1".into(), context: "Tide pools hold sea water.".into(), ..Context::default() };
///     let cache = Arc::new(Mutex::new(LruTtl::new(16, Duration::from_secs(60))));
///     cache.lock().unwrap().put(cache_key(&asked.query), cached, 0);
///     let (misses, hits) = vec![
///         job(r#"{"query_id": "q2", "tenant": "t", "text": "tide pools"}"#),
///         job(r#"{"query_id": "q3", "tenant": "t", "text": "rock pools"}"#),
///     ]
///     .to_stream(scope)
///     .cache_lookup(cache, Arc::default());
///     (
///         misses.map(|job| job.query.query_id).capture(),
///         hits.map(|(context, _)| (context.query_id, context.context)).capture(),
///     )
/// });
/// assert_eq!(misses.extract()[0].1, ["q3"]);
/// assert_eq!(hits.extract()[0].1, [("q2".to_string(), "Tide pools hold sea water.".to_string())]);
/// ```
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
                metrics().context_cache(CacheResult::Hit);
                metrics().query_ended(Some(job.query.mode), QueryOutcome::Cached);
                return Err((context, job.reply));
            }
            metrics().context_cache(CacheResult::Miss);
            Ok(job)
        });
        looked_up.ok_err(|looked_up| looked_up)
    }
}
