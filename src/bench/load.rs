//! `ragstream bench load`: `POST /v1/query` round trips while documents stream in at full embedding speed,
//! against the same kind of queries with ingest idle, in one run of the job in this process.
//!
//! The job reads a fresh Kafka topic into a fresh embedded index (or a fresh collection of the Qdrant
//! server at `--index-url`) with the configured embedder (the local
//! int8 model by default). One client sends queries one after another over HTTP; each pair of queries is
//! a new question (embedded on the query path) and an earlier question at another budget (its vector
//! comes from the job's embedding cache: no model on the path, and no context-cache hit), at
//! `--budgets` (600 and 700 tokens by default), packed to the budget with `--fill`.
//! 1. seed: the first `seed` documents are produced and indexed, so queries retrieve something;
//! 2. idle: `queries` round trips with ingest idle;
//! 3. loaded: the rest of the corpus is produced at once and, while the job ingests it, the client goes
//!    on until ingest is done (at most `queries` round trips of each kind are kept); the ingest rate of
//!    the phase is reported with them.

use std::path::Path;
use std::time::{Duration, Instant};

use ragstream_operators::metrics::metrics;
use ragstream_topologies::config::Config;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use serde_json::{json, Value};

use crate::bench::latency_summary as summary;

/// Arguments of `bench load`.
#[derive(clap::Args, Debug)]
pub struct LoadBench {
    /// The corpus, questions and broker.
    #[command(flatten)]
    pub data: crate::bench::QueryBenchData,
    /// Documents indexed before the idle phase.
    #[arg(long, default_value_t = 200)]
    pub seed: usize,
    /// Round trips of each kind per phase.
    #[arg(long, default_value_t = 100)]
    pub queries: usize,
    /// Extra config (TOML, appended; `\n` for a line break), e.g. "[embedder]\nthreads = 1".
    #[arg(long, default_value = "")]
    pub config_extra: String,
    /// A Qdrant server (gRPC URL) to index into, in a fresh collection, instead of an embedded
    /// index (empty: embedded).
    #[arg(long, default_value = "")]
    pub index_url: String,
    /// Token budgets of each pair's new question and earlier question (two different budgets: the
    /// earlier question must miss the context cache).
    #[arg(long, value_delimiter = ',', default_values_t = [600, 700])]
    pub budgets: Vec<usize>,
    /// Every query packed to its budget (`fill: true`) instead of stopping once the evidence is in.
    #[arg(long)]
    pub fill: bool,
}

/// Round trips of one phase: (new questions, cached vectors).
#[derive(Default)]
struct Phase {
    embedded: Vec<f64>,
    cached: Vec<f64>,
    /// The job's own `latency_ms.total` of the new questions.
    job_total: Vec<f64>,
}

impl Phase {
    /// The phase's round trips as the report gives them.
    fn report(&self) -> Value {
        json!({"with_query_embedding": summary(self.embedded.clone()), "embedding_cached": summary(self.cached.clone()), "job_latency_total": summary(self.job_total.clone())})
    }
}

/// Waits until `events` source events since `start` are consumed and nothing is in flight.
fn wait_ingested(events: u64, start: u64, deadline: Instant) -> bool {
    metrics().source_events.get().saturating_sub(start) >= events
        && metrics().in_flight_messages.get() == 0
        || Instant::now() > deadline
}

/// Writes, loads and validates the job's configuration (index at `index` or on `index_url`).
fn job_config(
    args: &LoadBench,
    run: &str,
    index: &Path,
    index_url: Option<&str>,
) -> anyhow::Result<Config> {
    let config_path = std::env::temp_dir().join(format!("ragstream-bench-load-{run}.toml"));
    let index_section = match index_url {
        Some(url) => {
            format!("kind = \"server\"\nurl = {url:?}\ncollection = \"load_{run}\"")
        }
        None => format!("path = {:?}", index.display().to_string()),
    };
    std::fs::write(
        &config_path,
        format!(
            "[source]\nkind = \"kafka\"\n[kafka]\nbrokers = \"{}\"\ndocuments_topic = \"load-docs-{run}\"\nqueries_topic = \"load-queries-{run}\"\ncontexts_topic = \"load-contexts-{run}\"\ndlq_topic = \"load-dlq-{run}\"\ngroup_id = \"load-{run}\"\n[index]\n{index_section}\n[http]\nlisten = \"127.0.0.1:0\"\n[runtime]\nworkers = 1\n{}\n",
            args.data.brokers,
            args.config_extra.replace("\\n", "\n"),
        ),
    )?;
    let config = Config::load(&config_path)?;
    config.validate()?;
    Ok(config)
}

