//! The local MiniLM embedder (ONNX Runtime) agrees with sentence-transformers: reference vectors made by
//! `deploy/scripts/make_reference_vectors.py` (PyTorch, fp32) and committed as a fixture.
//! Floors: cosine ≥ 0.999 for the fp32 graph, ≥ 0.98 for the int8 graph, on every reference sentence.

use ragstream_operators::embed::minilm::Precision;
use ragstream_operators::embed::{cosine, Embedder};

struct Fixture {
    sentences: Vec<String>,
    vectors: Vec<Vec<f32>>,
    wordpieces: Vec<usize>,
}

fn fixture() -> Fixture {
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/minilm_reference.json"))
            .expect("fixture is JSON");
    let field = |name: &str| fixture[name].clone();
    Fixture {
        sentences: serde_json::from_value(field("sentences")).expect("sentences"),
        vectors: serde_json::from_value(field("vectors")).expect("vectors"),
        wordpieces: serde_json::from_value(field("wordpieces")).expect("wordpieces"),
    }
}

/// The worst cosine of `precision`'s vectors against the reference; every vector must reach `floor`.
fn worst_cosine(precision: Precision, floor: f32) -> f32 {
    let fixture = fixture();
    let mut model = crate::common::minilm(precision);
    assert_eq!(model.dimension(), 384);
    let texts: Vec<&str> = fixture.sentences.iter().map(String::as_str).collect();
    let vectors = model.embed(&texts).expect("embeds");
    assert_eq!(vectors.len(), texts.len());
    let mut worst = f32::MAX;
    for (index, (got, want)) in vectors.iter().zip(&fixture.vectors).enumerate() {
        let similarity = cosine(got, want);
        worst = worst.min(similarity);
        assert!(
            similarity >= floor,
            "{precision:?}, sentence {index} ({:?}…): cosine {similarity} < {floor}",
            &texts[index].chars().take(40).collect::<String>()
        );
        let norm: f32 = got.iter().map(|v| v * v).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "normalised");
    }
    // Order independence: one sentence alone gives the vector it got in the batch.
    let single = model.embed(&texts[3..4]).expect("single");
    assert!(cosine(&single[0], &vectors[3]) > 0.99999);
    // Word pieces before truncation match the reference tokenizer; the long one exceeds 256 and is cut.
    for (sentence, &count) in fixture.sentences.iter().zip(&fixture.wordpieces) {
        assert_eq!(model.word_pieces(sentence).expect("tokenizes"), count);
    }
    assert!(
        fixture.wordpieces.iter().any(|&count| count > 256),
        "the fixture exercises truncation"
    );
    eprintln!("{precision:?}: worst cosine vs sentence-transformers {worst:.6}");
    worst
}

#[test]
fn fp32_graph_matches_sentence_transformers() {
    worst_cosine(Precision::Fp32, 0.999);
}

#[test]
fn int8_graph_stays_close_to_sentence_transformers() {
    let worst = worst_cosine(Precision::Int8, 0.98);
    assert!(worst < 0.99999, "the int8 graph is really quantised");
}

#[test]
fn the_two_precisions_write_different_embedder_versions() {
    let fp32 = crate::common::minilm(Precision::Fp32);
    let int8 = crate::common::minilm(Precision::Int8);
    assert_eq!(fp32.version(), "all-MiniLM-L6-v2/mean/256");
    assert_eq!(int8.version(), "all-MiniLM-L6-v2/mean/256/int8");
}

/// A directory holding `events.jsonl` with two short documents of tenant `local`.
fn two_documents() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let events = [
        (
            "tides",
            "Tides rise and fall twice a day under the pull of the moon.",
        ),
        (
            "bees",
            "Honey bees dance to tell the hive where the flowers are.",
        ),
    ]
    .iter()
    .map(|(id, text)| {
        serde_json::json!({"op": "upsert", "tenant": "local", "doc_id": id, "version": 1,
                           "source": format!("{id}.md"), "kind": "prose", "text": text})
        .to_string()
    })
    .collect::<Vec<_>>();
    std::fs::write(dir.path().join("events.jsonl"), events.join("\n") + "\n").expect("events");
    dir
}

