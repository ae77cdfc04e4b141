//! The job's HTTP endpoints: `/metrics` (Prometheus text), `/healthz` (process up), `/readyz` (index
//! open, model loaded, broker reachable), `POST /query` (a query event in the body, its context as
//! the response: the same dataflow as the queries topic), `GET /invalidations?since=N` (the process's
//! invalidations of published contexts numbered above N) and `/mcp` (the agent tools). Bound to
//! loopback unless configured otherwise.
//!
//! The server is hyper on a small tokio runtime of its own, built to stay up whatever a client sends:
//! - a connection cap (`http.max_connections`): a connection over it is closed at once;
//! - a deadline for a request's head and one for its body (`http.read_timeout_secs`), so slow or
//!   silent clients hold nothing for long;
//! - body limits checked against `Content-Length` before a byte of the body is read, and enforced
//!   while reading (chunked bodies);
//! - queries waiting for their contexts are capped (`http.max_queries_in_flight`, answered 503 with
//!   `Retry-After` beyond), and wait off the runtime's threads, so `/healthz`, `/readyz` and
//!   `/metrics` are answered at once however many queries are in flight;
//! - every request is handled in a task of its own: a panic answers that request 500 and nothing else;
//! - the `Host` header of `/query`, `/invalidations` and `/mcp` must be an allowed one (DNS-rebinding
//!   protection from browsers); health and metrics answer any host, as probes and scrapers address
//!   the job by IP.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use ragstream_operators::io::query_source::HttpIngress;
use ragstream_operators::query::invalidate::InvalidationLog;
use ragstream_operators::query::Context;
use tokio::sync::Semaphore;

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

/// Longest a `POST /query` waits for its context.
const QUERY_TIMEOUT: Duration = Duration::from_secs(120);
/// Threads of the server's runtime: they parse, route and answer; queries wait elsewhere.
const SERVER_THREADS: usize = 2;
/// Largest request head (request line and headers) read into memory.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// The HTTP status of a context: refused queries are the caller's error (a condition the index
/// refused too: 422), an index outage is ours, an unknown chunk is not found.
pub fn status_of(context: &Context) -> u16 {
    match (&context.error, context.error_type.as_deref()) {
        (None, _) => 200,
        (Some(_), Some("index_unavailable")) => 503,
        (Some(_), Some("index_refused")) => 422,
        (Some(_), Some("unknown_chunk")) => 404,
        (Some(_), _) if context.mode.is_empty() => 400,
        (Some(error), _) if error.starts_with("index unavailable") => 503,
        (Some(_), _) => 404,
    }
}

/// Refuses to serve on `listen` without tokens when it reaches beyond loopback, unless the
/// configuration says `anonymous = true`.
pub fn check_open(listen: &str, no_tokens: bool, anonymous: bool) -> anyhow::Result<()> {
    use std::net::ToSocketAddrs;
    if !no_tokens || anonymous {
        return Ok(());
    }
    let loopback_only = listen
        .to_socket_addrs()
        .map(|mut addresses| addresses.all(|address| address.ip().is_loopback()))
        .unwrap_or(false);
    if loopback_only {
        return Ok(());
    }
    anyhow::bail!(
        "http.listen = {listen} reaches beyond loopback and no bearer token is set: set the \
         variable named by http.query_token_env (or those of http.tokens), or serve every caller \
         without a token by saying `anonymous = true` in [http]"
    )
}

/// What bounds the server; see the module documentation.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Open connections at once.
    pub max_connections: usize,
    /// `POST /query` and `/mcp` requests waiting for their contexts at once.
    pub max_queries_in_flight: usize,
    /// Deadline for a request's head, and separately for its body.
    pub read_timeout: Duration,
    /// Largest body of `POST /query` and `/mcp` (twice `query.max_query_bytes`: a body between one
    /// and two times the query limit still reaches the dataflow, which dead-letters it as oversize).
    pub max_body_bytes: usize,
}

