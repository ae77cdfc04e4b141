//! Standing queries over MCP. `rag_subscribe` makes a subscription (as `POST /v1/subscriptions`
//! does, bound to the call's credential) and answers its first version; each subscription is the
//! resource `ragstream://subscriptions/{id}`, whose read is its latest version. A client told of
//! new versions subscribes to the resource: `resources/subscribe` (protocol revisions up to
//! 2025-11-25, answered with `notifications/resources/updated`) or a `subscriptions/listen` stream
//! naming it (2026-07-28). The notification says only that the resource moved; the client reads
//! it. Notifications need a connection the server can write to at any time: the stdio transport.
//! The job's `/mcp` is stateless (one JSON answer a request), so there the tools and reads work and
//! a resource subscription is refused, pointing at `GET /v1/subscriptions/{id}/events`.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use rmcp::model::{
    ListResourcesResult, ReadResourceResult, Resource, ResourceContents,
    ResourceUpdatedNotificationParam,
};
use rmcp::service::{RequestContext, RoleServer, SubscriptionContext};

use super::*;
use crate::standing::{Refused, Standing};

/// The resources' URI prefix: a subscription's URI is this followed by its id.
pub const SCHEME: &str = "ragstream://subscriptions/";

/// The resource URI of subscription `id`.
pub fn uri(id: &str) -> String {
    format!("{SCHEME}{id}")
}

/// The subscription id a resource URI names.
fn id_of(uri: &str) -> Option<&str> {
    uri.strip_prefix(SCHEME).filter(|id| !id.is_empty())
}

/// The resource subscriptions of one MCP session (`resources/subscribe`), each a task forwarding
/// its versions as notifications.
#[derive(Clone, Default)]
pub(super) struct Watches(Arc<Mutex<HashMap<String, tokio::task::AbortHandle>>>);

impl Drop for Watches {
    fn drop(&mut self) {
        // The last handle of a session: its forwarding tasks end with it.
        if Arc::strong_count(&self.0) == 1 {
            if let Ok(watches) = self.0.lock() {
                watches.values().for_each(tokio::task::AbortHandle::abort);
            }
        }
    }
}

const OFF: &str = "standing queries are off in this job (standing.enabled = false)";
const OVER_HTTP: &str = "resource notifications need the stdio transport (`ragstream mcp`): over HTTP, read the resource again or follow GET /v1/subscriptions/{id}/events";

impl RagTools {
    fn standing(&self) -> Result<&Arc<Standing>, ErrorData> {
        self.standing
            .as_ref()
            .ok_or_else(|| ErrorData::invalid_request(OFF, None))
    }

    /// The tenants the call's credential opens (`None`: every tenant).
    fn tenants(&self, extensions: &Extensions) -> Option<Arc<BTreeSet<String>>> {
        self.grant(extensions).and_then(|grant| grant.0.clone())
    }

    /// Makes a subscription of `query` for the call's tenant and labels; answers its first version.
    pub(super) async fn subscribe_as(
        &self,
        extensions: &Extensions,
        asked: Option<String>,
        mut query: Value,
        (min_interval_ms, ttl_secs): (Option<u64>, Option<u64>),
    ) -> Result<CallToolResult, ErrorData> {
        let Some(standing) = self.standing.clone() else {
            return Ok(CallToolResult::error(vec![Content::text(OFF)]));
        };
        let tenant = match self.tenant(extensions, asked) {
            Ok(tenant) => tenant,
            Err(refused) => return Ok(*refused),
        };
        query["tenant"] = json!(tenant);
        query["acl"] = json!(self.labels(extensions));
        let Value::Object(query) = query else {
            return Err(ErrorData::internal_error("a query is an object", None));
        };
        let request = crate::standing::Request {
            query,
            min_interval_ms,
            ttl_secs,
            credential: self
                .grant(extensions)
                .map_or_else(String::new, |grant| grant.2.to_string()),
            id: None,
            publish: false,
        };
        let made = tokio::task::spawn_blocking(move || standing.subscribe(request))
            .await
            .map_err(|error| ErrorData::internal_error(error.to_string(), None))?;
        let version = match made {
            Ok(version) => version,
            Err(Refused::Query(context)) => return Ok(result(*context)),
            Err(refused) => {
                return Ok(CallToolResult::error(vec![Content::text(
                    refused.message(),
                )]))
            }
        };
        let mut answer = result(version.context.clone());
        if let Some(Value::Object(structured)) = &mut answer.structured_content {
            structured.insert("subscription_id".into(), json!(version.subscription_id));
            structured.insert("uri".into(), json!(uri(&version.subscription_id)));
            structured.insert("version".into(), json!(version.version));
        }
        Ok(answer)
    }

    /// Ends a subscription the call's credential may see.
    pub(super) fn unsubscribe_as(
        &self,
        extensions: &Extensions,
        id: &str,
    ) -> Result<CallToolResult, ErrorData> {
        let id = id_of(id).unwrap_or(id);
        let ended = self
            .standing()?
            .unsubscribe(id, self.tenants(extensions).as_deref());
        Ok(match ended {
            true => {
                let mut answer =
                    CallToolResult::success(vec![Content::text(format!("{id} ended"))]);
                answer.structured_content =
                    Some(json!({"subscription_id": id, "uri": uri(id), "ended": true}));
                answer
            }
            false => CallToolResult::error(vec![Content::text(format!(
                "no subscription {id} (ended, expired, or not this credential's)"
            ))]),
        })
    }

