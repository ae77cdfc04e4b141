//! The agent tools over MCP, driven by a real MCP client (the PyPI package `mcp`, installed by
//! `deploy/scripts/install/mcp-client.sh`, which the test command runs): over streamable HTTP at
//! `/mcp` of a running job with a tenant-bound token, then over stdio (`ragstream mcp`). The client
//! lists the tools and calls each one; the tenant comes from the credential.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::job::{http_post_json_with, Job};
use serde_json::{json, Value};

const HANDBOOK: &str = "# Operations handbook\n\n## Deployment\n\nReleases ship every Tuesday through the deployctl pipeline. Each release is tagged with its version.\n\n## Rollback\n\nTo roll back a release, run `deployctl rollback --to <version>` from the ops bastion. A rollback takes about four minutes and pages the on-call engineer.\n";
const FAQ: &str = "The Acme office is located in Lisbon, near the river. Visitors sign in at the front desk.\n\nThe cafeteria opens at eight. Coffee is free for employees and visitors.";
const GLOBEX: &str = "Project zebra-quasar is the secret launch codename of Globex. To roll back a release at Globex, run deployctl rollback as well.";

const TOOLS: [&str; 13] = [
    "rag_search",
    "rag_subscribe",
    "rag_unsubscribe",
    "rag_search_deep",
    "rag_search_files",
    "rag_read_chunk",
    "rag_list_sources",
    "sql_search",
    "sql_search_compact",
    "get_index_stats",
    "get_cache_stats",
    "clear_cache",
    "force_reindex",
];

