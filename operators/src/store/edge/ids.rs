//! Point ids: this crate's UUIDs as the engine's, and back.

use qdrant_edge::PointId;

/// The UUID of an engine point id (none for a numeric id, which this store never writes).
pub(super) fn uuid_of(id: &PointId) -> Option<uuid::Uuid> {
    match id {
        PointId::Uuid(uuid) => uuid::Uuid::from_slice(uuid.as_bytes()).ok(),
        PointId::NumId(_) => None,
    }
}

/// The engine point id of a UUID.
pub(super) fn point_id(id: uuid::Uuid) -> PointId {
    PointId::Uuid(qdrant_edge::external::uuid::Uuid::from_bytes(
        *id.as_bytes(),
    ))
}
