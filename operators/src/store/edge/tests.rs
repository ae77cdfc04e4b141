use super::*;
use crate::store::bm25::Bm25Encoder;
use crate::store::DenseDistance;
use qdrant_edge::Distance;

#[test]
fn edge_store_passes_the_contract() {
    let dir = tempfile::tempdir().expect("tempdir");
    let open =
        |path: &Path| EdgeStore::open(path, super::super::contract::DIMENSION).expect("open");
    super::super::contract::run(&|| Box::new(open(dir.path())) as Box<dyn VectorStore>);
}

/// A shard created with the engine's per-shard IDF (before the corpus-wide statistics) says so,
/// and is searched with the engine's IDF still; a new shard stores plain BM25 weights.
#[test]
fn shards_with_the_engine_idf_are_recognised() {
    let dir = tempfile::tempdir().expect("tempdir");
    let legacy = dir.path().join("legacy");
    let config = EdgeConfig::builder()
        .vector(
            DENSE_VECTOR,
            EdgeVectorParams::builder(4, Distance::Cosine).build(),
        )
        .sparse_vector(
            SPARSE_VECTOR,
            EdgeSparseVectorParams::builder()
                .modifier(Modifier::Idf)
                .build(),
        )
        .build();
    std::fs::create_dir_all(&legacy).expect("dir");
    drop(EdgeShard::new(&legacy, config).expect("legacy shard"));
    assert!(EdgeStore::open(&legacy, 4).expect("open").engine_idf());
    let fresh = EdgeStore::open(&dir.path().join("fresh"), 4).expect("open");
    assert!(!VectorStore::engine_idf(&fresh));
}

/// Points of a shard large enough for the optimizer to build HNSW graphs and int8 vectors (the
/// engine indexes segments above 10 MB of vectors).
const POINTS: usize = 8000;
const DIMENSION: usize = 384;

/// Uniform values in [-0.5, 0.5), the same sequence on every run.
fn xorshift() -> impl FnMut() -> f32 {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }
}

/// [`POINTS`] points of tenant `t` with random vectors and texts of three words from a small
/// vocabulary (so BM25 searches have many matches with different scores).
fn random_points(random: &mut impl FnMut() -> f32) -> Vec<PointWrite> {
    (0..POINTS)
        .map(|i| {
            let text = format!("w{} w{} w{}", i % 97, i % 89, i % 13);
            let mut point =
                super::super::contract::sample_point("t", &format!("doc{i}"), 1, &text, &[]);
            point.dense = (0..DIMENSION).map(|_| random()).collect();
            point
        })
        .collect()
}

/// A shard at `path` holding `points`, optimized (its segments indexed).
fn optimized_shard(path: &Path, tuning: IndexTuning, points: &[PointWrite]) -> EdgeStore {
    let store = EdgeStore::open_tuned(path, DIMENSION, tuning).expect("open");
    for batch in points.chunks(1000) {
        store.upsert(batch).expect("upsert");
    }
    assert!(store.optimize().expect("optimize"), "the optimizer ran");
    assert!(
        store.shard.info().indexed_vectors_count > 0,
        "segments were indexed"
    );
    store
}

/// The `index_type` of every sparse index the engine built under `dir`.
fn sparse_index_types(dir: &Path) -> Vec<String> {
    let mut types = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            types.extend(sparse_index_types(&path));
        } else if path
            .file_name()
            .is_some_and(|name| name == "sparse_index_config.json")
        {
            let config: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
            types.push(config["index_type"].as_str().unwrap_or("?").to_string());
        }
    }
    types
}

/// `indexes_on_disk` moves the optimized segments' BM25 index to memory-mapped files, and
/// searches through it (BM25, document filters) answer exactly as with the index in RAM.
#[test]
fn indexes_on_disk_answer_as_indexes_in_ram() {
    let points = random_points(&mut xorshift());
    let dirs = [
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    ];
    let [on_disk, in_ram] = [true, false].map(|indexes_on_disk| {
        let tuning = IndexTuning {
            indexes_on_disk,
            ..IndexTuning::default()
        };
        optimized_shard(dirs[usize::from(!indexes_on_disk)].path(), tuning, &points)
    });
    let types = sparse_index_types(dirs[0].path());
    assert!(types.iter().any(|t| t == "Mmap"), "{types:?}");
    assert!(!types.iter().any(|t| t == "ImmutableRam"), "{types:?}");
    let types = sparse_index_types(dirs[1].path());
    assert!(types.iter().any(|t| t == "ImmutableRam"), "{types:?}");
    let encoder = Bm25Encoder::default();
    for (text, doc_ids) in [
        ("w5 w17", vec![]),
        ("w3 w40 w7", vec![]),
        ("w5", (0..400).map(|i| format!("doc{}", i * 7)).collect()),
    ] {
        let filter = SearchFilter {
            tenant: Some("t".into()),
            doc_ids,
            ..SearchFilter::default()
        };
        let query = SearchVector::Sparse(encoder.encode_query(text));
        let [disk, ram] = [&on_disk, &in_ram].map(|store| {
            store
                .search(&query, &filter, 20, None)
                .expect("search")
                .into_iter()
                .map(|hit| (hit.stored.key.doc_id, hit.score))
                .collect::<Vec<_>>()
        });
        assert!(!disk.is_empty(), "{text}: BM25 finds matches");
        assert_eq!(disk, ram, "{text}");
    }
}

