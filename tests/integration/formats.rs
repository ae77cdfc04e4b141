//! HTML, PDF and DOCX in, end to end: files written by the test (a PDF of three pages, an HTML page
//! with nested headings and navigation, a DOCX with heading styles) sent through `POST /v1/documents`
//! and dropped into a watched directory. A query finds the right page or section and cites it in its
//! items and its context; an edit of one PDF page re-embeds that page's chunk only; a file that cannot
//! be read is refused (422 over HTTP) or dead-lettered (the directory source) with its reason. Files on
//! the documents topic are extracted off the worker and keep their order; a hostile one is
//! dead-lettered with its offset.

use std::time::Duration;

use base64::Engine as _;
use ragstream_core::testing::{docx_file, pdf_file};
use serde_json::{json, Value};

use crate::common::job::{http_post_json_with, metric, Job};

const TOKEN: &str = "formats-token-6e1d94b2";

/// Three pages on three subjects, each short enough to be one chunk.
fn report_pages(refund_days: u32) -> [String; 3] {
    [
        "Harbour report\n\nThe northern ferry crosses the fjord every morning at seven.\nIt carries forty cars and two hundred passengers.".into(),
        "Ticket prices\n\nA single crossing costs twelve euros for adults.\nChildren under six travel free of charge.".into(),
        format!("Refund policy\n\nCancelled crossings are refunded within {refund_days} days.\nClaims are filed at the harbour office."),
    ]
}

fn report(refund_days: u32) -> Vec<u8> {
    let pages = report_pages(refund_days);
    pdf_file(&pages.each_ref().map(String::as_str))
}

const GUIDE_HTML: &str = r#"<!DOCTYPE html><html><head><title>Island guide</title>
<style>.x { color: red }</style><script>var lighthouse = "never indexed";</script></head>
<body><nav><a href="/">Home</a> <a href="/lighthouse">Lighthouse tours</a></nav>
<h1>Island guide</h1><p>Welcome to the island.</p>
<h2>Walks</h2><p>The coastal path circles the island in four hours.</p>
<h3>Lighthouse</h3><p>The lighthouse on the western cape is open to visitors on Sundays from ten to four.</p>
<h2>Food</h2><p>The harbour bakery sells cinnamon buns from six in the morning.</p>
</body></html>"#;

fn handbook() -> Vec<u8> {
    docx_file(&[
        ("Title", "Crew handbook"),
        ("Heading1", "Safety"),
        ("", "Life jackets are stored under every second bench."),
        ("Heading2", "Drills"),
        (
            "",
            "The crew runs a man-overboard drill every Thursday afternoon.",
        ),
        ("Heading1", "Rosters"),
        ("", "Shifts change at noon and at midnight."),
    ])
}

fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn config(source: &str) -> String {
    format!(
        "{source}\n[index]\npath = \"{{dir}}/index\"\n[http]\nlisten = \"{{http}}\"\nquery_token_env = \"FORMATS_TOKEN\"\n[runtime]\nserve = true\ndlq_path = \"{{dir}}/dlq.jsonl\"\n"
    )
}

fn query(port: u16, text: &str) -> Value {
    let body = json!({"query_id": format!("q-{}", text.len()), "tenant": "acme", "text": text,
                      "k": 3, "token_budget": 400});
    let auth = format!("Bearer {TOKEN}");
    let (status, answer) = http_post_json_with(
        port,
        "/v1/query",
        &body.to_string(),
        &[("Authorization", &auth)],
    )
    .expect("answered");
    assert_eq!(status, 200, "{answer}");
    serde_json::from_str(&answer).expect("context")
}

fn post(port: u16, documents: Value) -> (u16, Value) {
    crate::common::job::post_documents(port, TOKEN, &json!({ "documents": documents }))
}