#[test]
fn an_index_of_another_embedder_version_stops_the_job_unless_mixing_is_allowed() {
    use crate::common::job::Job;
    use std::time::Duration;
    let dir = two_documents();
    let serving = crate::common::JSONL_SERVING;
    let mut job = Job::start(dir.path(), serving, 1);
    job.wait_ready(Duration::from_secs(120));
    job.wait_indexed(2);
    job.stop();
    // The fp32 graph writes another embedder version: refused at start, saying what to do.
    let fp32 = format!("{serving}[embedder]\nprecision = \"fp32\"\n");
    let mut refused = Job::start(dir.path(), &fp32, 1);
    assert!(!refused.wait_exit(Duration::from_secs(120)).success());
    let log = refused.log();
    assert!(
        log.contains("holds vectors of embedder all-MiniLM-L6-v2/mean/256/int8"),
        "{log}"
    );
    // Flagged: it serves the index as it is.
    let mixed = format!("{fp32}allow_mixed_versions = true\n");
    let mut job = Job::start(dir.path(), &mixed, 1);
    job.wait_ready(Duration::from_secs(120));
    let body = serde_json::json!({"query_id": "m", "tenant": "local", "text": "why do tides rise"});
    let (status, reply) =
        crate::common::job::http_post_json(job.http_port, "/v1/query", &body.to_string())
            .expect("answered");
    assert_eq!(status, 200, "{reply}");
    let context: serde_json::Value = serde_json::from_str(&reply).expect("context JSON");
    assert_eq!(context["items"][0]["doc_id"], "tides", "{context}");
    assert!(job
        .log()
        .contains("serving vectors of another embedder version"));
    job.stop();
}

/// The BM25 weighting is part of what an index holds: a job with another `[index.bm25]` refuses
/// the index, and `embedder.reembed` re-encodes it (BM25+ then scores a match higher by its shift).
#[test]
fn an_index_of_another_bm25_weighting_refuses_to_open_until_re_encoded() {
    use crate::common::job::Job;
    use std::time::Duration;
    let dir = two_documents();
    let bm25_score = |job: &Job| -> f64 {
        let body = serde_json::json!({"query_id": "b", "tenant": "local", "text": "tides moon",
                                      "trace": true});
        let (status, reply) =
            crate::common::job::http_post_json(job.http_port, "/v1/query", &body.to_string())
                .expect("answered");
        assert_eq!(status, 200, "{reply}");
        let context: serde_json::Value = serde_json::from_str(&reply).expect("context JSON");
        context["trace"]["candidates"]
            .as_array()
            .expect("trace candidates")
            .iter()
            .find(|c| c["doc_id"] == "tides")
            .and_then(|c| c["bm25"]["score"].as_f64())
            .unwrap_or_else(|| panic!("a BM25 hit on tides: {context}"))
    };
    let serving = crate::common::JSONL_SERVING;
    let mut job = Job::start(dir.path(), serving, 1);
    job.wait_ready(Duration::from_secs(120));
    job.wait_indexed(2);
    let standard = bm25_score(&job);
    job.stop();
    let plus = format!("{serving}[index.bm25]\nvariant = \"plus\"\n");
    let mut refused = Job::start(dir.path(), &plus, 1);
    assert!(!refused.wait_exit(Duration::from_secs(120)).success());
    let log = refused.log();
    assert!(
        log.contains(
            "this job embeds with all-MiniLM-L6-v2/mean/256/int8 + bm25 plus k1=1.2 b=0.75 delta=1"
        ),
        "{log}"
    );
    let reencode = format!("{plus}[embedder]\nreembed = true\n");
    let mut job = Job::start(dir.path(), &reencode, 1);
    job.wait_ready(Duration::from_secs(120));
    assert!(job.log().contains("re-embedded"), "{}", job.log());
    let shifted = bm25_score(&job);
    // Two matched terms, each adding its IDF (ln 2 in a corpus of two, one holding it) times 1.
    assert!(
        shifted > standard + 1.0,
        "BM25+ {shifted} against the standard {standard}"
    );
    job.stop();
}
