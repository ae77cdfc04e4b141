//! The HTTP API's OpenAPI 3.1 document and the JSON Schemas of the topics' messages, generated from
//! the Rust types the job reads and writes (schemars). `ragstream openapi` prints the document,
//! `ragstream schemas DIR` writes the topic schemas; both are committed under `docs/` and a test
//! fails when they drift from the types.

use ragstream_core::query::invalidate::Invalidation;
use ragstream_core::query::{Context, ContextItem, Query};
use ragstream_operators::ingest::decode::DocumentEvent;
use ragstream_operators::ingest::dlq::{DlqHeaders, DlqLine};
use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::JsonSchema;
use serde_json::{json, Map, Value};

use crate::http::api::{
    CacheCleared, IndexStatsPage, InvalidationsPage, Problem, SourcesPage, PROBLEMS, PROBLEM_JSON,
};
use crate::http::documents::{DocumentsAccepted, DocumentsRequest};
use ragstream_core::query::cache::CacheStats;
use ragstream_core::store::reindex::ReindexStatus;

/// Where the document's schemas live, as a JSON pointer.
const COMPONENTS: &str = "/components/schemas";

fn generator(serialize: bool, definitions_path: &'static str) -> SchemaGenerator {
    let settings =
        SchemaSettings::draft2020_12().with(|s| s.definitions_path = definitions_path.into());
    let settings = if serialize {
        settings.for_serialize()
    } else {
        settings.for_deserialize()
    };
    settings.into_generator()
}

/// A reference to the component `name`.
fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#{COMPONENTS}/{name}") })
}

fn json_content(schema: Value) -> Value {
    json!({ "application/json": { "schema": schema } })
}

/// The responses of a data route: `success` (status, description, schema) and the problems.
fn responses(success: (&str, &str, Value), problems: &[u16]) -> Value {
    let mut responses = Map::new();
    responses.insert(
        success.0.into(),
        json!({ "description": success.1, "content": json_content(success.2) }),
    );
    for status in problems {
        let names: Vec<&str> = PROBLEMS
            .iter()
            .filter(|(_, s, _)| s == status)
            .map(|(name, _, _)| *name)
            .collect();
        responses.insert(
            status.to_string(),
            json!({
                "description": format!("A problem: {}", names.join(", ")),
                "content": { PROBLEM_JSON: { "schema": schema_ref("Problem") } },
            }),
        );
    }
    Value::Object(responses)
}

/// The answers of the document routes: 200 (local mode), 202 (Kafka mode) or a problem; `more`: statuses beside those every one of them may give.
fn documents_responses(more: &[u16]) -> Value {
    let mut answers = responses(
        (
            "200",
            "Indexed (local mode)",
            schema_ref("DocumentsAccepted"),
        ),
        &with(&with(&GUARDED, &[400, 408, 409, 413, 503, 504]), more),
    );
    answers["202"] = json!({
        "description": "On the documents topic (Kafka mode), or not indexed within `wait` (local mode: `status` and the Location header name the batch's status link)",
        "content": json_content(schema_ref("DocumentsAccepted")),
    });
    answers
}

/// The `wait` parameter of the document routes.
fn wait_param() -> Value {
    json!({ "name": "wait", "in": "query", "required": false, "description": "Local mode: seconds to wait for the index (0 to 120; default 120); past it the answer is 202 with the batch's status link.", "schema": { "type": "number", "minimum": 0, "maximum": 120 } })
}

/// The statuses every authenticated route may answer with a problem.
const GUARDED: [u16; 5] = [401, 403, 404, 429, 500];

fn with(base: &[u16], more: &[u16]) -> Vec<u16> {
    let mut all: Vec<u16> = base.iter().chain(more).copied().collect();
    all.sort_unstable();
    all.dedup();
    all
}

fn text_response(description: &str) -> Value {
    json!({ "description": description, "content": { "text/plain": { "schema": { "type": "string" } } } })
}

