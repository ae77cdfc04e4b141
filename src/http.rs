//! The job's HTTP API (described by the OpenAPI document at `/v1/openapi.json`, [`crate::openapi`]):
//! `POST /v1/query` (a query event in the body, its context as the answer: the same dataflow as the
//! queries topic), `GET /v1/sources` and `GET /v1/chunks/{id}` (the `list_sources` and `read_chunk`
//! modes), `GET /v1/invalidations?since=N` (the process's invalidations of published contexts
//! numbered above N), `/mcp` (the agent tools), and unversioned `/metrics` (Prometheus text),
//! `/healthz` (process up) and `/readyz` (index open, model loaded, broker reachable). Every error
//! is a problem (RFC 9457, [`crate::api::Problem`]). Bound to loopback unless configured otherwise.
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
//! - the `Host` header of the `/v1/` data routes and `/mcp` must be an allowed one (DNS-rebinding
//!   protection from browsers); health, metrics and the OpenAPI document answer any host, as probes
//!   and scrapers address the job by IP.

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
use ragstream_core::query::invalidate::InvalidationLog;
use ragstream_core::query::Context;
use ragstream_operators::ingest::decode::DecodeConfig;
use ragstream_operators::io::query_source::HttpIngress;
use tokio::sync::Semaphore;

use crate::api::{InvalidationsPage, Problem, SourcesPage, PROBLEM_JSON};
use crate::documents::{self, DocumentsTarget};

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
/// Threads of the server's runtime: they parse, route and answer; queries wait elsewhere.
const SERVER_THREADS: usize = 2;
/// Largest request head (request line and headers) read into memory.
const MAX_HEAD_BYTES: usize = 64 * 1024;

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
    /// `POST /v1/query` and `/mcp` requests waiting for their contexts at once.
    pub max_queries_in_flight: usize,
    /// Deadline for a request's head, and separately for its body.
    pub read_timeout: Duration,
    /// Largest body of `POST /v1/query` and `/mcp` (twice `query.max_query_bytes`: a body between one
    /// and two times the query limit still reaches the dataflow, which dead-letters it as oversize).
    pub max_body_bytes: usize,
    /// Largest body of `POST /v1/documents` (four times `ingest.max_document_bytes`).
    pub max_documents_body_bytes: usize,
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

/// The bearer tokens of the data routes, each with the tenants it may query and, for a tenant-bound
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
/// naming one of its tenants (or none, when the token opens exactly one: that one is filled in), and its `acl` (if any) only labels of the token's; a body without `acl`
/// carries the token's labels. Other tokens pass the body as it is. `Err`: why it is refused (403).
fn bind(body: Bytes, access: &Access) -> Result<Bytes, String> {
    let (Some(tenants), Some(labels)) = (&access.tenants, &access.labels) else {
        return Ok(body);
    };
    let mut query: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&body)
        .map_err(|_| "this token may not query that tenant".to_string())?;
    // A token of exactly one tenant fills in a tenant the body leaves out.
    if query.get("tenant").is_none() && tenants.len() == 1 {
        if let Some(only) = tenants.iter().next() {
            query.insert("tenant".into(), serde_json::json!(only));
        }
    }
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
    /// Where `POST /v1/documents` writes.
    documents: DocumentsTarget,
    /// The checks of every document event.
    decode: DecodeConfig,
    /// Document batches read and written at once.
    document_slots: Arc<Semaphore>,
}

/// Document batches read and written at once (each up to `Limits::max_documents_body_bytes`).
const DOCUMENT_SLOTS: usize = 4;

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

/// A problem reply (RFC 9457): `name` is one of [`crate::api::PROBLEMS`].
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

/// `POST /v1/documents`: a batch of document events, checked whole, then written.
async fn post_documents(shared: Arc<Shared>, request: Request<Incoming>, access: Access) -> Reply {
    let Some(owned) = shared.documents.takes_documents() else {
        return problem("no_document_input", NO_DOCUMENT_INPUT);
    };
    // The slot first: a batch may be large, and only a few are read at once.
    let Ok(slot) = shared.document_slots.clone().try_acquire_owned() else {
        return busy("document batches are being written already; retry shortly");
    };
    let limit = shared.limits.max_documents_body_bytes;
    let over = format!("the body is over {limit} bytes (four times ingest.max_document_bytes)");
    let body = match read_body_within(request, limit, shared.limits.read_timeout, &over).await {
        Ok((_, body)) => body,
        Err(refused) => return refused,
    };
    // Extracting files (HTML, PDF, DOCX) is CPU work: done off the server's threads.
    let checked = {
        let shared = shared.clone();
        let owned = owned.map(str::to_string);
        tokio::task::spawn_blocking(move || {
            documents::admit(
                &body,
                access.tenants.as_deref(),
                owned.as_deref(),
                &shared.decode,
            )
        })
        .await
    };
    let Ok(admitted) = checked else {
        drop(slot);
        return problem("internal", "checking the documents failed");
    };
    let reply = match admitted {
        Ok(admitted) => write_documents(&shared, admitted).await,
        Err(refused) => problem_reply(refused.as_ref()),
    };
    drop(slot);
    reply
}

