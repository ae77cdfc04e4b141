//! ShareStats: brings every shard's BM25 statistics deltas to the first worker of every process,
//! which applies them to the process's [`CorpusStats`] (see [`crate::store::stats`]).

use std::sync::Arc;

use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::Operator;
use timely::dataflow::StreamVec;

use crate::stage::flat_map_stage;
use crate::store::stats::{CorpusStats, StatsDelta};

/// Extension trait: share statistics deltas.
pub trait ShareStats<'scope> {
    /// Sends each non-empty delta to every worker in `leaders` (the first worker of each process);
    /// this worker applies what it receives to `stats` (only leaders receive any).
    fn share_stats(self, stats: Arc<CorpusStats>, leaders: Vec<usize>);
}

impl<'scope> ShareStats<'scope> for StreamVec<'scope, u64, StatsDelta> {
    fn share_stats(self, stats: Arc<CorpusStats>, leaders: Vec<usize>) {
        let addressed = flat_map_stage(self, "StatsToProcesses", move |delta: StatsDelta| {
            let targets = if delta.is_empty() {
                &[][..]
            } else {
                &leaders[..]
            };
            targets
                .iter()
                .map(|leader| (*leader as u64, delta.clone()))
                .collect::<Vec<_>>()
        });
        addressed.sink(
            Exchange::new(|(leader, _): &(u64, StatsDelta)| *leader),
            "ApplyStats",
            move |(input, _frontier)| {
                input.for_each(|_, data| {
                    for (_, delta) in data.drain(..) {
                        stats.apply(&delta);
                        let chunks: i64 = delta.tenants.values().map(|t| t.chunks).sum();
                        crate::metrics::metrics().bm25_corpus_chunks.add(chunks);
                    }
                });
            },
        );
    }
}
