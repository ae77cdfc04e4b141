//! The runtime: opens what the configuration names (`ragstream_topologies::factory`: embedders,
//! shards, sources, sinks), starts the timely workers and the HTTP endpoints, and stops them.
//!
//! Shards (edge backend) live at `<index.path>/shard-<i>` for worker `i`; `<index.path>/layout.json`
//! records the worker count, and a job with another count refuses to start (documents are routed to
//! shards by key hash modulo the worker count; changing it needs a re-index).
//!
//! Cluster mode (`runtime.processes` > 1) is timely's own: `processes` processes of `workers` threads
//! each, connected as the hostfile lists them. Worker indices are global; each process opens the shards
//! of its workers only, consumes the partitions the group gives its workers, and serves HTTP from its
//! first worker. Exchanges (documents to the worker owning their shard, queries to every shard and back
//! to the worker that received them) cross processes through timely's communication layer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ragstream_core::query::invalidate::InvalidationLog;
use ragstream_operators::embed::service::{InferenceService, Priority};
use ragstream_operators::ingest::embed::{take_vectors, ChunkInputs};
use ragstream_operators::ingest::extract::FileReader;
use ragstream_operators::ingest::hydrate::hydrate;
use ragstream_operators::ingest::quota::Usage;
use ragstream_operators::ingest::reindex::{Owned, Reindexer};
use ragstream_operators::ingest::sandbox::Sandbox;
use ragstream_operators::ingest::written::Changes;
use ragstream_operators::io::local_source::DocumentIngress;
use ragstream_operators::io::query_source::{HttpIngress, IngestProgress};
use ragstream_operators::metrics::metrics;
use ragstream_operators::store::stats::CorpusStats;
use ragstream_operators::store::{Bm25Encoder, StoreError, VectorStore};
use ragstream_operators::tokens::Encoding;
use ragstream_topologies::config::{Config, IndexKind, SourceKind};
use ragstream_topologies::factory;
use ragstream_topologies::job::ProcessParts;

use crate::http::documents::DocumentsTarget;
use crate::http::{check_open, serve, Limits, QueryTokens, Readiness};
use crate::standing::Standing;

#[cfg(feature = "kafka")]
mod kafka;

/// A started job.
pub struct Running {
    /// The open shards (worker `i` writes shard `i`).
    pub shards: Arc<Vec<Arc<dyn VectorStore>>>,
    /// Set to stop the job gracefully.
    pub shutdown: Arc<AtomicBool>,
    /// The address the HTTP endpoints (`/metrics`, `/v1/query`, …) listen on.
    pub address: std::net::SocketAddr,
    /// Submits queries to the running job (what `POST /v1/query` uses).
    pub ingress: Arc<HttpIngress>,
    /// The standing queries (`None`: off).
    #[cfg_attr(
        not(feature = "mcp"),
        allow(dead_code, reason = "the MCP tools' stdio server")
    )]
    pub standing: Option<Arc<Standing>>,
    thread: std::thread::JoinHandle<anyhow::Result<()>>,
}

impl Running {
    /// Whether the job is still running (false once it stopped, or a worker panicked).
    pub fn is_running(&self) -> bool {
        !self.thread.is_finished()
    }

    /// Waits for the job to finish.
    pub fn join(self) -> anyhow::Result<()> {
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the job thread panicked"))?
    }
}

/// Runs the job until it is stopped (SIGINT/SIGTERM), its input ends, or it has been idle long enough.
pub fn run(config: Config) -> anyhow::Result<()> {
    start(config)?.join()
}

/// Re-embeds every chunk of a shard with `embedder` (same ids, new vectors and embedder version; with
/// the evidence units `evidence` gives each chunk), its BM25 weights encoded with `bm25`.
fn reembed_shard(
    shard: &dyn VectorStore,
    embedder: &InferenceService,
    (evidence, bm25): (
        ragstream_operators::model::EvidenceUnits,
        ragstream_operators::store::Bm25Params,
    ),
) -> anyhow::Result<usize> {
    let hydrated = hydrate(shard, &|_| true)?;
    let bm25 = ragstream_operators::store::Bm25Encoder::with_params(bm25);
    let mut written = 0;
    let all: Vec<_> = hydrated.documents.into_values().flatten().collect();
    for batch in all.chunks(256) {
        let mut inputs = ChunkInputs::default();
        for stored in batch {
            inputs.push(&stored.chunk, evidence);
        }
        let mut vectors = embedder
            .embed_blocking_spans(inputs.texts, inputs.spans, Priority::Ingest)?
            .vectors
            .into_iter();
        let points: Vec<_> = batch
            .iter()
            .map(|stored| {
                let (dense, units) = take_vectors(&stored.chunk, evidence, &mut vectors);
                ragstream_operators::store::PointWrite {
                    id: stored.id,
                    key: stored.key.clone(),
                    version: stored.version,
                    sparse: bm25.encode_document(&stored.chunk.embedding_input()),
                    dense,
                    evidence: units,
                    chunk: stored.chunk.clone(),
                    embedder_version: embedder.version().to_string(),
                }
            })
            .collect();
        shard.upsert(&points)?;
        written += points.len();
    }
    shard.flush()?;
    Ok(written)
}

