//! The factory: what the configuration names, built. Embedders and the inference service, the index
//! shards, the DLQ sinks, the Kafka side of the query source, the local inputs and the embedded
//! index's checkpoint, and the document source of a worker's dataflow: each chosen here, once, from `Config`, so the process's runtime only wires and runs them.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use ragstream_core::query::endpoints::{PassageWriter, RerankKind, Reranker};
use ragstream_core::query::invalidate::InvalidationLog;
use ragstream_operators::embed::http::{HttpEmbedder, HttpEmbedderConfig};
use ragstream_operators::embed::minilm::{MiniLm, MiniLmOptions, Precision};
use ragstream_operators::embed::service::{InferenceService, ServiceConfig};
use ragstream_operators::embed::Embedder;
use ragstream_operators::ingest::decode::DecodeConfig;
use ragstream_operators::ingest::extract::FileReader;
use ragstream_operators::io::checkpoint::IndexCheckpoint;
use ragstream_operators::io::context_sink::ContextPublisher;
use ragstream_operators::io::dir_source::{read_jsonl, DirSource, Extensions};
#[cfg(feature = "kafka")]
use ragstream_operators::io::dlq_sink::KafkaDlq;
use ragstream_operators::io::dlq_sink::{DlqSink, FileDlq};
use ragstream_operators::io::endpoints::{
    ChatPassageWriter, CohereReranker, LlmReranker, TeiReranker,
};
use ragstream_operators::io::invalidation_sink::InvalidationPublisher;
#[cfg(feature = "kafka")]
use ragstream_operators::io::kafka_source::{kafka_source, KafkaSourceConfig};
use ragstream_operators::io::local_source::{
    local_source, DocumentIngress, LocalInput, LocalSourceConfig,
};
use ragstream_operators::io::query_source::{HttpIngress, IngestProgress, QueryKafkaConfig};
use ragstream_operators::io::SourceStreams;
use ragstream_operators::metadata::MetaIndex;
use ragstream_operators::model::EvidenceUnits;
use ragstream_operators::store::edge::EdgeStore;
#[cfg(feature = "qdrant-server")]
use ragstream_operators::store::server::ServerStore;
use ragstream_operators::store::{SearchFilter, VectorStore};
use timely::dataflow::operators::generic::operator::empty;
use timely::dataflow::{ProbeHandle, Scope};

use crate::config::{Config, EmbedderKind, EmbedderPrecision, IndexKind, SourceKind};

/// Builds one instance of the configured embedder.
pub fn embedder(config: &Config) -> anyhow::Result<Box<dyn Embedder>> {
    Ok(match config.embedder.kind {
        EmbedderKind::Minilm => Box::new(
            MiniLm::load(&MiniLmOptions {
                model_dir: config.embedder.model_dir(),
                runtime_library: config.embedder.runtime_library(),
                precision: match config.embedder.precision {
                    EmbedderPrecision::Int8 => Precision::Int8,
                    EmbedderPrecision::Fp32 => Precision::Fp32,
                },
                threads: config.embedder.threads,
                batch_size: config.embedder.batch_size,
                spinning: config.embedder.spinning,
                pool_spans: config.embedder.evidence() == EvidenceUnits::Pooled,
            })
            .with_context(|| "run deploy/scripts/install/model.sh to fetch the model")?,
        ),
        EmbedderKind::Http => Box::new(HttpEmbedder::new(HttpEmbedderConfig {
            url: config.embedder.url.clone().unwrap_or_default(),
            model: config.embedder.model.clone(),
            dimension: config.embedder.dimension,
            api_key: std::env::var(&config.embedder.api_key_env).ok(),
            timeout: config.embedder.timeout_secs,
            batch_size: config.embedder.batch_size,
        })),
    })
}

/// Starts the process's inference service: `embedder.executors` instances of the configured embedder
/// on threads of their own, and one more for queries when `embedder.query_executor` is on.
pub fn inference_service(config: &Config) -> anyhow::Result<InferenceService> {
    let query_executor = config.embedder.query_executor();
    let executors = (0..config.embedder.executors() + usize::from(query_executor))
        .map(|_| embedder(config))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(InferenceService::start(
        executors,
        ServiceConfig {
            slice_word_pieces: config.embedder.slice_word_pieces,
            query_executor,
            version_tag: config.index.bm25.tag(),
            query_headroom: config.embedder.query_headroom(),
            ..ServiceConfig::default()
        },
    )?)
}

