//! Acked: the ingest state follows what the index acknowledged.
//!
//! The differential upsert records a document's new chunk ids when its event is applied, before the
//! embedder and the index took them. Where either refuses the document, the index holds something
//! else than that state, and the document's next event would be diffed against the wrong one (an
//! identical re-send would give no work at all, a later version would skip the chunks it shares with
//! the refused one). So the Embed and IndexWrite operators of a worker (both keyed by
//! [`DocKey::route`], so one worker sees all of a document) share this ledger:
//! - while a document has a write in flight, its later deltas wait in Embed, in order;
//! - after a refusal the writer reads back the ids the index holds of the document;
//! - the document's next delta (ChunkDiff gives one for every event, with work or not) is computed
//!   again against them ([`diff_owned`]) from the whole new set it carries.
//!
//! Re-sending the refused version, or any later one, therefore converges to exactly its chunks. The
//! ledger lives in memory: after a restart the hydration reads what the index holds anyway.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use super::diff::{diff_owned, ChunkDelta};
use crate::model::{ChunkIds, DocKey};
use crate::offload::with_backoff;
use crate::store::{SearchFilter, StoreError, VectorStore};

/// The documents of one worker with a write in flight, and what the index holds of those whose last
/// write was refused.
#[derive(Default)]
pub struct Acked {
    in_flight: HashMap<DocKey, usize>,
    held: HashMap<DocKey, ChunkIds>,
    embed: Option<timely::scheduling::Activator>,
}

/// The ledger shared by a worker's Embed and IndexWrite operators.
pub type SharedAcked = Rc<RefCell<Acked>>;

impl Acked {
    /// A new, empty ledger to share.
    pub fn shared() -> SharedAcked {
        Rc::new(RefCell::new(Self::default()))
    }

    /// Whether `key` has a delta given to the writer and not finished yet.
    pub fn in_flight(&self, key: &DocKey) -> bool {
        self.in_flight.contains_key(key)
    }

    /// The delta to embed and write for `delta` (computed again against what the index holds where
    /// the document's last write was refused), counted in flight; `None` when it changes nothing.
    pub fn admit(&mut self, delta: ChunkDelta) -> Option<ChunkDelta> {
        let delta = match self.held.remove(&delta.key) {
            Some(held) => {
                let (key, time) = (delta.key.clone(), delta.time);
                tracing::info!(document = %key, "diffing against what the index holds after a refusal");
                diff_owned(&key, Some(&held), delta.into_new_set(), time)
            }
            None => delta,
        };
        if !delta.has_work() {
            return None;
        }
        *self.in_flight.entry(delta.key.clone()).or_default() += 1;
        Some(delta)
    }

    /// A write of `key` finished; `held`: what the index holds of it, where it was refused.
    pub fn finished(&mut self, key: &DocKey, held: Option<ChunkIds>) {
        if let Some(count) = self.in_flight.get_mut(key) {
            *count -= 1;
            if *count == 0 {
                self.in_flight.remove(key);
            }
        }
        match held {
            Some(held) => self.held.insert(key.clone(), held),
            None => self.held.remove(key),
        };
    }

    /// Registers the Embed operator, woken when a write finishes.
    pub fn set_embed(&mut self, activator: timely::scheduling::Activator) {
        self.embed = Some(activator);
    }

    /// Wakes the Embed operator (deltas may wait for the write that finished).
    pub fn wake_embed(&self) {
        if let Some(embed) = &self.embed {
            embed.activate();
        }
    }
}

/// What the index holds of `key` (its point ids with their layouts, and the newest version), read on
/// the writer thread after a refusal; `None` (logged) when the index cannot say.
pub fn held_by_index(store: &dyn VectorStore, key: &DocKey) -> Option<ChunkIds> {
    let filter = SearchFilter {
        tenant: Some(key.tenant.clone()),
        doc_ids: vec![key.doc_id.clone()],
        ..SearchFilter::default()
    };
    let read = with_backoff(
        crate::outage::Dependency::Index,
        StoreError::is_retryable,
        || {
            let mut ids = Vec::new();
            let mut version = 0;
            store.scroll(&filter, &mut |stored| {
                if &stored.key == key {
                    version = version.max(stored.version);
                    ids.push((stored.id, stored.chunk.layout()));
                }
            })?;
            ids.sort_unstable();
            Ok(ChunkIds { version, ids })
        },
    );
    match read {
        Ok(ids) => Some(ids),
        Err(error) => {
            tracing::warn!(document = %key, %error, "cannot read what the index holds of a refused document");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::diff::diff_chunk_sets;
    use crate::ingest::diff::tests::chunks as set;

    const TEXT: &str = "Alpha one two three four five six seven.\n\nBravo one two three four five six seven.\n\nCharlie one two three four five six seven.";

    /// v1 was refused (the index holds nothing of it) but the upsert kept its ids: the identical
    /// re-send diffs to nothing, and the ledger makes it write every chunk; a later version sharing
    /// chunks with v1 is written whole too; without a refusal a delta is taken as it is.
    #[test]
    fn after_a_refusal_the_next_delta_is_computed_against_what_the_index_holds() {
        let key = DocKey::new("t", "d");
        let v1 = set(TEXT, 1);
        let resend = diff_chunk_sets(&key, Some(&v1.ids(&key)), Some(&v1), 5);
        assert!(!resend.has_work(), "the upsert sees nothing new");

        let mut acked = Acked::default();
        assert!(
            acked.admit(resend.clone()).is_none(),
            "no refusal: nothing to do"
        );
        let nothing = ChunkIds {
            version: 0,
            ids: Vec::new(),
        };
        acked.finished(&key, Some(nothing.clone()));
        let admitted = acked.admit(resend).expect("work after the refusal");
        assert_eq!(admitted.upserts.len(), v1.chunks.len());
        assert!(admitted.deletes.is_empty() && admitted.kept.is_empty());
        assert!(acked.in_flight(&key));
        acked.finished(&key, None);
        assert!(!acked.in_flight(&key));

        let v2 = set(&TEXT.replace("Charlie", "Delta"), 2);
        let later = diff_chunk_sets(&key, Some(&v1.ids(&key)), Some(&v2), 6);
        assert!(
            later.upserts.len() < v2.chunks.len(),
            "v2 shares chunks with v1"
        );
        acked.finished(&key, Some(nothing));
        let admitted = acked.admit(later).expect("work");
        assert_eq!(admitted.upserts.len(), v2.chunks.len(), "written whole");
        acked.finished(&key, None);

        let gone = diff_chunk_sets(&key, Some(&v2.ids(&key)), None, 7);
        let held = v2.ids(&key);
        acked.finished(
            &key,
            Some(ChunkIds {
                version: 2,
                ids: held.ids[..1].to_vec(),
            }),
        );
        let admitted = acked.admit(gone).expect("a delete");
        assert_eq!(
            admitted.deletes,
            vec![held.ids[0].0],
            "deletes what the index holds"
        );
    }
}
