//! The query flow through a real Kafka-protocol broker (Tansu): documents of two tenants in on the
//! documents topic, queries in on the queries topic, contexts out on the contexts topic, for every mode.
//! Tenant A's queries never see tenant B's chunks; a read-your-writes query sent right after a document
//! update sees the update; a malformed query lands in the DLQ and a bad one gets an error context.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::common::broker::Broker;
use crate::common::job::{metric, Job};
use ragstream_core::query::modes::ReserveFrom;
use ragstream_core::query::{Context, Tier};
use serde_json::{json, Value};

const DOCS: &str = "docs";
const QUERIES: &str = "queries";
const CONTEXTS: &str = "contexts";
const DLQ: &str = "dlq";

fn config(broker: &Broker) -> String {
    crate::common::kafka_config(
        &broker.bootstrap(),
        &format!(
            "documents_topic = \"{DOCS}\"\nqueries_topic = \"{QUERIES}\"\ncontexts_topic = \"{CONTEXTS}\"\ndlq_topic = \"{DLQ}\"\ngroup_id = \"ragstream-query-it\""
        ),
        "",
    )
}

fn document(
    tenant: &str,
    doc_id: &str,
    version: u64,
    kind: &str,
    title: &str,
    text: &str,
) -> (String, Option<Vec<u8>>) {
    let value = json!({
        "op": "upsert", "tenant": tenant, "doc_id": doc_id, "version": version,
        "source": format!("{tenant}/{doc_id}"), "kind": kind, "title": title, "text": text,
    });
    (
        format!("{tenant}/{doc_id}"),
        Some(value.to_string().into_bytes()),
    )
}

const HANDBOOK: &str = "# Operations handbook\n\n## Deployment\n\nReleases ship every Tuesday through the deployctl pipeline. Each release is tagged with its version.\n\n## Rollback\n\nTo roll back a release, run `deployctl rollback --to <version>` from the ops bastion. A rollback takes about four minutes and pages the on-call engineer.\n\n## On-call\n\nThe on-call rotation changes every Monday at 09:00 Lisbon time.\n";

const BILLING: &str = "/// Sums the line items of an invoice, in cents.\npub fn compute_invoice_total(items: &[LineItem]) -> u64 {\n    items.iter().map(|item| item.cents * item.quantity).sum()\n}\n\n/// Applies a percentage discount to a total, in cents.\npub fn apply_discount(total: u64, percent: u64) -> u64 {\n    total - total * percent / 100\n}\n";

fn warehouse() -> String {
    let rows: Vec<Value> = (1..=7)
        .map(|i| json!({"id": i, "email": format!("c{i}@example.com")}))
        .collect();
    json!({"tables": [
        {"database": "shop", "schema": "public", "table_name": "orders", "row_count": 1200,
         "columns": [{"name": "id", "type": "bigint", "distribution": {"min": 1, "max": 1200}},
                     {"name": "customer_id", "type": "bigint", "distribution": {"distinct": 880}},
                     {"name": "total_cents", "type": "integer", "distribution": {"mean": 4312}}],
         "sample_rows": rows},
        {"database": "shop", "schema": "public", "table_name": "customers", "row_count": 880,
         "columns": [{"name": "id", "type": "bigint"}, {"name": "email", "type": "text"}]}
    ]})
    .to_string()
}

const FAQ: &str = "The Acme office is located in Lisbon, near the river. Visitors sign in at the front desk.\n\nThe cafeteria opens at eight. Coffee is free for employees and visitors.";

const GLOBEX: &str = "Project zebra-quasar is the secret launch codename of Globex. To roll back a release at Globex, run deployctl rollback as well; the Globex rollback takes nine minutes.";

/// The first `total` contexts on the contexts topic, by query id; waits until `wanted` are among them.
fn contexts(broker: &Broker, wanted: &[&str], total: usize) -> HashMap<String, Context> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut by_id = HashMap::new();
        for (key, value, _) in broker.read_all(CONTEXTS, total) {
            let context: Context =
                serde_json::from_slice(&value.expect("value")).expect("context JSON");
            assert_eq!(
                key.as_deref(),
                Some(context.query_id.as_bytes()),
                "keyed by query id"
            );
            by_id.insert(context.query_id.clone(), context);
        }
        if wanted.iter().all(|id| by_id.contains_key(*id)) {
            return by_id;
        }
        assert!(
            Instant::now() < deadline,
            "contexts missing: have {:?}, want {wanted:?}",
            by_id.keys()
        );
    }
}

