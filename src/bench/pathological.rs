//! `ragstream bench pathological`: documents that once stalled the job, measured in one run.
//!
//! 1. chunking time of three shapes (one line of minified script, a markdown table, one code item of
//!    a single function) at 1 MiB and at `size_mib`, the median of 3 passes each, and the ratio of
//!    the two (linear chunking: about the ratio of the sizes);
//! 2. file formats read as the job reads them (each file in the sandbox's child process, then its
//!    text chunked): HTML nested, of many headings, of unclosed tags and of one word without
//!    whitespace, PDFs of many pages, of one long content stream and of many linked objects, and a
//!    DOCX of many paragraphs, each at 1 MiB and at `size_mib`: the median of 3 passes each and the
//!    ratio of the two;
//! 3. the job in this process on its embedded default (a watched directory, the local model, a fresh
//!    embedded index): `POST /v1/query` round trips from one client, one every `interval_ms`, with ingest
//!    idle, then while the one-line script and the table of `size_mib` each are dropped into the
//!    directory and ingested (the client goes on until both are indexed or `loaded_seconds` passed;
//!    chunking them, the stall this bench exists for, takes the first seconds of that).

use std::path::Path;
use std::time::{Duration, Instant};

use ragstream_operators::ingest::chunk::{Chunker, ChunkerConfig};
use ragstream_operators::ingest::extract::{ExtractLimits, FileReader};
use ragstream_operators::ingest::sandbox::{Sandbox, SandboxLimits};
use ragstream_operators::metrics::metrics;
use ragstream_operators::model::{DocKey, DocKind, Document};
use serde_json::{json, Value};

use crate::bench::{latency_summary as summary, local_job};

/// Arguments of `bench pathological`.
#[derive(clap::Args, Debug)]
pub struct PathologicalBench {
    /// Size of the large documents, MiB (each stays just under the job's document limit).
    #[arg(long, default_value_t = 8)]
    pub size_mib: usize,
    /// Round trips with ingest idle.
    #[arg(long, default_value_t = 200)]
    pub queries: usize,
    /// Longest the loaded phase lasts, seconds (the large documents may still be embedded after it).
    #[arg(long, default_value_t = 120)]
    pub loaded_seconds: u64,
    /// Least milliseconds between the starts of two round trips (one client, paced: the queries
    /// take a bounded share of the CPU, and ingest goes on beside them).
    #[arg(long, default_value_t = 50)]
    pub interval_ms: u64,
    /// Measure chunking and the file formats only (no job).
    #[arg(long)]
    pub offline: bool,
}

/// The three shapes, `bytes` long: (name, file name, text).
fn shapes(bytes: usize) -> Vec<(&'static str, &'static str, String)> {
    let fill = |mut item: Box<dyn FnMut(usize) -> String>, head: &str, tail: &str| {
        let mut text = String::with_capacity(bytes + 256);
        text.push_str(head);
        let mut i = 0;
        while text.len() + tail.len() < bytes {
            text.push_str(&item(i));
            i += 1;
        }
        text.push_str(tail);
        text
    };
    vec![
        (
            "one line of minified script",
            "bundle.min.js",
            fill(
                Box::new(|i| {
                    format!(
                        "function f{i}(a,b){{return a*{i}+b[{}]||g{i}(a)}};var v{i}=f{i}(1,[2]);",
                        i % 7
                    )
                }),
                "",
                "\n",
            ),
        ),
        (
            "a markdown table",
            "table.md",
            fill(
                Box::new(|i| {
                    format!(
                        "| {i} | item {i} | warehouse {} | {}.{:02} |\n",
                        i % 97,
                        i * 3,
                        i % 100
                    )
                }),
                "# Inventory\n\n| id | name | location | price |\n|---|---|---|---|\n",
                "",
            ),
        ),
        (
            "one code item",
            "generated.rs",
            fill(
                Box::new(|i| {
                    format!(
                        "    let value_{i} = compute({i}, value_{}) + offset;\n",
                        i.saturating_sub(1)
                    )
                }),
                "pub fn generated(offset: u64) -> u64 {\n    let value_0 = offset;\n",
                "    value_0\n}\n",
            ),
        ),
    ]
}

