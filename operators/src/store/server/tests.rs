use super::*;

/// The server's URL and API key, and a collection name no other run uses.
fn server_and_collection(prefix: &str) -> (String, Option<String>, String) {
    let url = std::env::var("QDRANT_URL").expect("QDRANT_URL");
    let api_key = std::env::var("QDRANT_API_KEY").ok();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let collection = format!("ragstream_{prefix}_{}_{nanos}", std::process::id());
    (url, api_key, collection)
}

/// Deletes the collection at the end, also when the test fails.
struct Cleanup<'a>(&'a ServerStore);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if let Err(error) = self.0.delete_collection() {
            eprintln!("could not delete {}: {error}", self.0.collection());
        }
    }
}

#[test]
#[ignore = "needs a Qdrant server: set QDRANT_URL and run with --ignored"]
fn server_store_passes_the_contract() {
    // Every distance: with `dot` and `l2` the scores and thresholds are still cosines.
    for distance in [DenseDistance::Cosine, DenseDistance::Dot, DenseDistance::L2] {
        contract_with(IndexTuning {
            distance,
            ..IndexTuning::default()
        });
    }
}

fn contract_with(tuning: IndexTuning) {
    let (url, api_key, collection) = server_and_collection("contract");
    let open_with = |tuning: IndexTuning| {
        ServerStore::connect(
            &url,
            api_key.clone(),
            &collection,
            super::super::contract::DIMENSION,
            tuning,
        )
    };
    let open = || open_with(tuning).expect("connect to the Qdrant server");
    let store = open();
    let _cleanup = Cleanup(&store);
    super::super::contract::run(&|| Box::new(open()) as Box<dyn VectorStore>);
    // A job of another distance is refused the collection.
    let other = IndexTuning {
        distance: match tuning.distance {
            DenseDistance::Cosine => DenseDistance::L2,
            _ => DenseDistance::Cosine,
        },
        ..tuning
    };
    let Err(error) = open_with(other) else {
        panic!("a collection of another distance refused");
    };
    let error = error.to_string();
    assert!(error.contains("distance"), "{error}");
}

#[test]
#[ignore = "needs a Qdrant server: set QDRANT_URL and run with --ignored"]
fn a_querys_one_request_returns_every_point_and_reads_older_ones_in_a_second() {
    use crate::store::{lanes, Bm25Encoder, Lane, LaneQuery};
    use ragstream_core::testing::{sample_point, DIMENSION};

    let (url, api_key, collection) = server_and_collection("units");
    let store = ServerStore::connect(
        &url,
        api_key,
        &collection,
        DIMENSION,
        IndexTuning::default(),
    )
    .expect("connect to the Qdrant server");
    let _cleanup = Cleanup(&store);
    let mut with_units = sample_point("a", "units", 1, "kafka offsets are committed", &[]);
    let unit = |at: usize| {
        let mut vector = vec![0.0; DIMENSION];
        vector[at] = 1.0;
        vector
    };
    with_units.evidence = vec![unit(0), unit(1)];
    let plain = sample_point("a", "plain", 1, "kafka partitions are rebalanced", &[]);
    let older = sample_point("a", "older", 1, "kafka topics hold the events", &[]);
    store
        .upsert(&[with_units.clone(), plain.clone(), older.clone()])
        .expect("upsert");
    // `older` as a job wrote it before every point held a multi-vector: no units field, no
    // multi-vector.
    let vectors = NamedVectors::default()
        .add_vector(DENSE_VECTOR, Vector::new_dense(older.dense.clone()))
        .add_vector(
            SPARSE_VECTOR,
            Vector::new_sparse(older.sparse.indices.clone(), older.sparse.values.clone()),
        );
    store
        .runtime
        .block_on(
            store.client.upsert_points(
                UpsertPointsBuilder::new(
                    &collection,
                    vec![PointStruct::new(
                        point_id(older.id),
                        vectors,
                        to_payload(&chunk_payload(&older)),
                    )],
                )
                .wait(true),
            ),
        )
        .expect("write as before");

    let query = |vector: &[f32], doc_ids: &[&str]| {
        let filter = SearchFilter {
            tenant: Some("a".into()),
            doc_ids: doc_ids.iter().map(|id| id.to_string()).collect(),
            ..SearchFilter::default()
        };
        let lanes = LaneQuery {
            dense: Some(Lane {
                vector: vector.to_vec(),
                limit: 10,
                score_threshold: None,
            }),
            bm25: Some(Lane {
                vector: Bm25Encoder::default().encode_query("kafka"),
                limit: 10,
                score_threshold: None,
            }),
            pool: None,
        };
        let got = store.search_lanes(&lanes, &filter).expect("lanes");
        let expected = lanes::sequential(&store, &lanes, &filter).expect("sequential");
        (got, expected)
    };
    let requests = |hits: &LaneHits| {
        hits.timings
            .iter()
            .map(|(stage, _)| stage.as_str())
            .collect::<Vec<_>>()
    };
    let ids = |hits: &[Hit]| {
        let mut ids: Vec<uuid::Uuid> = hits.iter().map(|hit| hit.stored.id).collect();
        ids.sort();
        ids
    };
    let mut all = vec![with_units.id, plain.id, older.id];
    all.sort();

    // Points written now: one request; the evidence scored by the engine only where there are units.
    let (got, expected) = query(&unit(1), &["units", "plain"]);
    assert_eq!(requests(&got), ["retrieve_batch"]);
    assert_eq!(ids(&got.dense), ids(&expected.dense));
    assert_eq!(ids(&got.bm25).len(), 2, "both match kafka");
    let scored = got.evidence.clone().expect("engine-scored evidence");
    assert_eq!(scored.len(), 1, "{scored:?}");
    assert_eq!(scored[0].0, with_units.id);
    assert!(scored[0].1 > 0.999, "its second unit: {}", scored[0].1);
    assert_eq!(got.vectors.len(), 2);
    for (id, vectors) in &got.vectors {
        assert!(vectors.evidence.is_empty(), "units stay on the server");
        let written = if *id == plain.id {
            &plain.dense
        } else {
            &with_units.dense
        };
        assert_eq!(&vectors.dense, written);
    }

    // With a point written before: found all the same, read in a second request.
    let (got, expected) = query(&older.dense, &[]);
    assert_eq!(requests(&got), ["retrieve_batch", "retrieve_points"]);
    assert_eq!(ids(&got.dense), all);
    assert_eq!(ids(&got.bm25), all);
    assert_eq!(got.dense[0].stored.id, older.id, "its own vector first");
    for (lane, got, expected) in [
        ("dense", &got.dense, &expected.dense),
        ("bm25", &got.bm25, &expected.bm25),
    ] {
        for (got, expected) in got.iter().zip(expected) {
            assert_eq!(got.stored, expected.stored, "{lane}");
            assert!((got.score - expected.score).abs() < 1e-5, "{lane}");
        }
    }
    let scored = got.evidence.clone().expect("engine-scored evidence");
    assert_eq!(
        scored.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        [with_units.id]
    );
    assert_eq!(got.vectors.len(), 3);

    // The stand-in never comes back as units.
    let stored = store.vectors(&all).expect("vectors");
    for (id, vectors) in stored {
        let expected = if id == with_units.id { 2 } else { 0 };
        assert_eq!(vectors.evidence.len(), expected, "{id}");
    }
}