/// `force_reindex` over this process's shards: a shared index (a Qdrant server collection) is one,
/// re-indexed for the documents routed to this process's workers.
fn reindexer(
    config: &Config,
    shards: &[Arc<dyn VectorStore>],
    service: &InferenceService,
    shutdown: &Arc<AtomicBool>,
) -> Arc<Reindexer> {
    let shared_index = config.index.kind == IndexKind::Server;
    let own = if shared_index { 1 } else { shards.len() };
    let workers = config.runtime.workers;
    Arc::new(Reindexer::new(
        shards.iter().take(own).cloned().collect(),
        service.clone(),
        (config.embedder.evidence(), config.index.bm25),
        shared_index.then(|| Owned {
            first_worker: config.runtime.first_worker(),
            workers,
            peers: workers * config.runtime.processes.max(1),
        }),
        shutdown.clone(),
    ))
}

/// Starts the job: opens the index and the embedder, serves HTTP, then runs the workers (each
/// builds its dataflow from the process's parts: `ragstream_topologies::job`).
pub fn start(config: Config) -> anyhow::Result<Running> {
    let workers = config.runtime.workers;
    let encoding = Encoding::parse(&config.chunking.tokenizer).expect("validated");
    // The embedders first: their dimension shapes the collection. One inference service per process
    // serves every worker's ingest and queries, on threads of its own.
    let service = factory::inference_service(&config)?;
    let shards = open_index(&config, &service)?;
    let files = file_sandbox(&config)?;
    let readiness = Arc::new(Readiness::default());
    let ingress = Arc::new(HttpIngress::default());
    let invalidation_log = Arc::new(Mutex::new(InvalidationLog::new(
        config.query.invalidations.log_entries,
    )));
    let posted = factory::document_ingress(&config);
    let usage = Arc::new(Usage::new(config.ingest.quotas.quotas()));
    let changes = Arc::new(Changes::default());
    let corpus_stats = Arc::new(CorpusStats::default());
    let standing = start_standing(&config, &shards, &ingress, &changes, &corpus_stats)?;
    // The queries topic's standing events, where documents come from Kafka.
    let standing_intake: Option<Arc<dyn ragstream_operators::io::query_source::StandingIntake>> =
        match (&standing, config.source.kind) {
            #[cfg(feature = "kafka")]
            (Some(standing), SourceKind::Kafka) => Some(kafka::standing_intake(standing, &config)?),
            _ => None,
        };
    let address = serve_http(
        &config,
        &readiness,
        &ingress,
        &invalidation_log,
        (posted.as_ref(), &usage, standing.as_ref()),
        &files,
    )?;
    tracing::info!(%address, "serving /metrics, /healthz, /readyz, /v1/ (query, documents, sources, chunks, invalidations, openapi.json), /mcp");
    let progress = Arc::new(IngestProgress::default());
    let shutdown = Arc::new(AtomicBool::new(false));
    #[cfg(feature = "kafka")]
    if config.source.kind == SourceKind::Kafka {
        progress.kafka.store(true, Ordering::SeqCst);
        kafka::connect(&config, &readiness, &shutdown)?;
    }
    stop_on_signal(shutdown.clone(), &ingress, config.runtime.stop_grace_secs)?;
    if !config.runtime.exit_when_idle_secs.is_zero() {
        spawn_idle_watch(config.runtime.exit_when_idle_secs, shutdown.clone());
    }
    let local_input = Arc::new(Mutex::new(factory::local_input(&config, &shards, &files)?));
    let shards = Arc::new(shards);
    let reindex = reindexer(&config, &shards, &service, &shutdown);
    let _ = ingress.reindex.set(reindex.clone());
    let checkpoint = factory::index_checkpoint(&config)?;
    let timely_config = timely_config(&config.runtime)?;
    let parts = ProcessParts {
        encoding,
        shards: shards.clone(),
        first_worker: config.runtime.first_worker(),
        stats_leaders: (0..config.runtime.processes.max(1))
            .map(|process| process * workers)
            .collect(),
        corpus_stats,
        progress,
        checkpoint,
        local_input,
        posted,
        ingress: ingress.clone(),
        invalidation_log,
        reranker: factory::reranker(&config),
        writer: factory::passage_writer(&config),
        access: Arc::new(Mutex::new(
            ragstream_core::query::surrogate::AccessCounts::new(
                config.query.pack.surrogates.access_entries,
            ),
        )),
        shutdown: shutdown.clone(),
        service,
        files,
        usage,
        changes: standing.is_some().then_some(changes),
        standing_intake,
        config: Arc::new(config),
    };
    let thread = spawn_workers(timely_config, parts, readiness, (standing.clone(), reindex))?;
    Ok(Running {
        shards,
        shutdown,
        address,
        ingress,
        standing,
        thread,
    })
}

