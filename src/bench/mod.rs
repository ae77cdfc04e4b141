//! `ragstream bench` (the `bench` feature): the benches, one module each, and `bench ingest` here.
//!
//! `ragstream bench ingest`: ingest figures measured in one run, on this machine.
//!
//! 1. token counting MB/s (o200k_base, cl100k_base; median of 5 passes over the corpus);
//! 2. embedding only: the corpus's chunks through the configured inference service, nothing else
//!    (chunks/s, word pieces/s), twice: in whole calls of `kafka.max_batch` texts and in the service's
//!    slices (as the pipeline embeds);
//! 3. end to end: the corpus produced to a fresh Kafka topic and ingested by the real job in this process
//!    (consume, guard, chunk, differential upsert, embed, index write + flush, offset store), chunks/s,
//!    and the CPU seconds of each thread; the ratio to the faster of (2) is the pipeline overhead;
//! 4. event-to-searchable at low load: single documents produced one at a time while the job idles, timed
//!    until their chunks are counted in the index (median, max);
//! 5. peak RSS of the process (VmHWM).

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use ragstream_operators::model::{DocKey, DocKind, Document};
use ragstream_topologies::config::Config;
use rdkafka::producer::{BaseProducer, BaseRecord};
use serde_json::json;

pub mod edits;
pub mod embed;
mod ingest_steps;
pub mod load;
pub mod neighbours;
pub mod pathological;
pub mod query;
pub mod scale;
pub mod standing;
pub mod volume;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Query latency through Kafka at a steady offered rate, with and without query embedding.
    Query(query::QueryBench),
    /// Ingest and query throughput at several worker counts, the model taken out (instant embedder).
    Scale(scale::ScaleBench),
    /// The job at a million chunks, the model taken out (instant embedder): ingest rate, RSS, disk,
    /// query round trips while growing, at full size idle and under ingest, stalls during optimization.
    Volume(volume::VolumeBench),
    /// Chunks embedded, rewritten and deleted when one paragraph of a 100-chunk prose, markdown or
    /// code document is inserted, deleted or changed at its head, middle or tail (no model needed).
    Edits(edits::EditsBench),
    /// The local embedder's word pieces/s on a corpus's chunks and its single-query latency.
    Embed(embed::EmbedBench),
    /// Chunking time of pathological documents (one 8 MiB line, an 8 MiB table, one 8 MiB function)
    /// against 1 MiB ones, and `POST /v1/query` round trips while two of them are ingested against idle.
    Pathological(pathological::PathologicalBench),
    /// One tenant posting large documents without pause beside another posting small ones: how soon
    /// the small ones are searchable and the other tenant's round trips, against idle.
    Neighbours(neighbours::NeighboursBench),
    /// `POST /v1/query` round trips while documents stream in at full embedding speed, and with ingest idle.
    Load(load::LoadBench),
    /// Standing queries while a corpus streams in (ingest throughput against none, change → version
    /// latency, re-evaluations per changed context), and many held idle.
    Standing(standing::StandingBench),
    /// Token counting, embedding-only and end-to-end Kafka ingest throughput, freshness, peak RSS.
    Ingest(IngestBench),
}

/// Runs one of the benches and prints its report.
pub fn run(command: Command) -> anyhow::Result<()> {
    let report = match command {
        Command::Pathological(args) => pathological::pathological(args)?,
        Command::Neighbours(args) => neighbours::neighbours(args)?,
        Command::Load(args) => load::load(args)?,
        Command::Standing(args) => standing::standing(args)?,
        Command::Embed(args) => {
            // One line per report: the embed bench script collects them as JSON lines.
            println!("{}", embed::embed(args)?);
            return Ok(());
        }
        Command::Ingest(args) => ingest(args)?,
        Command::Query(args) => query::query(args)?,
        Command::Scale(args) => scale::scale(args)?,
        Command::Edits(args) => edits::edits(args)?,
        Command::Volume(args) => volume::volume(args)?,
    };
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// Arguments of `bench ingest`.
#[derive(clap::Args, Debug)]
pub struct IngestBench {
    /// BEIR corpus (`{_id, title, text}` per line).
    #[arg(long)]
    pub corpus: PathBuf,
    /// Kafka bootstrap servers (a fresh topic is created by producing to it).
    #[arg(long)]
    pub brokers: String,
    /// Use only the first N documents.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Single-document probes for event-to-searchable.
    #[arg(long, default_value_t = 20)]
    pub probes: usize,
}

/// What the query benches read and where the broker is.
#[derive(clap::Args, Debug)]
pub struct QueryBenchData {
    /// BEIR corpus (`{_id, title, text}` per line).
    #[arg(long)]
    pub corpus: PathBuf,
    /// Questions (`{_id, text}` per line).
    #[arg(long)]
    pub questions: PathBuf,
    /// Kafka bootstrap servers.
    #[arg(long)]
    pub brokers: String,
}

/// Queues `record`, serving delivery reports while the producer's queue is full.
pub(crate) fn send_blocking(producer: &BaseProducer, mut record: BaseRecord<'_, String, String>) {
    loop {
        match producer.send(record) {
            Ok(()) => return,
            Err((_, back)) => {
                producer.poll(Duration::from_millis(1));
                record = back;
            }
        }
    }
}

pub(crate) fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

/// A memory field of `/proc/self/status` (e.g. `VmHWM:`, peak RSS) in MiB; 0 where unavailable.
pub(crate) fn proc_status_mib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map(|kib| kib / 1024.0)
        .unwrap_or(0.0)
}

