//! The local MiniLM embedder agrees with sentence-transformers (reference vectors made by
//! `deploy/scripts/make_reference_vectors.py` and committed as a fixture).

mod common;

use ragstream_operators::embed::minilm::MiniLm;
use ragstream_operators::embed::{cosine, Embedder};

#[test]
fn minilm_matches_sentence_transformers() {
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/minilm_reference.json"))
            .expect("fixture is JSON");
    let sentences: Vec<String> =
        serde_json::from_value(fixture["sentences"].clone()).expect("sentences");
    let expected: Vec<Vec<f32>> =
        serde_json::from_value(fixture["vectors"].clone()).expect("vectors");
    let wordpieces: Vec<usize> =
        serde_json::from_value(fixture["wordpieces"].clone()).expect("wordpieces");
    let mut model = MiniLm::load(&common::model_dir(), 8).expect("model loads");
    assert_eq!(model.dimension(), 384);
    let texts: Vec<&str> = sentences.iter().map(String::as_str).collect();
    let vectors = model.embed(&texts).expect("embeds");
    assert_eq!(vectors.len(), sentences.len());
    let mut worst = f32::MAX;
    for (index, (got, want)) in vectors.iter().zip(&expected).enumerate() {
        let similarity = cosine(got, want);
        worst = worst.min(similarity);
        assert!(
            similarity >= 0.999,
            "sentence {index} ({:?}…): cosine {similarity}",
            &sentences[index].chars().take(40).collect::<String>()
        );
        let norm: f32 = got.iter().map(|v| v * v).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "normalised");
    }
    eprintln!("worst cosine vs sentence-transformers: {worst:.6}");
    // Word pieces before truncation match the reference tokenizer; the long one exceeds 256 and is cut.
    for (sentence, &count) in sentences.iter().zip(&wordpieces) {
        assert_eq!(model.word_pieces(sentence).expect("tokenizes"), count);
    }
    assert!(
        wordpieces.iter().any(|&count| count > 256),
        "the fixture exercises truncation"
    );
    // Order independence: embedding one sentence alone gives the same vector as in the batch.
    let single = model.embed(&texts[3..4]).expect("single");
    assert!(cosine(&single[0], &vectors[3]) > 0.99999);
}
