//! Evidence end to end.
//! - Sentence evidence (docs/query.md, "Sentence evidence"): each chunk's sentences are embedded on
//!   their own at ingest and kept in the index, so a chunk about several things is as close to a query as
//!   its closest sentence. The rerank's `sentence_evidence` factor shows it in the trace; with
//!   `embedder.evidence_units = false` the factor is the chunk's own cosine.
//! - The lanes' evidence adapts the fusion weights (docs/query.md, "Intents", after the intent
//!   table):
//!   a query in plain words whose dense hits are code becomes a code search, in the context, its
//!   trace and the metrics; a query that names a programming language does so where code is the
//!   smaller part of the corpus.

use std::time::Duration;

use crate::common::job::{http_post_json, metric_labeled, Job};
use serde_json::{json, Value};

/// `mixed` covers four unrelated things in one chunk; one sentence answers the query. `general` is
/// about the query's subject as a whole without answering it.
const DOCS: [(&str, &str); 2] = [
    (
        "mixed",
        "The village bakery opens at six and sells rye bread until noon. \
         The football club trains on the school pitch on Tuesday evenings. \
         The lighthouse keeper winds the lamp clock every Sunday at noon. \
         Bus 12 to the railway station leaves from the market square every half hour.",
    ),
    (
        "general",
        "Lighthouses guide ships along dangerous coasts. A lighthouse keeper once lived in the tower, \
         kept the lamp burning through the night and logged passing ships and the weather.",
    ),
];

const QUESTION: &str = "When does the lighthouse keeper wind the lamp clock?";

fn start(dir: &std::path::Path, extra: &str) -> Job {
    start_with(dir, extra, &DOCS, "prose", "")
}

/// Indexes `docs` of `kind` (sources `town/{id}{extension}`) through the job's JSONL source.
fn start_with(
    dir: &std::path::Path,
    extra: &str,
    docs: &[(&str, &str)],
    kind: &str,
    extension: &str,
) -> Job {
    let docs: Vec<(&str, &str, &str, &str)> = docs
        .iter()
        .map(|(id, text)| (*id, *text, kind, extension))
        .collect();
    start_mixed(dir, extra, &docs)
}

/// Indexes `docs` (id, text, kind, source extension) through the job's JSONL source.
fn start_mixed(dir: &std::path::Path, extra: &str, docs: &[(&str, &str, &str, &str)]) -> Job {
    let events: Vec<String> = docs
        .iter()
        .map(|(id, text, kind, extension)| {
            json!({"op": "upsert", "tenant": "town", "doc_id": id, "version": 1,
                   "source": format!("town/{id}{extension}"), "kind": kind, "title": "",
                   "text": text})
            .to_string()
        })
        .collect();
    std::fs::write(dir.join("events.jsonl"), events.join("\n") + "\n").expect("events");
    let config = format!("{}{extra}", crate::common::JSONL_SERVING);
    let mut job = Job::start(dir, &config, 1);
    job.wait_ready(Duration::from_secs(120));
    job.wait_indexed(docs.len());
    job
}

/// A trace candidate: document, dense lane score, sentence evidence, final score.
type Scored = (String, f64, f64, f64);

/// Each document's scores, and the packed documents.
fn ask(job: &Job) -> (Vec<Scored>, Vec<String>) {
    let body = json!({"query_id": "q", "tenant": "town", "text": QUESTION, "token_budget": 400,
                      "trace": true, "fill": true});
    let (status, reply) =
        http_post_json(job.http_port, "/v1/query", &body.to_string()).expect("answered");
    assert_eq!(status, 200, "{reply}");
    let context: Value = serde_json::from_str(&reply).expect("context JSON");
    let candidates = context["trace"]["candidates"]
        .as_array()
        .expect("trace candidates")
        .iter()
        .map(|c| {
            (
                c["doc_id"].as_str().expect("doc").to_string(),
                c["dense"]["score"].as_f64().expect("dense lane hit"),
                c["factors"]["sentence_evidence"]
                    .as_f64()
                    .expect("sentence evidence"),
                c["score"].as_f64().expect("score"),
            )
        })
        .collect();
    let items = context["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["doc_id"].as_str().expect("doc").to_string())
        .collect();
    (candidates, items)
}

fn of<'a>(candidates: &'a [(String, f64, f64, f64)], doc: &str) -> &'a (String, f64, f64, f64) {
    candidates
        .iter()
        .find(|c| c.0 == doc)
        .unwrap_or_else(|| panic!("{doc} in {candidates:?}"))
}

