//! `ragstream bench query`: query latency through Kafka at a steady offered rate, on an indexed corpus.
//!
//! The job runs in this process on the given index (e.g. the one `ragstream eval` built for SQuAD and
//! SciFact), with fresh queries/contexts topics. Queries (SQuAD questions and SciFact claims, each to
//! its tenant) are produced at `rate` per second for `seconds`; a reader on the contexts topic records
//! when each context arrives. Latency = context received − query produced.
//!
//! Phases, in this order (so one phase's backlog never delays the next one's measurement):
//! 1. `unpaced_with_embedding`: texts A produced at once; the rate the job sustains when every query is
//!    embedded on the query path (this also puts A's vectors in the job's embedding cache);
//! 2. `embedding_cached`: texts A again at `rate` (another budget, so no context-cache hit): the query
//!    vectors come from the embedding cache, i.e. the pipeline's latency without the model;
//! 3. `with_embedding`: new texts B at `rate`: every query embedded on the query path.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ragstream_core::query::Context;
use ragstream_topologies::config::Config;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use serde_json::{json, Value};

/// Arguments of `bench query`.
#[derive(clap::Args, Debug)]
pub struct QueryBench {
    /// Kafka bootstrap servers.
    #[arg(long)]
    pub brokers: String,
    /// An index holding the `squad` and `scifact` tenants (built by `ragstream eval`).
    #[arg(long, default_value = ".ragstream/eval/index")]
    pub index: PathBuf,
    /// BEIR data root (for the query texts).
    #[arg(long, default_value = "../shared/data", env = "RAGSTREAM_DATA")]
    pub data: PathBuf,
    /// Offered queries per second.
    #[arg(long, default_value_t = 200.0)]
    pub rate: f64,
    /// Seconds per phase.
    #[arg(long, default_value_t = 20.0)]
    pub seconds: f64,
}

fn texts(data: &std::path::Path) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (tenant, path) in [
        ("squad", data.join("squad-v1.1/questions.jsonl")),
        ("scifact", data.join("scifact/queries.jsonl")),
    ] {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let value: Value = serde_json::from_str(line)?;
            out.push((
                tenant.to_string(),
                value["text"].as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    // Interleave the tenants deterministically.
    out.sort_by_key(|(_, text)| {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut hasher);
        hasher.finish()
    });
    Ok(out)
}

fn summary(mut values: Vec<f64>) -> Value {
    values.sort_by(|a, b| a.total_cmp(b));
    let at = |p: f64| {
        if values.is_empty() {
            0.0
        } else {
            values[((p / 100.0) * (values.len() - 1) as f64).round() as usize]
        }
    };
    json!({"n": values.len(), "p50_ms": at(50.0), "p95_ms": at(95.0), "p99_ms": at(99.0), "max_ms": values.last().copied().unwrap_or(0.0)})
}

/// The name of this run's topic `name`.
fn topic(name: &str, run: &str) -> String {
    format!("bench-{name}-{run}")
}

/// Writes the job's configuration and starts the job; the job and the configuration's path.
fn start_job(args: &QueryBench, run: &str) -> anyhow::Result<(crate::runtime::Running, PathBuf)> {
    let config_path = std::env::temp_dir().join(format!("ragstream-bench-query-{run}.toml"));
    std::fs::write(
        &config_path,
        format!(
            "[source]\nkind = \"kafka\"\n[kafka]\nbrokers = \"{}\"\ndocuments_topic = \"{}\"\nqueries_topic = \"{}\"\ncontexts_topic = \"{}\"\ndlq_topic = \"{}\"\ngroup_id = \"bench-{run}\"\n[index]\npath = {:?}\n[http]\nlisten = \"127.0.0.1:0\"\n[runtime]\nworkers = 1\n",
            args.brokers,
            topic("docs", run),
            topic("queries", run),
            topic("contexts", run),
            topic("dlq", run),
            args.index.display().to_string(),
        ),
    )?;
    let config = Config::load(&config_path)?;
    let client = config.kafka.client_config();
    ragstream_operators::io::kafka_admin::ensure_topics(&client, &[(&topic("docs", run), 1)])
        .map_err(anyhow::Error::msg)?;
    let running = crate::runtime::start(config)?;
    Ok((running, config_path))
}

/// Contexts read from the contexts topic, by query id: when each arrived, and the context.
type Received = Arc<Mutex<HashMap<String, (Instant, Context)>>>;

/// Starts a thread that reads the contexts topic from its beginning into `received`, for good.
fn spawn_reader(brokers: &str, run: &str, received: &Received) -> anyhow::Result<()> {
    let received = received.clone();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("bench-reader-{run}"))
        .set("enable.auto.commit", "false")
        .create()?;
    let mut assignment = TopicPartitionList::new();
    // The runtime created the contexts topic (one partition).
    assignment.add_partition_offset(&topic("contexts", run), 0, Offset::Beginning)?;
    consumer.assign(&assignment)?;
    std::thread::spawn(move || loop {
        if let Some(Ok(message)) = consumer.poll(Duration::from_millis(50)) {
            let now = Instant::now();
            if let Some(Ok(context)) = message.payload().map(serde_json::from_slice::<Context>) {
                received
                    .lock()
                    .expect("received")
                    .insert(context.query_id.clone(), (now, context));
            }
        }
    });
    Ok(())
}

