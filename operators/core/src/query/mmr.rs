//! Mmr: maximal marginal relevance over the stored vectors, with per-document and per-section caps.
//!
//! Picks, one at a time, the candidate maximising `λ · relevance − (1 − λ) · max cosine to the picked`
//! (relevance = score rescaled to [0, 1]). A candidate whose document already has `per_document`
//! picks, or whose section already has `per_section`, is deferred, not dropped (a chunk outside any
//! section, as in plain prose, counts against its document's cap only): the packer uses
//! deferred candidates only when the budget would otherwise be left unused. A candidate whose cosine to
//! a pick reaches `near_duplicate` (0.95) is dropped as a near-duplicate of it. Below the caps,
//! `file_penalty` spreads the picks softly: each pick of a document already picked costs
//! `file_penalty` times the number of its document's picks (0 by default: the caps alone).

use std::collections::BTreeMap;

use super::{Action, Candidate, Cause, Decision};
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
    /// Taken off a candidate's MMR value per pick its document already has.
    pub file_penalty: f32,
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

/// Each candidate's score rescaled to [0, 1] (all 1 when the scores are equal).
fn relevance(candidates: &[Candidate]) -> Vec<f32> {
    let (low, high) = candidates.iter().fold((f32::MAX, f32::MIN), |(lo, hi), c| {
        (lo.min(c.score), hi.max(c.score))
    });
    let span = (high - low).max(f32::EPSILON);
    candidates
        .iter()
        .map(|c| {
            if high > low {
                (c.score - low) / span
            } else {
                1.0
            }
        })
        .collect()
}

/// The inverse of a norm from a vector's dot product with itself (0 for a zero vector).
fn inverse(self_dot: f32) -> f32 {
    let norm = self_dot.sqrt();
    if norm > 0.0 {
        norm.recip()
    } else {
        0.0
    }
}

/// The similarities MMR has computed so far: each candidate is compared with the picks only when it
/// could be the next pick.
struct Similarities<'c> {
    candidates: &'c [Candidate],
    /// Each vector's inverse norm (cosines from dot products, no normalised copies), computed at
    /// its first comparison.
    inverse_norms: Vec<Option<f32>>,
    near_duplicate: f32,
    /// Picks with a vector, in pick order.
    vector_picks: Vec<usize>,
    /// How many of `vector_picks` each candidate has been compared with.
    compared: Vec<usize>,
    /// Each candidate's highest similarity to those picks.
    max_similarity: Vec<Option<f32>>,
}

impl Similarities<'_> {
    /// Whether candidate `index` has been compared with every pick it can be compared with.
    fn fresh(&self, index: usize) -> bool {
        self.candidates[index].vector.is_none() || self.compared[index] == self.vector_picks.len()
    }

    /// The inverse norm of candidate `index` (which has a vector).
    fn inverse_norm(&mut self, index: usize) -> f32 {
        let candidates = self.candidates;
        let vector = candidates[index].vector.as_deref().unwrap_or_default();
        *self.inverse_norms[index].get_or_insert_with(|| inverse(dot(vector, vector)))
    }

    /// Compares candidate `index` with the picks it has not met; the decision that drops it when it is
    /// a near-duplicate of one.
    fn refresh(&mut self, index: usize) -> Option<Decision> {
        let candidates = self.candidates;
        let vector = candidates[index].vector.as_deref()?;
        while let Some(&pick) = self.vector_picks.get(self.compared[index]) {
            self.compared[index] += 1;
            let pick_vector = candidates[pick].vector.as_deref().unwrap_or_default();
            let pick_inverse = self.inverse_norm(pick);
            let similarity = dot(pick_vector, vector) * pick_inverse * self.inverse_norm(index);
            if similarity >= self.near_duplicate {
                return Some(Decision::new(
                    self.candidates[index].id(),
                    Action::Dropped,
                    Cause::NearDuplicate,
                    format!(
                        "near-duplicate of {} (cosine {similarity:.3})",
                        self.candidates[pick].id()
                    ),
                ));
            }
            let entry = &mut self.max_similarity[index];
            *entry = Some(entry.map_or(similarity, |s| s.max(similarity)));
        }
        None
    }
}