/// `DELETE /v1/documents/{doc_id}?tenant=&version=`: one delete, as `POST /v1/documents` takes it.
async fn delete_document(shared: Arc<Shared>, doc_id: &str, params: &str, access: Access) -> Reply {
    let Some(owned) = shared.documents.takes_documents() else {
        return problem("no_document_input", NO_DOCUMENT_INPUT);
    };
    let params = parameters(params);
    let mut event = serde_json::json!({
        "op": "delete",
        "doc_id": percent_encoding::percent_decode_str(doc_id).decode_utf8_lossy(),
    });
    if let Some(tenant) = params.get("tenant") {
        event["tenant"] = serde_json::json!(tenant);
    }
    if let Some(version) = params.get("version") {
        match version.parse::<u64>() {
            Ok(version) => event["version"] = serde_json::json!(version),
            Err(_) => return problem("bad_request", "version must be a positive integer"),
        }
    }
    let Ok(slot) = shared.document_slots.clone().try_acquire_owned() else {
        return busy("document batches are being written already; retry shortly");
    };
    let body = serde_json::json!({ "documents": [event] }).to_string();
    let admitted = documents::admit(
        body.as_bytes(),
        access.tenants.as_deref(),
        owned,
        &shared.decode,
    );
    let reply = match admitted {
        Ok(admitted) => write_documents(&shared, admitted).await,
        Err(refused) => problem_reply(refused.as_ref()),
    };
    drop(slot);
    reply
}

const NO_DOCUMENT_INPUT: &str =
    "this job reads one JSONL file and stops; it takes no documents over HTTP (runtime.serve = false)";