/// The paths of the read and operations routes: sources, chunks, invalidations, the index's counts,
/// the context caches.
fn read_paths(bearer: &Value, tenant: &Value) -> Value {
    json!({
    "/v1/sources": { "get": {
        "operationId": "sources", "summary": "One page of the tenant's documents, with their chunk counts.",
        "security": bearer,
        "parameters": [
            tenant.clone(),
            { "name": "limit", "in": "query", "required": false, "description": "Documents per page (1 to 1000; default 100).", "schema": { "type": "integer", "minimum": 1, "maximum": 1000 } },
            { "name": "cursor", "in": "query", "required": false, "description": "The previous page's `next_cursor`.", "schema": { "type": "string" } },
        ],
        "responses": responses(("200", "A page of documents", schema_ref("SourcesPage")), &with(&GUARDED, &[400, 408, 503, 504])),
    }},
    "/v1/chunks/{chunk_id}": { "get": {
        "operationId": "chunk", "summary": "The full text of one chunk, with its source, lines, section path and metadata.",
        "security": bearer,
        "parameters": [
            { "name": "chunk_id", "in": "path", "required": true, "description": "A context item's `chunk_id`.", "schema": { "type": "string" } },
            tenant.clone(),
        ],
        "responses": responses(("200", "The chunk", schema_ref("ContextItem")), &with(&GUARDED, &[400, 408, 503, 504])),
    }},
    "/v1/invalidations": { "get": {
        "operationId": "invalidations",
        "summary": "Contexts made stale by index writes since `since`, of the tenants the token opens.",
        "security": bearer,
        "parameters": [
            { "name": "since", "in": "query", "required": false, "description": "The previous page's `last` (default 0).", "schema": { "type": "integer", "minimum": 0 } },
        ],
        "responses": responses(("200", "The invalidations", schema_ref("InvalidationsPage")), &with(&GUARDED, &[400])),
    }},
    "/v1/stats/index": { "get": {
        "operationId": "indexStats",
        "summary": "What the index holds for the tenant: its chunks (those the token's ACL labels see), by kind, and the shards answering.",
        "security": bearer,
        "parameters": [ tenant.clone() ],
        "responses": responses(("200", "The counts", schema_ref("IndexStatsPage")), &with(&GUARDED, &[400, 408, 503, 504])),
    }},
    "/v1/cache": {
        "get": {
            "operationId": "cacheStats",
            "summary": "This process's context caches: the tenant's entries, capacity, TTL and the process's hits and misses.",
            "security": bearer,
            "parameters": [ tenant.clone() ],
            "responses": responses(("200", "The figures", schema_ref("CacheStats")), &with(&GUARDED, &[400])),
        },
        "delete": {
            "operationId": "clearCache",
            "summary": "Remove the tenant's cached contexts from this process's caches: those whose query text matches `pattern`, or all.",
            "security": bearer,
            "parameters": [
                tenant.clone(),
                { "name": "pattern", "in": "query", "required": false, "description": "A glob over the query text (`*`, `?`, `[..]`, `{a,b}`; case ignored; at most 512 bytes).", "schema": { "type": "string", "minLength": 1, "maxLength": 512 } },
            ],
            "responses": responses(("200", "How many were removed", schema_ref("CacheCleared")), &with(&GUARDED, &[400])),
        },
    },
    "/v1/reindex": {
        "post": {
            "operationId": "forceReindex",
            "summary": "Start re-embedding the tenant's chunks (those whose source matches `source_pattern`) in place with the job's embedder and BM25 weighting, on this process's shards; one run per process at a time. Chunks that ingest changes meanwhile are left as ingest wrote them.",
            "security": bearer,
            "parameters": [
                tenant.clone(),
                { "name": "source_pattern", "in": "query", "required": false, "description": "A glob over the documents' sources (as `filters.source_pattern`).", "schema": { "type": "string", "minLength": 1, "maxLength": 512 } },
            ],
            "responses": responses(("202", "Started: the run's status", schema_ref("ReindexStatus")), &with(&GUARDED, &[400, 409, 503])),
        },
        "get": {
            "operationId": "reindexStatus",
            "summary": "The tenant's last reindex in this process: running or ended, with its counts.",
            "security": bearer,
            "parameters": [ tenant.clone() ],
            "responses": responses(("200", "The run's status", schema_ref("ReindexStatus")), &with(&GUARDED, &[400, 404])),
        },
    }
    })
}

