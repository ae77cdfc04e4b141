//! `force_reindex`: re-embeds and re-encodes a tenant's chunks in place, with the job's embedder and
//! BM25 weighting, on a thread of its own (never a dataflow worker), one run per process at a time.
//!
//! Each batch is read back from the index, embedded at ingest priority (queries go first) and written
//! with [`VectorStore::replace_current`]: a chunk that ingest changed or deleted meanwhile is left as
//! ingest wrote it (counted `skipped`), so a run never brings back a stale chunk. Chunk ids, versions
//! and texts stay; only the vectors, evidence units and BM25 weights are new. An index or embedder
//! outage is retried with backoff (about three minutes per batch) before the run stops with the
//! error; an error retrying cannot help (the index or the embedder refusing the request) stops it at
//! once ([`RunError`]); stopping the job stops the run.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::embed::service::{InferenceService, Priority};
use crate::embed::EmbedError;
use crate::ingest::embed::{take_vectors, ChunkInputs};
use crate::model::EvidenceUnits;
use crate::outage::{Backoff, Dependency, GaveUp, Retry};
use crate::store::reindex::ReindexStatus;
use crate::store::{Bm25Encoder, Bm25Params, PointWrite, SearchFilter, StoreError, VectorStore};
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
    /// Emptied once the job has stopped ([`Reindexer::release`]), so the index closes.
    shards: Mutex<Vec<Arc<dyn VectorStore>>>,
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
            .field("shards", &self.shards.lock().expect("shards").len())
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
    /// The job has stopped.
    Stopping,
}