/// Median seconds of 3 chunkings of `text` as the file `name`, and the chunks made.
fn chunk_seconds(chunker: &Chunker, name: &str, text: &str) -> (f64, usize) {
    let document = Document {
        key: DocKey::new("bench", name),
        version: 1,
        source: name.to_string(),
        kind: DocKind::Auto,
        title: None,
        text: text.to_string(),
        acl: Vec::new(),
        updated_ms: 0,
        metadata: Default::default(),
    };
    let mut seconds = Vec::new();
    let mut chunks = 0;
    for _ in 0..3 {
        let started = Instant::now();
        chunks = chunker.chunk(&document).len();
        seconds.push(started.elapsed().as_secs_f64());
    }
    (crate::bench::median(&mut seconds), chunks)
}

/// The file shapes, about `bytes` long: (name, format, file).
fn formats(bytes: usize) -> Vec<(&'static str, DocKind, Vec<u8>)> {
    use ragstream_core::testing::{docx_file, hostile, pdf_file};
    let sentence =
        "The index is kept exact on deletes and every chunk of a removed page goes with it.";
    // A page of about 2 KiB of text in 25 lines.
    let page: String = (0..25).map(|_| format!("{sentence}\n")).collect();
    let pages: Vec<&str> = std::iter::repeat_n(page.as_str(), bytes / (page.len() + 200)).collect();
    let long_stream: String = std::iter::repeat_n(sentence, bytes / (sentence.len() + 12))
        .map(|line| format!("({line}) Tj\n0 -14 Td\n"))
        .collect();
    let paragraphs: Vec<(&str, &str)> =
        std::iter::repeat_n(("", sentence), bytes / (sentence.len() + 80)).collect();
    vec![
        (
            "html nested",
            DocKind::Html,
            hostile::html_nested(bytes / 11),
        ),
        (
            "html headings",
            DocKind::Html,
            hostile::html_headings(bytes / 18),
        ),
        (
            "html unclosed",
            DocKind::Html,
            hostile::html_unclosed(bytes * 2 / 13),
        ),
        (
            "html one word",
            DocKind::Html,
            hostile::html_one_word(bytes),
        ),
        ("pdf many pages", DocKind::Pdf, pdf_file(&pages)),
        (
            "pdf one long content stream",
            DocKind::Pdf,
            hostile::pdf_with_content(
                format!("BT /F1 11 Tf 72 720 Td\n{long_stream}ET").as_bytes(),
            ),
        ),
        (
            "pdf many objects",
            DocKind::Pdf,
            hostile::pdf_linked_objects(bytes / 60),
        ),
        (
            "docx many paragraphs",
            DocKind::Docx,
            docx_file(&paragraphs),
        ),
    ]
}

/// Median seconds of 3 reads of `file` through `sandbox` each followed by chunking its text, and the
/// chunks made (`None`: refused, with why).
fn read_seconds(
    sandbox: &Sandbox,
    chunker: &Chunker,
    (name, kind, file): (&str, DocKind, &[u8]),
) -> (f64, Result<usize, String>) {
    let limits = ExtractLimits::for_documents(file.len().max(8 << 20));
    let mut seconds = Vec::new();
    let mut chunks = Ok(0);
    for _ in 0..3 {
        let started = Instant::now();
        chunks = sandbox
            .read(kind, file, &limits)
            .map(|read| {
                chunker
                    .chunk(&Document {
                        key: DocKey::new("bench", name),
                        version: 1,
                        source: name.to_string(),
                        kind,
                        title: read.title,
                        text: read.text,
                        acl: Vec::new(),
                        updated_ms: 0,
                        metadata: Default::default(),
                    })
                    .len()
            })
            .map_err(|error| error.message);
        seconds.push(started.elapsed().as_secs_f64());
    }
    (crate::bench::median(&mut seconds), chunks)
}

