//! The invalidation operators around the core's [`Citations`] registry.
//!
//! ```text
//! Pack ─► Cite ─► Publish                    (each worker records what its published contexts cite)
//! IndexWrite ─► changed ids ─► broadcast ─► Invalidate ─► InvalidationSink (topic, GET /v1/invalidations)
//! ```
//!
//! A context is answered on the worker that received its query, so each worker keeps the citations of
//! its own contexts; every worker hears of every changed chunk. Invalidations are advice to whoever
//! holds a context: they are sent as they are found and do not hold any time of the dataflow.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{SystemTime, UNIX_EPOCH};

use timely::dataflow::operators::core::Inspect;
use timely::dataflow::operators::vec::Broadcast;
use timely::dataflow::StreamVec;

use super::job::{QueryServices, Reply};
use crate::metrics::metrics;
use crate::stage::map_stage;
use ragstream_core::query::invalidate::{Citations, Invalidation};
use ragstream_core::query::Context;

/// Where invalidations go (implemented by `io::invalidation_sink`).
pub trait InvalidationSink {
    /// Sends each invalidation (numbering them in the process's log).
    fn send(&mut self, invalidations: Vec<Invalidation>);
}

/// One worker's citations and the sink of its invalidations.
pub struct Invalidator {
    citations: Citations,
    sink: Box<dyn InvalidationSink>,
    services: QueryServices,
}

impl Invalidator {
    /// Citations kept for `ttl` and at most `max_citations` at once; invalidations to `sink`.
    pub fn new(
        ttl: std::time::Duration,
        max_citations: usize,
        sink: Box<dyn InvalidationSink>,
        services: QueryServices,
    ) -> Rc<RefCell<Self>> {
        Rc::new(RefCell::new(Self {
            citations: Citations::new(
                u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
                max_citations,
            ),
            sink,
            services,
        }))
    }

    fn send(&mut self, invalidations: Vec<Invalidation>) {
        if !invalidations.is_empty() {
            metrics().invalidations.inc_by(invalidations.len() as u64);
            self.sink.send(invalidations);
        }
    }

    fn cite(&mut self, context: &Context) {
        let now = now_ms();
        let took = context.latency_ms.get("total").copied().unwrap_or(0.0);
        let retrieved = now.saturating_sub(took.ceil() as u64);
        let before = self.citations.len();
        let services = &self.services;
        let found = self
            .citations
            .cite(context, retrieved, now, || services.watermark());
        self.held_changed(before);
        self.send(found.into_iter().collect());
    }

    fn changed(&mut self, ids: &[uuid::Uuid]) {
        let before = self.citations.len();
        let services = &self.services;
        let found = self
            .citations
            .changed(ids, now_ms(), || services.watermark());
        self.held_changed(before);
        self.send(found);
    }

    fn held_changed(&self, before: usize) {
        let after = self.citations.len();
        metrics().citations_held.add(after as i64 - before as i64);
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Extension trait: record what published contexts cite.
///
/// # Examples
///
/// A context cites chunks `a` and `b`; when chunk `b` changes, its holder is told which query's
/// context went stale and why:
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use std::time::Duration;
/// use ragstream_core::query::cache::LruTtl;
/// use ragstream_core::query::invalidate::Invalidation;
/// use ragstream_operators::query::example::{gathered, hit, job, services};
/// use ragstream_operators::query::fuse::Fuse;
/// use ragstream_operators::query::invalidation::{Cite, Invalidate, InvalidationSink, Invalidator};
/// use ragstream_operators::query::pack::Pack;
/// use timely::dataflow::operators::vec::ToStream;
///
/// /// Keeps what it is sent.
/// struct Told(Arc<Mutex<Vec<Invalidation>>>);
///
/// impl InvalidationSink for Told {
///     fn send(&mut self, invalidations: Vec<Invalidation>) {
///         self.0.lock().unwrap().extend(invalidations);
///     }
/// }
///
/// let told = Arc::new(Mutex::new(Vec::new()));
/// let sink = Told(told.clone());
/// let (a, b) = (
///     hit("a", "Tide pools hold sea water at low tide.", 0.9, &[1.0, 0.0]),
///     hit("b", "Anemones and crabs live in tide pools.", 0.8, &[0.0, 1.0]),
/// );
/// let changed = b.0.stored.id;
/// timely::example(move |scope| {
///     let invalidator = Invalidator::new(Duration::from_secs(60), 1000, Box::new(sink), services());
///     let query = job(r#"{"query_id": "q1", "tenant": "t", "text": "tide pools"}"#);
///     let cache = Arc::new(Mutex::new(LruTtl::new(16, Duration::from_secs(60))));
///     vec![gathered(query, vec![a, b], Vec::new())]
///         .to_stream(scope)
///         .fuse()
///         .pack(services(), cache)
///         .cite(invalidator.clone());
///     vec![changed].to_stream(scope).invalidate(invalidator);
/// });
/// let told = told.lock().unwrap();
/// assert_eq!(told.len(), 1);
/// assert_eq!((told[0].query_id.as_str(), told[0].tenant.as_str()), ("q1", "t"));
/// assert_eq!(told[0].stale_chunk_ids, [changed.to_string()]);
/// ```
pub trait Cite<'scope> {
    /// Records each context's citations with `invalidator` (a context already stale is invalidated at
    /// once) and passes it on unchanged.
    fn cite(
        self,
        invalidator: Rc<RefCell<Invalidator>>,
    ) -> StreamVec<'scope, u64, (Context, Reply)>;
}

impl<'scope> Cite<'scope> for StreamVec<'scope, u64, (Context, Reply)> {
    fn cite(
        self,
        invalidator: Rc<RefCell<Invalidator>>,
    ) -> StreamVec<'scope, u64, (Context, Reply)> {
        map_stage(self, "Cite", move |(context, reply): (Context, Reply)| {
            invalidator.borrow_mut().cite(&context);
            (context, reply)
        })
    }
}

/// Extension trait: invalidate contexts whose chunks changed.
pub trait Invalidate {
    /// Broadcasts the ids of changed chunks to every worker, whose invalidator tells the holders of
    /// the contexts citing them.
    fn invalidate(self, invalidator: Rc<RefCell<Invalidator>>);
}

impl Invalidate for StreamVec<'_, u64, uuid::Uuid> {
    fn invalidate(self, invalidator: Rc<RefCell<Invalidator>>) {
        self.broadcast().inspect_core(move |event| {
            if let Ok((_, ids)) = event {
                invalidator.borrow_mut().changed(ids);
            }
        });
    }
}
