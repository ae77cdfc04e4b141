//! Fuse: weighted reciprocal-rank fusion of the dense and BM25 lanes.
//!
//! Each lane is first deduplicated by point id and by document offset (the same document range
//! returned twice, e.g. from two shards), keeping the best-ranked hit, and re-ranked densely from 1:
//! one passage cannot be counted twice. A candidate's fused score is
//! `Σ_lane weight_lane / (rrf_k + rank_lane)`; its lane ranks and raw scores stay on it for the trace.

use rustc_hash::{FxHashMap, FxHashSet};

use super::{Action, Candidate, Cause, Decision, LaneHit, Weights};
use crate::store::Hit;

/// A retrieval lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Lane {
    /// Nearest neighbours of the query's vector.
    Dense,
    /// BM25 over the query's terms.
    Bm25,
}

impl Lane {
    /// The lane's name (trace, metrics).
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Dense => "dense",
            Lane::Bm25 => "bm25",
        }
    }

    /// This lane's hit on a candidate.
    pub fn hit(self, candidate: &mut Candidate) -> &mut Option<LaneHit> {
        match self {
            Lane::Dense => &mut candidate.dense,
            Lane::Bm25 => &mut candidate.bm25,
        }
    }

    /// This lane's weight.
    pub fn weight(self, weights: Weights) -> f32 {
        match self {
            Lane::Dense => weights.dense,
            Lane::Bm25 => weights.bm25,
        }
    }
}

impl std::fmt::Display for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which of a lane's hits to keep: repeated points and repeated document offsets leave, best rank
/// first, each with a decision saying why.
fn lane_keep(hits: &[Hit], lane: Lane, decisions: &mut Vec<Decision>) -> Vec<bool> {
    let mut ids = FxHashSet::with_capacity_and_hasher(hits.len(), Default::default());
    let mut offsets = FxHashSet::with_capacity_and_hasher(hits.len(), Default::default());
    hits.iter()
        .map(|hit| {
            let stored = &hit.stored;
            let offset = (
                &stored.key,
                stored.chunk.char_range.0,
                stored.chunk.char_range.1,
            );
            let fresh = ids.insert(stored.id) && offsets.insert(offset);
            if !fresh {
                decisions.push(Decision::new(
                    stored.id.to_string(),
                    Action::Dropped,
                    Cause::LaneDuplicate,
                    format!("duplicate point or document offset on the {lane} lane"),
                ));
            }
            fresh
        })
        .collect()
}

/// Fuses the lanes (each sorted best first), taking their chunks over. Returns candidates by fused
/// score (ties by point id).
pub fn fuse(
    dense: Vec<Hit>,
    bm25: Vec<Hit>,
    weights: Weights,
    rrf_k: f32,
) -> (Vec<Candidate>, Vec<Decision>) {
    let mut decisions = Vec::new();
    let mut candidates: Vec<Candidate> = Vec::with_capacity(dense.len() + bm25.len());
    let mut by_id: FxHashMap<uuid::Uuid, usize> =
        FxHashMap::with_capacity_and_hasher(candidates.capacity(), Default::default());
    for (lane, hits) in [(Lane::Dense, dense), (Lane::Bm25, bm25)] {
        let weight = lane.weight(weights);
        // The kept hits are ranked densely from 1 as they are taken over.
        let keep = lane_keep(&hits, lane, &mut decisions);
        let kept = hits
            .into_iter()
            .zip(keep)
            .filter_map(|(hit, keep)| keep.then_some(hit));
        for (index, hit) in kept.enumerate() {
            let rank = index + 1;
            let lane_hit = Some(LaneHit {
                rank,
                score: hit.score,
            });
            let at = *by_id.entry(hit.stored.id).or_insert_with(|| {
                candidates.push(Candidate::new(hit.stored));
                candidates.len() - 1
            });
            let candidate = &mut candidates[at];
            *lane.hit(candidate) = lane_hit;
            candidate.fused += weight / (rrf_k + rank as f32);
        }
    }
    for candidate in &mut candidates {
        candidate.score = candidate.fused;
    }
    sort_by_score(&mut candidates);
    (candidates, decisions)
}