/// Produces queries to the job's queries topic and reads the answers the reader collected.
struct Phases<'a> {
    /// Names the query ids.
    run: &'a str,
    /// The job's queries topic.
    queries_topic: String,
    producer: BaseProducer,
    received: Received,
}

impl Phases<'_> {
    /// Produces `items` as queries at `rate` per second; each query's id and when it was sent.
    fn offer(
        &self,
        name: &str,
        items: &[(String, String)],
        (budget, rate): (usize, f64),
        started: Instant,
    ) -> Vec<(String, Instant)> {
        let mut sent: Vec<(String, Instant)> = Vec::with_capacity(items.len());
        for (i, (tenant, text)) in items.iter().enumerate() {
            let due = started + Duration::from_secs_f64(i as f64 / rate);
            while Instant::now() < due {
                self.producer.poll(Duration::ZERO);
                std::thread::sleep(Duration::from_micros(200));
            }
            let id = format!("{name}-{i}-{}", self.run);
            let body =
                json!({"query_id": id, "tenant": tenant, "text": text, "token_budget": budget})
                    .to_string();
            crate::bench::send_blocking(
                &self.producer,
                BaseRecord::to(&self.queries_topic).key(&id).payload(&body),
            );
            sent.push((id, Instant::now()));
        }
        sent
    }

    /// Waits up to 5 minutes for the context of every query `sent`.
    fn wait_answered(&self, sent: &[(String, Instant)]) {
        let deadline = Instant::now() + Duration::from_secs(300);
        while Instant::now() < deadline {
            let map = self.received.lock().expect("received");
            if sent.iter().all(|(id, _)| map.contains_key(id)) {
                break;
            }
            drop(map);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One phase: `items` offered at `rate` with `budget` tokens; its latencies and achieved rate.
    fn measure(
        &self,
        name: &str,
        items: &[(String, String)],
        budget: usize,
        rate: f64,
    ) -> anyhow::Result<Value> {
        let started = Instant::now();
        let sent = self.offer(name, items, (budget, rate), started);
        self.producer.flush(Duration::from_secs(30))?;
        let offered_seconds = started.elapsed().as_secs_f64();
        self.wait_answered(&sent);
        let map = self.received.lock().expect("received");
        let mut latency = Vec::new();
        let mut without_embed = Vec::new();
        let mut stages: HashMap<String, Vec<f64>> = HashMap::new();
        let mut last = started;
        for (id, at) in &sent {
            if let Some((got, context)) = map.get(id) {
                let ms = got.duration_since(*at).as_secs_f64() * 1000.0;
                latency.push(ms);
                without_embed.push(ms - context.latency_ms.get("embed").copied().unwrap_or(0.0));
                for (stage, value) in &context.latency_ms {
                    stages.entry(stage.clone()).or_default().push(*value);
                }
                last = last.max(*got);
            }
        }
        let answered = latency.len();
        Ok(json!({
            "offered_rate": rate,
            "sent": sent.len(),
            "answered": answered,
            "offered_seconds": offered_seconds,
            "achieved_rate": answered as f64 / last.duration_since(started).as_secs_f64().max(1e-9),
            "latency_produce_to_context": summary(latency),
            "latency_minus_embedding": summary(without_embed),
            "stages_ms": stages.into_iter().map(|(k, v)| (k, summary(v))).collect::<serde_json::Map<_, _>>(),
        }))
    }
}

/// Runs the benchmark and returns its report.
pub fn query(args: QueryBench) -> anyhow::Result<Value> {
    let run = format!(
        "{}-{}",
        std::process::id(),
        ragstream_operators::now_millis()
    );
    let (running, config_path) = start_job(&args, &run)?;

    // The reader of the contexts topic.
    let received: Received = Arc::default();
    spawn_reader(&args.brokers, &run, &received)?;
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .set("linger.ms", "0")
        .create()?;
    let all = texts(&args.data)?;
    let per_phase = (args.rate * args.seconds).round() as usize;
    anyhow::ensure!(
        all.len() >= 2 * per_phase + 20,
        "not enough query texts for {per_phase} queries"
    );
    let phases = Phases {
        run: &run,
        queries_topic: topic("queries", &run),
        producer,
        received,
    };
    // Warm up (model, index caches, consumer group join).
    let (texts_a, rest) = all.split_at(per_phase);
    let (texts_b, rest) = rest.split_at(per_phase);
    let warm = phases.measure("warmup", &rest[..20], 3000, args.rate)?;
    eprintln!("warm-up: {}", warm["latency_produce_to_context"]);
    let unpaced = phases.measure("unpaced", texts_a, 3000, 1e9)?;
    eprintln!(
        "unpaced, with embedding: {} answered/s",
        unpaced["achieved_rate"]
    );
    let cached = phases.measure("cached", texts_a, 2999, args.rate)?;
    eprintln!("embedding cached: {}", cached["latency_produce_to_context"]);
    let with_embedding = phases.measure("embed", texts_b, 3000, args.rate)?;
    eprintln!(
        "with embedding: {}",
        with_embedding["latency_produce_to_context"]
    );
    running
        .shutdown
        .store(true, std::sync::atomic::Ordering::SeqCst);
    running.join()?;
    let _ = std::fs::remove_file(&config_path);
    Ok(json!({
        "rate": args.rate,
        "seconds_per_phase": args.seconds,
        "unpaced_with_embedding": unpaced,
        "embedding_cached": cached,
        "with_embedding": with_embedding,
    }))
}