/// The tenants a token may query (`None`: every tenant).
type Tenants = Option<Arc<BTreeSet<String>>>;
/// The ACL labels a token's queries carry (`None`: the labels a request names, unchecked).
type Labels = Option<Arc<Vec<String>>>;

/// What a request's token opens.
#[derive(Clone)]
struct Access {
    tenants: Tenants,
    labels: Labels,
}

/// The bearer tokens of `POST /query`, each with the tenants it may query and, for a tenant-bound
/// token, the ACL labels its queries carry.
/// Deliberately not `Debug`: the tokens are secrets.
#[derive(Default, Clone)]
pub struct QueryTokens {
    tokens: Vec<(Arc<str>, Access)>,
}

/// A request's bearer token did not match.
struct Unauthorized;

impl QueryTokens {
    /// The tokens found in the environment: the one named by `every_tenant_env` (every tenant, any
    /// labels), and those of `bound` (variable name → tenants), whose queries carry the labels
    /// `labels` gives the same variable (none: public chunks only). Unset or empty variables are
    /// skipped.
    pub fn from_env(
        every_tenant_env: &str,
        bound: &BTreeMap<String, Vec<String>>,
        labels: &BTreeMap<String, Vec<String>>,
    ) -> Self {
        let read = |name: &str| std::env::var(name).ok().filter(|t| !t.is_empty());
        let mut tokens: Vec<(Arc<str>, Access)> = Vec::new();
        if let Some(token) = read(every_tenant_env) {
            let access = Access {
                tenants: None,
                labels: None,
            };
            tokens.push((Arc::from(token), access));
        }
        for (name, tenants) in bound {
            if let Some(token) = read(name) {
                let access = Access {
                    tenants: Some(Arc::new(tenants.iter().cloned().collect())),
                    labels: Some(Arc::new(labels.get(name).cloned().unwrap_or_default())),
                };
                tokens.push((Arc::from(token), access));
            }
        }
        Self { tokens }
    }

    /// No token is configured: every request is served as every tenant.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The tenants `request`'s `Authorization: Bearer <token>` opens (`None`: every tenant; also when no
    /// token is configured). Tokens are compared in constant time.
    fn grant(&self, headers: &HeaderMap) -> Result<Access, Unauthorized> {
        if self.tokens.is_empty() {
            return Ok(Access {
                tenants: None,
                labels: None,
            });
        }
        // Every byte of the token is compared whatever the given value's length or first difference.
        let equal = |given: &str, token: &str| {
            let given = given.as_bytes();
            let length_differs = u8::from(given.len() != token.len());
            token
                .bytes()
                .enumerate()
                .fold(length_differs, |diff, (at, byte)| {
                    diff | (byte ^ given.get(at).copied().unwrap_or(!byte))
                })
                == 0
        };
        headers
            .get_all(http::header::AUTHORIZATION)
            .iter()
            .filter_map(|value| value.to_str().ok()?.strip_prefix("Bearer "))
            .find_map(|given| {
                self.tokens
                    .iter()
                    .find(|(token, _)| equal(given, token))
                    .map(|(_, access)| access.clone())
            })
            .ok_or(Unauthorized)
    }
}

/// The query body as the token allows it: with a tenant-bound token, the body must be a JSON object
/// naming one of its tenants, and its `acl` (if any) only labels of the token's; a body without `acl`
/// carries the token's labels. Other tokens pass the body as it is. `Err`: why it is refused (403).
fn bind(body: Bytes, access: &Access) -> Result<Bytes, String> {
    let (Some(tenants), Some(labels)) = (&access.tenants, &access.labels) else {
        return Ok(body);
    };
    let mut query: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&body)
        .map_err(|_| "this token may not query that tenant".to_string())?;
    let tenant = query.get("tenant").and_then(serde_json::Value::as_str);
    if !tenant.is_some_and(|tenant| tenants.contains(tenant)) {
        return Err("this token may not query that tenant".into());
    }
    match query.get("acl") {
        None | Some(serde_json::Value::Null) => {
            if !labels.is_empty() {
                query.insert("acl".into(), serde_json::json!(labels.as_slice()));
            }
        }
        Some(serde_json::Value::Array(asked)) => {
            if let Some(wider) = asked.iter().find(|label| {
                !label
                    .as_str()
                    .is_some_and(|l| labels.iter().any(|t| t == l))
            }) {
                return Err(format!("this token may not use the ACL label {wider}"));
            }
        }
        // Not a list: left for the decoder to refuse with its DLQ record.
        Some(_) => {}
    }
    serde_json::to_vec(&query)
        .map(Bytes::from)
        .map_err(|e| format!("cannot re-encode the query: {e}"))
}

