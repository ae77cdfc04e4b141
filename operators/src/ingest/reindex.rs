//! `force_reindex`: re-embeds and re-encodes a tenant's chunks in place, with the job's embedder and
//! BM25 weighting, on a thread of its own (never a dataflow worker), one run per process at a time.
//!
//! Each batch is read back from the index, embedded at ingest priority (queries go first) and written
//! with [`VectorStore::replace_current`]: a chunk that ingest changed or deleted meanwhile is left as
//! ingest wrote it (counted `skipped`), so a run never brings back a stale chunk. Chunk ids, versions
//! and texts stay; only the vectors, evidence units and BM25 weights are new. An index or embedder
//! outage is retried with backoff (about three minutes per batch) before the run stops with the
//! error; stopping the job stops the run.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::embed::service::{InferenceService, Priority};
use crate::ingest::embed::{take_vectors, ChunkInputs};
use crate::model::EvidenceUnits;
use crate::outage::{Backoff, Dependency, Retry};
use crate::store::reindex::ReindexStatus;
use crate::store::{Bm25Encoder, Bm25Params, PointWrite, SearchFilter, VectorStore};
use ragstream_core::query::pattern::SourcePattern;

/// Chunks read, embedded and written together.
const BATCH: usize = 64;
/// Tries of one batch before the run stops.
const TRIES: u32 = 10;

/// Which documents this process re-indexes in a shared index (a Qdrant server collection): those
/// routed to its workers, since those workers are the ones writing them.
#[derive(Debug, Clone, Copy)]
pub struct Owned {
    /// The process's first worker (global index).
    pub first_worker: usize,
    /// Its workers.
    pub workers: usize,
    /// Workers of the whole job.
    pub peers: usize,
}

/// Runs `force_reindex` over this process's shards.
pub struct Reindexer {
    shards: Vec<Arc<dyn VectorStore>>,
    service: InferenceService,
    evidence: EvidenceUnits,
    bm25: Bm25Params,
    owned: Option<Owned>,
    shutdown: Arc<AtomicBool>,
    /// The last run of each tenant (the running one included).
    runs: Mutex<std::collections::BTreeMap<String, ReindexStatus>>,
    running: AtomicBool,
}

impl std::fmt::Debug for Reindexer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reindexer")
            .field("shards", &self.shards.len())
            .field("running", &self.running)
            .finish_non_exhaustive()
    }
}

/// Why a run did not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The pattern does not parse.
    BadPattern(String),
    /// A run is going (one per process).
    Busy(String),
}

impl Reindexer {
    /// A reindexer of `shards`; `owned` with a shared index.
    pub fn new(
        shards: Vec<Arc<dyn VectorStore>>,
        service: InferenceService,
        (evidence, bm25): (EvidenceUnits, Bm25Params),
        owned: Option<Owned>,
        shutdown: Arc<AtomicBool>,
    ) -> Self {
        Self {
            shards,
            service,
            evidence,
            bm25,
            owned,
            shutdown,
            runs: Mutex::default(),
            running: AtomicBool::new(false),
        }
    }

    /// The tenant's last run, if any.
    pub fn status(&self, tenant: &str) -> Option<ReindexStatus> {
        self.runs.lock().expect("runs").get(tenant).cloned()
    }

    /// Starts a run over the tenant's chunks whose source matches `pattern` (all without one).
    pub fn start(
        self: &Arc<Self>,
        tenant: &str,
        pattern: Option<&str>,
    ) -> Result<ReindexStatus, Refusal> {
        let matcher = pattern
            .map(SourcePattern::parse)
            .transpose()
            .map_err(Refusal::BadPattern)?;
        if self.running.swap(true, Ordering::SeqCst) {
            // Another tenant's run is not named to this caller.
            let own = self
                .runs
                .lock()
                .expect("runs")
                .values()
                .any(|run| run.running && run.tenant == tenant);
            return Err(Refusal::Busy(if own {
                "a reindex of this tenant is running: one at a time; GET its status".into()
            } else {
                "a reindex (of another tenant) is running in this process: one at a time; retry later".into()
            }));
        }
        let status = ReindexStatus {
            tenant: tenant.to_string(),
            source_pattern: pattern.map(str::to_string),
            running: true,
            started_ms: crate::now_millis(),
            ..ReindexStatus::default()
        };
        self.runs
            .lock()
            .expect("runs")
            .insert(tenant.to_string(), status.clone());
        let this = self.clone();
        let tenant = tenant.to_string();
        let spawned = std::thread::Builder::new()
            .name("reindex".into())
            .spawn(move || {
                let result = this.run(&tenant, matcher.as_ref());
                this.update(&tenant, |status| {
                    status.running = false;
                    status.finished_ms = Some(crate::now_millis());
                    status.error = result.err();
                });
                tracing::info!(?tenant, status = ?this.status(&tenant), "reindex ended");
                this.running.store(false, Ordering::SeqCst);
            });
        if let Err(error) = spawned {
            self.running.store(false, Ordering::SeqCst);
            self.update(&status.tenant, |s| {
                s.running = false;
                s.error = Some(format!("could not start: {error}"));
            });
        }
        Ok(status)
    }

