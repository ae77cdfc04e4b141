//! Payload indexes of a shard: the keyword fields every shard has (the tenant's marked as such), and
//! the declared metadata keys', each of its type.

use qdrant_edge::{
    CreateIndex, FieldIndexOperations, JsonPath, KeywordIndexParams, PayloadFieldSchema,
    PayloadSchemaParams, PayloadSchemaType, UpdateOperation,
};
use ragstream_core::metadata::MetaIndex;

use super::error::engine_error;
use super::filter::json_path;
use super::EdgeStore;
use crate::store::{StoreError, KEYWORD_INDEXES, ON_DISK_KEYWORD_INDEXES};

impl EdgeStore {
    /// Creates the keyword payload indexes (idempotent).
    pub(super) fn create_indexes(&self) -> Result<(), StoreError> {
        // Idempotent: an existing index is accepted. Re-issued on every open (a segment created on load
        // may start without indexes).
        let _guard = self.writer.lock().expect("store writer lock");
        for field in KEYWORD_INDEXES {
            let on_disk = self.tuning.indexes_on_disk && ON_DISK_KEYWORD_INDEXES.contains(&field);
            let schema = if field == "tenant" {
                PayloadFieldSchema::FieldParams(PayloadSchemaParams::Keyword(KeywordIndexParams {
                    is_tenant: Some(true),
                    ..KeywordIndexParams::default()
                }))
            } else if on_disk {
                PayloadFieldSchema::FieldParams(PayloadSchemaParams::Keyword(KeywordIndexParams {
                    on_disk: Some(true),
                    ..KeywordIndexParams::default()
                }))
            } else {
                PayloadFieldSchema::FieldType(PayloadSchemaType::Keyword)
            };
            let operation = UpdateOperation::FieldIndexOperation(
                FieldIndexOperations::CreateIndex(CreateIndex {
                    field_name: json_path(field),
                    field_schema: Some(schema),
                }),
            );
            self.shard.update(operation).map_err(engine_error)?;
        }
        Ok(())
    }

    /// Declares metadata keys and creates their payload indexes.
    pub(super) fn create_metadata_indexes(
        &self,
        keys: &[(String, MetaIndex)],
    ) -> Result<(), StoreError> {
        let _guard = self.writer.lock().expect("store writer lock");
        if let Ok(mut declared) = self.declared.lock() {
            declared.extend(keys.iter().cloned());
        }
        for (key, index) in keys {
            let kind = match index {
                MetaIndex::Keyword => PayloadSchemaType::Keyword,
                MetaIndex::Integer => PayloadSchemaType::Integer,
                MetaIndex::Float => PayloadSchemaType::Float,
                MetaIndex::Bool => PayloadSchemaType::Bool,
                MetaIndex::Datetime => PayloadSchemaType::Datetime,
            };
            let path: JsonPath = format!("metadata.{key}")
                .parse()
                .map_err(|_| StoreError::Invalid(format!("metadata key {key:?}")))?;
            let operation = UpdateOperation::FieldIndexOperation(
                FieldIndexOperations::CreateIndex(CreateIndex {
                    field_name: path,
                    field_schema: Some(PayloadFieldSchema::FieldType(kind)),
                }),
            );
            self.shard.update(operation).map_err(engine_error)?;
        }
        Ok(())
    }
}