/// The paths of the standing queries: subscribe, read the latest version, follow the versions as
/// Server-Sent Events, unsubscribe.
fn subscription_paths(bearer: &Value, subscribe: Value) -> Value {
    let id = json!({ "name": "id", "in": "path", "required": true, "description": "The subscription's id (`subscription_id` of its versions).", "schema": { "type": "string" } });
    json!({
    "/v1/subscriptions": { "post": {
        "operationId": "subscribe",
        "summary": "Make a standing query: the job answers the query now (version 1, in the answer) and again whenever its tenant's documents change, publishing a new version only when the context moved (items, order, text, tokens). Once ingest is quiet, the latest version is what POST /v1/query answers for the same query.",
        "security": bearer,
        "requestBody": { "required": true, "content": json_content(subscribe) },
        "responses": responses(("201", "Made: version 1 (Location names the subscription)", schema_ref("Version")), &with(&GUARDED, &[400, 408, 413, 503])),
    }},
    "/v1/subscriptions/{id}": {
        "get": {
            "operationId": "subscription",
            "summary": "The subscription's latest version, and whether a change of its tenant is still to be reflected (`pending`).",
            "security": bearer,
            "parameters": [ id.clone() ],
            "responses": responses(("200", "The subscription", schema_ref("Status")), &GUARDED),
        },
        "delete": {
            "operationId": "unsubscribe",
            "summary": "End the subscription: its event streams end, everything it held is freed.",
            "security": bearer,
            "parameters": [ id.clone() ],
            "responses": responses(("200", "Ended", schema_ref("Unsubscribed")), &GUARDED),
        },
    },
    "/v1/subscriptions/{id}/events": { "get": {
        "operationId": "subscriptionEvents",
        "summary": "Server-Sent Events: one `version` event per version (id: the version number; data: a Version), from the one after `Last-Event-ID` (or `last_event_id`) where it is still kept, else from the oldest kept; an `end` event when the subscription ends; a comment every 15 s.",
        "security": bearer,
        "parameters": [
            id,
            { "name": "Last-Event-ID", "in": "header", "required": false, "description": "The last version received: the stream resumes after it.", "schema": { "type": "integer", "minimum": 0 } },
            { "name": "last_event_id", "in": "query", "required": false, "description": "As the Last-Event-ID header, for clients that cannot set it.", "schema": { "type": "integer", "minimum": 0 } },
        ],
        "responses": {
            "200": { "description": "The event stream", "content": { "text/event-stream": { "schema": { "type": "string" } } } },
            "401": { "description": "A problem: unauthorized", "content": { PROBLEM_JSON: { "schema": schema_ref("Problem") } } },
            "404": { "description": "A problem: not_found", "content": { PROBLEM_JSON: { "schema": schema_ref("Problem") } } },
        },
    }},
    })
}

/// The schemas of the document: the components, and the request bodies that refer to them.
struct Schemas {
    components: serde_json::Map<String, Value>,
    query: Value,
    documents: Value,
    subscribe: Value,
}

/// Requests are described as the job reads them, responses as it writes them; a name with two
/// shapes gives the response's its own name (`…Response`).
fn schemas() -> Schemas {
    let mut requests = generator(false, COMPONENTS);
    let query = requests.subschema_for::<Query>().to_value();
    let documents = requests.subschema_for::<DocumentsRequest>().to_value();
    let subscribe = requests
        .subschema_for::<crate::http::SubscribeRequest>()
        .to_value();
    let mut schemas = requests.take_definitions(true);
    let mut responses_gen = generator(true, COMPONENTS);
    for schema in [
        responses_gen.subschema_for::<Context>(),
        responses_gen.subschema_for::<ContextItem>(),
        responses_gen.subschema_for::<SourcesPage>(),
        responses_gen.subschema_for::<InvalidationsPage>(),
        responses_gen.subschema_for::<Problem>(),
        responses_gen.subschema_for::<DocumentsAccepted>(),
        responses_gen.subschema_for::<crate::http::BatchStatus>(),
        responses_gen.subschema_for::<IndexStatsPage>(),
        responses_gen.subschema_for::<CacheStats>(),
        responses_gen.subschema_for::<CacheCleared>(),
        responses_gen.subschema_for::<ReindexStatus>(),
        responses_gen.subschema_for::<crate::standing::Version>(),
        responses_gen.subschema_for::<crate::standing::Status>(),
        responses_gen.subschema_for::<crate::standing::Unsubscribed>(),
    ] {
        debug_assert!(schema.get("$ref").is_some(), "a named component");
    }
    for (name, schema) in responses_gen.take_definitions(true) {
        match schemas.get(&name) {
            Some(other) if *other != schema => {
                // One name, two shapes: the response's variant gets a name of its own.
                schemas.insert(format!("{name}Response"), schema);
            }
            _ => {
                schemas.insert(name, schema);
            }
        }
    }
    Schemas {
        components: schemas,
        query,
        documents,
        subscribe,
    }
}

