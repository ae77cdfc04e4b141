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
    /// Where the reserve came from.
    pub reserve_from: ReserveFrom,
}

/// Where a derived budget's answer reserve came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ReserveFrom {
    /// The query's `reserve_output`.
    ReserveOutput,
    /// `[query.window] reserve_ratio` of what the prompt leaves of the window.
    ReserveRatio,
    /// `[query.window] min_reserve`, the ratio's share being smaller.
    MinReserve,
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
    let share = (remaining as f32 * rule.reserve_ratio) as usize;
    let (reserve, reserve_from) = match query.reserve_output {
        Some(reserve) => (reserve, ReserveFrom::ReserveOutput),
        None if share >= rule.min_reserve => (share, ReserveFrom::ReserveRatio),
        None => (rule.min_reserve, ReserveFrom::MinReserve),
    };
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
            reserve_from,
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

/// Most candidates per lane a `files` query may ask for (`pool`).
pub const MAX_FILES_POOL: usize = 500;

/// What `files` groups its candidates by (the query's `file_key`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum FileKey {
    /// The document (the default).
    #[default]
    DocId,
    /// The document's source (documents sharing a source are one file).
    Source,
    /// The directory of the source: everything before its last `/` (`.` for none).
    Directory,
    /// A metadata value (`metadata.<key>`): documents without the key form one group, `""`.
    Metadata(String),
}

impl FileKey {
    /// `doc_id`, `source`, `directory` or `metadata.<key>`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "doc_id" => Ok(Self::DocId),
            "source" => Ok(Self::Source),
            "directory" => Ok(Self::Directory),
            _ => match text.strip_prefix("metadata.") {
                Some(key) => {
                    crate::metadata::check_key(key)?;
                    Ok(Self::Metadata(key.to_string()))
                }
                None => Err(format!(
                    "file_key must be doc_id, source, directory or metadata.<key>, got {:?}",
                    text.chars().take(64).collect::<String>()
                )),
            },
        }
    }

    /// The group a file (one of the candidates' documents) falls in.
    fn of(&self, entry: &SourceEntry, metadata: &crate::metadata::Metadata) -> String {
        match self {
            Self::DocId => entry.doc_id.clone(),
            Self::Source => entry.source.clone(),
            Self::Directory => entry
                .source
                .rsplit_once('/')
                .map_or(".", |(dir, _)| dir)
                .to_string(),
            Self::Metadata(key) => match metadata.to_object().get(key) {
                None | Some(serde_json::Value::Null) => String::new(),
                Some(serde_json::Value::String(text)) => text.clone(),
                Some(other) => other.to_string(),
            },
        }
    }
}