/// Checks what the queries find in the three files (doc ids as given), and returns the top PDF item.
fn assert_found(port: u16, pdf: &str, html: &str, docx: &str) -> Value {
    let context = query(port, "how many days until a cancelled crossing is refunded");
    let top = context["items"][0].clone();
    assert_eq!(top["doc_id"], pdf, "{context}");
    assert_eq!(top["page"], 3, "{top}");
    assert!(
        top["text"].as_str().unwrap_or("").contains("refunded"),
        "{top}"
    );
    let cited = format!(
        "Source: {} (page 3, lines ",
        top["source"].as_str().unwrap_or("")
    );
    assert!(
        context["context"].as_str().unwrap_or("").contains(&cited),
        "{cited} in {}",
        context["context"]
    );

    let context = query(port, "when can visitors go up the lighthouse");
    let top = &context["items"][0];
    assert_eq!(top["doc_id"], html, "{context}");
    assert_eq!(
        top["section_path"],
        json!(["Island guide", "Walks", "Lighthouse"]),
        "{top}"
    );
    assert!(top.get("page").is_none(), "{top}");
    let text = context["context"].as_str().unwrap_or("");
    assert!(
        !text.contains("never indexed") && !text.contains("Lighthouse tours"),
        "{text}"
    );

    let context = query(port, "how often does the crew practise man overboard");
    let top = &context["items"][0];
    assert_eq!(top["doc_id"], docx, "{context}");
    assert_eq!(top["section_path"], json!(["Safety", "Drills"]), "{top}");
    context["items"][0].clone()
}

#[test]
fn files_posted_over_http_are_extracted_and_cited_by_page_and_section() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("events.jsonl"), "").expect("events");
    let source = "[source]\nkind = \"jsonl\"\npath = \"{dir}/events.jsonl\"";
    let mut job = Job::start_with_env(dir.path(), &config(source), 1, &[("FORMATS_TOKEN", TOKEN)]);
    job.wait_ready(Duration::from_secs(120));
    let port = job.http_port;

    // The PDF and the DOCX as bytes (the DOCX without an extension: recognised by content), the
    // HTML as text.
    let (status, answer) = post(
        port,
        json!([
            {"tenant": "acme", "doc_id": "report.pdf", "version": 1, "content_base64": base64(&report(14))},
            {"tenant": "acme", "doc_id": "guide.html", "version": 1, "text": GUIDE_HTML},
            {"tenant": "acme", "doc_id": "handbook", "version": 1, "content_base64": base64(&handbook())},
        ]),
    );
    assert_eq!(
        (status, &answer),
        (200, &json!({"accepted": 3, "indexed": true}))
    );
    assert_found(port, "report.pdf", "guide.html", "handbook");
    let embedded = metric(&job.metrics(), "ragstream_chunks_embedded_total");
    assert!(embedded >= 6.0, "{embedded} chunks embedded");

    // Page 3 edited: one chunk re-embedded, the other pages' chunks kept.
    let (status, answer) = post(
        port,
        json!([{"tenant": "acme", "doc_id": "report.pdf", "version": 2, "content_base64": base64(&report(30))}]),
    );
    assert_eq!(status, 200, "{answer}");
    let after = metric(&job.metrics(), "ragstream_chunks_embedded_total");
    assert_eq!(
        after - embedded,
        1.0,
        "chunks embedded by the edit of one page"
    );
    println!(
        "FORMATS http: a 3-page PDF, an HTML page and a DOCX posted: {embedded} chunks embedded; \
         the edit of page 3 re-embedded {} chunk",
        after - embedded
    );
    let top =
        query(port, "how many days until a cancelled crossing is refunded")["items"][0].clone();
    assert_eq!(top["page"], 3);
    assert!(
        top["text"]
            .as_str()
            .unwrap_or("")
            .contains("within 30 days"),
        "{top}"
    );

    // A file that cannot be read: 422 naming it, nothing of the batch written.
    let mut broken = report(14);
    broken.truncate(broken.len() / 3);
    let (status, problem) = post(
        port,
        json!([
            {"tenant": "acme", "doc_id": "fine.txt", "version": 1, "text": "A fine text."},
            {"tenant": "acme", "doc_id": "broken.pdf", "version": 1, "content_base64": base64(&broken)},
        ]),
    );
    assert_eq!(status, 422, "{problem}");
    assert_eq!(problem["type"], "urn:ragstream:problem:unparseable");
    assert_eq!(problem["errors"][0]["index"], 1);
    assert!(
        problem["errors"][0]["detail"]
            .as_str()
            .unwrap_or("")
            .contains("pdf file cannot be read"),
        "{problem}"
    );
    let unrelated = query(port, "a fine text");
    assert!(unrelated["items"]
        .as_array()
        .expect("items")
        .iter()
        .all(|i| i["doc_id"] != "fine.txt"));
    job.stop();
}

