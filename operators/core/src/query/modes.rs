//! The non-default modes and the budget arithmetic, as pure functions.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Candidate, Query, SourceEntry};
use crate::tokens::TokenCounter;

/// How a budget is derived from a model's context window (config section `query.window`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WindowConfig {
    /// Share of the window reserved for the answer when the query does not say (`reserve_output`).
    pub reserve_ratio: f32,
    /// Least tokens reserved for the answer.
    pub min_reserve: usize,
    /// Tokens kept free between the context, the prompt and the answer.
    pub safety_margin: usize,
}

impl Default for WindowConfig {
    fn default() -> Self {
        Self {
            reserve_ratio: 0.25,
            min_reserve: 32,
            safety_margin: 32,
        }
    }
}
/// Above this many tokens, `sql_full` suggests `sql_compact`.
pub const SQL_FULL_HINT_TOKENS: usize = 2000;
/// Sample rows `sql_full` keeps per table.
pub const SQL_SAMPLE_ROWS: usize = 5;

/// A budget derived from a model's context window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Derived {
    /// The model's context window.
    pub window: usize,
    /// Tokens of the prompt (system, template and history).
    pub prompt: usize,
    /// Tokens reserved for the answer.
    pub reserve: usize,
}

/// The context budget, and how it was derived: `window − prompt − reserve − margin` when a context
/// window is given (and at most `token_budget` if both are), the reserve being the query's
/// `reserve_output`, else `reserve_ratio` of what the prompt leaves of the window (at least
/// `min_reserve`); else `token_budget` or `default` (`query.default_token_budget`).
pub fn budget_for(
    query: &Query,
    counter: TokenCounter,
    (rule, default): (&WindowConfig, usize),
) -> (usize, Option<Derived>) {
    let Some(window) = query.context_window else {
        return (query.token_budget.unwrap_or(default), None);
    };
    // Saturating throughout: the decoder bounds each number, and this holds whatever it lets through.
    let prompt = query.prompt.as_ref().map_or(0, |p| {
        p.history.iter().fold(
            counter
                .count(&p.system)
                .saturating_add(counter.count(&p.template)),
            |sum, h| sum.saturating_add(counter.count(h)),
        )
    });
    let remaining = window.saturating_sub(prompt);
    let reserve = query
        .reserve_output
        .unwrap_or(((remaining as f32 * rule.reserve_ratio) as usize).max(rule.min_reserve));
    let mut budget = window.saturating_sub(
        prompt
            .saturating_add(reserve)
            .saturating_add(rule.safety_margin),
    );
    if let Some(limit) = query.token_budget {
        budget = budget.min(limit);
    }
    (
        budget,
        Some(Derived {
            window,
            prompt,
            reserve,
        }),
    )
}

/// Tokens left for the answer once the context is packed (less the window's safety margin).
pub fn max_new_tokens(
    window: usize,
    prompt: usize,
    tokens_used: usize,
    rule: &WindowConfig,
) -> usize {
    window.saturating_sub(
        prompt
            .saturating_add(tokens_used)
            .saturating_add(rule.safety_margin),
    )
}

/// Files ranked by the concentration of chunk hits: `Σ 1/rank · sqrt(hits / chunks)` over the file's
/// chunks among the ranked candidates (rank from 1), so a file whose few chunks all rank high beats a
/// long file with many middling hits.
pub fn rank_files(candidates: &[Candidate], sources: &[SourceEntry], k: usize) -> Vec<SourceEntry> {
    let totals: BTreeMap<&str, &SourceEntry> =
        sources.iter().map(|s| (s.doc_id.as_str(), s)).collect();
    let mut by_doc: BTreeMap<String, (usize, f32, SourceEntry)> = BTreeMap::new();
    for (position, candidate) in candidates.iter().enumerate() {
        let stored = &candidate.stored;
        let entry = by_doc.entry(stored.key.doc_id.clone()).or_insert_with(|| {
            let chunks = totals
                .get(stored.key.doc_id.as_str())
                .map_or(1, |s| s.chunks);
            (
                0,
                0.0,
                SourceEntry {
                    doc_id: stored.key.doc_id.clone(),
                    source: stored.chunk.source.clone(),
                    title: stored.chunk.doc_title.clone(),
                    chunks,
                    hits: None,
                    score: None,
                },
            )
        });
        entry.0 += 1;
        entry.1 += 1.0 / (position + 1) as f32;
    }
    let mut files: Vec<SourceEntry> = by_doc
        .into_values()
        .map(|(hits, sum, mut entry)| {
            let concentration = (hits as f32 / entry.chunks.max(hits) as f32).sqrt();
            entry.hits = Some(hits);
            entry.score = Some(sum * concentration);
            entry
        })
        .collect();
    files.sort_by(|a, b| {
        b.score
            .unwrap_or(0.0)
            .total_cmp(&a.score.unwrap_or(0.0))
            .then_with(|| a.doc_id.cmp(&b.doc_id))
    });
    files.truncate(k);
    files
}

