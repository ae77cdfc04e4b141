//! Rerank: answer-focused features over the top of the fused list.
//!
//! Within a window (default the top 40, plus each lane's top 3 wherever fusion ranked them) each
//! candidate gets
//! `score = w_fused · fused/max_fused + w_lanes · lane_scores + w_evidence · sentence_evidence
//!        + w_recall · term_recall
//!        + w_sentence · sentence_recall + w_weighted · weighted_sentence_recall + w_phrase · phrase
//!        + w_precision · term_precision + w_entity · entity_coverage + w_date · date_match
//!        − w_distractor · distractor`
//! where lane scores are the engines' raw scores min-max normalised over each lane's hits and
//! combined with the intent's lane weights (rank fusion keeps only ranks; how far apart the scores are
//! says how sure a lane is), sentence evidence the best cosine between the query vector and one of the
//! chunk's evidence units (its sentences, in code its lines, each with a vector from ingest: a chunk
//! about several things is as close to the query as its closest sentence; a chunk of one sentence
//! counts its own vector), term
//! recall is the share of query terms the chunk holds, sentence recall
//! the largest share of them one sentence holds, weighted sentence recall the same with each term
//! weighted by how few of the window's candidates hold it (`ln(1 + n / (1 + df))`: a term every
//! candidate holds does not tell them apart), phrase the share of the query's phrases (each two
//! terms next to each other in the query, stop words skipped) the chunk holds next to each other in
//! the same order within a sentence (a question is worded like the passage that answers it: "papal
//! legate" next to each other says more than both words somewhere), term precision the share of the
//! chunk's terms that are query terms, entity coverage the share of query entities it names, date
//! match the share of the query's years/date literals it contains, and distractor is 1 for tentative,
//! draft or checklist language. Candidates below the window keep their order, after the window.
//! Every factor is stored on the candidate for the trace.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::fuse::sort_by_score;
use super::{Candidate, Plan};
use crate::store::Bm25Encoder;

mod features;
pub use features::{factors, Features, Lexical, DISTRACTOR_CUES};
#[cfg(test)]
use features::{has_cue, is_word_boundary};

/// Rerank window and weights (config section `query.rerank`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RerankConfig {
    /// Candidates reranked (the rest keep their fused order).
    pub window: usize,
    /// Each lane's best hits down to this rank join the window wherever fusion put them (a lane
    /// weighted low by the intent cannot bury its top hit below the window).
    pub lane_heads: usize,
    /// Weight of the normalised fused score.
    pub fused: f32,
    /// Weight of the lanes' normalised raw scores.
    pub lanes: f32,
    /// Weight of sentence evidence: the best cosine between the query and one of the chunk's sentences
    /// (code: lines), each with a vector of its own from ingest (`embedder.evidence_vectors`; the
    /// chunk's own where it has none).
    pub sentence_evidence: f32,
    /// Weight of term recall.
    pub term_recall: f32,
    /// Weight of sentence recall (the most query terms one sentence holds, as a share).
    pub sentence_recall: f32,
    /// Weight of weighted sentence recall: the largest share of the query terms' weight one sentence
    /// holds, a term weighing more the fewer of the window's candidates hold it.
    pub weighted_sentence_recall: f32,
    /// Weight of phrase matches (the share of the query's adjacent term pairs the chunk holds
    /// adjacent, in order, within a sentence).
    pub phrase: f32,
    /// Weight of term precision.
    pub term_precision: f32,
    /// Weight of entity coverage.
    pub entity: f32,
    /// Weight of year/date-literal match.
    pub date: f32,
    /// Penalty for tentative/draft/checklist language.
    pub distractor: f32,
    /// A reranker endpoint after the built-in rerank: `none` (default), `http` (the
    /// text-embeddings-inference rerank API), `cohere` (the Cohere/Jina rerank API) or `llm` (a chat
    /// model grading passages).
    pub kind: super::endpoints::RerankKind,
    /// Candidates (the head of the built-in order) the endpoint reorders.
    pub endpoint_window: usize,
    /// The endpoint (`kind` other than `none`).
    pub endpoint: super::endpoints::EndpointConfig,
}

