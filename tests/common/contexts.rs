//! The queries and the comparison of contexts shared by the tests that run the same data through two
//! setups (a cluster against one process, the Qdrant server against the embedded index).

use ragstream_core::query::Context;
use serde_json::json;

/// The queries: bounded at two budgets, deep, files and list_sources, over SQuAD paragraphs' phrases.
pub fn queries(paragraphs: &[super::oracle::Paragraph]) -> Vec<(String, serde_json::Value)> {
    let mut out = Vec::new();
    for (i, p) in paragraphs.iter().step_by(10).take(24).enumerate() {
        let phrase: Vec<&str> = p.text.split_whitespace().skip(12).take(9).collect();
        let text = phrase.join(" ");
        let (mode, budget) = match i % 6 {
            0 | 1 => ("bounded", 500),
            2 | 3 => ("bounded", 1500),
            4 => ("deep", 0),
            _ => ("files", 0),
        };
        let mut query = json!({"tenant": "squad", "text": text, "mode": mode, "k": 5});
        if budget > 0 {
            query["token_budget"] = json!(budget);
        }
        out.push((format!("q{i}"), query));
    }
    out.push((
        "sources".to_string(),
        json!({"tenant": "squad", "text": "", "mode": "list_sources"}),
    ));
    out
}

/// What must be equal between the runs: the items and the packed text (not latencies or watermarks).
pub fn comparable(context: &Context) -> serde_json::Value {
    json!({
        "error": context.error,
        "intent": context.intent_name(),
        "tokens_used": context.tokens_used,
        "chunks_available": context.chunks_available,
        "items": context.items.iter().map(|item| json!({
            "chunk_id": item.chunk_id, "tier": item.tier, "lines": item.lines, "text": item.text,
        })).collect::<Vec<_>>(),
        "sources": context.sources.iter().map(|s| json!([s.source, s.chunks, s.hits])).collect::<Vec<_>>(),
        "context": context.context,
    })
}

/// A context's items ((chunk id, text, tokens), in order) and its packed string.
pub type Items = (Vec<(String, String, u64)>, String);

/// What a version's or a one-shot context's items are, as the JSON answers carry them: (chunk id,
/// text, tokens) in order, and the packed string.
pub fn items(context: &serde_json::Value) -> Items {
    let items = context["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|item| {
                    (
                        item["chunk_id"].as_str().unwrap_or_default().to_string(),
                        item["text"].as_str().unwrap_or_default().to_string(),
                        item["tokens"].as_u64().unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    (
        items,
        context["context"].as_str().unwrap_or_default().to_string(),
    )
}
