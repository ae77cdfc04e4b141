//! The operations routes: `GET /v1/stats/index` (the `index_stats` mode: counts inside the index),
//! `GET /v1/cache` (this process's context caches), `DELETE /v1/cache` (clear them), `POST
//! /v1/reindex` (`force_reindex`) and `GET /v1/reindex` (its status), each for one tenant the token
//! opens.

use super::*;
use crate::http::api::{CacheCleared, IndexStatsPage};
use ragstream_core::query::pattern::TextPattern;
use ragstream_operators::ingest::reindex::Refusal;

/// Whether the token opens `tenant`.
fn opens(access: &Access, tenant: &str) -> bool {
    access
        .tenants
        .as_ref()
        .is_none_or(|tenants| tenants.contains(tenant))
}

/// The tenant of an operations request, if the token opens it.
fn cache_tenant(params: &BTreeMap<String, String>, access: &Access) -> Result<String, Box<Reply>> {
    let Some(tenant) = tenant_of(params, access) else {
        return Err(Box::new(problem("bad_request", NAME_THE_TENANT)));
    };
    if !opens(access, &tenant) {
        return Err(Box::new(problem(
            "forbidden",
            "this token may not query that tenant",
        )));
    }
    Ok(tenant)
}

/// `GET /v1/stats/index?tenant=`: the tenant's chunks, by kind, and the shards that hold them.
pub(super) async fn index_stats(shared: Arc<Shared>, params: &str, access: Access) -> Reply {
    let params = parameters(params);
    let Some(tenant) = tenant_of(&params, &access) else {
        return problem("bad_request", NAME_THE_TENANT);
    };
    let body = serde_json::json!({
        "query_id": internal_query_id(), "tenant": tenant, "text": "", "mode": "index_stats",
    });
    match ask(&shared, Bytes::from(body.to_string()), &access).await {
        Ok(context) => refused(&context).unwrap_or_else(|| {
            json_reply(&IndexStatsPage {
                tenant: context.tenant,
                stats: context.index_stats.unwrap_or_default(),
                index_watermark: context.index_watermark,
            })
        }),
        Err(reply) => reply,
    }
}

/// `GET /v1/cache?tenant=`: the tenant's cached contexts and the caches' figures.
pub(super) fn cache_stats(shared: &Shared, params: &str, access: &Access) -> Reply {
    match cache_tenant(&parameters(params), access) {
        Ok(tenant) => json_reply(&shared.ingress.caches.stats(&tenant)),
        Err(reply) => *reply,
    }
}

/// `DELETE /v1/cache?tenant=&pattern=`: removes the tenant's cached contexts whose query text
/// matches the glob `pattern` (all of them without one).
pub(super) fn clear_cache(shared: &Shared, params: &str, access: &Access) -> Reply {
    let params = parameters(params);
    let tenant = match cache_tenant(&params, access) {
        Ok(tenant) => tenant,
        Err(reply) => return *reply,
    };
    let pattern = match params.get("pattern").map(|p| TextPattern::parse(p)) {
        None => None,
        Some(Ok(pattern)) => Some(pattern),
        Some(Err(error)) => return problem("bad_request", &error),
    };
    let cleared = shared.ingress.caches.clear(&tenant, pattern.as_ref());
    tracing::info!(%tenant, cleared, "context cache cleared");
    json_reply(&CacheCleared { tenant, cleared })
}

/// `POST /v1/reindex?tenant=&source_pattern=`: starts re-embedding the tenant's chunks (those
/// whose source matches the glob) in place; 202 with the run's status.
pub(super) fn start_reindex(shared: &Shared, params: &str, access: &Access) -> Reply {
    let params = parameters(params);
    let tenant = match cache_tenant(&params, access) {
        Ok(tenant) => tenant,
        Err(reply) => return *reply,
    };
    let Some(reindexer) = shared.ingress.reindex.get() else {
        return problem("busy", "the job has not opened its index yet");
    };
    match reindexer.start(&tenant, params.get("source_pattern").map(String::as_str)) {
        Ok(status) => {
            tracing::info!(%tenant, pattern = ?status.source_pattern, "reindex started");
            let mut answer = json_reply(&status);
            *answer.status_mut() = StatusCode::ACCEPTED;
            answer
        }
        Err(Refusal::BadPattern(error)) => problem("bad_request", &error),
        Err(Refusal::Busy(detail)) => problem("reindex_running", &detail),
        Err(Refusal::Stopping) => problem("stopping", "the job is stopping"),
    }
}

/// `GET /v1/reindex?tenant=`: the tenant's last reindex in this process (running or ended).
pub(super) fn reindex_status(shared: &Shared, params: &str, access: &Access) -> Reply {
    let tenant = match cache_tenant(&parameters(params), access) {
        Ok(tenant) => tenant,
        Err(reply) => return *reply,
    };
    match shared.ingress.reindex.get().and_then(|r| r.status(&tenant)) {
        Some(status) => json_reply(&status),
        None => problem(
            "not_found",
            "no reindex of this tenant since the job started",
        ),
    }
}