/// The reranker endpoint `query.rerank.kind` names, if any.
pub fn reranker(config: &Config) -> Option<Arc<dyn Reranker>> {
    let rerank = &config.query.rerank;
    match rerank.kind {
        RerankKind::None => None,
        RerankKind::Http => Some(Arc::new(TeiReranker::new(&rerank.endpoint))),
        RerankKind::Cohere => Some(Arc::new(CohereReranker::new(&rerank.endpoint))),
        RerankKind::Llm => Some(Arc::new(LlmReranker::new(&rerank.endpoint))),
    }
}

/// The HyDE passage writer, when `query.hyde.enabled`.
pub fn passage_writer(config: &Config) -> Option<Arc<dyn PassageWriter>> {
    let hyde = &config.query.hyde;
    hyde.enabled.then(|| {
        Arc::new(ChatPassageWriter::new(&hyde.endpoint, hyde.max_tokens)) as Arc<dyn PassageWriter>
    })
}

/// Opens (or creates) every shard of this process's workers: one qdrant-edge shard a worker at
/// `<index.path>/shard-<i>`, or one Qdrant server collection shared by all of them.
pub fn open_shards(config: &Config, dimension: usize) -> anyhow::Result<Vec<Arc<dyn VectorStore>>> {
    match config.index.kind {
        IndexKind::Edge => {
            let root = &config.index.path;
            std::fs::create_dir_all(root)
                .with_context(|| format!("creating {}", root.display()))?;
            // In a cluster every process opens the shards of its own workers (global indices).
            check_layout(root, config.runtime.total_workers())?;
            let first = config.runtime.first_worker();
            (first..first + config.runtime.workers)
                .map(|i| {
                    let path = root.join(format!("shard-{i}"));
                    let store = EdgeStore::open_tuned(&path, dimension, config.index.tuning)
                        .with_context(|| format!("opening {}", path.display()))?;
                    store
                        .index_metadata(&metadata_indexes(config))
                        .with_context(|| format!("indexing metadata keys in {}", path.display()))?;
                    Ok(Arc::new(store) as Arc<dyn VectorStore>)
                })
                .collect()
        }
        #[cfg(not(feature = "qdrant-server"))]
        IndexKind::Server => Err(crate::config::ConfigError::Feature {
            key: "index.kind",
            value: "server",
            feature: "qdrant-server",
        }
        .into()),
        #[cfg(feature = "qdrant-server")]
        IndexKind::Server => {
            // One shared collection: every worker writes its own documents into it.
            let url = config.index.url.clone().expect("validated");
            let api_key = std::env::var(&config.index.api_key_env).ok();
            let store = ServerStore::connect(
                &url,
                api_key,
                &config.index.collection,
                dimension,
                config.index.tuning,
            )
            .with_context(|| format!("connecting to Qdrant at {url}"))?;
            store
                .index_metadata(&metadata_indexes(config))
                .context("indexing metadata keys")?;
            let store: Arc<dyn VectorStore> = Arc::new(store);
            Ok((0..config.runtime.workers).map(|_| store.clone()).collect())
        }
    }
}

fn metadata_indexes(config: &Config) -> Vec<(String, MetaIndex)> {
    config
        .index
        .metadata
        .iter()
        .map(|(key, index)| (key.clone(), *index))
        .collect()
}

/// `<root>/layout.json` records the worker count; another count is refused (documents are routed to
/// shards by key hash modulo the worker count).
fn check_layout(root: &Path, workers: usize) -> anyhow::Result<()> {
    let path = root.join("layout.json");
    if let Ok(text) = std::fs::read_to_string(&path) {
        let layout: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
        let shards = layout
            .get("shards")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0) as usize;
        if shards != workers {
            bail!("the index at {} has {shards} shards but the job runs {workers} workers; run with --workers {shards} or re-index into a new path", root.display());
        }
        return Ok(());
    }
    std::fs::write(&path, serde_json::json!({ "shards": workers }).to_string())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Where dead letters go: the DLQ topic with a Kafka source, else the JSONL file `runtime.dlq_path`.
