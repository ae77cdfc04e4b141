//! The queries topic's standing event: a query event with a `standing` object (read by
//! [`super::kafka`] with the `kafka` feature; its schema is published either way).

use serde::Deserialize;

/// The `standing` object of a queries-topic event.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[cfg_attr(
    not(feature = "kafka"),
    allow(dead_code, reason = "read by the queries topic's intake")
)]
#[serde(deny_unknown_fields)]
pub struct StandingEvent {
    /// The subscription's id (letters, digits, `-` and `_`, at most 128): the key of its versions
    /// on the contexts topic. Default: the event's `query_id`.
    #[serde(default)]
    pub subscription_id: Option<String>,
    /// Least milliseconds between two evaluations (0 to 3600000; default
    /// `standing.default_min_interval_ms`).
    #[serde(default)]
    pub min_interval_ms: Option<u64>,
    /// Seconds until the subscription ends (default `standing.default_ttl_secs`).
    #[serde(default)]
    pub ttl_secs: Option<u64>,
    /// `true`: end the subscription (its versions end with a tombstone).
    #[serde(default)]
    pub end: bool,
}

/// A queries-topic event with a `standing` object, as the schema shows it: a query event and the
/// subscription's parameters.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[allow(
    dead_code,
    reason = "the schema of the event: events are read field by field"
)]
pub struct StandingQueryEvent {
    /// The query (every field of a query event).
    #[serde(flatten)]
    pub query: ragstream_core::query::Query,
    /// Subscribes (or, with `end`, unsubscribes).
    pub standing: StandingEvent,
}
