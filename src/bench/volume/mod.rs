//! `ragstream bench volume`: the job at a million chunks on one machine, the model taken out.
//!
//! The job's embedder is the instant in-process `/v1/embeddings` server of `bench scale` (hashed
//! bag-of-words vectors, 384-d), so what is measured is the pipeline and the index at volume: Kafka
//! consume, chunking, the differential upsert, index writes and flushes, the shard optimizations (segment
//! merges, HNSW builds) and queries against the grown index.
//!
//! Documents are a corpus repeated with varied ids (`<id>~<pass>`); from the second pass on, a quarter of
//! each text's words are swapped for corpus words picked by a hash of (document, position), so vectors
//! and BM25 terms differ from pass to pass (the HNSW graph does not index thousands of identical vectors)
//! while word statistics stay the corpus's. Events are produced ahead of the job with a bounded backlog.
//! 1. grow: documents stream in until `chunks` chunks are indexed, while one client sends queries one after
//!    another through the job's query ingress; ingest rate, round trips and RSS are reported per tenth of
//!    the target, and every round trip that overlapped a shard optimization is kept apart;
//! 2. idle: at full size, once writes and optimizations are done, `queries` round trips;
//! 3. loaded: `extra_chunks` more chunks stream in while the client goes on.
//!
//! Each phase also counts the worker's operator activations longer than 20, 50 and 100 ms, per operator
//! (`Dataflow` is a whole worker step): a query that arrives during one waits it out.
//!
//! Memory: peak and current RSS of the process, split into anonymous (heap: the job's arrangements, the
//! engine's in-memory structures) and file-backed (the index's memory-mapped segments) pages.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ragstream_operators::io::query_source::HttpIngress;
use ragstream_operators::metrics::metrics;
use ragstream_topologies::config::Config;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde_json::{json, Value};

mod phases;
mod recall;
use phases::{grow_phase, loaded_phase, settle, Base, Phase};
use recall::dense_recall;

/// Arguments of `bench volume`.
#[derive(clap::Args, Debug)]
pub struct VolumeBench {
    /// The corpus (repeated with varied ids and words up to the target), questions and broker.
    #[command(flatten)]
    pub data: crate::bench::QueryBenchData,
    /// Chunks to index before the idle phase.
    #[arg(long, default_value_t = 1_000_000)]
    pub chunks: u64,
    /// Chunks streamed in during the loaded phase.
    #[arg(long, default_value_t = 50_000)]
    pub extra_chunks: u64,
    /// Dataflow workers (one index shard each).
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Round trips in the idle phase (and at most in the loaded one).
    #[arg(long, default_value_t = 1000)]
    pub queries: usize,
}

const PARTITIONS: i32 = 4;
/// Documents produced ahead of the job's consumption.
const BACKLOG: u64 = 20_000;
/// Slices of the grow phase reported apart.
const BANDS: u64 = 10;

