//! The local MiniLM embedder (ONNX Runtime) agrees with sentence-transformers: reference vectors made by
//! `deploy/scripts/install/make_reference_vectors.py` (PyTorch, fp32) and committed as a fixture.
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
        serde_json::from_str(include_str!("../fixtures/minilm_reference.json"))
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

/// Byte ranges of `sentences` in their concatenation with single spaces, and the concatenation.
fn joined(sentences: &[&str]) -> (String, Vec<std::ops::Range<usize>>) {
    let mut text = String::new();
    let mut spans = Vec::new();
    for sentence in sentences {
        if !text.is_empty() {
            text.push(' ');
        }
        spans.push(text.len()..text.len() + sentence.len());
        text.push_str(sentence);
    }
    (text, spans)
}

#[test]
fn pooled_units_come_from_their_chunks_pass_and_stay_their_own_sentences() {
    let sentences = [
        "The village bakery opens at six and sells rye bread until noon.",
        "The football club trains on the school pitch on Tuesday evenings.",
        "The lighthouse keeper winds the lamp clock every Sunday at noon.",
        "Bus 12 to the railway station leaves from the market square every half hour.",
    ];
    let (mixed, mixed_spans) = joined(&sentences);
    // 40 sentences, about 500 word pieces: the pass sees the first half.
    let many: Vec<String> = (0..40)
        .map(|i| format!("Harbour note {i} records the tide, the wind and the ships."))
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let (long, long_spans) = joined(&many);
    for precision in [Precision::Int8, Precision::Fp32] {
        let mut alone = crate::common::minilm(precision);
        let mut pooled = crate::common::minilm_pooling(precision, true);
        assert_eq!(
            pooled.version(),
            format!("{}/units-pooled", alone.version())
        );
        assert!(pooled.pools_spans() && !alone.pools_spans());
        let texts = [long.as_str(), mixed.as_str()];
        let spans = [long_spans.clone(), mixed_spans.clone()];
        let got = pooled.embed_spans(&texts, &spans).expect("embeds");
        assert_eq!(got.len(), 2 + long_spans.len() + mixed_spans.len());
        let (long_got, mixed_got) = got.split_at(1 + long_spans.len());
        // The texts' own vectors are what `embed` gives.
        let own = alone.embed(&texts).expect("embeds");
        assert!(cosine(&long_got[0], &own[0]) > 0.99999, "{precision:?}");
        assert!(cosine(&mixed_got[0], &own[1]) > 0.99999, "{precision:?}");
        // Each sentence embedded alone is nearest to its own pooled unit (a pooled unit carries
        // its chunk's context, so the converse need not hold), and the question's sentence is the
        // question's best unit.
        let units = alone.embed(&sentences).expect("embeds");
        for unit in &mixed_got[1..] {
            let norm: f32 = unit.iter().map(|v| v * v).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-4, "normalised");
        }
        for (index, sentence) in units.iter().enumerate() {
            let similarities: Vec<f32> =
                mixed_got[1..].iter().map(|u| cosine(u, sentence)).collect();
            let nearest = (0..similarities.len())
                .max_by(|&a, &b| similarities[a].total_cmp(&similarities[b]))
                .expect("units");
            eprintln!("{precision:?}: sentence {index} against the pooled units {similarities:?}");
            assert_eq!(nearest, index, "{precision:?}: {similarities:?}");
        }
        let question = alone
            .embed(&["When does the lighthouse keeper wind the lamp clock?"])
            .expect("embeds");
        let best = (1..mixed_got.len())
            .max_by(|&a, &b| {
                cosine(&mixed_got[a], &question[0]).total_cmp(&cosine(&mixed_got[b], &question[0]))
            })
            .expect("units");
        assert_eq!(best, 3, "{precision:?}: the lighthouse sentence");
        // The long text: units the pass saw are pooled (not their vector alone), the rest are
        // embedded alone.
        let long_alone = alone.embed(&many).expect("embeds");
        let pooled_count = long_got[1..]
            .iter()
            .zip(&long_alone)
            .take_while(|(got, alone)| cosine(got, alone) < 0.9999)
            .count();
        assert!(
            (10..30).contains(&pooled_count),
            "{precision:?}: {pooled_count} units pooled"
        );
        for (got, unit) in long_got[1 + pooled_count..]
            .iter()
            .zip(&long_alone[pooled_count..])
        {
            assert!(
                cosine(got, unit) > 0.99999,
                "{precision:?}: past the cut, alone"
            );
        }
        // A text's vectors do not depend on the texts it shares a call with.
        let by_itself = pooled
            .embed_spans(&[mixed.as_str()], std::slice::from_ref(&mixed_spans))
            .expect("embeds");
        for (a, b) in by_itself.iter().zip(mixed_got) {
            assert!(cosine(a, b) > 0.99999, "{precision:?}");
        }
    }
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
