//! The records of the standing-query API: a version and its diff, a subscription's status, why a
//! subscription was refused, and what a request asks for.

use std::sync::Arc;

use ragstream_core::query::{Context, Watermark};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// One version of a subscription's context.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Version {
    /// The subscription.
    pub subscription_id: String,
    /// 1, 2, …: never goes backwards, never skips.
    pub version: u64,
    /// What the index reflected when this version was evaluated.
    pub index_watermark: Watermark,
    /// When it was published (ms since the epoch).
    pub published_ms: u64,
    /// What moved since the previous version (everything is `added` in version 1).
    pub diff: Diff,
    /// The context, as `POST /v1/query` answers it.
    pub context: Context,
}

/// What moved between two versions, by chunk id.
#[derive(Debug, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct Diff {
    /// Items in this version, not in the previous.
    pub added: Vec<String>,
    /// Items in the previous version, not in this.
    pub removed: Vec<String>,
    /// Items in both whose text, tokens, lines or tier changed.
    pub changed: Vec<String>,
    /// Whether the items kept moved relative to each other.
    pub reordered: bool,
}

/// A subscription's state as `GET /v1/subscriptions/{id}` shows it.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Status {
    /// The subscription.
    pub subscription_id: String,
    /// Its tenant.
    pub tenant: String,
    /// True while a change of its tenant is not yet reflected by an evaluation.
    pub pending: bool,
    /// Least milliseconds between two evaluations.
    pub min_interval_ms: u64,
    /// Seconds until it expires.
    pub expires_in_secs: u64,
    /// The latest version.
    pub latest: Arc<Version>,
}

/// The answer of `DELETE /v1/subscriptions/{id}`.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Unsubscribed {
    /// The subscription.
    pub subscription_id: String,
    /// Always true: it ended, its event streams with it.
    pub ended: bool,
}

/// Why a subscription was not made.
#[derive(Debug)]
pub enum Refused {
    /// The request is wrong (the message says how): 400.
    Invalid(String),
    /// The tenant holds `standing.max_per_tenant` already: 403 `quota_exceeded`.
    TenantFull(usize),
    /// The process holds `standing.max_total` already: 503.
    Full(usize),
    /// The first evaluation failed: its context, which says why.
    Query(Box<Context>),
    /// The job is stopping.
    Stopping,
}

impl Refused {
    /// Why, in words (what an MCP tool answers; the HTTP API answers a problem of its own).
    #[cfg_attr(
        not(feature = "mcp"),
        allow(dead_code, reason = "the MCP tools' words")
    )]
    pub fn message(&self) -> String {
        match self {
            Refused::Invalid(message) => message.clone(),
            Refused::TenantFull(cap) => {
                format!("the tenant holds {cap} subscriptions already (standing.max_per_tenant)")
            }
            Refused::Full(cap) => {
                format!("the job holds {cap} subscriptions already (standing.max_total)")
            }
            Refused::Query(context) => context
                .error
                .clone()
                .unwrap_or_else(|| "the first evaluation failed".into()),
            Refused::Stopping => "the job is stopping".into(),
        }
    }
}

/// A subscription's parameters as the request gives them.
#[derive(Debug, Default)]
pub struct Request {
    /// The query event, already bound to the credential's tenants and labels.
    pub query: Map<String, Value>,
    /// `min_interval_ms`, if given.
    pub min_interval_ms: Option<u64>,
    /// `ttl_secs`, if given.
    pub ttl_secs: Option<u64>,
    /// The name its credential is known by (its environment variable, never the token): a
    /// restart checks that it still opens the query.
    pub credential: String,
    /// The subscription's id, where the client chose it (Kafka): a subscription of that id and
    /// tenant answers its latest version again instead of a new one. `None`: the job makes one.
    pub id: Option<String>,
    /// Publish its versions (and its end) through [`Standing::set_publisher`](super::Standing::set_publisher)'s publisher.
    pub publish: bool,
}