/// The repeated corpus.
struct Corpus {
    /// (id, title, text).
    documents: Vec<(String, String, String)>,
    vocabulary: Vec<String>,
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Corpus {
    fn read(path: &Path) -> anyhow::Result<Self> {
        let documents: Vec<(String, String, String)> = crate::bench::read_jsonl_lines(path)?
            .iter()
            .map(|d| {
                let field = |name: &str| d[name].as_str().unwrap_or_default().to_string();
                (field("_id"), field("title"), field("text"))
            })
            .collect();
        anyhow::ensure!(!documents.is_empty(), "{} has no documents", path.display());
        let vocabulary = documents
            .iter()
            .flat_map(|(_, _, text)| text.split_whitespace().map(str::to_string))
            .collect();
        Ok(Self {
            documents,
            vocabulary,
        })
    }

    /// The `serial`-th event: (Kafka key, payload, text bytes).
    fn event(&self, serial: u64) -> (String, String, usize) {
        let count = self.documents.len() as u64;
        let (pass, index) = (serial / count, (serial % count) as usize);
        let (id, title, text) = &self.documents[index];
        let text = if pass == 0 {
            text.clone()
        } else {
            text.split_whitespace()
                .enumerate()
                .map(|(position, word)| {
                    let hash = splitmix(serial.wrapping_mul(0x1_0000_0001) ^ position as u64);
                    if hash.is_multiple_of(4) {
                        self.vocabulary[(hash >> 8) as usize % self.vocabulary.len()].as_str()
                    } else {
                        word
                    }
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        let doc_id = format!("{id}~{pass}");
        let payload = json!({"tenant": "bench", "doc_id": doc_id, "version": 1, "kind": "prose",
            "title": title, "text": text})
        .to_string();
        (format!("bench/{doc_id}"), payload, text.len())
    }
}

/// One query round trip.
struct Sample {
    round_trip_ms: f64,
    /// The job's own latency without the query embedding stage.
    job_ms_without_embedding: f64,
    /// The job's milliseconds per stage.
    stages: std::collections::BTreeMap<String, f64>,
    /// A shard optimization ran at some point during the round trip.
    during_optimization: bool,
    /// Chunks indexed when the query was sent.
    chunks: u64,
}

/// Bounds (seconds) above which worker activations are counted per phase.
const LONG_ACTIVATIONS: [f64; 3] = [0.02, 0.05, 0.1];

/// Worker activations longer than each of [`LONG_ACTIVATIONS`] so far, per operator.
fn long_activations() -> Vec<BTreeMap<String, u64>> {
    LONG_ACTIVATIONS
        .iter()
        .map(|&bound| ragstream_operators::activations::longer_than(bound))
        .collect()
}

/// The activations counted by [`long_activations`] since `before`: per bound (ms), per operator.
fn long_activations_since(before: &[BTreeMap<String, u64>]) -> Value {
    let now = long_activations();
    let mut out = serde_json::Map::new();
    for ((bound, now), before) in LONG_ACTIVATIONS.iter().zip(&now).zip(before) {
        let added: serde_json::Map<String, Value> = now
            .iter()
            .map(|(operator, &n)| (operator, n - before.get(operator).copied().unwrap_or(0)))
            .filter(|&(_, n)| n > 0)
            .map(|(operator, n)| (operator.clone(), json!(n)))
            .collect();
        out.insert(
            format!("over_{}_ms", (bound * 1000.0).round()),
            Value::Object(added),
        );
    }
    Value::Object(out)
}

fn optimizations() -> (i64, u64) {
    (
        metrics().index_optimizations_running.get(),
        metrics().index_optimize_seconds.get_sample_count(),
    )
}

/// Sends `questions` one after another until `stop` is set or `limit` round trips are done.
fn ask_until(
    ingress: &HttpIngress,
    questions: &[String],
    first: usize,
    limit: usize,
    stop: &AtomicBool,
    chunks_base: u64,
) -> anyhow::Result<Vec<Sample>> {
    let mut samples = Vec::new();
    for (i, question) in questions.iter().cycle().skip(first).enumerate() {
        if samples.len() >= limit || stop.load(Ordering::SeqCst) {
            break;
        }
        let body = json!({"query_id": format!("volume-{first}-{i}"), "tenant": "bench",
            "text": question, "token_budget": 1000});
        let before = optimizations();
        let chunks = metrics().chunks_upserted.get() - chunks_base;
        let sent = Instant::now();
        let (_, reply) = ingress.submit(body.to_string().into_bytes());
        let context = reply.recv_timeout(Duration::from_secs(120))?;
        let round_trip_ms = sent.elapsed().as_secs_f64() * 1000.0;
        let after = optimizations();
        anyhow::ensure!(context.error.is_none(), "query failed: {:?}", context.error);
        let stage = |name: &str| context.latency_ms.get(name).copied().unwrap_or(0.0);
        samples.push(Sample {
            round_trip_ms,
            job_ms_without_embedding: stage("total") - stage("embed"),
            stages: context.latency_ms,
            during_optimization: before.0 > 0 || after.0 > 0 || after.1 != before.1,
            chunks,
        });
    }
    Ok(samples)
}

fn summary<'a>(samples: impl Iterator<Item = &'a Sample>) -> Value {
    let samples: Vec<&Sample> = samples.collect();
    let (round_trips, job): (Vec<f64>, Vec<f64>) = samples
        .iter()
        .map(|s| (s.round_trip_ms, s.job_ms_without_embedding))
        .unzip();
    let mut stages: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    for sample in &samples {
        for (stage, ms) in &sample.stages {
            stages.entry(stage).or_default().push(*ms);
        }
    }
    let stage_p50: serde_json::Map<String, Value> = stages
        .into_iter()
        .map(|(stage, values)| {
            let summary = crate::bench::latency_summary(values);
            (stage.to_string(), summary["p50_ms"].clone())
        })
        .collect();
    let during_optimization = samples.iter().filter(|s| s.during_optimization).count();
    json!({"round_trip": crate::bench::latency_summary(round_trips),
        "job_without_embedding": crate::bench::latency_summary(job),
        "stage_p50_ms": stage_p50, "during_optimization": during_optimization})
}

fn longest_during_optimization<'a>(samples: impl Iterator<Item = &'a Sample>) -> f64 {
    samples
        .filter(|s| s.during_optimization)
        .map(|s| s.round_trip_ms)
        .fold(0.0, f64::max)
}

fn memory() -> Value {
    let field = crate::bench::proc_status_mib;
    json!({"rss_mib": field("VmRSS:"), "anonymous_mib": field("RssAnon:"),
        "file_backed_mib": field("RssFile:"), "peak_rss_mib": field("VmHWM:")})
}

/// Bytes allocated on disk under `path`.
fn disk_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => disk_bytes(&entry.path()),
            Ok(meta) => meta.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

/// Produces the corpus's events in order, a bounded backlog ahead of the job.
struct Feeder<'a> {
    corpus: &'a Corpus,
    producer: BaseProducer,
    topic: String,
    next: u64,
    text_bytes: u64,
}

impl Feeder<'_> {
    /// Produces events, at most [`BACKLOG`] ahead of the job, until `enough(produced)`; then waits until
    /// the job acknowledged all of them. Calls `tick` between steps. Returns the events produced.
    fn feed(
        &mut self,
        consumed_base: u64,
        enough: &dyn Fn(u64) -> bool,
        mut tick: impl FnMut(),
    ) -> anyhow::Result<u64> {
        let first = self.next;
        let deadline = Instant::now() + Duration::from_secs(4 * 3600);
        loop {
            let produced = self.next - first;
            let consumed = metrics().source_events.get() - consumed_base;
            if !enough(produced) && produced < consumed + BACKLOG {
                for _ in 0..500 {
                    let (key, payload, bytes) = self.corpus.event(self.next);
                    crate::bench::send_blocking(
                        &self.producer,
                        BaseRecord::to(&self.topic).key(&key).payload(&payload),
                    );
                    self.next += 1;
                    self.text_bytes += bytes as u64;
                }
                self.producer.poll(Duration::ZERO);
            } else if enough(produced)
                && consumed >= produced
                && metrics().in_flight_messages.get() == 0
            {
                self.producer.flush(Duration::from_secs(60))?;
                return Ok(produced);
            } else {
                self.producer.poll(Duration::from_millis(5));
            }
            tick();
            anyhow::ensure!(
                Instant::now() < deadline,
                "ingest did not finish in 4 hours"
            );
        }
    }
}

