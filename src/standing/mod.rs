//! Standing queries: subscriptions whose contexts the job keeps current as the corpus changes.
//!
//! A subscription is a query event, bound to the tenant and labels of the credential that made it.
//! Its versions are contexts the job's own query dataflow answered for that event (through
//! [`HttpIngress`], the path of `POST /v1/query`), so a version is what a one-shot query with the
//! same body answers at the version's watermark. The index writers record each tenant's finished
//! documents in a change feed ([`Changes`]); an evaluator thread re-evaluates the subscriptions a
//! change may move and publishes a new version only where the context moved.
//!
//! # Guarantees
//! - **Exact at rest.** A change is reflected only by an evaluation whose watermark is past the
//!   change's event time; until one is, the subscription stays pending and is evaluated again. Once
//!   ingest is quiet at watermark W and no subscription is pending, each latest version equals (items,
//!   order, text, tokens) the one-shot answer at W.
//! - **No empty versions.** An evaluation whose items (ids, order, text, tokens, lines) and packed
//!   string equal the latest version's publishes nothing.
//! - **Ordered.** Versions are numbered 1, 2, … without gaps; a subscription's evaluations run one at
//!   a time, each at one watermark, so watermarks never go backwards.
//! - **Coalesced.** At most one evaluation of a subscription per `min_interval_ms`: changes meanwhile
//!   are folded into the next. At most `standing.evaluations_in_flight` evaluations run at once,
//!   taken round robin over the tenants, so one tenant's many subscriptions do not hold up another's.
//! - **Bounded.** Per-tenant and total caps, `versions_kept` versions per subscription, a TTL;
//!   expiry and unsubscribing free everything.
//! - **Kept across restarts** (`standing.durable`): each subscription and its latest version in a
//!   file ([`store`]); a job started again binds each by its credential as configured now and
//!   answers it again, going on from the kept version's number and watermark.
//!
//! # Which subscriptions a change re-evaluates
//! Only a change of a subscription's own tenant can move it (documents and BM25 statistics are per
//! tenant). Of those, each evaluation leaves a [`Probe`] of what its retrieval saw, and a batch of
//! changed documents re-evaluates only the subscriptions whose probe it may move: a changed
//! document with a member in either lane; a new chunk whose cosine with the query vector reaches the
//! dense lane's lowest member's (one pass of dot products over the tenant's subscriptions and the
//! batch's chunks); a new chunk whose BM25 score comes within twice the statistics' drift of the
//! BM25 lane's lowest member's (the chunk's terms looked up in an inverted index of the
//! subscriptions' terms; the drift bounds how far any chunk's BM25 score moved since the probe,
//! [`Probe::drift`]); or a drift past `standing.drift` of the lane's best score (the lane's members
//! may have changed places). When a tenant has been quiet for [`SETTLE`] (longer for one written
//! in a stream, up to [`SETTLE_MAX`]: [`changes::quiet_ms`]), subscriptions whose drift
//! is past `standing.rest_drift` of their best BM25 score are evaluated once more, so a context is
//! exact at rest (up to BM25 scores closer than twice that: with 0, exact). A subscription without a probe, a change recorded without its chunks (the feed
//! overflowed) and a server collection weighing terms across tenants (its own IDF) fall back to
//! re-evaluating every subscription the change may concern.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ragstream_core::query::probe::Probe;
use ragstream_core::query::{Context, Watermark};
use ragstream_operators::ingest::written::{Changes, DocChange, TenantChange};
use ragstream_operators::io::query_source::HttpIngress;
use ragstream_operators::metrics::{metrics, Moved};
use ragstream_operators::store::stats::CorpusStats;
use ragstream_operators::store::Bm25Encoder;
use ragstream_topologies::config::{StandingConfig, MAX_MIN_INTERVAL_MS};
use serde_json::{Map, Value};

pub mod event;
#[cfg(feature = "kafka")]
pub mod kafka;