/// An optimized shard with int8 vectors: a search finds the point a query is next to, and
/// every score is the float vectors' cosine, not the int8 estimate.
#[test]
fn quantised_search_is_rescored_with_the_float_vectors() {
    let mut random = xorshift();
    let points = random_points(&mut random);
    let dir = tempfile::tempdir().expect("tempdir");
    let store = optimized_shard(dir.path(), IndexTuning::default(), &points);
    let filter = SearchFilter {
        tenant: Some("t".into()),
        ..SearchFilter::default()
    };
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    let cosine = |a: &[f32], b: &[f32]| {
        a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>() / (norm(a) * norm(b))
    };
    for j in (0..POINTS).step_by(POINTS / 20) {
        // Near one stored point: it must come first, found through the int8 graph search.
        let query: Vec<f32> = points[j]
            .dense
            .iter()
            .map(|x| x + 0.02 * random())
            .collect();
        let hits = store
            .search(&SearchVector::Dense(query.clone()), &filter, 10, None)
            .expect("search");
        assert_eq!(hits.len(), 10);
        assert_eq!(hits[0].stored.key.doc_id, format!("doc{j}"));
        for hit in &hits {
            let index: usize = hit.stored.key.doc_id[3..].parse().expect("doc id");
            let float = cosine(&query, &points[index].dense);
            assert!(
                (hit.score - float).abs() < 1e-4,
                "score {} is the float vectors' {float}",
                hit.score
            );
        }
    }
}

/// The engine's outages (its runtime, storage, memory, deadlines) are retried; what says the request
/// is wrong is a refusal.
#[test]
fn engine_outages_are_retried_and_wrong_requests_refused() {
    for outage in [
        "Service runtime error: No space left on device (os error 28)",
        "Out of memory, free: 0, segment",
        "Timeout error: optimizer",
    ] {
        assert!(
            matches!(engine_error(outage), StoreError::Unavailable(_)),
            "{outage}"
        );
    }
    for refusal in [
        "Vector dimension error: expected dim: 4, got 7",
        "Validation failed: payload too large",
    ] {
        assert!(
            matches!(engine_error(refusal), StoreError::Invalid(_)),
            "{refusal}"
        );
    }
}

/// With `dot` and `l2` the shard passes the contract (its score thresholds are cosines), ranks as
/// with `cosine` and reports the same scores; a shard is refused by a job of another distance.
#[test]
fn every_distance_passes_the_contract_and_ranks_and_scores_as_cosine() {
    let points = random_points(&mut xorshift());
    let shards: Vec<(tempfile::TempDir, EdgeStore)> =
        [DenseDistance::Cosine, DenseDistance::Dot, DenseDistance::L2]
            .into_iter()
            .map(|distance| {
                let tuning = IndexTuning {
                    distance,
                    quantized: false,
                    ..IndexTuning::default()
                };
                let contract = tempfile::tempdir().expect("tempdir");
                super::super::contract::run(&|| {
                    Box::new(
                        EdgeStore::open_tuned(
                            contract.path(),
                            super::super::contract::DIMENSION,
                            tuning,
                        )
                        .expect("open"),
                    ) as Box<dyn VectorStore>
                });
                let dir = tempfile::tempdir().expect("tempdir");
                let store = EdgeStore::open_tuned(dir.path(), DIMENSION, tuning).expect("open");
                store.upsert(&points).expect("upsert");
                (dir, store)
            })
            .collect();
    let filter = SearchFilter {
        tenant: Some("t".into()),
        ..SearchFilter::default()
    };
    let mut random = xorshift();
    for _ in 0..20 {
        let query: Vec<f32> = (0..DIMENSION).map(|_| random() * 3.0).collect();
        let answers: Vec<Vec<Hit>> = shards
            .iter()
            .map(|(_, store)| {
                store
                    .search(&SearchVector::Dense(query.clone()), &filter, 10, Some(0.1))
                    .expect("search")
            })
            .collect();
        let ids = |hits: &[Hit]| hits.iter().map(|h| h.stored.id).collect::<Vec<_>>();
        assert!(!answers[0].is_empty());
        for other in &answers[1..] {
            assert_eq!(ids(other), ids(&answers[0]));
            for (a, b) in other.iter().zip(&answers[0]) {
                assert!(
                    (a.score - b.score).abs() < 1e-3,
                    "{} vs {}",
                    a.score,
                    b.score
                );
                assert!(b.score >= 0.1);
            }
        }
    }
    let (dirs, stores): (Vec<_>, Vec<_>) = shards.into_iter().unzip();
    drop(stores);
    let Err(error) = EdgeStore::open_tuned(dirs[1].path(), DIMENSION, IndexTuning::default())
    else {
        panic!("a dot shard refused by a cosine job");
    };
    let error = error.to_string();
    assert!(
        error.contains("distance Dot") && error.contains("cosine"),
        "{error}"
    );
}