/// `enough` for [`Feeder::feed`]: whether the events produced since `from_events` bring the chunks
/// indexed since the counter stood at `from_chunks` to `target`, counting the events not yet
/// acknowledged at the chunks-per-event rate seen since `run` (chunk and event counters at the start).
fn reaches(
    target: u64,
    from_chunks: u64,
    from_events: u64,
    run: (u64, u64),
) -> impl Fn(u64) -> bool {
    move |produced| {
        let (chunks, events) = (
            metrics().chunks_upserted.get(),
            metrics().source_events.get(),
        );
        let in_flight = metrics().in_flight_messages.get().max(0) as u64;
        let pending = produced.saturating_sub(events - from_events) + in_flight;
        let acknowledged = (events - run.1).saturating_sub(in_flight).max(1);
        let rate = ((chunks - run.0) as f64 / acknowledged as f64).max(1.0);
        (chunks - from_chunks) as f64 + pending as f64 * rate >= target as f64
    }
}

/// Starts the instant embedder; writes, loads and validates the job's configuration.
fn job_config(args: &VolumeBench, run: &str, topic: &str, index: &Path) -> anyhow::Result<Config> {
    let config_path = std::env::temp_dir().join(format!("ragstream-bench-volume-{run}.toml"));
    let embedder = crate::bench::scale::instant_embedder()?;
    std::fs::write(
        &config_path,
        format!(
            "[source]\nkind = \"kafka\"\n[kafka]\nbrokers = \"{}\"\ndocuments_topic = \"{topic}\"\nqueries_topic = \"volume-queries-{run}\"\ncontexts_topic = \"volume-contexts-{run}\"\ndlq_topic = \"volume-dlq-{run}\"\ngroup_id = \"volume-{run}\"\n[embedder]\nkind = \"http\"\nurl = \"{embedder}\"\ndimension = {}\nbatch_size = 64\n[index]\npath = {:?}\n[http]\nlisten = \"127.0.0.1:0\"\n[runtime]\nworkers = {}\n",
            args.data.brokers,
            crate::bench::scale::DIMENSION,
            index.display().to_string(),
            args.workers,
        ),
    )?;
    let config = Config::load(&config_path)?;
    config.validate()?;
    Ok(config)
}

