//! The HTTP API's own types: its error shape (RFC 9457 problem details) and the bodies of the routes
//! that do not answer with a context. The OpenAPI document ([`crate::http::openapi`]) is generated from
//! these and the wire types of the core.

use ragstream_core::query::invalidate::Invalidation;
use ragstream_core::query::{Context, IndexStats, SourceEntry, Watermark};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The media type of a problem.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The prefix of every problem type: `urn:ragstream:problem:<name>`, `<name>` one of [`PROBLEMS`].
pub const PROBLEM_PREFIX: &str = "urn:ragstream:problem:";

/// Every problem the API answers: its name (the `type` after [`PROBLEM_PREFIX`]), HTTP status and
/// title. The names of refused input are the DLQ reasons of the same refusal.
pub const PROBLEMS: &[(&str, u16, &str)] = &[
    ("malformed_json", 400, "The body is not JSON"),
    ("missing_field", 400, "A document lacks a required field"),
    ("unknown_kind", 400, "A document's kind is not known"),
    ("unknown_op", 400, "A document's op is not upsert or delete"),
    ("bad_key", 400, "A document's tenant or id is not valid"),
    (
        "unknown_tenant",
        400,
        "A document's tenant is not one the job takes",
    ),
    (
        "invalid_metadata",
        400,
        "A document's metadata is not a flat object of bounded values",
    ),
    ("invalid_utf8", 400, "The body is not UTF-8"),
    ("invalid_query", 400, "The query is not valid"),
    ("bad_request", 400, "The request is not valid"),
    ("unauthorized", 401, "Missing or wrong bearer token"),
    (
        "forbidden",
        403,
        "The token does not open this tenant or label",
    ),
    ("host_not_allowed", 403, "This Host is not allowed"),
    (
        "quota_exceeded",
        403,
        "The documents would take the tenant past a quota (413: one document alone passes it)",
    ),
    (
        "subscriptions_exceeded",
        403,
        "The tenant holds as many standing queries as it may (standing.max_per_tenant)",
    ),
    ("not_found", 404, "No such route"),
    ("unknown_chunk", 404, "No such chunk"),
    (
        "method_not_allowed",
        405,
        "Method not allowed on this route",
    ),
    (
        "tenant_owned",
        409,
        "The tenant's documents come from the watched directory",
    ),
    (
        "no_document_input",
        409,
        "This job takes no documents over HTTP",
    ),
    (
        "reindex_running",
        409,
        "A reindex is running in this process; one at a time",
    ),
    ("request_timeout", 408, "The body did not arrive in time"),
    (
        "rate_limited",
        429,
        "This credential's requests are over its rate; retry after Retry-After",
    ),
    ("oversize", 413, "The body or the query is too large"),
    (
        "unparseable",
        422,
        "A document's file (HTML, PDF, DOCX) cannot be read",
    ),
    (
        "index_refused",
        422,
        "The index refused the query's conditions",
    ),
    ("internal", 500, "Internal error"),
    (
        "too_large_context",
        500,
        "The context is too large to publish",
    ),
    ("busy", 503, "Too many requests in flight; retry shortly"),
    (
        "broker_unavailable",
        503,
        "The broker did not take the documents; retry later",
    ),
    (
        "index_unavailable",
        503,
        "The index is unavailable; retry later",
    ),
    ("stopping", 503, "The job is stopping"),
    ("timeout", 504, "No answer in time"),
];

/// An error, as every route answers it (RFC 9457, `application/problem+json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Problem {
    /// `urn:ragstream:problem:<name>`: stable, for programs. The names of refused input are the DLQ
    /// reasons of the same refusal.
    #[serde(rename = "type")]
    pub kind: String,
    /// A short summary of the problem type.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What exactly was wrong, for people.
    pub detail: String,
    /// The query's id, when the body named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_id: Option<String>,
    /// `POST /v1/documents`: every refused document of the batch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<DocumentError>,
}