/// Whether the source emitted at least `events` events and the index acknowledged every one of them.
fn indexed(events: u64) -> bool {
    metrics().source_events.get() >= events && metrics().in_flight_messages.get() == 0
}

/// Questions the idle and loaded phases ask in turn (each asked once with a serial, so neither the
/// context cache nor the embedding cache answers it).
const QUESTIONS: [&str; 4] = [
    "how are oversized documents refused",
    "which warehouse holds item 42",
    "what does the generated function return",
    "how is the index kept exact on deletes",
];

/// Chunking time of each shape at `small` and at `bytes` bytes; one report row a shape.
fn chunking(chunker: &Chunker, (small, bytes): (usize, usize), size_mib: usize) -> Vec<Value> {
    let mut chunking = Vec::new();
    for ((name, file, one), (_, _, large)) in shapes(small).into_iter().zip(shapes(bytes)) {
        let (small_s, small_chunks) = chunk_seconds(chunker, file, &one);
        let (large_s, large_chunks) = chunk_seconds(chunker, file, &large);
        eprintln!("chunking {name}: 1 MiB {small_s:.3} s, {size_mib} MiB {large_s:.3} s");
        chunking.push(json!({
            "shape": name,
            "small": {"bytes": one.len(), "seconds": small_s, "chunks": small_chunks},
            "large": {"bytes": large.len(), "seconds": large_s, "chunks": large_chunks},
            "time_ratio": large_s / small_s,
            "size_ratio": large.len() as f64 / one.len() as f64,
        }));
    }
    chunking
}

/// Reading time of each file format at `small` and at `bytes` bytes; one report row a format.
fn files(chunker: &Chunker, (small, bytes): (usize, usize)) -> anyhow::Result<Vec<Value>> {
    // The job's own limits, but time enough to see how long a large file takes.
    let sandbox = Sandbox::of_this_binary(SandboxLimits {
        cpu_secs: 600,
        wall_secs: 600,
        ..SandboxLimits::default()
    })?;
    let mut files = Vec::new();
    for ((name, kind, one), (_, _, large)) in formats(small).into_iter().zip(formats(bytes)) {
        let (small_s, small_chunks) = read_seconds(&sandbox, chunker, (name, kind, &one));
        let (large_s, large_chunks) = read_seconds(&sandbox, chunker, (name, kind, &large));
        eprintln!(
            "reading {name}: {} KiB {small_s:.3} s ({small_chunks:?} chunks), {} KiB {large_s:.3} s ({large_chunks:?} chunks)",
            one.len() >> 10,
            large.len() >> 10
        );
        let outcome = |chunks: Result<usize, String>| match chunks {
            Ok(chunks) => json!({"chunks": chunks}),
            Err(refused) => json!({"refused": refused}),
        };
        files.push(json!({
            "shape": name,
            "small": {"bytes": one.len(), "seconds": small_s, "outcome": outcome(small_chunks)},
            "large": {"bytes": large.len(), "seconds": large_s, "outcome": outcome(large_chunks)},
            "time_ratio": large_s / small_s,
            "size_ratio": large.len() as f64 / one.len() as f64,
        }));
    }
    Ok(files)
}

/// Waits up to `limit` until `target` events are indexed; whether they are.
fn wait_indexed(target: u64, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while !indexed(target) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    indexed(target)
}

/// The query client: one `POST /v1/query` round trip at a time, each a new question.
struct Asker {
    agent: ureq::Agent,
    /// The job's `/v1/query`.
    url: String,
    /// Names the query ids.
    run: String,
    /// Questions asked so far.
    serial: usize,
}

impl Asker {
    /// Asks the next question; the round trip's milliseconds.
    fn ask(&mut self) -> anyhow::Result<f64> {
        let serial = self.serial;
        let text = format!("{} {serial}", QUESTIONS[serial % QUESTIONS.len()]);
        let body = json!({"query_id": format!("p-{serial}-{}", self.run), "tenant": "bench", "text": text, "token_budget": 600});
        self.serial += 1;
        Ok(crate::bench::round_trip(&self.agent, &self.url, &body)?.1)
    }
}