/// The credential Kafka-made subscriptions are bound to (kept in builds without `kafka`, so that a
/// subscription an earlier run took over Kafka is never rebound to an HTTP token of that name).
pub const KAFKA_CREDENTIAL: &str = "kafka";
mod changes;
use changes::{reflects, weighed};
mod moves;
mod records;
mod store;
mod versions;
use moves::Chunk;
pub use records::{Refused, Request, Status, Unsubscribed, Version};
use store::{Restored, Saved, Store};
use versions::{diff, same};

/// Where the versions of subscriptions made over Kafka go (the contexts topic).
pub trait Publish: Send + Sync {
    /// A new version (version 1 included; the latest again where a subscribe event came twice).
    fn version(&self, version: &Version);
    /// The subscription ended.
    fn end(&self, id: &str);
}

/// How often the evaluator looks at the change feed and at evaluations under way.
const TICK: Duration = Duration::from_millis(20);
/// Longest an evaluation may take before it is given up and tried again.
const EVALUATION_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a tenant stays without changes before its subscriptions are checked for drift at rest.
pub const SETTLE: Duration = Duration::from_millis(300);
/// The longest a tenant written at a slow pace must stay without changes to be at rest.
pub const SETTLE_MAX: Duration = Duration::from_secs(3);

/// The process's standing queries.
pub struct Standing {
    config: StandingConfig,
    ingress: Arc<HttpIngress>,
    changes: Arc<Changes>,
    /// The tenants' BM25 statistics, where the job weighs the query terms itself (`None`: the index
    /// weighs terms across tenants, any change may move any subscription), and the ingest's BM25
    /// encoder (to weigh a probe's members; its largest weight a term can have in a chunk bounds
    /// the drift, [`Bm25Params::weight_max`]).
    ///
    /// [`Bm25Params::weight_max`]: ragstream_operators::store::Bm25Params::weight_max
    stats: Option<(Arc<CorpusStats>, Bm25Encoder)>,
    /// Where subscriptions are kept across restarts (`None`: not kept).
    store: Option<Store>,
    /// Where versions of subscriptions made with `publish` go.
    publisher: std::sync::OnceLock<Arc<dyn Publish>>,
    state: Mutex<State>,
    stopped: AtomicBool,
}

/// A token bucket over re-evaluations (`standing.evaluations_per_sec`): it fills at the rate, up
/// to one second's worth, and each evaluation started takes a token.
#[derive(Default)]
struct Pace {
    tokens: f64,
    filled: Option<Instant>,
}

impl Pace {
    /// Evaluations that may start now at `rate` per second.
    fn room(&mut self, now: Instant, rate: f64) -> usize {
        let since = self
            .filled
            .map_or(1.0, |filled| now.duration_since(filled).as_secs_f64());
        self.filled = Some(now);
        self.tokens = (self.tokens + since * rate).min(rate.max(1.0));
        self.tokens.floor().max(0.0) as usize
    }

    fn spend(&mut self) {
        self.tokens -= 1.0;
    }
}

#[derive(Default)]
struct State {
    /// The pace of re-evaluations.
    pace: Pace,
    subscriptions: HashMap<String, Subscription>,
    by_tenant: HashMap<String, BTreeSet<String>>,
    /// Subscriptions pending or being evaluated (the evaluator looks at these only).
    active: BTreeSet<String>,
    /// The change serial the evaluator has taken in.
    seen_serial: u64,
    /// Subscriptions made so far (part of each id).
    made: u64,
    /// Where the round robin over tenants starts next.
    turn: u64,
    /// Tenants changed since their subscriptions were last checked for drift at rest.
    settle: HashMap<String, Settling>,
    /// Each tenant's latest change time (ms since the epoch), while it holds subscriptions.
    last_change_ms: HashMap<String, u64>,
    /// Subscriptions being made (their first evaluation under way).
    subscribing: usize,
}