/// The OpenAPI 3.1 document of the job's HTTP API.
pub fn document() -> Value {
    let Schemas {
        components: schemas,
        query,
        documents,
        subscribe,
    } = schemas();
    let bearer = json!([{ "bearer": [] }]);
    let tenant = |required: bool, description: &str| {
        json!({
            "name": "tenant", "in": "query", "required": required,
            "description": description, "schema": { "type": "string" },
        })
    };
    let mut document = json!({
        "openapi": "3.1.0",
        "info": {
            "title": "ragstream",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Token-budgeted contexts from a retrieval index kept fresh by a stream job. \
                Every error is a problem (RFC 9457, application/problem+json) whose `type` is \
                `urn:ragstream:problem:<name>`. The agent tools are served at /mcp (Model Context \
                Protocol, streamable HTTP), outside this document.",
            "license": { "name": "Apache-2.0", "identifier": "Apache-2.0" },
        },
        "paths": {
            "/healthz": { "get": {
                "operationId": "healthz", "summary": "The process is up.",
                "responses": { "200": text_response("`ok`") },
            }},
            "/readyz": { "get": {
                "operationId": "readyz",
                "summary": "Index open, model loaded, broker reachable; a line per check and per outage being retried.",
                "responses": { "200": text_response("Ready"), "503": text_response("Not ready") },
            }},
            "/metrics": { "get": {
                "operationId": "metrics", "summary": "Prometheus metrics (text exposition format).",
                "responses": { "200": text_response("The metrics") },
            }},
            "/v1/openapi.json": { "get": {
                "operationId": "openapi", "summary": "This document.",
                "responses": { "200": { "description": "The OpenAPI document", "content": json_content(json!({ "type": "object" })) } },
            }},
            "/v1/query": { "post": {
                "operationId": "query",
                "summary": "Answer a query with a context packed into its token budget (or another mode's answer).",
                "description": "The body is a query event, as on the queries topic. With a tenant-bound token the tenant must be one of the token's and `acl` at most its labels (absent: the token's labels).",
                "security": bearer,
                "requestBody": { "required": true, "content": json_content(query) },
                "responses": responses(("200", "The context", schema_ref("Context")), &with(&GUARDED, &[400, 408, 413, 422, 503, 504])),
            }},
            "/v1/documents": { "post": {
                "operationId": "upsertDocuments",
                "summary": "Write a batch of document upserts and deletes (at most 1000).",
                "description": "Each document is checked as the documents topic's decoder checks it; a batch with any refusal is answered with every refusal (`errors`) and nothing of it is written. Kafka mode: 202 once the broker acknowledged every event (the job indexes them as it reads the topic). Local mode: 200 once the index acknowledged every document, or 202 with the batch's status link once `wait` passed; each tenant's batches queue apart and take turns, at most 4 of a tenant's being written at once (503 `busy` beyond). The tenant may be left out where the token opens exactly one.",
                "security": bearer,
                "parameters": [wait_param()],
                "requestBody": { "required": true, "content": json_content(documents) },
                "responses": documents_responses(&[422]),
            }},
            "/v1/batches/{id}": { "get": {
                "operationId": "batchStatus",
                "summary": "Where a batch posted in local mode stands: queued, indexed or stopped.",
                "security": bearer,
                "parameters": [
                    { "name": "id", "in": "path", "required": true, "description": "The batch's id (from the `status` link of a 202).", "schema": { "type": "integer", "minimum": 1 } },
                ],
                "responses": responses(("200", "The batch's state", schema_ref("BatchStatus")), &GUARDED),
            }},
            "/v1/documents/{doc_id}": { "delete": {
                "operationId": "deleteDocument",
                "summary": "Delete one document and every chunk of it.",
                "security": bearer,
                "parameters": [
                    { "name": "doc_id", "in": "path", "required": true, "description": "The document's id (percent-encoded).", "schema": { "type": "string" } },
                    tenant(false, "The tenant (may be left out when the token opens exactly one)."),
                    { "name": "version", "in": "query", "required": false, "description": "Ignored when the index holds a newer version.", "schema": { "type": "integer", "minimum": 0 } },
                    wait_param(),
                ],
                "responses": documents_responses(&[]),
            }},
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer",
                "description": "A token of `http.query_token_env` (every tenant) or of `http.tokens` (its tenants and ACL labels). Not needed when the job has none set and listens on loopback." } },
        },
    });
    let tenant_param = tenant(
        false,
        "The tenant (may be left out when the token opens exactly one).",
    );
    for more in [
        read_paths(&bearer, &tenant_param),
        subscription_paths(&bearer, subscribe),
    ] {
        if let (Some(paths), Value::Object(more)) = (document["paths"].as_object_mut(), more) {
            paths.extend(more);
        }
    }
    document
}