impl Default for RerankConfig {
    fn default() -> Self {
        Self {
            window: 40,
            lane_heads: 3,
            fused: 0.5,
            lanes: 1.0,
            sentence_evidence: 1.0,
            term_recall: 0.3,
            sentence_recall: 0.3,
            phrase: 0.5,
            weighted_sentence_recall: 0.6,
            term_precision: 0.1,
            entity: 0.2,
            date: 0.15,
            distractor: 0.2,
            kind: super::endpoints::RerankKind::None,
            endpoint_window: 10,
            endpoint: super::endpoints::EndpointConfig::default(),
        }
    }
}

/// Per candidate, the largest share of the query terms' weight one of its sentences holds, each term
/// weighted by how few of the candidates hold it: `ln(1 + n / (1 + df))` for `n` candidates of which
/// `df` hold the term anywhere. `sentences` holds, per candidate, each sentence's terms as bits (the
/// first 64 terms of `terms`). A term every candidate holds tells them apart least, so the sentence
/// that holds the rare words of the question counts most: "Who was the MVP of Super Bowl 50?" over
/// passages all about Super Bowl 50 is decided by "MVP".
pub fn weighted_sentence_recall(sentences: &[Vec<u64>], terms: usize) -> Vec<f32> {
    let terms = terms.min(64);
    let n = sentences.len() as f32;
    // The terms each candidate holds anywhere: its sentences' bits together.
    let held: Vec<u64> = sentences
        .iter()
        .map(|chunk| chunk.iter().fold(0, |all, mask| all | mask))
        .collect();
    let weights: Vec<f32> = (0..terms)
        .map(|term| {
            let df = held.iter().filter(|all| *all & (1 << term) != 0).count() as f32;
            (1.0 + n / (1.0 + df)).ln()
        })
        .collect();
    let total: f32 = weights.iter().sum();
    sentences
        .iter()
        .map(|chunk| {
            if total <= 0.0 {
                return 0.0;
            }
            let best = chunk
                .iter()
                .map(|mask| {
                    weights
                        .iter()
                        .enumerate()
                        .filter(|(term, _)| mask & (1 << term) != 0)
                        .map(|(_, w)| w)
                        .sum::<f32>()
                })
                .fold(0.0f32, f32::max);
            best / total
        })
        .collect()
}

/// Each candidate's lane scores: per lane, `(score − min) / (max − min)` over every candidate that lane
/// returned (0 when the lane did not return it), weighted by the plan's lane weights.
fn lane_scores(candidates: &[Candidate], plan: &Plan) -> Vec<f32> {
    let range = |lane: fn(&Candidate) -> Option<f32>| {
        candidates
            .iter()
            .filter_map(lane)
            .fold(None, |acc: Option<(f32, f32)>, s| {
                Some(acc.map_or((s, s), |(lo, hi)| (lo.min(s), hi.max(s))))
            })
    };
    let dense = |c: &Candidate| c.dense.map(|h| h.score);
    let bm25 = |c: &Candidate| c.bm25.map(|h| h.score);
    let (dense_range, bm25_range) = (range(dense), range(bm25));
    let total = (plan.weights.dense + plan.weights.bm25).max(f32::EPSILON);
    let normalised = |score: Option<f32>, range: Option<(f32, f32)>| match (score, range) {
        (Some(s), Some((lo, hi))) if hi > lo => (s - lo) / (hi - lo),
        (Some(_), Some(_)) => 1.0,
        _ => 0.0,
    };
    candidates
        .iter()
        .map(|c| {
            (plan.weights.dense * normalised(dense(c), dense_range)
                + plan.weights.bm25 * normalised(bm25(c), bm25_range))
                / total
        })
        .collect()
}