#[test]
fn a_chunk_is_as_close_as_its_closest_sentence() {
    // Each sentence embedded alone (the default), then pooled from its chunk's pass (measured:
    // the lighthouse sentence's cosine 0.80 alone, 0.69 pooled, the chunk's own 0.47).
    for (extra, floor) in [
        ("", 0.7),
        ("[embedder]\nevidence_vectors = \"pooled\"\n", 0.6),
    ] {
        closest_sentence_answers(extra, floor);
    }

    // Without evidence units the factor is each chunk's own cosine.
    let dir = tempfile::tempdir().expect("tempdir");
    let job = start(dir.path(), "[embedder]\nevidence_units = false\n");
    let (candidates, _) = ask(&job);
    for (doc, dense, evidence, _) in &candidates {
        assert!(
            (dense - evidence).abs() < 1e-3,
            "{doc}: evidence {evidence} is not the chunk's cosine {dense}"
        );
    }
}

/// With the job's config and `extra`, the mixed chunk's lighthouse sentence (evidence at least
/// `floor`) lifts it over its own cosine and over the general chunk, to the top of the context.
fn closest_sentence_answers(extra: &str, floor: f64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let job = start(dir.path(), extra);
    let (candidates, items) = ask(&job);
    eprintln!("{extra:?}: {candidates:?}");
    let mixed = of(&candidates, "mixed");
    let general = of(&candidates, "general");
    // The whole mixed chunk is diluted by its other topics; its lighthouse sentence is not.
    assert!(
        mixed.2 > mixed.1 + 0.1,
        "sentence evidence {} over the chunk's cosine {}: {candidates:?}",
        mixed.2,
        mixed.1
    );
    assert!(mixed.2 > floor, "{candidates:?}");
    // The general chunk's closest sentence answers less than the mixed chunk's.
    assert!(mixed.2 > general.2, "{candidates:?}");
    // Sentence evidence puts the answering chunk first.
    assert_eq!(
        items.first().map(String::as_str),
        Some("mixed"),
        "{items:?}"
    );
}

/// Three Python functions: every dense hit of any query is code.
const CODE: [(&str, &str); 3] = [
    (
        "empty",
        "def is_empty(items):\n    \"\"\"Return True when the list holds no elements.\"\"\"\n    return len(items) == 0\n",
    ),
    (
        "reverse",
        "def reverse_words(sentence):\n    \"\"\"Reverse the order of the words of a sentence.\"\"\"\n    return ' '.join(reversed(sentence.split()))\n",
    ),
    (
        "mean",
        "def mean(values):\n    \"\"\"Average of a list of numbers.\"\"\"\n    return sum(values) / len(values)\n",
    ),
];

fn context(job: &Job, id: &str, text: &str) -> Value {
    let body = json!({"query_id": id, "tenant": "town", "text": text, "token_budget": 400,
                      "trace": true});
    let (status, reply) =
        http_post_json(job.http_port, "/v1/query", &body.to_string()).expect("answered");
    assert_eq!(status, 200, "{reply}");
    serde_json::from_str(&reply).expect("context JSON")
}

#[test]
fn plain_words_over_code_hits_are_a_code_search_in_the_context_trace_and_metrics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let job = start_with(dir.path(), "", &CODE, "code", ".py");

    // Plain words (the analyzer's `claim`, lanes 0.5 / 0.5): the dense hits are all code.
    let plain = context(&job, "plain", "python check whether a list has no elements");
    assert_eq!(plain["intent"], "code_search", "{plain}");
    assert!((plain["weights"]["dense"].as_f64().unwrap() - 0.85).abs() < 1e-6);
    assert!((plain["weights"]["bm25"].as_f64().unwrap() - 0.15).abs() < 1e-6);
    let signals = plain["trace"]["signals"].as_array().expect("signals");
    assert!(signals.iter().any(|s| s == "code_hits"), "{signals:?}");
    let adapted: Vec<&Value> = plain["trace"]["decisions"]
        .as_array()
        .expect("decisions")
        .iter()
        .filter(|d| d["action"] == "adapted")
        .collect();
    assert_eq!(adapted.len(), 1, "{plain}");
    assert_eq!(adapted[0]["cause"], "evidence_rule");
    assert_eq!(adapted[0]["step"], "fuse");
    assert_eq!(plain["items"][0]["doc_id"], "empty", "{plain}");

    // A query naming an identifier keeps the analyzer's intent and weights.
    let named = context(&job, "named", "where is is_empty defined");
    assert_ne!(named["intent"], "code_search", "{named}");
    let named_dense = named["weights"]["dense"].as_f64().unwrap();

    // The metrics: the analyzer's intents, one adaptation, and the weights fusion used.
    let metrics = job.metrics();
    assert_eq!(
        metric_labeled(
            &metrics,
            "ragstream_fusion_adapted_total",
            "rule=\"code_search\""
        ),
        1.0
    );
    assert_eq!(
        metric_labeled(
            &metrics,
            "ragstream_queries_by_intent_total",
            "intent=\"claim\""
        ),
        1.0
    );
    assert_eq!(
        metric_labeled(
            &metrics,
            "ragstream_queries_by_intent_total",
            "intent=\"code_search\""
        ),
        0.0
    );
    assert_eq!(
        metric_labeled(&metrics, "ragstream_fusion_weight_count", "lane=\"dense\""),
        2.0
    );
    let dense_sum = metric_labeled(&metrics, "ragstream_fusion_weight_sum", "lane=\"dense\"");
    assert!(
        (dense_sum - (0.85 + named_dense)).abs() < 1e-6,
        "dense weights observed {dense_sum}, used 0.85 + {named_dense}"
    );
    drop(job);

    // The design's QUERY_ADAPTIVE_WEIGHTS off (`adapt_fusion = false`): the analyzer's intent and
    // weights stand, and nothing is adapted.
    let off_dir = tempfile::tempdir().expect("tempdir");
    let off = start_with(
        off_dir.path(),
        "[query]\nadapt_fusion = false\n",
        &CODE,
        "code",
        ".py",
    );
    let fixed = context(&off, "plain", "python check whether a list has no elements");
    assert_eq!(fixed["intent"], "claim", "{fixed}");
    assert!((fixed["weights"]["dense"].as_f64().unwrap() - 0.5).abs() < 1e-6);
    assert!(!fixed["trace"]["decisions"]
        .as_array()
        .expect("decisions")
        .iter()
        .any(|d| d["action"] == "adapted"));
}