/// Runs the benchmark and returns its report.
pub fn volume(args: VolumeBench) -> anyhow::Result<Value> {
    let run = format!(
        "{}-{}",
        std::process::id(),
        ragstream_operators::now_millis()
    );
    let corpus = Corpus::read(&args.data.corpus)?;
    let questions = crate::bench::read_questions(&args.data.questions, 2 * args.queries)?;
    let topic = format!("volume-docs-{run}");
    let index = std::env::temp_dir().join(format!("ragstream-bench-volume-{run}"));
    let config = job_config(&args, &run, &topic, &index)?;
    let tuning = config.index.tuning;
    let client = config.kafka.client_config();
    ragstream_operators::io::kafka_admin::ensure_topics(&client, &[(&topic, PARTITIONS)])
        .map_err(anyhow::Error::msg)?;
    let mut feeder = Feeder {
        corpus: &corpus,
        producer: client.clone().set("linger.ms", "20").create()?,
        topic,
        next: 0,
        text_bytes: 0,
    };
    let base = Base {
        chunks: metrics().chunks_upserted.get(),
        events: metrics().source_events.get(),
    };
    let running = crate::runtime::start(config)?;

    // 1. Grow to the target while one client queries.
    let stop = AtomicBool::new(false);
    let phase = Phase {
        ingress: &running.ingress,
        questions: &questions,
        args: &args,
        stop: &stop,
        base,
    };
    let grow = grow_phase(phase, &mut feeder)?;

    // 2. Idle at full size: once the writer's optimization on going idle is done.
    let settle_seconds = settle(tuning);
    let at_full_size = json!({"memory": memory(), "disk_mib": disk_bytes(&index) as f64 / 1048576.0,
        "text_mib": feeder.text_bytes as f64 / 1048576.0});
    eprintln!("at full size: {at_full_size}");
    stop.store(false, Ordering::SeqCst);
    let idle_activations = long_activations();
    let idle = ask_until(
        &running.ingress,
        &questions,
        questions.len() / 2,
        args.queries,
        &stop,
        base.chunks,
    )?;

    let idle_activations = long_activations_since(&idle_activations);

    // 3. Loaded at full size.
    let loaded = loaded_phase(phase, &mut feeder)?;
    let end = json!({"memory": memory(), "disk_mib": disk_bytes(&index) as f64 / 1048576.0});
    running.shutdown.store(true, Ordering::SeqCst);
    let _ = running.join();
    let idle_questions = &questions[questions.len() / 2..];
    let recall = dense_recall(&index, args.workers, tuning, idle_questions);
    let _ = std::fs::remove_dir_all(&index);
    let recall = recall?;

    let optimize = &metrics().index_optimize_seconds;
    Ok(json!({
        "corpus": args.data.corpus.display().to_string(),
        "workers": args.workers,
        "partitions": PARTITIONS,
        "embedder": "instant in-process /v1/embeddings (model time excluded)",
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "grow": grow.report(args.chunks, settle_seconds),
        "optimizations": {"count": optimize.get_sample_count(), "seconds": optimize.get_sample_sum()},
        "at_full_size": at_full_size,
        "idle": summary(idle.iter()),
        "idle_long_activations": idle_activations,
        "loaded": loaded.report(),
        "end": end,
        "tuning": format!("{tuning:?}"),
        "dense_recall": recall,
        "peak_rss_mib": crate::bench::proc_status_mib("VmHWM:"),
    }))
}
