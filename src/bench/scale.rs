//! `ragstream bench scale`: ingest and query throughput of the job at several worker counts, measured
//! in one run so the ratios compare like with like on this machine.
//!
//! The model is taken out of the measurement: the job's embedder is the HTTP embedder pointed at an
//! instant `/v1/embeddings` server inside this process (hashed bag-of-words vectors, 384-d), so what is
//! measured is the pipeline (Kafka consume, decode, guard, chunk, differential upsert, exchange by key,
//! index write and flush, offset store; and for queries intent, search of every shard, fusion, rerank,
//! dedup, MMR, packing with the real tokenizer) plus one local HTTP round trip per embedding call.
//!
//! For each worker count: a fresh index and consumer group ingest the whole corpus from a 4-partition
//! topic (documents per second from the first event consumed to the last acknowledged by the index;
//! the time from the job's start to the group's commit of every partition is reported too), then a fixed set
//! of bounded queries is answered through the job's query ingress with 32 in flight (queries per
//! second, and the latency median). The worker counts are measured in interleaved rounds (1, 2, 4, 1, 2,
//! 4, …) so drift on a shared machine spreads over all of them; the report gives each count's median.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ragstream_topologies::config::Config;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::{json, Value};

/// Arguments of `bench scale`.
#[derive(clap::Args, Debug)]
pub struct ScaleBench {
    /// BEIR corpus (`{_id, title, text}` per line).
    #[arg(long)]
    pub corpus: PathBuf,
    /// Kafka bootstrap servers.
    #[arg(long)]
    pub brokers: String,
    /// Use only the first N documents.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Worker counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub workers: Vec<usize>,
    /// Queries per worker count.
    #[arg(long, default_value_t = 2000)]
    pub queries: usize,
    /// Rounds over the worker counts (interleaved: 1, 2, 4, 1, 2, 4, …); medians are reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
}

const PARTITIONS: i32 = 4;
pub(crate) const DIMENSION: usize = 384;
const QUERIES_IN_FLIGHT: usize = 32;

/// A tiny_http server on `listen` whose connections send each write at once (`TCP_NODELAY`, which
/// accepted sockets inherit from the listener on Linux): tiny_http writes a response's head and body
/// separately, and with Nagle's algorithm the body waited for the client's delayed ACK.
fn listen_nodelay(listen: &str) -> anyhow::Result<tiny_http::Server> {
    let listener = std::net::TcpListener::bind(listen)
        .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
    socket2::SockRef::from(&listener)
        .set_tcp_nodelay(true)
        .map_err(|e| anyhow::anyhow!("TCP_NODELAY on {listen}: {e}"))?;
    tiny_http::Server::from_listener(listener, None)
        .map_err(|e| anyhow::anyhow!("cannot serve on {listen}: {e}"))
}

/// Serves an instant OpenAI-compatible `/v1/embeddings` on loopback; returns its URL.
pub(crate) fn instant_embedder() -> anyhow::Result<String> {
    let server = listen_nodelay("127.0.0.1:0")?;
    let url = format!(
        "http://{}",
        server.server_addr().to_ip().context("a TCP address")?
    );
    std::thread::spawn(move || {
        for mut request in server.incoming_requests() {
            let mut body = Vec::new();
            let _ = request.as_reader().read_to_end(&mut body);
            let input: Value = serde_json::from_slice(&body).unwrap_or_default();
            let data: Vec<Value> = input["input"]
                .as_array()
                .map(|texts| {
                    texts
                        .iter()
                        .enumerate()
                        .map(|(index, text)| {
                            json!({"index": index, "embedding": hashed(text.as_str().unwrap_or(""))})
                        })
                        .collect()
                })
                .unwrap_or_default();
            let response = json!({"data": data}).to_string();
            let header = tiny_http::Header::from_bytes("Content-Type", "application/json")
                .expect("static header");
            let _ = request.respond(tiny_http::Response::from_string(response).with_header(header));
        }
    });
    Ok(url)
}

/// A bag-of-words vector: similar texts get similar vectors, at no model cost.
pub fn hashed(text: &str) -> Vec<f32> {
    let mut vector = vec![0.0f32; DIMENSION];
    for word in text.split_whitespace() {
        let hash = word.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        vector[(hash % DIMENSION as u64) as usize] += 1.0;
    }
    vector[0] += 0.01;
    vector
}

