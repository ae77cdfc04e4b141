//! What the tools return: a context as text and structured content, the tools' filters as a
//! query's, a reindex run's status.

use super::*;

pub(super) fn filters(filter: Option<DocFilterArg>) -> Value {
    let filter = filter.map(DocFilterArg::into_filter).unwrap_or_default();
    json!({
        "doc_ids": filter.doc_ids,
        "source_prefix": filter.source_prefix,
        "source_pattern": filter.source_pattern,
        "kinds": filter.kinds,
        "langs": filter.langs,
        "metadata": filter.metadata.unwrap_or_default(),
    })
}

/// What a tool returns: the packed text (or listing) as text content, and the context's particulars
/// (items without their text, tokens, notes, watermark) as structured content.
pub(super) fn result(context: Context) -> CallToolResult {
    if let Some(error) = &context.error {
        return CallToolResult::error(vec![Content::text(error.clone())]);
    }
    let items: Vec<Value> = context
        .items
        .iter()
        .map(|item| {
            json!({
                "chunk_id": item.chunk_id,
                "doc_id": item.doc_id,
                "source": item.source,
                "lines": item.lines,
                "section_path": item.section_path,
                "tier": item.tier,
                "score": item.score,
                "tokens": item.tokens,
                // The design's names: the item as packed (`tokens`) and the whole chunk.
                "snippet_tokens": item.tokens,
                "full_tokens": item.full_tokens,
                "lanes": item.lanes,
                "metadata": item.metadata,
            })
        })
        .collect();
    let structured = json!({
        "query_id": context.query_id,
        "tenant": context.tenant,
        "mode": context.mode_name(),
        "intent": context.intent_name(),
        "tokens_used": context.tokens_used,
        "token_budget": context.token_budget,
        "max_new_tokens": context.max_new_tokens,
        "base_tokens": context.base_tokens,
        "generation_budget": context.generation_budget,
        "meta": context.meta,
        "chunks_available": context.chunks_available,
        "chunks_returned": context.chunks_returned,
        "unique_files": context.unique_files,
        "file_diversity_ratio": context.file_diversity_ratio,
        "truncated": context.truncated,
        "note": context.note,
        "items": items,
        "sources": context.sources,
        "next_cursor": context.next_cursor,
        "index_stats": context.index_stats,
        "index_watermark": context.index_watermark,
    });
    let mut out = CallToolResult::success(vec![Content::text(context.context)]);
    out.structured_content = Some(structured);
    out
}

impl RagTools {
    /// `force_reindex`'s answer: the run's status as text and structured content.
    pub(super) fn reindex_result(status: &ReindexStatus) -> CallToolResult {
        let text = format!(
            "reindex of {}: {} ({} documents, {} chunks, {} rewritten, {} skipped as changed by ingest){}",
            status.tenant,
            if status.running { "running" } else { "ended" },
            status.documents,
            status.chunks,
            status.rewritten,
            status.skipped,
            status
                .error
                .as_deref()
                .map_or_else(String::new, |e| format!("; stopped: {e}"))
        );
        let mut out = CallToolResult::success(vec![Content::text(text)]);
        out.structured_content = Some(json!(status));
        out
    }
}