/// Gives each candidate its stored dense vector (moved out of `vectors`, as the index returned them).
pub fn attach_vectors(candidates: &mut [Candidate], vectors: Vec<(uuid::Uuid, Vec<f32>)>) {
    let mut vectors: FxHashMap<uuid::Uuid, Vec<f32>> = vectors.into_iter().collect();
    for candidate in candidates {
        candidate.vector = vectors.remove(&candidate.stored.id);
    }
}

/// Gives each candidate its sentence evidence (the best cosine between the query and one of the
/// chunk's evidence units, or the chunk's own), as the shards computed it.
pub fn attach_evidence(candidates: &mut [Candidate], evidence: Vec<(uuid::Uuid, f32)>) {
    let evidence: FxHashMap<uuid::Uuid, f32> = evidence.into_iter().collect();
    for candidate in candidates {
        candidate.evidence = evidence.get(&candidate.stored.id).copied();
    }
}

/// Sorts best first; ties by point id, so every run orders identically.
pub fn sort_by_score(candidates: &mut [Candidate]) {
    candidates.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| a.stored.id.cmp(&b.stored.id))
    });
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    pub use crate::testing::stored;

    fn hit(doc: &str, order: u32, score: f32) -> Hit {
        Hit {
            stored: stored(doc, order, &format!("text of {doc} {order}")),
            score,
        }
    }

    #[test]
    fn weighted_rrf_ranks_and_keeps_lane_scores() {
        let dense = vec![hit("a", 0, 0.9), hit("b", 0, 0.8), hit("c", 0, 0.7)];
        let bm25 = vec![hit("c", 0, 12.0), hit("b", 0, 9.0), hit("d", 0, 3.0)];
        let weights = Weights {
            dense: 0.5,
            bm25: 0.5,
        };
        let (fused, _) = fuse(dense.clone(), bm25.clone(), weights, 60.0);
        let order: Vec<&str> = fused.iter().map(|c| c.stored.key.doc_id.as_str()).collect();
        // c: 1/63 + 1/61 = 0.032266 edges out b: 2/62 = 0.032258; then a: 1/61, d: 1/63.
        assert_eq!(order, vec!["c", "b", "a", "d"]);
        let b = &fused[1];
        assert_eq!(
            b.dense,
            Some(LaneHit {
                rank: 2,
                score: 0.8
            })
        );
        assert_eq!(
            b.bm25,
            Some(LaneHit {
                rank: 2,
                score: 9.0
            })
        );
        assert!((b.fused - (0.5 / 62.0 + 0.5 / 62.0)).abs() < 1e-7);
        // Dense only: dense order; a BM25-heavy preset puts the BM25 winner first.
        let (fused, _) = fuse(
            dense.clone(),
            bm25.clone(),
            Weights {
                dense: 1.0,
                bm25: 0.0,
            },
            60.0,
        );
        assert_eq!(fused[0].stored.key.doc_id, "a");
        let (fused, _) = fuse(
            dense.clone(),
            bm25.clone(),
            Weights {
                dense: 0.2,
                bm25: 0.8,
            },
            60.0,
        );
        assert_eq!(fused[0].stored.key.doc_id, "c");
    }

    #[test]
    fn duplicates_are_removed_before_fusion() {
        // "a" appears twice on the dense lane (two shards answered it): counted once, and "b" moves up to rank 2.
        let dense = vec![hit("a", 0, 0.9), hit("a", 0, 0.9), hit("b", 0, 0.5)];
        let (fused, decisions) = fuse(
            dense,
            Vec::new(),
            Weights {
                dense: 1.0,
                bm25: 0.0,
            },
            60.0,
        );
        assert_eq!(fused.len(), 2);
        assert!((fused[0].fused - 1.0 / 61.0).abs() < 1e-7);
        assert_eq!(fused[1].dense.map(|h| h.rank), Some(2));
        assert_eq!(decisions.len(), 1);
        assert_eq!(decisions[0].action, Action::Dropped);
        assert_eq!(decisions[0].cause, Cause::LaneDuplicate);
    }
}