fn committed(consumer: &BaseConsumer, topic: &str) -> anyhow::Result<Vec<i64>> {
    let mut list = TopicPartitionList::new();
    for partition in 0..PARTITIONS {
        list.add_partition(topic, partition);
    }
    let offsets = consumer.committed_offsets(list, Duration::from_secs(5))?;
    Ok((0..PARTITIONS)
        .map(
            |p| match offsets.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(offset)) => offset,
                _ => -1,
            },
        )
        .collect())
}

/// The first `limit` documents of a BEIR corpus, parsed.
fn read_documents(corpus: &std::path::Path, limit: Option<usize>) -> anyhow::Result<Vec<Value>> {
    let text =
        std::fs::read_to_string(corpus).with_context(|| format!("reading {}", corpus.display()))?;
    Ok(text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(limit.unwrap_or(usize::MAX))
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?)
}

/// Produces every document to `topic` as an upsert of the tenant `bench`, and waits for delivery.
fn produce_corpus(producer: &BaseProducer, topic: &str, documents: &[Value]) -> anyhow::Result<()> {
    for document in documents {
        let id = document["_id"].as_str().unwrap_or_default();
        let event = json!({
            "op": "upsert", "tenant": "bench", "doc_id": id, "version": 1, "source": id,
            "kind": "prose", "title": document["title"], "text": document["text"],
        })
        .to_string();
        let key = format!("bench/{id}");
        crate::bench::send_blocking(producer, BaseRecord::to(topic).key(&key).payload(&event));
    }
    producer.flush(Duration::from_secs(60))?;
    Ok(())
}

/// The end offset of each partition of `topic`, as `reader` fetches them.
fn high_watermarks(reader: &BaseConsumer, topic: &str) -> anyhow::Result<Vec<i64>> {
    (0..PARTITIONS)
        .map(|p| Ok(reader.fetch_watermarks(topic, p, Duration::from_secs(5))?.1))
        .collect::<anyhow::Result<_>>()
}