/// A schema table (`sql_compact`: neither distributions nor samples; `sql_full`: both): its line (qualified name, row count) and `name type` per column, with each
/// column's value distribution when `distributions`, and at most 5 sample rows when `samples`.
pub fn sql_table(table_text: &str, distributions: bool, samples: bool) -> String {
    let mut out = Vec::new();
    let mut rows = None;
    for line in table_text.lines() {
        if line.starts_with("Sample rows:") {
            if !samples {
                break;
            }
            rows = Some(0);
            out.push(line.to_string());
            continue;
        }
        if let Some(count) = rows.as_mut() {
            *count += 1;
            if *count > SQL_SAMPLE_ROWS {
                continue;
            }
            out.push(line.to_string());
            continue;
        }
        match line.strip_prefix("- ") {
            Some(column) if !distributions => {
                let column = column.split_once(": ").map_or(column, |(head, _)| head);
                out.push(format!("- {column}"));
            }
            _ => out.push(line.to_string()),
        }
    }
    out.join("\n")
}

/// The error of an unknown `read_chunk` id, listing the documents that exist.
pub fn unknown_chunk(id: &str, sources: &[SourceEntry]) -> String {
    let listed: Vec<String> = sources
        .iter()
        .take(50)
        .map(|s| format!("{} ({} chunks)", s.doc_id, s.chunks))
        .collect();
    let mut message = format!(
        "no chunk {id:?} for this tenant; read_chunk takes a chunk_id from a context's items. Available documents: {}",
        if listed.is_empty() { "none".to_string() } else { listed.join(", ") }
    );
    if sources.len() > listed.len() {
        message.push_str(" and more (list_sources pages through them all)");
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::decode::decode_query;
    use crate::query::fuse::tests::stored;
    use crate::query::DEFAULT_BUDGET;
    use crate::tokens::Encoding;

    const TABLE: &str = "Table shop.public.orders (1200 rows)\nColumns:\n- id bigint: {\"min\":1,\"max\":1200}\n- email text: {\"distinct\":900}\nSample rows:\n{\"id\":1}\n{\"id\":2}\n{\"id\":3}\n{\"id\":4}\n{\"id\":5}\n{\"id\":6}";

    #[test]
    fn sql_renderings() {
        let compact = "Table shop.public.orders (1200 rows)\nColumns:\n- id bigint\n- email text";
        assert_eq!(sql_table(TABLE, false, false), compact);
        let full = sql_table(TABLE, true, true);
        assert!(full.contains("\"min\":1"));
        assert!(full.contains("{\"id\":5}"));
        assert!(!full.contains("{\"id\":6}"));
        // Each part on its own: distributions without rows, rows without distributions.
        assert_eq!(
            sql_table(TABLE, true, false),
            "Table shop.public.orders (1200 rows)\nColumns:\n- id bigint: {\"min\":1,\"max\":1200}\n- email text: {\"distinct\":900}"
        );
        let rows = sql_table(TABLE, false, true);
        assert!(rows.starts_with(&format!("{compact}\nSample rows:\n{{\"id\":1}}")));
        assert!(rows.contains("{\"id\":5}") && !rows.contains("{\"id\":6}"));
        assert!(!rows.contains("min"));
    }

    #[test]
    fn budget_from_window_and_prompt() {
        let counter = TokenCounter::new(Encoding::O200kBase);
        let rule = WindowConfig::default();
        let query = decode_query(
            br#"{"query_id":"q","tenant":"t","text":"x","context_window":8000,"prompt":{"system":"You are helpful.","template":"Answer: {context}","history":["hi","hello"]}}"#,
            8192,
        )
        .unwrap();
        let (budget, derived) = budget_for(&query, counter, (&rule, DEFAULT_BUDGET));
        let Derived {
            window: w,
            prompt,
            reserve,
        } = derived.unwrap();
        assert_eq!(w, 8000);
        assert!(prompt > 5 && prompt < 20);
        // The reserve is a quarter of what the prompt leaves, not of the whole window.
        assert_eq!(reserve, (8000 - prompt) / 4);
        assert!(reserve < 2000);
        assert_eq!(budget, 8000 - prompt - reserve - rule.safety_margin);
        assert_eq!(max_new_tokens(8000, prompt, budget, &rule), reserve);
        // A long prompt leaves less, and the reserve shrinks with it.
        let long = decode_query(
            br#"{"query_id":"q","tenant":"t","text":"x","context_window":1000,"prompt":{"system":"word word word word word word word word word word word word word word word word word word word word"}}"#,
            8192,
        )
        .unwrap();
        let (_, derived) = budget_for(&long, counter, (&rule, DEFAULT_BUDGET));
        let derived = derived.unwrap();
        assert!(derived.prompt >= 20);
        assert_eq!(derived.reserve, (1000 - derived.prompt) / 4);
        // A small window: the reserve is at least 32.
        let small = decode_query(
            br#"{"query_id":"q","tenant":"t","text":"x","context_window":100}"#,
            8192,
        )
        .unwrap();
        assert_eq!(
            budget_for(&small, counter, (&rule, DEFAULT_BUDGET)).0,
            100 - 32 - 32
        );
        // token_budget caps the derived budget; no window: token_budget or the default.
        let capped = decode_query(
            br#"{"query_id":"q","tenant":"t","text":"x","context_window":8000,"token_budget":500}"#,
            8192,
        )
        .unwrap();
        assert_eq!(budget_for(&capped, counter, (&rule, DEFAULT_BUDGET)).0, 500);
        let plain = decode_query(br#"{"query_id":"q","tenant":"t","text":"x"}"#, 8192).unwrap();
        assert_eq!(
            budget_for(&plain, counter, (&rule, DEFAULT_BUDGET)),
            (DEFAULT_BUDGET, None)
        );
        // The rule is the config's: no reserve floor, a wider margin.
        let wide = WindowConfig {
            reserve_ratio: 0.0,
            min_reserve: 0,
            safety_margin: 100,
        };
        assert_eq!(budget_for(&small, counter, (&wide, DEFAULT_BUDGET)).0, 0);
        assert_eq!(budget_for(&capped, counter, (&wide, DEFAULT_BUDGET)).0, 500);
        let (budget, _) = budget_for(&query, counter, (&wide, DEFAULT_BUDGET));
        assert_eq!(budget, 8000 - prompt - 100);
    }

    #[test]
    fn files_by_concentration() {
        let candidate = |doc: &str, order: u32, score: f32| {
            let mut c = Candidate::new(stored(doc, order, doc));
            c.score = score;
            c
        };
        let sources = vec![
            SourceEntry {
                doc_id: "big".into(),
                source: "big".into(),
                title: String::new(),
                chunks: 100,
                hits: None,
                score: None,
            },
            SourceEntry {
                doc_id: "small".into(),
                source: "small".into(),
                title: String::new(),
                chunks: 2,
                hits: None,
                score: None,
            },
        ];
        // Two hits in a 2-chunk file beat three in a 100-chunk file.
        let candidates = vec![
            candidate("big", 0, 1.0),
            candidate("big", 1, 1.0),
            candidate("big", 2, 1.0),
            candidate("small", 0, 0.9),
            candidate("small", 1, 0.9),
        ];
        let files = rank_files(&candidates, &sources, 10);
        assert_eq!(files[0].doc_id, "small");
        assert_eq!(files[0].hits, Some(2));
        assert_eq!(files[1].hits, Some(3));
    }

    #[test]
    fn unknown_chunk_lists_documents() {
        let sources = vec![SourceEntry {
            doc_id: "a".into(),
            source: "a".into(),
            title: String::new(),
            chunks: 3,
            hits: None,
            score: None,
        }];
        let message = unknown_chunk("nope", &sources);
        assert!(message.contains("a (3 chunks)"));
    }
}
