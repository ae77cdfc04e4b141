//! Dense recall of the grown index against exact search, measured once the job has stopped.

use std::path::Path;
use std::time::Instant;

use ragstream_operators::store::edge::{DenseSearch, EdgeStore};
use ragstream_operators::store::{IndexTuning, SearchFilter};
use serde_json::{json, Value};

/// Questions whose dense search is compared with exact search once the job has stopped.
const RECALL_QUESTIONS: usize = 200;
/// Results compared per question.
const RECALL_AT: usize = 10;

/// Beam widths the dense search's recall and time are measured at, besides the configured one.
const RECALL_EFS: [usize; 4] = [32, 64, 100, 200];

/// Recall@10 and median time of the dense search against exact search with the float vectors, on the
/// shards the run left behind, for questions of the idle phase (embedded as the instant embedder
/// does): as configured (HNSW, int8 candidates re-scored when quantised) at several beam widths, and
/// with HNSW on the float vectors only at the configured one. Shards are merged by score as retrieval
/// merges them. The corpus repeats each paragraph with a quarter of its words swapped, so near-ties
/// are common: a result counts as found when its score reaches the exact search's tenth (scores are
/// the float vectors' in every way searched).
pub(super) fn dense_recall(
    index: &Path,
    workers: usize,
    tuning: IndexTuning,
    questions: &[String],
) -> anyhow::Result<Value> {
    let filter = SearchFilter {
        tenant: Some("bench".into()),
        acl: Some(Vec::new()),
        ..SearchFilter::default()
    };
    let vectors: Vec<Vec<f32>> = questions
        .iter()
        .take(RECALL_QUESTIONS)
        .map(|q| crate::bench::scale::hashed(q))
        .collect();
    // Top scores of every question searched one way, and the median time of a search.
    let measure = |tuning: IndexTuning, way: DenseSearch| -> anyhow::Result<(Vec<Vec<f32>>, f64)> {
        let shards = (0..workers)
            .map(|i| {
                EdgeStore::open_tuned(
                    &index.join(format!("shard-{i}")),
                    crate::bench::scale::DIMENSION,
                    tuning,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (mut tops, mut times) = (Vec::new(), Vec::new());
        for vector in &vectors {
            let started = Instant::now();
            let mut scores = Vec::new();
            for shard in &shards {
                let hits = shard.search_dense(vector, &filter, RECALL_AT, way)?;
                scores.extend(hits.into_iter().map(|hit| hit.score));
            }
            times.push(started.elapsed().as_secs_f64() * 1000.0);
            scores.sort_by(|a, b| b.total_cmp(a));
            scores.truncate(RECALL_AT);
            tops.push(scores);
        }
        times.sort_by(f64::total_cmp);
        Ok((tops, times.get(times.len() / 2).copied().unwrap_or(0.0)))
    };
    let (exact, exact_ms) = measure(tuning, DenseSearch::Exact)?;
    let recall = |tops: &[Vec<f32>]| {
        let (mut found, mut expected) = (0usize, 0usize);
        for (top, exact) in tops.iter().zip(&exact) {
            let Some(&tenth) = exact.last() else { continue };
            expected += exact.len();
            found += top.iter().filter(|&&s| s >= tenth - 1e-5).count();
        }
        found as f64 / expected.max(1) as f64
    };
    let mut ways = vec![json!({"search": "exact", "recall": 1.0, "p50_ms": exact_ms})];
    let (float, float_ms) = measure(tuning, DenseSearch::FloatHnsw)?;
    ways.push(json!({"search": "hnsw float", "ef": tuning.ef, "recall": recall(&float), "p50_ms": float_ms}));
    let mut efs = RECALL_EFS.to_vec();
    if !efs.contains(&tuning.ef) {
        efs.push(tuning.ef);
    }
    for ef in efs {
        let (tops, ms) = measure(IndexTuning { ef, ..tuning }, DenseSearch::Configured)?;
        ways.push(
            json!({"search": if tuning.quantized { "hnsw int8 + rescore" } else { "hnsw float" },
            "ef": ef, "configured": ef == tuning.ef, "recall": recall(&tops), "p50_ms": ms}),
        );
    }
    Ok(json!({"questions": vectors.len(), "at": RECALL_AT, "ways": ways}))
}