/// The `Host` values the data endpoints accept.
#[derive(Debug, Clone)]
pub struct AllowedHosts {
    /// `None`: any host (the configuration listed `*`).
    names: Option<Vec<String>>,
}

impl AllowedHosts {
    /// `configured` as given (`name` or `name:port`, `*` for any); empty: the loopback names.
    pub fn new(configured: &[String]) -> Self {
        if configured.iter().any(|name| name == "*") {
            return Self { names: None };
        }
        let names = if configured.is_empty() {
            vec!["localhost".into(), "127.0.0.1".into(), "[::1]".into()]
        } else {
            configured
                .iter()
                .map(|name| name.to_ascii_lowercase())
                .collect()
        };
        Self { names: Some(names) }
    }

    /// The configured list handed to rmcp's own check (empty: its loopback default).
    fn for_mcp(configured: &[String]) -> Vec<String> {
        if configured.iter().any(|name| name == "*") {
            Vec::new()
        } else {
            configured.to_vec()
        }
    }

    /// Whether `host` (a `Host` header value) is allowed: an entry matches it whole, or its name
    /// part when the entry names no port.
    fn allows(&self, host: Option<&HeaderValue>) -> bool {
        let Some(names) = &self.names else {
            return true;
        };
        let Some(host) = host.and_then(|h| h.to_str().ok()) else {
            return false;
        };
        let host = host.to_ascii_lowercase();
        let name = match host.rsplit_once(':') {
            // `[::1]:8080` or `name:8080`; a bare IPv6 literal has no brackets to split at.
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !name.is_empty() => {
                name
            }
            _ => host.as_str(),
        };
        names
            .iter()
            .any(|allowed| *allowed == host || *allowed == name)
    }
}

/// What every request handler shares.
struct Shared {
    readiness: Arc<Readiness>,
    ingress: Arc<HttpIngress>,
    invalidation_log: Arc<Mutex<InvalidationLog>>,
    tokens: QueryTokens,
    hosts: AllowedHosts,
    mcp: crate::mcp::McpHttp,
    limits: Limits,
    queries: Arc<Semaphore>,
}

type Reply = Response<Full<Bytes>>;

fn reply(status: StatusCode, body: impl Into<Bytes>, content_type: &'static str) -> Reply {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    response
}

/// A JSON error body `{"error": message}`.
fn error(status: StatusCode, message: &str) -> Reply {
    reply(
        status,
        serde_json::json!({ "error": message }).to_string(),
        "application/json",
    )
}

/// The request's body, read within the limits: `Content-Length` over the limit is refused before
/// reading, a body that grows past it while read is refused too, and the whole body must arrive
/// within the read timeout.
async fn read_body(
    request: Request<Incoming>,
    limits: &Limits,
) -> Result<(http::request::Parts, Bytes), Reply> {
    let limit = limits.max_body_bytes;
    let (parts, body) = request.into_parts();
    if let Some(length) = parts.headers.get(http::header::CONTENT_LENGTH) {
        match length.to_str().ok().and_then(|l| l.parse::<u64>().ok()) {
            Some(length) if length > limit as u64 => {
                return Err(error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &format!("the body is over {limit} bytes (twice query.max_query_bytes)"),
                ))
            }
            Some(_) => {}
            None => {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    "Content-Length is not a number",
                ))
            }
        }
    }
    match tokio::time::timeout(limits.read_timeout, Limited::new(body, limit).collect()).await {
        Err(_) => Err(error(
            StatusCode::REQUEST_TIMEOUT,
            &format!(
                "the body did not arrive within {} s",
                limits.read_timeout.as_secs()
            ),
        )),
        Ok(Err(cause)) if cause.is::<http_body_util::LengthLimitError>() => Err(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("the body is over {limit} bytes (twice query.max_query_bytes)"),
        )),
        Ok(Err(cause)) => Err(error(
            StatusCode::BAD_REQUEST,
            &format!("cannot read the body: {cause}"),
        )),
        Ok(Ok(collected)) => Ok((parts, collected.to_bytes())),
    }
}

