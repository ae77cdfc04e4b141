//! The job's HTTP API (described by the OpenAPI document at `/v1/openapi.json`, [`crate::http::openapi`]):
//! `POST /v1/query` (a query event in the body, its context as the answer: the same dataflow as the
//! queries topic), `GET /v1/sources` and `GET /v1/chunks/{id}` (the `list_sources` and `read_chunk`
//! modes), `GET /v1/invalidations?since=N` (the process's invalidations of published contexts
//! numbered above N), `GET /v1/stats/index`, `GET /v1/cache`, `DELETE /v1/cache` and `POST`/`GET
//! /v1/reindex` (operations: the index's counts, the context caches, `force_reindex`), `/mcp` (the agent tools), and unversioned `/metrics` (Prometheus text),
//! `/healthz` (process up) and `/readyz` (index open, model loaded, broker reachable). Every error
//! is a problem (RFC 9457, [`crate::http::api::Problem`]). Bound to loopback unless configured otherwise.
//!
//! The server is hyper on a small tokio runtime of its own, built to stay up whatever a client sends:
//! - a connection cap (`http.max_connections`): a connection over it is closed at once;
//! - a deadline for a request's head and one for its body (`http.read_timeout_secs`), and the same
//!   for each write of a response to make progress (`deadline`), so slow or silent clients, and
//!   clients that stop reading, hold nothing for long;
//! - body limits checked against `Content-Length` before a byte of the body is read, and enforced
//!   while reading (chunked bodies);
//! - queries waiting for their contexts are capped (`http.max_queries_in_flight`, answered 503 with
//!   `Retry-After` beyond), and wait off the runtime's threads, so `/healthz`, `/readyz` and
//!   `/metrics` are answered at once however many queries are in flight;
//! - every request is handled in a task of its own: a panic answers that request 500 and nothing else;
//! - the `Host` header of the `/v1/` data routes and `/mcp` must be an allowed one (DNS-rebinding
//!   protection from browsers); health, metrics and the OpenAPI document answer any host, as probes
//!   and scrapers address the job by IP.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use ragstream_core::query::invalidate::InvalidationLog;
use ragstream_core::query::Context;
use ragstream_operators::ingest::decode::DecodeConfig;
use ragstream_operators::io::query_source::HttpIngress;
use tokio::sync::Semaphore;

use crate::http::api::{InvalidationsPage, Problem, SourcesPage, PROBLEM_JSON};

mod access;
pub mod api;
mod batches;
mod deadline;
pub mod documents;
pub mod openapi;
mod ops;
mod rate;
mod reads;
mod subscriptions;
mod writes;

pub use batches::BatchStatus;
use ops::{cache_stats, clear_cache, index_stats, reindex_status, start_reindex};
use reads::{chunk, invalidations, sources};
pub use subscriptions::SubscribeRequest;
use writes::{batch_status, delete_document, post_documents};

use access::{bind, Access, Tenants, Unauthorized};
pub use access::{check_open, AllowedHosts, QueryTokens};
use documents::DocumentsTarget;

/// Readiness flags set by the runtime.
#[derive(Debug)]
pub struct Readiness {
    /// Every worker opened its shard and loaded its embedder.
    pub ready: AtomicBool,
    /// The Kafka broker answered the last metadata probe (always true without Kafka).
    pub broker: AtomicBool,
}

impl Default for Readiness {
    fn default() -> Self {
        Self {
            ready: AtomicBool::new(false),
            broker: AtomicBool::new(true),
        }
    }
}

