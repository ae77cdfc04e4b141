//! Queries under hostile input: tenant isolation over 1000 random queries across 3 tenants with ACLs
//! (every mode, query text full of the other tenants' words, reads of other tenants' chunk ids), and
//! bad requests (over-large budget, negative k, unknown mode, empty text) answered with clear errors.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::common::job::{answer_context, http_get, http_post_json, metric, Job};
use super::common::JSONL_SERVING;
use ragstream_core::query::Context;
use serde_json::{json, Value};

const TENANTS: [&str; 3] = ["acme", "globex", "initech"];
/// ACL of document `d` (empty = visible to the whole tenant).
const DOC_ACLS: [&[&str]; 3] = [&[], &["eng"], &["hr"]];
const WORDS: [&str; 12] = [
    "rollback",
    "invoice",
    "backup",
    "deploy",
    "payroll",
    "vacation",
    "alerts",
    "schema",
    "latency",
    "contract",
    "budget",
    "onboarding",
];

/// A small deterministic generator (xorshift64*), so failures replay.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Each tenant has 12 documents; document `d` carries ACL `DOC_ACLS[d % 3]` and a secret word of its own
/// (`{tenant}secret{d}`) that no other tenant's document contains.
fn events() -> (String, BTreeMap<String, (String, Vec<String>)>) {
    let mut lines = String::new();
    let mut owners = BTreeMap::new();
    for tenant in TENANTS {
        for d in 0..12 {
            let doc_id = format!("{tenant}-doc{d}");
            let acl: Vec<String> = DOC_ACLS[d % 3].iter().map(|s| s.to_string()).collect();
            let topic = WORDS[d % WORDS.len()];
            let text = format!(
                "# {topic} at {tenant}\n\nThe {topic} process of {tenant} is described here. Ask about {tenant}secret{d} only inside {tenant}.\n\n## Details\n\nThe {topic} steps take {d} days and involve the {} team.\n",
                WORDS[(d + 5) % WORDS.len()]
            );
            let event = json!({
                "op": "upsert", "tenant": tenant, "doc_id": doc_id, "version": 1,
                "source": format!("{tenant}/{doc_id}.md"), "kind": "markdown", "title": doc_id,
                "text": text, "acl": acl,
            });
            lines.push_str(&event.to_string());
            lines.push('\n');
            owners.insert(doc_id, (tenant.to_string(), acl));
        }
    }
    (lines, owners)
}

/// The access policy: a chunk is visible to a query of its own tenant when it has no ACL labels, or
/// when the query names one of them. A query that names no labels (no `acl` at all) sees public chunks
/// only: ACLs are closed by default.
fn visible(owner: &(String, Vec<String>), tenant: &str, acl: &Option<Vec<String>>) -> bool {
    let (doc_tenant, doc_acl) = owner;
    let shares_a_label = || {
        acl.as_ref()
            .is_some_and(|labels| doc_acl.iter().any(|l| labels.contains(l)))
    };
    doc_tenant == tenant && (doc_acl.is_empty() || shares_a_label())
}

fn post(port: u16, body: &Value) -> (u16, Context) {
    let (status, text) =
        http_post_json(port, "/v1/query", &body.to_string()).expect("the job answers");
    (status, answer_context(status, &text))
}