    /// The subscriptions the credential may see, as resources.
    pub(super) fn subscriptions(
        &self,
        extensions: &Extensions,
    ) -> Result<ListResourcesResult, ErrorData> {
        let held = self.standing()?.held(self.tenants(extensions).as_deref());
        let resources = held
            .into_iter()
            .map(|(id, tenant, version)| {
                Resource::new(uri(&id), id.clone())
                    .with_description(format!(
                        "standing query of tenant {tenant}: version {version} of its context"
                    ))
                    .with_mime_type("application/json")
            })
            .collect();
        let mut listed = ListResourcesResult::with_all_items(resources);
        listed.ttl_ms = Some(0);
        Ok(listed)
    }

    /// A subscription's latest version (as `GET /v1/subscriptions/{id}` answers it).
    pub(super) fn read(
        &self,
        uri: &str,
        extensions: &Extensions,
    ) -> Result<ReadResourceResult, ErrorData> {
        let missing = || ErrorData::resource_not_found(format!("no subscription at {uri}"), None);
        let id = id_of(uri).ok_or_else(missing)?;
        let status = self
            .standing()?
            .status(id, self.tenants(extensions).as_deref())
            .ok_or_else(missing)?;
        let text = serde_json::to_string(&status)
            .map_err(|error| ErrorData::internal_error(error.to_string(), None))?;
        let mut read = ReadResourceResult::new(vec![
            ResourceContents::text(text, uri).with_mime_type("application/json")
        ]);
        read.ttl_ms = Some(0);
        Ok(read)
    }

    /// `resources/subscribe`: forwards each new version of the subscription at `uri` as
    /// `notifications/resources/updated` (and one when it ends), until `resources/unsubscribe`
    /// or the session ends.
    pub(super) fn watch(
        &self,
        uri: String,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        if context.extensions.get::<http::request::Parts>().is_some() {
            return Err(ErrorData::invalid_request(OVER_HTTP, None));
        }
        let mut versions = self.versions(&uri, &context.extensions)?;
        let peer = context.peer.clone();
        let notified = uri.clone();
        let task = tokio::spawn(async move {
            loop {
                let ended = versions.changed().await.is_err();
                let param = ResourceUpdatedNotificationParam::new(notified.clone());
                if peer.notify_resource_updated(param).await.is_err() || ended {
                    break;
                }
            }
        });
        if let Some(earlier) = lock(&self.watches.0).insert(uri, task.abort_handle()) {
            earlier.abort();
        }
        Ok(())
    }

    /// `resources/unsubscribe`.
    pub(super) fn unwatch(&self, uri: &str) {
        if let Some(task) = lock(&self.watches.0).remove(uri) {
            task.abort();
        }
    }

    /// A `subscriptions/listen` stream: `notifications/resources/updated` for each accepted
    /// subscription's new versions (and its end), until the client cancels it or every
    /// subscription named has ended.
    pub(super) async fn listen_to(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let extensions = &context.request_context().extensions;
        if extensions.get::<http::request::Parts>().is_some() {
            return Err(ErrorData::invalid_request(OVER_HTTP, None));
        }
        let uris = context
            .accepted()
            .resource_subscriptions
            .clone()
            .unwrap_or_default();
        tracing::debug!(?uris, "subscriptions/listen");
        let mut watched = Vec::new();
        for uri in uris {
            let versions = self.versions(&uri, extensions)?;
            watched.push((uri, versions));
        }
        let (sender, mut moved) = tokio::sync::mpsc::channel::<(String, bool)>(16);
        let mut tasks = tokio::task::JoinSet::new();
        for (uri, mut versions) in watched {
            let sender = sender.clone();
            tasks.spawn(async move {
                loop {
                    let ended = versions.changed().await.is_err();
                    if sender.send((uri.clone(), ended)).await.is_err() || ended {
                        break;
                    }
                }
            });
        }
        drop(sender);
        loop {
            tokio::select! {
                () = context.cancelled() => return Ok(()),
                next = moved.recv() => match next {
                    Some((uri, _)) => {
                        if let Err(error) = context.sink().notify_resource_updated(uri).await {
                            tracing::debug!(%error, "a subscriptions/listen stream closed");
                            return Ok(());
                        }
                    }
                    None => return Ok(()),
                },
            }
        }
    }

    /// The receiver told of the versions of the subscription at `uri`, if the call may see it.
    fn versions(
        &self,
        uri: &str,
        extensions: &Extensions,
    ) -> Result<tokio::sync::watch::Receiver<u64>, ErrorData> {
        let missing = || ErrorData::resource_not_found(format!("no subscription at {uri}"), None);
        let id = id_of(uri).ok_or_else(missing)?;
        let (_, mut versions) = self
            .standing()?
            .versions_after(id, self.tenants(extensions).as_deref(), u64::MAX)
            .ok_or_else(missing)?;
        versions.mark_unchanged();
        Ok(versions)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