impl Readiness {
    /// `/readyz`: status and a line per check, then a line per outage being retried.
    ///
    /// An outage of a dependency the job shares with its peers (the index server, the embedding
    /// server, the DLQ) is listed but keeps the status 200: every instance would fail alike, and
    /// taking them all out of service would also stop the queries they can still answer (cached
    /// vectors, the BM25 lane). The `ragstream_outage` gauge and its alert report it instead.
    fn report(&self) -> (StatusCode, String) {
        let workers = self.ready.load(Ordering::SeqCst);
        let broker = self.broker.load(Ordering::SeqCst);
        let status = if workers && broker {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        let mut body = format!(
            "index and model: {}\nbroker: {}\n",
            if workers { "ok" } else { "starting" },
            if broker { "ok" } else { "unreachable" }
        );
        for outage in ragstream_operators::outage::current() {
            body.push_str(&format!(
                "outage: {} for {:.1} s, retrying; ingest paused: {}\n",
                outage.dependency,
                outage.duration.as_secs_f64(),
                outage.error.replace('\n', " ")
            ));
        }
        (status, body)
    }
}

/// Longest a `POST /v1/query` waits for its context.
const QUERY_TIMEOUT: Duration = Duration::from_secs(120);
/// Threads of the server's runtime: they read, route and answer; queries wait and documents are
/// checked elsewhere. Four, so that requests are read and answered while others copy large bodies.
const SERVER_THREADS: usize = 4;
/// Largest request head (request line and headers) read into memory.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// What bounds the server; see the module documentation.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Open connections at once.
    pub max_connections: usize,
    /// `POST /v1/query` and `/mcp` requests waiting for their contexts at once.
    pub max_queries_in_flight: usize,
    /// Deadline for a request's head, and separately for its body.
    pub read_timeout: Duration,
    /// Largest body of `POST /v1/query` and `/mcp` (twice `query.max_query_bytes`: a body between one
    /// and two times the query limit still reaches the dataflow, which dead-letters it as oversize).
    pub max_body_bytes: usize,
    /// Largest body of `POST /v1/documents` (four times `ingest.max_document_bytes`).
    pub max_documents_body_bytes: usize,
    /// Requests a second of one credential on the data routes and `/mcp` (0: no limit).
    pub token_requests_per_second: f64,
    /// Requests one credential may send at once after a quiet spell.
    pub token_burst: std::num::NonZeroU32,
}

/// The tenants a token may query (`None`: every tenant).
/// What every request handler shares.
struct Shared {
    readiness: Arc<Readiness>,
    ingress: Arc<HttpIngress>,
    invalidation_log: Arc<Mutex<InvalidationLog>>,
    tokens: QueryTokens,
    hosts: AllowedHosts,
    #[cfg(feature = "mcp")]
    mcp: crate::mcp::McpHttp,
    limits: Limits,
    queries: Arc<Semaphore>,
    /// Where `POST /v1/documents` writes.
    documents: DocumentsTarget,
    /// The checks of every document event.
    decode: DecodeConfig,
    /// Document batches read at once (and, to the documents topic, written).
    document_slots: Arc<Semaphore>,
    /// Where posted batches are parsed and checked: one thread per slot, at a lower CPU priority
    /// than the server's and the query path's threads.
    document_checks: ragstream_operators::offload::CallPool,
    /// Batches being written in local mode, per tenant, and their receipts.
    batches: Arc<batches::Batches>,
    /// Each credential's request rate.
    rates: rate::RateLimits,
    /// The standing queries (`None`: `standing.enabled = false`).
    standing: Option<Arc<crate::standing::Standing>>,
}

/// Document batches read and written at once (each up to `Limits::max_documents_body_bytes`).
const DOCUMENT_SLOTS: usize = 4;

/// A response body: whole, or an event stream.
type Body =
    http_body_util::Either<Full<Bytes>, http_body_util::channel::Channel<Bytes, Infallible>>;

type Reply = Response<Body>;