/// Standing queries, when enabled: the index writers record each tenant's `changes`; the registry
/// re-evaluates the subscriptions they may move. A server collection weighing terms across tenants
/// (the engine's IDF) moves every subscription with any change; otherwise the registry scores with
/// the job's own `corpus_stats`. In a cluster every shard's writer ships the documents it finished
/// to the first worker of every process, which records them here: any process holds subscriptions
/// over all shards.
fn start_standing(
    config: &Config,
    shards: &[Arc<dyn VectorStore>],
    ingress: &Arc<HttpIngress>,
    changes: &Arc<Changes>,
    corpus_stats: &Arc<CorpusStats>,
) -> anyhow::Result<Option<Arc<Standing>>> {
    if !config.standing.enabled {
        return Ok(None);
    }
    let own_idf = (!shards.iter().any(|shard| shard.engine_idf())).then(|| {
        (
            corpus_stats.clone(),
            Bm25Encoder::with_params(config.index.bm25),
        )
    });
    Ok(Some(Standing::start(
        config.standing.clone(),
        ingress.clone(),
        changes.clone(),
        own_idf,
        config.standing.kept(&config.index.path).as_deref(),
    )?))
}

/// Runs the timely workers on a thread of their own: each builds its dataflow from `parts`; the job
/// is ready once every worker has. When they are gone, `standing` stops (no evaluation can be
/// answered, every event stream ends).
fn spawn_workers(
    timely_config: timely::Config,
    parts: ProcessParts,
    readiness: Arc<Readiness>,
    (standing, reindex): (Option<Arc<Standing>>, Arc<Reindexer>),
) -> anyhow::Result<std::thread::JoinHandle<anyhow::Result<()>>> {
    let workers = parts.config.runtime.workers;
    let ready_workers = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let thread = std::thread::Builder::new().name("timely".into()).spawn(
        move || -> anyhow::Result<()> {
            let guards = timely::execute(timely_config, move |worker| {
                ragstream_operators::activations::record_activations(worker);
                parts.build_worker(worker);
                if ready_workers.fetch_add(1, Ordering::SeqCst) + 1 == workers {
                    readiness.ready.store(true, Ordering::SeqCst);
                }
            })
            .map_err(|e| anyhow::anyhow!("starting workers: {e}"))?;
            let joined = guards.join();
            if let Some(standing) = &standing {
                standing.stop();
            }
            // The HTTP server outlives the job: what it holds must not keep the index open.
            reindex.release();
            for result in joined {
                result.map_err(|e| anyhow::anyhow!("worker failed: {e}"))?;
            }
            tracing::info!("stopped");
            Ok(())
        },
    )?;
    Ok(thread)
}

