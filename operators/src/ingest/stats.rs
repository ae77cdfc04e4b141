//! Sharing with every process: each shard's BM25 statistics deltas ([`ShareStats`]) and, in a
//! cluster serving standing queries, the documents each shard's writer finished ([`ShareChanges`])
//! go to the first worker of every process, which applies them to the process's [`CorpusStats`]
//! (see [`crate::store::stats`]) or records them in its [`Changes`].

use std::sync::Arc;

use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::Operator;
use timely::dataflow::StreamVec;
use timely::ExchangeData;

use super::written::{Changes, ShippedChanges};
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
        to_leaders(
            self,
            leaders,
            ("StatsToProcesses", "ApplyStats"),
            StatsDelta::is_empty,
            move |delta| {
                stats.apply(&delta);
                let chunks: i64 = delta.tenants.values().map(|t| t.chunks).sum();
                crate::metrics::metrics().bm25_corpus_chunks.add(chunks);
            },
        );
    }
}

/// Extension trait: share the documents the index writers finished.
pub trait ShareChanges<'scope> {
    /// Sends each batch's finished documents to every worker in `leaders`; this worker records
    /// what it receives in `changes` (only leaders receive any).
    fn share_changes(self, changes: Arc<Changes>, leaders: Vec<usize>);
}

impl<'scope> ShareChanges<'scope> for StreamVec<'scope, u64, ShippedChanges> {
    fn share_changes(self, changes: Arc<Changes>, leaders: Vec<usize>) {
        to_leaders(
            self,
            leaders,
            ("ChangesToProcesses", "RecordChanges"),
            |shipped| shipped.finished.is_empty(),
            move |shipped| shipped.record_in(&changes),
        );
    }
}

/// Sends each record that is not `empty` to every worker in `leaders`, where `apply` takes it.
fn to_leaders<'scope, T: ExchangeData + Clone>(
    stream: StreamVec<'scope, u64, T>,
    leaders: Vec<usize>,
    (route, sink): (&'static str, &'static str),
    empty: impl Fn(&T) -> bool + 'static,
    mut apply: impl FnMut(T) + 'static,
) {
    let addressed = flat_map_stage(stream, route, move |record: T| {
        let targets = if empty(&record) {
            &[][..]
        } else {
            &leaders[..]
        };
        targets
            .iter()
            .map(|leader| (*leader as u64, record.clone()))
            .collect::<Vec<_>>()
    });
    addressed.sink(
        Exchange::new(|(leader, _): &(u64, T)| *leader),
        sink,
        move |(input, _frontier)| {
            input.for_each(|_, data| {
                for (_, record) in data.drain(..) {
                    apply(record);
                }
            });
        },
    );
}
