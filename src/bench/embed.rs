//! `ragstream bench embed`: the local embedder's throughput on a corpus's chunks and its single-query
//! latency, on exactly the texts the PyTorch peer (`deploy/scripts/bench/embed_torch.py`) measures.
//!
//! 1. The corpus is chunked by the pipeline's chunker; the chunks' embedding inputs are the texts.
//! 2. Throughput: every text in one `embed` call (sorted by length and batched by 32 inside, as
//!    sentence-transformers' `encode` does), after a warm-up call; word pieces are the model's inputs
//!    after truncation at 256 ([CLS] and [SEP] included), counted the same way on both sides.
//! 3. Query latency: the first `queries` questions embedded one at a time; median and 90th percentile.
//!
//! `--texts-out` writes the texts and questions as JSON for the peer.

use std::path::PathBuf;
use std::time::Instant;

use ragstream_operators::embed::minilm::{MiniLm, MiniLmOptions, Precision};
use ragstream_operators::embed::Embedder;
use ragstream_operators::ingest::chunk::{Chunker, ChunkerConfig};
use ragstream_topologies::config::EmbedderConfig;
use serde_json::json;

/// Which embedder runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    /// ONNX Runtime, int8 graph.
    Int8,
    /// ONNX Runtime, fp32 graph.
    Fp32,
}

/// Arguments of `bench embed`.
#[derive(clap::Args, Debug)]
pub struct EmbedBench {
    /// BEIR corpus (`{_id, title, text}` per line).
    #[arg(long)]
    pub corpus: PathBuf,
    /// Questions (`{_id, text}` per line) for the single-query latency.
    #[arg(long)]
    pub questions: PathBuf,
    /// Use only the first N documents.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Questions embedded one at a time.
    #[arg(long, default_value_t = 200)]
    pub queries: usize,
    /// The embedder.
    #[arg(long, value_enum, default_value = "int8")]
    pub engine: Engine,
    /// Inference threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Write the texts and questions (JSON) for the PyTorch peer.
    #[arg(long)]
    pub texts_out: Option<PathBuf>,
}

fn load(engine: Engine, threads: usize) -> anyhow::Result<Box<dyn Embedder>> {
    let config = EmbedderConfig::default();
    let precision = match engine {
        Engine::Int8 => Precision::Int8,
        Engine::Fp32 => Precision::Fp32,
    };
    Ok(Box::new(MiniLm::load(&MiniLmOptions {
        model_dir: config.model_dir(),
        runtime_library: config.runtime_library(),
        precision,
        threads,
        batch_size: 32,
        spinning: config.spinning,
        pool_spans: false,
    })?))
}

/// Runs the benchmark and returns its report as JSON.
pub fn embed(args: EmbedBench) -> anyhow::Result<serde_json::Value> {
    let chunker = Chunker::new(ChunkerConfig::default());
    let mut documents = crate::bench::read_corpus(&args.corpus)?;
    if let Some(limit) = args.limit {
        documents.truncate(limit);
    }
    let texts: Vec<String> = documents
        .iter()
        .flat_map(|d| chunker.chunk(d))
        .map(|c| c.embedding_input())
        .collect();
    let questions: Vec<String> = crate::bench::read_jsonl_lines(&args.questions)?
        .iter()
        .take(args.queries)
        .map(|q| q["text"].as_str().unwrap_or_default().to_string())
        .collect();
    if let Some(path) = &args.texts_out {
        std::fs::write(
            path,
            json!({"texts": texts, "queries": questions}).to_string(),
        )?;
    }
    let mut embedder = load(args.engine, args.threads)?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    embedder.embed(&refs[..refs.len().min(64)])?;
    let started = Instant::now();
    embedder.embed(&refs)?;
    let seconds = started.elapsed().as_secs_f64();
    let word_pieces = embedder.last_token_count();
    let mut latencies: Vec<f64> = Vec::with_capacity(questions.len());
    for question in &questions {
        let started = Instant::now();
        embedder.embed(&[question.as_str()])?;
        latencies.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    latencies.sort_by(f64::total_cmp);
    let percentile = |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize];
    Ok(json!({
        "engine": format!("{:?}", args.engine).to_lowercase(),
        "threads": args.threads,
        "texts": texts.len(),
        "word_pieces": word_pieces,
        "seconds": seconds,
        "word_pieces_per_s": word_pieces as f64 / seconds,
        "query_p50_ms": percentile(0.5),
        "query_p90_ms": percentile(0.9),
    }))
}
