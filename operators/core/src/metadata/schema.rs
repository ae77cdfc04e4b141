//! The JSON Schemas of metadata and of metadata filters (the wire contract; the decoder checks the
//! byte bounds the schemas can only describe).

use schemars::{json_schema, Schema, SchemaGenerator};

use super::{MAX_CONDITIONS, MAX_KEYS, MAX_LIST};

/// The pattern of a metadata key.
const KEY_PATTERN: &str = "^[A-Za-z0-9_-]{1,64}$";

/// A document's `metadata`: a flat object of strings, numbers, booleans and lists of those.
pub fn metadata_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "description": "Flat metadata: keys of letters, digits, '_' and '-'; values strings (at most 1 KiB), numbers, booleans or lists of those; 16 KiB in all.",
        "maxProperties": MAX_KEYS,
        "propertyNames": {"pattern": KEY_PATTERN},
        "additionalProperties": {
            "anyOf": [
                {"type": ["string", "number", "boolean"]},
                {"type": "array", "maxItems": MAX_LIST, "items": {"type": ["string", "number", "boolean"]}}
            ]
        }
    })
}

impl schemars::JsonSchema for super::MetaFilters {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "MetadataFilters".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let scalar = json_schema!({"type": ["string", "integer", "boolean"]});
        let bound = json_schema!({
            "anyOf": [{"type": "number"}, {"type": "string", "description": "An RFC 3339 date-time or a date (YYYY-MM-DD)."}]
        });
        json_schema!({
            "type": ["object", "null"],
            "description": "Conditions on the documents' metadata, all required: a value (equality; a list value matches when one element does), {\"any\": [...]} (one of the values) or {\"gte\", \"lte\"} (a numeric or date-time range).",
            "maxProperties": MAX_CONDITIONS,
            "propertyNames": {"pattern": KEY_PATTERN},
            "additionalProperties": {
                "oneOf": [
                    scalar,
                    {
                        "type": "object",
                        "properties": {"any": {"type": "array", "minItems": 1, "maxItems": MAX_LIST, "items": scalar}},
                        "required": ["any"],
                        "additionalProperties": false
                    },
                    {
                        "type": "object",
                        "properties": {"gte": bound, "lte": bound},
                        "minProperties": 1,
                        "additionalProperties": false
                    }
                ]
            }
        })
    }
}
