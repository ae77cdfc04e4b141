//! Agent tools over the Model Context Protocol (rmcp): `rag_search` (a bounded context),
//! `rag_search_deep`, `rag_read_chunk`, `rag_list_sources`, `sql_search` and `sql_search_compact`;
//! the operations tools `get_index_stats`, `get_cache_stats` and `clear_cache`; and standing
//! queries (`rag_subscribe`, `rag_unsubscribe`, each subscription a resource: [`standing`]).
//!
//! Each tool builds a query event and submits it to the job's query ingress, the same path as
//! `POST /v1/query`: the query is decoded, validated (a malformed one gets its DLQ record) and answered
//! by the dataflow. Two transports serve the same tools:
//! - streamable HTTP at `POST /mcp` on the job's HTTP server, stateless, JSON responses; the bearer
//!   token is checked as for `/v1/query` and decides the tenants a call may search;
//! - stdio (`ragstream mcp`): the job runs in the process and the tools answer on stdin/stdout; the
//!   tenant is the one named at launch (`--tenant`), the credential of a local process.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use ragstream_core::query::pattern::TextPattern;
use ragstream_core::query::Context;
use ragstream_core::store::reindex::ReindexStatus;
use ragstream_operators::ingest::reindex::Refusal;
use ragstream_operators::io::query_source::HttpIngress;
use rmcp::handler::server::{router::tool::ToolRouter, wrapper::Parameters};
use rmcp::model::{
    CallToolResult, ContentBlock as Content, Extensions, Implementation, ServerCapabilities,
    ServerConfig,
};
use rmcp::transport::streamable_http_server::{
    session::never::NeverSessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use rmcp::{tool, tool_handler, tool_router, ErrorData, ServerHandler, ServiceExt};
use serde_json::{json, Value};

mod args;
mod results;
mod standing;
pub use args::*;
use results::{filters, result};
pub use standing::SCHEME;

/// The name the stdio transport's credential is known by (a subscription it makes comes back
/// after a restart only where the job configures no tokens).
pub const STDIO_CREDENTIAL: &str = "stdio";

/// How long a tool waits for its context (as `POST /v1/query` does).
const TOOL_TIMEOUT: Duration = Duration::from_secs(120);

/// What a caller may search: the tenants (`None`: every tenant, as the unbound token or no tokens
/// configured grant), the ACL labels its queries carry (`None`: the labels it names, unchecked;
/// `Some`: exactly these, the labels of a tenant-bound token), and the name its credential is
/// known by (a token's environment variable, never the token; what a subscription it makes is
/// bound to again after a restart).
#[derive(Debug, Clone)]
pub struct Grant(
    pub Option<Arc<BTreeSet<String>>>,
    pub Option<Arc<Vec<String>>>,
    pub Arc<str>,
);

impl Grant {
    /// The `acl` of the grant's queries: a tenant-bound grant's labels, `[]` where it has none
    /// (chunks without labels only, whatever `query.absent_acl` says); `None` (the job's
    /// `absent_acl` rule) for the every-tenant token and a stdio launch.
    fn acl(&self) -> Option<Vec<String>> {
        self.1.as_deref().cloned()
    }

    /// The tenant a call searches: the one it names, if the grant opens it; else the grant's only
    /// tenant.
    fn tenant(&self, asked: Option<String>) -> Result<String, String> {
        match (&self.0, asked) {
            (Some(tenants), Some(asked)) if tenants.contains(&asked) => Ok(asked),
            (Some(_), Some(asked)) => Err(format!("this credential may not search tenant {asked}")),
            (Some(tenants), None) if tenants.len() == 1 => {
                Ok(tenants.iter().next().expect("one").clone())
            }
            (Some(tenants), None) => Err(format!(
                "this credential opens several tenants: name one in `tenant` ({})",
                tenants.iter().cloned().collect::<Vec<_>>().join(", ")
            )),
            (None, Some(asked)) => Ok(asked),
            (None, None) => Err("name the tenant to search in `tenant`".into()),
        }
    }
}

/// The tools, answering through the job's query ingress.
#[derive(Clone)]
pub struct RagTools {
    ingress: Arc<HttpIngress>,
    /// The job's standing queries (`None`: off), each a resource.
    standing: Option<Arc<crate::standing::Standing>>,
    /// This session's resource subscriptions.
    watches: standing::Watches,
    /// The stdio transport's grant; over HTTP each request carries its own (`None` here).
    grant: Option<Grant>,
    next: Arc<AtomicU64>,
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl RagTools {
    /// Tools answering through `ingress` (subscriptions held by `standing`); `grant` for stdio,
    /// `None` over HTTP (each request's own).
    pub fn new(
        ingress: Arc<HttpIngress>,
        standing: Option<Arc<crate::standing::Standing>>,
        grant: Option<Grant>,
    ) -> Self {
        Self {
            ingress,
            standing,
            watches: standing::Watches::default(),
            grant,
            next: Arc::new(AtomicU64::new(0)),
            tool_router: Self::tool_router(),
        }
    }

    /// The call's grant: the HTTP request's, or the stdio launch's.
    fn grant<'a>(&'a self, extensions: &'a Extensions) -> Option<&'a Grant> {
        extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Grant>())
            .or(self.grant.as_ref())
    }

    /// The tenant of a call: from the HTTP request's grant, or the stdio launch's. A refusal is a
    /// tool error, which the caller sees (a protocol error would reach it opaquely).
    fn tenant(
        &self,
        extensions: &Extensions,
        asked: Option<String>,
    ) -> Result<String, Box<CallToolResult>> {
        let refused =
            |message: String| Box::new(CallToolResult::error(vec![Content::text(message)]));
        let grant = self
            .grant(extensions)
            .ok_or_else(|| refused("no credential with this request".into()))?;
        grant.tenant(asked).map_err(refused)
    }

    /// The ACL labels of a call's queries ([`Grant::acl`]).
    fn labels(&self, extensions: &Extensions) -> Option<Vec<String>> {
        self.grant(extensions).and_then(Grant::acl)
    }

    /// Asks `query` for the call's tenant (the one it names in `asked`, if its credential opens it)
    /// with the credential's ACL labels; a refused tenant is a tool error.
    async fn ask_as(
        &self,
        extensions: &Extensions,
        asked: Option<String>,
        mut query: Value,
    ) -> Result<CallToolResult, ErrorData> {
        let tenant = match self.tenant(extensions, asked) {
            Ok(tenant) => tenant,
            Err(refused) => return Ok(*refused),
        };
        query["tenant"] = json!(tenant);
        query["acl"] = json!(self.labels(extensions));
        self.ask(query).await
    }

    /// Submits a query event and waits for its context (off the async executor). A call dropped
    /// while it waits (its client went away) forgets its request, so the waiting thread is released
    /// at once and a request still queued never runs.
    async fn ask(&self, mut query: Value) -> Result<CallToolResult, ErrorData> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        query["query_id"] = json!(format!("mcp-{}-{id}", std::process::id()));
        let (abandon, receiver) = self
            .ingress
            .submit_guarded(query.to_string().into_bytes(), None);
        let context =
            tokio::task::spawn_blocking(move || match receiver.recv_timeout(TOOL_TIMEOUT) {
                Ok(context) => Ok(context),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    Err("the job is stopping and takes no more queries")
                }
                Err(mpsc::RecvTimeoutError::Timeout) => Err("no context within 120 s"),
            })
            .await
            .map_err(|error| ErrorData::internal_error(error.to_string(), None))?;
        drop(abandon);
        match context {
            Ok(context) => Ok(result(context)),
            Err(message) => Ok(CallToolResult::error(vec![Content::text(message)])),
        }
    }

    #[tool(
        description = "Search the indexed documents and get one context packed into a token budget: the best passages with their sources (`Source: path (lines a-b)`), deduplicated and diversified. The context stops early once the evidence is in unless `fill` is true. Items carry chunk ids for rag_read_chunk."
    )]
    async fn rag_search(
        &self,
        Parameters(args): Parameters<SearchArgs>,
        extensions: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        self.ask_as(
            &extensions,
            args.tenant,
            json!({
                "text": args.query,
                "mode": "bounded",
                "token_budget": args.token_budget,
                "k": args.k,
                "score_threshold": args.score_threshold,
                "filters": filters(args.doc_filter),
                "fill": args.fill.unwrap_or(false),
                "return_full": args.return_full.unwrap_or(false),
                "preset": args.preset,
                "hyde": args.hyde,
                "num_hypotheses": args.num_hypotheses,
            }),
        )
        .await
    }

    #[tool(
        description = "Subscribe to a search: its context (as rag_search packs it) is kept current as the documents change. Answers version 1 of the context with a `subscription_id` and a resource `uri` (ragstream://subscriptions/{id}): read the resource for the latest version, subscribe to it to be told when the context moved (the stdio transport), end it with rag_unsubscribe. A new version comes only when the context's items or text changed."
    )]
    async fn rag_subscribe(
        &self,
        Parameters(args): Parameters<SubscribeArgs>,
        extensions: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        self.subscribe_as(
            &extensions,
            args.tenant,
            json!({
                "text": args.query,
                "mode": "bounded",
                "token_budget": args.token_budget,
                "k": args.k,
                "filters": filters(args.doc_filter),
                "fill": args.fill.unwrap_or(false),
            }),
            (args.min_interval_ms, args.ttl_secs),
        )
        .await
    }

    #[tool(
        description = "End a subscription made with rag_subscribe (by its subscription_id or resource uri)."
    )]
    async fn rag_unsubscribe(
        &self,
        Parameters(args): Parameters<UnsubscribeArgs>,
        extensions: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        self.unsubscribe_as(&extensions, &args.subscription_id)
    }

    #[tool(
        description = "Search and get whole chunks, best first (20 unless `k` says, at most 50), with no token budget (check they fit your window: each item has `full_tokens`)."
    )]
    async fn rag_search_deep(
        &self,
        Parameters(args): Parameters<DeepArgs>,
        extensions: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        self.ask_as(
            &extensions,
            args.tenant,
            json!({
                "text": args.query,
                "mode": "deep",
                "k": args.k,
                "score_threshold": args.score_threshold,
                "filters": filters(args.doc_filter),
                "preset": args.preset,
            }),
        )
        .await
    }

    #[tool(
        description = "Find the files most about a question: chunks are retrieved, grouped into files (documents, sources, directories or a metadata value: `file_key`) and ranked by how many of a file's chunks rank high; each file with its chunk counts. Read a file's chunks with rag_search and a doc_filter."
    )]
    async fn rag_search_files(
        &self,
        Parameters(args): Parameters<FilesArgs>,
        extensions: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        self.ask_as(
            &extensions,
            args.tenant,
            json!({
                "text": args.query,
                "mode": "files",
                "k": args.k,
                "pool": args.pool,
                "file_key": args.file_key,
                "filters": filters(args.doc_filter),
            }),
        )
        .await
    }

    #[tool(description = "Read the full text of one chunk by its id (from a search result).")]
    async fn rag_read_chunk(
        &self,
        Parameters(args): Parameters<ReadChunkArgs>,
        extensions: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        self.ask_as(
            &extensions,
            args.tenant,
            json!({"text": args.chunk_id, "mode": "read_chunk"}),
        )
        .await
    }

    #[tool(
        description = "List the tenant's indexed documents with their titles and chunk counts, one page at a time in document-id order; a result with `next_cursor` has more: pass it as `cursor`."
    )]
    async fn rag_list_sources(
        &self,
        Parameters(args): Parameters<ListSourcesArgs>,
        extensions: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        self.ask_as(
            &extensions,
            args.tenant,
            json!({"text": "", "mode": "list_sources", "k": args.limit, "cursor": args.cursor}),
        )
        .await
    }

    #[tool(
        description = "Find SQL tables by what they hold: qualified names, row counts, columns and types (`compact`), or also value distributions and sample rows (`full`; `include_distributions` and `include_samples` choose each). Tables under `score_threshold` (0.3) similarity are left out."
    )]
    async fn sql_search(
        &self,
        Parameters(args): Parameters<SqlArgs>,
        extensions: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let compact = args
            .compact
            .unwrap_or(matches!(args.detail, SqlDetail::Compact));
        let mode = if compact { "sql_compact" } else { "sql_full" };
        self.ask_as(
            &extensions,
            args.tenant,
            json!({
                "text": args.query,
                "mode": mode,
                "k": args.k,
                "score_threshold": args.score_threshold.unwrap_or(SQL_SCORE_THRESHOLD),
                "include_distributions": args.include_distributions,
                "include_samples": args.include_samples,
            }),
        )
        .await
    }

    #[tool(
        description = "Find SQL tables by what they hold, compactly: qualified names, row counts, columns and types only (sql_search with compact output and no samples or distributions)."
    )]
    async fn sql_search_compact(
        &self,
        Parameters(args): Parameters<SqlCompactArgs>,
        extensions: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        self.ask_as(
            &extensions,
            args.tenant,
            json!({
                "text": args.query,
                "mode": "sql_compact",
                "k": args.k,
                "score_threshold": SQL_SCORE_THRESHOLD,
            }),
        )
        .await
    }

    #[tool(
        description = "What the index holds for the tenant: its chunks (those your credential's ACL labels see), by kind (prose, markdown, code, sql_schema), the shards answering and the index backend."
    )]
    async fn get_index_stats(
        &self,
        Parameters(args): Parameters<TenantArgs>,
        extensions: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        self.ask_as(
            &extensions,
            args.tenant,
            json!({"text": "", "mode": "index_stats"}),
        )
        .await
    }

    #[tool(
        description = "This job process's cached contexts for the tenant (entries), the caches' capacity and TTL, and the process's cache hits and misses."
    )]
    async fn get_cache_stats(
        &self,
        Parameters(args): Parameters<TenantArgs>,
        extensions: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let tenant = match self.tenant(&extensions, args.tenant) {
            Ok(tenant) => tenant,
            Err(refused) => return Ok(*refused),
        };
        let stats = self.ingress.caches.stats(&tenant);
        let text = format!(
            "{} cached contexts for {tenant} (capacity {} over {} workers, {} s each); process hits {} misses {} ({:.2})",
            stats.entries,
            stats.capacity,
            stats.workers,
            stats.ttl_secs,
            stats.process_hits,
            stats.process_misses,
            stats.process_hit_ratio
        );
        let mut out = CallToolResult::success(vec![Content::text(text)]);
        out.structured_content = Some(json!(stats));
        Ok(out)
    }

    #[tool(
        description = "Remove the tenant's cached contexts from this job process's caches: those whose question matches `pattern` (a glob: `*tides*`; case ignored), or all of them. A cached context is never served after the index changed anyway; clear when something outside the index changed."
    )]
    async fn clear_cache(
        &self,
        Parameters(args): Parameters<ClearCacheArgs>,
        extensions: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let tenant = match self.tenant(&extensions, args.tenant) {
            Ok(tenant) => tenant,
            Err(refused) => return Ok(*refused),
        };
        let pattern = match args.pattern.as_deref().map(TextPattern::parse) {
            None => None,
            Some(Ok(pattern)) => Some(pattern),
            Some(Err(error)) => return Ok(CallToolResult::error(vec![Content::text(error)])),
        };
        let cleared = self.ingress.caches.clear(&tenant, pattern.as_ref());
        tracing::info!(%tenant, cleared, "context cache cleared (MCP)");
        let mut out = CallToolResult::success(vec![Content::text(format!(
            "{cleared} cached contexts of {tenant} removed"
        ))]);
        out.structured_content = Some(json!({"tenant": tenant, "cleared": cleared}));
        Ok(out)
    }

    #[tool(
        description = "Re-embed the tenant's indexed chunks in place (all, or those whose source matches `source_pattern`) with the job's embedder and BM25 weighting, on this job process's shards: for when the embedding model behind an endpoint changed, or vectors are suspect. One run at a time; chunks ingest changes meanwhile keep ingest's version. Returns the run's status (with `wait`, once it ended or after 60 seconds)."
    )]
    async fn force_reindex(
        &self,
        Parameters(args): Parameters<ReindexArgs>,
        extensions: Extensions,
    ) -> Result<CallToolResult, ErrorData> {
        let tenant = match self.tenant(&extensions, args.tenant) {
            Ok(tenant) => tenant,
            Err(refused) => return Ok(*refused),
        };
        let Some(reindexer) = self.ingress.reindex.get() else {
            return Ok(CallToolResult::error(vec![Content::text(
                "the job has not opened its index yet",
            )]));
        };
        let mut status = match reindexer.start(&tenant, args.source_pattern.as_deref()) {
            Ok(status) => status,
            Err(Refusal::Stopping) => {
                return Ok(CallToolResult::error(vec![Content::text(
                    "the job is stopping",
                )]))
            }
            Err(Refusal::BadPattern(error) | Refusal::Busy(error)) => {
                return Ok(CallToolResult::error(vec![Content::text(error)]))
            }
        };
        tracing::info!(%tenant, pattern = ?status.source_pattern, "reindex started (MCP)");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while args.wait && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            match reindexer.status(&tenant) {
                Some(now) if !now.running => {
                    status = now;
                    break;
                }
                Some(now) => status = now,
                None => break,
            }
        }
        Ok(Self::reindex_result(&status))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for RagTools {
    fn get_info(&self) -> ServerConfig {
        let capabilities = match self.standing.is_some() {
            true => ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .enable_resources_subscribe()
                .build(),
            false => ServerCapabilities::builder().enable_tools().build(),
        };
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("ragstream", env!("CARGO_PKG_VERSION")))
            .with_instructions(
            "Retrieval over the tenant's indexed documents. Start with rag_search (a context packed \
             into a token budget, with sources); read a cited chunk whole with rag_read_chunk; \
             rag_search_deep returns whole chunks without a budget; rag_list_sources lists the \
             documents; sql_search finds SQL tables. rag_subscribe keeps a search's context \
             current: its resource reads the latest version, and a resource subscription tells \
             when it moved. get_index_stats, get_cache_stats and clear_cache are for operating \
             the job.",
            )
    }

    async fn list_resources(
        &self,
        _request: Option<rmcp::model::PaginatedRequestParams>,
        context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::ListResourcesResult, ErrorData> {
        self.subscriptions(&context.extensions)
    }

    async fn read_resource(
        &self,
        request: rmcp::model::ReadResourceRequestParams,
        context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResponse, ErrorData> {
        self.read(&request.uri, &context.extensions).map(Into::into)
    }

    #[allow(
        deprecated,
        reason = "resources/subscribe serves clients of the 2025 revisions"
    )]
    async fn subscribe(
        &self,
        request: rmcp::model::SubscribeRequestParams,
        context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<(), ErrorData> {
        self.watch(request.uri, context)
    }

    #[allow(
        deprecated,
        reason = "resources/unsubscribe serves clients of the 2025 revisions"
    )]
    async fn unsubscribe(
        &self,
        request: rmcp::model::UnsubscribeRequestParams,
        _context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<(), ErrorData> {
        self.unwatch(&request.uri);
        Ok(())
    }

    fn accepted_subscription_filter(
        &self,
        requested: &rmcp::model::SubscriptionFilter,
    ) -> Option<rmcp::model::SubscriptionFilter> {
        self.standing.as_ref()?;
        let ours = requested.resource_subscriptions.as_ref().map(|uris| {
            uris.iter()
                .filter(|uri| uri.starts_with(SCHEME))
                .cloned()
                .collect::<Vec<_>>()
        });
        Some(
            rmcp::model::SubscriptionFilter::builder()
                .resource_subscriptions(ours.unwrap_or_default())
                .build(),
        )
    }

    async fn listen(&self, context: rmcp::service::SubscriptionContext) -> Result<(), ErrorData> {
        self.listen_to(context).await
    }
}