    fn update(&self, tenant: &str, change: impl FnOnce(&mut ReindexStatus)) {
        if let Some(status) = self.runs.lock().expect("runs").get_mut(tenant) {
            change(status);
        }
    }

    fn owns(&self, route: u64) -> bool {
        self.owned.is_none_or(|owned| {
            let worker = (route % owned.peers.max(1) as u64) as usize;
            (owned.first_worker..owned.first_worker + owned.workers).contains(&worker)
        })
    }

    fn run(&self, tenant: &str, pattern: Option<&SourcePattern>) -> Result<(), String> {
        let filter = SearchFilter {
            tenant: Some(tenant.to_string()),
            ..SearchFilter::default()
        };
        let encoder = Bm25Encoder::with_params(self.bm25);
        for shard in &self.shards {
            let mut ids = Vec::new();
            let mut documents = BTreeSet::new();
            self.retry(Dependency::Index, || {
                ids.clear();
                documents.clear();
                shard.scroll(&filter, &mut |stored| {
                    if pattern.is_none_or(|p| p.matches(&stored.chunk.source))
                        && self.owns(stored.key.route())
                    {
                        ids.push(stored.id);
                        documents.insert(stored.key.doc_id);
                    }
                })
            })?;
            self.update(tenant, |status| {
                status.documents += documents.len();
                status.chunks += ids.len();
            });
            for batch in ids.chunks(BATCH) {
                if self.shutdown.load(Ordering::SeqCst) {
                    return Err("the job is stopping".into());
                }
                let written = self.rewrite(shard.as_ref(), batch, &encoder)?;
                self.update(tenant, |status| {
                    status.rewritten += written;
                    status.skipped += batch.len() - written;
                });
            }
            self.retry(Dependency::Index, || shard.flush())?;
        }
        Ok(())
    }

    /// Re-embeds the chunks `ids` the shard still holds and writes those still current; returns how
    /// many were written.
    fn rewrite(
        &self,
        shard: &dyn VectorStore,
        ids: &[uuid::Uuid],
        encoder: &Bm25Encoder,
    ) -> Result<usize, String> {
        let held = self.retry(Dependency::Index, || shard.get(ids))?;
        let mut inputs = ChunkInputs::default();
        for stored in &held {
            inputs.push(&stored.chunk, self.evidence);
        }
        if inputs.is_empty() {
            return Ok(0);
        }
        let embedded = self.retry(Dependency::Embedder, || {
            self.service
                .embed_blocking_spans(inputs.texts.clone(), inputs.spans.clone(), Priority::Ingest)
                .map_err(|e| e.to_string())
        })?;
        let mut vectors = embedded.vectors.into_iter();
        let points: Vec<PointWrite> = held
            .into_iter()
            .map(|stored| {
                let (dense, evidence) = take_vectors(&stored.chunk, self.evidence, &mut vectors);
                PointWrite {
                    id: stored.id,
                    key: stored.key,
                    version: stored.version,
                    sparse: encoder.encode_document(&stored.chunk.embedding_input()),
                    dense,
                    evidence,
                    chunk: stored.chunk,
                    embedder_version: self.service.version().to_string(),
                }
            })
            .collect();
        self.retry(Dependency::Index, || shard.replace_current(&points))
    }

    /// `attempt` (a call to `dependency`) until it succeeds, [`TRIES`] times at most with doubling
    /// waits (0.2 s to 30 s), or until the job stops; the outage shows meanwhile.
    fn retry<T, E: std::fmt::Display>(
        &self,
        dependency: Dependency,
        attempt: impl FnMut() -> Result<T, E>,
    ) -> Result<T, String> {
        Retry::new(dependency)
            .waits(Backoff::new(
                Duration::from_millis(200),
                Duration::from_secs(30),
            ))
            .at_most(TRIES)
            .until(&self.shutdown)
            .run(|_: &E| true, attempt)
            .map_err(|gave_up| gave_up.to_string())
    }
}