/// A slot among the queries in flight, or 503 with `Retry-After`.
fn query_slot(shared: &Shared) -> Result<tokio::sync::OwnedSemaphorePermit, Box<Reply>> {
    shared.queries.clone().try_acquire_owned().map_err(|_| {
        let mut response = error(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!(
                "{} queries are in flight already (http.max_queries_in_flight); retry shortly",
                shared.limits.max_queries_in_flight
            ),
        );
        response
            .headers_mut()
            .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
        Box::new(response)
    })
}

/// Forgets the request's ticket when its handler is dropped (the client went away), so the waiting
/// thread is released at once.
struct Abandon {
    ingress: Arc<HttpIngress>,
    ticket: u64,
}

impl Drop for Abandon {
    fn drop(&mut self) {
        self.ingress.abandon(self.ticket);
    }
}

async fn query(shared: Arc<Shared>, request: Request<Incoming>, access: Access) -> Reply {
    // The slot is taken once the body is in: a slow client holds a connection, never a query slot.
    let body = match read_body(request, &shared.limits).await {
        Ok((_, body)) => body,
        Err(refused) => return refused,
    };
    let slot = match query_slot(&shared) {
        Ok(slot) => slot,
        Err(busy) => return *busy,
    };
    // A tenant-bound token: the body names one of its tenants and at most its labels.
    let body = match bind(body, &access) {
        Ok(body) => body,
        Err(refused) => {
            tracing::warn!("POST /query refused: {refused}");
            return error(StatusCode::FORBIDDEN, &refused);
        }
    };
    // Oversized bodies within the read limit still go through the dataflow, which refuses them with
    // a DLQ record.
    let (ticket, receiver) = shared.ingress.submit(body.to_vec());
    let abandon = Abandon {
        ingress: shared.ingress.clone(),
        ticket,
    };
    let waited = tokio::task::spawn_blocking(move || {
        let waited = receiver.recv_timeout(QUERY_TIMEOUT);
        drop(slot);
        waited
    })
    .await;
    let reply = match waited {
        Ok(Ok(context)) => match serde_json::to_string(&context) {
            Ok(body) => reply(
                StatusCode::from_u16(status_of(&context)).unwrap_or(StatusCode::OK),
                body,
                "application/json",
            ),
            Err(cause) => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("cannot serialise the context: {cause}"),
            ),
        },
        Ok(Err(mpsc::RecvTimeoutError::Disconnected)) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the job is stopping and takes no more queries",
        ),
        Ok(Err(mpsc::RecvTimeoutError::Timeout)) => {
            error(StatusCode::GATEWAY_TIMEOUT, "no context within 120 s")
        }
        Err(_) => error(StatusCode::INTERNAL_SERVER_ERROR, "the query's wait failed"),
    };
    drop(abandon);
    reply
}