/// Why a run stopped before its end.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The index refused a call, failed every try, or the job stopped while it was out.
    #[error("{0}")]
    Index(GaveUp<StoreError>),
    /// The embedder refused a batch, failed every try, or the job stopped while it was out.
    #[error("{0}")]
    Embedder(GaveUp<EmbedError>),
    /// The job is stopping (between batches).
    #[error("the job is stopping")]
    Stopping,
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
            shards: Mutex::new(shards),
            service,
            evidence,
            bm25,
            owned,
            shutdown,
            runs: Mutex::default(),
            running: AtomicBool::new(false),
        }
    }

    /// Lets go of the shards once the job has stopped (a later run is refused), so that nothing
    /// outside the job keeps its index open.
    pub fn release(&self) {
        self.shards.lock().expect("shards").clear();
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
        if self.shards.lock().expect("shards").is_empty() {
            return Err(Refusal::Stopping);
        }
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
                    status.error = result.err().map(|error| error.to_string());
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

    fn run(&self, tenant: &str, pattern: Option<&SourcePattern>) -> Result<(), RunError> {
        let filter = SearchFilter {
            tenant: Some(tenant.to_string()),
            ..SearchFilter::default()
        };
        let encoder = Bm25Encoder::with_params(self.bm25);
        let shards = self.shards.lock().expect("shards").clone();
        for shard in &shards {
            let mut ids = Vec::new();
            let mut documents = BTreeSet::new();
            self.index(|| {
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
                    return Err(RunError::Stopping);
                }
                let written = self.rewrite(shard.as_ref(), batch, &encoder)?;
                self.update(tenant, |status| {
                    status.rewritten += written;
                    status.skipped += batch.len() - written;
                });
            }
            self.index(|| shard.flush())?;
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
    ) -> Result<usize, RunError> {
        let held = self.index(|| shard.get(ids))?;
        let mut inputs = ChunkInputs::default();
        for stored in &held {
            inputs.push(&stored.chunk, self.evidence);
        }
        if inputs.is_empty() {
            return Ok(0);
        }
        let embedded = self
            .retry(Dependency::Embedder, EmbedError::is_retryable, || {
                self.service.embed_blocking_spans(
                    inputs.texts.clone(),
                    inputs.spans.clone(),
                    Priority::Ingest,
                )
            })
            .map_err(RunError::Embedder)?;
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
        self.index(|| shard.replace_current(&points))
    }

    /// `attempt`, an index call, [`Self::retry`]d while the index is out.
    fn index<T>(&self, attempt: impl FnMut() -> Result<T, StoreError>) -> Result<T, RunError> {
        self.retry(Dependency::Index, StoreError::is_retryable, attempt)
            .map_err(RunError::Index)
    }

    /// `attempt` (a call to `dependency`) until it succeeds, [`TRIES`] times at most with doubling
    /// waits (0.2 s to 30 s), or until the job stops, while its error is `retryable`; the outage
    /// shows meanwhile.
    fn retry<T, E: std::fmt::Display>(
        &self,
        dependency: Dependency,
        retryable: impl Fn(&E) -> bool,
        attempt: impl FnMut() -> Result<T, E>,
    ) -> Result<T, GaveUp<E>> {
        Retry::new(dependency)
            .waits(Backoff::new(
                Duration::from_millis(200),
                Duration::from_secs(30),
            ))
            .at_most(TRIES)
            .until(&self.shutdown)
            .run(retryable, attempt)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::time::Instant;

    use super::*;
    use crate::embed::service::ServiceConfig;
    use crate::embed::Embedder;
    use crate::store::{Hit, SearchVector, StoredChunk, StoredVectors};
    use ragstream_core::testing::stored;

    /// An index holding two chunks whose `get` answers from a script, then with the chunks.
    struct Scripted {
        gets: Mutex<VecDeque<StoreError>>,
        calls: std::sync::atomic::AtomicUsize,
    }

    impl VectorStore for Scripted {
        fn backend(&self) -> &'static str {
            "scripted"
        }
        fn check_embedder(&self, _: &str, _: usize) -> Result<(), StoreError> {
            Ok(())
        }
        fn index_metadata(
            &self,
            _: &[(String, crate::metadata::MetaIndex)],
        ) -> Result<(), StoreError> {
            Ok(())
        }
        fn upsert(&self, _: &[PointWrite]) -> Result<(), StoreError> {
            Ok(())
        }
        fn replace_current(&self, points: &[PointWrite]) -> Result<usize, StoreError> {
            Ok(points.len())
        }
        fn delete(&self, _: &[uuid::Uuid]) -> Result<(), StoreError> {
            Ok(())
        }
        fn flush(&self) -> Result<(), StoreError> {
            Ok(())
        }
        fn scroll(
            &self,
            _: &SearchFilter,
            visit: &mut dyn FnMut(StoredChunk),
        ) -> Result<(), StoreError> {
            visit(stored("a", 0, "One sentence."));
            visit(stored("a", 1, "Another sentence."));
            Ok(())
        }
        fn count(&self, _: &SearchFilter) -> Result<usize, StoreError> {
            Ok(2)
        }
        fn search(
            &self,
            _: &SearchVector,
            _: &SearchFilter,
            _: usize,
            _: Option<f32>,
        ) -> Result<Vec<Hit>, StoreError> {
            Ok(Vec::new())
        }
        fn get(&self, ids: &[uuid::Uuid]) -> Result<Vec<StoredChunk>, StoreError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if let Some(error) = self.gets.lock().expect("script").pop_front() {
                return Err(error);
            }
            let mut held = Vec::new();
            self.scroll(&SearchFilter::default(), &mut |chunk| {
                if ids.contains(&chunk.id) {
                    held.push(chunk);
                }
            })?;
            Ok(held)
        }
        fn vectors(
            &self,
            _: &[uuid::Uuid],
        ) -> Result<Vec<(uuid::Uuid, StoredVectors)>, StoreError> {
            Ok(Vec::new())
        }
    }

    struct Ones;

    impl Embedder for Ones {
        fn version(&self) -> &str {
            "test"
        }
        fn dimension(&self) -> usize {
            2
        }
        fn embed(&mut self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
            Ok(vec![vec![1.0, 0.0]; texts.len()])
        }
        fn last_token_count(&self) -> usize {
            0
        }
    }

    /// Runs a reindex of tenant `t` over an index whose `get` fails with `script` first; returns
    /// the run's status and how many `get` calls it made.
    fn run(script: Vec<StoreError>) -> (ReindexStatus, usize) {
        let store = Arc::new(Scripted {
            gets: Mutex::new(script.into()),
            calls: Default::default(),
        });
        let service = InferenceService::start(vec![Box::new(Ones)], ServiceConfig::default())
            .expect("service");
        let reindexer = Arc::new(Reindexer::new(
            vec![store.clone()],
            service,
            (EvidenceUnits::Off, Bm25Params::default()),
            None,
            Arc::new(AtomicBool::new(false)),
        ));
        reindexer.start("t", None).expect("starts");
        let started = Instant::now();
        loop {
            let status = reindexer.status("t").expect("a run");
            if !status.running {
                return (status, store.calls.load(Ordering::SeqCst));
            }
            assert!(started.elapsed() < Duration::from_secs(60), "{status:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn an_outage_is_retried_and_a_refusal_stops_the_run_at_once() {
        let (status, calls) = run(vec![StoreError::Unavailable("down".into())]);
        assert_eq!(status.error, None, "{status:?}");
        assert_eq!((status.chunks, status.rewritten, calls), (2, 2, 2));
        // The old loop retried every error ten times, with waits of about three minutes in all.
        let (status, calls) = run(vec![StoreError::Invalid("bad filter".into())]);
        assert_eq!(calls, 1, "a refusal is not retried");
        let error = status.error.expect("the run stopped");
        assert!(
            error.contains("refused the operation: bad filter"),
            "{error}"
        );
        assert_eq!(status.rewritten, 0);
    }

    #[test]
    fn once_released_the_shards_are_let_go_and_a_run_is_refused() {
        let store: Arc<dyn VectorStore> = Arc::new(Scripted {
            gets: Mutex::default(),
            calls: Default::default(),
        });
        let service = InferenceService::start(vec![Box::new(Ones)], ServiceConfig::default())
            .expect("service");
        let reindexer = Reindexer::new(
            vec![store.clone()],
            service,
            (EvidenceUnits::Off, Bm25Params::default()),
            None,
            Arc::new(AtomicBool::new(false)),
        );
        assert_eq!(Arc::strong_count(&store), 2);
        reindexer.release();
        assert_eq!(Arc::strong_count(&store), 1, "the index is no longer held");
        assert_eq!(
            Arc::new(reindexer).start("t", None).expect_err("stopped"),
            Refusal::Stopping
        );
    }
}
