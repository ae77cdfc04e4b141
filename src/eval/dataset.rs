//! The evaluation sets: BEIR corpora, queries, qrels and answers, and the events that index them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use serde_json::{json, Value};

use super::*;

/// One evaluation query: id, text, answer strings, graded relevant documents.
pub(super) type EvalQuery = (String, String, Vec<String>, BTreeMap<String, u32>);

pub(super) struct Dataset {
    pub(super) tenant: String,
    pub(super) corpus: PathBuf,
    pub(super) queries: Vec<EvalQuery>,
    /// The kind its documents are indexed as, and the extension their sources get.
    pub(super) kind: &'static str,
    pub(super) extension: &'static str,
}

/// Graded relevance per query from a BEIR qrels file (`query-id corpus-id score`, a header line).
pub(super) fn read_qrels(path: &Path) -> anyhow::Result<HashMap<String, BTreeMap<String, u32>>> {
    let qrels =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut relevant: HashMap<String, BTreeMap<String, u32>> = HashMap::new();
    for line in qrels.lines().skip(1) {
        let fields: Vec<&str> = line.split('\t').collect();
        if fields.len() == 3 {
            let score: u32 = fields[2].trim().parse().unwrap_or(0);
            if score > 0 {
                relevant
                    .entry(fields[0].to_string())
                    .or_default()
                    .insert(fields[1].to_string(), score);
            }
        }
    }
    Ok(relevant)
}

pub(super) fn read_jsonl(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("parsing {}", path.display())))
        .collect()
}

pub(super) fn dataset(args: &EvalArgs) -> anyhow::Result<Dataset> {
    let str_of = |v: &Value, k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    match args.dataset.as_str() {
        "squad" => {
            let root = args.data.join("squad-v1.1");
            let queries = read_jsonl(&root.join("questions.jsonl"))?
                .into_iter()
                .map(|q| {
                    let answers = q
                        .get("answers")
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .filter_map(Value::as_str)
                                .map(str::to_string)
                                .collect()
                        })
                        .unwrap_or_default();
                    let relevant = BTreeMap::from([(str_of(&q, "paragraph"), 1)]);
                    (str_of(&q, "_id"), str_of(&q, "text"), answers, relevant)
                })
                .collect();
            Ok(Dataset {
                tenant: "squad".into(),
                corpus: root.join("corpus.jsonl"),
                queries,
                kind: "prose",
                extension: "",
            })
        }
        "scifact" | "cosqa" => {
            let (root, qrels) = match args.dataset.as_str() {
                "scifact" => (args.data.join("scifact"), "qrels/train.tsv"),
                _ => (args.data.join("cosqa"), "qrels/dev.tsv"),
            };
            let relevant = read_qrels(&root.join(qrels))?;
            let queries = read_jsonl(&root.join("queries.jsonl"))?
                .into_iter()
                .filter_map(|q| {
                    let id = str_of(&q, "_id");
                    let judged = relevant.get(&id)?.clone();
                    Some((id, str_of(&q, "text"), Vec::new(), judged))
                })
                .collect();
            let code = args.dataset == "cosqa";
            Ok(Dataset {
                tenant: args.dataset.clone(),
                corpus: root.join("corpus.jsonl"),
                queries,
                kind: if code { "code" } else { "prose" },
                extension: if code { ".py" } else { "" },
            })
        }
        other => bail!("unknown dataset {other:?} (squad, scifact or cosqa)"),
    }
}

/// Writes the corpus as document events (tenant = dataset, source = `<tenant>/<_id><extension>`, of
/// `kind`); with `sample = (n, judged)`, only the first `n` documents and those in `judged`. Answers
/// the number of documents written.
pub(super) fn write_events(
    corpus: &Path,
    tenant: &str,
    (kind, extension): (&str, &str),
    sample: Option<(usize, &BTreeSet<String>)>,
    out: &Path,
) -> anyhow::Result<usize> {
    let docs = read_jsonl(corpus)?;
    let mut lines = String::new();
    let mut written = 0;
    for (position, doc) in docs.iter().enumerate() {
        let id = doc.get("_id").and_then(Value::as_str).unwrap_or_default();
        if sample.is_some_and(|(first, judged)| position >= first && !judged.contains(id)) {
            continue;
        }
        written += 1;
        let event = json!({
            "op": "upsert",
            "tenant": tenant,
            "doc_id": id,
            "version": 1,
            "source": format!("{tenant}/{id}{extension}"),
            "kind": kind,
            "title": doc.get("title").and_then(Value::as_str).unwrap_or_default(),
            "text": doc.get("text").and_then(Value::as_str).unwrap_or_default(),
        });
        lines.push_str(&event.to_string());
        lines.push('\n');
    }
    std::fs::write(out, lines).with_context(|| format!("writing {}", out.display()))?;
    Ok(written)
}