/// The stdio transport's runtime: one thread for rmcp's tasks (the tools' waits for their contexts
/// run on its blocking pool).
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("mcp")
        .enable_all()
        .build()
}

/// The streamable HTTP side: the tools behind `/mcp` of the job's HTTP server, rmcp's tower service
/// called with each request (on the HTTP server's runtime; the tools' waits for their contexts run
/// on its blocking pool).
pub struct McpHttp {
    service: StreamableHttpService<RagTools, NeverSessionManager>,
}

impl McpHttp {
    /// Tools over `ingress` and `standing`; `allowed_hosts` are the `Host` values accepted (empty:
    /// loopback only; `None`: any).
    pub fn new(
        ingress: Arc<HttpIngress>,
        standing: Option<Arc<crate::standing::Standing>>,
        allowed_hosts: Option<&[String]>,
    ) -> Self {
        let mut config = StreamableHttpServerConfig::default()
            .with_sse_keep_alive(None)
            .with_sse_retry(None)
            .with_legacy_session_mode(false)
            .with_json_response(true);
        match allowed_hosts {
            None => config = config.disable_allowed_hosts(),
            Some([]) => {}
            Some(hosts) => config = config.with_allowed_hosts(hosts.iter().cloned()),
        }
        let tools = RagTools::new(ingress, standing, None);
        let service = StreamableHttpService::new(
            move || Ok(tools.clone()),
            Arc::new(NeverSessionManager::default()),
            config,
        );
        Self { service }
    }