/// Runs the benchmark and returns its report.
pub fn pathological(args: PathologicalBench) -> anyhow::Result<Value> {
    let bytes = (args.size_mib << 20).saturating_sub(64 << 10);
    let small = (1 << 20) - (64 << 10);
    let chunker = Chunker::new(ChunkerConfig::default());
    let chunking = chunking(&chunker, (small, bytes), args.size_mib);
    let files = files(&chunker, (small, bytes))?;

    if args.offline {
        return Ok(json!({"chunking": chunking, "files": files}));
    }
    let run = format!(
        "{}-{}",
        std::process::id(),
        ragstream_operators::now_millis()
    );
    let (running, root) = local_job(
        ("pathological", &run),
        ("bench", 1),
        &[(
            "guide.md",
            "# Ingest\n\nOversized documents are refused with a DLQ record that keeps their value.\n\n\
             # Index\n\nThe index is kept exact on deletes: every chunk of a deleted document is removed.\n",
        )],
        "",
    )?;
    let docs = root.join("docs");
    let mut asker = Asker {
        url: format!("http://{}/v1/query", running.address),
        agent: ureq::Agent::new_with_defaults(),
        run,
        serial: 0,
    };
    // The process's counters start at zero: the seed is the first event.
    anyhow::ensure!(
        wait_indexed(1, Duration::from_secs(600)),
        "the seed document was not indexed"
    );
    for _ in 0..5 {
        asker.ask()?;
    }
    let interval = Duration::from_millis(args.interval_ms);
    let mut idle = Vec::new();
    for _ in 0..args.queries {
        let started = Instant::now();
        idle.push(asker.ask()?);
        std::thread::sleep(interval.saturating_sub(started.elapsed()));
    }
    eprintln!("idle: {} round trips", idle.len());

    let large = shapes(bytes);
    let chunks_before = metrics().chunks_upserted.get();
    let embedded_before = metrics().chunks_embedded.get();
    let target = metrics().source_events.get() + 2;
    let loaded_start = Instant::now();
    for (_, file, text) in large.iter().take(2) {
        write_atomically(&root.join(file), &docs.join(file), text)?;
    }
    let mut loaded = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(args.loaded_seconds);
    while !indexed(target) && Instant::now() < deadline {
        let started = Instant::now();
        loaded.push(asker.ask()?);
        std::thread::sleep(interval.saturating_sub(started.elapsed()));
    }
    let loaded_seconds = loaded_start.elapsed().as_secs_f64();
    let chunks = metrics().chunks_upserted.get() - chunks_before;
    let embedded = metrics().chunks_embedded.get() - embedded_before;
    let done = indexed(target);
    eprintln!(
        "loaded: {} round trips in {loaded_seconds:.1} s while {embedded} chunks were embedded and {chunks} written (all indexed: {done})",
        loaded.len()
    );
    // The job is not stopped gracefully (that finishes the ingest in flight): the process ends after
    // the report, and its working directory under the temporary directory is left to the caller
    // (`bench/pathological.sh` removes it).
    drop(running);
    let p = |v: &[f64], key: &str| summary(v.to_vec())[key].as_f64().unwrap_or(0.0);
    Ok(json!({
        "chunking": chunking,
        "files": files,
        "queries": {
            "idle": summary(idle.clone()),
            "ingesting": summary(loaded.clone()),
            "ingesting_over_idle": {"p50": p(&loaded, "p50_ms") / p(&idle, "p50_ms"), "p99": p(&loaded, "p99_ms") / p(&idle, "p99_ms")},
        },
        "ingest": {"documents": [large[0].1, large[1].1], "bytes_each": bytes, "chunks_embedded": embedded, "chunks_written": chunks, "seconds": loaded_seconds, "embedded_per_s": embedded as f64 / loaded_seconds, "all_indexed": done},
    }))
}

/// Writes `text` to `outside` (not watched) and moves it to `path`, so the directory source never
/// reads half a file.
fn write_atomically(outside: &Path, path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(outside, text)?;
    std::fs::rename(outside, path)?;
    Ok(())
}
