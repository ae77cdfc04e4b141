//! `ragstream bench edits`: how many chunks one small edit costs to embed.
//!
//! Three documents of at least 100 chunks with the job's default chunker: prose (SQuAD paragraphs of
//! the corpus, in order, separated by blank lines), markdown (the same paragraphs under a heading per
//! article) and code (this repository's Rust sources under `--code`, concatenated in path order). On
//! each, one paragraph (a block between blank lines; a heading is never the one edited) at the head,
//! the middle and the tail is inserted before, deleted, or changed (a sentence or a line added after
//! its first one). Each edited text is chunked and diffed against the original exactly as the ingest
//! flow does ([`diff_chunk_sets`]); the report counts, per edit, the chunks embedded, the chunks
//! rewritten with their stored vectors (moved) and the chunks deleted.

use std::path::{Path, PathBuf};

use anyhow::Context;
use ragstream_operators::ingest::chunk::{Chunker, ChunkerConfig};
use ragstream_operators::ingest::diff::diff_chunk_sets;
use ragstream_operators::model::{ChunkSet, DocKey, DocKind, Document};
use serde_json::json;

/// Arguments of `bench edits`.
#[derive(clap::Args, Debug)]
pub struct EditsBench {
    /// BEIR corpus (`{_id, title, text}` per line) for the prose and markdown documents.
    #[arg(long, default_value = "../shared/data/squad-v1.1/corpus.jsonl")]
    pub corpus: PathBuf,
    /// A directory of Rust sources for the code document.
    #[arg(long, default_value = "operators/src")]
    pub code: PathBuf,
    /// Chunks each document reaches at least.
    #[arg(long, default_value_t = 100)]
    pub chunks: usize,
}

/// A paragraph inserted into prose and markdown.
const NEW_PARAGRAPH: &str =
    "An inserted paragraph talks about something else entirely. It has two \
sentences, and the second one is a little longer than the first.";
/// An item inserted into code.
const NEW_ITEM: &str = "/// An inserted helper.\nfn inserted_helper(values: &[u32]) -> u32 {\n    \
values.iter().copied().max().unwrap_or(0)\n}";

/// Runs the benchmark and returns its report as JSON.
pub fn edits(args: EditsBench) -> anyhow::Result<serde_json::Value> {
    let chunker = Chunker::new(ChunkerConfig::default());
    let corpus = crate::bench::read_corpus(&args.corpus)?;
    let mut documents = Vec::new();
    for kind in [DocKind::Prose, DocKind::Markdown, DocKind::Code] {
        let text = match kind {
            DocKind::Code => code_text(&chunker, &args.code, args.chunks)?,
            _ => prose_text(&chunker, &corpus, kind, args.chunks),
        };
        documents.push((kind, text));
    }
    let mut cases = Vec::new();
    let mut worst = serde_json::Map::new();
    for (kind, text) in &documents {
        let original = chunk_set(&chunker, *kind, text, 1);
        let blocks: Vec<&str> = text.split("\n\n").collect();
        let editable: Vec<usize> = (0..blocks.len())
            .filter(|&i| !blocks[i].trim_start().starts_with('#') || *kind == DocKind::Code)
            .filter(|&i| !blocks[i].trim().is_empty())
            .collect();
        let mut most = 0;
        for (position, at) in [
            ("head", editable[0]),
            ("middle", editable[editable.len() / 2]),
            ("tail", editable[editable.len() - 1]),
        ] {
            for operation in ["insert", "delete", "change"] {
                let edited = edit(&blocks, at, operation, *kind);
                let new = chunk_set(&chunker, *kind, &edited, 2);
                let key = DocKey::new("bench", kind.as_str());
                let delta = diff_chunk_sets(&key, Some(&original.ids(&key)), Some(&new), 2);
                most = most.max(delta.upserts.len());
                cases.push(json!({
                    "kind": kind.as_str(),
                    "position": position,
                    "edit": operation,
                    "chunks_before": original.chunks.len(),
                    "chunks_after": new.chunks.len(),
                    "embedded": delta.upserts.len(),
                    "rewritten_without_embedding": delta.restamp.len(),
                    "deleted": delta.deletes.len(),
                }));
            }
        }
        worst.insert(kind.as_str().to_string(), json!(most));
    }
    Ok(json!({
        "documents": documents
            .iter()
            .map(|(kind, text)| json!({
                "kind": kind.as_str(),
                "bytes": text.len(),
                "chunks": chunk_set(&chunker, *kind, text, 1).chunks.len(),
            }))
            .collect::<Vec<_>>(),
        "most_embedded_per_edit": worst,
        "cases": cases,
    }))
}

fn chunk_set(chunker: &Chunker, kind: DocKind, text: &str, version: u64) -> ChunkSet {
    let source = match kind {
        DocKind::Code => "bench.rs",
        DocKind::Markdown => "bench.md",
        _ => "bench.txt",
    };
    let document = Document {
        key: DocKey::new("bench", kind.as_str()),
        version,
        source: source.into(),
        kind,
        title: Some("Edit bench".into()),
        text: text.into(),
        acl: vec![],
        updated_ms: 0,
        metadata: Default::default(),
    };
    ChunkSet {
        version,
        chunks: chunker.chunk(&document),
        document: None,
    }
}

/// The text with block `at` edited.
fn edit(blocks: &[&str], at: usize, operation: &str, kind: DocKind) -> String {
    let mut out: Vec<String> = blocks.iter().map(|b| b.to_string()).collect();
    match operation {
        "insert" => {
            let new = if kind == DocKind::Code {
                NEW_ITEM
            } else {
                NEW_PARAGRAPH
            };
            out.insert(at, new.to_string());
        }
        "delete" => {
            out.remove(at);
        }
        _ => {
            let block = &out[at];
            let (cut, addition) = if kind == DocKind::Code {
                (block.find('\n'), "\n    // An added line.")
            } else {
                (block.find(". ").map(|i| i + 1), " An added sentence.")
            };
            let cut = cut.unwrap_or(block.len());
            out[at] = format!("{}{}{}", &block[..cut], addition, &block[cut..]);
        }
    }
    out.join("\n\n")
}

/// Corpus paragraphs in order until the document has `chunks` chunks; markdown gets a heading per
/// article.
fn prose_text(chunker: &Chunker, corpus: &[Document], kind: DocKind, chunks: usize) -> String {
    let mut text = String::new();
    let mut title = None;
    for (index, document) in corpus.iter().enumerate() {
        if kind == DocKind::Markdown && title != document.title {
            title = document.title.clone();
            text.push_str(&format!(
                "## {}\n\n",
                title.as_deref().unwrap_or("Untitled")
            ));
        }
        text.push_str(&document.text);
        text.push_str("\n\n");
        if index % 8 == 7 && chunk_set(chunker, kind, &text, 1).chunks.len() >= chunks {
            break;
        }
    }
    text.trim_end().to_string()
}

/// This repository's Rust sources in path order until the document has `chunks` chunks.
fn code_text(chunker: &Chunker, dir: &Path, chunks: usize) -> anyhow::Result<String> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut text = String::new();
    for file in files {
        text.push_str(std::fs::read_to_string(&file)?.trim_end());
        text.push_str("\n\n");
        if chunk_set(chunker, DocKind::Code, &text, 1).chunks.len() >= chunks {
            break;
        }
    }
    Ok(text.trim_end().to_string())
}
