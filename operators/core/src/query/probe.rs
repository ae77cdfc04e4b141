//! Probe: what a query's retrieval saw, kept beside its context so a standing query can tell which
//! index changes could move that context without running it again.
//!
//! Everything after retrieval (fusion by rank, rerank over the candidates' own text, dedup, MMR,
//! packing) is a function of the two lanes' members, their order and their documents. So a change
//! can move the context only if it
//! - touches a document with a member in either lane (edits, deletes, neighbours, file counts);
//! - adds a chunk that would enter a lane: its cosine with the query vector reaches the dense lane's
//!   lowest member's, or its BM25 score the BM25 lane's lowest member's (a lane cut nowhere admits
//!   every chunk);
//! - moves the IDF of the query's terms (corpus statistics) enough to reorder the BM25 lane: a
//!   member's BM25 score moves by at most [`Probe::drift`] (the moves of the weights of the terms
//!   some chunk held when the probe was taken, times the largest weight a term can have in a
//!   chunk), so two members further apart than twice that keep their order, and a new chunk (scored
//!   with the weights of now) enters the lane only if it scores within that of the lowest member.

use super::super::store::SparseVector;

/// Slack on the dense admission test: engine scores may come from quantised vectors.
pub const DENSE_SLACK: f32 = 0.01;

/// What one evaluation's retrieval saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Probe {
    /// The dense query vector searched (empty: no dense lane).
    pub dense: Vec<f32>,
    /// The cosine of the dense lane's lowest member, where the lane was cut (`None`: any chunk
    /// would enter).
    pub dense_floor: Option<f32>,
    /// The BM25 query vector searched, each term weighed by its IDF at the time (empty: no BM25
    /// lane).
    pub bm25: SparseVector,
    /// The same terms unweighed (what the IDF multiplied).
    pub bm25_raw: Vec<f32>,
    /// Per term, whether a chunk of the tenant held it (a term no chunk held weighs on no member).
    pub bm25_seen: Vec<bool>,
    /// The BM25 lane's lowest member's score, where the lane was cut.
    pub bm25_floor: Option<f32>,
    /// The BM25 lane's best score (0: an empty lane).
    pub bm25_top: f32,
    /// The documents with a member in either lane, sorted and unique.
    pub docs: Vec<String>,
}

impl Probe {
    /// Whether a chunk at cosine `score` with the query vector could enter the dense lane.
    pub fn admits_dense(&self, score: Option<f32>) -> bool {
        if self.dense.is_empty() {
            return false;
        }
        match (self.dense_floor, score) {
            (None, _) | (_, None) => true,
            (Some(floor), Some(score)) => score >= floor - DENSE_SLACK,
        }
    }

    /// Whether a chunk scoring `score` with the BM25 weights of now could enter the BM25 lane, a
    /// member's score having moved by up to `drift` since the probe: it shares a term, and the lane
    /// was cut nowhere or the chunk reaches its lowest member's score less the drift.
    pub fn admits_bm25(&self, score: f32, drift: f32) -> bool {
        if score <= 0.0 {
            return false;
        }
        self.bm25_floor
            .is_none_or(|floor| score >= floor - drift.max(0.0))
    }

    /// Whether `doc_id` has a member in a lane.
    pub fn cites(&self, doc_id: &str) -> bool {
        self.docs
            .binary_search_by(|doc| doc.as_str().cmp(doc_id))
            .is_ok()
    }

    /// How far a member's BM25 score may have moved since the probe was taken, given each query
    /// term's weight now (in the order of `bm25.indices`) and the largest weight a term can have in a
    /// chunk (`weight_max`): `weight_max · Σ |now − then|` over the terms some chunk held then (the
    /// members hold no other). Infinite where the terms do not match.
    pub fn drift(&self, now: &[f32], weight_max: f32) -> f32 {
        if now.len() != self.bm25.values.len() || self.bm25_seen.len() != now.len() {
            return f32::INFINITY;
        }
        let moved: f32 = self
            .bm25
            .values
            .iter()
            .zip(now)
            .zip(&self.bm25_seen)
            .filter(|(_, seen)| **seen)
            .map(|((then, now), _)| (now - then).abs())
            .sum();
        if !moved.is_finite() {
            return f32::INFINITY;
        }
        weight_max * moved
    }
}

/// The cosine of two vectors (`None` where either is empty, of another length or zero).
pub fn cosine(a: &[f32], b: &[f32]) -> Option<f32> {
    if a.is_empty() || a.len() != b.len() {
        return None;
    }
    let (mut dot, mut aa, mut bb) = (0.0f32, 0.0f32, 0.0f32);
    for (x, y) in a.iter().zip(b) {
        dot += x * y;
        aa += x * x;
        bb += y * y;
    }
    let norm = (aa * bb).sqrt();
    (norm > 0.0 && norm.is_finite()).then(|| dot / norm)
}

