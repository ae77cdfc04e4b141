//! The optional model endpoints of the query flow, against the stand-in model server of
//! `crate::common::endpoints` (docs/query.md: "Rerank and HyDE endpoints"): a TEI-style reranker and a
//! chat model reorder the rerank window, HyDE joins a hypothetical passage to the dense query, and each falls
//! back cleanly (noted, traced, counted) when the endpoint is too slow or answers nonsense.

use std::time::Duration;

use crate::common::endpoints::StandIn;
use crate::common::job::{http_post_json, metric_labeled, Job};
use serde_json::{json, Value};

const DOCS: [(&str, &str); 5] = [
    ("monarch", "Monarch butterflies migrate thousands of kilometres from Canada to Mexico each autumn, flying south to overwinter in fir forests."),
    ("compass", "A compass needle points to magnetic north because it aligns with the Earth's magnetic field."),
    ("tides", "Tides rise and fall twice a day as the Moon's gravity pulls the oceans; spring tides follow the full and new Moon."),
    ("bees", "Honey bees travel a few kilometres from the hive to forage, and tell each other where flowers are with a waggle dance."),
    ("salmon", "Salmon return from the ocean to the river where they hatched, swimming upstream to spawn and then dying."),
];

fn start(dir: &std::path::Path, endpoint: &str) -> Job {
    let events: Vec<String> = DOCS
        .iter()
        .map(|(id, text)| {
            json!({"op": "upsert", "tenant": "nature", "doc_id": id, "version": 1,
                   "source": format!("nature/{id}"), "kind": "prose", "title": id, "text": text})
            .to_string()
        })
        .collect();
    std::fs::write(dir.join("events.jsonl"), events.join("\n") + "\n").expect("events");
    let config = format!("{}{endpoint}", crate::common::JSONL_SERVING);
    let mut job = Job::start(dir, &config, 1);
    job.wait_ready(Duration::from_secs(120));
    job.wait_indexed(DOCS.len());
    job
}

fn ask(job: &Job, id: &str, text: &str, budget: usize) -> Value {
    ask_with(job, id, text, budget, json!({}))
}

/// As [`ask`], with the query's other fields from `extra`.
fn ask_with(job: &Job, id: &str, text: &str, budget: usize, extra: Value) -> Value {
    let mut body = json!({"query_id": id, "tenant": "nature", "text": text, "token_budget": budget,
                      "trace": true, "fill": true});
    for (key, value) in extra.as_object().expect("an object") {
        body[key] = value.clone();
    }
    let (status, reply) =
        http_post_json(job.http_port, "/v1/query", &body.to_string()).expect("answered");
    assert_eq!(status, 200, "{reply}");
    serde_json::from_str(&reply).expect("context JSON")
}

fn notes(context: &Value) -> String {
    context["note"].as_str().unwrap_or_default().to_string()
}

/// The trace candidates carrying an endpoint score, in the trace's (final) order.
fn endpoint_scores(context: &Value) -> Vec<(String, f64, f64)> {
    context["trace"]["candidates"]
        .as_array()
        .expect("trace candidates")
        .iter()
        .filter_map(|c| {
            Some((
                c["doc_id"].as_str()?.to_string(),
                c["factors"]["endpoint"].as_f64()?,
                c["score"].as_f64()?,
            ))
        })
        .collect()
}

/// The window is in the endpoint's order: endpoint scores never rise down the list, and the packed
/// context starts with the endpoint's best.
fn assert_endpoint_order(context: &Value, window: usize) {
    let scored = endpoint_scores(context);
    assert_eq!(scored.len(), window.min(DOCS.len()), "{context}");
    for pair in scored.windows(2) {
        assert!(pair[0].1 >= pair[1].1, "endpoint order: {scored:?}");
        assert!(pair[0].2 >= pair[1].2, "score order: {scored:?}");
    }
    assert_eq!(
        context["items"][0]["doc_id"],
        scored[0].0.as_str(),
        "{context}"
    );
}

fn fallback(context: &Value, kind: &str, why: &str) {
    let note = notes(context);
    assert!(
        note.contains(&format!("rerank endpoint ({kind}) unavailable")),
        "{note}"
    );
    assert!(note.contains(why), "{note}");
    assert!(endpoint_scores(context).is_empty(), "built-in order kept");
    assert!(!context["items"].as_array().expect("items").is_empty());
    let decisions = context["trace"]["decisions"].as_array().expect("decisions");
    assert!(decisions
        .iter()
        .any(|d| d["cause"] == "endpoint_fallback" && d["step"] == "rerank"));
}

