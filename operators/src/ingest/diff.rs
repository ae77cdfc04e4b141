//! ChunkDiff: consolidated document-level diffs → per-document chunk deltas.
//!
//! Input: the differential collection of `(DocKey, ChunkIds)` maintained by `arrange_from_upsert` (a
//! document's version and point ids: the state kept for the whole corpus holds no text), and beside it
//! the chunk sets the upsert was fed. At each completed time a changed document shows up as `-old`
//! and/or `+new`; identical re-upserts cancel out and never appear. The new ids' chunks are looked up
//! among the sets fed at that time (by key and version). The diff by point id (what the embedder sees,
//! whatever the position) and layout gives the index work: retracted chunks are deleted, new chunks
//! embedded and upserted, moved chunks rewritten with their stored vectors, and unchanged chunks are
//! neither re-embedded nor rewritten (only counted).
//!
//! A value no event fed (no chunk set at its time) is the index's own: the hydration at time 0 loads
//! what the index holds at start, and a shared index is read again at every partition assignment
//! ([`super::guard`]). It produces no index work; the document's next event is diffed against it.

use std::collections::{BTreeMap, HashMap, HashSet};

use differential_dataflow::Hashable;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::{Exchange, Pipeline};
use timely::dataflow::operators::{Capability, Operator};
use timely::dataflow::StreamVec;

use crate::metrics::metrics;
use crate::model::{Chunk, ChunkIds, ChunkSet, DocKey};

/// The hydration epoch: updates at this time come from the index itself.
pub const HYDRATION_TIME: u64 = 0;

/// Index work for one document at one time.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct ChunkDelta {
    /// The document.
    pub key: DocKey,
    /// Version of the new chunk set (of the old one for a delete).
    pub version: u64,
    /// Point ids to delete.
    pub deletes: Vec<uuid::Uuid>,
    /// Chunks to embed and upsert.
    pub upserts: Vec<Chunk>,
    /// Chunks present before and after: never re-embedded (counted, and rewritten only when in `restamp`).
    pub unchanged: usize,
    /// Chunks whose embedded text is unchanged, rewritten at the new version with their stored vectors
    /// (no embedding): those that moved or whose payload changed, and one chunk to carry a version bump
    /// that changed nothing else.
    pub restamp: Vec<Chunk>,
    /// The ids a published context may cite whose stored record this delta deletes or rewrites with a
    /// new layout (not the chunk that only carries a version bump): what invalidates such a context
    /// (`query::invalidate`).
    pub changed: Vec<uuid::Uuid>,
    /// The ingestion time of the change (milliseconds since the epoch).
    pub time: u64,
    /// The document of the new chunk set (what a refusal dead-letters); `None` for a delete.
    #[serde(default)]
    pub document: Option<std::sync::Arc<crate::model::Document>>,
    /// The new set's chunks present before with the same layout (neither embedded nor rewritten):
    /// with `upserts` and `restamp`, the whole new set, so the delta can be computed again against
    /// what the index holds after a refusal ([`super::acked`]).
    #[serde(default)]
    pub kept: Vec<Chunk>,
    /// The document is deleted (there is no new set).
    #[serde(default)]
    pub delete: bool,
}

impl ChunkDelta {
    /// Whether the delta changes the index at all.
    pub fn has_work(&self) -> bool {
        !self.deletes.is_empty() || !self.upserts.is_empty() || !self.restamp.is_empty()
    }

    /// The new chunk set this delta leads to (`None` for a delete), its chunks in order.
    pub fn into_new_set(self) -> Option<ChunkSet> {
        if self.delete {
            return None;
        }
        let mut chunks: Vec<Chunk> = self
            .upserts
            .into_iter()
            .chain(self.restamp)
            .chain(self.kept)
            .collect();
        chunks.sort_by_key(|chunk| chunk.order_index);
        Some(ChunkSet {
            version: self.version,
            chunks,
            document: self.document,
        })
    }
}

/// The delta between a document's old chunks (their ids and layouts, as the upsert kept them) and its
/// new chunk set: a new id is embedded, an id kept with a new layout (the chunk moved, or its header or
/// ACL changed) is rewritten with its stored vector, an id kept as it was is left alone, and an id gone
/// is deleted.
pub fn diff_chunk_sets(
    key: &DocKey,
    old: Option<&ChunkIds>,
    new: Option<&ChunkSet>,
    time: u64,
) -> ChunkDelta {
    diff_owned(key, old, new.cloned(), time)
}