/// A tenant waiting for its drift check at rest.
#[derive(Clone, Copy)]
struct Settling {
    /// Its latest change.
    change: TenantChange,
    /// How long it must stay without changes to be at rest ([`changes::quiet_ms`]: a tenant written every
    /// second is not at rest between two writes).
    quiet_ms: u64,
    /// Its statistics' deltas applied at the last check (`u64::MAX`: none yet).
    applied: u64,
    /// When it was last checked (ms since the epoch).
    checked_ms: u64,
}

struct Subscription {
    tenant: String,
    credential: String,
    /// Its versions go to the publisher.
    publish: bool,
    query: Map<String, Value>,
    min_interval: Duration,
    expires: Instant,
    /// The same as ms since the epoch (what is kept on disk).
    expires_ms: u64,
    versions: VecDeque<Arc<Version>>,
    /// The newest change of its tenant not yet reflected.
    wanted: Option<TenantChange>,
    evaluation: Option<Evaluation>,
    /// What the latest evaluation's retrieval saw (`None`: every change of its tenant may move it).
    probe: Option<Arc<Probe>>,
    /// The newest change judged not to move it while an evaluation was under way (that evaluation
    /// may not reflect it: judged again when it ends).
    judged: Option<TenantChange>,
    last_started: Instant,
    evaluations: u64,
    /// The latest version number, for the event streams; dropped when the subscription ends.
    notify: tokio::sync::watch::Sender<u64>,
}

struct Evaluation {
    receiver: mpsc::Receiver<Context>,
    ticket: u64,
    /// The change it was started for.
    change: Option<TenantChange>,
    started: Instant,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Standing {
    /// A registry evaluating through `ingress`, told of changes by `changes`; starts its evaluator.
    /// `stats`: the tenants' BM25 statistics where the job weighs query terms itself (`None` where
    /// the index weighs them across tenants), with the ingest's BM25 encoder.
    /// `kept`: the directory of the subscriptions kept across restarts (`None`: none kept); those
    /// it holds come back with [`Standing::restore`].
    pub fn start(
        config: StandingConfig,
        ingress: Arc<HttpIngress>,
        changes: Arc<Changes>,
        stats: Option<(Arc<CorpusStats>, Bm25Encoder)>,
        kept: Option<&std::path::Path>,
    ) -> anyhow::Result<Arc<Self>> {
        let store = kept.map(Store::open).transpose()?;
        let standing = Arc::new(Self {
            config,
            ingress,
            changes,
            stats,
            store,
            publisher: std::sync::OnceLock::new(),
            state: Mutex::new(State::default()),
            stopped: AtomicBool::new(false),
        });
        let evaluator = Arc::downgrade(&standing);
        std::thread::Builder::new()
            .name("standing".into())
            .spawn(move || {
                while let Some(standing) = evaluator.upgrade() {
                    if standing.stopped.load(Ordering::SeqCst) {
                        break;
                    }
                    standing.tick(Instant::now());
                    drop(standing);
                    std::thread::sleep(TICK);
                }
            })?;
        Ok(standing)
    }

    /// Stops evaluating (the job is stopping); event streams end. Kept subscriptions stay kept
    /// (their files written so far are flushed).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        let mut state = lock(&self.state);
        state.subscriptions.clear();
        state.by_tenant.clear();
        state.active.clear();
        metrics().standing_held.set(0);
        drop(state);
        if let Some(store) = &self.store {
            store.flush(Duration::from_secs(5));
        }
    }