/// CPU seconds (user + system) this process's threads have used, summed by thread name (digits dropped,
/// so `ragstream-embed-0` and `ragstream-embed-1` count together).
pub(crate) fn thread_cpu_seconds() -> std::collections::BTreeMap<String, f64> {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut by_name = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return by_name;
    };
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ...`: the name may hold spaces, the fields after the last ')' do not.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name: String = stat[open + 1..close]
            .chars()
            .filter(|c| !c.is_ascii_digit())
            .collect();
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        let used = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        // After the name: state is field 0, utime field 11, stime field 12.
        *by_name.entry(name).or_insert(0.0) += (used(11) + used(12)) / ticks;
    }
    by_name
}

/// `after − before`, by name, rounded to 0.01 s, only names that used any.
pub(crate) fn cpu_used(
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
) -> serde_json::Map<String, serde_json::Value> {
    after
        .iter()
        .map(|(name, &seconds)| (name, seconds - before.get(name).copied().unwrap_or(0.0)))
        .filter(|&(_, used)| used >= 0.01)
        .map(|(name, used)| (name.clone(), json!((used * 100.0).round() / 100.0)))
        .collect()
}

/// The texts of a questions file (`{_id, text}` lines); fails when it holds fewer than `needed`.
pub(crate) fn read_questions(path: &std::path::Path, needed: usize) -> anyhow::Result<Vec<String>> {
    let questions: Vec<String> = read_jsonl_lines(path)?
        .iter()
        .map(|q| q["text"].as_str().unwrap_or_default().to_string())
        .collect();
    anyhow::ensure!(
        questions.len() >= needed,
        "{} questions, need {needed}",
        questions.len()
    );
    Ok(questions)
}

/// One `POST /v1/query` round trip: the context (an error context is an error) and the milliseconds.
pub(crate) fn round_trip(
    agent: &ureq::Agent,
    url: &str,
    body: &serde_json::Value,
) -> anyhow::Result<(serde_json::Value, f64)> {
    let started = Instant::now();
    let mut response = agent
        .post(url)
        .header("content-type", "application/json")
        .send(body.to_string())?;
    let context: serde_json::Value = serde_json::from_str(&response.body_mut().read_to_string()?)?;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(
        context["error"].is_null(),
        "query failed: {}",
        context["error"]
    );
    Ok((context, ms))
}

/// `POST` a JSON body; the status and the answer (a transport error as status 0).
pub(crate) fn post_json(
    agent: &ureq::Agent,
    url: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    answer(
        agent
            .post(url)
            .header("content-type", "application/json")
            .send(body.to_string()),
    )
}

/// `GET`; the status and the answer (a transport error as status 0).
pub(crate) fn get_json(agent: &ureq::Agent, url: &str) -> (u16, serde_json::Value) {
    answer(agent.get(url).call())
}

fn answer(
    response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
) -> (u16, serde_json::Value) {
    match response {
        Ok(mut response) => (
            response.status().as_u16(),
            serde_json::from_str(&response.body_mut().read_to_string().unwrap_or_default())
                .unwrap_or(serde_json::Value::Null),
        ),
        Err(error) => (0, json!({"error": error.to_string()})),
    }
}

/// A bench's job in this process on its embedded default: a watched directory holding `seed`
/// (file name, text) for `tenant`, rescanned every `rescan_secs`, a fresh embedded index, the
/// local model, an HTTP port of its own, one worker, and `extra` TOML; all under a fresh directory
/// of the temporary folder named after `name` and `run`. The job and that directory.
pub(crate) fn local_job(
    (name, run): (&str, &str),
    (tenant, rescan_secs): (&str, u64),
    seed: &[(&str, &str)],
    extra: &str,
) -> anyhow::Result<(crate::runtime::Running, PathBuf)> {
    let root = std::env::temp_dir().join(format!("ragstream-bench-{name}-{run}"));
    let docs = root.join("docs");
    std::fs::create_dir_all(&docs)?;
    for (file, text) in seed {
        std::fs::write(docs.join(file), text)?;
    }
    let config_path = root.join("ragstream.toml");
    std::fs::write(
        &config_path,
        format!(
            "[source]\nkind = \"dir\"\npath = {:?}\ntenant = {tenant:?}\nrescan_secs = {rescan_secs}\n[index]\npath = {:?}\n[http]\nlisten = \"127.0.0.1:0\"\n[runtime]\nworkers = 1\ndlq_path = {:?}\n{extra}",
            docs.display().to_string(),
            root.join("index").display().to_string(),
            root.join("dlq.jsonl").display().to_string(),
        ),
    )?;
    let config = Config::load(&config_path)?;
    config.validate()?;
    Ok((crate::runtime::start(config)?, root))
}

/// n, p50, p90, p99 and max of latencies in milliseconds.
pub(crate) fn latency_summary(mut values: Vec<f64>) -> serde_json::Value {
    values.sort_by(f64::total_cmp);
    let at = |p: f64| {
        if values.is_empty() {
            0.0
        } else {
            values[((values.len() - 1) as f64 * p).round() as usize]
        }
    };
    json!({"n": values.len(), "p50_ms": at(0.5), "p90_ms": at(0.9), "p99_ms": at(0.99), "max_ms": values.last().copied().unwrap_or(0.0)})
}

/// The lines of a JSONL file, parsed (blank lines skipped).
pub(crate) fn read_jsonl_lines(path: &std::path::Path) -> anyhow::Result<Vec<serde_json::Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| Ok(serde_json::from_str(l)?))
        .collect()
}

/// A BEIR corpus (`{_id, title, text}` lines) as prose documents of the tenant `bench`.
pub(crate) fn read_corpus(path: &std::path::Path) -> anyhow::Result<Vec<Document>> {
    read_jsonl_lines(path)?
        .into_iter()
        .map(|value| {
            let id = value["_id"].as_str().context("_id")?.to_string();
            Ok(Document {
                key: DocKey::new("bench", id.clone()),
                version: 1,
                source: id,
                kind: DocKind::Prose,
                title: value["title"].as_str().map(str::to_string),
                text: value["text"].as_str().context("text")?.to_string(),
                acl: vec![],
                updated_ms: 0,
                metadata: Default::default(),
            })
        })
        .collect()
}

/// Runs the benchmark and returns its report as JSON.
pub fn ingest(args: IngestBench) -> anyhow::Result<serde_json::Value> {
    let mut documents = read_corpus(&args.corpus)?;
    if let Some(limit) = args.limit {
        documents.truncate(limit);
    }
    let bytes: usize = documents.iter().map(|d| d.text.len()).sum();
    eprintln!(
        "corpus: {} documents, {:.2} MB",
        documents.len(),
        bytes as f64 / 1e6
    );

    // 1. Token counting.
    let counting = ingest_steps::token_counting(&documents, bytes);

    let (config, config_path) = ingest_steps::write_config(&args.brokers)?;
    // 2. Embedding only, on exactly the texts the pipeline will embed (each chunk and its evidence
    // units), in pipeline-sized calls.
    let embedding = ingest_steps::embedding_only(&config, &documents)?;
    let (chunk_count, embed_seconds, sliced_seconds) = (
        embedding.chunks,
        embedding.seconds,
        embedding.sliced_seconds,
    );
    // The pipeline is measured against the model at its best: the faster of the two.
    let best_rate = chunk_count as f64 / embed_seconds.min(sliced_seconds);

    // 3. End to end through Kafka.
    let producer = ingest_steps::produce_corpus(&config, &args.brokers, &documents)?;
    let (running, pipeline) = ingest_steps::end_to_end(&config, documents.len() as u64)?;

    // 4. Event-to-searchable at low load.
    let latencies = ingest_steps::event_to_searchable(
        &producer,
        &config.kafka.documents_topic,
        &running,
        args.probes,
    )?;
    running.shutdown.store(true, Ordering::SeqCst);
    running.join()?;
    let mut sorted = latencies.clone();
    let freshness_median = median(&mut sorted);
    let freshness_max = sorted.last().copied().unwrap_or(0.0);
    let report = json!({
        "documents": documents.len(),
        "corpus_mb": bytes as f64 / 1e6,
        "token_counting_mb_per_s": counting,
        "embedding_only": {"chunks": chunk_count, "texts": embedding.texts, "seconds": embed_seconds, "chunks_per_s": embedding.rate, "word_pieces_per_s": embedding.word_pieces as f64 / embed_seconds},
        "embedding_only_sliced": {"slice_word_pieces": config.embedder.slice_word_pieces, "seconds": sliced_seconds, "chunks_per_s": chunk_count as f64 / sliced_seconds},
        "end_to_end_kafka": {
            "chunks": pipeline.chunks, "seconds": pipeline.seconds, "chunks_per_s": pipeline.rate,
            "seconds_to_first_event": pipeline.first_event, "chunks_per_s_from_first_event": pipeline.consuming_rate,
            "embedding_seconds": pipeline.embedding_seconds, "embedding_calls": pipeline.embedding_calls,
            "index_write_seconds": pipeline.index_seconds, "index_write_batches": pipeline.index_batches,
            "cpu_seconds_by_thread": pipeline.cpu,
        },
        "pipeline_overhead": 1.0 - pipeline.rate / best_rate,
        "pipeline_overhead_from_first_event": 1.0 - pipeline.consuming_rate / best_rate,
        "event_to_searchable_ms": {"median": freshness_median, "max": freshness_max, "probes": latencies.len()},
        "peak_rss_mib": proc_status_mib("VmHWM:"),
    });
    let _ = std::fs::remove_dir_all(&config.index.path);
    let _ = std::fs::remove_file(&config_path);
    Ok(report)
}