pub fn dlq_sink(config: &Config) -> anyhow::Result<Box<dyn DlqSink>> {
    Ok(match config.source.kind {
        #[cfg(not(feature = "kafka"))]
        SourceKind::Kafka => {
            return Err(crate::config::ConfigError::Feature {
                key: "source.kind",
                value: "kafka",
                feature: "kafka",
            }
            .into())
        }
        #[cfg(feature = "kafka")]
        SourceKind::Kafka => Box::new(
            KafkaDlq::new(&config.kafka.client_config(), &config.kafka.dlq_topic)
                .map_err(|e| anyhow::anyhow!("DLQ producer: {e}"))?,
        ),
        SourceKind::Dir | SourceKind::Jsonl => {
            Box::new(FileDlq::new(config.runtime.dlq_path.clone()))
        }
    })
}

/// The queries topic's side of the query source, when documents come from Kafka.
#[cfg(not(feature = "kafka"))]
pub fn query_kafka(_config: &Config) -> Option<QueryKafkaConfig> {
    None
}

/// The queries topic's side of the query source, when documents come from Kafka.
#[cfg(feature = "kafka")]
pub fn query_kafka(config: &Config) -> Option<QueryKafkaConfig> {
    (config.source.kind == SourceKind::Kafka).then(|| QueryKafkaConfig {
        client: config.kafka.client_config(),
        topic: config.kafka.queries_topic.clone(),
        documents_topic: config.kafka.documents_topic.clone(),
        documents_group: config.kafka.group_id.clone(),
        group_id: format!("{}-queries", config.kafka.group_id),
        instance_id: config.kafka.instance_id.clone(),
        session_timeout: config.kafka.session_timeout_ms,
        standing: None,
    })
}

/// Where a worker's contexts and invalidations go: to the HTTP callers and the process's log, and,
/// when documents come from Kafka, to the contexts and invalidations topics.
pub fn query_publishers(
    config: &Config,
    http: Arc<HttpIngress>,
    log: Arc<Mutex<InvalidationLog>>,
) -> anyhow::Result<(ContextPublisher, InvalidationPublisher)> {
    let contexts = ContextPublisher::new(Some(http));
    let invalidations = InvalidationPublisher::new(log);
    #[cfg(feature = "kafka")]
    if config.source.kind == SourceKind::Kafka {
        let client = config.kafka.client_config();
        let contexts = contexts
            .to_topic(&client, &config.kafka.contexts_topic)
            .map_err(|e| anyhow::anyhow!("contexts producer: {e}"))?;
        let invalidations = invalidations
            .to_topic(&client, &config.kafka.invalidations_topic)
            .map_err(|e| anyhow::anyhow!("invalidations producer: {e}"))?;
        return Ok((contexts, invalidations));
    }
    let _ = config;
    Ok((contexts, invalidations))
}

/// Where documents posted over HTTP go when no documents topic takes them: a local source that keeps
/// serving (a directory, or a JSONL file with `runtime.serve`); `None` otherwise (with Kafka the
/// HTTP API produces to the documents topic; a JSONL file read once ends).
pub fn document_ingress(config: &Config) -> Option<Arc<DocumentIngress>> {
    let serves = match config.source.kind {
        SourceKind::Dir => true,
        SourceKind::Jsonl => config.runtime.serve,
        SourceKind::Kafka => false,
    };
    serves.then(|| Arc::new(DocumentIngress::new(config.ingest.fair)))
}

/// The embedded index's own position in the documents topic ([`IndexCheckpoint`]): only for an
/// embedded index fed by Kafka; a shared (server) index uses the group's offsets.
pub fn index_checkpoint(config: &Config) -> anyhow::Result<Option<Arc<IndexCheckpoint>>> {
    Ok(match (config.source.kind, config.index.kind) {
        (SourceKind::Kafka, IndexKind::Edge) => Some(Arc::new(IndexCheckpoint::open(
            &config.index.path,
            &config.kafka.documents_topic,
        )?)),
        _ => None,
    })
}