/// 503 `busy` with `Retry-After`.
fn busy(detail: &str) -> Reply {
    let mut response = problem("busy", detail);
    response
        .headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// Writes an admitted batch where the job takes documents, and answers once it is durable there.
async fn write_documents(shared: &Arc<Shared>, admitted: documents::Admitted) -> Reply {
    let accepted = admitted.events.len();
    match &shared.documents {
        DocumentsTarget::Kafka(sink) => {
            let sink = sink.clone();
            let events = admitted.events;
            match tokio::task::spawn_blocking(move || sink.send(&events)).await {
                Ok(Ok(())) => {
                    let mut answer = json_reply(&documents::DocumentsAccepted {
                        accepted,
                        indexed: false,
                    });
                    *answer.status_mut() = StatusCode::ACCEPTED;
                    answer
                }
                Ok(Err(outage)) => {
                    tracing::warn!(error = %outage, "POST /v1/documents: the broker did not take the batch");
                    problem("broker_unavailable", &outage)
                }
                Err(_) => problem("internal", "the batch's write failed"),
            }
        }
        DocumentsTarget::Local { ingress, .. } => {
            let receiver = ingress.submit(admitted.ops.into_iter().map(Ok).collect());
            let waited =
                tokio::task::spawn_blocking(move || receiver.recv_timeout(QUERY_TIMEOUT)).await;
            match waited {
                Ok(Ok(())) => json_reply(&documents::DocumentsAccepted {
                    accepted,
                    indexed: true,
                }),
                Ok(Err(mpsc::RecvTimeoutError::Disconnected)) => problem(
                    "stopping",
                    "the job is stopping and takes no more documents",
                ),
                Ok(Err(mpsc::RecvTimeoutError::Timeout)) => problem(
                    "timeout",
                    "the documents were not indexed within 120 s; they are still queued",
                ),
                Err(_) => problem("internal", "the batch's wait failed"),
            }
        }
        DocumentsTarget::None => problem("no_document_input", NO_DOCUMENT_INPUT),
    }
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

/// `GET /v1/sources?tenant=&limit=&cursor=`: one page of the tenant's documents.
async fn sources(shared: Arc<Shared>, params: &str, access: Access) -> Reply {
    let params = parameters(params);
    let Some(tenant) = tenant_of(&params, &access) else {
        return problem("bad_request", NAME_THE_TENANT);
    };
    let limit = match params.get("limit").map(|l| l.parse::<u64>()) {
        None => None,
        Some(Ok(limit)) => Some(limit),
        Some(Err(_)) => return problem("bad_request", "limit must be a positive integer"),
    };
    let body = serde_json::json!({
        "query_id": internal_query_id(), "tenant": tenant, "text": "", "mode": "list_sources",
        "k": limit, "cursor": params.get("cursor"),
    });
    match ask(&shared, Bytes::from(body.to_string()), &access).await {
        Ok(context) => refused(&context).unwrap_or_else(|| {
            json_reply(&SourcesPage {
                tenant: context.tenant,
                sources: context.sources,
                next_cursor: context.next_cursor,
            })
        }),
        Err(reply) => reply,
    }
}

/// `GET /v1/chunks/{chunk_id}?tenant=`: one chunk, whole.
async fn chunk(shared: Arc<Shared>, chunk_id: &str, params: &str, access: Access) -> Reply {
    let params = parameters(params);
    let Some(tenant) = tenant_of(&params, &access) else {
        return problem("bad_request", NAME_THE_TENANT);
    };
    let chunk_id = percent_encoding::percent_decode_str(chunk_id).decode_utf8_lossy();
    let body = serde_json::json!({
        "query_id": internal_query_id(), "tenant": tenant, "text": chunk_id, "mode": "read_chunk",
    });
    match ask(&shared, Bytes::from(body.to_string()), &access).await {
        Ok(context) => match refused(&context) {
            Some(reply) => reply,
            None => match context.items.into_iter().next() {
                Some(item) => json_reply(&item),
                None => problem("unknown_chunk", "no such chunk"),
            },
        },
        Err(reply) => reply,
    }
}

/// `GET /v1/invalidations?since=N`: the invalidations numbered above N (of the tenants the caller's
/// token opens), the number to ask from next, and whether some above N were already dropped.
fn invalidations(params: &str, log: &Mutex<InvalidationLog>, tenants: Tenants) -> Reply {
    let since = match parameters(params).get("since").map(|s| s.parse::<u64>()) {
        None => 0,
        Some(Ok(since)) => since,
        Some(Err(_)) => return problem("bad_request", "since must be a number"),
    };
    let Ok(log) = log.lock() else {
        return problem("internal", "the invalidation log is unavailable");
    };
    let (mut entries, last, truncated) = log.since(since);
    drop(log);
    if let Some(tenants) = tenants {
        entries.retain(|entry| tenants.contains(&entry.tenant));
    }
    json_reply(&InvalidationsPage {
        invalidations: entries,
        last,
        truncated,
    })
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
    DOCUMENT.get_or_init(|| crate::openapi::pretty(&crate::openapi::document()))
}

/// The data routes: they check the `Host` and the bearer token.
fn is_data_route(path: &str) -> bool {
    let one_segment = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|id| !id.is_empty() && !id.contains('/'))
    };
    matches!(
        path,
        "/v1/query" | "/v1/sources" | "/v1/invalidations" | "/v1/documents" | "/mcp"
    ) || one_segment("/v1/chunks/")
        || one_segment("/v1/documents/")
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
    let access = match shared.tokens.grant(request.headers()) {
        Ok(access) => access,
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
        "/v1/documents" if post => post_documents(shared, request, access).await,
        "/v1/documents" => method_not_allowed("POST"),
        document if document.starts_with("/v1/documents/") => {
            if method == Method::DELETE {
                let doc_id = document.trim_start_matches("/v1/documents/");
                delete_document(shared, doc_id, &params, access).await
            } else {
                method_not_allowed("DELETE")
            }
        }
        "/mcp" => {
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
        chunk_path if get => {
            let chunk_id = chunk_path.trim_start_matches("/v1/chunks/");
            chunk(shared, chunk_id, &params, access).await
        }
        _ => method_not_allowed("GET"),
    }
}

/// At most the first 128 bytes of `text` (a request's path in a message).
fn prefix(text: &str) -> &str {
    let mut end = text.len().min(128);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
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
    documents: DocumentsTarget,
    decode: DecodeConfig,
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
        documents,
        decode,
        document_slots: Arc::new(Semaphore::new(DOCUMENT_SLOTS)),
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
        let filled = bind(serde_json::json!({"text": "x"})).unwrap();
        assert_eq!(
            filled["tenant"], "acme",
            "the token's one tenant is filled in"
        );
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