/// One refused document of a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DocumentError {
    /// Its position in `documents`.
    pub index: usize,
    /// The DLQ reason the documents topic would give it (`missing_field`, `oversize`, …).
    pub reason: String,
    /// What exactly was wrong.
    pub detail: String,
}

impl Problem {
    /// The problem `name` (one of [`PROBLEMS`]; an unknown name is answered as `internal`'s status).
    pub fn new(name: &str, detail: impl Into<String>) -> Self {
        let (status, title) = PROBLEMS
            .iter()
            .find(|(known, _, _)| *known == name)
            .map_or((500, "Internal error"), |(_, status, title)| {
                (*status, *title)
            });
        Self {
            kind: format!("{PROBLEM_PREFIX}{name}"),
            title: title.to_string(),
            status,
            detail: detail.into(),
            query_id: None,
            errors: Vec::new(),
        }
    }

    /// The problem of a context that carries an error (`None` for an answered query). A context
    /// without an error type is a refused query when it has no mode, else an internal error.
    pub fn of_context(context: &Context) -> Option<Self> {
        let detail = context.error.as_ref()?;
        let name = match context.error_type.as_deref() {
            Some(name) if PROBLEMS.iter().any(|(known, _, _)| *known == name) => name,
            _ if context.mode.is_none() => "invalid_query",
            _ => "internal",
        };
        let mut problem = Self::new(name, detail.clone());
        problem.query_id = Some(context.query_id.clone()).filter(|id| !id.is_empty());
        Some(problem)
    }
}

/// `GET /v1/sources`: one page of the tenant's documents.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SourcesPage {
    /// The tenant.
    pub tenant: String,
    /// Its documents in `doc_id` order, with their chunk counts.
    pub sources: Vec<SourceEntry>,
    /// Pass as `cursor` for the next page (absent on the last page).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `GET /v1/stats/index`: what the index holds for a tenant (the chunks the token's ACL labels
/// see).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct IndexStatsPage {
    /// The tenant.
    pub tenant: String,
    /// The counts.
    pub stats: IndexStats,
    /// What the index reflected when counted.
    pub index_watermark: Watermark,
}

/// `DELETE /v1/cache`: the cached contexts removed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CacheCleared {
    /// The tenant.
    pub tenant: String,
    /// Contexts removed from this process's caches.
    pub cleared: usize,
}

/// `GET /v1/invalidations`: the invalidations numbered above `since`, of the tenants the token
/// opens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InvalidationsPage {
    /// The invalidations, oldest first.
    pub invalidations: Vec<Invalidation>,
    /// The number to ask from next (`since`).
    pub last: u64,
    /// Whether some above `since` were already dropped from the log (re-read those contexts).
    pub truncated: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_are_unique_and_carry_error_statuses() {
        let mut names: Vec<&str> = PROBLEMS.iter().map(|(name, _, _)| *name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), PROBLEMS.len(), "a name listed twice");
        assert!(PROBLEMS
            .iter()
            .all(|(_, status, _)| (400..600).contains(status)));
    }

    #[test]
    fn a_context_error_becomes_the_problem_of_its_type() {
        let mut context = Context {
            query_id: "q1".into(),
            error: Some("boom".into()),
            error_type: Some("index_unavailable".into()),
            mode: Some(ragstream_core::query::Mode::Bounded),
            ..Context::default()
        };
        let problem = Problem::of_context(&context).unwrap();
        assert_eq!(problem.kind, "urn:ragstream:problem:index_unavailable");
        assert_eq!((problem.status, problem.detail.as_str()), (503, "boom"));
        assert_eq!(problem.query_id.as_deref(), Some("q1"));
        context.error_type = Some("oversize".into());
        assert_eq!(Problem::of_context(&context).unwrap().status, 413);
        context.error_type = None;
        assert_eq!(Problem::of_context(&context).unwrap().status, 500);
        context.mode = None;
        assert_eq!(Problem::of_context(&context).unwrap().status, 400);
        context.error = None;
        assert!(Problem::of_context(&context).is_none());
    }
}
