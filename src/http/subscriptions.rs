//! `/v1/subscriptions`: standing queries over HTTP (see [`crate::standing`]).
//!
//! - `POST /v1/subscriptions` `{"query": {…query event…}, "min_interval_ms": n, "ttl_secs": n}` →
//!   201, `Location`, and version 1 of the context.
//! - `GET /v1/subscriptions/{id}`: the latest version and whether a change is pending.
//! - `GET /v1/subscriptions/{id}/events`: Server-Sent Events, one `version` event per version (its
//!   number as the event id), from the one after `Last-Event-ID` (or `?last_event_id=`) where that
//!   is still kept, else from the oldest kept; an `end` event when the subscription ends. A comment
//!   line every 15 s keeps the stream open.
//! - `DELETE /v1/subscriptions/{id}` → 200 `{"subscription_id", "ended": true}`.
//!
//! A subscription's tenant and labels are its credential's, bound as for `POST /v1/query`; another
//! credential that may not see its tenant gets 404.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use http_body_util::channel::Channel;
use hyper::body::Incoming;
use hyper::Request;

use super::access::{bind, Access};
use super::{json_reply, problem, problem_reply, read_body, Reply, Shared};
use crate::http::api::Problem;
use crate::standing::{Refused, Standing, Version};

/// Seconds between two keep-alive comments of an event stream.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

const NO_STANDING: &str = "standing queries are off (standing.enabled = false)";

/// The body of `POST /v1/subscriptions`.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SubscribeRequest {
    /// The query event, as `POST /v1/query` takes it (its `query_id` is replaced per evaluation).
    #[schemars(with = "ragstream_core::query::Query")]
    pub query: serde_json::Map<String, serde_json::Value>,
    /// Least milliseconds between two evaluations (0 to 3600000; default `standing.default_min_interval_ms`).
    #[serde(default)]
    pub min_interval_ms: Option<u64>,
    /// Seconds until the subscription ends (1 to `standing.max_ttl_secs`; default
    /// `standing.default_ttl_secs`).
    #[serde(default)]
    pub ttl_secs: Option<u64>,
}

fn registry(shared: &Shared) -> Result<&Arc<Standing>, Box<Reply>> {
    shared
        .standing
        .as_ref()
        .ok_or_else(|| Box::new(problem("not_found", NO_STANDING)))
}

/// `POST /v1/subscriptions`.
pub(super) async fn subscribe(
    shared: Arc<Shared>,
    request: Request<Incoming>,
    (access, credential): (Access, &str),
) -> Reply {
    let standing = match registry(&shared) {
        Ok(standing) => standing.clone(),
        Err(reply) => return *reply,
    };
    let body = match read_body(request, &shared.limits).await {
        Ok((_, body)) => body,
        Err(refused) => return refused,
    };
    let asked: SubscribeRequest = match serde_json::from_slice(&body) {
        Ok(asked) => asked,
        Err(cause) => {
            return problem(
                "bad_request",
                &format!("the body is not a subscription: {cause}"),
            )
        }
    };
    let query = match serde_json::to_vec(&asked.query) {
        Ok(query) => Bytes::from(query),
        Err(_) => return problem("bad_request", "the query is not JSON"),
    };
    let bound = match bind(query, &access) {
        Ok(bound) => bound,
        Err(refused) => return problem("forbidden", &refused),
    };
    let Ok(serde_json::Value::Object(query)) = serde_json::from_slice(&bound) else {
        return problem("bad_request", "the query must be a JSON object");
    };
    let request = crate::standing::Request {
        query,
        min_interval_ms: asked.min_interval_ms,
        ttl_secs: asked.ttl_secs,
        credential: credential.to_string(),
        id: None,
        publish: false,
    };
    // The first answer waits as a query does: it holds one of the query slots meanwhile.
    let slot = match super::query_slot(&shared) {
        Ok(slot) => slot,
        Err(busy) => return *busy,
    };
    let made = tokio::task::spawn_blocking(move || standing.subscribe(request)).await;
    drop(slot);
    match made {
        Ok(Ok(version)) => {
            let mut answer = json_reply(&*version);
            *answer.status_mut() = StatusCode::CREATED;
            if let Ok(location) =
                HeaderValue::from_str(&format!("/v1/subscriptions/{}", version.subscription_id))
            {
                answer
                    .headers_mut()
                    .insert(http::header::LOCATION, location);
            }
            answer
        }
        Ok(Err(refused)) => refusal(refused),
        Err(_) => problem("internal", "the subscription's first evaluation failed"),
    }
}