/// `GET /invalidations?since=N`: `{"invalidations": [...], "last": M, "truncated": bool}`, the
/// invalidations numbered above N (of the tenants the caller's token opens), M the number to ask from
/// next, `truncated` when some above N were already dropped from the log.
fn invalidations(params: &str, log: &Mutex<InvalidationLog>, tenants: Tenants) -> Reply {
    let since = params
        .split('&')
        .find_map(|pair| pair.strip_prefix("since="))
        .map(str::parse::<u64>);
    let since = match since {
        None => 0,
        Some(Ok(since)) => since,
        Some(Err(_)) => return error(StatusCode::BAD_REQUEST, "since must be a number"),
    };
    let Ok(log) = log.lock() else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the invalidation log is unavailable",
        );
    };
    let (mut entries, last, truncated) = log.since(since);
    drop(log);
    if let Some(tenants) = tenants {
        entries.retain(|entry| tenants.contains(&entry.tenant));
    }
    let body = serde_json::json!({"invalidations": entries, "last": last, "truncated": truncated});
    reply(StatusCode::OK, body.to_string(), "application/json")
}

fn unauthorized(path: &str) -> Reply {
    tracing::warn!(path, "request refused: missing or wrong bearer token");
    error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token")
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
        "/query" | "/invalidations" | "/mcp" => {}
        _ => return reply(StatusCode::NOT_FOUND, "not found\n", "text/plain"),
    }
    if !shared
        .hosts
        .allows(request.headers().get(http::header::HOST))
    {
        tracing::warn!(
            path,
            "request refused: Host is not an allowed one (http.allowed_hosts)"
        );
        return error(
            StatusCode::FORBIDDEN,
            "this Host is not allowed (http.allowed_hosts)",
        );
    }
    let access = match shared.tokens.grant(request.headers()) {
        Ok(access) => access,
        Err(Unauthorized) => return unauthorized(&path),
    };
    let post = request.method() == Method::POST;
    match path.as_str() {
        "/query" if post => query(shared, request, access).await,
        "/query" => reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "POST a query event\n",
            "text/plain",
        ),
        "/invalidations" => invalidations(&params, &shared.invalidation_log, access.tenants),
        _ => {
            let (parts, body) = match read_body(request, &shared.limits).await {
                Ok(read) => read,
                Err(refused) => return refused,
            };
            let slot = match query_slot(&shared) {
                Ok(slot) => slot,
                Err(busy) => return *busy,
            };
            let grant = crate::mcp::Grant(access.tenants, access.labels);
            let reply = shared.mcp.handle(parts, body, grant).await;
            drop(slot);
            reply
        }
    }
}