/// Reranks the window of `candidates` (sorted by fused score) in place.
///
/// Returns the bottom of the reranked scale: the lowest reranked score less one, where candidates
/// below the window start. The evidence stop measures a candidate's standing from it, so its scale
/// is the same whether or not any candidate lies below the window (with no window: the lowest score).
pub fn rerank(
    candidates: &mut [Candidate],
    plan: &Plan,
    config: &RerankConfig,
    bm25: &Bm25Encoder,
) -> f32 {
    let mut window = config.window.min(candidates.len());
    if window == 0 {
        return candidates
            .iter()
            .map(|c| c.score)
            .fold(f32::INFINITY, f32::min);
    }
    // Lane heads below the window move up to join it; the others keep their fused order.
    let head = |c: &Candidate| {
        [c.dense, c.bm25]
            .iter()
            .flatten()
            .any(|hit| hit.rank <= config.lane_heads)
    };
    let fused_window = window;
    for index in fused_window..candidates.len() {
        if head(&candidates[index]) {
            candidates[window..=index].rotate_right(1);
            window += 1;
        }
    }
    let max_fused = candidates[..window]
        .iter()
        .map(|c| c.fused)
        .fold(f32::MIN, f32::max)
        .max(f32::EPSILON);
    let lanes = lane_scores(candidates, plan);
    let mut features = Features::new(plan, bm25);
    let mut sentences: Vec<Vec<u64>> = Vec::with_capacity(window);
    for (candidate, lane_score) in candidates[..window].iter_mut().zip(lanes) {
        let normalised = candidate.fused / max_fused;
        let mut score = config.fused * normalised + config.lanes * lane_score;
        candidate.factors.clear();
        candidate
            .factors
            .insert(Cow::Borrowed("fused_normalised"), normalised);
        candidate
            .factors
            .insert(Cow::Borrowed("lane_scores"), lane_score);
        // No evidence where the shard had no query vector (the query's embedding failed: then no
        // candidate has any).
        let evidence = candidate.evidence.unwrap_or(0.0);
        score += config.sentence_evidence * evidence;
        candidate
            .factors
            .insert(Cow::Borrowed("sentence_evidence"), evidence);
        // The text the chunk was embedded as: title, section path and text, a line each.
        let chunk = &candidate.stored.chunk;
        let path = chunk.section_path.join(" > ");
        let parts = [chunk.doc_title.as_str(), path.as_str(), chunk.text.as_str()];
        for (name, value, weight) in features.of(&parts).weighted(config, plan.lexical) {
            score += weight * value;
            candidate.factors.insert(Cow::Borrowed(name), value);
        }
        sentences.push(std::mem::take(&mut features.sentences));
        candidate.score = score;
    }
    // Needs the whole window: how many of its candidates hold each term.
    let recall = weighted_sentence_recall(&sentences, plan.terms.len());
    for (candidate, value) in candidates[..window].iter_mut().zip(recall) {
        candidate.score += config.weighted_sentence_recall * plan.lexical * value;
        candidate
            .factors
            .insert(Cow::Borrowed("weighted_sentence_recall"), value);
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
    floor - 1.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::fuse::tests::stored;
    use crate::query::intent::IntentPresets;

    fn analyze(text: &str, bm25: &Bm25Encoder) -> Plan {
        crate::query::intent::analyze(text, bm25, &IntentPresets::default())
    }
    use crate::query::LaneHit;

    fn candidate(doc: &str, text: &str, fused: f32) -> Candidate {
        let mut c = Candidate::new(stored(doc, 0, text));
        c.fused = fused;
        c.score = fused;
        c
    }

    proptest::proptest! {
        /// The word-start scan finds a cue exactly when an overlapping search for every cue finds one
        /// at word boundaries.
        #[test]
        fn cues_are_found_where_a_search_finds_them(
            pieces in proptest::collection::vec(
                proptest::sample::select(vec![
                    "draft", "Draft", "re", "to be", " confirmed", "decided", "todo", "s", " ", "-",
                    "_", "[", "]", "[ ]", "é", "x", "tbd", "TBD", "work in", " progress", "not yet ",
                    "proposal", "propose", "d", "7", ".",
                ]),
                0..12,
            ),
        ) {
            let text = pieces.concat().to_lowercase();
            let reference = aho_corasick::AhoCorasick::builder()
                .ascii_case_insensitive(true)
                .build(DISTRACTOR_CUES)
                .expect("automaton");
            let expected = reference
                .find_overlapping_iter(&text)
                .any(|m| is_word_boundary(&text, m.start(), m.len()));
            proptest::prop_assert_eq!(has_cue(&text), expected, "{}", text);
        }
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
    fn sentence_evidence_orders_chunks_equal_on_every_other_feature() {
        let bm25 = Bm25Encoder::default();
        let plan = analyze("When does the keeper wind the clock?", &bm25);
        let text = "The keeper winds the clock. The bakery sells bread.";
        let mut diluted = candidate("diluted", text, 0.030);
        diluted.evidence = Some(0.4);
        let mut answering = candidate("answering", text, 0.030);
        answering.evidence = Some(0.9);
        let mut closer = candidate("closer", text, 0.030);
        closer.evidence = Some(0.6);
        let mut candidates = vec![diluted, closer, answering];
        let config = RerankConfig {
            lanes: 0.0,
            ..RerankConfig::default()
        };
        rerank(&mut candidates, &plan, &config, &bm25);
        let order: Vec<&str> = candidates
            .iter()
            .map(|c| c.stored.key.doc_id.as_str())
            .collect();
        assert_eq!(order, vec!["answering", "closer", "diluted"]);
        let evidence: Vec<f32> = candidates
            .iter()
            .map(|c| c.factors["sentence_evidence"])
            .collect();
        assert_eq!(evidence, vec![0.9, 0.6, 0.4]);
        // The factor's weight is the score difference it makes.
        let gap = candidates[0].score - candidates[2].score;
        assert!((gap - 0.5 * config.sentence_evidence).abs() < 1e-5, "{gap}");
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
            factors(&plan, "The todos app was redrafted", &bm25).distractor,
            0.0
        );
    }

    /// d0..d4 in falling fused order; only d4 holds the query "exact words here".
    fn five_with_the_match_last() -> Vec<Candidate> {
        (0..5)
            .map(|i| {
                let text = if i == 4 {
                    "exact words here"
                } else {
                    "nothing"
                };
                candidate(&format!("d{i}"), text, 0.05 - i as f32 * 0.001)
            })
            .collect()
    }

    #[test]
    fn the_bottom_of_the_scale_does_not_depend_on_candidates_below_the_window() {
        let bm25 = Bm25Encoder::default();
        let plan = analyze("exact words here", &bm25);
        let bottom = |window: usize| {
            let mut candidates = five_with_the_match_last();
            let config = RerankConfig {
                window,
                lane_heads: 0,
                ..RerankConfig::default()
            };
            let bottom = rerank(&mut candidates, &plan, &config, &bm25);
            let reranked = candidates[..window.min(5)]
                .iter()
                .map(|c| c.score)
                .fold(f32::INFINITY, f32::min);
            assert_eq!(
                bottom,
                reranked - 1.0,
                "one below the lowest reranked score"
            );
            assert!(candidates.iter().all(|c| c.score > bottom));
            (bottom, candidates)
        };
        // The same five reranked, with none below the window and with none: the same bottom.
        let (all, _) = bottom(5);
        let (wide, _) = bottom(40);
        assert_eq!(all, wide);
        // With two below the window they lie between the bottom and the lowest reranked score.
        let (narrow, candidates) = bottom(3);
        for c in &candidates[3..] {
            assert!(c.score > narrow && c.score <= narrow + 1.0, "{}", c.score);
        }
    }

    #[test]
    fn window_bounds_the_rerank() {
        let bm25 = Bm25Encoder::default();
        let plan = analyze("exact words here", &bm25);
        let mut candidates = five_with_the_match_last();
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

    #[test]
    fn a_lane_head_below_the_window_is_reranked() {
        let bm25 = Bm25Encoder::default();
        let plan = analyze("exact words here", &bm25);
        let mut candidates = five_with_the_match_last();
        for (i, c) in candidates.iter_mut().enumerate() {
            c.dense = Some(LaneHit {
                rank: i + 1,
                score: 0.5,
            });
        }
        // The perfect match is only the weak lane's top hit: fusion put it last.
        candidates[4].dense = None;
        candidates[4].bm25 = Some(LaneHit {
            rank: 1,
            score: 9.0,
        });
        let config = RerankConfig {
            window: 2,
            lane_heads: 1,
            ..RerankConfig::default()
        };
        rerank(&mut candidates, &plan, &config, &bm25);
        assert_eq!(candidates[0].stored.key.doc_id, "d4");
        // The window was d0, d1 and the head d4; d2 and d3 keep their fused order after it.
        let rest: Vec<&str> = candidates[3..]
            .iter()
            .map(|c| c.stored.key.doc_id.as_str())
            .collect();
        assert_eq!(rest, ["d2", "d3"]);
        assert!(candidates[..3].iter().all(|c| !c.factors.is_empty()));
        assert!(candidates[3..].iter().all(|c| c.factors.is_empty()));
    }

    #[test]
    fn sentence_recall_prefers_terms_together() {
        let bm25 = Bm25Encoder::default();
        let plan = analyze("Which team won the championship final?", &bm25);
        let together = factors(
            &plan,
            "The season was long. The Broncos team won the championship final. Fans cheered.",
            &bm25,
        );
        let scattered = factors(
            &plan,
            "Our team trained hard. Nobody won anything. The championship was cancelled. A final note.",
            &bm25,
        );
        assert_eq!(together.term_recall, scattered.term_recall);
        assert_eq!(together.sentence_recall, 1.0);
        assert!(scattered.sentence_recall <= 0.25);
    }

    #[test]
    fn weighted_sentence_recall_counts_the_terms_few_candidates_hold() {
        // Terms 0 ("super"), 1 ("bowl"), 2 ("mvp"). Every candidate holds 0 and 1; one also holds 2,
        // in a sentence of its own; another holds 0 and 1 together in one sentence.
        let both = 0b011u64;
        let sentences = vec![
            vec![both],         // "Super Bowl 50 was played in February."
            vec![0b001, 0b110], // "Super Bowl 50 ..." / "Bowl MVP Von Miller ..."
            vec![0b001, 0b010], // the two words in different sentences
        ];
        let recall = weighted_sentence_recall(&sentences, 3);
        // n = 3; df 3, 3, 1: weights ln(1.75), ln(1.75), ln(2.5).
        let (common, rare) = ((1.0f32 + 3.0 / 4.0).ln(), (1.0f32 + 3.0 / 2.0).ln());
        let total = 2.0 * common + rare;
        assert!((recall[0] - 2.0 * common / total).abs() < 1e-6);
        assert!((recall[1] - (common + rare) / total).abs() < 1e-6);
        assert!((recall[2] - common / total).abs() < 1e-6);
        // Unweighted, the first two tie (two of three terms in one sentence); weighted, the sentence
        // with the rare term wins.
        assert!(recall[1] > recall[0] && recall[0] > recall[2]);
        // No terms, or no candidates: nothing, not NaN.
        assert_eq!(
            weighted_sentence_recall(&[vec![], vec![]], 0),
            vec![0.0, 0.0]
        );
        assert!(weighted_sentence_recall(&[], 3).is_empty());
    }

    #[test]
    fn the_rerank_adds_the_weighted_sentence_recall_of_its_window() {
        let bm25 = Bm25Encoder::default();
        let plan = analyze("Who was the MVP of Super Bowl 50?", &bm25);
        // Every chunk names Super Bowl 50; only b has a sentence with "MVP" in it.
        let window = || {
            vec![
                candidate(
                    "a",
                    "Super Bowl 50 was played in February. The crowd was large.",
                    0.03,
                ),
                candidate(
                    "b",
                    "Denver won it. The MVP of Super Bowl 50 was Von Miller.",
                    0.03,
                ),
                candidate(
                    "c",
                    "Super Bowl 50 had a halftime show. Tickets sold out.",
                    0.03,
                ),
            ]
        };
        let (mut with, mut without) = (window(), window());
        rerank(&mut with, &plan, &RerankConfig::default(), &bm25);
        let off = RerankConfig {
            weighted_sentence_recall: 0.0,
            ..RerankConfig::default()
        };
        rerank(&mut without, &plan, &off, &bm25);
        let by_doc = |list: &[Candidate], doc: &str| {
            list.iter()
                .find(|c| c.stored.key.doc_id == doc)
                .cloned()
                .unwrap()
        };
        let value = |doc: &str| by_doc(&with, doc).factors["weighted_sentence_recall"];
        // b's second sentence holds every term; a's and c's first hold the three every chunk has,
        // 3 ln(1.75) of 3 ln(1.75) + ln(2.5) (n = 3; "mvp" in one chunk).
        assert_eq!(value("b"), 1.0);
        let common = 3.0 * 1.75f32.ln();
        assert!(
            (value("a") - common / (common + 2.5f32.ln())).abs() < 1e-6,
            "{}",
            value("a")
        );
        assert_eq!(value("a"), value("c"));
        for doc in ["a", "b", "c"] {
            let added = by_doc(&with, doc).score - by_doc(&without, doc).score;
            assert!((added - 0.6 * value(doc)).abs() < 1e-5, "{doc}: {added}");
        }
    }

    #[test]
    fn phrase_counts_the_query_words_next_to_each_other_in_its_order() {
        let bm25 = Bm25Encoder::default();
        // Terms "papal", "legat", "order", "arrest" (stemmed, stop words gone): three pairs.
        let plan = analyze("When did the papal legate order an arrest?", &bm25);
        assert_eq!(plan.pairs.len(), 3, "{plan:?}");
        let phrase = |text: &str| factors(&plan, text, &bm25).phrase;
        // All three, across stop words and inflections ("ordered" stems to "order").
        assert_eq!(
            phrase("The papal legate ordered the arrest of Luther."),
            1.0
        );
        assert_eq!(
            phrase("A papal legate of the church ordered nothing."),
            1.0 / 3.0
        );
        // The same words, none next to its neighbour of the query in the query's order.
        assert_eq!(phrase("Arrest orders came; the legate was papal."), 0.0);
        // A sentence end breaks a pair.
        assert_eq!(
            phrase("He was papal. Legate orders and an arrest followed."),
            2.0 / 3.0
        );
        // So does a word between two terms that is no stop word.
        assert_eq!(phrase("The papal envoy and legate gave orders."), 0.0);
        // A query of one term has no phrases: the feature is 0, not undefined.
        let single = analyze("legate", &bm25);
        assert!(single.pairs.is_empty());
        let value = factors(&single, "legate legate", &bm25).phrase;
        assert_eq!(value, 0.0);
    }

    #[test]
    fn lane_scores_separate_what_ranks_cannot() {
        use crate::query::LaneHit;
        let bm25 = Bm25Encoder::default();
        let plan = analyze("neutral words", &bm25);
        // Same fused score (mirrored lane ranks), but b's BM25 score is far above the rest while a's
        // dense lead is marginal.
        let hit = |rank, score| Some(LaneHit { rank, score });
        let mut a = candidate("a", "nothing", 0.03);
        a.dense = hit(1, 0.61);
        a.bm25 = hit(2, 3.0);
        let mut b = candidate("b", "nothing", 0.03);
        b.dense = hit(2, 0.60);
        b.bm25 = hit(1, 12.0);
        let mut c = candidate("c", "nothing", 0.02);
        c.dense = hit(3, 0.30);
        c.bm25 = hit(3, 1.0);
        let mut candidates = vec![a, b, c];
        rerank(&mut candidates, &plan, &RerankConfig::default(), &bm25);
        assert_eq!(candidates[0].stored.key.doc_id, "b");
        assert!(candidates[0].factors["lane_scores"] > candidates[1].factors["lane_scores"]);
        assert_eq!(candidates[2].factors["lane_scores"], 0.0);
    }
}
