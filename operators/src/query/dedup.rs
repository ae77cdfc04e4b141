//! Dedup: exact duplicates leave (`ragstream_core::query::dedup`); near-duplicates leave against each
//! MMR pick.

use timely::dataflow::StreamVec;

use super::job::{ranked_step, Working};
use ragstream_core::query::dedup::dedup;

/// Extension trait: the `Dedup` operator.
pub trait Dedup<'scope> {
    /// Exact-duplicate removal (near-duplicates leave against each MMR pick).
    fn dedup(self) -> StreamVec<'scope, u64, Working>;
}

impl<'scope> Dedup<'scope> for StreamVec<'scope, u64, Working> {
    fn dedup(self) -> StreamVec<'scope, u64, Working> {
        ranked_step(self, "Dedup", move |working| {
            let (kept, decisions) = dedup(std::mem::take(&mut working.candidates));
            working.candidates = kept;
            working.trace.decisions.extend(decisions);
        })
    }
}