/// Seven documents in prose about lists, numbers and words: beside [`CODE`], code is three of ten.
const DOCS_ABOUT_CODE: [(&str, &str); 7] = [
    (
        "guide",
        "The style guide asks for short functions with a docstring that says what they return.",
    ),
    (
        "lists",
        "A shopping list is empty when every item has been bought and crossed out.",
    ),
    (
        "averages",
        "The class average is the sum of all marks divided by the number of pupils.",
    ),
    (
        "words",
        "Some poems read the same when the order of their words is reversed.",
    ),
    (
        "release",
        "The release notes list the new helpers and the functions that were removed.",
    ),
    (
        "review",
        "Reviewers check that each element of a change has a test before it is merged.",
    ),
    (
        "library",
        "The town library lends books about programming and mathematics to every member.",
    ),
];

#[test]
fn a_query_naming_its_language_is_a_code_search_where_code_is_the_smaller_part() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut docs: Vec<(&str, &str, &str, &str)> = CODE
        .iter()
        .map(|(id, text)| (*id, *text, "code", ".py"))
        .collect();
    docs.extend(
        DOCS_ABOUT_CODE
            .iter()
            .map(|(id, text)| (*id, *text, "prose", ".txt")),
    );
    let job = start_mixed(dir.path(), "", &docs);

    // Every document is among the dense lane's ten hits: three are code.
    let named = context(
        &job,
        "named",
        "check whether a list has no elements in python",
    );
    let hits = named["trace"]["candidates"]
        .as_array()
        .expect("trace candidates")
        .len();
    assert_eq!(hits, 10, "{named}");
    assert_eq!(named["intent"], "code_search", "{named}");
    let signals = named["trace"]["signals"].as_array().expect("signals");
    assert!(signals.iter().any(|s| s == "names_language"), "{signals:?}");
    assert!(signals.iter().any(|s| s == "code_hits"), "{signals:?}");
    assert!(
        named
            .to_string()
            .contains("(it names a programming language)"),
        "{named}"
    );

    // The same words without the language: three code hits of ten are no code search.
    let unnamed = context(&job, "unnamed", "check whether a list has no elements");
    assert_ne!(unnamed["intent"], "code_search", "{unnamed}");
    let signals = unnamed["trace"]["signals"].as_array().expect("signals");
    assert!(
        !signals
            .iter()
            .any(|s| s == "names_language" || s == "code_hits"),
        "{signals:?}"
    );
}

#[test]
fn code_indexed_as_prose_is_read_as_code_by_the_code_search_rule() {
    // The same ten documents, the three functions indexed as prose in `.txt` files: only their
    // text says they are code.
    let dir = tempfile::tempdir().expect("tempdir");
    let docs: Vec<(&str, &str, &str, &str)> = CODE
        .iter()
        .chain(DOCS_ABOUT_CODE.iter())
        .map(|(id, text)| (*id, *text, "prose", ".txt"))
        .collect();
    let job = start_mixed(dir.path(), "", &docs);

    let named = context(
        &job,
        "named",
        "check whether a list has no elements in python",
    );
    assert_eq!(named["intent"], "code_search", "{named}");
    assert!(
        named.to_string().contains(
            "3 of the dense lane's top 10 hits are code (3 indexed as text that reads as code)"
        ),
        "{named}"
    );
    let top = named["trace"]["candidates"][0]["doc_id"]
        .as_str()
        .expect("first candidate");
    assert_eq!(top, "empty", "{named}");
}