fn reply(status: StatusCode, body: impl Into<Bytes>, content_type: &'static str) -> Reply {
    let mut response = Response::new(Body::Left(Full::new(body.into())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    response
}

/// A problem reply (RFC 9457): `name` is one of [`crate::http::api::PROBLEMS`].
fn problem(name: &str, detail: &str) -> Reply {
    problem_reply(&Problem::new(name, detail))
}

fn problem_reply(problem: &Problem) -> Reply {
    let body = serde_json::to_string(problem).unwrap_or_default();
    let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    reply(status, body, PROBLEM_JSON)
}

/// A JSON body.
fn json_reply(body: &impl serde::Serialize) -> Reply {
    match serde_json::to_string(body) {
        Ok(body) => reply(StatusCode::OK, body, "application/json"),
        Err(cause) => problem("internal", &format!("cannot serialise the answer: {cause}")),
    }
}

/// The request's body, read within the limits: `Content-Length` over the limit is refused before
/// reading, a body that grows past it while read is refused too, and the whole body must arrive
/// within the read timeout.
async fn read_body(
    request: Request<Incoming>,
    limits: &Limits,
) -> Result<(http::request::Parts, Bytes), Reply> {
    let bound = format!(
        "the body is over {} bytes (twice query.max_query_bytes)",
        limits.max_body_bytes
    );
    read_body_within(request, limits.max_body_bytes, limits.read_timeout, &bound).await
}

/// The request's body within `limit` bytes and `timeout`; `over` says what the limit is.
async fn read_body_within(
    request: Request<Incoming>,
    limit: usize,
    timeout: Duration,
    over: &str,
) -> Result<(http::request::Parts, Bytes), Reply> {
    let (parts, body) = request.into_parts();
    if let Some(length) = parts.headers.get(http::header::CONTENT_LENGTH) {
        match length.to_str().ok().and_then(|l| l.parse::<u64>().ok()) {
            Some(length) if length > limit as u64 => return Err(problem("oversize", over)),
            Some(_) => {}
            None => return Err(problem("bad_request", "Content-Length is not a number")),
        }
    }
    match tokio::time::timeout(timeout, Limited::new(body, limit).collect()).await {
        Err(_) => Err(problem(
            "request_timeout",
            &format!("the body did not arrive within {} s", timeout.as_secs()),
        )),
        Ok(Err(cause)) if cause.is::<http_body_util::LengthLimitError>() => {
            Err(problem("oversize", over))
        }
        Ok(Err(cause)) => Err(problem(
            "bad_request",
            &format!("cannot read the body: {cause}"),
        )),
        Ok(Ok(collected)) => Ok((parts, collected.to_bytes())),
    }
}

/// A slot among the queries in flight, or 503 with `Retry-After`.
fn query_slot(shared: &Shared) -> Result<tokio::sync::OwnedSemaphorePermit, Box<Reply>> {
    shared.queries.clone().try_acquire_owned().map_err(|_| {
        Box::new(busy(&format!(
            "{} queries are in flight already (http.max_queries_in_flight); retry shortly",
            shared.limits.max_queries_in_flight
        )))
    })
}

/// Runs one query event through the dataflow: the body bound to the token's tenants and labels, a
/// slot among the queries in flight, the wait for its context. `Err`: the problem reply.
async fn ask(shared: &Arc<Shared>, body: Bytes, access: &Access) -> Result<Context, Reply> {
    let slot = query_slot(shared).map_err(|busy| *busy)?;
    // A tenant-bound token: the body names one of its tenants and at most its labels.
    let body = bind(body, access).map_err(|refused| {
        tracing::warn!("query refused: {refused}");
        problem("forbidden", &refused)
    })?;
    // Oversized bodies within the read limit still go through the dataflow, which refuses them with
    // a DLQ record.
    // The slot is held until the dataflow answers, not until the caller stops waiting.
    // Dropping `abandon` (this handler dropped: the client went away) releases the waiting thread.
    let (abandon, receiver) = shared
        .ingress
        .submit_guarded(body.to_vec(), Some(Box::new(slot)));
    let waited = tokio::task::spawn_blocking(move || receiver.recv_timeout(QUERY_TIMEOUT)).await;
    let answer = match waited {
        Ok(Ok(context)) => Ok(context),
        Ok(Err(mpsc::RecvTimeoutError::Disconnected)) => Err(problem(
            "stopping",
            "the job is stopping and takes no more queries",
        )),
        Ok(Err(mpsc::RecvTimeoutError::Timeout)) => {
            Err(problem("timeout", "no context within 120 s"))
        }
        Err(_) => Err(problem("internal", "the query's wait failed")),
    };
    drop(abandon);
    answer
}

/// The context's problem reply, if it carries an error.
fn refused(context: &Context) -> Option<Reply> {
    Problem::of_context(context).map(|problem| problem_reply(&problem))
}

/// `POST /v1/query`: the query event in the body, its context as the answer.
async fn query(shared: Arc<Shared>, request: Request<Incoming>, access: Access) -> Reply {
    // The slot is taken once the body is in: a slow client holds a connection, never a query slot.
    let body = match read_body(request, &shared.limits).await {
        Ok((_, body)) => body,
        Err(refused) => return refused,
    };
    match ask(&shared, body, &access).await {
        Ok(context) => refused(&context).unwrap_or_else(|| json_reply(&context)),
        Err(reply) => reply,
    }
}

/// 429 `rate_limited` with `Retry-After` (whole seconds, at least 1).
fn rate_limited(credential: &str, wait: Duration) -> Reply {
    let mut response = problem(
        "rate_limited",
        &format!(
            "the requests of this credential ({credential}) are over http.token_requests_per_second; \
             retry in {:.1} s",
            wait.as_secs_f64()
        ),
    );
    let seconds = wait.as_secs_f64().ceil().max(1.0) as u64;
    if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
        response
            .headers_mut()
            .insert(http::header::RETRY_AFTER, value);
    }
    ragstream_operators::metrics::metrics()
        .http_rate_limited
        .inc();
    tracing::debug!(credential, "request over its credential's rate: 429");
    response
}

/// 503 `busy` with `Retry-After`.
fn busy(detail: &str) -> Reply {
    let mut response = problem("busy", detail);
    response
        .headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// The query parameters of a request, decoded (`application/x-www-form-urlencoded`).
fn parameters(query: &str) -> BTreeMap<String, String> {
    form_urlencoded::parse(query.as_bytes())
        .map(|(name, value)| (name.into_owned(), value.into_owned()))
        .collect()
}

/// The tenant a request names, or the one tenant its token opens (`None`: neither).
fn tenant_of(params: &BTreeMap<String, String>, access: &Access) -> Option<String> {
    if let Some(tenant) = params.get("tenant") {
        return Some(tenant.clone());
    }
    match access.tenants.as_deref() {
        Some(tenants) if tenants.len() == 1 => tenants.iter().next().cloned(),
        _ => None,
    }
}

const NAME_THE_TENANT: &str = "name the tenant: ?tenant=<tenant>";

/// A query id for the routes that build their query themselves (answers are matched by ticket).
fn internal_query_id() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    format!("http-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

fn unauthorized(path: &str) -> Reply {
    tracing::warn!(path, "request refused: missing or wrong bearer token");
    problem("unauthorized", "missing or wrong bearer token")
}

/// 405 with the methods the route takes.
fn method_not_allowed(allow: &'static str) -> Reply {
    let mut response = problem("method_not_allowed", &format!("this route takes {allow}"));
    response
        .headers_mut()
        .insert(http::header::ALLOW, HeaderValue::from_static(allow));
    response
}

/// The OpenAPI document, generated once.
fn openapi_json() -> &'static str {
    static DOCUMENT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DOCUMENT.get_or_init(|| crate::http::openapi::pretty(&crate::http::openapi::document()))
}

/// The data routes: they check the `Host` and the bearer token.
fn is_data_route(path: &str) -> bool {
    let one_segment = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|id| !id.is_empty() && !id.contains('/'))
    };
    matches!(
        path,
        "/v1/query"
            | "/v1/sources"
            | "/v1/invalidations"
            | "/v1/documents"
            | "/v1/stats/index"
            | "/v1/cache"
            | "/v1/reindex"
            | "/v1/subscriptions"
            | "/mcp"
    ) || one_segment("/v1/chunks/")
        || one_segment("/v1/subscriptions/")
        || path
            .strip_prefix("/v1/subscriptions/")
            .and_then(|rest| rest.strip_suffix("/events"))
            .is_some_and(|id| !id.is_empty() && !id.contains('/'))
        || one_segment("/v1/documents/")
        || one_segment("/v1/batches/")
}

