//! Dedup: exact duplicates leave (`ragstream_core::query::dedup`); near-duplicates leave against each
//! MMR pick.

use timely::dataflow::StreamVec;

use super::job::{ranked_step, Working};
use ragstream_core::query::dedup::dedup;
use ragstream_core::query::Stage;

/// Extension trait: the `Dedup` operator.
///
/// # Examples
///
/// Of two chunks with the same text (up to case and spacing), the better ranked one stays:
///
/// ```
/// use ragstream_operators::query::example::{documents, gathered, hit, job};
/// use timely::dataflow::operators::capture::{Capture, Extract};
/// use timely::dataflow::operators::vec::{Map, ToStream};
/// use ragstream_operators::query::dedup::Dedup;
/// use ragstream_operators::query::fuse::Fuse;
///
/// let kept = timely::example(|scope| {
///     let query = job(r#"{"query_id": "q1", "tenant": "t", "text": "tide pools"}"#);
///     let dense = vec![
///         hit("a", "Tide pools at low tide.", 0.9, &[1.0, 0.0]),
///         hit("b", "tide  pools at low tide.", 0.8, &[1.0, 0.0]),
///         hit("c", "what lives in a rock pool", 0.7, &[0.0, 1.0]),
///     ];
///     vec![gathered(query, dense, Vec::new())]
///         .to_stream(scope)
///         .fuse()
///         .dedup()
///         .map(|working| documents(&working))
///         .capture()
/// });
/// assert_eq!(kept.extract()[0].1, [vec!["a", "c"]]);
/// ```
pub trait Dedup<'scope> {
    /// Exact-duplicate removal (near-duplicates leave against each MMR pick).
    fn dedup(self) -> StreamVec<'scope, u64, Working>;
}

impl<'scope> Dedup<'scope> for StreamVec<'scope, u64, Working> {
    fn dedup(self) -> StreamVec<'scope, u64, Working> {
        ranked_step(self, "Dedup", Stage::Dedup, move |working| {
            let (kept, decisions) = dedup(std::mem::take(&mut working.candidates));
            working.candidates = kept;
            working.trace.decisions.extend(decisions);
        })
    }
}
