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
use ragstream_operators::embed::service::Priority;
use ragstream_operators::ingest::chunk::{Chunker, ChunkerConfig};
use ragstream_operators::ingest::embed::ChunkInputs;
use ragstream_operators::metrics::metrics;
use ragstream_operators::model::{DocKey, DocKind, Document};
use ragstream_operators::store::SearchFilter;
use ragstream_operators::tokens::{Encoding, TokenCounter};
use ragstream_topologies::config::Config;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use serde_json::json;

pub mod edits;
pub mod embed;
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

/// Embeds `inputs` through an inference service built from `config`, all requests (`max_batch`
/// chunks each) submitted at once; answers seconds and word pieces.
fn embed_all(config: &Config, inputs: &ChunkInputs) -> anyhow::Result<(f64, usize)> {
    let service = ragstream_topologies::factory::inference_service(config)?;
    let started = Instant::now();
    let nobody: ragstream_operators::offload::Waker = std::sync::Arc::new(|| {});
    let batch = config.kafka.max_batch.max(1);
    let tickets: Vec<_> = inputs
        .texts
        .chunks(batch)
        .zip(inputs.spans.chunks(batch))
        .map(|(texts, spans)| {
            service.submit_spans(texts.to_vec(), spans.to_vec(), Priority::Ingest, &nobody)
        })
        .collect();
    let mut word_pieces = 0;
    for ticket in tickets {
        word_pieces += ticket.wait()?.word_pieces;
    }
    Ok((started.elapsed().as_secs_f64(), word_pieces))
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
    let mut counting = serde_json::Map::new();
    for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
        let counter = TokenCounter::new(encoding);
        let mut rates: Vec<f64> = (0..5)
            .map(|_| {
                let started = Instant::now();
                let tokens: usize = documents.iter().map(|d| counter.count(&d.text)).sum();
                std::hint::black_box(tokens);
                bytes as f64 / 1e6 / started.elapsed().as_secs_f64()
            })
            .collect();
        counting.insert(encoding.name().to_string(), json!(median(&mut rates)));
    }
    eprintln!("token counting MB/s: {counting:?}");

    let config_text = format!(
        "[source]\nkind = \"kafka\"\n[kafka]\nbrokers = \"{}\"\ndocuments_topic = \"bench-{}\"\ndlq_topic = \"bench-dlq\"\ngroup_id = \"bench-{}\"\n[index]\npath = \"{}\"\n[http]\nlisten = \"127.0.0.1:0\"\n",
        args.brokers,
        std::process::id(),
        std::process::id(),
        std::env::temp_dir().join(format!("ragstream-bench-{}", std::process::id())).display()
    );
    let config_path =
        std::env::temp_dir().join(format!("ragstream-bench-{}.toml", std::process::id()));
    std::fs::write(&config_path, config_text)?;
    let config = Config::load(&config_path)?;
    // 2. Embedding only, on exactly the texts the pipeline will embed (each chunk and its evidence
    // units), in pipeline-sized calls.
    let chunker = Chunker::new(ChunkerConfig::default());
    let mut inputs = ChunkInputs::default();
    let mut chunk_count = 0usize;
    for chunk in documents.iter().flat_map(|d| chunker.chunk(d)) {
        inputs.push(&chunk, config.embedder.evidence());
        chunk_count += 1;
    }
    // Every configured ingest executor, each on whole calls of `max_batch` texts (one slice a call).
    let mut whole_calls = config.clone();
    whole_calls.embedder.slice_word_pieces = usize::MAX / 2;
    let (embed_seconds, word_pieces) = embed_all(&whole_calls, &inputs)?;
    let embed_rate = chunk_count as f64 / embed_seconds;
    eprintln!(
        "embedding only: {chunk_count} chunks ({} vectors with their evidence units) in {embed_seconds:.1}s = {embed_rate:.1} chunks/s, {:.0} word pieces/s ({} executor(s) of {} thread(s))",
        inputs.vectors(),
        word_pieces as f64 / embed_seconds,
        config.embedder.executors(),
        config.embedder.threads
    );
    // The same texts cut into the slices a query may wait behind: what the pipeline's model time is
    // made of.
    let (sliced_seconds, _) = embed_all(&config, &inputs)?;
    eprintln!(
        "embedding only, in the service's slices of {} word pieces: {sliced_seconds:.1}s = {:.1} chunks/s",
        config.embedder.slice_word_pieces,
        chunk_count as f64 / sliced_seconds
    );
    // The pipeline is measured against the model at its best: the faster of the two.
    let best_rate = chunk_count as f64 / embed_seconds.min(sliced_seconds);

    // 3. End to end through Kafka.
    ragstream_operators::io::kafka_admin::ensure_topics(
        &config.kafka.client_config(),
        &[
            (config.kafka.documents_topic.as_str(), 3),
            (config.kafka.dlq_topic.as_str(), 1),
        ],
    )
    .map_err(anyhow::Error::msg)?;
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .set("enable.idempotence", "true")
        .create()?;
    for document in &documents {
        let body = json!({"tenant": "bench", "doc_id": document.key.doc_id, "version": 1, "kind": "prose", "title": document.title, "text": document.text}).to_string();
        let key = document.key.to_string();
        send_blocking(
            &producer,
            BaseRecord::to(&config.kafka.documents_topic)
                .key(&key)
                .payload(&body),
        );
    }
    producer.flush(Duration::from_secs(60))?;
    let (embed_before, calls_before) = (
        metrics().embed_seconds.get_sample_sum(),
        metrics().embed_seconds.get_sample_count(),
    );
    let cpu_before = thread_cpu_seconds();
    let started = Instant::now();
    let running = crate::runtime::start(config.clone())?;
    let events = documents.len() as u64;
    let mut first_event: Option<f64> = None;
    while metrics().source_events.get() < events || metrics().in_flight_messages.get() > 0 {
        if first_event.is_none() && metrics().source_events.get() > 0 {
            first_event = Some(started.elapsed().as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let pipeline_seconds = started.elapsed().as_secs_f64();
    let pipeline_cpu = cpu_used(&cpu_before, &thread_cpu_seconds());
    eprintln!("CPU seconds by thread during the pipeline: {pipeline_cpu:?}");
    let chunks = metrics().chunks_upserted.get();
    let pipeline_rate = chunks as f64 / pipeline_seconds;
    let first_event = first_event.unwrap_or(0.0);
    let consuming_rate = chunks as f64 / (pipeline_seconds - first_event);
    let embed_in_pipeline = metrics().embed_seconds.get_sample_sum() - embed_before;
    let embed_calls = metrics().embed_seconds.get_sample_count() - calls_before;
    let index_seconds = metrics().index_write_seconds.get_sample_sum();
    let index_batches = metrics().index_write_seconds.get_sample_count();
    eprintln!(
        "end to end: {chunks} chunks in {pipeline_seconds:.1}s = {pipeline_rate:.1} chunks/s; first event after {first_event:.1}s; \
         embedding {embed_in_pipeline:.1}s in {embed_calls} calls; index writes {index_seconds:.1}s in {index_batches} batches"
    );

    // 4. Event-to-searchable at low load.
    let mut latencies = Vec::new();
    for probe in 0..args.probes {
        let doc_id = format!("probe-{probe}");
        let body = json!({"tenant": "bench", "doc_id": doc_id, "version": 1, "kind": "prose", "text": format!("Probe document number {probe}. It checks freshness.")}).to_string();
        let key = format!("bench/{doc_id}");
        let sent = Instant::now();
        producer
            .send(
                BaseRecord::to(&config.kafka.documents_topic)
                    .key(&key)
                    .payload(&body),
            )
            .map_err(|(e, _)| e)?;
        producer.flush(Duration::from_secs(10))?;
        let filter = SearchFilter {
            tenant: Some("bench".into()),
            doc_ids: vec![doc_id.clone()],
            ..SearchFilter::default()
        };
        loop {
            let found: usize = running
                .shards
                .iter()
                .map(|s| s.count(&filter).unwrap_or(0))
                .sum();
            if found > 0 {
                break;
            }
            anyhow::ensure!(
                sent.elapsed() < Duration::from_secs(60),
                "probe {probe} never became searchable"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        latencies.push(sent.elapsed().as_secs_f64() * 1000.0);
        std::thread::sleep(Duration::from_millis(300));
    }
    running.shutdown.store(true, Ordering::SeqCst);
    running.join()?;
    let mut sorted = latencies.clone();
    let freshness_median = median(&mut sorted);
    let freshness_max = sorted.last().copied().unwrap_or(0.0);
    let report = json!({
        "documents": documents.len(),
        "corpus_mb": bytes as f64 / 1e6,
        "token_counting_mb_per_s": counting,
        "embedding_only": {"chunks": chunk_count, "texts": inputs.vectors(), "seconds": embed_seconds, "chunks_per_s": embed_rate, "word_pieces_per_s": word_pieces as f64 / embed_seconds},
        "embedding_only_sliced": {"slice_word_pieces": config.embedder.slice_word_pieces, "seconds": sliced_seconds, "chunks_per_s": chunk_count as f64 / sliced_seconds},
        "end_to_end_kafka": {
            "chunks": chunks, "seconds": pipeline_seconds, "chunks_per_s": pipeline_rate,
            "seconds_to_first_event": first_event, "chunks_per_s_from_first_event": consuming_rate,
            "embedding_seconds": embed_in_pipeline, "embedding_calls": embed_calls,
            "index_write_seconds": index_seconds, "index_write_batches": index_batches,
            "cpu_seconds_by_thread": pipeline_cpu,
        },
        "pipeline_overhead": 1.0 - pipeline_rate / best_rate,
        "pipeline_overhead_from_first_event": 1.0 - consuming_rate / best_rate,
        "event_to_searchable_ms": {"median": freshness_median, "max": freshness_max, "probes": latencies.len()},
        "peak_rss_mib": proc_status_mib("VmHWM:"),
    });
    let _ = std::fs::remove_dir_all(&config.index.path);
    let _ = std::fs::remove_file(&config_path);
    Ok(report)
}
