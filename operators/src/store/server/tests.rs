use super::*;

#[test]
#[ignore = "needs a Qdrant server: set QDRANT_URL and run with --ignored"]
fn server_store_passes_the_contract() {
    let url = std::env::var("QDRANT_URL").expect("QDRANT_URL");
    let api_key = std::env::var("QDRANT_API_KEY").ok();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let collection = format!("ragstream_contract_{}_{nanos}", std::process::id());
    let open = || {
        ServerStore::connect(
            &url,
            api_key.clone(),
            &collection,
            super::super::contract::DIMENSION,
            IndexTuning::default(),
        )
        .expect("connect to the Qdrant server")
    };
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
}
