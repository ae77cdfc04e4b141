//! What `ragstream eval` measures: nDCG, recall, answer recall, redundancy, garbage, latency.

use std::collections::{BTreeMap, BTreeSet};

use ragstream_core::query::Context;
use ragstream_operators::text::sentences;
use ragstream_operators::tokens::TokenCounter;
use serde_json::{json, Value};

use super::*;

pub(super) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

pub(super) fn latency_summary(mut values: Vec<f64>) -> Value {
    values.sort_by(|a, b| a.total_cmp(b));
    json!({
        "p50_ms": percentile(&values, 50.0),
        "p95_ms": percentile(&values, 95.0),
        "p99_ms": percentile(&values, 99.0),
        "max_ms": values.last().copied().unwrap_or(0.0),
    })
}

pub(super) fn ndcg_at(ranked: &[String], relevant: &BTreeMap<String, u32>, k: usize) -> f64 {
    let dcg: f64 = ranked
        .iter()
        .take(k)
        .enumerate()
        .map(|(i, doc)| {
            relevant.get(doc).map_or(0.0, |&g| {
                (2f64.powi(g as i32) - 1.0) / ((i + 2) as f64).log2()
            })
        })
        .sum();
    let mut ideal: Vec<u32> = relevant.values().copied().collect();
    ideal.sort_unstable_by(|a, b| b.cmp(a));
    let idcg: f64 = ideal
        .iter()
        .take(k)
        .enumerate()
        .map(|(i, &g)| (2f64.powi(g as i32) - 1.0) / ((i + 2) as f64).log2())
        .sum();
    if idcg == 0.0 {
        0.0
    } else {
        dcg / idcg
    }
}

pub(super) fn recall_at(ranked: &[String], relevant: &BTreeMap<String, u32>, k: usize) -> f64 {
    if relevant.is_empty() {
        return 0.0;
    }
    let found = ranked
        .iter()
        .take(k)
        .filter(|d| relevant.contains_key(*d))
        .count();
    found as f64 / relevant.len() as f64
}

