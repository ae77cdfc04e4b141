//! Corpus-wide BM25 statistics: per tenant, the chunks indexed and the number of chunks holding each
//! term (document frequency), over every shard of the job.
//!
//! The index stores BM25 term-frequency weights without IDF ([`super::bm25`]); a query's BM25 vector
//! carries each term's IDF from these statistics ([`CorpusStats::weigh`]), so a chunk's BM25 score is
//! the same whichever shard holds it and however many shards there are.
//!
//! # How they are kept
//! - Each shard's writer computes a [`StatsDelta`] from what it actually changed: the terms of every
//!   point it writes, minus the terms of the points it overwrites or deletes (read back from the
//!   index before the write), so replays and rewrites count once. A worker's hydration adds what its
//!   shard held at start.
//! - The deltas are sent to the first worker of every process, which applies them to the process's
//!   [`CorpusStats`] (all its workers read it). Every process therefore holds the whole corpus's
//!   statistics, a worker step or a network hop behind the index writes.
//! - Statistics are per tenant: one tenant's documents never move another tenant's scores. Within a
//!   tenant they count every chunk, ACL-restricted ones included (as a search engine's index
//!   statistics do).

use std::collections::{BTreeMap, HashMap};
use std::sync::RwLock;

use super::SparseVector;

/// Changes to the statistics of some tenants.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StatsDelta {
    /// Per tenant: change in chunk count, and change in document frequency per term id.
    pub tenants: BTreeMap<String, TenantDelta>,
}

/// Changes to one tenant's statistics.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TenantDelta {
    /// Chunks added (negative: removed).
    pub chunks: i64,
    /// Document frequency change per term id (zeros removed).
    pub df: BTreeMap<u32, i64>,
}

impl StatsDelta {
    /// Counts one chunk of `tenant` with the terms of its BM25 vector `sparse`, `sign` times (+1 added,
    /// −1 removed).
    pub fn count(&mut self, tenant: &str, sparse: &SparseVector, sign: i64) {
        let delta = match self.tenants.get_mut(tenant) {
            Some(delta) => delta,
            None => self.tenants.entry(tenant.to_string()).or_default(),
        };
        delta.chunks += sign;
        for term in &sparse.indices {
            let df = delta.df.entry(*term).or_default();
            *df += sign;
            if *df == 0 {
                delta.df.remove(term);
            }
        }
        if delta.chunks == 0 && delta.df.is_empty() {
            self.tenants.remove(tenant);
        }
    }

    /// Adds `other` into this delta.
    pub fn merge(&mut self, other: StatsDelta) {
        for (tenant, theirs) in other.tenants {
            let ours = self.tenants.entry(tenant.clone()).or_default();
            ours.chunks += theirs.chunks;
            for (term, n) in theirs.df {
                let df = ours.df.entry(term).or_default();
                *df += n;
                if *df == 0 {
                    ours.df.remove(&term);
                }
            }
            if ours.chunks == 0 && ours.df.is_empty() {
                self.tenants.remove(&tenant);
            }
        }
    }

    /// Nothing changes.
    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }
}

/// One tenant's statistics.
#[derive(Debug, Default)]
struct TenantStats {
    chunks: i64,
    df: HashMap<u32, i64>,
}

/// Deltas applied so far, per tenant: grows with every delta that changes the tenant.
type Applied = HashMap<String, u64>;

/// The statistics of the whole corpus, per tenant, shared by the workers of one process.
#[derive(Debug, Default)]
pub struct CorpusStats {
    tenants: RwLock<HashMap<String, TenantStats>>,
    applied: RwLock<Applied>,
}

/// BM25 inverse document frequency of a term held by `df` of `chunks` chunks (Lucene's form, never
/// negative): `ln(1 + (N − df + 0.5) / (df + 0.5))`.
pub fn idf(chunks: i64, df: i64) -> f32 {
    let (chunks, df) = (chunks.max(0) as f64, df.clamp(0, chunks.max(0)) as f64);
    (1.0 + (chunks - df + 0.5) / (df + 0.5)).ln() as f32
}

impl CorpusStats {
    /// Applies a delta.
    pub fn apply(&self, delta: &StatsDelta) {
        {
            let mut applied = self.applied.write().unwrap_or_else(|e| e.into_inner());
            for tenant in delta.tenants.keys() {
                *applied.entry(tenant.clone()).or_default() += 1;
            }
        }
        let mut tenants = self.tenants.write().unwrap_or_else(|e| e.into_inner());
        for (tenant, change) in &delta.tenants {
            let stats = match tenants.get_mut(tenant) {
                Some(stats) => stats,
                None => tenants.entry(tenant.clone()).or_default(),
            };
            stats.chunks += change.chunks;
            for (term, n) in &change.df {
                let df = stats.df.entry(*term).or_default();
                *df += n;
                if *df == 0 {
                    stats.df.remove(term);
                }
            }
            if stats.chunks == 0 && stats.df.is_empty() {
                tenants.remove(tenant);
            }
        }
    }

    /// How many deltas changed `tenant`'s statistics so far (a reader tells from it whether they
    /// moved since it last looked).
    pub fn applied(&self, tenant: &str) -> u64 {
        let applied = self.applied.read().unwrap_or_else(|e| e.into_inner());
        applied.get(tenant).copied().unwrap_or(0)
    }