/// The Cohere/Jina rerank shape (`query.rerank.kind = "cohere"`) orders the window by the same rule.
#[test]
fn a_cohere_shaped_reranker_reorders_the_window() {
    let stand_in = StandIn::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let cohere = format!(
        "[query.rerank]\nkind = \"cohere\"\nendpoint_window = 4\n[query.rerank.endpoint]\nurl = \"{}\"\nmodel = \"rerank-test\"\ntimeout_ms = 500\n",
        stand_in.url
    );
    let mut job = start(dir.path(), &cohere);
    let question = "which animals migrate or travel far from home";
    let context = ask(&job, "c1", question, 2000);
    assert_endpoint_order(&context, 4);
    assert_eq!(
        (stand_in.count("/v1/rerank"), stand_in.count("/rerank")),
        (1, 0)
    );
    for (doc, score, _) in endpoint_scores(&context) {
        let text = DOCS.iter().find(|(id, _)| *id == doc).expect("doc").1;
        let expected = crate::common::endpoints::share(question, text);
        assert!(
            (score - expected as f64).abs() < 1e-4,
            "{doc}: {score} vs {expected}"
        );
    }
    let slow = ask(&job, "c2", "which animals migrate slowly", 2000);
    fallback(&slow, "cohere", "/v1/rerank");
    assert!(job.stop().success());
}

#[test]
fn a_tei_reranker_and_a_chat_grader_reorder_the_window_and_fall_back_when_slow_or_wrong() {
    let stand_in = StandIn::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let http = format!(
        "[query.rerank]\nkind = \"http\"\nendpoint_window = 4\n[query.rerank.endpoint]\nurl = \"{}\"\ntimeout_ms = 500\n",
        stand_in.url
    );
    let mut job = start(dir.path(), &http);
    let context = ask(
        &job,
        "h1",
        "which animals migrate or travel far from home",
        2000,
    );
    assert_endpoint_order(&context, 4);
    assert_eq!(stand_in.count("/rerank"), 1);
    // The stand-in's scores are what the trace shows: recomputed here from its documented rule.
    for (doc, score, _) in endpoint_scores(&context) {
        let text = DOCS.iter().find(|(id, _)| *id == doc).expect("doc").1;
        let expected =
            crate::common::endpoints::share("which animals migrate or travel far from home", text);
        assert!(
            (score - expected as f64).abs() < 1e-4,
            "{doc}: {score} vs {expected}"
        );
    }
    // Too slow (2 s against a 500 ms timeout): answered anyway, in the built-in order, and said so.
    let started = std::time::Instant::now();
    let slow = ask(&job, "h2", "which animals migrate slowly", 2000);
    assert!(
        started.elapsed() < Duration::from_millis(1900),
        "the timeout bounds the wait"
    );
    fallback(&slow, "http", "/rerank");
    let metrics = job.metrics();
    assert_eq!(
        metric_labeled(
            &metrics,
            "ragstream_endpoint_calls_total",
            "endpoint=\"rerank_http\",outcome=\"ok\""
        ),
        1.0
    );
    assert_eq!(
        metric_labeled(
            &metrics,
            "ragstream_endpoint_calls_total",
            "endpoint=\"rerank_http\",outcome=\"fallback\""
        ),
        1.0
    );
    job.stop();

    // The chat grader on the same index.
    let llm = format!(
        "[query.rerank]\nkind = \"llm\"\nendpoint_window = 5\n[query.rerank.endpoint]\nurl = \"{}\"\nmodel = \"grader\"\ntimeout_ms = 500\n",
        stand_in.url
    );
    let mut job = start(dir.path(), &llm);
    let context = ask(
        &job,
        "l1",
        "which animals migrate or travel far from home",
        2000,
    );
    assert_endpoint_order(&context, 5);
    assert!(endpoint_scores(&context)
        .iter()
        .all(|(_, g, _)| g.fract() == 0.0 && (0.0..=10.0).contains(g)));
    let refused = ask(&job, "l2", "which animals migrate, refuse", 2000);
    fallback(&refused, "llm", "no JSON array");
    assert_eq!(stand_in.count("/v1/chat/completions"), 2);
    job.stop();
}

