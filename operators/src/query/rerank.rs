//! Rerank: answer-focused features over the top of the fused list.
//!
//! Within a window (default the top 12) each candidate gets
//! `score = w_fused · fused/max_fused + w_recall · term_recall + w_precision · term_precision
//!        + w_entity · entity_coverage + w_date · date_match − w_distractor · distractor`
//! where term recall is the share of query terms the chunk holds, term precision the share of the
//! chunk's terms that are query terms, entity coverage the share of query entities it names, date
//! match the share of the query's years/date literals it contains, and distractor is 1 for tentative,
//! draft or checklist language. Candidates below the window keep their order, after the window.
//! Every factor is stored on the candidate for the trace.

use serde::{Deserialize, Serialize};

use super::fuse::sort_by_score;
use super::{Candidate, Plan};
use crate::store::Bm25Encoder;

/// Rerank window and weights (config section `query.rerank`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RerankConfig {
    /// Candidates reranked (the rest keep their fused order).
    pub window: usize,
    /// Weight of the normalised fused score.
    pub fused: f32,
    /// Weight of term recall.
    pub term_recall: f32,
    /// Weight of term precision.
    pub term_precision: f32,
    /// Weight of entity coverage.
    pub entity: f32,
    /// Weight of year/date-literal match.
    pub date: f32,
    /// Penalty for tentative/draft/checklist language.
    pub distractor: f32,
}

impl Default for RerankConfig {
    fn default() -> Self {
        Self {
            window: 12,
            fused: 1.0,
            term_recall: 0.3,
            term_precision: 0.1,
            entity: 0.2,
            date: 0.15,
            distractor: 0.2,
        }
    }
}

/// Words that mark a chunk as tentative: drafts, proposals, checklists, open questions.
pub const DISTRACTOR_CUES: [&str; 12] = [
    "tentative",
    "draft",
    "checklist",
    "todo",
    "tbd",
    "to be confirmed",
    "to be decided",
    "proposal",
    "proposed",
    "not yet decided",
    "work in progress",
    "[ ]",
];

