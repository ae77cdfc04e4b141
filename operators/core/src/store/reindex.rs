//! What `force_reindex` reports: one run over a tenant's chunks.

use serde::{Deserialize, Serialize};

/// A `force_reindex` run: the tenant's chunks (those whose source matches the pattern) re-embedded
/// and re-encoded in place with the job's embedder and BM25 weighting.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ReindexStatus {
    /// The tenant.
    pub tenant: String,
    /// Only chunks whose source matches this glob (all of the tenant's without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_pattern: Option<String>,
    /// Whether the run is still going.
    pub running: bool,
    /// Documents found to re-index.
    pub documents: usize,
    /// Chunks found to re-index.
    pub chunks: usize,
    /// Chunks re-embedded and written.
    pub rewritten: usize,
    /// Chunks changed or deleted by ingest while the run went (left as ingest wrote them).
    pub skipped: usize,
    /// When the run started (ms since the epoch).
    pub started_ms: u64,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_ms: Option<u64>,
    /// Why it stopped early (the index or the embedder kept failing, the job stopped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The points of `points` that `store` still holds at the same version and content.
pub fn still_current(
    store: &dyn super::VectorStore,
    points: &[super::PointWrite],
) -> Result<Vec<super::PointWrite>, super::StoreError> {
    let ids: Vec<uuid::Uuid> = points.iter().map(|p| p.id).collect();
    let held: std::collections::HashMap<uuid::Uuid, (u64, String)> = store
        .get(&ids)?
        .into_iter()
        .map(|s| (s.id, (s.version, s.chunk.content_hash)))
        .collect();
    Ok(points
        .iter()
        .filter(|p| {
            held.get(&p.id).is_some_and(|(version, hash)| {
                *version == p.version && *hash == p.chunk.content_hash
            })
        })
        .cloned()
        .collect())
}
