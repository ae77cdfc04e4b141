//! The read routes besides `POST /v1/query`: `GET /v1/sources`, `GET /v1/chunks/{id}` (queries the
//! route builds itself) and `GET /v1/invalidations`.

use super::*;

/// `GET /v1/sources?tenant=&limit=&cursor=`: one page of the tenant's documents.
pub(super) async fn sources(shared: Arc<Shared>, params: &str, access: Access) -> Reply {
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
pub(super) async fn chunk(
    shared: Arc<Shared>,
    chunk_id: &str,
    params: &str,
    access: Access,
) -> Reply {
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
pub(super) fn invalidations(params: &str, log: &Mutex<InvalidationLog>, tenants: Tenants) -> Reply {
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
