//! A small LRU + TTL cache. Entries carry the index generation they were computed at and miss once the
//! index has moved on, so a cached context never hides a newer write.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

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
