//! The job's HTTP endpoints: `/metrics` (Prometheus text), `/healthz` (process up), `/readyz` (index
//! open, model loaded, broker reachable), `POST /query` (a query event in the body, its context as
//! the response: the same dataflow as the queries topic) and `GET /invalidations?since=N` (the
//! process's invalidations of published contexts numbered above N). Bound to loopback unless
//! configured otherwise.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use ragstream_operators::io::query_source::HttpIngress;
use ragstream_operators::query::invalidate::InvalidationLog;
use ragstream_operators::query::Context;

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
    /// `/readyz`: status and a line per check.
    fn report(&self) -> (u16, String) {
        let workers = self.ready.load(Ordering::SeqCst);
        let broker = self.broker.load(Ordering::SeqCst);
        let status = if workers && broker { 200 } else { 503 };
        let body = format!(
            "index and model: {}\nbroker: {}\n",
            if workers { "ok" } else { "starting" },
            if broker { "ok" } else { "unreachable" }
        );
        (status, body)
    }
}

/// Threads answering HTTP requests (a query waits for its context on one of them).
const HTTP_THREADS: usize = 16;
/// Longest a `POST /query` waits for its context.
const QUERY_TIMEOUT: Duration = Duration::from_secs(120);

/// The HTTP status of a context: refused queries are the caller's error, an index outage is ours.
pub fn status_of(context: &Context) -> u16 {
    match &context.error {
        None => 200,
        Some(_) if context.mode.is_empty() => 400,
        Some(error) if error.starts_with("index unavailable") => 503,
        Some(_) => 404,
    }
}

/// A tiny_http server on `listen` whose connections send each write at once (`TCP_NODELAY`, which
/// accepted sockets inherit from the listener on Linux). tiny_http writes a response's head and body
/// separately; with Nagle's algorithm the body then waited for the client's delayed ACK, ~40 ms per
/// response on a kept-alive connection.
pub fn listen_nodelay(listen: &str) -> anyhow::Result<tiny_http::Server> {
    let listener = std::net::TcpListener::bind(listen)
        .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
    socket2::SockRef::from(&listener)
        .set_tcp_nodelay(true)
        .map_err(|e| anyhow::anyhow!("TCP_NODELAY on {listen}: {e}"))?;
    tiny_http::Server::from_listener(listener, None)
        .map_err(|e| anyhow::anyhow!("cannot serve on {listen}: {e}"))
}

fn respond(request: tiny_http::Request, status: u16, body: String, content_type: &str) {
    let header = tiny_http::Header::from_bytes("Content-Type", content_type).expect("valid header");
    let response = tiny_http::Response::from_string(body)
        .with_status_code(status)
        .with_header(header);
    let _ = request.respond(response);
}

/// The tenants a token may query (`None`: every tenant).
type Tenants = Option<Arc<BTreeSet<String>>>;

/// The bearer tokens of `POST /query`, each with the tenants it may query.
/// Deliberately not `Debug`: the tokens are secrets.
#[derive(Default, Clone)]
pub struct QueryTokens {
    tokens: Vec<(Arc<str>, Tenants)>,
}

/// A request's bearer token did not match.
struct Unauthorized;

impl QueryTokens {
    /// The tokens found in the environment: the one named by `every_tenant_env`, and those of `bound`
    /// (variable name → tenants). Unset or empty variables are skipped.
    pub fn from_env(every_tenant_env: &str, bound: &BTreeMap<String, Vec<String>>) -> Self {
        let read = |name: &str| std::env::var(name).ok().filter(|t| !t.is_empty());
        let mut tokens: Vec<(Arc<str>, Tenants)> = Vec::new();
        if let Some(token) = read(every_tenant_env) {
            tokens.push((Arc::from(token), None));
        }
        for (name, tenants) in bound {
            if let Some(token) = read(name) {
                tokens.push((
                    Arc::from(token),
                    Some(Arc::new(tenants.iter().cloned().collect())),
                ));
            }
        }
        Self { tokens }
    }

    /// The tenants `request`'s `Authorization: Bearer <token>` opens (`None`: every tenant; also when no
    /// token is configured). Tokens are compared in constant time.
    fn grant(&self, request: &tiny_http::Request) -> Result<Tenants, Unauthorized> {
        if self.tokens.is_empty() {
            return Ok(None);
        }
        let equal = |given: &str, token: &str| {
            given.len() == token.len()
                && given
                    .bytes()
                    .zip(token.bytes())
                    .fold(0u8, |diff, (a, b)| diff | (a ^ b))
                    == 0
        };
        request
            .headers()
            .iter()
            .filter(|h| h.field.equiv("Authorization"))
            .filter_map(|h| h.value.as_str().strip_prefix("Bearer "))
            .find_map(|given| {
                self.tokens
                    .iter()
                    .find(|(token, _)| equal(given, token))
                    .map(|(_, tenants)| tenants.clone())
            })
            .ok_or(Unauthorized)
    }
}

/// The `tenant` of a query body, when it is one.
fn tenant_of(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()?
        .get("tenant")?
        .as_str()
        .map(str::to_string)
}