/// Routes one request.
async fn route(shared: Arc<Shared>, request: Request<Incoming>) -> Reply {
    let path = request.uri().path().to_string();
    let params = request.uri().query().unwrap_or("").to_string();
    match path.as_str() {
        "/healthz" => return reply(StatusCode::OK, "ok\n", "text/plain"),
        "/readyz" => {
            let (status, body) = shared.readiness.report();
            return reply(status, body, "text/plain");
        }
        "/metrics" => {
            return reply(
                StatusCode::OK,
                ragstream_operators::metrics::metrics().render(),
                "text/plain; version=0.0.4",
            )
        }
        "/v1/openapi.json" => return reply(StatusCode::OK, openapi_json(), "application/json"),
        path if is_data_route(path) => {}
        _ => return problem("not_found", &format!("no route {}", prefix(&path))),
    }
    if !shared
        .hosts
        .allows(request.headers().get(http::header::HOST))
    {
        tracing::warn!(
            path,
            "request refused: Host is not an allowed one (http.allowed_hosts)"
        );
        return problem(
            "host_not_allowed",
            "this Host is not allowed (http.allowed_hosts)",
        );
    }
    let (access, credential) = match shared.tokens.grant_named(request.headers()) {
        Ok((access, credential)) => match shared.rates.take(&credential, std::time::Instant::now())
        {
            Ok(()) => (access, credential),
            Err(wait) => return rate_limited(&credential, wait),
        },
        Err(Unauthorized) => return unauthorized(&path),
    };
    let method = request.method().clone();
    let (get, post) = (
        method == Method::GET || method == Method::HEAD,
        method == Method::POST,
    );
    match path.as_str() {
        "/v1/query" if post => query(shared, request, access).await,
        "/v1/query" => method_not_allowed("POST"),
        "/v1/sources" if get => sources(shared, &params, access).await,
        "/v1/invalidations" if get => {
            invalidations(&params, &shared.invalidation_log, access.tenants)
        }
        "/v1/sources" | "/v1/invalidations" => method_not_allowed("GET"),
        "/v1/stats/index" if get => index_stats(shared, &params, access).await,
        "/v1/stats/index" => method_not_allowed("GET"),
        "/v1/cache" if get => cache_stats(&shared, &params, &access),
        "/v1/cache" if method == Method::DELETE => clear_cache(&shared, &params, &access),
        "/v1/cache" => method_not_allowed("GET, DELETE"),
        "/v1/reindex" if post => start_reindex(&shared, &params, &access),
        "/v1/reindex" if get => reindex_status(&shared, &params, &access),
        "/v1/reindex" => method_not_allowed("GET, POST"),
        "/v1/documents" if post => post_documents(shared, request, &params, access).await,
        "/v1/documents" => method_not_allowed("POST"),
        document if document.starts_with("/v1/documents/") => {
            if method == Method::DELETE {
                let doc_id = document.trim_start_matches("/v1/documents/");
                delete_document(shared, doc_id, &params, access).await
            } else {
                method_not_allowed("DELETE")
            }
        }
        "/v1/subscriptions" if post => {
            subscriptions::subscribe(shared, request, (access, &credential)).await
        }
        "/v1/subscriptions" => method_not_allowed("POST"),
        standing if standing.starts_with("/v1/subscriptions/") => subscriptions::route(
            &shared,
            &request,
            standing.trim_start_matches("/v1/subscriptions/"),
            &params,
            &access,
        ),
        batch if batch.starts_with("/v1/batches/") => match get {
            true => batch_status(&shared, batch.trim_start_matches("/v1/batches/"), &access),
            false => method_not_allowed("GET"),
        },
        #[cfg(not(feature = "mcp"))]
        "/mcp" => {
            let _ = (request, credential);
            problem(
                "not_found",
                "this build of ragstream serves no MCP tools: build it with the `mcp` feature \
                 (cargo build --features mcp, or --features full)",
            )
        }
        #[cfg(feature = "mcp")]
        "/mcp" => {
            let (parts, body) = match read_body(request, &shared.limits).await {
                Ok(read) => read,
                Err(refused) => return refused,
            };
            let slot = match query_slot(&shared) {
                Ok(slot) => slot,
                Err(busy) => return *busy,
            };
            let grant = crate::mcp::Grant(access.tenants, access.labels, credential);
            let reply = shared.mcp.handle(parts, body, grant).await.map(Body::Left);
            drop(slot);
            reply
        }
        chunk_path if get => {
            let chunk_id = chunk_path.trim_start_matches("/v1/chunks/");
            chunk(shared, chunk_id, &params, access).await
        }
        _ => method_not_allowed("GET"),
    }
}

