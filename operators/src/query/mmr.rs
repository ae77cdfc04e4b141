//! Mmr: maximal marginal relevance over the stored vectors, with per-document and per-section caps.
//!
//! Picks, one at a time, the candidate maximising `λ · relevance − (1 − λ) · max cosine to the picked`
//! (relevance = score rescaled to [0, 1]). A candidate whose document already has `per_document`
//! picks, or whose section already has `per_section`, is deferred, not dropped (a chunk outside any
//! section, as in plain prose, counts against its document's cap only): the packer uses
//! deferred candidates only when the budget would otherwise be left unused. A candidate whose cosine to
//! a pick reaches `near_duplicate` (0.95) is dropped as a near-duplicate of it.

use std::collections::BTreeMap;

use super::{Candidate, Decision};
use crate::embed::dot;

/// MMR settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MmrConfig {
    /// Relevance (1.0) versus diversity (0.0).
    pub lambda: f32,
    /// Most picks per document.
    pub per_document: usize,
    /// Most picks per section (document + section path).
    pub per_section: usize,
    /// Cosine at or above which a candidate is a near-duplicate of a pick and leaves (dedup step).
    pub near_duplicate: f32,
}

/// The MMR outcome.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Picked, in pick order.
    pub picked: Vec<Candidate>,
    /// Held back by a cap, best first.
    pub deferred: Vec<Candidate>,
    /// Why candidates were deferred or left out.
    pub decisions: Vec<Decision>,
}

fn section(candidate: &Candidate) -> (String, Vec<String>) {
    (
        candidate.stored.key.doc_id.clone(),
        candidate.stored.chunk.section_path.clone(),
    )
}

