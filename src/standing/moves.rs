//! Which subscriptions a written chunk may move, by lane: its dense vector against each query vector,
//! its BM25 terms through an inverted index of the queries' terms. What `Standing::moved` checks
//! after the cheaper reasons (the change cites a member, the term weights drifted).

use std::collections::{BTreeSet, HashMap, HashSet};

use ragstream_core::query::probe::{cosine, Probe};
use ragstream_operators::metrics::{metrics, Moved};
use ragstream_operators::store::SparseVector;

/// A written chunk: its dense and BM25 vectors.
pub(super) type Chunk = (Vec<f32>, SparseVector);

/// Counts `count` subscriptions moved for `reason` (`ragstream_standing_moved_total`).
pub(super) fn count(reason: Moved, count: usize) {
    metrics().count_moved(reason, count);
}

/// Dense: every chunk against every query vector not moved yet; a query moves when its best cosine
/// would enter its context ([`Probe::admits_dense`]).
pub(super) fn by_dense(
    probes: &[(&String, &Probe)],
    chunks: &[&Chunk],
    moved: &mut BTreeSet<String>,
) {
    for (id, probe) in probes {
        if moved.contains(*id) || probe.dense.is_empty() {
            continue;
        }
        let best = chunks
            .iter()
            .map(|(dense, _)| cosine(&probe.dense, dense))
            .try_fold(f32::NEG_INFINITY, |best, score| score.map(|s| best.max(s)));
        if probe.admits_dense(best) {
            count(Moved::Dense, 1);
            moved.insert((*id).clone());
        }
    }
}

/// BM25: each chunk's terms through an inverted index of the terms of the queries not moved yet,
/// weighed as now (`weights`: each probe's term weights and drift); a query moves when a chunk's
/// score would enter its context ([`Probe::admits_bm25_now`]).
pub(super) fn by_bm25(
    probes: &[(&String, &Probe)],
    weights: &[(Vec<f32>, f32)],
    chunks: &[&Chunk],
    moved: &mut BTreeSet<String>,
) {
    let mut terms: HashMap<u32, Vec<(usize, f32)>> = HashMap::new();
    for (at, (id, probe)) in probes.iter().enumerate() {
        if moved.contains(*id) {
            continue;
        }
        for (term, weight) in probe.bm25.indices.iter().zip(&weights[at].0) {
            terms.entry(*term).or_default().push((at, *weight));
        }
    }
    if terms.is_empty() {
        return;
    }
    // A term no chunk held at the probe weighs its raw weight until the statistics count it (they
    // are applied a step after the write): a chunk bringing one enters.
    let unseen: HashSet<(usize, u32)> = probes
        .iter()
        .enumerate()
        .flat_map(|(at, (_, probe))| {
            probe
                .bm25
                .indices
                .iter()
                .zip(&probe.bm25_seen)
                .filter(|(_, seen)| !**seen)
                .map(move |(term, _)| (at, *term))
        })
        .collect();
    let mut scores: HashMap<usize, f32> = HashMap::new();
    for (_, sparse) in chunks {
        scores.clear();
        for (term, weight) in sparse.indices.iter().zip(&sparse.values) {
            for (at, query) in terms.get(term).map_or(&[][..], Vec::as_slice) {
                let entry = scores.entry(*at).or_default();
                *entry += query * weight;
                if unseen.contains(&(*at, *term)) {
                    *entry = f32::INFINITY;
                }
            }
        }
        for (at, score) in &scores {
            let (id, probe) = probes[*at];
            let (now, drift) = &weights[*at];
            if probe.admits_bm25_now(*score, now, *drift) && moved.insert(id.clone()) {
                count(Moved::Bm25, 1);
            }
        }
    }
}
