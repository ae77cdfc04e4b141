//! A chunk as the index stores it: the payload written with its point, and the chunk read back
//! from it.

use super::*;

/// The payload stored with a chunk.
pub fn chunk_payload(point: &PointWrite) -> Map<String, Value> {
    let chunk = &point.chunk;
    let value = json!({
        "tenant": point.key.tenant,
        "doc_id": point.key.doc_id,
        "version": point.version,
        "order_index": chunk.order_index,
        "section_path": chunk.section_path,
        "header": chunk.header,
        "doc_title": chunk.doc_title,
        "source": chunk.source,
        "source_prefixes": source_prefixes(&chunk.source),
        "kind": chunk.kind.as_str(),
        "lines": [chunk.lines.0, chunk.lines.1],
        "page": chunk.page,
        "char_range": [chunk.char_range.0, chunk.char_range.1],
        "tokens": chunk.tokens,
        "content_hash": chunk.content_hash,
        "occurrence": chunk.occurrence,
        "embedder_version": point.embedder_version,
        "acl": chunk.acl,
        "lang": chunk.lang,
        "updated_ms": chunk.updated_ms,
        "last": chunk.last,
        "metadata": chunk.metadata.to_object(),
        "text": chunk.text,
    });
    match value {
        Value::Object(map) => map,
        _ => unreachable!("json! of an object literal"),
    }
}

/// Reads a chunk back from its payload; `None` if a field is missing (not a ragstream point). Takes
/// the payload, so its strings move into the chunk instead of being copied (every hit of a query's
/// lanes passes through here).
pub fn chunk_from_payload(id: uuid::Uuid, mut payload: Map<String, Value>) -> Option<StoredChunk> {
    fn text(payload: &mut Map<String, Value>, name: &str) -> Option<String> {
        match payload.remove(name)? {
            Value::String(text) => Some(text),
            _ => None,
        }
    }
    fn strings(payload: &mut Map<String, Value>, name: &str) -> Option<Vec<String>> {
        match payload.remove(name)? {
            Value::Array(values) => values
                .into_iter()
                .map(|value| match value {
                    Value::String(text) => Some(text),
                    _ => None,
                })
                .collect(),
            _ => None,
        }
    }
    let number =
        |payload: &Map<String, Value>, name: &str| payload.get(name).and_then(Value::as_u64);
    let pair = |payload: &Map<String, Value>, name: &str| {
        let array = payload.get(name)?.as_array()?;
        Some((
            array.first()?.as_u64()? as u32,
            array.get(1)?.as_u64()? as u32,
        ))
    };
    let p = &mut payload;
    let key = DocKey::new(text(p, "tenant")?, text(p, "doc_id")?);
    let embedder_version = text(p, "embedder_version")?;
    let section_path = strings(p, "section_path")?;
    let header = text(p, "header")?;
    let doc_title = text(p, "doc_title")?;
    let source = text(p, "source")?;
    let kind = DocKind::parse(&text(p, "kind")?)?;
    let content_hash = text(p, "content_hash")?;
    let acl = strings(p, "acl")?;
    // Absent from points written before languages were detected.
    let lang = text(p, "lang").unwrap_or_default();
    let chunk_text = text(p, "text")?;
    Some(StoredChunk {
        id,
        key,
        version: number(p, "version")?,
        embedder_version,
        chunk: Chunk {
            order_index: number(p, "order_index")? as u32,
            section_path,
            header,
            doc_title,
            source,
            kind,
            lines: pair(p, "lines")?,
            page: number(p, "page")
                .and_then(|page| u32::try_from(page).ok())
                .filter(|&page| page > 0),
            char_range: pair(p, "char_range")?,
            tokens: number(p, "tokens")? as u32,
            content_hash,
            // Absent from points written before chunks had stable ids (their id is the stored one).
            occurrence: number(p, "occurrence").unwrap_or(0) as u32,
            acl,
            lang,
            // Absent from points written before document times were kept.
            updated_ms: number(p, "updated_ms").unwrap_or(0),
            metadata: crate::metadata::Metadata::from_payload(p.get("metadata")),
            text: chunk_text,
            // Absent from points written before it was kept: unknown, so neighbours are read.
            last: p.get("last").and_then(Value::as_bool).unwrap_or(false),
        },
    })
}