    /// Takes back the subscriptions kept by an earlier run: each whose credential (by its name)
    /// still opens its query, as `rebind` answers (the query as that credential binds it now, or
    /// why not), within the caps and not expired. Each is evaluated again at once and publishes a
    /// version only where its context moved since its latest kept version; the others' files are
    /// removed. Returns how many came back.
    pub fn restore(
        &self,
        rebind: impl Fn(&str, Map<String, Value>) -> Result<Map<String, Value>, String>,
    ) -> usize {
        let Some(store) = &self.store else {
            return 0;
        };
        let now = Instant::now();
        let now_ms = ragstream_operators::now_millis();
        let mut state = lock(&self.state);
        let mut restored = 0;
        for kept in store.load() {
            let Restored {
                subscription_id: id,
                tenant,
                credential,
                query,
                min_interval_ms,
                expires_ms,
                publish,
                latest,
                ..
            } = kept;
            let refused = if expires_ms <= now_ms {
                Some("expired".to_string())
            } else if state.subscriptions.contains_key(&id) {
                Some("held already".to_string())
            } else if min_interval_ms > MAX_MIN_INTERVAL_MS {
                Some("min_interval_ms out of range".to_string())
            } else if let Err(full) = self.room(&state, &tenant) {
                Some(format!("{full:?}"))
            } else {
                None
            };
            let query = match refused {
                Some(why) => Err(why),
                None => rebind(&credential, query).and_then(|query| {
                    match query.get("tenant").and_then(Value::as_str) == Some(tenant.as_str()) {
                        true => Ok(query),
                        false => Err("its query names another tenant".into()),
                    }
                }),
            };
            let query = match query {
                Ok(query) => query,
                Err(why) => {
                    tracing::info!(subscription = %id, %tenant, reason = %why, "a kept subscription ended at restart");
                    store.remove(&id);
                    continue;
                }
            };
            if let Some(made) = id
                .strip_prefix("sub-")
                .and_then(|rest| rest.split('-').next())
                .and_then(|made| made.parse::<u64>().ok())
            {
                state.made = state.made.max(made);
            }
            let min_interval = Duration::from_millis(min_interval_ms);
            // Evaluated again at once; its change counts as reflected by an answer at least at the
            // kept version's watermark (so versions never go back past it).
            let wanted = TenantChange {
                serial: 0,
                time: latest.index_watermark.frontier_ms.saturating_sub(1),
                recorded_ms: now_ms,
            };
            let terms = Terms {
                tenant,
                credential,
                publish,
                query,
                min_interval,
                expires_ms,
            };
            let due = now.checked_sub(min_interval).unwrap_or(now);
            hold(
                &mut state,
                id,
                terms,
                Arc::new(latest),
                (Some(wanted), None, due),
            );
            restored += 1;
        }
        if restored > 0 {
            self.changes.set_detailed(true);
        }
        metrics()
            .standing_held
            .set(state.subscriptions.len() as i64);
        restored
    }

    /// Ends a subscription ([`remove`]); a published one ends with its publisher's end record.
    fn remove(&self, state: &mut State, id: &str) {
        let published = state
            .subscriptions
            .get(id)
            .is_some_and(|subscription| subscription.publish);
        remove(state, id, (&self.ingress, self.store.as_ref()));
        if let (true, Some(publisher)) = (published, self.publisher.get()) {
            publisher.end(id);
        }
    }