/// Selects up to `k` candidates from `candidates` (best first).
///
/// Lazily: a candidate's value only falls as picks are added (its highest similarity to the picks
/// only rises), so a value computed against some of the picks bounds the true one from above. Each
/// round compares only the candidate with the highest bound with the picks it has not met, until the
/// best candidate is up to date: the picks are those of comparing every candidate with every pick, at
/// a fraction of the dot products. Every candidate is compared with the first pick, so that a bound
/// always rests on a similarity (with none, a negative one could lift the value above the bound). A
/// near-duplicate is dropped when it is compared; one never compared is reported beyond `k`.
pub fn mmr(candidates: Vec<Candidate>, k: usize, config: MmrConfig) -> Selection {
    let relevance = relevance(&candidates);
    let mut similarities = Similarities {
        candidates: &candidates,
        inverse_norms: vec![None; candidates.len()],
        near_duplicate: config.near_duplicate,
        vector_picks: Vec::new(),
        compared: vec![0; candidates.len()],
        max_similarity: vec![None; candidates.len()],
    };
    let value = |index: usize, max_similarity: &[Option<f32>]| {
        config.lambda * relevance[index]
            - (1.0 - config.lambda) * max_similarity[index].unwrap_or(0.0)
    };
    let mut remaining: Vec<usize> = (0..candidates.len()).collect();
    let (mut picks, mut deferred, mut decisions) = (Vec::new(), Vec::new(), Vec::new());
    let mut per_document: BTreeMap<&str, usize> = BTreeMap::new();
    let mut per_section: BTreeMap<(&str, &[String]), usize> = BTreeMap::new();
    // The soft cost of a document's picks (exact whenever computed: it is not part of the bound).
    let penalty = |index: usize, per_document: &BTreeMap<&str, usize>| {
        if config.file_penalty == 0.0 {
            // Off (the default): no lookup per candidate and round.
            return 0.0;
        }
        let document = candidates[index].stored.key.doc_id.as_str();
        config.file_penalty * per_document.get(document).copied().unwrap_or(0) as f32
    };
    while picks.len() < k {
        // The highest value (the first of equals), once it is up to date.
        let position = loop {
            let best = remaining
                .iter()
                .enumerate()
                .map(|(position, &index)| {
                    let value = value(index, &similarities.max_similarity);
                    (position, value - penalty(index, &per_document))
                })
                .reduce(|best, next| {
                    if next.1.total_cmp(&best.1).is_gt() {
                        next
                    } else {
                        best
                    }
                });
            let Some((best, _)) = best else {
                break None;
            };
            if similarities.fresh(remaining[best]) {
                break Some(best);
            }
            if let Some(decision) = similarities.refresh(remaining[best]) {
                decisions.push(decision);
                remaining.remove(best);
            }
        };
        let Some(position) = position else {
            break;
        };
        let index = remaining.remove(position);
        let candidate = &candidates[index];
        let document = candidate.stored.key.doc_id.as_str();
        let section = (document, candidate.stored.chunk.section_path.as_slice());
        let document_count = per_document.get(document).copied().unwrap_or(0);
        let section_count = per_section.get(&section).copied().unwrap_or(0);
        if let Some(deferral) = capped(candidate, document_count, section_count, &config) {
            decisions.push(deferral);
            deferred.push(index);
            continue;
        }
        *per_document.entry(document).or_default() += 1;
        *per_section.entry(section).or_default() += 1;
        picks.push(index);
        if candidate.vector.is_some() {
            similarities.vector_picks.push(index);
            if similarities.vector_picks.len() == 1 {
                remaining.retain(|&other| match similarities.refresh(other) {
                    Some(decision) => {
                        decisions.push(decision);
                        false
                    }
                    None => true,
                });
            }
        }
    }
    for &index in &remaining {
        decisions.push(Decision::new(
            candidates[index].id(),
            Action::Dropped,
            Cause::BeyondK,
            format!("beyond k = {k}"),
        ));
    }
    let mut slots: Vec<Option<Candidate>> = candidates.into_iter().map(Some).collect();
    let mut take = |indices: Vec<usize>| -> Vec<Candidate> {
        indices
            .into_iter()
            .filter_map(|index| slots[index].take())
            .collect()
    };
    Selection {
        picked: take(picks),
        deferred: take(deferred),
        decisions,
    }
}