pub(super) fn normalise(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

pub(super) fn answered(context: &str, answers: &[String]) -> bool {
    let haystack = normalise(context);
    answers.iter().any(|a| {
        let needle = normalise(a);
        !needle.is_empty() && haystack.contains(&needle)
    })
}

/// Packed item tokens ÷ tokens of their distinct sentences (of their distinct non-blank lines, for
/// code: `by_lines`).
pub(super) fn redundancy(
    items: &[(String, String)],
    counter: TokenCounter,
    by_lines: bool,
) -> (usize, usize) {
    let mut seen = BTreeSet::new();
    let mut distinct = Vec::new();
    let mut packed = 0;
    for (_, text) in items {
        packed += counter.count(text);
        let units: Vec<(usize, usize)> = if by_lines {
            let mut at = 0;
            text.split_inclusive('\n')
                .map(|line| {
                    let span = (at, at + line.len());
                    at += line.len();
                    span
                })
                .filter(|&(a, b)| !text[a..b].trim().is_empty())
                .collect()
        } else {
            sentences(text)
        };
        for (a, b) in units {
            let sentence = normalise(&text[a..b]);
            if seen.insert(sentence) {
                distinct.push(&text[a..b]);
            }
        }
    }
    let distinct_tokens = distinct.iter().map(|s| counter.count(s)).sum();
    (packed, distinct_tokens)
}

/// Tokens of items from documents outside `relevant` (and, with answers, holding no answer).
pub(super) fn garbage(
    items: &[(String, String)],
    relevant: &BTreeMap<String, u32>,
    answers: &[String],
    counter: TokenCounter,
) -> (usize, usize) {
    let mut bad = 0;
    let mut total = 0;
    for (doc, text) in items {
        let tokens = counter.count(text);
        total += tokens;
        if !relevant.contains_key(doc) && !answered(text, answers) {
            bad += tokens;
        }
    }
    (bad, total)
}

#[derive(Default)]
pub(super) struct Tally {
    /// Redundancy counted by lines (code) rather than sentences.
    pub(super) by_lines: bool,
    pub(super) answered: usize,
    pub(super) overruns: usize,
    pub(super) packed: usize,
    pub(super) distinct: usize,
    pub(super) garbage: usize,
    pub(super) item_tokens: usize,
    pub(super) used: usize,
    pub(super) contexts: usize,
}

impl Tally {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add(
        &mut self,
        items: &[(String, String)],
        context: &str,
        tokens_used: usize,
        budget: usize,
        relevant: &BTreeMap<String, u32>,
        answers: &[String],
        counter: TokenCounter,
    ) {
        self.contexts += 1;
        if !answers.is_empty() && answered(context, answers) {
            self.answered += 1;
        }
        // Recounted by tiktoken in one call, not by the job's piece-cached counter: an overrun would
        // show even if the two disagreed.
        if tokens_used > budget || counter.count_whole(context) > budget {
            self.overruns += 1;
        }
        let (packed, distinct) = redundancy(items, counter, self.by_lines);
        self.packed += packed;
        self.distinct += distinct;
        let (bad, total) = garbage(items, relevant, answers, counter);
        self.garbage += bad;
        self.item_tokens += total;
        self.used += tokens_used;
    }

    pub(super) fn report(&self, with_answers: bool) -> Value {
        let n = self.contexts.max(1) as f64;
        let mut out = json!({
            "contexts": self.contexts,
            "overruns": self.overruns,
            "overrun_rate": self.overruns as f64 / n,
            "redundancy_ratio": self.packed as f64 / self.distinct.max(1) as f64,
            "garbage_fraction": self.garbage as f64 / self.item_tokens.max(1) as f64,
            "mean_tokens_used": self.used as f64 / n,
        });
        if with_answers {
            out["answer_recall"] = json!(self.answered as f64 / n);
        }
        out
    }
}

/// One JSONL line per question and budget: answered or not, where the gold document ranked, the
/// ranked candidates with their lane ranks and rerank factors, what was packed and why.
pub(super) fn detail_line(query: &EvalQuery, budget: usize, context: &Context) -> String {
    let (id, text, answers, relevant) = query;
    let ranked: Vec<&str> = context
        .trace
        .as_ref()
        .map(|t| t.candidates.iter().map(|c| c.doc_id.as_str()).collect())
        .unwrap_or_default();
    let gold_rank = ranked.iter().position(|d| relevant.contains_key(*d));
    let gold_decisions: Vec<String> = context
        .trace
        .as_ref()
        .map(|t| {
            t.decisions
                .iter()
                .filter(|d| {
                    t.candidates
                        .iter()
                        .any(|c| c.chunk_id == d.chunk_id && relevant.contains_key(&c.doc_id))
                })
                .map(|d| format!("{} {}: {}", d.step.as_str(), d.action.as_str(), d.reason))
                .collect()
        })
        .unwrap_or_default();
    let items: Vec<Value> = context
        .items
        .iter()
        .map(|i| {
            json!({
                "doc": i.doc_id,
                "tier": i.tier,
                "tokens": i.tokens,
                "gold": relevant.contains_key(&i.doc_id),
                "text": i.text,
            })
        })
        .collect();
    let mut line = json!({
        "id": id,
        "question": text,
        "answers": answers,
        "budget": budget,
        "intent": context.intent_name(),
        "gold_rank": gold_rank,
        "gold_decisions": gold_decisions,
        "answered": answered(&context.context, answers),
        "candidates": context.trace.as_ref().map(|t| t.candidates.iter().map(|c| json!({
            "doc": c.doc_id,
            "gold": relevant.contains_key(&c.doc_id),
            "dense": c.dense,
            "bm25": c.bm25,
            "fused": c.fused,
            "factors": c.factors,
            "score": c.score,
        })).collect::<Vec<_>>()),
        "items": items,
    })
    .to_string();
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use ragstream_operators::tokens::Encoding;

    fn relevant(grades: &[(&str, u32)]) -> BTreeMap<String, u32> {
        grades.iter().map(|(d, g)| (d.to_string(), *g)).collect()
    }

    fn ranked(docs: &[&str]) -> Vec<String> {
        docs.iter().map(|d| d.to_string()).collect()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn ndcg_against_hand_computed_values() {
        // DCG = (2^1 - 1)/log2(3) + (2^2 - 1)/log2(4) = 0.63093 + 1.5; the ideal order (grade 2, then
        // 1) gives 3/log2(2) + 1/log2(3) = 3.63093; nDCG = 2.13093 / 3.63093 = 0.586883.
        let grades = relevant(&[("b", 1), ("c", 2)]);
        let order = ranked(&["a", "b", "c"]);
        assert!(close(ndcg_at(&order, &grades, 3), 0.586_882_671_435_72));
        // The best document first and the other second: the ideal order.
        assert!(close(ndcg_at(&ranked(&["c", "b", "a"]), &grades, 3), 1.0));
        // Nothing relevant in the cut-off: 0; no judgements at all: 0, not NaN.
        assert_eq!(ndcg_at(&order, &grades, 1), 0.0);
        assert_eq!(ndcg_at(&order, &BTreeMap::new(), 3), 0.0);
        // The cut-off applies to the ideal too: at k = 1 only the best grade counts.
        assert!(close(ndcg_at(&ranked(&["c"]), &grades, 1), 1.0));
    }

    #[test]
    fn recall_counts_relevant_documents_within_the_cut_off() {
        let grades = relevant(&[("b", 1), ("c", 1), ("d", 1)]);
        let order = ranked(&["a", "b", "c"]);
        assert!(close(recall_at(&order, &grades, 2), 1.0 / 3.0));
        assert!(close(recall_at(&order, &grades, 10), 2.0 / 3.0));
        assert_eq!(recall_at(&order, &BTreeMap::new(), 10), 0.0);
    }

    #[test]
    fn an_answer_counts_up_to_case_and_spacing_and_never_when_empty() {
        let context = "The Eiffel\n  Tower was completed in 1889.";
        assert!(answered(context, &["eiffel tower".into()]));
        assert!(answered(context, &["1890".into(), "IN 1889".into()]));
        assert!(!answered(context, &["1890".into()]));
        assert!(!answered(context, &[" ".into()]));
        assert!(!answered(context, &[]));
    }

    #[test]
    fn redundancy_counts_each_distinct_sentence_once() {
        let counter = TokenCounter::new(Encoding::default());
        let sentence = "Tides rise twice a day.";
        let once = counter.count(sentence);
        // The same sentence packed twice: twice its tokens packed, once distinct.
        let twice = [("a".into(), sentence.into()), ("b".into(), sentence.into())];
        assert_eq!(redundancy(&twice, counter, false), (2 * once, once));
        // Case and spacing do not make a sentence distinct.
        let shouted = [
            ("a".into(), sentence.into()),
            ("b".into(), "TIDES  rise twice a day.".into()),
        ];
        let (packed, distinct) = redundancy(&shouted, counter, false);
        assert_eq!(distinct, once);
        assert_eq!(packed, once + counter.count("TIDES  rise twice a day."));
        // Code: distinct non-blank lines.
        let code = [
            ("a".into(), "let x = 1;\n\nlet y = 2;\n".into()),
            ("b".into(), "let x = 1;\n".into()),
        ];
        let (packed, distinct) = redundancy(&code, counter, true);
        assert_eq!(
            packed,
            counter.count("let x = 1;\n\nlet y = 2;\n") + counter.count("let x = 1;\n")
        );
        assert_eq!(
            distinct,
            counter.count("let x = 1;\n") + counter.count("let y = 2;\n")
        );
    }

    #[test]
    fn garbage_is_tokens_of_items_neither_relevant_nor_answering() {
        let counter = TokenCounter::new(Encoding::default());
        let items = [
            ("gold".into(), "The tower opened in 1889.".into()),
            ("other".into(), "Its engineer saw it open in 1889.".into()),
            ("junk".into(), "Bread needs flour, water and salt.".into()),
        ];
        let grades = relevant(&[("gold", 1)]);
        let (bad, total) = garbage(&items, &grades, &["1889".into()], counter);
        let tokens: Vec<usize> = items.iter().map(|(_, t)| counter.count(t)).collect();
        assert_eq!(bad, tokens[2]);
        assert_eq!(total, tokens.iter().sum::<usize>());
        // Without answers only the relevant document is clean.
        let (bad, _) = garbage(&items, &grades, &[], counter);
        assert_eq!(bad, tokens[1] + tokens[2]);
    }

    #[test]
    fn the_tally_reports_rates_over_its_contexts() {
        let counter = TokenCounter::new(Encoding::default());
        let grades = relevant(&[("gold", 1)]);
        let answers = vec!["1889".to_string()];
        let mut tally = Tally::default();
        let hit = [("gold".to_string(), "Opened in 1889.".to_string())];
        let miss = [("junk".to_string(), "Bread needs flour.".to_string())];
        tally.add(&hit, "Opened in 1889.", 5, 100, &grades, &answers, counter);
        // Says it used 120 of a 100-token budget: an overrun.
        tally.add(
            &miss,
            "Bread needs flour.",
            120,
            100,
            &grades,
            &answers,
            counter,
        );
        let report = tally.report(true);
        assert_eq!(report["contexts"], 2);
        assert_eq!(report["overruns"], 1);
        assert_eq!(report["answer_recall"], 0.5);
        assert_eq!(report["mean_tokens_used"], 62.5);
        let junk = counter.count("Bread needs flour.") as f64;
        let all = junk + counter.count("Opened in 1889.") as f64;
        assert!(close(
            report["garbage_fraction"].as_f64().expect("a number"),
            junk / all
        ));
        assert!(tally.report(false).get("answer_recall").is_none());
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let sorted = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(percentile(&sorted, 50.0), 3.0);
        assert_eq!(percentile(&sorted, 99.0), 5.0);
        assert_eq!(percentile(&sorted, 0.0), 1.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }
}