    /// Sets where the versions of subscriptions made with `publish` go (once).
    #[cfg_attr(
        not(feature = "kafka"),
        allow(dead_code, reason = "the contexts topic's publisher")
    )]
    pub fn set_publisher(&self, publisher: Arc<dyn Publish>) {
        let _ = self.publisher.set(publisher);
    }

    fn publish(&self, version: &Version) {
        if let Some(publisher) = self.publisher.get() {
            publisher.version(version);
        }
    }

    /// Ends subscription `id` of `tenant` (true), if it exists.
    #[cfg_attr(
        not(feature = "kafka"),
        allow(dead_code, reason = "ended over the queries topic")
    )]
    pub fn end(&self, id: &str, tenant: &str) -> bool {
        let tenants = BTreeSet::from([tenant.to_string()]);
        self.unsubscribe(id, Some(&tenants))
    }

    /// Keeps a subscription's parameters and latest version on disk (where subscriptions are kept).
    fn keep(&self, id: &str, subscription: &Subscription) {
        let (Some(store), Some(latest)) = (&self.store, subscription.versions.back()) else {
            return;
        };
        store.save(&Saved {
            format: store::FORMAT,
            subscription_id: id,
            tenant: &subscription.tenant,
            credential: &subscription.credential,
            query: &subscription.query,
            min_interval_ms: subscription.min_interval.as_millis() as u64,
            expires_ms: subscription.expires_ms,
            publish: subscription.publish,
            latest,
        });
    }

    /// Makes a subscription and evaluates its first version (blocking: call off the server's
    /// threads).
    pub fn subscribe(&self, request: Request) -> Result<Arc<Version>, Refused> {
        let min_interval_ms = request
            .min_interval_ms
            .unwrap_or(self.config.default_min_interval_ms);
        if min_interval_ms > MAX_MIN_INTERVAL_MS {
            return Err(Refused::Invalid(format!(
                "min_interval_ms must be at most {MAX_MIN_INTERVAL_MS} (an hour)"
            )));
        }
        let ttl_secs = request.ttl_secs.unwrap_or(self.config.default_ttl_secs);
        if !(1..=self.config.max_ttl_secs).contains(&ttl_secs) {
            return Err(Refused::Invalid(format!(
                "ttl_secs must be from 1 to {} (standing.max_ttl_secs)",
                self.config.max_ttl_secs
            )));
        }
        let Some(tenant) = request.query.get("tenant").and_then(Value::as_str) else {
            return Err(Refused::Invalid("the query names no tenant".into()));
        };
        let tenant = tenant.to_string();
        let id = {
            let mut state = lock(&self.state);
            if let Some(id) = &request.id {
                // A subscription of the client's id: the latest version again (an event read
                // twice subscribes once), or a refusal where another tenant holds the id.
                if let Some(held) = state.subscriptions.get(id) {
                    if held.tenant != tenant {
                        return Err(Refused::Invalid(format!(
                            "subscription id {id} is held by another tenant"
                        )));
                    }
                    let asked = |query: &Map<String, Value>| {
                        let mut query = query.clone();
                        query.remove("query_id");
                        query
                    };
                    if asked(&held.query) != asked(&request.query) {
                        return Err(Refused::Invalid(format!(
                            "subscription id {id} is held with another query: end it first"
                        )));
                    }
                    let latest = held.versions.back().cloned().ok_or(Refused::Stopping)?;
                    if held.publish {
                        self.publish(&latest);
                    }
                    return Ok(latest);
                }
            }
            self.room(&state, &tenant)?;
            state.made += 1;
            state.subscribing += 1;
            match &request.id {
                Some(id) => id.clone(),
                None => format!("sub-{}-{:016x}", state.made, rand_suffix()),
            }
        };
        // The feed keeps documents' chunks from before the first evaluation on.
        self.changes.set_detailed(true);
        let made = self.make(id, tenant, request, min_interval_ms, ttl_secs);
        lock(&self.state).subscribing -= 1;
        made
    }

    /// Evaluates a new subscription's first version and holds it.
    fn make(
        &self,
        id: String,
        tenant: String,
        request: Request,
        min_interval_ms: u64,
        ttl_secs: u64,
    ) -> Result<Arc<Version>, Refused> {
        let since = self.changes.serial();
        let mut context = self.evaluate_now(&id, 1, &request.query)?;
        if context.error.is_some() {
            return Err(Refused::Query(Box::new(context)));
        }
        let now = Instant::now();
        let expires_ms =
            ragstream_operators::now_millis().saturating_add(ttl_secs.saturating_mul(1000));
        let probe = weighed(context.probe.take(), self.encoder(), None);
        let version = Arc::new(Version {
            subscription_id: id.clone(),
            version: 1,
            index_watermark: context.index_watermark.clone(),
            published_ms: ragstream_operators::now_millis(),
            diff: diff(None, &context),
            context,
        });
        let mut state = lock(&self.state);
        self.room(&state, &tenant)?;
        // A change of the tenant not reflected by the first version keeps it pending (read under
        // the lock: the evaluator takes no change in between without seeing this subscription).
        let wanted = self
            .changes
            .of(&tenant)
            .filter(|change| !reflects(&version.index_watermark, change) || change.serial > since);
        let terms = Terms {
            tenant,
            credential: request.credential,
            publish: request.publish,
            query: request.query,
            min_interval: Duration::from_millis(min_interval_ms),
            expires_ms,
        };
        hold(
            &mut state,
            id.clone(),
            terms,
            version.clone(),
            (wanted, probe, now),
        );
        if let Some(made) = state.subscriptions.get(&id) {
            self.keep(&id, made);
            if made.publish {
                self.publish(&version);
            }
        }
        metrics()
            .standing_held
            .set(state.subscriptions.len() as i64);
        metrics().standing_versions.inc();
        Ok(version)
    }

    /// Whether `tenant` may hold one more subscription.
    fn room(&self, state: &State, tenant: &str) -> Result<(), Refused> {
        if self.stopped.load(Ordering::SeqCst) {
            return Err(Refused::Stopping);
        }
        let held = state.by_tenant.get(tenant).map_or(0, BTreeSet::len);
        if held >= self.config.max_per_tenant {
            return Err(Refused::TenantFull(self.config.max_per_tenant));
        }
        if state.subscriptions.len() >= self.config.max_total {
            return Err(Refused::Full(self.config.max_total));
        }
        Ok(())
    }

    /// Evaluates `query` once, waiting for its context.
    fn evaluate_now(
        &self,
        id: &str,
        serial: u64,
        query: &Map<String, Value>,
    ) -> Result<Context, Refused> {
        let (_, receiver) = self.submit(id, serial, query);
        receiver
            .recv_timeout(EVALUATION_TIMEOUT)
            .map_err(|_| Refused::Stopping)
    }

    /// Hands one evaluation of `query` to the dataflow.
    fn submit(
        &self,
        id: &str,
        serial: u64,
        query: &Map<String, Value>,
    ) -> (u64, mpsc::Receiver<Context>) {
        let mut event = query.clone();
        event.insert("query_id".into(), Value::String(format!("{id}#{serial}")));
        let body = serde_json::to_vec(&Value::Object(event)).unwrap_or_default();
        self.ingress.submit_internal(body)
    }

    /// The subscription's state, if it exists and `tenants` (a credential's, `None`: any) holds
    /// its tenant.
    pub fn status(&self, id: &str, tenants: Option<&BTreeSet<String>>) -> Option<Status> {
        let state = lock(&self.state);
        let subscription = state.subscriptions.get(id)?;
        if !visible(subscription, tenants) {
            return None;
        }
        // Pending counts every change recorded so far, not only those the evaluator took in.
        let untaken = self
            .changes
            .of(&subscription.tenant)
            .is_some_and(|change| change.serial > state.seen_serial);
        Some(Status {
            subscription_id: id.to_string(),
            tenant: subscription.tenant.clone(),
            pending: subscription.wanted.is_some()
                || subscription.evaluation.is_some()
                || state.settle.contains_key(&subscription.tenant)
                || untaken,
            min_interval_ms: subscription.min_interval.as_millis() as u64,
            expires_in_secs: subscription
                .expires
                .saturating_duration_since(Instant::now())
                .as_secs(),
            latest: subscription.versions.back()?.clone(),
        })
    }

    /// The subscriptions `tenants` (`None`: any) may see: (id, tenant, latest version number), by id.
    #[cfg_attr(
        not(feature = "mcp"),
        allow(dead_code, reason = "an MCP tool's listing")
    )]
    pub fn held(&self, tenants: Option<&BTreeSet<String>>) -> Vec<(String, String, u64)> {
        let state = lock(&self.state);
        let mut held: Vec<(String, String, u64)> = state
            .subscriptions
            .iter()
            .filter(|(_, subscription)| visible(subscription, tenants))
            .map(|(id, subscription)| {
                let version = subscription.versions.back().map_or(0, |v| v.version);
                (id.clone(), subscription.tenant.clone(), version)
            })
            .collect();
        held.sort();
        held
    }

    /// Ends a subscription (true), if it exists and `tenants` holds its tenant.
    pub fn unsubscribe(&self, id: &str, tenants: Option<&BTreeSet<String>>) -> bool {
        let mut state = lock(&self.state);
        if !state
            .subscriptions
            .get(id)
            .is_some_and(|subscription| visible(subscription, tenants))
        {
            return false;
        }
        self.remove(&mut state, id);
        true
    }

    /// The versions after `last` still kept (all kept where `last` is older than the oldest), and a
    /// receiver told of each new version (closed when the subscription ends).
    pub fn versions_after(
        &self,
        id: &str,
        tenants: Option<&BTreeSet<String>>,
        last: u64,
    ) -> Option<(Vec<Arc<Version>>, tokio::sync::watch::Receiver<u64>)> {
        let state = lock(&self.state);
        let subscription = state.subscriptions.get(id)?;
        if !visible(subscription, tenants) {
            return None;
        }
        let versions = subscription
            .versions
            .iter()
            .filter(|version| version.version > last)
            .cloned()
            .collect();
        Some((versions, subscription.notify.subscribe()))
    }
}