/// [`diff_chunk_sets`], taking the new set's chunks rather than copying them.
pub fn diff_owned(
    key: &DocKey,
    old: Option<&ChunkIds>,
    new: Option<ChunkSet>,
    time: u64,
) -> ChunkDelta {
    let old_ids: HashMap<uuid::Uuid, u64> = old
        .map(|o| o.ids.iter().copied().collect())
        .unwrap_or_default();
    let delete = new.is_none();
    let (new_version, document, chunks) = match new {
        Some(set) => (Some(set.version), set.document, set.chunks),
        None => (None, None, Vec::new()),
    };
    let mut new_ids: HashSet<uuid::Uuid> = HashSet::new();
    let mut upserts = Vec::new();
    let mut restamp = Vec::new();
    let mut kept = Vec::new();
    let mut unchanged = 0;
    for chunk in chunks {
        let id = chunk.point_id(key);
        new_ids.insert(id);
        match old_ids.get(&id) {
            None => upserts.push(chunk),
            Some(&layout) => {
                unchanged += 1;
                if layout != chunk.layout() {
                    restamp.push(chunk);
                } else {
                    kept.push(chunk);
                }
            }
        }
    }
    let mut deletes: Vec<uuid::Uuid> = old_ids
        .keys()
        .filter(|id| !new_ids.contains(id))
        .copied()
        .collect();
    deletes.sort();
    let mut changed: Vec<uuid::Uuid> = deletes
        .iter()
        .copied()
        .chain(restamp.iter().map(|chunk: &Chunk| chunk.point_id(key)))
        .collect();
    changed.sort();
    // The index must carry the new version even when no chunk changed (a same-text update, a shrink
    // that keeps the prefix): hydration seeds the version guard from the newest stored chunk version,
    // and a lagging one would let a late older event back in after a restart. Rewriting one unchanged
    // chunk at the new version, with the vector the index already holds, is enough and embeds nothing.
    if let (Some(old), Some(version)) = (old, new_version) {
        if upserts.is_empty() && restamp.is_empty() && version != old.version && !kept.is_empty() {
            restamp.push(kept.remove(0));
        }
    }
    let version = new_version.or(old.map(|o| o.version)).unwrap_or(0);
    ChunkDelta {
        key: key.clone(),
        version,
        deletes,
        upserts,
        unchanged,
        restamp,
        changed,
        time,
        document,
        kept,
        delete,
    }
}

/// Extension trait: turn collection diffs into chunk deltas.
pub trait DiffChunks<'scope> {
    /// One [`ChunkDelta`] per changed document and completed time (none for the hydration epoch).
    /// `sets` are the chunk sets the upsert was fed (by key and version); their chunks are looked up
    /// when a document's new ids come out of the upsert, and dropped once their time is done.
    fn diff_chunks(
        self,
        sets: StreamVec<'scope, u64, (DocKey, Option<ChunkSet>, u64)>,
    ) -> StreamVec<'scope, u64, ChunkDelta>;
}

