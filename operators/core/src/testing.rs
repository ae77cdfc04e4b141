//! Builders of test records, for this crate's tests and (feature `testing`) the tests of the crates
//! above it.

use crate::ingest::chunk::content_hash;
use crate::model::{Chunk, DocKey, DocKind};
use crate::store::{Bm25Encoder, PointWrite, StoredChunk};

/// A stored chunk of `doc` at `order` with `text` (tenant `t`, embedder version `test`).
pub fn stored(doc: &str, order: u32, text: &str) -> StoredChunk {
    let start = order * 1000;
    StoredChunk {
        id: uuid::Uuid::new_v5(
            &uuid::Uuid::NAMESPACE_OID,
            format!("{doc}#{order}").as_bytes(),
        ),
        key: DocKey::new("t", doc),
        version: 1,
        embedder_version: "test".into(),
        chunk: Chunk {
            order_index: order,
            section_path: vec![format!("{doc} section {order}")],
            header: format!("{doc} section {order}"),
            doc_title: format!("Title of {doc}"),
            source: format!("src/{doc}.md"),
            kind: DocKind::Prose,
            lines: (order * 10 + 1, order * 10 + 9),
            char_range: (start, start + text.len() as u32),
            tokens: crate::tokens::TokenCounter::new(crate::tokens::Encoding::O200kBase).count(text)
                as u32,
            content_hash: blake3::hash(text.as_bytes()).to_hex().to_string(),
            occurrence: 0,
            acl: vec![],
            updated_ms: 0,
            metadata: Default::default(),
            lang: "eng".into(),
            text: text.into(),
        },
    }
}

/// Vector dimension of [`sample_point`]s (the store contract's collections).
pub const DIMENSION: usize = 8;

fn unit(axis: usize) -> Vec<f32> {
    let mut v = vec![0.01; DIMENSION];
    v[axis % DIMENSION] = 1.0;
    crate::embed::l2_normalize(&mut v);
    v
}

/// A point for `tenant/doc_id` with `text` (language `eng`), its dense vector on an axis derived from
/// the text.
pub fn sample_point(
    tenant: &str,
    doc_id: &str,
    version: u64,
    text: &str,
    acl: &[&str],
) -> PointWrite {
    let mut chunk = Chunk {
        order_index: 0,
        section_path: vec!["Section".into()],
        header: "Section".into(),
        doc_title: doc_id.into(),
        source: format!("docs/{doc_id}"),
        kind: DocKind::Prose,
        lines: (1, 1),
        char_range: (0, text.len() as u32),
        tokens: 3,
        content_hash: String::new(),
        occurrence: 0,
        acl: acl.iter().map(|s| s.to_string()).collect(),
        updated_ms: 0,
        metadata: Default::default(),
        lang: "eng".into(),
        text: text.into(),
    };
    chunk.content_hash = content_hash(&chunk);
    let axis = text.bytes().map(usize::from).sum::<usize>();
    let key = DocKey::new(tenant, doc_id);
    PointWrite {
        id: chunk.point_id(&key),
        key,
        version,
        sparse: Bm25Encoder::default().encode_document(&chunk.embedding_input()),
        dense: unit(axis),
        evidence: Vec::new(),
        chunk,
        embedder_version: "test-embedder".into(),
    }
}