fn visible(subscription: &Subscription, tenants: Option<&BTreeSet<String>>) -> bool {
    tenants.is_none_or(|tenants| tenants.contains(&subscription.tenant))
}

/// What a subscription is made with (kept on disk, besides its latest version).
struct Terms {
    tenant: String,
    credential: String,
    publish: bool,
    query: Map<String, Value>,
    min_interval: Duration,
    /// When it expires (ms since the epoch).
    expires_ms: u64,
}

/// Holds a subscription made with `terms` whose latest version is `latest`: by id, by tenant, and
/// among the active ones where a change is `wanted`; `probe` is what `latest`'s retrieval saw,
/// `last_started` when its last evaluation started.
fn hold(
    state: &mut State,
    id: String,
    terms: Terms,
    latest: Arc<Version>,
    (wanted, probe, last_started): (Option<TenantChange>, Option<Arc<Probe>>, Instant),
) {
    let Terms {
        tenant,
        credential,
        publish,
        query,
        min_interval,
        expires_ms,
    } = terms;
    let (notify, _) = tokio::sync::watch::channel(latest.version);
    let left = expires_ms.saturating_sub(ragstream_operators::now_millis());
    state
        .by_tenant
        .entry(tenant.clone())
        .or_default()
        .insert(id.clone());
    if wanted.is_some() {
        state.active.insert(id.clone());
    }
    state.subscriptions.insert(
        id,
        Subscription {
            tenant,
            credential,
            publish,
            query,
            min_interval,
            expires: Instant::now() + Duration::from_millis(left),
            expires_ms,
            versions: VecDeque::from([latest]),
            wanted,
            evaluation: None,
            probe,
            judged: None,
            last_started,
            evaluations: 0,
            notify,
        },
    );
}