impl<'scope> DiffChunks<'scope> for StreamVec<'scope, u64, ((DocKey, ChunkIds), u64, isize)> {
    fn diff_chunks(
        self,
        sets: StreamVec<'scope, u64, (DocKey, Option<ChunkSet>, u64)>,
    ) -> StreamVec<'scope, u64, ChunkDelta> {
        // The sets go where the upsert sends their keys.
        let exchange = Exchange::new(|(key, _, _): &(DocKey, Option<ChunkSet>, u64)| key.hashed());
        self.binary_frontier::<_, CapacityContainerBuilder<Vec<_>>, _, _, _, _>(
            sets,
            Pipeline,
            exchange,
            "ChunkDiff",
            move |_cap, _info| {
                type Changes = BTreeMap<DocKey, (Option<ChunkIds>, Option<ChunkIds>)>;
                type Sets = HashMap<(DocKey, u64), ChunkSet>;
                let mut stash: BTreeMap<u64, (Capability<u64>, Changes)> = BTreeMap::new();
                // The sets fed at each time, with a capability: a time whose sets the upsert showed
                // no change for (identical re-upserts) still gives their deltas without work.
                let mut chunks: BTreeMap<u64, (Capability<u64>, Sets)> = BTreeMap::new();
                move |(input, frontier), (sets, sets_frontier), output| {
                    sets.for_each(|cap, data| {
                        for (key, set, time) in data.drain(..) {
                            if let Some(set) = set {
                                chunks
                                    .entry(time)
                                    .or_insert_with(|| (cap.delayed(&time, 0), HashMap::new()))
                                    .1
                                    .insert((key, set.version), set);
                            }
                        }
                    });
                    input.for_each(|cap, data| {
                        for ((key, ids), time, diff) in data.drain(..) {
                            let retained = cap.delayed(&time, 0);
                            let entry = stash
                                .entry(time)
                                .or_insert_with(|| (retained, BTreeMap::new()));
                            let slot = entry.1.entry(key).or_default();
                            // The upsert emits at most one retraction and one addition per key and time.
                            if diff < 0 {
                                slot.0 = Some(ids);
                            } else {
                                slot.1 = Some(ids);
                            }
                        }
                    });
                    let done =
                        |time: &u64| !frontier.less_equal(time) && !sets_frontier.less_equal(time);
                    // Done times in order (a document's deltas leave in the order of its events).
                    loop {
                        let time = match (stash.keys().next(), chunks.keys().next()) {
                            (Some(a), Some(b)) => *a.min(b),
                            (Some(a), None) => *a,
                            (None, Some(b)) => *b,
                            (None, None) => break,
                        };
                        if !done(&time) {
                            break;
                        }
                        let changed = stash.remove(&time);
                        let fed = chunks.remove(&time);
                        let cap = match (&changed, &fed) {
                            (Some((cap, _)), _) | (None, Some((cap, _))) => cap.clone(),
                            (None, None) => unreachable!("a time of either map"),
                        };
                        let changes = changed.map(|(_, changes)| changes).unwrap_or_default();
                        let mut sets_at = fed.map(|(_, sets)| sets).unwrap_or_default();
                        let mut session = output.session(&cap);
                        let mut hydrated = 0;
                        for (key, (old, new)) in changes {
                            let new = match new {
                                Some(ids) => match sets_at.remove(&(key.clone(), ids.version)) {
                                    Some(set) => Some(set),
                                    None => {
                                        // Not fed by an event: the index's own ids (hydration at
                                        // start, or a shared index read again at an assignment).
                                        hydrated += ids.ids.len();
                                        continue;
                                    }
                                },
                                None => None,
                            };
                            let delta = diff_owned(&key, old.as_ref(), new, time);
                            metrics().chunks_unchanged.inc_by(delta.unchanged as u64);
                            // Also without work: Embed computes it again where the document's last
                            // write was refused (`super::acked`).
                            session.give(delta);
                        }
                        // Sets the upsert showed no change for (identical re-upserts): deltas
                        // without work, for the same reason.
                        for ((key, _), set) in sets_at {
                            let ids = set.ids(&key);
                            let delta = diff_owned(&key, Some(&ids), Some(set), time);
                            metrics().chunks_unchanged.inc_by(delta.unchanged as u64);
                            session.give(delta);
                        }
                        metrics().chunks_hydrated.inc_by(hydrated as u64);
                    }
                }
            },
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ingest::chunk::{Chunker, ChunkerConfig};
    use crate::model::{DocKind, Document};

    /// The chunk set of document `t/d` at `version` (prose chunks of 12 tokens).
    pub(crate) fn chunks(text: &str, version: u64) -> ChunkSet {
        let chunker = Chunker::new(ChunkerConfig {
            prose_tokens: 12,
            ..ChunkerConfig::default()
        });
        let doc = Document {
            version,
            source: "d.txt".into(),
            ..ragstream_core::testing::prose("t", "d", text)
        };
        ChunkSet {
            version,
            chunks: chunker.chunk(&doc),
            document: None,
        }
    }

    #[test]
    fn shrink_deletes_tail_and_keeps_prefix() {
        let key = DocKey::new("t", "d");
        let long = "Alpha one two three four five six seven.\n\nBravo one two three four five six seven.\n\nCharlie one two three four five six seven.";
        let short = "Alpha one two three four five six seven.";
        let old = chunks(long, 1);
        let new = chunks(short, 2);
        assert!(old.chunks.len() >= 3);
        let delta = diff_chunk_sets(&key, Some(&old.ids(&key)), Some(&new), 5);
        assert_eq!(delta.unchanged, 1, "the first chunk is identical");
        assert!(delta.upserts.is_empty(), "nothing to embed");
        assert_eq!(
            delta.restamp,
            new.chunks[..1],
            "rewritten at the new version"
        );
        assert_eq!(delta.deletes.len(), old.chunks.len() - 1);
        assert_eq!(delta.version, 2);
    }

    #[test]
    fn new_metadata_rewrites_every_chunk_and_embeds_none() {
        let key = DocKey::new("t", "d");
        let text =
            "Alpha one two three four five six seven.\n\nBravo one two three four five six seven.";
        let v1 = chunks(text, 1);
        let mut v2 = chunks(text, 2);
        let metadata = crate::metadata::Metadata::parse(&serde_json::json!({"team": "search"}))
            .expect("valid");
        for chunk in &mut v2.chunks {
            chunk.metadata = metadata.clone();
        }
        assert!(v2.chunks.len() >= 2);
        let delta = diff_chunk_sets(&key, Some(&v1.ids(&key)), Some(&v2), 5);
        assert!(delta.upserts.is_empty(), "nothing to embed");
        assert!(delta.deletes.is_empty());
        assert_eq!(
            delta.restamp, v2.chunks,
            "every chunk carries the new metadata"
        );
    }

    #[test]
    fn a_new_version_with_the_same_text_rewrites_one_chunk_and_a_replay_nothing() {
        let key = DocKey::new("t", "d");
        let text =
            "Alpha one two three four five six seven.\n\nBravo one two three four five six seven.";
        let (v1, v2) = (chunks(text, 1), chunks(text, 2));
        let bump = diff_chunk_sets(&key, Some(&v1.ids(&key)), Some(&v2), 5);
        assert!(bump.deletes.is_empty() && bump.upserts.is_empty());
        assert_eq!(
            bump.restamp,
            v2.chunks[..1],
            "one chunk carries version 2 into the index"
        );
        assert_eq!(bump.unchanged, v2.chunks.len());
        let replay = diff_chunk_sets(&key, Some(&v2.ids(&key)), Some(&v2), 6);
        assert!(
            replay.upserts.is_empty() && replay.deletes.is_empty() && replay.restamp.is_empty()
        );
    }

    #[test]
    fn delete_retracts_everything_and_insert_adds_everything() {
        let key = DocKey::new("t", "d");
        let set = chunks("Some text. More text here.", 1);
        let delete = diff_chunk_sets(&key, Some(&set.ids(&key)), None, 1);
        assert_eq!(delete.deletes.len(), set.chunks.len());
        assert!(delete.upserts.is_empty());
        let insert = diff_chunk_sets(&key, None, Some(&set), 1);
        assert_eq!(insert.upserts.len(), set.chunks.len());
        assert!(insert.deletes.is_empty());
    }

    /// Paragraphs of 1 to 6 sentences of 4 to 14 words, deterministic.
    fn paragraphs(count: usize, seed: u64) -> Vec<String> {
        const WORDS: [&str; 16] = [
            "river", "stone", "quiet", "engine", "harbor", "signal", "amber", "ledger", "orbit",
            "cedar", "pulse", "meadow", "copper", "lantern", "vector", "tide",
        ];
        let mut state = seed;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n) as usize
        };
        (0..count)
            .map(|_| {
                let sentences: Vec<String> = (0..1 + next(6))
                    .map(|_| {
                        let words: Vec<&str> = (0..4 + next(11)).map(|_| WORDS[next(16)]).collect();
                        let mut sentence = words.join(" ");
                        sentence[..1].make_ascii_uppercase();
                        sentence + "."
                    })
                    .collect();
                sentences.join(" ")
            })
            .collect()
    }

    /// Small functions of 1 to 8 body lines, each with a doc comment.
    fn items(count: usize) -> Vec<String> {
        (0..count)
            .map(|i| {
                let body: Vec<String> = (0..1 + (i * 7 + 3) % 8)
                    .map(|j| format!("    let v{j} = x.wrapping_mul({}) ^ {j};", i * 31 + j))
                    .collect();
                format!(
                    "/// Mixes step {i}.\nfn mix_{i}(x: u32) -> u32 {{\n{}\n    x\n}}",
                    body.join("\n")
                )
            })
            .collect()
    }

    fn set_of(kind: DocKind, blocks: &[String], version: u64) -> ChunkSet {
        let chunker = Chunker::new(ChunkerConfig {
            prose_tokens: 120,
            code_tokens: 80,
            ..ChunkerConfig::default()
        });
        let source = match kind {
            DocKind::Code => "lib.rs",
            DocKind::Markdown => "guide.md",
            _ => "notes.txt",
        };
        let doc = Document {
            key: DocKey::new("t", "d"),
            version,
            source: source.into(),
            kind,
            title: None,
            text: blocks.join("\n\n"),
            acl: vec![],
            updated_ms: 0,
            metadata: Default::default(),
        };
        ChunkSet {
            version,
            chunks: chunker.chunk(&doc),
            document: None,
        }
    }

    #[test]
    fn an_edit_embeds_only_the_chunks_next_to_it() {
        let key = DocKey::new("t", "d");
        let prose = paragraphs(260, 7);
        let mut markdown = Vec::new();
        for (i, paragraph) in paragraphs(260, 11).into_iter().enumerate() {
            if i % 12 == 0 {
                markdown.push(format!("## Part {}", i / 12));
            }
            markdown.push(paragraph);
        }
        let code = items(160);
        for (kind, blocks) in [
            (DocKind::Prose, prose),
            (DocKind::Markdown, markdown),
            (DocKind::Code, code),
        ] {
            let original = set_of(kind, &blocks, 1);
            assert!(
                original.chunks.len() >= 100,
                "{kind:?}: {} chunks",
                original.chunks.len()
            );
            let editable: Vec<usize> = (0..blocks.len())
                .filter(|&i| !blocks[i].starts_with('#'))
                .collect();
            for at in [
                editable[0],
                editable[editable.len() / 2],
                editable[editable.len() - 1],
            ] {
                let mut inserted = blocks.clone();
                inserted.insert(
                    at,
                    "A new paragraph of two sentences. It says little.".into(),
                );
                let mut deleted = blocks.clone();
                deleted.remove(at);
                let mut changed = blocks.clone();
                changed[at] = format!("{} One more sentence.", changed[at]);
                for (edit, edited) in [
                    ("insert", inserted),
                    ("delete", deleted),
                    ("change", changed),
                ] {
                    let new = set_of(kind, &edited, 2);
                    let delta = diff_chunk_sets(&key, Some(&original.ids(&key)), Some(&new), 2);
                    assert!(
                        delta.upserts.len() <= 3,
                        "{kind:?} {edit} at block {at}: {} of {} chunks embedded",
                        delta.upserts.len(),
                        new.chunks.len()
                    );
                    // Every chunk of the new set is embedded, moved (rewritten) or left as it is.
                    assert!(delta.unchanged + delta.upserts.len() == new.chunks.len());
                    let ids: HashSet<uuid::Uuid> =
                        new.chunks.iter().map(|c| c.point_id(&key)).collect();
                    assert_eq!(ids.len(), new.chunks.len(), "ids are distinct");
                }
            }
        }
    }

    #[test]
    fn a_moved_chunk_is_rewritten_with_its_vector_and_twins_keep_apart() {
        let key = DocKey::new("t", "d");
        let blocks = paragraphs(60, 3);
        let original = set_of(DocKind::Prose, &blocks, 1);
        let mut edited = vec!["A first paragraph. It pushes the rest down.".to_string()];
        edited.extend(blocks.iter().cloned());
        let new = set_of(DocKind::Prose, &edited, 2);
        let delta = diff_chunk_sets(&key, Some(&original.ids(&key)), Some(&new), 2);
        assert!(delta.upserts.len() <= 2, "{} embedded", delta.upserts.len());
        let old_ids: HashSet<uuid::Uuid> =
            original.chunks.iter().map(|c| c.point_id(&key)).collect();
        let moved: Vec<&Chunk> = new
            .chunks
            .iter()
            .filter(|c| old_ids.contains(&c.point_id(&key)))
            .collect();
        assert!(moved.len() + 3 >= new.chunks.len());
        assert_eq!(
            delta.restamp.len(),
            moved.len(),
            "every kept chunk stands at a new position and is rewritten"
        );
        assert!(delta.restamp.iter().all(|c| c.order_index > 0));
        // What a published context citing them must hear of: the moved chunks and the deleted ones.
        let mut expected: Vec<uuid::Uuid> = delta
            .deletes
            .iter()
            .copied()
            .chain(moved.iter().map(|c| c.point_id(&key)))
            .collect();
        expected.sort();
        assert_eq!(delta.changed, expected);

        // A version bump that changes nothing rewrites one chunk to carry the version, and changes
        // nothing a context cites.
        let bumped = set_of(DocKind::Prose, &blocks, 3);
        let bump = diff_chunk_sets(&key, Some(&original.ids(&key)), Some(&bumped), 3);
        assert_eq!(bump.restamp.len(), 1);
        assert!(bump.changed.is_empty());
        // A delete changes every chunk.
        let gone = diff_chunk_sets(&key, Some(&original.ids(&key)), None, 4);
        assert_eq!(gone.changed.len(), original.chunks.len());

        let twin = "The same words appear twice in this document, word for word, so that two chunks \
            carry one text. They are kept apart by their occurrence, never merged into one point, and \
            each keeps its own position. Both passages are long enough that two of them never fit \
            in one chunk of this test's budget, so the document has exactly two chunks, alike."
            .to_string();
        let twins = set_of(DocKind::Prose, &[twin.clone(), twin], 1);
        assert_eq!(twins.chunks.len(), 2);
        assert_eq!(twins.chunks[0].content_hash, twins.chunks[1].content_hash);
        assert_ne!(
            twins.chunks[0].point_id(&key),
            twins.chunks[1].point_id(&key),
            "identical passages of one document are two points"
        );
    }
}
