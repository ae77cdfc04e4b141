//! The steps of `bench ingest` (the bench itself is in the parent module), one function each.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ragstream_operators::embed::service::Priority;
use ragstream_operators::ingest::chunk::{Chunker, ChunkerConfig};
use ragstream_operators::ingest::embed::ChunkInputs;
use ragstream_operators::metrics::metrics;
use ragstream_operators::model::Document;
use ragstream_operators::store::SearchFilter;
use ragstream_operators::tokens::{Encoding, TokenCounter};
use ragstream_topologies::config::Config;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use serde_json::json;

use super::{cpu_used, median, send_blocking, thread_cpu_seconds};

/// Token counting MB/s of `documents` (`bytes` of text) per encoding, the median of 5 passes.
pub(super) fn token_counting(
    documents: &[Document],
    bytes: usize,
) -> serde_json::Map<String, serde_json::Value> {
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
    counting
}

/// Writes and loads the job's configuration (named after this process); it and the file's path.
pub(super) fn write_config(brokers: &str) -> anyhow::Result<(Config, PathBuf)> {
    let config_text = format!(
        "[source]\nkind = \"kafka\"\n[kafka]\nbrokers = \"{}\"\ndocuments_topic = \"bench-{}\"\ndlq_topic = \"bench-dlq\"\ngroup_id = \"bench-{}\"\n[index]\npath = \"{}\"\n[http]\nlisten = \"127.0.0.1:0\"\n",
        brokers,
        std::process::id(),
        std::process::id(),
        std::env::temp_dir().join(format!("ragstream-bench-{}", std::process::id())).display()
    );
    let config_path =
        std::env::temp_dir().join(format!("ragstream-bench-{}.toml", std::process::id()));
    std::fs::write(&config_path, config_text)?;
    let config = Config::load(&config_path)?;
    Ok((config, config_path))
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

/// What embedding the corpus's chunks, and nothing else, took.
pub(super) struct EmbeddingOnly {
    /// Chunks of the corpus.
    pub(super) chunks: usize,
    /// Texts embedded: each chunk and its evidence units.
    pub(super) texts: usize,
    /// Seconds in whole calls of `max_batch` texts.
    pub(super) seconds: f64,
    /// Chunks per second in whole calls.
    pub(super) rate: f64,
    /// Word pieces embedded.
    pub(super) word_pieces: usize,
    /// Seconds in the service's slices.
    pub(super) sliced_seconds: f64,
}

/// Embeds the texts the pipeline will embed, in whole calls and then in the service's slices.
pub(super) fn embedding_only(
    config: &Config,
    documents: &[Document],
) -> anyhow::Result<EmbeddingOnly> {
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
    let (sliced_seconds, _) = embed_all(config, &inputs)?;
    eprintln!(
        "embedding only, in the service's slices of {} word pieces: {sliced_seconds:.1}s = {:.1} chunks/s",
        config.embedder.slice_word_pieces,
        chunk_count as f64 / sliced_seconds
    );
    Ok(EmbeddingOnly {
        chunks: chunk_count,
        texts: inputs.vectors(),
        seconds: embed_seconds,
        rate: embed_rate,
        word_pieces,
        sliced_seconds,
    })
}

/// Creates the topics and produces every document, waiting for delivery; the producer.
pub(super) fn produce_corpus(
    config: &Config,
    brokers: &str,
    documents: &[Document],
) -> anyhow::Result<BaseProducer> {
    ragstream_operators::io::kafka_admin::ensure_topics(
        &config.kafka.client_config(),
        &[
            (config.kafka.documents_topic.as_str(), 3),
            (config.kafka.dlq_topic.as_str(), 1),
        ],
    )
    .map_err(anyhow::Error::msg)?;
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .create()?;
    for document in documents {
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
    Ok(producer)
}

/// What the job took to ingest the whole topic.
pub(super) struct EndToEnd {
    /// Chunks indexed.
    pub(super) chunks: u64,
    /// From the job's start until every event was acknowledged.
    pub(super) seconds: f64,
    /// Chunks per second over `seconds`.
    pub(super) rate: f64,
    /// Seconds from the job's start to the first event consumed.
    pub(super) first_event: f64,
    /// Chunks per second from the first event consumed.
    pub(super) consuming_rate: f64,
    /// Seconds the pipeline spent embedding.
    pub(super) embedding_seconds: f64,
    /// Embedding calls the pipeline made.
    pub(super) embedding_calls: u64,
    /// Seconds of index writes.
    pub(super) index_seconds: f64,
    /// Index write batches.
    pub(super) index_batches: u64,
    /// CPU seconds by thread name during the ingest.
    pub(super) cpu: serde_json::Map<String, serde_json::Value>,
}

/// Starts the job and waits until it acknowledged all `events`; the job and what that took.
pub(super) fn end_to_end(
    config: &Config,
    events: u64,
) -> anyhow::Result<(crate::runtime::Running, EndToEnd)> {
    let (embed_before, calls_before) = (
        metrics().embed_seconds.get_sample_sum(),
        metrics().embed_seconds.get_sample_count(),
    );
    let cpu_before = thread_cpu_seconds();
    let started = Instant::now();
    let running = crate::runtime::start(config.clone())?;
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
    Ok((
        running,
        EndToEnd {
            chunks,
            seconds: pipeline_seconds,
            rate: pipeline_rate,
            first_event,
            consuming_rate,
            embedding_seconds: embed_in_pipeline,
            embedding_calls: embed_calls,
            index_seconds,
            index_batches,
            cpu: pipeline_cpu,
        },
    ))
}

/// Milliseconds from producing each of `probes` single documents until its chunks are counted.
pub(super) fn event_to_searchable(
    producer: &BaseProducer,
    topic: &str,
    running: &crate::runtime::Running,
    probes: usize,
) -> anyhow::Result<Vec<f64>> {
    let mut latencies = Vec::new();
    for probe in 0..probes {
        let doc_id = format!("probe-{probe}");
        let body = json!({"tenant": "bench", "doc_id": doc_id, "version": 1, "kind": "prose", "text": format!("Probe document number {probe}. It checks freshness.")}).to_string();
        let key = format!("bench/{doc_id}");
        let sent = Instant::now();
        producer
            .send(BaseRecord::to(topic).key(&key).payload(&body))
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
    Ok(latencies)
}