/// The embedder's settings, as the report gives them.
fn embedder_settings(config: &Config) -> Value {
    json!({"kind": format!("{:?}", config.embedder.kind), "precision": format!("{:?}", config.embedder.precision), "threads": config.embedder.threads, "executors": config.embedder.executors(), "query_executor": config.embedder.query_executor(), "slice_word_pieces": config.embedder.slice_word_pieces})
}

/// Produces `documents` to `topic` as prose of the tenant `bench`, and waits for delivery.
fn produce(producer: &BaseProducer, topic: &str, documents: &[Value]) -> anyhow::Result<()> {
    for document in documents {
        let doc_id = document["_id"].as_str().unwrap_or_default();
        let id = format!("bench/{doc_id}");
        let body = json!({"tenant": "bench", "doc_id": doc_id, "version": 1, "kind": "prose", "title": document["title"], "text": document["text"]}).to_string();
        crate::bench::send_blocking(producer, BaseRecord::to(topic).key(&id).payload(&body));
    }
    producer.flush(Duration::from_secs(60))?;
    Ok(())
}

/// The query client: asks pairs of questions over HTTP, each a new question then an earlier one.
struct Asker<'a> {
    agent: ureq::Agent,
    /// The job's `/v1/query`.
    url: String,
    questions: &'a [String],
    /// The next new question.
    next_question: usize,
    /// Names the query ids.
    run: &'a str,
    /// The new question's budget and the earlier question's.
    budgets: (usize, usize),
    /// Every query packed to its budget.
    fill: bool,
}

impl Asker<'_> {
    /// One pair: a new question, then an earlier one at another budget, timed into `phase`.
    fn pair(&mut self, phase: &mut Phase, serial: usize) -> anyhow::Result<()> {
        let (new_budget, cached_budget) = self.budgets;
        let new = &self.questions[self.next_question];
        let earlier = &self.questions[self.next_question.saturating_sub(1)];
        self.next_question += 1;
        for (text, budget, embedded) in [(new, new_budget, true), (earlier, cached_budget, false)] {
            let body = json!({"query_id": format!("load-{serial}-{budget}-{}", self.run), "tenant": "bench", "text": text, "token_budget": budget, "fill": self.fill});
            let (context, ms) = crate::bench::round_trip(&self.agent, &self.url, &body)?;
            if embedded {
                phase.embedded.push(ms);
                phase
                    .job_total
                    .push(context["latency_ms"]["total"].as_f64().unwrap_or(0.0));
            } else {
                phase.cached.push(ms);
            }
        }
        Ok(())
    }
}

/// What the loaded phase measured.
struct Loaded {
    /// Round trips while the job ingested.
    phase: Phase,
    /// From the first document produced until all were ingested.
    seconds: f64,
    /// Chunks indexed meanwhile.
    chunks: u64,
}