#[test]
fn files_in_the_watched_directory_are_extracted_and_unreadable_ones_dead_lettered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let docs = dir.path().join("docs");
    std::fs::create_dir_all(docs.join("site")).expect("docs");
    std::fs::write(docs.join("report.pdf"), report(14)).expect("pdf");
    std::fs::write(docs.join("site/guide.html"), GUIDE_HTML).expect("html");
    std::fs::write(docs.join("handbook.docx"), handbook()).expect("docx");
    std::fs::write(docs.join("broken.docx"), b"PK\x03\x04 not an archive").expect("broken");
    let source = format!(
        "[source]\nkind = \"dir\"\npath = {:?}\ntenant = \"acme\"\nrescan_secs = 1",
        docs.display().to_string()
    );
    let mut job = Job::start_with_env(dir.path(), &config(&source), 1, &[("FORMATS_TOKEN", TOKEN)]);
    job.wait_ready(Duration::from_secs(120));
    job.wait_indexed(3);
    assert_found(
        job.http_port,
        "report.pdf",
        "site/guide.html",
        "handbook.docx",
    );

    // The unreadable file: one DLQ record with its reason, not repeated by later scans.
    let metrics = job.wait_for(Duration::from_secs(30), "the DLQ record", |m| {
        crate::common::job::metric_labeled(m, "ragstream_dlq_records_total", "unparseable") >= 1.0
    });
    let embedded = metric(&metrics, "ragstream_chunks_embedded_total");
    let dlq = std::fs::read_to_string(dir.path().join("dlq.jsonl")).expect("dlq");
    let records: Vec<Value> = dlq
        .lines()
        .map(|l| serde_json::from_str(l).expect("record"))
        .collect();
    assert_eq!(records.len(), 1, "{dlq}");
    assert_eq!(records[0]["reason"], "unparseable", "{dlq}");
    assert!(
        dlq.contains("broken.docx") && dlq.contains("docx file cannot be read"),
        "{dlq}"
    );

    // Page 3 edited on disk: the next scan re-embeds that page's chunk only.
    std::fs::write(docs.join("report.pdf"), report(30)).expect("edit");
    let metrics = job.wait_for(Duration::from_secs(60), "the edited page", |m| {
        metric(m, "ragstream_chunks_embedded_total") > embedded
            && metric(m, "ragstream_in_flight_messages") == 0.0
    });
    std::thread::sleep(Duration::from_secs(3));
    let after = metric(&job.metrics(), "ragstream_chunks_embedded_total");
    assert_eq!(
        after - embedded,
        1.0,
        "chunks embedded by the edit of one page"
    );
    println!(
        "FORMATS dir: 3 files extracted ({embedded} chunks embedded), 1 unreadable file \
         dead-lettered once; the edit of page 3 re-embedded {} chunk",
        after - embedded
    );
    let top = query(
        job.http_port,
        "how many days until a cancelled crossing is refunded",
    )["items"][0]
        .clone();
    assert!(
        top["text"]
            .as_str()
            .unwrap_or("")
            .contains("within 30 days"),
        "{top}"
    );
    let dlq_after = std::fs::read_to_string(dir.path().join("dlq.jsonl")).expect("dlq");
    assert_eq!(dlq_after.lines().count(), 1, "{dlq_after}");
    drop(metrics);
    job.stop();
}

