//! The stages a query's time is measured in: the `ragstream_query_stage_seconds` metric's `stage`
//! label and the keys of a context's `latency_ms` (besides `total`, and `cache` on a cache hit).

use serde::{Deserialize, Serialize};

/// A measured stage of the query flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Decoding the request.
    Decode,
    /// The analyzer (intent, weights, depths).
    Intent,
    /// The HyDE passage writer's call.
    Hyde,
    /// Embedding the query.
    Embed,
    /// A read-your-writes query waiting for the index.
    ConsistencyWait,
    /// Retrieval as the slowest shard took it.
    Retrieve,
    /// The dense lane's request.
    RetrieveDense,
    /// The BM25 lane's request.
    RetrieveBm25,
    /// Reading the hits' stored vectors.
    RetrieveVectors,
    /// A server backend's one request for both lanes and the vectors.
    RetrieveBatch,
    /// A server backend's request for the points the batch left to read.
    RetrievePoints,
    /// Fusion.
    Fuse,
    /// The built-in rerank.
    Rerank,
    /// The reranker endpoint's call.
    RerankEndpoint,
    /// Deduplication.
    Dedup,
    /// MMR.
    Mmr,
    /// Packing.
    Pack,
    /// The lookup modes' answer.
    Lookup,
    /// Publishing the context.
    Publish,
}

impl Stage {
    /// Every stage, in flow order.
    pub const ALL: [Stage; 19] = [
        Stage::Decode,
        Stage::Intent,
        Stage::Hyde,
        Stage::Embed,
        Stage::ConsistencyWait,
        Stage::Retrieve,
        Stage::RetrieveDense,
        Stage::RetrieveBm25,
        Stage::RetrieveVectors,
        Stage::RetrieveBatch,
        Stage::RetrievePoints,
        Stage::Fuse,
        Stage::Rerank,
        Stage::RerankEndpoint,
        Stage::Dedup,
        Stage::Mmr,
        Stage::Pack,
        Stage::Lookup,
        Stage::Publish,
    ];

    /// The name on the wire (metric label, `latency_ms` key).
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Decode => "decode",
            Stage::Intent => "intent",
            Stage::Hyde => "hyde",
            Stage::Embed => "embed",
            Stage::ConsistencyWait => "consistency_wait",
            Stage::Retrieve => "retrieve",
            Stage::RetrieveDense => "retrieve_dense",
            Stage::RetrieveBm25 => "retrieve_bm25",
            Stage::RetrieveVectors => "retrieve_vectors",
            Stage::RetrieveBatch => "retrieve_batch",
            Stage::RetrievePoints => "retrieve_points",
            Stage::Fuse => "fuse",
            Stage::Rerank => "rerank",
            Stage::RerankEndpoint => "rerank_endpoint",
            Stage::Dedup => "dedup",
            Stage::Mmr => "mmr",
            Stage::Pack => "pack",
            Stage::Lookup => "lookup",
            Stage::Publish => "publish",
        }
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stage_is_its_serde_name_once() {
        let names: std::collections::BTreeSet<&str> =
            Stage::ALL.iter().map(|stage| stage.as_str()).collect();
        assert_eq!(names.len(), Stage::ALL.len());
        for stage in Stage::ALL {
            assert_eq!(
                serde_json::to_value(stage).expect("encoded"),
                stage.as_str(),
                "{stage:?}"
            );
        }
    }
}