/// Phase 3: produces `rest` at once and asks pairs (at most `queries`) until the job ingested it.
fn loaded_phase(
    asker: &mut Asker<'_>,
    (producer, topic): (&BaseProducer, &str),
    rest: &[Value],
    queries: usize,
) -> anyhow::Result<Loaded> {
    let chunks_before = metrics().chunks_upserted.get();
    let loaded_start = Instant::now();
    let events_before = metrics().source_events.get();
    produce(producer, topic, rest)?;
    let mut loaded = Phase::default();
    let deadline = Instant::now() + Duration::from_secs(3600);
    let mut serial = 100_000;
    while !wait_ingested(rest.len() as u64, events_before, deadline) {
        if loaded.embedded.len() < queries {
            asker.pair(&mut loaded, serial)?;
            serial += 1;
        } else {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let ingest_seconds = loaded_start.elapsed().as_secs_f64();
    let chunks = metrics().chunks_upserted.get() - chunks_before;
    eprintln!(
        "loaded: {} pairs while {} chunks were ingested in {ingest_seconds:.1} s",
        loaded.embedded.len(),
        chunks
    );
    Ok(Loaded {
        phase: loaded,
        seconds: ingest_seconds,
        chunks,
    })
}

/// Runs the benchmark and returns its report.
pub fn load(args: LoadBench) -> anyhow::Result<Value> {
    let run = format!(
        "{}-{}",
        std::process::id(),
        ragstream_operators::now_millis()
    );
    let documents = crate::bench::read_jsonl_lines(&args.data.corpus)?;
    let questions = crate::bench::read_questions(&args.data.questions, 4 * args.queries)?;
    let &[new_budget, cached_budget] = args.budgets.as_slice() else {
        anyhow::bail!("--budgets takes two budgets: the new question's and the earlier one's");
    };
    anyhow::ensure!(
        new_budget != cached_budget,
        "--budgets: the two budgets must differ (the earlier question must miss the context cache)"
    );
    anyhow::ensure!(
        documents.len() > args.seed,
        "the corpus has no documents after the seed"
    );
    let index = std::env::temp_dir().join(format!("ragstream-bench-load-{run}"));
    let index_url = Some(args.index_url.as_str()).filter(|url| !url.is_empty());
    let config = job_config(&args, &run, &index, index_url)?;
    let embedder = embedder_settings(&config);
    ragstream_operators::io::kafka_admin::ensure_topics(
        &config.kafka.client_config(),
        &[(format!("load-docs-{run}").as_str(), 1)],
    )
    .map_err(anyhow::Error::msg)?;
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &args.data.brokers)
        .set("linger.ms", "5")
        .create()?;
    let topic = format!("load-docs-{run}");
    let start_events = metrics().source_events.get();
    let running = crate::runtime::start(config)?;
    let mut asker = Asker {
        agent: ureq::Agent::new_with_defaults(),
        url: format!("http://{}/v1/query", running.address),
        questions: &questions,
        next_question: 0,
        run: &run,
        budgets: (new_budget, cached_budget),
        fill: args.fill,
    };

    // 1. Seed.
    let seeded = Instant::now();
    produce(&producer, &topic, &documents[..args.seed])?;
    let deadline = Instant::now() + Duration::from_secs(3600);
    while !wait_ingested(args.seed as u64, start_events, deadline) {
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "seeded {} documents in {:.1} s",
        args.seed,
        seeded.elapsed().as_secs_f64()
    );
    // Warm the query path (first-use costs), then 2. idle.
    let mut warm = Phase::default();
    for i in 0..5 {
        asker.pair(&mut warm, i)?;
    }
    let mut idle = Phase::default();
    for i in 0..args.queries {
        asker.pair(&mut idle, 100 + i)?;
    }
    eprintln!("idle: {} pairs", idle.embedded.len());

    // 3. Loaded.
    let rest = &documents[args.seed..];
    let Loaded {
        phase: loaded,
        seconds: ingest_seconds,
        chunks,
    } = loaded_phase(&mut asker, (&producer, &topic), rest, args.queries)?;
    running
        .shutdown
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = running.join();
    let _ = std::fs::remove_dir_all(&index);
    let p50 = |v: &[f64]| summary(v.to_vec())["p50_ms"].as_f64().unwrap_or(0.0);
    Ok(json!({
        "embedder": embedder,
        "queries": {"budgets": [new_budget, cached_budget], "fill": args.fill},
        "index": if index_url.is_some() { "qdrant server" } else { "embedded" },
        "documents": {"seed": args.seed, "streamed": rest.len()},
        "idle": idle.report(),
        "loaded": loaded.report(),
        "loaded_over_idle_p50": {"with_query_embedding": p50(&loaded.embedded) / p50(&idle.embedded), "embedding_cached": p50(&loaded.cached) / p50(&idle.cached)},
        "ingest": {"chunks": chunks, "seconds": ingest_seconds, "chunks_per_s": chunks as f64 / ingest_seconds},
    }))
}