/// Selects up to `k` candidates from `candidates` (best first).
pub fn mmr(candidates: Vec<Candidate>, k: usize, config: MmrConfig) -> Selection {
    let (low, high) = candidates.iter().fold((f32::MAX, f32::MIN), |(lo, hi), c| {
        (lo.min(c.score), hi.max(c.score))
    });
    let span = (high - low).max(f32::EPSILON);
    let relevance: Vec<f32> = candidates
        .iter()
        .map(|c| {
            if high > low {
                (c.score - low) / span
            } else {
                1.0
            }
        })
        .collect();
    // Cosines from dot products and each vector's inverse norm (no normalised copies).
    let inverse_norms: Vec<Option<f32>> = candidates
        .iter()
        .map(|c| {
            c.vector.as_deref().map(|v| {
                let norm = dot(v, v).sqrt();
                if norm > 0.0 {
                    norm.recip()
                } else {
                    0.0
                }
            })
        })
        .collect();
    let mut slots: Vec<Option<Candidate>> = candidates.into_iter().map(Some).collect();
    let mut remaining: Vec<usize> = (0..slots.len()).collect();
    let mut selection = Selection::default();
    let mut per_document: BTreeMap<String, usize> = BTreeMap::new();
    let mut per_section: BTreeMap<(String, Vec<String>), usize> = BTreeMap::new();
    // Highest similarity of each remaining candidate to anything picked so far.
    let mut max_similarity: Vec<Option<f32>> = vec![None; slots.len()];
    while selection.picked.len() < k && !remaining.is_empty() {
        let best = remaining
            .iter()
            .enumerate()
            .map(|(position, &index)| {
                let similarity = max_similarity[index].unwrap_or(0.0);
                let value = config.lambda * relevance[index] - (1.0 - config.lambda) * similarity;
                (position, value)
            })
            .max_by(|a, b| a.1.total_cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
            .map(|(position, _)| position)
            .expect("non-empty");
        let index = remaining.remove(best);
        let candidate = slots[index].take().expect("each candidate is taken once");
        let document = candidate.stored.key.doc_id.clone();
        let section_key = section(&candidate);
        let document_count = per_document.get(&document).copied().unwrap_or(0);
        let section_count = per_section.get(&section_key).copied().unwrap_or(0);
        // Without a section path the "section" would be the whole document, and its cap would
        // override the document's.
        let sectioned = !candidate.stored.chunk.section_path.is_empty();
        if document_count >= config.per_document
            || (sectioned && section_count >= config.per_section)
        {
            let reason = if document_count >= config.per_document {
                format!("document cap ({}) reached", config.per_document)
            } else {
                format!("section cap ({}) reached", config.per_section)
            };
            selection
                .decisions
                .push(Decision::new(candidate.id(), "mmr", "deferred", reason));
            selection.deferred.push(candidate);
            continue;
        }
        *per_document.entry(document).or_default() += 1;
        *per_section.entry(section_key).or_default() += 1;
        if let (Some(vector), Some(inverse)) = (&candidate.vector, inverse_norms[index]) {
            let picked_id = candidate.id();
            remaining.retain(|&other_index| {
                let other = slots[other_index].as_ref().expect("remaining");
                let (Some(other_vector), Some(other_inverse)) =
                    (&other.vector, inverse_norms[other_index])
                else {
                    return true;
                };
                let similarity = dot(vector, other_vector) * inverse * other_inverse;
                if similarity >= config.near_duplicate {
                    selection.decisions.push(Decision::new(
                        other.id(),
                        "dedup",
                        "dropped",
                        format!("near-duplicate of {picked_id} (cosine {similarity:.3})"),
                    ));
                    return false;
                }
                let entry = &mut max_similarity[other_index];
                *entry = Some(entry.map_or(similarity, |s| s.max(similarity)));
                true
            });
        }
        selection.picked.push(candidate);
    }
    for candidate in remaining
        .into_iter()
        .filter_map(|index| slots[index].take())
    {
        selection.decisions.push(Decision::new(
            candidate.id(),
            "mmr",
            "dropped",
            format!("beyond k = {k}"),
        ));
    }
    selection
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::fuse::tests::stored;

    fn candidate(doc: &str, order: u32, score: f32, vector: Vec<f32>) -> Candidate {
        let mut c = Candidate::new(stored(doc, order, &format!("{doc} {order}")));
        c.score = score;
        c.vector = Some(vector);
        c
    }

    const OPEN: MmrConfig = MmrConfig {
        lambda: 0.6,
        per_document: 10,
        per_section: 10,
        near_duplicate: 0.999,
    };

    #[test]
    fn near_duplicates_of_a_pick_leave() {
        let candidates = vec![
            candidate("a", 0, 1.0, vec![1.0, 0.0]),
            candidate("b", 0, 0.9, vec![0.9, 0.436]),
            candidate("c", 0, 0.8, vec![0.0, 1.0]),
        ];
        // cosine(a, b) ≈ 0.9: kept at 0.95, dropped at 0.85.
        let strict = mmr(
            candidates.clone(),
            10,
            MmrConfig {
                near_duplicate: 0.95,
                ..OPEN
            },
        );
        assert_eq!(strict.picked.len(), 3);
        let loose = mmr(
            candidates,
            10,
            MmrConfig {
                near_duplicate: 0.85,
                ..OPEN
            },
        );
        let docs: Vec<&str> = loose
            .picked
            .iter()
            .map(|c| c.stored.key.doc_id.as_str())
            .collect();
        assert_eq!(docs, vec!["a", "c"]);
        let dropped = loose
            .decisions
            .iter()
            .find(|d| d.step == "dedup")
            .expect("decision");
        assert!(dropped.reason.contains("near-duplicate"));
    }

    #[test]
    fn diversity_beats_a_redundant_runner_up() {
        let candidates = vec![
            candidate("a", 0, 1.0, vec![1.0, 0.0, 0.0]),
            candidate("b", 0, 0.95, vec![0.99, 0.14, 0.0]),
            candidate("c", 0, 0.9, vec![0.0, 0.0, 1.0]),
        ];
        let picked = mmr(candidates.clone(), 2, OPEN).picked;
        let docs: Vec<&str> = picked
            .iter()
            .map(|c| c.stored.key.doc_id.as_str())
            .collect();
        assert_eq!(docs, vec!["a", "c"]);
        // λ = 1 is plain relevance order.
        let relevance = mmr(
            candidates,
            2,
            MmrConfig {
                lambda: 1.0,
                ..OPEN
            },
        )
        .picked;
        let docs: Vec<&str> = relevance
            .iter()
            .map(|c| c.stored.key.doc_id.as_str())
            .collect();
        assert_eq!(docs, vec!["a", "b"]);
    }

    /// MMR with caps 2 per document and 1 per section; the picks as `{doc}{order}`.
    fn capped(
        candidates: Vec<Candidate>,
        lambda: f32,
        near_duplicate: f32,
    ) -> (Selection, Vec<String>) {
        let config = MmrConfig {
            lambda,
            per_document: 2,
            per_section: 1,
            near_duplicate,
        };
        let selection = mmr(candidates, 10, config);
        let picked = selection
            .picked
            .iter()
            .map(|c| format!("{}{}", c.stored.key.doc_id, c.stored.chunk.order_index))
            .collect();
        (selection, picked)
    }

    #[test]
    fn caps_defer_instead_of_dropping() {
        let candidates = vec![
            candidate("a", 0, 1.0, vec![1.0, 0.0]),
            candidate("a", 1, 0.9, vec![0.0, 1.0]),
            candidate("a", 2, 0.8, vec![0.7, 0.7]),
            candidate("b", 0, 0.1, vec![0.6, 0.8]),
        ];
        let (selection, picked) = capped(candidates, 0.6, 0.95);
        assert_eq!(picked, vec!["a0", "a1", "b0"]);
        assert_eq!(selection.deferred.len(), 1);
        assert!(selection.decisions[0].reason.contains("document cap"));
    }

    #[test]
    fn the_section_cap_binds_sections_and_unsectioned_chunks_only_meet_the_document_cap() {
        let mut candidates = vec![
            candidate("a", 0, 1.0, vec![1.0, 0.0]),
            candidate("a", 1, 0.9, vec![0.0, 1.0]),
            candidate("p", 0, 0.8, vec![0.6, 0.8]),
            candidate("p", 1, 0.7, vec![0.8, 0.6]),
        ];
        // "a" has one section for both chunks; "p" is plain prose without sections.
        for c in &mut candidates {
            c.stored.chunk.section_path = if c.stored.key.doc_id == "a" {
                vec!["Intro".into()]
            } else {
                vec![]
            };
        }
        let (selection, picked) = capped(candidates, 1.0, 0.99);
        assert_eq!(picked, vec!["a0", "p0", "p1"]);
        assert_eq!(selection.deferred.len(), 1);
        assert!(selection.decisions[0].reason.contains("section cap"));
    }
}