/// A request's task, aborted when the connection goes away before it is answered (so a query whose
/// client left is abandoned, freeing its slot).
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
            Ok(error(StatusCode::INTERNAL_SERVER_ERROR, "internal error"))
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
                .serve_connection(TokioIo::new(stream), service);
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
    let shared = Arc::new(Shared {
        readiness,
        queries: Arc::new(Semaphore::new(limits.max_queries_in_flight)),
        mcp: crate::mcp::McpHttp::new(ingress.clone(), &AllowedHosts::for_mcp(allowed_hosts)),
        ingress,
        invalidation_log,
        tokens,
        hosts: AllowedHosts::new(allowed_hosts),
        limits,
    });
    std::thread::Builder::new()
        .name("http-accept".into())
        .spawn(move || runtime.block_on(accept(listener, shared)))?;
    Ok(address)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(value: &str) -> HeaderValue {
        HeaderValue::from_str(value).unwrap()
    }

    #[test]
    fn loopback_hosts_by_default() {
        let hosts = AllowedHosts::new(&[]);
        for allowed in [
            "localhost",
            "localhost:9464",
            "127.0.0.1:1",
            "[::1]:9464",
            "LOCALHOST",
        ] {
            assert!(hosts.allows(Some(&host(allowed))), "{allowed}");
        }
        for refused in [
            "evil.example",
            "evil.example:9464",
            "localhost.evil.example",
            "127.0.0.2",
        ] {
            assert!(!hosts.allows(Some(&host(refused))), "{refused}");
        }
        assert!(!hosts.allows(None), "no Host header");
    }

    #[test]
    fn configured_hosts_replace_loopback_and_a_star_opens_all() {
        let hosts = AllowedHosts::new(&["rag.example.com".into(), "10.0.0.5:9464".into()]);
        assert!(hosts.allows(Some(&host("rag.example.com:443"))));
        assert!(hosts.allows(Some(&host("10.0.0.5:9464"))));
        assert!(
            !hosts.allows(Some(&host("10.0.0.5:80"))),
            "the entry names a port"
        );
        assert!(!hosts.allows(Some(&host("localhost"))));
        let any = AllowedHosts::new(&["*".into()]);
        assert!(any.allows(Some(&host("anything:1"))));
        assert!(any.allows(None));
    }

    #[test]
    fn beyond_loopback_needs_a_token_or_anonymous() {
        assert!(check_open("127.0.0.1:0", true, false).is_ok());
        assert!(check_open("[::1]:0", true, false).is_ok());
        let refused = check_open("0.0.0.0:9464", true, false)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("anonymous = true"), "{refused}");
        assert!(
            check_open("0.0.0.0:9464", false, false).is_ok(),
            "a token is set"
        );
        assert!(
            check_open("0.0.0.0:9464", true, true).is_ok(),
            "said in so many words"
        );
    }

    #[test]
    fn a_tenant_bound_token_binds_its_tenant_and_its_labels() {
        let access = Access {
            tenants: Some(Arc::new(["acme".to_string()].into_iter().collect())),
            labels: Some(Arc::new(vec!["eng".into(), "ops".into()])),
        };
        let bind = |body: serde_json::Value| {
            bind(Bytes::from(body.to_string()), &access)
                .map(|b| serde_json::from_slice::<serde_json::Value>(&b).unwrap())
        };
        let bound = bind(serde_json::json!({"tenant": "acme", "text": "x"})).unwrap();
        assert_eq!(
            bound["acl"],
            serde_json::json!(["eng", "ops"]),
            "the token's labels"
        );
        let narrowed = bind(serde_json::json!({"tenant": "acme", "acl": ["ops"]})).unwrap();
        assert_eq!(
            narrowed["acl"],
            serde_json::json!(["ops"]),
            "a request may narrow"
        );
        let wider = bind(serde_json::json!({"tenant": "acme", "acl": ["ops", "finance"]}));
        assert!(wider.unwrap_err().contains("finance"), "never widen");
        assert!(bind(serde_json::json!({"tenant": "globex"})).is_err());
        assert!(bind(serde_json::json!(["not", "an", "object"])).is_err());
        // A token without labels: public chunks only, and no label may be named.
        let public = Access {
            tenants: access.tenants.clone(),
            labels: Some(Arc::new(Vec::new())),
        };
        let body = Bytes::from(r#"{"tenant":"acme"}"#);
        let kept = bind_with(&public, body);
        assert!(kept.unwrap().get("acl").is_none());
        let named = bind_with(&public, Bytes::from(r#"{"tenant":"acme","acl":["eng"]}"#));
        assert!(named.is_err());
        // The every-tenant token passes the body as it is.
        let every = Access {
            tenants: None,
            labels: None,
        };
        let body = Bytes::from(r#"{"tenant":"any","acl":["anything"]}"#);
        assert_eq!(super::bind(body.clone(), &every).unwrap(), body);
    }

    fn bind_with(access: &Access, body: Bytes) -> Result<serde_json::Value, String> {
        super::bind(body, access).map(|b| serde_json::from_slice(&b).unwrap())
    }

    #[test]
    fn tokens_compare_whole() {
        let tokens = QueryTokens {
            tokens: vec![(
                Arc::from("s3cret-token"),
                Access {
                    tenants: None,
                    labels: None,
                },
            )],
        };
        let ask = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(http::header::AUTHORIZATION, host(value));
            tokens.grant(&headers).is_ok()
        };
        assert!(ask("Bearer s3cret-token"));
        for wrong in [
            "Bearer s3cret-toke",
            "Bearer s3cret-token2",
            "Bearer ",
            "s3cret-token",
            "Bearer S3cret-token",
        ] {
            assert!(!ask(wrong), "{wrong}");
        }
        assert!(tokens.grant(&HeaderMap::new()).is_err());
    }
}
