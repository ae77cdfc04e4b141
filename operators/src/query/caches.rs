//! The process's context caches (one a worker, filled by Pack and read by CacheLookup), for the
//! operations tools: their figures (`get_cache_stats`, `GET /v1/cache`) and clearing them
//! (`clear_cache`, `DELETE /v1/cache`), always for one tenant at a time.
//!
//! A cached context is already never served once the index has moved on (entries carry the index
//! generation); clearing is for what the index cannot see: a changed prompt template upstream, a
//! context an operator wants recomputed, a test.

use std::sync::{Arc, Mutex};

use crate::metrics::{metrics, CacheResult};
use ragstream_core::query::cache::{CacheStats, LruTtl};
use ragstream_core::query::pattern::TextPattern;
use ragstream_core::query::{Context, Query};

/// One worker's cache of contexts, keyed by the query's JSON without its id.
pub type ContextCache = Arc<Mutex<LruTtl<String, Context>>>;

/// The context caches of this process's workers.
#[derive(Debug, Default)]
pub struct CacheRegistry {
    caches: Mutex<Vec<ContextCache>>,
}

/// The query a cache key was made from (its JSON, without the id).
fn query_of(key: &str) -> Option<Query> {
    serde_json::from_str(key).ok()
}

impl CacheRegistry {
    /// Adds a worker's cache.
    pub fn register(&self, cache: ContextCache) {
        self.caches.lock().expect("cache registry").push(cache);
    }

    fn each(&self, mut visit: impl FnMut(&mut LruTtl<String, Context>)) {
        let caches = self.caches.lock().expect("cache registry").clone();
        for cache in caches {
            visit(&mut cache.lock().expect("context cache"));
        }
    }

    /// The figures of `tenant`'s entries and of the caches.
    pub fn stats(&self, tenant: &str) -> CacheStats {
        let mut stats = CacheStats {
            tenant: tenant.to_string(),
            ..CacheStats::default()
        };
        self.each(|cache| {
            stats.workers += 1;
            stats.capacity += cache.capacity();
            stats.ttl_secs = cache.ttl().as_secs();
            stats.entries += cache
                .iter()
                .filter(|(_, context)| context.tenant == tenant)
                .count();
        });
        stats.process_hits = metrics().context_cache_count(CacheResult::Hit);
        stats.process_misses = metrics().context_cache_count(CacheResult::Miss);
        let total = stats.process_hits + stats.process_misses;
        if total > 0 {
            stats.process_hit_ratio = stats.process_hits as f64 / total as f64;
        }
        stats
    }

    /// Removes `tenant`'s entries whose query text matches `pattern` (all of them without one);
    /// answers how many.
    pub fn clear(&self, tenant: &str, pattern: Option<&TextPattern>) -> usize {
        let mut cleared = 0;
        self.each(|cache| {
            cleared += cache.remove_where(|key, context| {
                context.tenant == tenant
                    && pattern.is_none_or(|pattern| {
                        query_of(key).is_some_and(|query| pattern.matches(&query.text))
                    })
            });
        });
        cleared
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn cached(tenant: &str, text: &str) -> (String, Context) {
        let query = ragstream_core::query::decode::decode_query(
            format!(r#"{{"query_id":"q","tenant":"{tenant}","text":"{text}"}}"#).as_bytes(),
            8192,
        )
        .expect("query");
        // The key as CacheLookup makes it.
        let key = crate::query::cache_lookup::cache_key(&query);
        let context = Context {
            tenant: tenant.to_string(),
            ..Context::default()
        };
        (key, context)
    }

    #[test]
    fn stats_count_one_tenants_entries_and_clear_removes_only_what_matches() {
        let registry = CacheRegistry::default();
        let caches: Vec<ContextCache> = (0..2)
            .map(|_| Arc::new(Mutex::new(LruTtl::new(8, Duration::from_secs(60)))))
            .collect();
        for cache in &caches {
            registry.register(cache.clone());
        }
        for (worker, tenant, text) in [
            (0, "acme", "why do tides rise"),
            (1, "acme", "when is the tide high"),
            (1, "acme", "how do I roll back"),
            (0, "globex", "why do tides rise"),
        ] {
            let (key, context) = cached(tenant, text);
            caches[worker].lock().unwrap().put(key, context, 0);
        }
        let stats = registry.stats("acme");
        assert_eq!((stats.entries, stats.workers), (3, 2));
        assert_eq!((stats.capacity, stats.ttl_secs), (16, 60));
        assert_eq!(registry.stats("globex").entries, 1);
        assert_eq!(registry.stats("initech").entries, 0);
        let tides = TextPattern::parse("*TIDE*").expect("pattern");
        assert_eq!(registry.clear("acme", Some(&tides)), 2);
        assert_eq!(
            registry.stats("acme").entries,
            1,
            "the rollback question stays"
        );
        assert_eq!(registry.stats("globex").entries, 1, "another tenant's stay");
        assert_eq!(registry.clear("acme", None), 1);
        assert_eq!(registry.stats("acme").entries, 0);
        assert_eq!(registry.stats("globex").entries, 1);
    }
}