/// Opens this process's shards and checks they were embedded by `service`'s model (re-embedding
/// them where `embedder.reembed` asks).
fn open_index(
    config: &Config,
    service: &InferenceService,
) -> anyhow::Result<Vec<Arc<dyn VectorStore>>> {
    let dimension = service.dimension();
    let version = service.version().to_string();
    let shards: Vec<_> = factory::open_shards(config, dimension)?
        .into_iter()
        .map(ragstream_operators::faults::maybe_faulty)
        .collect();
    for (index, shard) in shards.iter().enumerate() {
        match shard.check_embedder(&version, dimension) {
            Ok(()) => {}
            Err(StoreError::EmbedderMismatch {
                found_dimension, ..
            }) if config.embedder.reembed && found_dimension == dimension => {
                let written = reembed_shard(
                    shard.as_ref(),
                    service,
                    (config.embedder.evidence(), config.index.bm25),
                )?;
                tracing::info!(shard = index, chunks = written, embedder = %version, "re-embedded");
            }
            Err(StoreError::EmbedderMismatch {
                found,
                found_dimension,
                ..
            }) if config.embedder.allow_mixed_versions && found_dimension == dimension => {
                tracing::warn!(shard = index, %found, embedder = %version, "serving vectors of another embedder version (embedder.allow_mixed_versions)");
            }
            Err(StoreError::EmbedderMismatch {
                found_dimension, ..
            }) if config.embedder.reembed => {
                bail!("re-embedding from dimension {found_dimension} to {dimension} needs a new index: set index.path to an empty directory");
            }
            Err(error) => return Err(error.into()),
        }
    }
    Ok(shards)
}

/// Serves the HTTP API (refusing to listen openly without tokens unless `http.anonymous`); returns
/// the address it listens on.
fn serve_http(
    config: &Config,
    readiness: &Arc<Readiness>,
    ingress: &Arc<HttpIngress>,
    invalidation_log: &Arc<Mutex<InvalidationLog>>,
    (posted, usage, standing): (
        Option<&Arc<DocumentIngress>>,
        &Arc<Usage>,
        Option<&Arc<Standing>>,
    ),
    files: &Arc<dyn FileReader>,
) -> anyhow::Result<std::net::SocketAddr> {
    let tokens = QueryTokens::from_env(
        &config.http.query_token_env,
        &config.http.tokens,
        &config.http.token_labels,
    );
    check_open(
        &config.http.listen,
        tokens.is_empty(),
        config.http.anonymous,
    )?;
    let documents = match (posted, config.source.kind) {
        #[cfg(feature = "kafka")]
        (_, SourceKind::Kafka) => kafka::documents(config)?,
        (Some(ingress), kind) => DocumentsTarget::Local {
            ingress: ingress.clone(),
            owned_tenant: (kind == SourceKind::Dir).then(|| config.source.tenant.clone()),
            usage: usage.clone(),
        },
        (None, _) => DocumentsTarget::None,
    };
    // Subscriptions kept by an earlier run come back where their credentials still open them.
    if let Some(standing) = standing {
        // Subscriptions made over Kafka stand on the queries topic's access control: they come
        // back where the job still reads Kafka.
        let kafka = config.source.kind == SourceKind::Kafka;
        let restored = standing.restore(|credential, query| {
            match credential == crate::standing::KAFKA_CREDENTIAL {
                true if kafka => Ok(query),
                true => Err("made over Kafka, and the job no longer reads Kafka".into()),
                false => tokens.rebind(credential, query),
            }
        });
        if restored > 0 {
            tracing::info!(restored, "standing queries taken back from the last run");
        }
    }
    serve(
        &config.http.listen,
        readiness.clone(),
        ingress.clone(),
        invalidation_log.clone(),
        tokens,
        &config.http.allowed_hosts,
        Limits {
            max_connections: config.http.max_connections,
            max_queries_in_flight: config.http.max_queries_in_flight,
            read_timeout: config.http.read_timeout_secs,
            max_body_bytes: config.query.max_query_bytes.saturating_mul(2),
            max_documents_body_bytes: config.ingest.max_document_bytes.saturating_mul(4),
            token_requests_per_second: config.http.token_requests_per_second,
            token_burst: config.http.token_burst,
        },
        documents,
        factory::decode_config(config, files.clone()),
        standing.cloned(),
    )
}

/// The child processes that read the files of document events (this binary's `parse` mode under
/// `ingest.sandbox`'s limits; none without the `formats` feature), checked on a test page: a platform where they cannot run stops the
/// job here, with the reason, rather than refusing every file.
fn file_sandbox(config: &Config) -> anyhow::Result<Arc<dyn FileReader>> {
    // Without the readers (the `formats` feature) there is no parser to isolate: each such file is
    // refused in process, naming the feature.
    if !cfg!(feature = "formats") {
        return Ok(Arc::new(ragstream_operators::ingest::extract::InProcess));
    }
    let sandbox = Sandbox::of_this_binary(config.ingest.sandbox.limits())
        .context("locating this binary for the file sandbox")?;
    sandbox.check().map_err(anyhow::Error::msg)?;
    Ok(Arc::new(sandbox))
}