/// Thirty incident reports of about 150 tokens each: more chunks than a deep search returns by default.
fn incidents() -> String {
    (0..30)
        .map(|i| {
            format!(
                "Incident {i} began when storage node db-{i} raised a disk alarm at {h:02}:{m:02}. \
                 The on-call engineer found the write-ahead log of shard {s} filling volume v{i} and \
                 rotated it; replication lag on replica r{i} peaked at {lag} seconds before it caught \
                 up. The alarm cleared after {dur} minutes. Follow-up {i}: move the log of shard {s} \
                 to its own volume, alert at {pct} percent instead of 95, and add node db-{i} to the \
                 weekly capacity review. No customer data was lost and no request failed during \
                 incident {i}; the status page stayed green throughout the {dur} minutes.",
                h = i % 24,
                m = (i * 7) % 60,
                s = i * 3,
                lag = 10 + i * 4,
                dur = 5 + i,
                pct = 70 + i % 20,
            )
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

fn event(tenant: &str, doc_id: &str, kind: &str, title: &str, text: &str) -> String {
    json!({
        "op": "upsert", "tenant": tenant, "doc_id": doc_id, "version": 1,
        "source": format!("{tenant}/{doc_id}"), "kind": kind, "title": title, "text": text,
    })
    .to_string()
}

fn warehouse() -> String {
    json!({"tables": [
        {"database": "shop", "schema": "public", "table_name": "orders", "row_count": 1200,
         "columns": [{"name": "id", "type": "bigint"}, {"name": "customer_id", "type": "bigint"},
                     {"name": "total_cents", "type": "integer", "distribution": {"mean": 4312}}],
         "sample_rows": [{"id": 1, "customer_id": 7, "total_cents": 990}]},
        {"database": "shop", "schema": "public", "table_name": "customers", "row_count": 880,
         "columns": [{"name": "id", "type": "bigint"}, {"name": "email", "type": "text"}]}
    ]})
    .to_string()
}

fn python() -> PathBuf {
    PathBuf::from(std::env::var_os("RAGSTREAM_MCP_PYTHON").expect(
        "RAGSTREAM_MCP_PYTHON unset: run deploy/scripts/install/mcp-client.sh (the test command does)",
    ))
}

fn client_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/mcp/client.py")
}

/// The calls every transport makes: each tool, a read of the first chunk found, a filter, and a
/// tenant the credential does not open.
fn calls() -> Value {
    json!([
        ["search", "rag_search", {"query": "How do I roll back a release?", "token_budget": 300, "k": 5}],
        ["read", "rag_read_chunk", {"chunk_id": "$chunk"}],
        ["deep", "rag_search_deep", {"query": "rollback", "k": 2, "doc_filter": {"doc_ids": ["handbook"]}}],
        ["filtered", "rag_search", {"query": "rollback", "doc_filter": {"source_prefix": "acme/faq"}}],
        ["pattern", "rag_search", {"query": "rollback", "doc_filter": "*/h*k"}],
        ["pattern_field", "rag_search_deep", {"query": "rollback", "doc_filter": {"source_pattern": "acme/{faq,warehouse}"}}],
        ["sources", "rag_list_sources", {}],
        ["sql", "sql_search", {"query": "orders per customer", "detail": "compact", "k": 1}],
        ["sql_full", "sql_search", {"query": "orders per customer", "detail": "full", "k": 1}],
        ["sql_rows", "sql_search", {"query": "orders per customer", "k": 1, "include_samples": true}],
        ["sql_dist", "sql_search", {"query": "orders per customer", "k": 1, "compact": false, "include_samples": false}],
        ["sql_compact_tool", "sql_search_compact", {"query": "orders per customer", "k": 1}],
        ["sql_far", "sql_search", {"query": "weather forecast for the mountains tomorrow"}],
        ["sql_far_open", "sql_search", {"query": "weather forecast for the mountains tomorrow", "score_threshold": -1.0}],
        ["search_plain", "rag_search", {"query": "storage node disk alarm incident", "token_budget": 1500, "doc_filter": {"doc_ids": ["incidents"]}}],
        ["search_fill", "rag_search", {"query": "storage node disk alarm incident", "token_budget": 1500, "doc_filter": {"doc_ids": ["incidents"]}, "fill": true}],
        ["search_full", "rag_search", {"query": "storage node disk alarm incident", "token_budget": 1500, "doc_filter": {"doc_ids": ["incidents"]}, "return_full": true}],
        ["search_far", "rag_search", {"query": "weather forecast for the mountains tomorrow", "score_threshold": 0.9}],
        ["sources_page", "rag_list_sources", {"limit": 2}],
        ["sources_next", "rag_list_sources", {"limit": 2, "cursor": "$cursor"}],
        ["deep_default", "rag_search_deep", {"query": "storage node disk alarm incident", "doc_filter": {"doc_ids": ["incidents"]}}],
        ["other_tenant", "rag_search", {"query": "zebra-quasar codename", "tenant": "globex"}],
        ["meta", "rag_search", {"query": "rollback", "doc_filter": {"metadata": {"team": {"any": ["support", "sales"]}, "year": {"gte": 2024}}}}],
        ["meta_eq", "rag_search_deep", {"query": "rollback", "k": 3, "doc_filter": {"metadata": {"team": "ops"}}}],
        ["meta_none", "rag_search", {"query": "rollback", "doc_filter": {"metadata": {"published": {"lte": "2000-01-01"}}}}],
        ["meta_bad", "rag_search", {"query": "rollback", "doc_filter": {"metadata": {"year": 1.5}}}],
        ["plain_fast", "rag_search", {"query": "storage node disk alarm incident", "token_budget": 1500, "doc_filter": {"doc_ids": ["incidents"]}, "preset": "fast"}],
        ["deep_fast", "rag_search_deep", {"query": "storage node disk alarm incident", "k": 3, "preset": "fast"}],
        ["preset_unknown", "rag_search", {"query": "rollback", "preset": "fastest"}],
        ["hyde_args", "rag_search", {"query": "storage node disk alarm incident", "doc_filter": {"doc_ids": ["incidents"]}, "hyde": "hyde", "num_hypotheses": 2}],
        ["files", "rag_search_files", {"query": "How do I roll back a release?", "k": 3}],
        ["files_team", "rag_search_files", {"query": "rollback release", "file_key": "metadata.team", "pool": 40}],
        ["files_pool", "rag_search_files", {"query": "storage node disk alarm incident", "pool": 1}],
        ["files_wide", "rag_search_files", {"query": "storage node disk alarm incident", "pool": 200}],
        ["files_bad_key", "rag_search_files", {"query": "rollback", "file_key": "path"}],
        ["index_stats", "get_index_stats", {}],
        ["reindex", "force_reindex", {"wait": true}],
        ["reindex_pattern", "force_reindex", {"source_pattern": "acme/h*", "wait": true}],
        ["reindex_bad", "force_reindex", {"source_pattern": "[unclosed"}],
        ["search_reindexed", "rag_search_deep", {"query": "how long does a deployctl roll back take", "k": 2}],
        ["cache_stats", "get_cache_stats", {}],
        ["cache_clear", "clear_cache", {"pattern": "*ROLLBACK*"}],
        ["cache_after", "get_cache_stats", {}],
        ["cache_bad", "clear_cache", {"pattern": "[unclosed"}],
        ["cache_all", "clear_cache", {}],
        ["cache_none", "get_cache_stats", {}],
    ])
}

fn run_client(args: &[&str], mode: &str) -> Value {
    run_script(&client_script(), args, mode, &[])
}

/// Runs an MCP client `script` with `args` in protocol `mode` (and `env`); what it printed.
fn run_script(script: &Path, args: &[&str], mode: &str, env: &[(&str, &str)]) -> Value {
    let output = Command::new(python())
        .arg(script)
        .args(args)
        .env("MCP_CLIENT_MODE", mode)
        .env("RAGSTREAM_MODEL_DIR", crate::common::model_dir())
        .envs(env.iter().copied())
        .output()
        .expect("the MCP client runs");
    assert!(
        output.status.success(),
        "{mode}: MCP client failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "client output is not JSON ({error}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// What both transports must show.
fn check(seen: &Value, transport: &str) {
    let tools = seen["tools"].as_object().expect("tools");
    let mut names: Vec<&str> = tools.keys().map(String::as_str).collect();
    names.sort_unstable();
    let mut expected = TOOLS.to_vec();
    expected.sort_unstable();
    assert_eq!(names, expected, "{transport}: the tools listed");
    let properties = |tool: &str| -> Vec<String> {
        tools[tool]["input_schema"]["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("{transport}: {tool} has a JSON schema"))
            .keys()
            .cloned()
            .collect()
    };
    for field in [
        "query",
        "token_budget",
        "k",
        "score_threshold",
        "doc_filter",
        "tenant",
        "fill",
        "return_full",
    ] {
        assert!(
            properties("rag_search").contains(&field.to_string()),
            "{transport}: rag_search takes {field}"
        );
    }
    assert_eq!(
        tools["rag_search"]["input_schema"]["required"],
        json!(["query"])
    );
    assert!(properties("rag_read_chunk").contains(&"chunk_id".to_string()));
    for field in [
        "detail",
        "compact",
        "include_samples",
        "include_distributions",
        "score_threshold",
        "k",
    ] {
        assert!(
            properties("sql_search").contains(&field.to_string()),
            "{transport}: sql_search takes {field}"
        );
    }
    assert!(properties("sql_search_compact").contains(&"k".to_string()));
    for field in ["query", "k", "pool", "file_key", "doc_filter", "tenant"] {
        assert!(
            properties("rag_search_files").contains(&field.to_string()),
            "{transport}: rag_search_files takes {field}"
        );
    }

    let call = |label: &str| -> &Value { &seen["calls"][label] };
    let ok = |label: &str| {
        assert_eq!(
            call(label)["is_error"],
            false,
            "{transport}: {label}: {}",
            call(label)
        );
    };
    for label in [
        "search",
        "read",
        "deep",
        "filtered",
        "sources",
        "sql",
        "sql_full",
        "sql_rows",
        "sql_dist",
        "sql_compact_tool",
        "sql_far",
        "sql_far_open",
        "deep_default",
        "search_plain",
        "search_fill",
        "search_far",
        "search_full",
        "sources_page",
        "sources_next",
    ] {
        ok(label);
    }
    // rag_search: a packed, bounded context with its sources, for the credential's tenant.
    let search = call("search");
    let text = search["text"].as_str().expect("text");
    assert!(
        text.contains("deployctl rollback"),
        "{transport}: search text {text}"
    );
    assert!(
        text.contains("Source: acme/handbook"),
        "{transport}: {text}"
    );
    assert!(!text.contains("zebra-quasar"), "{transport}: other tenant");
    let structured = &search["structured"];
    assert_eq!(structured["tenant"], "acme");
    assert_eq!(structured["mode"], "bounded");
    assert!(structured["tokens_used"].as_u64().expect("tokens") <= 300);
    let first = structured["items"][0]["chunk_id"]
        .as_str()
        .expect("an item");
    // Counts and sizes: what came back of what was found, and each item packed and whole.
    let items = structured["items"].as_array().expect("items");
    assert!(items.len() <= 5, "{transport}: k = 5");
    assert_eq!(
        structured["chunks_returned"],
        json!(items.len()),
        "{transport}"
    );
    assert!(structured["chunks_available"].as_u64().expect("available") >= items.len() as u64);
    for item in items {
        assert_eq!(
            item["snippet_tokens"], item["tokens"],
            "{transport}: {item}"
        );
        assert!(
            item["full_tokens"].as_u64().expect("full_tokens") > 0,
            "{item}"
        );
        // Which lanes found it: one of them at least, each named once.
        let lanes = item["lanes"].as_array().expect("lanes");
        assert!(
            !lanes.is_empty() && lanes.len() <= 2 && (lanes[0] == "dense" || lanes[0] == "bm25"),
            "{transport}: {item}"
        );
    }
    // Diversity: the distinct sources among the items, and their share.
    let sources: std::collections::BTreeSet<&str> = items
        .iter()
        .map(|i| i["source"].as_str().expect("source"))
        .collect();
    assert_eq!(
        structured["unique_files"],
        json!(sources.len()),
        "{transport}"
    );
    let ratio = structured["file_diversity_ratio"].as_f64().expect("ratio");
    assert!((ratio - sources.len() as f64 / items.len() as f64).abs() < 1e-6);
    // rag_read_chunk: the whole chunk the search cited.
    let read = call("read");
    assert_eq!(read["structured"]["items"][0]["chunk_id"], first);
    assert!(read["text"]
        .as_str()
        .expect("text")
        .contains("deployctl rollback --to"));
    // rag_search_deep: whole chunks of the filtered document only, no budget.
    let deep = &call("deep")["structured"];
    assert_eq!(deep["mode"], "deep");
    assert!(deep["token_budget"].is_null());
    let deep_items = deep["items"].as_array().expect("items");
    assert!(!deep_items.is_empty() && deep_items.len() <= 2);
    assert!(deep_items.iter().all(|i| i["doc_id"] == "handbook"));
    // doc_filter: a source prefix keeps the search inside the FAQ.
    let filtered = call("filtered")["structured"]["items"]
        .as_array()
        .expect("items")
        .clone();
    assert!(
        filtered.iter().all(|i| i["doc_id"] == "faq"),
        "{filtered:?}"
    );
    // doc_filter as a path pattern (a glob, no literal directory), and as `source_pattern`.
    let pattern = call("pattern")["structured"]["items"]
        .as_array()
        .expect("items")
        .clone();
    assert!(!pattern.is_empty(), "{transport}: {pattern:?}");
    assert!(
        pattern.iter().all(|i| i["doc_id"] == "handbook"),
        "{pattern:?}"
    );
    let chosen = call("pattern_field")["structured"]["items"]
        .as_array()
        .expect("items")
        .clone();
    assert!(!chosen.is_empty(), "{transport}: {chosen:?}");
    assert!(
        chosen
            .iter()
            .all(|i| i["doc_id"] == "faq" || i["doc_id"] == "warehouse"),
        "{chosen:?}"
    );
    // rag_list_sources: acme's documents only.
    let sources = call("sources")["text"].as_str().expect("text");
    for doc in ["acme/handbook", "acme/faq", "acme/warehouse"] {
        assert!(sources.contains(doc), "{transport}: {sources}");
    }
    assert!(!sources.contains("globex"), "{transport}: {sources}");
    // sql_search: compact names the table and its columns; full adds the sample rows.
    let sql = call("sql")["text"].as_str().expect("text");
    assert!(
        sql.contains("orders") && sql.contains("customer_id"),
        "{sql}"
    );
    let sql_full = call("sql_full")["text"].as_str().expect("text");
    assert!(sql_full.len() > sql.len(), "{sql_full}");
    // The table's distribution (mean 4312) and its sample row (total 990), each on its own switch.
    let has = |label: &str, part: &str| call(label)["text"].as_str().expect("text").contains(part);
    assert!(
        !has("sql", "4312") && !has("sql", "990"),
        "{transport}: {sql}"
    );
    assert!(
        has("sql_full", "4312") && has("sql_full", "990"),
        "{sql_full}"
    );
    assert!(
        has("sql_rows", "990") && !has("sql_rows", "4312"),
        "{transport}: samples only"
    );
    assert!(
        has("sql_dist", "4312") && !has("sql_dist", "990"),
        "{transport}: distributions only"
    );
    assert_eq!(call("sql_compact_tool")["text"], call("sql")["text"]);
    // The 0.3 similarity floor leaves an unrelated question with no table; -1 lifts it.
    let tables = |label: &str| call(label)["structured"]["items"].as_array().map(Vec::len);
    assert_eq!(
        tables("sql_far"),
        Some(0),
        "{transport}: {}",
        call("sql_far")
    );
    assert!(
        tables("sql_far_open").unwrap_or(0) > 0,
        "{transport}: {}",
        call("sql_far_open")
    );
    // fill: packed to the budget rather than stopped once the evidence is in.
    let used = |label: &str| {
        call(label)["structured"]["tokens_used"]
            .as_u64()
            .expect("tokens")
    };
    assert!(
        used("search_fill") >= 1200 && used("search_fill") <= 1500,
        "{transport}: filled {} of 1500",
        used("search_fill")
    );
    assert!(used("search_fill") >= used("search_plain"));
    // return_full: whole chunks only, within the budget; without it the items are cut to fit.
    let tiers = |label: &str| -> Vec<Value> {
        call(label)["structured"]["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|i| i["tier"].clone())
            .collect()
    };
    let full = tiers("search_full");
    assert!(
        !full.is_empty() && full.iter().all(|t| t == "full"),
        "{transport}: {full:?}"
    );
    assert!(used("search_full") <= 1500);
    assert!(tiers("search_plain").iter().all(|t| t != "full"));
    // score_threshold: no dense candidate that far from the question, and no word of it indexed.
    assert_eq!(
        call("search_far")["structured"]["items"]
            .as_array()
            .map(Vec::len),
        Some(0),
        "{transport}: {}",
        call("search_far")
    );
    // rag_list_sources with a limit: one page of two documents and the cursor to the next.
    let page = &call("sources_page")["structured"];
    assert_eq!(page["sources"].as_array().map(Vec::len), Some(2), "{page}");
    assert!(page["next_cursor"].is_string(), "{transport}: {page}");
    // ... and the cursor: the next page starts after it (acme has four documents).
    let next = &call("sources_next")["structured"];
    let ids = |page: &Value| -> Vec<String> {
        page["sources"]
            .as_array()
            .expect("sources")
            .iter()
            .map(|s| s["doc_id"].as_str().expect("doc_id").to_string())
            .collect()
    };
    assert_eq!(ids(next).len(), 2, "{transport}: {next}");
    assert!(
        ids(next)[0] > ids(page)[1],
        "{transport}: {page} then {next}"
    );
    // rag_search_deep without k: the design's 20 whole chunks, each with its size.
    let deep_default = &call("deep_default")["structured"];
    let whole = deep_default["items"].as_array().expect("items");
    assert_eq!(whole.len(), 20, "{transport}: {deep_default}");
    assert_eq!(deep_default["chunks_returned"], 20);
    // One document: one file among the twenty.
    assert_eq!(deep_default["unique_files"], 1);
    assert!(
        (deep_default["file_diversity_ratio"]
            .as_f64()
            .expect("ratio")
            - 0.05)
            .abs()
            < 1e-6
    );
    for item in whole {
        assert_eq!(item["doc_id"], "incidents");
        let full = item["full_tokens"].as_u64().expect("full_tokens");
        assert!(
            full > 0 && full <= item["tokens"].as_u64().expect("tokens"),
            "{item}"
        );
    }
    // A tenant the credential does not open: a tool error, nothing of globex's.
    let other = call("other_tenant");
    assert_eq!(other["is_error"], true, "{transport}: {other}");
    assert!(
        other["text"]
            .as_str()
            .unwrap_or_default()
            .contains("may not search tenant globex")
            || other.to_string().contains("may not search tenant globex"),
        "{transport}: {other}"
    );
    assert!(!other.to_string().contains("zebra-quasar"));
    // doc_filter.metadata: the FAQ's team and year select it, and its items carry its metadata.
    let meta = call("meta")["structured"]["items"]
        .as_array()
        .expect("items")
        .clone();
    assert!(!meta.is_empty(), "{transport}: no item");
    for item in &meta {
        assert_eq!(item["doc_id"], "faq", "{transport}: {item}");
        assert_eq!(item["metadata"], json!({"team": "support", "year": 2025}));
    }
    let ops = call("meta_eq")["structured"]["items"]
        .as_array()
        .expect("items")
        .clone();
    assert!(!ops.is_empty(), "{transport}: no item");
    for item in &ops {
        assert_eq!(item["doc_id"], "handbook", "{transport}: {item}");
        assert_eq!(item["metadata"]["published"], "2023-04-01T00:00:00Z");
    }
    let none = &call("meta_none")["structured"]["items"];
    assert_eq!(
        none.as_array().map(Vec::len),
        Some(0),
        "{transport}: {none}"
    );
    let bad = call("meta_bad");
    assert_eq!(bad["is_error"], true, "{transport}: {bad}");
    assert!(bad.to_string().contains("range"), "{transport}: {bad}");
    // preset: `fast` turns section reunification off (the top result is not expanded with its
    // neighbours, as it is at the default); an unknown preset is refused by name.
    assert_eq!(
        tiers("search_plain").first().map(|t| t.as_str()),
        Some(Some("expanded")),
        "{transport}: {}",
        call("search_plain")
    );
    let fast = tiers("plain_fast");
    assert!(
        !fast.is_empty() && fast.iter().all(|t| t != "expanded"),
        "{transport}: {fast:?}"
    );
    assert_eq!(
        call("deep_fast")["structured"]["items"]
            .as_array()
            .map(Vec::len),
        Some(3),
        "{transport}: {}",
        call("deep_fast")
    );
    let unknown = call("preset_unknown");
    assert_eq!(unknown["is_error"], true, "{transport}: {unknown}");
    assert!(
        unknown.to_string().contains("unknown preset"),
        "{transport}: {unknown}"
    );
    // hyde and num_hypotheses: two passages written and used alone (the default writes none).
    let note = |label: &str| {
        call(label)["structured"]["note"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    assert!(
        note("hyde_args").contains("hyde (hyde): 2 hypothetical passage(s)"),
        "{transport}: {}",
        call("hyde_args")
    );
    assert!(!note("search_plain").contains("hyde"), "{transport}");
    check_operations(&call, transport);
    check_files(&call, transport);
    check_reindex(&call, transport);
}

/// `force_reindex`: every chunk of the tenant re-embedded in place (none skipped), or those of the
/// matching sources only; a search finds the same chunks after.
fn check_reindex<'a>(call: &impl Fn(&str) -> &'a Value, transport: &str) {
    let run = &call("reindex")["structured"];
    let chunks = call("index_stats")["structured"]["index_stats"]["chunks"].as_u64();
    assert_eq!(run["running"], false, "{transport}: {run}");
    assert!(run.get("error").is_none(), "{transport}: {run}");
    assert_eq!(run["documents"], 4, "{transport}: {run}");
    assert_eq!(run["chunks"].as_u64(), chunks, "{transport}: {run}");
    assert_eq!(run["rewritten"].as_u64(), chunks, "{transport}: {run}");
    assert_eq!(run["skipped"], 0, "{transport}: {run}");
    let handbook = &call("reindex_pattern")["structured"];
    assert_eq!(
        (&handbook["documents"], &handbook["source_pattern"]),
        (&json!(1), &json!("acme/h*")),
        "{transport}: {handbook}"
    );
    assert_eq!(handbook["rewritten"], handbook["chunks"], "{transport}");
    assert_eq!(call("reindex_bad")["is_error"], true, "{transport}");
    // The re-embedded index still finds the passage (a question no earlier call asked: not cached).
    let first = &call("search_reindexed")["structured"]["items"][0];
    assert_eq!(first["doc_id"], "handbook", "{transport}: {first}");
    assert!(
        first["section_path"].to_string().contains("Rollback"),
        "{transport}: {first}"
    );
}

/// `rag_search_files`: files ranked for a question, grouped by `file_key`, from a `pool` of
/// candidates.
fn check_files<'a>(call: &impl Fn(&str) -> &'a Value, transport: &str) {
    let sources = |label: &str| -> &'a Vec<Value> {
        call(label)["structured"]["sources"]
            .as_array()
            .unwrap_or_else(|| panic!("{transport}: {label}: {}", call(label)))
    };
    let files = sources("files");
    assert!(
        !files.is_empty() && files.len() <= 3,
        "{transport}: {files:?}"
    );
    assert!(
        files.iter().any(|f| f["doc_id"] == "handbook"),
        "{transport}: {files:?}"
    );
    assert!(files.iter().all(|f| f["hits"].as_u64().unwrap() >= 1
        && f["chunks"].as_u64().unwrap() >= f["hits"].as_u64().unwrap()
        && f.get("group").is_none()));
    // By the team in the documents' metadata: ops (the handbook), support (the FAQ), and one group
    // of the documents without a team.
    let teams: Vec<&str> = sources("files_team")
        .iter()
        .map(|f| f["group"].as_str().expect("group"))
        .collect();
    assert!(teams.contains(&"ops"), "{transport}: {teams:?}");
    let ops = sources("files_team")
        .iter()
        .find(|f| f["group"] == "ops")
        .expect("ops");
    assert_eq!(
        (&ops["doc_id"], &ops["documents"]),
        (&json!("handbook"), &json!(1))
    );
    assert!(
        teams.iter().all(|t| ["ops", "support", ""].contains(t)),
        "{transport}: {teams:?}"
    );
    let none = sources("files_team")
        .iter()
        .find(|f| f["group"] == "")
        .expect("the documents without a team");
    assert!(
        none["documents"].as_u64().unwrap() >= 2,
        "{transport}: {none}"
    );
    // A pool of one candidate per lane finds at most two chunks; a pool of 200 every chunk of the
    // incident reports.
    let hits = |label: &str| -> u64 {
        sources(label)
            .iter()
            .map(|f| f["hits"].as_u64().unwrap())
            .sum()
    };
    assert!(
        hits("files_pool") <= 2,
        "{transport}: {}",
        call("files_pool")
    );
    let incidents = sources("files_wide")
        .iter()
        .find(|f| f["doc_id"] == "incidents")
        .expect("incidents");
    assert_eq!(
        incidents["hits"], incidents["chunks"],
        "{transport}: {incidents}"
    );
    assert!(hits("files_wide") > hits("files_pool") + 10, "{transport}");
    assert_eq!(call("files_bad_key")["is_error"], true, "{transport}");
}

/// The operations tools: the index's counts for the caller's tenant, the cache's entries, and
/// clearing by pattern and whole.
fn check_operations<'a>(call: &impl Fn(&str) -> &'a Value, transport: &str) {
    let stats = &call("index_stats")["structured"]["index_stats"];
    let kind = |name: &str| stats["chunks_by_kind"][name].as_u64().unwrap_or(0);
    let chunks = stats["chunks"].as_u64().expect("chunks");
    assert!(
        kind("markdown") > 0 && kind("prose") > 30 && kind("sql_schema") > 0,
        "{transport}: {stats}"
    );
    assert_eq!(
        chunks,
        ["prose", "markdown", "code", "sql_schema"]
            .map(kind)
            .iter()
            .sum::<u64>(),
        "{transport}: {stats}"
    );
    assert_eq!(stats["backend"], "edge", "{transport}: {stats}");
    let entries = |label: &str| {
        call(label)["structured"]["entries"]
            .as_u64()
            .unwrap_or_else(|| panic!("{transport}: {label}: {}", call(label)))
    };
    let cleared = |label: &str| {
        call(label)["structured"]["cleared"]
            .as_u64()
            .unwrap_or_else(|| panic!("{transport}: {label}: {}", call(label)))
    };
    assert!(
        entries("cache_stats") >= 10,
        "{transport}: {}",
        call("cache_stats")
    );
    assert_eq!(
        call("cache_stats")["structured"]["tenant"],
        "acme",
        "{transport}"
    );
    // Six calls above ask about rollback; their contexts are cached, and only theirs go.
    assert!(
        cleared("cache_clear") >= 1,
        "{transport}: {}",
        call("cache_clear")
    );
    assert_eq!(
        entries("cache_after"),
        entries("cache_stats") - cleared("cache_clear"),
        "{transport}"
    );
    assert_eq!(call("cache_bad")["is_error"], true, "{transport}");
    assert_eq!(cleared("cache_all"), entries("cache_after"), "{transport}");
    assert_eq!(entries("cache_none"), 0, "{transport}");
}

/// `event` with a `metadata` object.
fn with_metadata(event: String, metadata: Value) -> String {
    let mut value: Value = serde_json::from_str(&event).expect("event");
    value["metadata"] = metadata;
    value.to_string()
}

#[test]
fn an_mcp_client_lists_and_calls_every_tool_over_http_and_stdio() {
    let dir = tempfile::tempdir().expect("tempdir");
    let events = [
        with_metadata(
            event(
                "acme",
                "handbook",
                "markdown",
                "Operations handbook",
                HANDBOOK,
            ),
            json!({"team": "ops", "year": 2023, "published": "2023-04-01T00:00:00Z"}),
        ),
        with_metadata(
            event("acme", "faq", "prose", "FAQ", FAQ),
            json!({"team": "support", "year": 2025}),
        ),
        event("acme", "warehouse", "sql_schema", "Warehouse", &warehouse()),
        event(
            "acme",
            "incidents",
            "prose",
            "Incident reports",
            &incidents(),
        ),
        event("globex", "secret", "prose", "Globex secrets", GLOBEX),
    ];
    std::fs::write(dir.path().join("events.jsonl"), events.join("\n") + "\n").expect("events");
    // One token, bound to acme; no token opens every tenant (its variable is left unset). HyDE
    // writes passages (the stand-in chat server) only for queries that ask with `hyde`.
    let stand_in = crate::common::endpoints::StandIn::start();
    let config = crate::common::JSONL_SERVING.replace(
        "[http]\n",
        "[http]\nquery_token_env = \"MCP_TEST_ADMIN_TOKEN\"\ntokens = { ACME_TOKEN = [\"acme\"] }\n",
    ) + &format!(
        "[query.hyde]\nenabled = true\nintents = []\n[query.hyde.endpoint]\nurl = \"{}\"\nmodel = \"writer\"\n",
        stand_in.url
    );
    let mut job = Job::start_with_env(dir.path(), &config, 1, &[("ACME_TOKEN", "acme-secret")]);
    job.wait_ready(Duration::from_secs(120));
    job.wait_indexed(5);

    // Without the token, /mcp is refused like /v1/query.
    let (status, _) = http_post_json_with(
        job.http_port,
        "/mcp",
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
        &[],
    )
    .expect("answered");
    assert_eq!(status, 401);

    let url = format!("http://127.0.0.1:{}/mcp", job.http_port);
    let calls = calls().to_string();
    let seen = run_client(&["http", &url, "acme-secret", &calls], "auto");
    assert_eq!(seen["server"], "ragstream");
    eprintln!("MCP over HTTP: protocol {}", seen["protocol"]);
    check(&seen, "http");
    // A client of the earlier revisions (initialize handshake) is served the same tools.
    let legacy = run_client(&["http", &url, "acme-secret", &calls], "legacy");
    eprintln!(
        "MCP over HTTP, legacy client: protocol {}",
        legacy["protocol"]
    );
    assert_ne!(legacy["protocol"], seen["protocol"]);
    check(&legacy, "http (legacy handshake)");
    job.stop();

    // stdio: the client launches `ragstream mcp` on the same index, the tenant named at launch.
    let binary = env!("CARGO_BIN_EXE_ragstream");
    let config_path = dir.path().join("ragstream.toml");
    let config_arg = config_path.display().to_string();
    let seen = run_client(
        &[
            "stdio",
            &calls,
            binary,
            "mcp",
            "--config",
            &config_arg,
            "--tenant",
            "acme",
        ],
        "auto",
    );
    eprintln!("MCP over stdio: protocol {}", seen["protocol"]);
    check(&seen, "stdio");
}

/// Standing queries over MCP with the real Python SDK on stdio: `rag_subscribe` answers version 1
/// and a resource URI; the resource is listed and read; subscribed to (`resources/subscribe` for a
/// client of the 2025 revisions, a `subscriptions/listen` stream for one of 2026-07-28), the client
/// is told with `notifications/resources/updated` when a posted document moves the context, and
/// the read after it holds the new passage; `rag_unsubscribe` ends it and the resource is gone.
#[test]
fn an_mcp_client_is_told_when_its_standing_context_moves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let events = [
        event(
            "acme",
            "handbook",
            "markdown",
            "Operations handbook",
            HANDBOOK,
        ),
        event("acme", "faq", "prose", "FAQ", FAQ),
    ];
    std::fs::write(dir.path().join("events.jsonl"), events.join("\n") + "\n").expect("events");
    let port = crate::common::broker::free_port();
    let config = crate::common::JSONL_SERVING
        .replace("[http]\n", "[http]\ntokens = { ACME_TOKEN = [\"acme\"] }\n")
        .replace("{dir}", &dir.path().display().to_string())
        .replace("{http}", &format!("127.0.0.1:{port}"));
    let config_path = dir.path().join("ragstream.toml");
    std::fs::write(&config_path, config).expect("config");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/mcp/standing.py");
    let documents = format!("http://127.0.0.1:{port}/v1/documents");
    // Each run posts a passage of its own (not a near-duplicate of the other, which dedup drops).
    let passages = [
        ("legacy", "bastion-7", "Emergency rollback: to roll back a release at once, log in to the bastion-7 host and run deployctl rollback --fast."),
        ("auto", "console-9", "Rolling back a release from a laptop: connect the VPN, open the console-9 release page and press Roll back; the previous version is live in a minute."),
    ];
    for (mode, marker, text) in passages {
        let document = json!({
            "tenant": "acme", "doc_id": format!("rollback-{mode}"), "version": 1, "marker": marker,
            "text": text,
        });
        let seen = run_script(
            &script,
            &[
                &documents,
                "acme-secret",
                &document.to_string(),
                env!("CARGO_BIN_EXE_ragstream"),
                "mcp",
                "--config",
                &config_path.display().to_string(),
                "--tenant",
                "acme",
            ],
            mode,
            &[("ACME_TOKEN", "acme-secret")],
        );
        eprintln!("standing over MCP ({mode}): protocol {}", seen["protocol"]);
        assert_eq!(seen["resources_subscribe"], true, "{mode}: {seen}");
        let made = &seen["subscribed"];
        assert_eq!(made["is_error"], false, "{mode}: {seen}");
        assert_eq!(made["structured"]["version"], 1);
        let uri = made["structured"]["uri"].as_str().expect("a uri");
        assert!(uri.starts_with("ragstream://subscriptions/sub-"), "{uri}");
        assert!(
            seen["listed"]
                .as_array()
                .expect("listed")
                .contains(&json!(uri)),
            "{mode}: {seen}"
        );
        assert_eq!(seen["first"]["latest"]["version"], 1);
        assert_eq!(seen["first"]["tenant"], "acme");
        assert_eq!(seen["posted"], 200, "{mode}: {seen}");
        let moved = &seen["moved"];
        assert!(
            moved.is_object(),
            "{mode}: not told of a version holding the new passage within 90 s: {seen}"
        );
        assert!(
            moved["latest"]["version"].as_u64() >= Some(2),
            "{mode}: {seen}"
        );
        assert!(
            seen["notified"]
                .as_array()
                .is_some_and(|told| !told.is_empty() && told.iter().all(|u| u == uri)),
            "{mode}: {seen}"
        );
        assert_eq!(seen["unsubscribed"]["is_error"], false, "{mode}: {seen}");
        assert_ne!(seen["read_after_end"], "read", "{mode}: {seen}");
    }
}
