//! A small LRU + TTL cache. Entries carry the index generation they were computed at and miss once the
//! index has moved on, so a cached context never hides a newer write.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// The context caches' figures for one tenant (`get_cache_stats`, `GET /v1/cache`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CacheStats {
    /// The tenant.
    pub tenant: String,
    /// Contexts cached for the tenant across this process's workers (an entry the index has moved
    /// past counts until a lookup finds it stale).
    pub entries: usize,
    /// Most entries, all tenants together, across the workers.
    pub capacity: usize,
    /// Seconds an entry lives.
    pub ttl_secs: u64,
    /// Caches (one a worker of this process).
    pub workers: usize,
    /// Lookups of this process that found a context, every tenant, since it started.
    pub process_hits: u64,
    /// Lookups of this process that did not.
    pub process_misses: u64,
    /// `process_hits / (process_hits + process_misses)`; 0 before any lookup.
    pub process_hit_ratio: f64,
}

/// The cache.
#[derive(Debug)]
pub struct LruTtl<K, V> {
    capacity: usize,
    ttl: Duration,
    tick: u64,
    entries: HashMap<K, (V, Instant, u64, u64)>,
}

impl<K: Hash + Eq + Clone, V: Clone> LruTtl<K, V> {
    /// A cache of at most `capacity` entries living `ttl` each (capacity 0 disables it).
    pub fn new(capacity: usize, ttl: Duration) -> Self {
        Self {
            capacity,
            ttl,
            tick: 0,
            entries: HashMap::new(),
        }
    }

    /// The value for `key` if it is fresh and was stored at index `generation`.
    pub fn get(&mut self, key: &K, generation: u64) -> Option<V> {
        self.tick += 1;
        let tick = self.tick;
        let ttl = self.ttl;
        let fresh = match self.entries.get_mut(key) {
            Some((value, at, stored, used)) if *stored == generation && at.elapsed() < ttl => {
                *used = tick;
                return Some(value.clone());
            }
            Some(_) => false,
            None => return None,
        };
        if !fresh {
            self.entries.remove(key);
        }
        None
    }

    /// Stores `value` for `key` at index `generation`, evicting the least recently used entry if full.
    pub fn put(&mut self, key: K, value: V, generation: u64) {
        if self.capacity == 0 {
            return;
        }
        self.tick += 1;
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (_, _, _, used))| *used)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                self.entries.remove(&oldest);
            }
        }
        self.entries
            .insert(key, (value, Instant::now(), generation, self.tick));
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Most entries (0: disabled).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// How long an entry lives.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The entries' keys and values, in no order (fresh or not).
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.entries.iter().map(|(key, (value, ..))| (key, value))
    }

    /// Removes the entries `remove` picks; answers how many.
    pub fn remove_where(&mut self, mut remove: impl FnMut(&K, &V) -> bool) -> usize {
        let before = self.entries.len();
        self.entries.retain(|key, (value, ..)| !remove(key, value));
        before - self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_ttl_and_generation() {
        let mut cache = LruTtl::new(2, Duration::from_secs(60));
        cache.put("a", 1, 7);
        cache.put("b", 2, 7);
        assert_eq!(cache.get(&"a", 7), Some(1));
        cache.put("c", 3, 7); // evicts b, the least recently used
        assert_eq!(cache.get(&"b", 7), None);
        assert_eq!(cache.get(&"a", 7), Some(1));
        // The index moved: a miss, and the stale entry is gone.
        assert_eq!(cache.get(&"a", 8), None);
        assert_eq!(cache.len(), 1);
        let mut short = LruTtl::new(2, Duration::from_millis(1));
        short.put("x", 1, 0);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(short.get(&"x", 0), None);
        let mut off = LruTtl::new(0, Duration::from_secs(1));
        off.put("x", 1, 0);
        assert!(off.is_empty());
    }
}