/// One process of `workers` threads, or this process's place in a cluster (addresses from the hostfile).
fn timely_config(
    runtime: &ragstream_topologies::config::RuntimeConfig,
) -> anyhow::Result<timely::Config> {
    if runtime.processes <= 1 {
        return Ok(timely::Config::process(runtime.workers));
    }
    let path = runtime.hostfile.as_ref().expect("validated");
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the hostfile {}", path.display()))?;
    let addresses: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_string)
        .collect();
    if addresses.len() < runtime.processes {
        bail!(
            "the hostfile {} lists {} addresses for {} processes",
            path.display(),
            addresses.len(),
            runtime.processes
        );
    }
    Ok(timely::Config {
        communication: timely::CommunicationConfig::Cluster {
            threads: runtime.workers,
            process: runtime.process,
            addresses: addresses[..runtime.processes].to_vec(),
            report: false,
            zerocopy: false,
        },
        worker: timely::WorkerConfig::default(),
    })
}

/// Sets `shutdown` on SIGINT or SIGTERM; a second signal exits at once. The handler is installed once
/// per process; every job started in it (a bench runs several, one after another) registers its flag.
fn stop_on_signal(
    shutdown: Arc<AtomicBool>,
    ingress: &Arc<HttpIngress>,
    grace: Duration,
) -> anyhow::Result<()> {
    static GRACE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    GRACE.store(grace.as_secs(), Ordering::SeqCst);
    static FLAGS: Mutex<Vec<std::sync::Weak<AtomicBool>>> = Mutex::new(Vec::new());
    // Closed by the handler itself: a worker busy with an embedding slice would close it only later.
    static INGRESSES: Mutex<Vec<std::sync::Weak<HttpIngress>>> = Mutex::new(Vec::new());
    INGRESSES
        .lock()
        .expect("signal ingresses")
        .push(Arc::downgrade(ingress));
    static INSTALLED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    FLAGS
        .lock()
        .expect("signal flags")
        .push(Arc::downgrade(&shutdown));
    INSTALLED
        .get_or_init(|| {
            static SIGNALS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            ctrlc::set_handler(|| {
                if SIGNALS.fetch_add(1, Ordering::SeqCst) > 0 {
                    // Nothing is lost: offsets and the index checkpoint only cover acknowledged work,
                    // so what was in flight is read again on restart (as after a crash).
                    tracing::warn!(
                        "second signal: stopping now; unacknowledged work is redone on restart"
                    );
                    // At once, as a crash would: `_exit` runs no exit handlers, so the model
                    // runtime's globals are not torn down under inference threads still running
                    // (their calls would fail, and the documents be dead-lettered as unembeddable).
                    // SAFETY: `_exit` has no preconditions; it ends the process.
                    unsafe { libc::_exit(130) };
                }
                tracing::info!("stopping: finishing in-flight work (signal again to stop at once)");
                let grace = GRACE.load(Ordering::SeqCst);
                if grace > 0 {
                    let _ =
                        std::thread::Builder::new()
                            .name("stop-grace".into())
                            .spawn(move || {
                                std::thread::sleep(Duration::from_secs(grace));
                                tracing::warn!(
                                grace_secs = grace,
                                "in-flight work not done within runtime.stop_grace_secs: stopping \
                                 now; unacknowledged work is redone on restart"
                            );
                                // As a second signal does (see there).
                                // SAFETY: `_exit` has no preconditions; it ends the process.
                                unsafe { libc::_exit(130) };
                            });
                }
                for flag in FLAGS.lock().expect("signal flags").iter() {
                    if let Some(flag) = flag.upgrade() {
                        flag.store(true, Ordering::SeqCst);
                    }
                }
                for ingress in INGRESSES.lock().expect("signal ingresses").iter() {
                    if let Some(ingress) = ingress.upgrade() {
                        ingress.close();
                    }
                }
            })
            .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(anyhow::Error::msg)
        .context("installing the signal handler")
}

/// Sets `shutdown` once no document event has been seen for `idle` and nothing is in flight.
fn spawn_idle_watch(idle: Duration, shutdown: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let events = || metrics().source_events.get();
        let mut last = events();
        let mut since = Instant::now();
        loop {
            std::thread::sleep(Duration::from_millis(200));
            let now = events();
            if now != last || metrics().in_flight_messages.get() > 0 {
                last = now;
                since = Instant::now();
            } else if since.elapsed() >= idle {
                tracing::info!(idle_secs = idle.as_secs(), "idle: stopping");
                shutdown.store(true, Ordering::SeqCst);
                return;
            }
        }
    });
}