fn query(
    mut request: tiny_http::Request,
    ingress: &HttpIngress,
    max_bytes: usize,
    tenants: Tenants,
) {
    let mut body = Vec::new();
    let limit = (max_bytes as u64).saturating_mul(2);
    if let Err(error) = request.as_reader().take(limit + 1).read_to_end(&mut body) {
        respond(
            request,
            400,
            format!("{{\"error\":\"cannot read the body: {error}\"}}"),
            "application/json",
        );
        return;
    }
    if let Some(tenants) = tenants {
        // A tenant-bound token: the body must name one of its tenants.
        if !tenant_of(&body).is_some_and(|tenant| tenants.contains(&tenant)) {
            tracing::warn!(
                remote = ?request.remote_addr(),
                "POST /query refused: the token may not query this tenant"
            );
            respond(
                request,
                403,
                "{\"error\":\"this token may not query that tenant\"}".into(),
                "application/json",
            );
            return;
        }
    }
    // Oversized bodies still go through the dataflow, which refuses them with a DLQ record.
    let (ticket, receiver) = ingress.submit(body);
    match receiver.recv_timeout(QUERY_TIMEOUT) {
        Ok(context) => {
            let status = status_of(&context);
            let body = serde_json::to_string(&context).expect("contexts serialise");
            respond(request, status, body, "application/json");
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => respond(
            request,
            503,
            "{\"error\":\"the job is stopping and takes no more queries\"}".into(),
            "application/json",
        ),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            ingress.abandon(ticket);
            respond(
                request,
                504,
                "{\"error\":\"no context within 120 s\"}".into(),
                "application/json",
            );
        }
    }
}

/// `GET /invalidations?since=N`: `{"invalidations": [...], "last": M, "truncated": bool}`, the
/// invalidations numbered above N (of the tenants the caller's token opens), M the number to ask from
/// next, `truncated` when some above N were already dropped from the log.
fn invalidations(
    request: tiny_http::Request,
    params: &str,
    log: &Mutex<InvalidationLog>,
    tenants: Tenants,
) {
    let since = params
        .split('&')
        .find_map(|pair| pair.strip_prefix("since="))
        .map(str::parse::<u64>);
    let since = match since {
        None => 0,
        Some(Ok(since)) => since,
        Some(Err(_)) => {
            return respond(
                request,
                400,
                "{\"error\":\"since must be a number\"}".into(),
                "application/json",
            )
        }
    };
    let (mut entries, last, truncated) = log.lock().expect("invalidation log").since(since);
    if let Some(tenants) = tenants {
        entries.retain(|entry| tenants.contains(&entry.tenant));
    }
    let body = serde_json::json!({"invalidations": entries, "last": last, "truncated": truncated});
    respond(request, 200, body.to_string(), "application/json");
}

/// Serves until the process exits. Returns the bound address.
pub fn serve(
    listen: &str,
    readiness: Arc<Readiness>,
    ingress: Arc<HttpIngress>,
    invalidation_log: Arc<Mutex<InvalidationLog>>,
    max_query_bytes: usize,
    tokens: QueryTokens,
    mcp_allowed_hosts: &[String],
) -> anyhow::Result<std::net::SocketAddr> {
    let server = listen_nodelay(listen)?;
    let mcp = Arc::new(crate::mcp::McpHttp::new(
        ingress.clone(),
        mcp_allowed_hosts,
    )?);
    let address = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| anyhow::anyhow!("{listen} is not an IP address"))?;
    let server = Arc::new(server);
    for index in 0..HTTP_THREADS {
        let server = server.clone();
        let readiness = readiness.clone();
        let ingress = ingress.clone();
        let tokens = tokens.clone();
        let invalidation_log = invalidation_log.clone();
        let mcp = mcp.clone();
        std::thread::Builder::new()
            .name(format!("http-{index}"))
            .spawn(move || {
                while let Ok(request) = server.recv() {
                    let post = *request.method() == tiny_http::Method::Post;
                    let url = request.url().to_string();
                    let (path, params) = url.split_once('?').unwrap_or((url.as_str(), ""));
                    match path {
                        "/query" if post => match tokens.grant(&request) {
                            Ok(tenants) => query(request, &ingress, max_query_bytes, tenants),
                            Err(Unauthorized) => {
                                tracing::warn!(
                                    remote = ?request.remote_addr(),
                                    "POST /query refused: missing or wrong bearer token"
                                );
                                respond(
                                    request,
                                    401,
                                    "{\"error\":\"missing or wrong bearer token\"}".into(),
                                    "application/json",
                                )
                            }
                        },
                        "/query" => {
                            respond(request, 405, "POST a query event\n".into(), "text/plain")
                        }
                        "/invalidations" => match tokens.grant(&request) {
                            Ok(tenants) => {
                                invalidations(request, params, &invalidation_log, tenants)
                            }
                            Err(Unauthorized) => respond(
                                request,
                                401,
                                "{\"error\":\"missing or wrong bearer token\"}".into(),
                                "application/json",
                            ),
                        },
                        "/mcp" => match tokens.grant(&request) {
                            Ok(tenants) => {
                                mcp.handle(request, crate::mcp::Grant(tenants), max_query_bytes)
                            }
                            Err(Unauthorized) => {
                                tracing::warn!(
                                    remote = ?request.remote_addr(),
                                    "/mcp refused: missing or wrong bearer token"
                                );
                                respond(
                                    request,
                                    401,
                                    "{\"error\":\"missing or wrong bearer token\"}".into(),
                                    "application/json",
                                )
                            }
                        },
                        "/metrics" => respond(
                            request,
                            200,
                            ragstream_operators::metrics::metrics().render(),
                            "text/plain; version=0.0.4",
                        ),
                        "/healthz" => respond(request, 200, "ok\n".into(), "text/plain"),
                        "/readyz" => {
                            let (status, body) = readiness.report();
                            respond(request, status, body, "text/plain")
                        }
                        _ => respond(request, 404, "not found\n".into(), "text/plain"),
                    }
                }
            })?;
    }
    Ok(address)
}