/// The dot product of two sparse vectors (indices ascending).
pub fn sparse_dot(a: &SparseVector, b: &SparseVector) -> f32 {
    let (mut i, mut j, mut sum) = (0, 0, 0.0);
    while i < a.indices.len() && j < b.indices.len() {
        match a.indices[i].cmp(&b.indices[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                sum += a.values.get(i).copied().unwrap_or(0.0)
                    * b.values.get(j).copied().unwrap_or(0.0);
                i += 1;
                j += 1;
            }
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sparse(terms: &[(u32, f32)]) -> SparseVector {
        SparseVector {
            indices: terms.iter().map(|t| t.0).collect(),
            values: terms.iter().map(|t| t.1).collect(),
        }
    }

    /// Whether a new chunk could enter either lane: the two tests as the standing queries' filter
    /// applies them (with the query's BM25 weights of now and the drift since the probe).
    fn admits(
        probe: &Probe,
        dense: &[f32],
        sparse: &SparseVector,
        now: &[f32],
        drift: f32,
    ) -> bool {
        let now = SparseVector {
            indices: probe.bm25.indices.clone(),
            values: now.to_vec(),
        };
        probe.admits_dense(cosine(&probe.dense, dense))
            || probe.admits_bm25(sparse_dot(&now, sparse), drift)
    }

    fn probe() -> Probe {
        Probe {
            dense: vec![1.0, 0.0],
            dense_floor: Some(0.5),
            bm25: sparse(&[(1, 2.0), (5, 1.0)]),
            bm25_raw: vec![1.0, 1.0],
            bm25_seen: vec![true, true],
            bm25_floor: Some(3.0),
            bm25_top: 6.0,
            docs: vec!["a".into(), "c".into()],
        }
    }

    /// A chunk enters a lane only at or above the lane's lowest member (with the slack), and a lane
    /// cut nowhere takes any chunk; a chunk sharing no term never enters the BM25 lane.
    #[test]
    fn admission_follows_each_lane_floor() {
        let probe = probe();
        let none = SparseVector::default();
        let then = [2.0, 1.0];
        assert!(admits(&probe, &[0.6, 0.8], &none, &then, 0.0));
        assert!(!admits(&probe, &[0.3, 0.954], &none, &then, 0.0));
        assert!(!admits(
            &probe,
            &[0.0, 1.0],
            &sparse(&[(2, 9.0)]),
            &then,
            0.0
        ));
        assert!(admits(
            &probe,
            &[0.0, 1.0],
            &sparse(&[(1, 1.0), (5, 1.0)]),
            &then,
            0.0
        ));
        let low = sparse(&[(1, 1.0), (5, 0.5)]);
        assert!(!admits(&probe, &[0.0, 1.0], &low, &then, 0.0));
        // 2.5 against 3.0: within reach where a member may have moved by 0.5.
        assert!(admits(&probe, &[0.0, 1.0], &low, &then, 0.5));
        assert!(!admits(&probe, &[0.0, 1.0], &low, &then, 0.4));
        // Scored with the weights of now: term 5 weighs 2 now, 2 + 1 reaches 3.
        assert!(admits(&probe, &[0.0, 1.0], &low, &[2.0, 2.0], 0.0));
        let open = Probe {
            dense_floor: None,
            bm25_floor: None,
            ..probe.clone()
        };
        assert!(admits(&open, &[0.0, 1.0], &none, &then, 0.0));
        // An uncut BM25 lane takes any chunk sharing a term, none sharing none.
        assert!(open.admits_bm25(sparse_dot(&open.bm25, &sparse(&[(5, 0.01)])), 0.0));
        assert!(!open.admits_bm25(sparse_dot(&open.bm25, &sparse(&[(6, 1.0)])), 0.0));
        assert!(probe.cites("c") && !probe.cites("b"));
    }

    /// The drift bounds any chunk's score move: weight changes summed, times the largest term
    /// weight; a chunk's actual move stays within it.
    #[test]
    fn drift_bounds_every_score_move() {
        let probe = probe();
        assert_eq!(probe.drift(&[2.0, 1.0], 2.2), 0.0);
        let drift = probe.drift(&[2.5, 0.8], 2.2);
        assert!((drift - 2.2 * 0.7).abs() < 1e-5, "{drift}");
        // A chunk holding both terms at the largest weight moves by 2.2 · (0.5 − 0.2) only.
        let chunk = sparse(&[(1, 2.2), (5, 2.2)]);
        let then = sparse_dot(&probe.bm25, &chunk);
        let now = sparse_dot(&sparse(&[(1, 2.5), (5, 0.8)]), &chunk);
        assert!((now - then).abs() <= drift);
        assert_eq!(probe.drift(&[2.0], 2.2), f32::INFINITY);
        assert_eq!(Probe::default().drift(&[], 2.2), 0.0);
        // A term no chunk held then weighs on no member: its move does not count.
        let unseen = Probe {
            bm25_seen: vec![true, false],
            ..probe
        };
        assert!((unseen.drift(&[2.5, 7.0], 2.2) - 2.2 * 0.5).abs() < 1e-5);
    }

    #[test]
    fn cosine_and_sparse_dot() {
        assert_eq!(cosine(&[1.0, 0.0], &[2.0, 0.0]), Some(1.0));
        assert_eq!(cosine(&[1.0], &[1.0, 0.0]), None);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), None);
        let dot = sparse_dot(
            &sparse(&[(1, 2.0), (3, 1.0)]),
            &sparse(&[(0, 5.0), (3, 4.0)]),
        );
        assert_eq!(dot, 4.0);
    }
}