/// The input of a local source: a directory (with the versions the index holds, so files gone from
/// the disk are deleted from the index) or the events of a JSONL file; none with Kafka.
pub fn local_input(
    config: &Config,
    shards: &[Arc<dyn VectorStore>],
    files: &Arc<dyn FileReader>,
) -> anyhow::Result<Option<LocalInput>> {
    Ok(match config.source.kind {
        SourceKind::Dir => {
            let mut known = BTreeMap::new();
            let tenant = config.source.tenant.clone();
            for shard in shards {
                let filter = SearchFilter {
                    tenant: Some(tenant.clone()),
                    ..SearchFilter::default()
                };
                shard.scroll(&filter, &mut |stored| {
                    let version = known.entry(stored.key.doc_id.clone()).or_insert(0u64);
                    *version = (*version).max(stored.version);
                })?;
            }
            let root = config.source.path.clone().expect("validated");
            let root = root
                .canonicalize()
                .with_context(|| format!("source.path {}", root.display()))?;
            Some(LocalInput::Dir {
                source: Box::new(
                    DirSource::new(root, tenant, config.ingest.max_document_bytes, known)
                        .with_extensions(Extensions::new(
                            &config.source.include_extensions,
                            &config.source.exclude_extensions,
                        ))
                        .with_preview_window(config.source.preview_window)
                        .with_files(files.clone()),
                ),
                rescan: config.source.rescan_secs.max(Duration::from_secs(1)),
            })
        }
        SourceKind::Jsonl => {
            let path = config.source.path.clone().expect("validated");
            let decode = decode_config(config, files.clone());
            Some(LocalInput::Events(
                read_jsonl(&path, &decode)
                    .with_context(|| format!("reading {}", path.display()))?,
            ))
        }
        SourceKind::Kafka => None,
    })
}

/// Limits of document decoding; `files` reads HTML, PDF and DOCX files (the job: its sandbox).
pub fn decode_config(config: &Config, files: Arc<dyn FileReader>) -> DecodeConfig {
    DecodeConfig {
        max_document_bytes: config.ingest.max_document_bytes,
        allowed_tenants: config.ingest.allowed_tenants.clone(),
        files,
    }
}

/// What a worker's document source needs besides the configuration.
pub struct SourceParts {
    /// The directory or JSONL input (first worker of a process with a local source).
    pub local: Option<LocalInput>,
    /// The embedded index's position in the documents topic (Kafka with the edge backend).
    pub checkpoint: Option<Arc<IndexCheckpoint>>,
    /// The ingest acknowledgement probe.
    pub acks: ProbeHandle<u64>,
    /// Set to stop.
    pub shutdown: Arc<AtomicBool>,
    /// Acknowledged document offsets, for read-your-writes.
    pub progress: Arc<IngestProgress>,
    /// Documents posted to the HTTP API (a local source that keeps serving).
    pub posted: Option<Arc<DocumentIngress>>,
    /// Reads the files of document events (the job's sandbox).
    pub files: Arc<dyn FileReader>,
}

/// The configured document source in `scope`: its events and its assignment markers (none for a
/// local source, which is never reassigned).
pub fn document_source<'scope>(
    scope: Scope<'scope, u64>,
    config: &Config,
    parts: SourceParts,
) -> SourceStreams<'scope> {
    match config.source.kind {
        #[cfg(not(feature = "kafka"))]
        SourceKind::Kafka => {
            unreachable!("Config::validate refuses a Kafka source without `kafka`")
        }
        #[cfg(feature = "kafka")]
        SourceKind::Kafka => kafka_source(
            scope,
            KafkaSourceConfig {
                client: config.kafka.client_config(),
                topic: config.kafka.documents_topic.clone(),
                group_id: config.kafka.group_id.clone(),
                max_batch: config.kafka.max_batch,
                max_in_flight: config.kafka.max_in_flight,
                max_in_flight_bytes: config.kafka.max_in_flight_mib.saturating_mul(1 << 20),
                prefetch_kbytes: config.kafka.prefetch_kbytes,
                idle_poll: Duration::from_millis(20),
                session_timeout: config.kafka.session_timeout_ms,
                instance_id: config.kafka.instance_id.clone(),
                checkpoint: parts.checkpoint,
            },
            decode_config(config, parts.files),
            parts.acks,
            parts.shutdown,
            parts.progress,
        ),
        SourceKind::Dir | SourceKind::Jsonl => (
            local_source(
                scope,
                parts.local,
                LocalSourceConfig {
                    batch: 256,
                    max_in_flight: 2048,
                    lane_bytes: match config.ingest.fair {
                        true => config.ingest.tenant_in_flight_mib << 20,
                        false => usize::MAX,
                    },
                },
                parts.acks,
                parts.shutdown,
                parts.posted,
            ),
            empty(scope),
        ),
    }
}
