use super::*;

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
    let url = std::env::var("QDRANT_URL").expect("QDRANT_URL");
    let api_key = std::env::var("QDRANT_API_KEY").ok();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let collection = format!("ragstream_contract_{}_{nanos}", std::process::id());
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
    // Deletes the collection at the end, also when the contract fails.
    struct Cleanup(ServerStore);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            if let Err(error) = self.0.delete_collection() {
                eprintln!("could not delete {}: {error}", self.0.collection());
            }
        }
    }
    let _cleanup = Cleanup(open());
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
