//! ChunkDiff: consolidated document-level diffs → per-document chunk deltas.
//!
//! Input: the differential collection of `(DocKey, ChunkIds)` maintained by `arrange_from_upsert` (a
//! document's version and point ids: the state kept for the whole corpus holds no text), and beside it
//! the chunk sets the upsert was fed. At each completed time a changed document shows up as `-old`
//! and/or `+new`; identical re-upserts cancel out and never appear. The new ids' chunks are looked up
//! among the sets fed at that time (by key and version). The diff by point id (which covers order index
//! and content hash) gives the index work: retracted chunks are deleted, new chunks embedded and
//! upserted, and unchanged chunks are neither re-embedded nor rewritten (only counted).
//!
//! Time 0 is the hydration epoch: it loads what the index already holds into the collection and
//! produces no index work.

use std::collections::{BTreeMap, HashMap, HashSet};

use differential_dataflow::Hashable;
use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::{Exchange, Pipeline};
use timely::dataflow::operators::{Capability, Operator};
use timely::dataflow::StreamVec;

use crate::metrics::metrics;
use crate::model::{point_id, Chunk, ChunkIds, ChunkSet, DocKey};

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
    /// Unchanged chunks rewritten at the new version with their stored vectors (no embedding), so the
    /// index carries a version bump that changed no chunk.
    pub restamp: Vec<Chunk>,
    /// The ingestion time of the change (milliseconds since the epoch).
    pub time: u64,
}

/// The delta between a document's old chunks (their ids, as the upsert kept them) and its new chunk set.
pub fn diff_chunk_sets(
    key: &DocKey,
    old: Option<&ChunkIds>,
    new: Option<&ChunkSet>,
    time: u64,
) -> ChunkDelta {
    let old_ids: HashSet<uuid::Uuid> = old
        .map(|o| o.ids.iter().copied().collect())
        .unwrap_or_default();
    let new_ids: HashSet<uuid::Uuid> = new
        .map(|s| {
            s.chunks
                .iter()
                .map(|c| point_id(key, c.order_index, &c.content_hash))
                .collect()
        })
        .unwrap_or_default();
    let mut deletes: Vec<uuid::Uuid> = old_ids.difference(&new_ids).copied().collect();
    deletes.sort();
    let upserts: Vec<Chunk> = new
        .map(|s| {
            s.chunks
                .iter()
                .filter(|c| !old_ids.contains(&point_id(key, c.order_index, &c.content_hash)))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    let unchanged = new_ids.intersection(&old_ids).count();
    // The index must carry the new version even when no chunk changed (a same-text update, a shrink
    // that keeps the prefix): hydration seeds the version guard from the newest stored chunk version,
    // and a lagging one would let a late older event back in after a restart. Rewriting one unchanged
    // chunk at the new version, with the vector the index already holds, is enough and embeds nothing.
    let mut restamp = Vec::new();
    if let (Some(old), Some(new)) = (old, new) {
        if upserts.is_empty() && new.version != old.version {
            restamp.extend(new.chunks.first().cloned());
        }
    }
    let version = new
        .map(|s| s.version)
        .or(old.map(|o| o.version))
        .unwrap_or(0);
    ChunkDelta {
        key: key.clone(),
        version,
        deletes,
        upserts,
        unchanged,
        restamp,
        time,
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
                let mut stash: BTreeMap<u64, (Capability<u64>, Changes)> = BTreeMap::new();
                let mut chunks: BTreeMap<u64, HashMap<(DocKey, u64), ChunkSet>> = BTreeMap::new();
                move |(input, frontier), (sets, sets_frontier), output| {
                    sets.for_each(|_cap, data| {
                        for (key, set, time) in data.drain(..) {
                            if let Some(set) = set {
                                chunks
                                    .entry(time)
                                    .or_default()
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
                    while let Some(entry) = stash.first_entry() {
                        if !done(entry.key()) {
                            break;
                        }
                        let time = *entry.key();
                        let (cap, changes) = entry.remove();
                        let mut sets_at = chunks.remove(&time).unwrap_or_default();
                        if time == HYDRATION_TIME {
                            let hydrated: usize = changes
                                .values()
                                .filter_map(|(_, new)| new.as_ref())
                                .map(|ids| ids.ids.len())
                                .sum();
                            metrics().chunks_hydrated.inc_by(hydrated as u64);
                            continue;
                        }
                        let mut session = output.session(&cap);
                        for (key, (old, new)) in changes {
                            let new = new.map(|ids| {
                                sets_at
                                    .remove(&(key.clone(), ids.version))
                                    .expect("the upsert's value was fed at its time")
                            });
                            let delta = diff_chunk_sets(&key, old.as_ref(), new.as_ref(), time);
                            metrics().chunks_unchanged.inc_by(delta.unchanged as u64);
                            if !delta.deletes.is_empty()
                                || !delta.upserts.is_empty()
                                || !delta.restamp.is_empty()
                            {
                                session.give(delta);
                            }
                        }
                    }
                    // Sets of done times the upsert showed no change for (identical re-upserts).
                    while let Some(entry) = chunks.first_entry() {
                        if !done(entry.key()) {
                            break;
                        }
                        entry.remove();
                    }
                }
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::chunk::{Chunker, ChunkerConfig};
    use crate::model::{DocKind, Document};

    fn chunks(text: &str, version: u64) -> ChunkSet {
        let chunker = Chunker::new(ChunkerConfig {
            prose_tokens: 12,
            ..ChunkerConfig::default()
        });
        let doc = Document {
            key: DocKey::new("t", "d"),
            version,
            source: "d.txt".into(),
            kind: DocKind::Prose,
            title: None,
            text: text.into(),
            acl: vec![],
        };
        ChunkSet {
            version,
            chunks: chunker.chunk(&doc),
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
}