#[test]
fn files_on_the_documents_topic_are_extracted_in_order_and_a_hostile_one_dead_lettered() {
    use crate::common::broker::Broker;
    let broker = Broker::start();
    broker.create_topic("docs", 1);
    broker.create_topic("dlq", 1);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = crate::common::kafka_config(
        &broker.bootstrap(),
        "documents_topic = \"docs\"\ndlq_topic = \"dlq\"\ngroup_id = \"formats\"",
        "[ingest.quotas]\nmax_documents = 3",
    );
    let mut job = Job::start_with_env(dir.path(), &config, 1, &[("RAGSTREAM_QUERY_TOKEN", TOKEN)]);
    job.wait_ready(Duration::from_secs(120));
    let event = |doc_id: &str, version: u64, body: Value| {
        let mut event = json!({"tenant": "acme", "doc_id": doc_id, "version": version});
        event.as_object_mut().expect("object").extend(
            body.as_object()
                .expect("object")
                .iter()
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        (
            format!("acme/{doc_id}"),
            Some(event.to_string().into_bytes()),
        )
    };
    // A note, the report (a PDF), a PDF that needs gigabytes to parse, the guide (HTML), and the
    // note again, edited: the edit must win over the version before the files.
    let amplifying = ragstream_core::testing::hostile::pdf_amplifying_content(60 << 20);
    broker.produce(
        "docs",
        &[
            event(
                "note.md",
                1,
                json!({"text": "The ferry note: boarding closes at noon."}),
            ),
            event(
                "report.pdf",
                1,
                json!({"content_base64": base64(&report(14))}),
            ),
            event(
                "amplify.pdf",
                1,
                json!({"content_base64": base64(&amplifying)}),
            ),
            event("guide.html", 1, json!({"text": GUIDE_HTML})),
            event(
                "note.md",
                2,
                json!({"text": "The ferry note: boarding now closes at eleven."}),
            ),
        ],
    );
    // Another tenant's fourth document passes its quota of three (acme holds three: the note, the
    // report and the guide).
    let globex: Vec<(String, Option<Vec<u8>>)> = (1..=4)
        .map(|n| {
            let event = json!({"tenant": "globex", "doc_id": format!("g{n}"), "version": 1,
                "text": format!("Globex memo {n}: the warehouse opens at {n} am.")});
            (format!("globex/g{n}"), Some(event.to_string().into_bytes()))
        })
        .collect();
    broker.produce("docs", &globex);
    job.wait_for(Duration::from_secs(180), "nine events acknowledged", |m| {
        metric(m, "ragstream_source_events_total") >= 9.0
            && metric(m, "ragstream_in_flight_messages") == 0.0
    });
    let context = query(
        job.http_port,
        "how many days until a cancelled crossing is refunded",
    );
    assert_eq!(context["items"][0]["doc_id"], "report.pdf", "{context}");
    assert_eq!(context["items"][0]["page"], 3, "{context}");
    let context = query(job.http_port, "when can visitors go up the lighthouse");
    assert_eq!(context["items"][0]["doc_id"], "guide.html", "{context}");
    let context = query(job.http_port, "when does ferry boarding close");
    let text = context["context"].as_str().unwrap_or("");
    assert!(text.contains("eleven") && !text.contains("noon"), "{text}");
    // The hostile file: dead-lettered with its reason and the message it came in; the document over
    // its tenant's quota, with its value, and the tenant's other three kept.
    let dlq = broker.read_all("dlq", 2);
    assert_eq!(dlq.len(), 2);
    let over = dlq
        .iter()
        .find(|(_, _, headers)| {
            headers
                .iter()
                .any(|(k, v)| k == "reason" && v == b"quota_exceeded")
        })
        .expect("a quota_exceeded record");
    assert_eq!(over.0.as_deref(), Some(&b"globex/g4"[..]));
    let value = String::from_utf8_lossy(over.1.as_deref().unwrap_or_default()).into_owned();
    assert!(value.contains("Globex memo 4"), "{value}");
    let error = over
        .2
        .iter()
        .find(|(k, _)| k == "error")
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default();
    assert!(error.contains("max_documents"), "{error}");
    let (_, _, headers) = dlq
        .iter()
        .find(|(_, _, headers)| {
            headers
                .iter()
                .any(|(k, v)| k == "reason" && v == b"unparseable")
        })
        .expect("the hostile file's record");
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    };
    assert_eq!(header("reason").as_deref(), Some("unparseable"));
    assert_eq!(header("offset").as_deref(), Some("2"), "{headers:?}");
    let error = header("error").unwrap_or_default();
    assert!(error.contains("memory limit"), "{error}");
    job.stop();
}