/// Removes a subscription, abandoning its evaluation and its file; its event streams end.
fn remove(state: &mut State, id: &str, (ingress, store): (&HttpIngress, Option<&Store>)) {
    if let Some(subscription) = state.subscriptions.remove(id) {
        if let Some(evaluation) = subscription.evaluation {
            ingress.abandon(evaluation.ticket);
        }
        if let Some(store) = store {
            store.remove(id);
        }
        if let Some(ids) = state.by_tenant.get_mut(&subscription.tenant) {
            ids.remove(id);
            if ids.is_empty() {
                state.by_tenant.remove(&subscription.tenant);
                state.last_change_ms.remove(&subscription.tenant);
            }
        }
    }
    state.active.remove(id);
    metrics()
        .standing_held
        .set(state.subscriptions.len() as i64);
}

/// 64 bits no client can guess from the ids it was given.
fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::changes::{newer, quiet_ms};
    use super::*;
    use ragstream_core::query::ContextItem;

    fn context(items: &[(&str, &str)]) -> Context {
        let mut context: Context = serde_json::from_value(serde_json::json!({
            "query_id": "q", "tenant": "t", "mode": "bounded", "items": [], "context": "",
            "tokens_used": 0, "token_budget": null, "tokenizer": "o200k_base",
            "chunks_available": 0, "chunks_returned": 0, "truncated": false, "intent": "definition",
            "weights": {"dense": 0.5, "bm25": 0.5}, "index_watermark": {"frontier_ms": 1},
            "latency_ms": {}
        }))
        .expect("a context");
        for (id, text) in items {
            let item: ContextItem = serde_json::from_value(serde_json::json!({
                "chunk_id": id, "doc_id": "d", "source": "s", "lines": [1, 2], "section_path": [],
                "tier": "full", "score": 0.5, "tokens": 3, "full_tokens": 3, "lanes": [],
                "text": text, "metadata": {}
            }))
            .expect("an item");
            context.items.push(item);
        }
        context
    }

    /// The diff names what was added, removed and changed, and whether the kept items moved.
    #[test]
    fn diff_names_added_removed_changed_and_reordered() {
        let before = context(&[("a", "one"), ("b", "two"), ("c", "three")]);
        let after = context(&[("c", "three"), ("a", "one!"), ("d", "four")]);
        let moved = diff(Some(&before), &after);
        assert_eq!(moved.added, vec!["d"]);
        assert_eq!(moved.removed, vec!["b"]);
        assert_eq!(moved.changed, vec!["a"]);
        assert!(moved.reordered);
        let first = diff(None, &after);
        assert_eq!(first.added, vec!["c", "a", "d"]);
        assert!(!same(&before, &after));
        let mut rescored = before.clone();
        rescored.items[0].score = 0.9;
        assert!(same(&before, &rescored), "a score alone is no new version");
    }

    /// The later change wins, keeping the later event time of both.
    /// The pace lets a second's worth start at once, then follows the rate; a slow rate still
    /// lets one through once a token filled.
    #[test]
    fn pace_starts_at_most_the_rate() {
        let start = Instant::now();
        let mut pace = Pace::default();
        assert_eq!(pace.room(start, 10.0), 10);
        for _ in 0..10 {
            pace.spend();
        }
        assert_eq!(pace.room(start, 10.0), 0);
        assert_eq!(pace.room(start + Duration::from_millis(250), 10.0), 2);
        // Never more than one second's worth, however long it waited.
        assert_eq!(pace.room(start + Duration::from_secs(60), 10.0), 10);
        let mut slow = Pace::default();
        assert_eq!(slow.room(start, 0.5), 0);
        assert_eq!(slow.room(start + Duration::from_secs(1), 0.5), 1);
        slow.spend();
        assert_eq!(slow.room(start + Duration::from_secs(2), 0.5), 0);
    }

    /// A tenant written now and then is at rest after SETTLE; one written in a stream only after
    /// twice its pace, at most SETTLE_MAX.
    #[test]
    fn a_stream_settles_after_twice_its_pace() {
        assert_eq!(quiet_ms(0), 300);
        assert_eq!(quiet_ms(100), 300);
        assert_eq!(quiet_ms(1000), 2000);
        assert_eq!(quiet_ms(1499), 2998);
        assert_eq!(quiet_ms(1500), 300);
        assert_eq!(quiet_ms(60_000), 300);
    }

    #[test]
    fn newer_keeps_the_later_serial_and_time() {
        let change = |serial, time| TenantChange {
            serial,
            time,
            recorded_ms: 0,
        };
        let kept = newer(Some(change(5, 100)), change(3, 200));
        assert_eq!((kept.serial, kept.time), (5, 200));
        let taken = newer(Some(change(2, 100)), change(3, 50));
        assert_eq!((taken.serial, taken.time), (3, 100));
        assert_eq!(newer(None, change(1, 1)).serial, 1);
    }
}