    /// Answers one request to `/mcp` (its body already read within the server's limits) whose
    /// bearer token granted `grant`.
    pub async fn handle(
        &self,
        parts: http::request::Parts,
        body: Bytes,
        grant: Grant,
    ) -> http::Response<Full<Bytes>> {
        let mut request = http::Request::from_parts(parts, Full::new(body));
        request.extensions_mut().insert(grant);
        let response = self.service.handle(request).await;
        let (parts, body) = response.into_parts();
        let body = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(never) => match never {},
        };
        http::Response::from_parts(parts, Full::new(body))
    }
}

/// Serves the tools on stdin/stdout until the client closes stdin.
pub fn serve_stdio(
    ingress: Arc<HttpIngress>,
    standing: Option<Arc<crate::standing::Standing>>,
    grant: Grant,
) -> anyhow::Result<()> {
    let runtime = runtime()?;
    runtime.block_on(async move {
        let service = RagTools::new(ingress, standing, Some(grant))
            .serve(rmcp::transport::stdio())
            .await?;
        service.waiting().await?;
        anyhow::Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The status `/mcp` answers an `initialize` sent under `host`, with `allowed` hosts.
    fn initialize_status(allowed: Option<&[String]>, host: &str) -> u16 {
        let mcp = McpHttp::new(Arc::new(HttpIngress::default()), None, allowed);
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-03-26", "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"}}});
        let (parts, _) = http::Request::post("/mcp")
            .header(http::header::HOST, host)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json, text/event-stream")
            .body(())
            .expect("request")
            .into_parts();
        let runtime = runtime().expect("runtime");
        let response = runtime.block_on(mcp.handle(
            parts,
            Bytes::from(body.to_string()),
            Grant(None, None, Arc::from("test")),
        ));
        response.status().as_u16()
    }

    #[test]
    fn any_host_opens_mcp_only_where_the_configuration_says_so() {
        let named = ["rag.example.com".to_string()];
        assert_eq!(initialize_status(None, "rag.example.com"), 200, "`*`");
        assert_eq!(initialize_status(Some(&named), "rag.example.com"), 200);
        assert_eq!(initialize_status(Some(&named), "evil.example"), 403);
        assert_eq!(initialize_status(Some(&[]), "localhost"), 200, "loopback");
        assert_eq!(initialize_status(Some(&[]), "rag.example.com"), 403);
    }

    fn grant(tenants: &[&str]) -> Grant {
        Grant(
            Some(Arc::new(tenants.iter().map(|t| t.to_string()).collect())),
            None,
            Arc::from("test"),
        )
    }

    #[test]
    fn the_credential_decides_the_tenant() {
        let one = grant(&["acme"]);
        assert_eq!(one.tenant(None).unwrap(), "acme");
        assert_eq!(one.tenant(Some("acme".into())).unwrap(), "acme");
        assert!(one
            .tenant(Some("globex".into()))
            .unwrap_err()
            .contains("may not search tenant globex"));
        let two = grant(&["acme", "globex"]);
        assert!(two.tenant(None).unwrap_err().contains("acme, globex"));
        assert_eq!(two.tenant(Some("globex".into())).unwrap(), "globex");
        let every = Grant(None, None, Arc::from("test"));
        assert_eq!(every.tenant(Some("any".into())).unwrap(), "any");
        assert!(every.tenant(None).is_err(), "no silent default tenant");
        // A tenant-bound token's calls carry its labels; one without labels an explicit empty
        // list (public chunks only even under `absent_acl = "all"`); the every-tenant token none.
        let labelled = Grant(
            one.0.clone(),
            Some(Arc::new(vec!["eng".into()])),
            one.2.clone(),
        );
        assert_eq!(labelled.acl(), Some(vec!["eng".to_string()]));
        let unlabelled = Grant(one.0.clone(), Some(Arc::new(Vec::new())), one.2.clone());
        assert_eq!(unlabelled.acl(), Some(Vec::new()));
        assert_eq!(every.acl(), None);
    }
}
