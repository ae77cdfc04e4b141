//! Writes to the collection: points as the server takes them, under the store's write lock.

use super::*;

impl ServerStore {
    /// Writes `points`; the caller holds `writes`.
    pub(super) fn upsert_held(&self, points: &[PointWrite]) -> Result<(), StoreError> {
        if points.is_empty() {
            return Ok(());
        }
        check_dimensions(points, self.dimension)?;
        let mut list = Vec::with_capacity(points.len());
        for point in points {
            if point.sparse.indices.len() != point.sparse.values.len() {
                return Err(StoreError::Invalid(format!(
                    "sparse vector with {} indices and {} values",
                    point.sparse.indices.len(),
                    point.sparse.values.len()
                )));
            }
            let mut vectors = NamedVectors::default()
                .add_vector(
                    DENSE_VECTOR,
                    Vector::new_dense(self.tuning.distance.prepare(&point.dense)),
                )
                .add_vector(
                    SPARSE_VECTOR,
                    Vector::new_sparse(point.sparse.indices.clone(), point.sparse.values.clone()),
                );
            let mut payload = chunk_payload(point);
            if self.evidence.load(std::sync::atomic::Ordering::Relaxed) {
                if point.evidence.iter().any(|v| v.len() != self.dimension) {
                    return Err(StoreError::Invalid(format!(
                        "evidence vector of a dimension other than the index's {}",
                        self.dimension
                    )));
                }
                // A point without units holds its own vector in their place, so that the query's
                // evidence request (which returns only points with the multi-vector) returns every
                // point; `units` says which, and its engine score is not used (read.rs).
                let units = if point.evidence.is_empty() {
                    vec![point.dense.clone()]
                } else {
                    point.evidence.clone()
                };
                vectors = vectors.add_vector(EVIDENCE_VECTOR, Vector::new_multi(units));
                payload.insert(UNITS_FIELD.to_string(), point.evidence.len().into());
            }
            list.push(PointStruct::new(
                point_id(point.id),
                vectors,
                to_payload(&payload),
            ));
        }
        self.runtime
            .block_on(
                self.client
                    .upsert_points(UpsertPointsBuilder::new(&self.collection, list).wait(true)),
            )
            .map(|_| ())
            .map_err(store_error)
    }
}

/// The server's distance for the dense vectors.
pub(super) fn server_distance(tuning: &IndexTuning) -> Distance {
    match tuning.distance {
        DenseDistance::Cosine => Distance::Cosine,
        DenseDistance::Dot => Distance::Dot,
        DenseDistance::L2 => Distance::Euclid,
    }
}