/// The features of one chunk for one query.
pub fn factors(plan: &Plan, text: &str, bm25: &Bm25Encoder) -> [(&'static str, f32); 5] {
    let lower = text.to_lowercase();
    // Only words that could stem to a query term are stemmed (a stem keeps the word's first letters).
    let prefixes: Vec<&str> = plan
        .terms
        .iter()
        .map(|t| &t[..t.char_indices().nth(3).map_or(t.len(), |(i, _)| i)])
        .collect();
    let mut total = 0usize;
    let mut matching = 0usize;
    let mut present = vec![false; plan.terms.len()];
    bm25.visit_words(text, &mut |word| {
        total += 1;
        if !prefixes.iter().any(|p| word.starts_with(p)) {
            return;
        }
        if let Ok(index) = plan.terms.binary_search(&bm25.stem(word)) {
            matching += 1;
            present[index] = true;
        }
    });
    let recall = if plan.terms.is_empty() {
        0.0
    } else {
        present.iter().filter(|p| **p).count() as f32 / plan.terms.len() as f32
    };
    let precision = if total == 0 {
        0.0
    } else {
        matching as f32 / total as f32
    };
    let share = |needles: &[String]| {
        if needles.is_empty() {
            0.0
        } else {
            let found = needles
                .iter()
                .filter(|n| lower.contains(&n.to_lowercase()))
                .count();
            found as f32 / needles.len() as f32
        }
    };
    let distractor = if DISTRACTOR_CUES.iter().any(|cue| {
        lower
            .match_indices(cue)
            .any(|(at, _)| is_word_boundary(&lower, at, cue.len()))
    }) {
        1.0
    } else {
        0.0
    };
    [
        ("term_recall", recall),
        ("term_precision", precision),
        ("entity", share(&plan.entities)),
        ("date", share(&plan.dates)),
        ("distractor", distractor),
    ]
}

fn is_word_boundary(text: &str, at: usize, len: usize) -> bool {
    let before = text[..at].chars().next_back();
    let after = text[at + len..].chars().next();
    !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
}

/// Reranks the window of `candidates` (sorted by fused score) in place.
pub fn rerank(
    candidates: &mut [Candidate],
    plan: &Plan,
    config: &RerankConfig,
    bm25: &Bm25Encoder,
) {
    let window = config.window.min(candidates.len());
    if window == 0 {
        return;
    }
    let max_fused = candidates[..window]
        .iter()
        .map(|c| c.fused)
        .fold(f32::MIN, f32::max)
        .max(f32::EPSILON);
    let weight = |name: &str| match name {
        "term_recall" => config.term_recall,
        "term_precision" => config.term_precision,
        "entity" => config.entity,
        "date" => config.date,
        _ => -config.distractor,
    };
    for candidate in &mut candidates[..window] {
        let normalised = candidate.fused / max_fused;
        let mut score = config.fused * normalised;
        candidate.factors.clear();
        candidate
            .factors
            .insert("fused_normalised".into(), normalised);
        for (name, value) in factors(plan, &candidate.stored.chunk.embedding_input(), bm25) {
            score += weight(name) * value;
            candidate.factors.insert(name.into(), value);
        }
        candidate.score = score;
    }
    // Below the window: fused order, strictly after every reranked candidate.
    let floor = candidates[..window]
        .iter()
        .map(|c| c.score)
        .fold(f32::MAX, f32::min);
    for candidate in &mut candidates[window..] {
        candidate.score = floor - 1.0 + candidate.fused / max_fused;
    }
    sort_by_score(&mut candidates[..window]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::fuse::tests::stored;
    use crate::query::intent::analyze;

    fn candidate(doc: &str, text: &str, fused: f32) -> Candidate {
        let mut c = Candidate::new(stored(doc, 0, text));
        c.fused = fused;
        c.score = fused;
        c
    }

    #[test]
    fn answer_bearing_chunk_moves_up() {
        let bm25 = Bm25Encoder::default();
        let plan = analyze("When was the Eiffel Tower completed?", &bm25);
        let mut candidates = vec![
            candidate(
                "a",
                "Paris has many towers and a long history of architecture.",
                0.033,
            ),
            candidate(
                "b",
                "The Eiffel Tower was completed in 1889 for the World's Fair.",
                0.030,
            ),
            candidate("c", "Unrelated text about cooking pasta.", 0.020),
        ];
        rerank(&mut candidates, &plan, &RerankConfig::default(), &bm25);
        assert_eq!(candidates[0].stored.key.doc_id, "b");
        assert!(candidates[0].factors["term_recall"] > candidates[1].factors["term_recall"]);
        assert_eq!(candidates[2].stored.key.doc_id, "c");
    }

    #[test]
    fn years_entities_and_distractors() {
        let bm25 = Bm25Encoder::default();
        let plan = analyze("What did Acme ship in 2021?", &bm25);
        let mut candidates = vec![
            candidate(
                "draft",
                "Draft: Acme may ship the widget in 2021 (tentative).",
                0.033,
            ),
            candidate("final", "Acme shipped the widget in 2021.", 0.032),
            candidate("old", "Acme shipped the gadget in 2019.", 0.0325),
        ];
        rerank(&mut candidates, &plan, &RerankConfig::default(), &bm25);
        let order: Vec<&str> = candidates
            .iter()
            .map(|c| c.stored.key.doc_id.as_str())
            .collect();
        assert_eq!(order[0], "final");
        let draft = candidates
            .iter()
            .find(|c| c.stored.key.doc_id == "draft")
            .unwrap();
        assert_eq!(draft.factors["distractor"], 1.0);
        let old = candidates
            .iter()
            .find(|c| c.stored.key.doc_id == "old")
            .unwrap();
        assert_eq!(old.factors["date"], 0.0);
        // "todo" inside "todos" is no distractor; "draft" inside "redrafted" is none either.
        assert_eq!(
            factors(&plan, "The todos app was redrafted", &bm25)[4].1,
            0.0
        );
    }

    #[test]
    fn window_bounds_the_rerank() {
        let bm25 = Bm25Encoder::default();
        let plan = analyze("exact words here", &bm25);
        let mut candidates: Vec<Candidate> = (0..5)
            .map(|i| {
                candidate(
                    &format!("d{i}"),
                    if i == 4 {
                        "exact words here"
                    } else {
                        "nothing"
                    },
                    0.05 - i as f32 * 0.001,
                )
            })
            .collect();
        let config = RerankConfig {
            window: 2,
            ..RerankConfig::default()
        };
        rerank(&mut candidates, &plan, &config, &bm25);
        // The perfect match sits below the window: it is not promoted.
        assert_eq!(candidates[4].stored.key.doc_id, "d4");
        assert!(candidates[4].factors.is_empty());
        assert!(candidates.windows(2).all(|w| w[0].score >= w[1].score));
    }
}