/// At most the first 128 bytes of `text` (a request's path in a message).
fn prefix(text: &str) -> &str {
    let end = text.floor_char_boundary(128);
    &text[..end]
}

/// A request's task, aborted when the connection goes away before it is answered (so a query whose
/// client left is abandoned: it leaves the queue, or keeps its slot until the job answers it).
struct RequestTask(tokio::task::JoinHandle<Reply>);

impl Drop for RequestTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Handles one request in a task of its own, so that a panic answers 500 and leaves the connection
/// and the server as they were.
async fn handle(shared: Arc<Shared>, request: Request<Incoming>) -> Result<Reply, Infallible> {
    let mut task = RequestTask(tokio::spawn(route(shared, request)));
    match (&mut task.0).await {
        Ok(reply) => Ok(reply),
        Err(failed) => {
            tracing::error!(error = %failed, "an HTTP handler failed; answered 500");
            Ok(problem("internal", "internal error"))
        }
    }
}

/// Accepts connections until the process exits, each served within the limits.
async fn accept(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    let connections = Arc::new(Semaphore::new(shared.limits.max_connections));
    let read_timeout = shared.limits.read_timeout;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(cause) => {
                // Out of file descriptors and the like: wait a moment rather than spin.
                tracing::warn!(error = %cause, "cannot accept an HTTP connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            tracing::warn!("HTTP connection closed at once: http.max_connections are open");
            drop(stream);
            continue;
        };
        // Each write goes out at once: a response's head and body are separate writes, and with
        // Nagle's algorithm the body waited for the client's delayed ACK (~40 ms a response).
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |request| handle(shared.clone(), request));
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(read_timeout)
                .max_buf_size(MAX_HEAD_BYTES)
                .serve_connection(
                    TokioIo::new(deadline::WriteDeadline::new(stream, read_timeout)),
                    service,
                );
            let _ = connection.await;
            drop(permit);
        });
    }
}