/// `count` questions of ten words each, from every seventh document (the corpus cycled).
fn questions_from(documents: &[Value], count: usize) -> Vec<String> {
    documents
        .iter()
        .cycle()
        .step_by(7)
        .take(count)
        .map(|d| {
            let text = d["text"].as_str().unwrap_or_default();
            text.split_whitespace()
                .skip(5)
                .take(10)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// What every round of the benchmark shares.
struct Shared {
    /// Names this run's topics, groups and scratch directory.
    run: String,
    /// The documents topic, produced once.
    topic: String,
    /// The broker connection settings.
    client: ClientConfig,
    /// Kafka bootstrap servers.
    brokers: String,
    /// The URL of the instant embedder.
    embedder: String,
    /// Where each round's configuration and index go.
    scratch: PathBuf,
    /// Documents produced to the topic.
    documents: usize,
    /// The end offset of each partition of the topic.
    high: Vec<i64>,
    /// The questions asked in every round.
    questions: Vec<String>,
}

/// How long one round's ingest took.
struct IngestTimes {
    /// From the first event consumed to the last acknowledged by the index.
    seconds: f64,
    /// From the job's start to the group's commit of every partition.
    start_to_committed_seconds: f64,
}

/// The questions of one round, answered.
struct Answers {
    /// Round trips, milliseconds, in the order answered.
    latencies: Vec<f64>,
    /// Contexts that carried an error.
    errors: usize,
    /// From the first question submitted to the last answer.
    seconds: f64,
}

/// Writes the job's configuration for one round (its own group and index) and loads it.
fn round_config(
    shared: &Shared,
    round: usize,
    workers: usize,
    group: &str,
) -> anyhow::Result<Config> {
    let (run, topic, embedder) = (&shared.run, &shared.topic, &shared.embedder);
    let config_path = shared.scratch.join(format!("w{workers}.toml"));
    std::fs::write(
        &config_path,
        format!(
            "[source]\nkind = \"kafka\"\n[kafka]\nbrokers = \"{}\"\ndocuments_topic = \"{topic}\"\nqueries_topic = \"bench-scale-queries-{run}\"\ncontexts_topic = \"bench-scale-contexts-{run}\"\ndlq_topic = \"bench-scale-dlq-{run}\"\ngroup_id = \"{group}\"\n[embedder]\nkind = \"http\"\nurl = \"{embedder}\"\ndimension = {DIMENSION}\nbatch_size = 64\n[index]\npath = {:?}\n[http]\nlisten = \"127.0.0.1:0\"\n[runtime]\nworkers = {workers}\n",
            shared.brokers,
            shared.scratch.join(format!("index-r{round}-w{workers}")).display().to_string(),
        ),
    )?;
    Ok(Config::load(&config_path)?)
}

/// Waits until the job has acknowledged the whole topic and its group committed every partition.
fn wait_committed(
    shared: &Shared,
    watcher: &BaseConsumer,
    workers: usize,
    events_before: u64,
    started: Instant,
) -> anyhow::Result<IngestTimes> {
    let metrics = ragstream_operators::metrics::metrics();
    // Throughput is timed from the first event consumed to the last one acknowledged by the index,
    // so the job's start and the broker's group join (seconds on Tansu) are not in it.
    let mut first_event: Option<Instant> = None;
    let mut acknowledged: Option<Instant> = None;
    loop {
        let consumed = metrics.source_events.get() - events_before;
        if first_event.is_none() && consumed > 0 {
            first_event = Some(Instant::now());
        }
        if acknowledged.is_none()
            && consumed >= shared.documents as u64
            && metrics.in_flight_messages.get() == 0
        {
            acknowledged = Some(Instant::now());
        }
        if acknowledged.is_some()
            && committed(watcher, &shared.topic)
                .map(|c| c == shared.high)
                .unwrap_or(false)
        {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(1800),
            "{workers} workers never committed the end of the topic"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let total_seconds = started.elapsed().as_secs_f64();
    let ingest_seconds = acknowledged
        .zip(first_event)
        .map_or(total_seconds, |(done, first)| (done - first).as_secs_f64());
    Ok(IngestTimes {
        seconds: ingest_seconds,
        start_to_committed_seconds: total_seconds,
    })
}

/// Asks every question through the job's ingress, [`QUERIES_IN_FLIGHT`] at a time.
fn ask_questions(
    running: &crate::runtime::Running,
    questions: &[String],
    workers: usize,
) -> anyhow::Result<Answers> {
    let mut pending: VecDeque<(Instant, std::sync::mpsc::Receiver<_>)> = VecDeque::new();
    let mut latencies = Vec::with_capacity(questions.len());
    let mut errors = 0usize;
    let queries_started = Instant::now();
    for (i, question) in questions.iter().enumerate() {
        if pending.len() >= QUERIES_IN_FLIGHT {
            let (sent, receiver) = pending.pop_front().expect("in flight");
            let context: ragstream_core::query::Context =
                receiver.recv_timeout(Duration::from_secs(120))?;
            errors += usize::from(context.error.is_some());
            latencies.push(sent.elapsed().as_secs_f64() * 1000.0);
        }
        let body = json!({"query_id": format!("w{workers}-{i}"), "tenant": "bench",
            "text": question, "token_budget": 1000})
        .to_string();
        let (_, receiver) = running.ingress.submit(body.into_bytes());
        pending.push_back((Instant::now(), receiver));
    }
    for (sent, receiver) in pending {
        let context = receiver.recv_timeout(Duration::from_secs(120))?;
        errors += usize::from(context.error.is_some());
        latencies.push(sent.elapsed().as_secs_f64() * 1000.0);
    }
    let query_seconds = queries_started.elapsed().as_secs_f64();
    Ok(Answers {
        latencies,
        errors,
        seconds: query_seconds,
    })
}

/// One round at `workers` workers (ingest into a fresh index, then queries); its report row.
fn measure_round(shared: &Shared, round: usize, workers: usize) -> anyhow::Result<Value> {
    let group = format!("bench-scale-{}-r{round}-w{workers}", shared.run);
    let config = round_config(shared, round, workers, &group)?;
    let chunks_before = ragstream_operators::metrics::metrics()
        .chunks_upserted
        .get();
    let metrics = ragstream_operators::metrics::metrics();
    let events_before = metrics.source_events.get();
    let started = Instant::now();
    let running = crate::runtime::start(config)?;
    // Committed offsets are read per group: a consumer of the job's group (it never subscribes).
    let watcher: BaseConsumer = shared.client.clone().set("group.id", &group).create()?;
    let ingest = wait_committed(shared, &watcher, workers, events_before, started)?;
    let ingest_seconds = ingest.seconds;
    let chunks = ragstream_operators::metrics::metrics()
        .chunks_upserted
        .get()
        - chunks_before;

    // Queries through the job's ingress, a fixed number in flight.
    let Answers {
        mut latencies,
        errors,
        seconds: query_seconds,
    } = ask_questions(&running, &shared.questions, workers)?;
    running.shutdown.store(true, Ordering::SeqCst);
    running.join()?;
    latencies.sort_by(f64::total_cmp);
    let median = latencies.get(latencies.len() / 2).copied().unwrap_or(0.0);
    let (documents, questions) = (shared.documents, shared.questions.len());
    eprintln!(
        "round {round}, {workers} worker(s): ingest {:.0} docs/s, queries {:.0}/s",
        documents as f64 / ingest_seconds,
        questions as f64 / query_seconds
    );
    Ok(json!({
        "round": round,
        "workers": workers,
        "ingest_seconds": ingest_seconds,
        "start_to_committed_seconds": ingest.start_to_committed_seconds,
        "ingest_docs_per_s": documents as f64 / ingest_seconds,
        "ingest_chunks_per_s": chunks as f64 / ingest_seconds,
        "queries_per_s": questions as f64 / query_seconds,
        "query_median_ms": median,
        "query_errors": errors,
    }))
}

/// Per worker count, each figure's median over the rounds and the scaling against the first count.
fn medians_by_workers(workers: &[usize], rows: &[Value]) -> Vec<Value> {
    let figures = [
        "ingest_docs_per_s",
        "ingest_chunks_per_s",
        "queries_per_s",
        "query_median_ms",
    ];
    let mut medians: Vec<Value> = Vec::new();
    for &workers in workers {
        let mut summary = json!({"workers": workers});
        for key in figures {
            let mut values: Vec<f64> = rows
                .iter()
                .filter(|r| r["workers"] == json!(workers))
                .filter_map(|r| r[key].as_f64())
                .collect();
            summary[key] = json!(crate::bench::median(&mut values));
        }
        summary["query_errors"] = json!(rows
            .iter()
            .filter(|r| r["workers"] == json!(workers))
            .filter_map(|r| r["query_errors"].as_u64())
            .sum::<u64>());
        medians.push(summary);
    }
    let base = medians.first().cloned().unwrap_or_default();
    for row in &mut medians {
        let ratio =
            |key: &str| row[key].as_f64().unwrap_or(0.0) / base[key].as_f64().unwrap_or(1.0);
        let (ingest, queries) = (ratio("ingest_docs_per_s"), ratio("queries_per_s"));
        row["ingest_scaling"] = json!(ingest);
        row["query_scaling"] = json!(queries);
    }
    medians
}

/// Runs the benchmark; returns the JSON report.
pub fn scale(args: ScaleBench) -> anyhow::Result<Value> {
    let run = format!(
        "{}-{}",
        std::process::id(),
        ragstream_operators::now_millis()
    );
    let topic = format!("bench-scale-docs-{run}");
    let client = {
        let mut client = ClientConfig::new();
        client.set("bootstrap.servers", &args.brokers);
        client
    };
    ragstream_operators::io::kafka_admin::ensure_topics(&client, &[(&topic, PARTITIONS)])
        .map_err(anyhow::Error::msg)?;
    let documents = read_documents(&args.corpus, args.limit)?;
    let producer: BaseProducer = client.clone().set("linger.ms", "5").create()?;
    produce_corpus(&producer, &topic, &documents)?;
    let reader: BaseConsumer = client
        .clone()
        .set("group.id", "bench-scale-reader")
        .create()?;
    let high = high_watermarks(&reader, &topic)?;
    let questions = questions_from(&documents, args.queries);
    let embedder = instant_embedder()?;
    let scratch = std::env::temp_dir().join(format!("ragstream-bench-scale-{run}"));
    std::fs::create_dir_all(&scratch)?;
    let shared = Shared {
        run,
        topic,
        client,
        brokers: args.brokers.clone(),
        embedder,
        scratch,
        documents: documents.len(),
        high,
        questions,
    };

    let mut rows = Vec::new();
    let plan: Vec<(usize, usize)> = (0..args.rounds.max(1))
        .flat_map(|round| args.workers.iter().map(move |&w| (round, w)))
        .collect();
    for (round, workers) in plan {
        rows.push(measure_round(&shared, round, workers)?);
    }
    let _ = std::fs::remove_dir_all(&shared.scratch);
    // Per worker count, the median of each figure over the rounds; ratios against the first count.
    let medians = medians_by_workers(&args.workers, &rows);
    Ok(json!({
        "corpus": args.corpus.display().to_string(),
        "documents": documents.len(),
        "queries": shared.questions.len(),
        "partitions": PARTITIONS,
        "embedder": "instant in-process /v1/embeddings (model time excluded)",
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "rounds": args.rounds.max(1),
        "medians": medians,
        "runs": rows,
    }))
}