    /// Chunks of `tenant`, and how many hold `term`.
    pub fn frequency(&self, tenant: &str, term: u32) -> (i64, i64) {
        let tenants = self.tenants.read().unwrap_or_else(|e| e.into_inner());
        tenants.get(tenant).map_or((0, 0), |stats| {
            (stats.chunks, stats.df.get(&term).copied().unwrap_or(0))
        })
    }

    /// The query vector `query` (1.0 per term) with each term's weight set to its IDF in `tenant`'s
    /// corpus. Terms no chunk holds keep their weight (they match nothing).
    pub fn weigh(&self, tenant: &str, query: &SparseVector) -> SparseVector {
        let tenants = self.tenants.read().unwrap_or_else(|e| e.into_inner());
        let Some(stats) = tenants.get(tenant) else {
            return query.clone();
        };
        let values = query
            .indices
            .iter()
            .zip(&query.values)
            .map(|(term, weight)| match stats.df.get(term) {
                Some(&df) if df > 0 => weight * idf(stats.chunks, df),
                _ => *weight,
            })
            .collect();
        SparseVector {
            indices: query.indices.clone(),
            values,
        }
    }

    /// Tenants with statistics and their chunk counts (for tests and reports).
    pub fn chunks_by_tenant(&self) -> BTreeMap<String, i64> {
        let tenants = self.tenants.read().unwrap_or_else(|e| e.into_inner());
        tenants
            .iter()
            .map(|(tenant, stats)| (tenant.clone(), stats.chunks))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vector(terms: &[u32]) -> SparseVector {
        SparseVector {
            indices: terms.to_vec(),
            values: vec![1.0; terms.len()],
        }
    }

    #[test]
    fn deltas_from_any_split_of_the_corpus_sum_to_the_same_statistics() {
        let chunks: Vec<(&str, Vec<u32>)> = vec![
            ("a", vec![1, 2, 3]),
            ("a", vec![2, 3]),
            ("a", vec![3]),
            ("b", vec![1]),
        ];
        // One shard holding everything, against four shards with a chunk each.
        let one = CorpusStats::default();
        let mut all = StatsDelta::default();
        for (tenant, terms) in &chunks {
            all.count(tenant, &vector(terms), 1);
        }
        one.apply(&all);
        let four = CorpusStats::default();
        for (tenant, terms) in &chunks {
            let mut shard = StatsDelta::default();
            shard.count(tenant, &vector(terms), 1);
            four.apply(&shard);
        }
        for term in 1..=4 {
            for tenant in ["a", "b"] {
                assert_eq!(one.frequency(tenant, term), four.frequency(tenant, term));
            }
        }
        assert_eq!(one.frequency("a", 3), (3, 3));
        assert_eq!(one.frequency("a", 1), (3, 1));
        assert_eq!(one.frequency("b", 1), (1, 1), "tenants are counted apart");
        // Removing a chunk takes its terms out; removing every chunk leaves nothing behind.
        let mut removal = StatsDelta::default();
        removal.count("a", &vector(&[2, 3]), -1);
        one.apply(&removal);
        assert_eq!(one.frequency("a", 2), (2, 1));
        let mut rest = StatsDelta::default();
        rest.count("a", &vector(&[1, 2, 3]), -1);
        rest.count("a", &vector(&[3]), -1);
        rest.count("b", &vector(&[1]), -1);
        one.apply(&rest);
        assert!(one.chunks_by_tenant().is_empty());
        // Every delta that changed a tenant counts once for it: a, in all three; b, in two.
        assert_eq!(
            (one.applied("a"), one.applied("b"), one.applied("c")),
            (3, 2, 0)
        );
        assert_eq!(four.applied("a"), 3);
    }

    #[test]
    fn a_delta_that_adds_and_removes_the_same_chunk_is_empty() {
        let mut delta = StatsDelta::default();
        delta.count("t", &vector(&[7, 9]), 1);
        let mut undo = StatsDelta::default();
        undo.count("t", &vector(&[7, 9]), -1);
        delta.merge(undo);
        assert!(delta.is_empty(), "{delta:?}");
    }

    #[test]
    fn rarer_terms_weigh_more_and_unknown_tenants_keep_the_query() {
        let stats = CorpusStats::default();
        let mut delta = StatsDelta::default();
        for n in 0..10u32 {
            let terms: Vec<u32> = if n == 0 { vec![1, 2] } else { vec![1] };
            delta.count("t", &vector(&terms), 1);
        }
        stats.apply(&delta);
        let weighed = stats.weigh("t", &vector(&[1, 2, 3]));
        assert_eq!(weighed.indices, vec![1, 2, 3]);
        assert!((weighed.values[0] - idf(10, 10)).abs() < 1e-6);
        assert!((weighed.values[1] - idf(10, 1)).abs() < 1e-6);
        assert!(weighed.values[1] > weighed.values[0], "{weighed:?}");
        assert_eq!(weighed.values[2], 1.0, "a term no chunk holds");
        assert!(
            idf(10, 10) > 0.0,
            "a term in every chunk still counts a little"
        );
        assert_eq!(stats.weigh("other", &vector(&[1])), vector(&[1]));
    }
}