/// The JSON Schema of one topic's messages: file name and schema.
fn topic_schema<T: JsonSchema>(
    serialize: bool,
    id: &str,
    title: &str,
    description: &str,
) -> (String, Value) {
    let mut schema = generator(serialize, "/$defs")
        .into_root_schema_for::<T>()
        .to_value();
    if let Value::Object(object) = &mut schema {
        object.insert("$id".into(), json!(format!("urn:ragstream:schema:{id}")));
        object.insert("title".into(), json!(title));
        object.insert("description".into(), json!(description));
    }
    (format!("{id}.schema.json"), schema)
}

/// The JSON Schemas of the topics' messages (file name → schema).
pub fn topic_schemas() -> Vec<(String, Value)> {
    vec![
        topic_schema::<DocumentEvent>(false, "document-event", "Document event",
            "The value of a documents-topic message (key `tenant/doc_id`; a message with a key and no value deletes that document), a line of a JSONL source and an item of the ingest API."),
        topic_schema::<Query>(false, "query", "Query event",
            "The value of a queries-topic message, and the body of POST /v1/query."),
        topic_schema::<crate::standing::event::StandingQueryEvent>(false, "standing-query", "Standing query event",
            "A queries-topic message that subscribes to a query (or, with standing.end, unsubscribes): a query event with a `standing` object."),
        topic_schema::<crate::standing::Version>(true, "standing-version", "Standing query version",
            "The value of a contexts-topic message keyed by a subscription id: one version of a standing query's context. A message with that key and no value (a tombstone) says the subscription ended."),
        topic_schema::<Context>(true, "context", "Context",
            "The value of a contexts-topic message (key: the query id), and the body of POST /v1/query's answer."),
        topic_schema::<Invalidation>(true, "invalidation", "Invalidation",
            "The value of an invalidations-topic message: a published context that index writes made stale."),
        topic_schema::<DlqHeaders>(true, "dlq-headers", "DLQ record headers",
            "The headers of a DLQ-topic message, as an object of header name to UTF-8 value; the message's key and value are the refused message's own."),
        topic_schema::<DlqLine>(true, "dlq-line", "DLQ file record",
            "A line of the file DLQ (dlq.path)."),
    ]
}

/// `value` as committed: pretty JSON with a final newline.
pub fn pretty(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed files are what the types generate: run `ragstream openapi > docs/openapi.json`
    /// and `ragstream schemas docs/schemas` after changing a wire type.
    #[test]
    fn committed_documents_match_the_types() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
        let committed = std::fs::read_to_string(root.join("openapi.json")).unwrap_or_default();
        assert!(
            committed == pretty(&document()),
            "docs/openapi.json is stale: run `cargo run -- openapi > docs/openapi.json`"
        );
        for (name, schema) in topic_schemas() {
            let committed =
                std::fs::read_to_string(root.join("schemas").join(&name)).unwrap_or_default();
            assert!(
                committed == pretty(&schema),
                "docs/schemas/{name} is stale: run `cargo run -- schemas docs/schemas`"
            );
        }
    }

    #[test]
    fn every_reference_resolves() {
        let document = document();
        let mut refs = Vec::new();
        collect_refs(&document, &mut refs);
        assert!(refs.len() > 10, "{refs:?}");
        for reference in refs {
            let pointer = reference.trim_start_matches('#');
            assert!(document.pointer(pointer).is_some(), "{reference} resolves");
        }
        for (name, schema) in topic_schemas() {
            let mut refs = Vec::new();
            collect_refs(&schema, &mut refs);
            for reference in refs {
                let pointer = reference.trim_start_matches('#');
                assert!(schema.pointer(pointer).is_some(), "{name}: {reference}");
            }
        }
    }

    fn collect_refs(value: &Value, refs: &mut Vec<String>) {
        match value {
            Value::Object(object) => {
                if let Some(Value::String(reference)) = object.get("$ref") {
                    refs.push(reference.clone());
                }
                object.values().for_each(|v| collect_refs(v, refs));
            }
            Value::Array(values) => values.iter().for_each(|v| collect_refs(v, refs)),
            _ => {}
        }
    }
}