/// Files ranked by the concentration of chunk hits: `Σ 1/rank · sqrt(hits / chunks)` over the file's
/// chunks among the ranked candidates (rank from 1), so a file whose few chunks all rank high beats a
/// long file with many middling hits. With a `key` other than the document, a group's hits, rank
/// sum and chunks are its documents' sums (chunks of the documents found among the candidates).
pub fn rank_files(
    candidates: &[Candidate],
    sources: &[SourceEntry],
    k: usize,
    key: &FileKey,
) -> Vec<SourceEntry> {
    let totals: BTreeMap<&str, &SourceEntry> =
        sources.iter().map(|s| (s.doc_id.as_str(), s)).collect();
    // Per document: hits, Σ 1/rank, the entry, its metadata.
    let mut by_doc: BTreeMap<String, (usize, f32, SourceEntry, &crate::metadata::Metadata)> =
        BTreeMap::new();
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
                    group: None,
                    documents: None,
                },
                &stored.chunk.metadata,
            )
        });
        entry.0 += 1;
        entry.1 += 1.0 / (position + 1) as f32;
    }
    // Per group: hits, Σ 1/rank, chunks, documents, the best document's entry and its Σ.
    let mut groups: BTreeMap<String, (usize, f32, usize, usize, SourceEntry, f32)> =
        BTreeMap::new();
    for (hits, sum, entry, metadata) in by_doc.into_values() {
        let name = key.of(&entry, metadata);
        let chunks = entry.chunks.max(hits);
        match groups.get_mut(&name) {
            Some(group) => {
                group.0 += hits;
                group.1 += sum;
                group.2 = group.2.saturating_add(chunks);
                group.3 += 1;
                if sum > group.5 {
                    (group.4, group.5) = (entry, sum);
                }
            }
            None => {
                groups.insert(name, (hits, sum, chunks, 1, entry, sum));
            }
        }
    }
    let grouped = *key != FileKey::DocId;
    let mut files: Vec<SourceEntry> = groups
        .into_iter()
        .map(|(name, (hits, sum, chunks, documents, mut entry, _))| {
            let concentration = (hits as f32 / chunks.max(hits) as f32).sqrt();
            entry.chunks = chunks;
            entry.hits = Some(hits);
            entry.score = Some(sum * concentration);
            if grouped {
                entry.group = Some(name);
                entry.documents = Some(documents);
            }
            entry
        })
        .collect();
    files.sort_by(|a, b| {
        b.score
            .unwrap_or(0.0)
            .total_cmp(&a.score.unwrap_or(0.0))
            .then_with(|| a.group.cmp(&b.group))
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
            reserve_from,
        } = derived.unwrap();
        assert_eq!(reserve_from, ReserveFrom::ReserveRatio);
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
        let (budget, derived) = budget_for(&small, counter, (&rule, DEFAULT_BUDGET));
        assert_eq!(budget, 100 - 32 - 32);
        assert_eq!(derived.unwrap().reserve_from, ReserveFrom::MinReserve);
        let asked = decode_query(
            br#"{"query_id":"q","tenant":"t","text":"x","context_window":1000,"reserve_output":100}"#,
            8192,
        )
        .unwrap();
        let (budget, derived) = budget_for(&asked, counter, (&rule, DEFAULT_BUDGET));
        assert_eq!(budget, 1000 - 100 - 32);
        assert_eq!(derived.unwrap().reserve_from, ReserveFrom::ReserveOutput);
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
                group: None,
                documents: None,
            },
            SourceEntry {
                doc_id: "small".into(),
                source: "small".into(),
                title: String::new(),
                chunks: 2,
                hits: None,
                score: None,
                group: None,
                documents: None,
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
        let files = rank_files(&candidates, &sources, 10, &FileKey::DocId);
        assert_eq!(files[0].doc_id, "small");
        assert_eq!(files[0].hits, Some(2));
        assert_eq!(files[1].hits, Some(3));
    }

    #[test]
    fn files_group_by_source_directory_or_a_metadata_value() {
        let candidate = |doc: &str, dir: &str, repo: Option<&str>| {
            let mut stored = stored(doc, 0, doc);
            stored.chunk.source = format!("{dir}/{doc}.rs");
            if let Some(repo) = repo {
                stored.chunk.metadata =
                    crate::metadata::Metadata::parse(&serde_json::json!({ "repo": repo })).unwrap();
            }
            Candidate::new(stored)
        };
        let entry = |doc: &str, dir: &str, chunks: usize| SourceEntry {
            doc_id: doc.into(),
            source: format!("{dir}/{doc}.rs"),
            title: String::new(),
            chunks,
            hits: None,
            score: None,
            group: None,
            documents: None,
        };
        let sources = vec![
            entry("a", "src/query", 4),
            entry("b", "src/query", 6),
            entry("c", "src/store", 2),
            entry("d", "lib", 3),
        ];
        let candidates = vec![
            candidate("c", "src/store", Some("core")),
            candidate("a", "src/query", Some("core")),
            candidate("b", "src/query", Some("app")),
            candidate("a", "src/query", Some("core")),
            candidate("d", "lib", None),
        ];
        // By document: four files, each its own group, no group fields.
        let docs = rank_files(&candidates, &sources, 10, &FileKey::DocId);
        assert_eq!(docs.len(), 4);
        assert!(docs
            .iter()
            .all(|f| f.group.is_none() && f.documents.is_none()));
        // By directory: src/query holds a and b (3 hits of 10 chunks), its best document a.
        let dirs = rank_files(&candidates, &sources, 10, &FileKey::Directory);
        let query = dirs
            .iter()
            .find(|f| f.group.as_deref() == Some("src/query"))
            .unwrap();
        assert_eq!(
            (query.hits, query.chunks, query.documents),
            (Some(3), 10, Some(2))
        );
        assert_eq!(query.doc_id, "a");
        // Σ 1/rank = 1/2 + 1/3 + 1/4 over sqrt(3/10).
        let expected = (0.5 + 1.0 / 3.0 + 0.25) * (0.3f32).sqrt();
        assert!((query.score.unwrap() - expected).abs() < 1e-6);
        // src/store: one hit at rank 1 of 2 chunks, 1 · sqrt(1/2), ranks first.
        assert_eq!(dirs[0].group.as_deref(), Some("src/store"));
        assert_eq!(dirs.len(), 3);
        // By a metadata value: core (a, c), app (b), and "" for d, which has no repo.
        let repos = rank_files(
            &candidates,
            &sources,
            10,
            &FileKey::parse("metadata.repo").unwrap(),
        );
        let mut names: Vec<_> = repos.iter().map(|f| f.group.clone().unwrap()).collect();
        names.sort();
        assert_eq!(names, vec!["", "app", "core"]);
        let core = repos
            .iter()
            .find(|f| f.group.as_deref() == Some("core"))
            .unwrap();
        assert_eq!(
            (core.hits, core.chunks, core.documents),
            (Some(3), 6, Some(2))
        );
        // By source, with k: one entry per source, the best only.
        assert_eq!(
            rank_files(&candidates, &sources, 1, &FileKey::Source).len(),
            1
        );
        // Keys are checked.
        assert!(FileKey::parse("path").unwrap_err().contains("file_key"));
        assert!(FileKey::parse("metadata.").is_err());
        assert!(FileKey::parse("metadata.a b").is_err());
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
            group: None,
            documents: None,
        }];
        let message = unknown_chunk("nope", &sources);
        assert!(message.contains("a (3 chunks)"));
    }
}
