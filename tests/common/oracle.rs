//! The oracle: the latest version of every live document, folded from what was produced, chunked with
//! the job's chunker; and the index's contents, read back from its shards.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use ragstream_operators::ingest::chunk::{Chunker, ChunkerConfig};
use ragstream_operators::model::{DocKey, DocKind, Document};
use ragstream_operators::store::edge::EdgeStore;
use ragstream_operators::store::{SearchFilter, VectorStore};

/// `(tenant/doc_id, order_index, content_hash, layout)` of one chunk: what it embeds and where it
/// stands (line and byte ranges, header, ACL: [`ragstream_operators::model::Chunk::layout`]).
pub type ChunkId = (String, u32, String, u64);

/// A SQuAD paragraph as a document.
#[derive(Clone, Debug)]
pub struct Paragraph {
    /// Corpus id (`Title#i`).
    pub id: String,
    /// Wikipedia title.
    pub title: String,
    /// Paragraph text.
    pub text: String,
}

/// Reads the SQuAD paragraphs.
pub fn squad() -> Vec<Paragraph> {
    let text =
        std::fs::read_to_string(super::data_dir().join("squad-v1.1/corpus.jsonl")).expect("corpus");
    text.lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).expect("json line");
            Paragraph {
                id: value["_id"].as_str().expect("_id").to_string(),
                title: value["title"].as_str().unwrap_or("").to_string(),
                text: value["text"].as_str().expect("text").to_string(),
            }
        })
        .collect()
}

/// Folds produced events into the expected live documents.
#[derive(Default)]
pub struct Oracle {
    docs: BTreeMap<DocKey, (u64, Option<Document>)>,
}

impl Oracle {
    /// An upsert event's JSON and the oracle's update.
    pub fn upsert(
        &mut self,
        tenant: &str,
        doc_id: &str,
        version: u64,
        title: &str,
        text: &str,
    ) -> (String, Option<Vec<u8>>) {
        let key = DocKey::new(tenant, doc_id);
        let document = Document {
            key: key.clone(),
            version,
            source: format!("squad/{doc_id}"),
            kind: DocKind::Prose,
            title: Some(title.to_string()),
            text: text.to_string(),
            acl: vec![],
            updated_ms: 0,
            metadata: Default::default(),
        };
        let body = serde_json::json!({
            "op": "upsert", "tenant": tenant, "doc_id": doc_id, "version": version,
            "source": document.source, "kind": "prose", "title": title, "text": text,
        });
        self.apply(key.clone(), Some(version), Some(document));
        (key.to_string(), Some(body.to_string().into_bytes()))
    }

    /// A versioned delete event.
    pub fn delete(
        &mut self,
        tenant: &str,
        doc_id: &str,
        version: u64,
    ) -> (String, Option<Vec<u8>>) {
        let key = DocKey::new(tenant, doc_id);
        let body = serde_json::json!({ "op": "delete", "tenant": tenant, "doc_id": doc_id, "version": version });
        self.apply(key.clone(), Some(version), None);
        (key.to_string(), Some(body.to_string().into_bytes()))
    }

    /// A tombstone.
    pub fn tombstone(&mut self, tenant: &str, doc_id: &str) -> (String, Option<Vec<u8>>) {
        let key = DocKey::new(tenant, doc_id);
        self.apply(key.clone(), None, None);
        (key.to_string(), None)
    }

    fn apply(&mut self, key: DocKey, version: Option<u64>, document: Option<Document>) {
        let current = self.docs.get(&key).map(|(v, _)| *v);
        match (version, current) {
            (Some(version), Some(current)) if version < current => {} // stale: ignored
            (Some(version), _) => {
                self.docs.insert(key, (version, document));
            }
            (None, _) => {
                let version = current.unwrap_or(0);
                self.docs.insert(key, (version, None));
            }
        }
    }

    /// The live document of `key`, if any.
    pub fn live(&self, key: &DocKey) -> Option<&Document> {
        self.docs.get(key).and_then(|(_, d)| d.as_ref())
    }

    /// The chunks the index must hold.
    pub fn expected(&self, chunker: &Chunker) -> BTreeSet<ChunkId> {
        self.docs
            .iter()
            .filter_map(|(key, (_, doc))| doc.as_ref().map(|d| (key, d)))
            .flat_map(|(key, doc)| {
                chunker.chunk(doc).into_iter().map(move |c| {
                    let layout = c.layout();
                    (key.to_string(), c.order_index, c.content_hash, layout)
                })
            })
            .collect()
    }
}

/// The job's default chunker.
pub fn default_chunker() -> Chunker {
    Chunker::new(ChunkerConfig::default())
}

/// Every chunk in every shard under `index`.
pub fn index_contents(index: &Path) -> BTreeSet<ChunkId> {
    let mut out = BTreeSet::new();
    let mut duplicates = 0;
    for entry in std::fs::read_dir(index).expect("index dir").flatten() {
        if !entry.file_name().to_string_lossy().starts_with("shard-") {
            continue;
        }
        let store = EdgeStore::open(&entry.path(), 384).expect("open shard");
        duplicates += store_contents(&store, &mut out);
    }
    assert_eq!(duplicates, 0, "a chunk is stored twice");
    out
}

/// Adds every chunk `store` holds to `out`; returns how many were there already.
pub fn store_contents(store: &dyn VectorStore, out: &mut BTreeSet<ChunkId>) -> usize {
    let mut duplicates = 0;
    store
        .scroll(&SearchFilter::default(), &mut |stored| {
            let layout = stored.chunk.layout();
            if !out.insert((
                stored.key.to_string(),
                stored.chunk.order_index,
                stored.chunk.content_hash,
                layout,
            )) {
                duplicates += 1;
            }
        })
        .expect("scroll");
    duplicates
}

/// Lost (expected, missing) and stale (present, unexpected) chunk counts, with examples.
pub fn compare(expected: &BTreeSet<ChunkId>, actual: &BTreeSet<ChunkId>) -> (usize, usize, String) {
    let lost: Vec<&ChunkId> = expected.difference(actual).collect();
    let stale: Vec<&ChunkId> = actual.difference(expected).collect();
    let example = format!(
        "lost e.g. {:?}; stale e.g. {:?}",
        lost.iter().take(3).collect::<Vec<_>>(),
        stale.iter().take(3).collect::<Vec<_>>()
    );
    (lost.len(), stale.len(), example)
}

/// The document keys stored in one shard.
pub fn shard_keys(path: &Path) -> BTreeSet<String> {
    let store = EdgeStore::open(path, 384).expect("open shard");
    let mut keys = BTreeSet::new();
    store
        .scroll(&SearchFilter::default(), &mut |stored| {
            keys.insert(stored.key.to_string());
        })
        .expect("scroll");
    keys
}