fn refusal(refused: Refused) -> Reply {
    match refused {
        Refused::Invalid(message) => problem("bad_request", &message),
        Refused::TenantFull(cap) => problem(
            "subscriptions_exceeded",
            &format!("the tenant holds {cap} subscriptions already (standing.max_per_tenant)"),
        ),
        Refused::Full(cap) => super::busy(&format!(
            "the job holds {cap} subscriptions already (standing.max_total)"
        )),
        Refused::Query(context) => problem_reply(
            &Problem::of_context(&context)
                .unwrap_or_else(|| Problem::new("internal", "the first evaluation failed")),
        ),
        Refused::Stopping => problem("stopping", "the job is stopping"),
    }
}

/// `GET`/`DELETE /v1/subscriptions/{id}` and `GET /v1/subscriptions/{id}/events`; `rest` is the
/// path after `/v1/subscriptions/`.
pub(super) fn route(
    shared: &Arc<Shared>,
    request: &Request<Incoming>,
    rest: &str,
    params: &str,
    access: &Access,
) -> Reply {
    let standing = match registry(shared) {
        Ok(standing) => standing,
        Err(reply) => return *reply,
    };
    let tenants = access.tenants.as_deref();
    let method = request.method();
    let missing = || problem("not_found", "no such subscription");
    if let Some(id) = rest.strip_suffix("/events") {
        if method != http::Method::GET {
            return super::method_not_allowed("GET");
        }
        let last = last_event_id(request, params);
        return match standing.versions_after(id, tenants, last) {
            Some((backlog, changes)) => {
                events(standing.clone(), id.to_string(), access, backlog, changes)
            }
            None => missing(),
        };
    }
    match *method {
        http::Method::GET | http::Method::HEAD => match standing.status(rest, tenants) {
            Some(status) => json_reply(&status),
            None => missing(),
        },
        http::Method::DELETE => match standing.unsubscribe(rest, tenants) {
            true => json_reply(&crate::standing::Unsubscribed {
                subscription_id: rest.to_string(),
                ended: true,
            }),
            false => missing(),
        },
        _ => super::method_not_allowed("GET, DELETE"),
    }
}

/// The version a resuming client saw last: `Last-Event-ID`, else `?last_event_id=`, else 0.
fn last_event_id(request: &Request<Incoming>, params: &str) -> u64 {
    let header = request
        .headers()
        .get("last-event-id")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse().ok());
    header
        .or_else(|| {
            params
                .split('&')
                .filter_map(|pair| pair.split_once('='))
                .find(|(key, _)| *key == "last_event_id")
                .and_then(|(_, value)| value.parse().ok())
        })
        .unwrap_or(0)
}

/// One `version` event.
fn event(version: &Version) -> Bytes {
    let data = serde_json::to_string(version).unwrap_or_default();
    Bytes::from(format!(
        "id: {}\nevent: version\ndata: {data}\n\n",
        version.version
    ))
}

/// The event stream: the backlog, then each new version as it is published, until the
/// subscription ends or the client goes away.
fn events(
    standing: Arc<Standing>,
    id: String,
    access: &Access,
    backlog: Vec<Arc<Version>>,
    mut changes: tokio::sync::watch::Receiver<u64>,
) -> Reply {
    let (mut sender, body) = Channel::<Bytes, Infallible>::new(4);
    let tenants = access.tenants.clone();
    tokio::spawn(async move {
        let mut last = 0;
        for version in backlog {
            last = version.version;
            if sender.send_data(event(&version)).await.is_err() {
                return;
            }
        }
        loop {
            match tokio::time::timeout(KEEP_ALIVE, changes.changed()).await {
                Err(_) => {
                    if sender
                        .send_data(Bytes::from_static(b": keep-alive\n\n"))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Ok(Err(_)) => {
                    let end = serde_json::json!({"subscription_id": id, "reason": "ended"});
                    let _ = sender
                        .send_data(Bytes::from(format!("event: end\ndata: {end}\n\n")))
                        .await;
                    return;
                }
                Ok(Ok(())) => {
                    let Some((versions, _)) =
                        standing.versions_after(&id, tenants.as_deref(), last)
                    else {
                        continue;
                    };
                    for version in versions {
                        last = version.version;
                        if sender.send_data(event(&version)).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    });
    let mut response = http::Response::new(super::Body::Right(body));
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    response
}