fn query(id: &str, tenant: &str, text: &str, extra: Value) -> (String, Option<Vec<u8>>) {
    let mut value = json!({"query_id": id, "tenant": tenant, "text": text});
    for (k, v) in extra.as_object().expect("object") {
        value[k] = v.clone();
    }
    (id.to_string(), Some(value.to_string().into_bytes()))
}

#[test]
fn every_mode_through_kafka_with_tenant_isolation_and_read_your_writes() {
    let broker = Broker::start();
    broker.create_topic(DOCS, 3);
    for topic in [QUERIES, CONTEXTS, DLQ] {
        broker.create_topic(topic, 1);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut job = Job::start(dir.path(), &config(&broker), 1);
    job.wait_ready(Duration::from_secs(120));
    let docs = vec![
        document(
            "acme",
            "handbook.md",
            1,
            "markdown",
            "Operations handbook",
            HANDBOOK,
        ),
        document("acme", "billing.rs", 1, "code", "billing.rs", BILLING),
        document(
            "acme",
            "warehouse",
            1,
            "sql_schema",
            "Warehouse schema",
            &warehouse(),
        ),
        document("acme", "faq", 1, "prose", "FAQ", FAQ),
        document("globex", "secret", 1, "prose", "Globex secrets", GLOBEX),
    ];
    broker.produce(DOCS, &docs);
    job.wait_indexed(5);

    // Round 1: every mode but read_chunk, plus isolation probes.
    broker.produce(
        QUERIES,
        &[
            query("bounded", "acme", "How do I roll back a release?", json!({"trace": true})),
            query("deep", "acme", "deployment and rollback", json!({"mode": "deep", "k": 3})),
            query("list", "acme", "", json!({"mode": "list_sources"})),
            query("list_page", "acme", "", json!({"mode": "list_sources", "k": 3})),
            query("list_last", "acme", "", json!({"mode": "list_sources", "k": 3, "cursor": "handbook.md"})),
            query("files", "acme", "invoice total discount", json!({"mode": "files"})),
            query("sql_compact", "acme", "which table has customer orders", json!({"mode": "sql_compact"})),
            query("sql_full", "acme", "which table has customer orders", json!({"mode": "sql_full"})),
            query("isolation", "acme", "zebra-quasar Globex secret codename", json!({"k": 20, "token_budget": 20000})),
            query("globex", "globex", "zebra-quasar codename", json!({})),
            query("window", "acme", "Where is the Acme office?", json!({"context_window": 400, "prompt": {"system": "Answer briefly.", "template": "Context: {context}", "history": []}})),
            query("budget", "acme", "How do I roll back a release?", json!({"token_budget": 60})),
        ],
    );
    let all = contexts(
        &broker,
        &[
            "bounded",
            "deep",
            "list",
            "list_page",
            "list_last",
            "files",
            "sql_compact",
            "sql_full",
            "isolation",
            "globex",
            "window",
            "budget",
        ],
        12,
    );
    for context in all.values() {
        assert!(
            context.error.is_none(),
            "{}: {:?}",
            context.query_id,
            context.error
        );
        if let Some(budget) = context.token_budget {
            assert!(
                context.tokens_used <= budget,
                "{} over budget",
                context.query_id
            );
        }
        assert!(context.latency_ms.contains_key("total"));
        assert!(context.index_watermark.frontier_ms > 0);
    }
    let bounded = &all["bounded"];
    assert_eq!(bounded.mode_name(), "bounded");
    assert_eq!(bounded.token_budget, Some(3000));
    assert!(
        bounded
            .context
            .contains("deployctl rollback --to <version>"),
        "{}",
        bounded.context
    );
    assert!(bounded.context.starts_with(&format!(
        "{}Source: acme/handbook.md (lines ",
        ragstream_core::query::pack::UNTRUSTED_OPEN
    )));
    assert!(bounded.context.ends_with("</retrieved-context>"));
    assert_eq!(bounded.items[0].tier, Tier::Expanded);
    assert_eq!(bounded.intent_name(), "procedure");
    let trace = bounded.trace.as_ref().expect("trace asked for");
    assert!(!trace.candidates.is_empty() && !trace.decisions.is_empty());
    assert!(
        trace
            .candidates
            .iter()
            .any(|c| c.dense.is_some() && c.bm25.is_some()),
        "both lanes in the trace"
    );
    // A procedure leans on the dense lane, which is read deeper (24) than BM25 (the floor, 20).
    let depth = trace.depth.expect("lane depths in the trace");
    assert_eq!((depth.dense, depth.bm25), (24, 20));
    let budget = &all["budget"];
    assert!(budget.tokens_used <= 60 && budget.truncated && !budget.items.is_empty());

    let deep = &all["deep"];
    assert!(deep.token_budget.is_none() && deep.items.len() <= 3 && !deep.items.is_empty());
    assert!(deep
        .note
        .as_deref()
        .unwrap_or("")
        .contains("no token budget"));
    assert!(deep.items.iter().all(|i| i.tier == Tier::Full));

    let list = &all["list"];
    let listed: Vec<&str> = list.sources.iter().map(|s| s.doc_id.as_str()).collect();
    assert_eq!(
        listed,
        vec!["billing.rs", "faq", "handbook.md", "warehouse"]
    );
    assert_eq!(
        list.sources
            .iter()
            .find(|s| s.doc_id == "warehouse")
            .map(|s| s.chunks),
        Some(2)
    );
    assert_eq!(list.next_cursor, None, "one page holds them all");
    // Paged: three documents and a cursor, then the rest after it and no cursor.
    let page = &all["list_page"];
    let paged: Vec<&str> = page.sources.iter().map(|s| s.doc_id.as_str()).collect();
    assert_eq!(paged, vec!["billing.rs", "faq", "handbook.md"]);
    assert_eq!(page.next_cursor.as_deref(), Some("handbook.md"));
    let last = &all["list_last"];
    assert_eq!(last.sources, list.sources[3..].to_vec());
    assert_eq!(last.next_cursor, None);

    assert_eq!(
        all["files"].sources.first().map(|s| s.doc_id.as_str()),
        Some("billing.rs")
    );

    let compact = &all["sql_compact"];
    assert!(
        compact
            .context
            .contains("Table shop.public.orders (1200 rows)"),
        "{}",
        compact.context
    );
    assert!(compact.context.contains("- total_cents integer"));
    assert!(!compact.context.contains("mean") && !compact.context.contains("Sample rows"));
    let full = &all["sql_full"];
    assert!(full.context.contains("\"mean\":4312") && full.context.contains("c5@example.com"));
    assert!(
        !full.context.contains("c6@example.com"),
        "at most 5 sample rows"
    );

    // Tenant isolation: acme never sees globex's chunk, even when asking for its words with a huge budget.
    let isolation = &all["isolation"];
    assert!(!isolation.context.contains("zebra-quasar"));
    assert!(isolation
        .items
        .iter()
        .all(|i| !i.source.starts_with("globex/")));
    assert!(all["globex"].context.contains("zebra-quasar"));
    assert!(all["globex"]
        .items
        .iter()
        .all(|i| i.source.starts_with("globex/")));

    let window = &all["window"];
    let budget_from_window = window.token_budget.expect("derived budget");
    let prompt = window.base_tokens.expect("base_tokens");
    let reserve = window.generation_budget.expect("generation_budget");
    assert!(prompt > 0, "the prompt's tokens");
    // The reserve: a quarter of what the prompt leaves of the window.
    assert_eq!(reserve, (400 - prompt) / 4);
    assert_eq!(
        budget_from_window,
        400 - prompt - reserve - 32,
        "window − prompt − reserve − margin"
    );
    assert!(window.max_new_tokens.expect("max_new_tokens") >= reserve);
    let meta = window.meta.as_ref().expect("meta with a context window");
    assert_eq!(
        (meta.context_window, meta.remaining, meta.safety_margin),
        (400, 400 - prompt, 32)
    );
    assert_eq!(meta.reserve_from, ReserveFrom::ReserveRatio);
    assert!(bounded.meta.is_none(), "no window, no meta");
    assert!(window.context.contains("Lisbon"));

    // Round 2: read_chunk by an id from round 1, an unknown id, read-your-writes, bad queries.
    let chunk_id = bounded.items[0].chunk_id.clone();
    broker.produce(
        DOCS,
        &[document(
            "acme",
            "faq",
            2,
            "prose",
            "FAQ",
            "The Acme office moved to Porto in 2026, next to the quokka statue. The cafeteria opens at nine.",
        )],
    );
    broker.produce(
        QUERIES,
        &[
            query(
                "ryw",
                "acme",
                "Where is the Acme office?",
                json!({"consistency": "read_your_writes"}),
            ),
            query("read", "acme", &chunk_id, json!({"mode": "read_chunk"})),
            query(
                "unknown",
                "acme",
                "00000000-0000-0000-0000-000000000000",
                json!({"mode": "read_chunk"}),
            ),
            query("stolen", "globex", &chunk_id, json!({"mode": "read_chunk"})),
            query("bad-k", "acme", "x", json!({"k": 0})),
            ("malformed".into(), Some(b"{not json".to_vec())),
        ],
    );
    // 12 from round 1, 5 answers and one error context (without a query id) for the malformed query.
    let all = contexts(&broker, &["ryw", "read", "unknown", "stolen", "bad-k"], 18);
    let ryw = &all["ryw"];
    assert!(
        ryw.context.contains("quokka statue"),
        "read-your-writes missed the update: {}",
        ryw.context
    );
    assert!(
        !ryw.context.contains("near the river"),
        "stale chunk served: {}",
        ryw.context
    );
    assert!(!ryw.index_watermark.offsets.is_empty());
    let read = &all["read"];
    assert_eq!(read.items.len(), 1);
    assert_eq!(read.items[0].chunk_id, chunk_id);
    assert!(read.tokens_used > 0);
    let unknown = all["unknown"]
        .error
        .as_deref()
        .expect("unknown chunk is an error");
    assert!(
        unknown.contains("handbook.md") && unknown.contains("Available documents"),
        "{unknown}"
    );
    // Another tenant cannot read acme's chunk by id, and is not shown acme's documents.
    let stolen = all["stolen"]
        .error
        .as_deref()
        .expect("foreign chunk is an error");
    assert!(!stolen.contains("handbook.md"), "{stolen}");
    assert!(all["bad-k"]
        .error
        .as_deref()
        .unwrap_or("")
        .contains("k must be"));

    let dlq = broker.read_all(DLQ, 2);
    let reasons: Vec<String> = dlq
        .iter()
        .filter_map(|(_, _, headers)| {
            headers
                .iter()
                .find(|(k, _)| k == "reason")
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        })
        .collect();
    assert!(
        reasons.contains(&"malformed_json".to_string()),
        "{reasons:?}"
    );
    assert!(
        reasons.contains(&"invalid_query".to_string()),
        "{reasons:?}"
    );
    // The topics' messages against their committed JSON Schemas: every document event, every
    // query that is JSON (the refused `bad-k` must fail its schema too), every context and the DLQ
    // records' headers.
    let mut cases = Vec::new();
    for (key, value, _) in broker.read_all(DOCS, 6) {
        let value: Value = serde_json::from_slice(&value.expect("an event")).expect("JSON");
        let what = format!(
            "documents {}",
            String::from_utf8_lossy(&key.unwrap_or_default())
        );
        cases.push(crate::api::topic_case("document-event", value, what, true));
    }
    for (_, value, _) in broker.read_all(QUERIES, 18) {
        let Ok(value) = serde_json::from_slice::<Value>(&value.unwrap_or_default()) else {
            continue;
        };
        let id = value["query_id"].as_str().unwrap_or_default().to_string();
        let valid = id != "bad-k";
        cases.push(crate::api::topic_case(
            "query",
            value,
            format!("query {id}"),
            valid,
        ));
    }
    for (_, value, _) in broker.read_all(CONTEXTS, 18) {
        let value: Value = serde_json::from_slice(&value.expect("a context")).expect("JSON");
        let what = format!("context {}", value["query_id"]);
        cases.push(crate::api::topic_case("context", value, what, true));
    }
    for (_, _, headers) in &dlq {
        let object = crate::api::headers_object(headers);
        let what = format!("DLQ headers {}", object["reason"]);
        cases.push(crate::api::topic_case("dlq-headers", object, what, true));
    }
    assert!(cases.len() >= 40, "{} messages", cases.len());
    let report = crate::api::check_schemas(dir.path(), None, &cases);
    println!("topic schemas: {} messages checked\n{report}", cases.len());

    let metrics = job.metrics();
    assert!(metric(&metrics, "ragstream_queries_received_total") >= 16.0);
    let status = job.stop();
    assert!(status.success(), "job stopped with {status}");
}