#[test]
fn hyde_joins_a_hypothetical_passage_to_vague_queries_once_and_falls_back_when_slow() {
    let stand_in = StandIn::start();
    let question = "why do some insects make such long journeys";
    stand_in.passage(
        question,
        "Monarch butterflies migrate thousands of kilometres from Canada to Mexico every autumn to overwinter in fir forests.",
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let hyde = format!(
        "[query.hyde]\nenabled = true\nweight = 0.7\n[query.hyde.endpoint]\nurl = \"{}\"\nmodel = \"writer\"\ntimeout_ms = 500\n",
        stand_in.url
    );
    let mut job = start(dir.path(), &hyde);
    let context = ask(&job, "y1", question, 2000);
    assert_eq!(context["intent"], "exploratory");
    assert!(
        notes(&context)
            .contains("hyde (combined): 1 hypothetical passage(s) joined the dense query"),
        "{context}"
    );
    assert_eq!(
        context["trace"]["hyde"]["strategy"], "combined",
        "{context}"
    );
    assert_eq!(context["trace"]["hyde"]["hypotheses"], 1);
    assert_eq!(context["trace"]["hyde"]["joined"], true);
    // The dense lane reads the mixed vector: the passage's document leads it with a cosine the
    // question alone does not reach (measured: docs/query.md, "Rerank and HyDE endpoints").
    let dense_top = context["trace"]["candidates"]
        .as_array()
        .expect("candidates")
        .iter()
        .find(|c| c["dense"]["rank"] == 1)
        .expect("a dense top hit")
        .clone();
    assert_eq!(dense_top["doc_id"], "monarch", "{dense_top}");
    let with_hyde = dense_top["dense"]["score"].as_f64().expect("cosine");
    assert_eq!(stand_in.count("/v1/chat/completions"), 1);
    // The same question again (another budget, so not the context cache): the passage is cached.
    let again = ask(&job, "y2", question, 1500);
    assert!(notes(&again).contains("(cached)"), "{again}");
    assert_eq!(stand_in.count("/v1/chat/completions"), 1);
    // A query of another intent gets no passage.
    let procedure = ask(&job, "y3", "how to install a compass", 2000);
    assert!(!notes(&procedure).contains("hyde"), "{procedure}");
    assert_eq!(stand_in.count("/v1/chat/completions"), 1);
    // A query may ask for HyDE whatever its intent, with more passages and the passages alone:
    // three passages (the stand-in answers one per request, so the writer asks three times).
    let asked = ask_with(
        &job,
        "y5",
        "how to install a compass",
        2000,
        json!({"hyde": "hyde", "num_hypotheses": 3}),
    );
    assert_eq!(asked["trace"]["hyde"]["strategy"], "hyde", "{asked}");
    assert_eq!(asked["trace"]["hyde"]["hypotheses"], 3);
    assert_eq!(asked["trace"]["hyde"]["weight"], 1.0);
    assert!(
        notes(&asked).contains("hyde (hyde): 3 hypothetical passage(s)"),
        "{asked}"
    );
    assert_eq!(stand_in.count("/v1/chat/completions"), 4);
    // `skip` on a vague question: no passage, no call, no HyDE in the trace.
    let skipped = ask_with(&job, "y6", question, 1800, json!({"hyde": "skip"}));
    assert!(skipped["trace"].get("hyde").is_none(), "{skipped}");
    assert!(!notes(&skipped).contains("hyde"), "{skipped}");
    assert_eq!(stand_in.count("/v1/chat/completions"), 4);
    // Too slow: the query's own vector, noted.
    let slow = ask(&job, "y4", "why do insects travel slowly", 2000);
    assert!(notes(&slow).contains("hyde endpoint unavailable"), "{slow}");
    let metrics = job.metrics();
    assert_eq!(
        metric_labeled(
            &metrics,
            "ragstream_endpoint_calls_total",
            "endpoint=\"hyde\",outcome=\"cached\""
        ),
        1.0
    );
    assert_eq!(
        metric_labeled(
            &metrics,
            "ragstream_endpoint_calls_total",
            "endpoint=\"hyde\",outcome=\"fallback\""
        ),
        1.0
    );
    job.stop();

    // Without HyDE, the same question's best dense cosine for that document is lower; a query that
    // asks for HyDE is told the job has no writer.
    let plain = tempfile::tempdir().expect("tempdir");
    let mut job = start(plain.path(), "");
    let context = ask_with(&job, "p1", question, 2000, json!({"hyde": "combined"}));
    assert!(notes(&context).contains("no HyDE writer"), "{context}");
    assert!(context["trace"].get("hyde").is_none(), "{context}");
    let without = context["trace"]["candidates"]
        .as_array()
        .expect("candidates")
        .iter()
        .find(|c| c["doc_id"] == "monarch")
        .and_then(|c| c["dense"]["score"].as_f64())
        .unwrap_or(0.0);
    eprintln!("HyDE: monarch cosine {with_hyde:.3} with the passage, {without:.3} without");
    assert!(with_hyde > without + 0.1, "{with_hyde} vs {without}");
    job.stop();
}