/// The deferral of `candidate` when its document (or its section) already has its cap of picks.
fn capped(
    candidate: &Candidate,
    document_count: usize,
    section_count: usize,
    config: &MmrConfig,
) -> Option<Decision> {
    // Without a section path the "section" would be the whole document, and its cap would
    // override the document's.
    let sectioned = !candidate.stored.chunk.section_path.is_empty();
    let (cause, reason) = if document_count >= config.per_document {
        let cap = config.per_document;
        (Cause::DocumentCap, format!("document cap ({cap}) reached"))
    } else if sectioned && section_count >= config.per_section {
        let cap = config.per_section;
        (Cause::SectionCap, format!("section cap ({cap}) reached"))
    } else {
        return None;
    };
    Some(Decision::new(
        candidate.id(),
        Action::Deferred,
        cause,
        reason,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::fuse::tests::stored;

    /// The eager MMR: every candidate compared with every pick (the lazy one must pick the same).
    fn eager(candidates: Vec<Candidate>, k: usize, config: MmrConfig) -> Selection {
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
                    let document = &slots[index].as_ref().expect("remaining").stored.key.doc_id;
                    let picks = per_document.get(document).copied().unwrap_or(0);
                    let value = config.lambda * relevance[index]
                        - (1.0 - config.lambda) * similarity
                        - config.file_penalty * picks as f32;
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
            if let Some(deferral) =
                super::capped(&candidate, document_count, section_count, &config)
            {
                selection.decisions.push(deferral);
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
                            Action::Dropped,
                            Cause::NearDuplicate,
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
                Action::Dropped,
                Cause::BeyondK,
                format!("beyond k = {k}"),
            ));
        }
        selection
    }

    fn section(candidate: &Candidate) -> (String, Vec<String>) {
        (
            candidate.stored.key.doc_id.clone(),
            candidate.stored.chunk.section_path.clone(),
        )
    }

    proptest::proptest! {
        /// Random scores, vectors (some missing, some near copies), documents and sections: the lazy
        /// MMR picks and defers exactly what the eager one does, in the same order.
        #[test]
        fn lazy_picks_what_eager_picks(
            rows in proptest::collection::vec(
                (0.0f32..1.0, proptest::collection::vec(-1.0f32..1.0, 4), 0u8..4, 0u8..3, 0u8..8),
                0..40,
            ),
            k in 1usize..12,
            lambda in 0.0f32..1.0,
            near_duplicate in 0.8f32..1.0,
            file_penalty in proptest::prop_oneof![proptest::strategy::Just(0.0f32), 0.0f32..0.3],
        ) {
            let mut candidates: Vec<Candidate> = Vec::new();
            for (i, (score, vector, doc, section, shape)) in rows.into_iter().enumerate() {
                let mut c = candidate(&format!("d{doc}"), i as u32, score, vector);
                c.stored.chunk.section_path = if section == 0 { vec![] } else { vec![format!("s{section}")] };
                match shape {
                    0 => c.vector = None,
                    // A near copy of the previous candidate's vector.
                    1 => if let Some(previous) = candidates.last().and_then(|p| p.vector.clone()) {
                        c.vector = Some(previous.iter().map(|x| x * 1.01).collect());
                    },
                    2 => c.score = 0.5,
                    _ => {}
                }
                candidates.push(c);
            }
            let config = MmrConfig { lambda, per_document: 2, per_section: 1, near_duplicate, file_penalty };
            let ids = |list: &[Candidate]| list.iter().map(|c| c.id()).collect::<Vec<_>>();
            let lazy = mmr(candidates.clone(), k, config);
            let eager = eager(candidates, k, config);
            proptest::prop_assert_eq!(ids(&lazy.picked), ids(&eager.picked));
            proptest::prop_assert_eq!(ids(&lazy.deferred), ids(&eager.deferred));
            // The picks keep their vectors.
            proptest::prop_assert!(lazy.picked.iter().zip(&eager.picked).all(|(a, b)| a.vector == b.vector));
        }
    }

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
        file_penalty: 0.0,
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
            .find(|d| d.step == crate::query::Step::Dedup)
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
            file_penalty: 0.0,
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
        assert_eq!(selection.decisions[0].cause, Cause::DocumentCap);
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
        assert_eq!(selection.decisions[0].cause, Cause::SectionCap);
    }

    #[test]
    fn the_file_penalty_lets_another_document_pass_a_slightly_better_second_chunk() {
        let candidates = vec![
            candidate("a", 0, 1.0, vec![1.0, 0.0, 0.0, 0.0]),
            candidate("a", 1, 0.95, vec![0.0, 1.0, 0.0, 0.0]),
            candidate("b", 0, 0.9, vec![0.0, 0.0, 1.0, 0.0]),
            candidate("c", 0, 0.0, vec![0.0, 0.0, 0.0, 1.0]),
        ];
        let order = |file_penalty: f32| -> Vec<String> {
            let config = MmrConfig {
                lambda: 1.0,
                file_penalty,
                ..OPEN
            };
            mmr(candidates.clone(), 4, config)
                .picked
                .iter()
                .map(|c| format!("{}{}", c.stored.key.doc_id, c.stored.chunk.order_index))
                .collect()
        };
        assert_eq!(order(0.0), ["a0", "a1", "b0", "c0"]);
        // a1's relevance 0.95 less 0.10 for a's pick falls below b0's 0.90.
        assert_eq!(order(0.1), ["a0", "b0", "a1", "c0"]);
    }
}