/// Serves until the process exits. Returns the bound address.
#[allow(clippy::too_many_arguments)]
pub fn serve(
    listen: &str,
    readiness: Arc<Readiness>,
    ingress: Arc<HttpIngress>,
    invalidation_log: Arc<Mutex<InvalidationLog>>,
    tokens: QueryTokens,
    allowed_hosts: &[String],
    limits: Limits,
    documents: DocumentsTarget,
    decode: DecodeConfig,
    standing: Option<Arc<crate::standing::Standing>>,
) -> anyhow::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(listen)
        .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
    listener.set_nonblocking(true)?;
    let address = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(SERVER_THREADS)
        .max_blocking_threads(limits.max_queries_in_flight.saturating_add(16))
        .thread_name("http")
        .enable_all()
        .build()?;
    let listener = {
        let _entered = runtime.enter();
        tokio::net::TcpListener::from_std(listener)?
    };
    let rates = rate::RateLimits::new(limits.token_requests_per_second, limits.token_burst);
    let shared = Arc::new(Shared {
        readiness,
        queries: Arc::new(Semaphore::new(limits.max_queries_in_flight)),
        #[cfg(feature = "mcp")]
        mcp: crate::mcp::McpHttp::new(
            ingress.clone(),
            standing.clone(),
            AllowedHosts::for_mcp(allowed_hosts).as_deref(),
        ),
        ingress,
        invalidation_log,
        tokens,
        hosts: AllowedHosts::new(allowed_hosts),
        limits,
        documents,
        decode,
        document_slots: Arc::new(Semaphore::new(DOCUMENT_SLOTS)),
        document_checks: ragstream_operators::offload::CallPool::lowered(
            "http-documents",
            DOCUMENT_SLOTS,
        ),
        batches: Arc::default(),
        rates,
        standing,
    });
    std::thread::Builder::new()
        .name("http-accept".into())
        .spawn(move || runtime.block_on(accept(listener, shared)))?;
    Ok(address)
}