#[test]
fn tenant_isolation_under_random_queries_and_clear_errors_for_bad_ones() {
    let (lines, owners) = events();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("events.jsonl"), lines).expect("events");
    let mut job = Job::start(dir.path(), JSONL_SERVING, 1);
    job.wait_ready(Duration::from_secs(120));
    job.wait_for(Duration::from_secs(180), "documents indexed", |m| {
        metric(m, "ragstream_documents_total") >= owners.len() as f64
            && metric(m, "ragstream_in_flight_messages") == 0.0
    });
    let port = job.http_port;

    // Chunk ids of every tenant, read by their owners holding every label.
    let mut chunk_ids: Vec<(String, String)> = Vec::new();
    for tenant in TENANTS {
        let (status, context) = post(
            port,
            &json!({"query_id": format!("ids-{tenant}"), "tenant": tenant, "text": WORDS.join(" "),
                    "mode": "deep", "k": 50, "acl": ["eng", "hr"]}),
        );
        assert_eq!(status, 200, "{:?}", context.error);
        assert!(
            context.items.len() >= 10,
            "{tenant}: {} items",
            context.items.len()
        );
        chunk_ids.extend(
            context
                .items
                .iter()
                .map(|i| (i.chunk_id.clone(), i.doc_id.clone())),
        );
    }

    // 1000 random queries, 8 in flight.
    let acls: [Option<Vec<String>>; 5] = [
        None,
        Some(vec![]),
        Some(vec!["eng".into()]),
        Some(vec!["hr".into()]),
        Some(vec!["eng".into(), "hr".into()]),
    ];
    let modes = [
        "bounded",
        "bounded",
        "bounded",
        "deep",
        "files",
        "list_sources",
        "read_chunk",
    ];
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut requests = Vec::new();
    for i in 0..1000 {
        let tenant = TENANTS[rng.below(3)];
        let acl = acls[rng.below(acls.len())].clone();
        let mode = modes[rng.below(modes.len())];
        let text = if mode == "read_chunk" {
            chunk_ids[rng.below(chunk_ids.len())].0.clone()
        } else {
            // Words of every tenant, including other tenants' secrets.
            let other = TENANTS[rng.below(3)];
            format!(
                "{} {} {other}secret{} {}",
                WORDS[rng.below(WORDS.len())],
                WORDS[rng.below(WORDS.len())],
                rng.below(12),
                other
            )
        };
        let mut body = json!({"query_id": format!("iso-{i}"), "tenant": tenant, "text": text,
                              "mode": mode, "token_budget": 100 + rng.below(2000)});
        if let Some(acl) = &acl {
            body["acl"] = json!(acl);
        }
        requests.push((tenant, acl, mode, body));
    }
    let next = AtomicUsize::new(0);
    let leaks: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let answered = AtomicUsize::new(0);
    let items_checked = AtomicUsize::new(0);
    let foreign_reads_refused = AtomicUsize::new(0);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::SeqCst);
                let Some((tenant, acl, mode, body)) = requests.get(index) else {
                    return;
                };
                let (status, context) = post(port, body);
                let mut found = Vec::new();
                if *mode == "read_chunk" && status != 200 {
                    // An unreadable chunk answers 404 unknown_chunk.
                    assert_eq!(status, 404, "{body}");
                    assert_eq!(
                        context.error_type.as_deref(),
                        Some("unknown_chunk"),
                        "{body}"
                    );
                    foreign_reads_refused.fetch_add(1, Ordering::SeqCst);
                } else {
                    assert_eq!(status, 200, "{body}: {:?}", context.error);
                }
                items_checked.fetch_add(
                    context.items.len() + context.sources.len(),
                    Ordering::SeqCst,
                );
                for item in &context.items {
                    let owner = &owners[&item.doc_id];
                    if !visible(owner, tenant, acl) {
                        found.push(format!("{body} → item {} of {owner:?}", item.doc_id));
                    }
                }
                for source in &context.sources {
                    let visible_source = owners
                        .get(&source.doc_id)
                        .is_some_and(|owner| visible(owner, tenant, acl));
                    if !visible_source || !source.source.starts_with(&format!("{tenant}/")) {
                        found.push(format!("{body} → source {}", source.source));
                    }
                }
                for other in TENANTS.iter().filter(|t| *t != tenant) {
                    if context.context.contains(&format!("{other}secret")) {
                        found.push(format!("{body} → context holds {other}'s text"));
                    }
                }
                answered.fetch_add(1, Ordering::SeqCst);
                leaks.lock().unwrap().extend(found);
            });
        }
    });
    let leaks = leaks.into_inner().unwrap();
    let modes_seen: BTreeSet<&str> = requests.iter().map(|r| r.2).collect();
    println!(
        "FAULT tenant isolation: {} random queries over {} tenants (modes {modes_seen:?}, 5 ACL sets), {} items/sources checked, {} reads of invisible chunks refused, in {:.1} s: leaks = {}/{}",
        answered.load(Ordering::SeqCst),
        TENANTS.len(),
        items_checked.load(Ordering::SeqCst),
        foreign_reads_refused.load(Ordering::SeqCst),
        started.elapsed().as_secs_f64(),
        leaks.len(),
        requests.len()
    );
    assert_eq!(answered.load(Ordering::SeqCst), 1000);
    assert!(
        leaks.is_empty(),
        "{} leaks:\n{}",
        leaks.len(),
        leaks.join("\n")
    );

    // Bad requests: a clear error, HTTP 400, and the job goes on.
    let bad = [
        (
            json!({"query_id": "b1", "tenant": "acme", "text": "x", "token_budget": 50_000_000u64}),
            "token_budget",
        ),
        (
            json!({"query_id": "b2", "tenant": "acme", "text": "x", "k": -1}),
            "k must be",
        ),
        (
            json!({"query_id": "b3", "tenant": "acme", "text": "x", "mode": "psychic"}),
            "psychic",
        ),
        (
            json!({"query_id": "b4", "tenant": "acme", "text": "   "}),
            "text is empty",
        ),
        (
            json!({"query_id": "b5", "tenant": "", "text": "x"}),
            "tenant",
        ),
    ];
    for (body, expected) in &bad {
        let (status, context) = post(port, body);
        let error = context.error.clone().unwrap_or_default();
        assert_eq!(status, 400, "{body}: {error}");
        assert_eq!(
            context.error_type.as_deref(),
            Some("invalid_query"),
            "{body}"
        );
        assert!(error.contains(expected), "{body}: {error}");
        assert_eq!(context.query_id, body["query_id"].as_str().unwrap());
        println!("FAULT bad query {body}: 400 {error}");
    }
    let dlq = std::fs::read_to_string(dir.path().join("dlq.jsonl")).unwrap_or_default();
    assert_eq!(
        dlq.lines().filter(|l| l.contains("invalid_query")).count(),
        bad.len(),
        "each bad query in the DLQ"
    );
    let (status, context) = post(
        port,
        &json!({"query_id": "after", "tenant": "acme", "text": "rollback process"}),
    );
    assert_eq!(status, 200, "{:?}", context.error);
    assert!(!context.items.is_empty());
    assert_eq!(http_get(port, "/healthz").map(|r| r.0), Some(200));
    job.stop();
}
