//! Document metadata and the query conditions on it.
//!
//! A document event's `metadata` is a flat JSON object: each value a string, a number, a boolean or a
//! list of those (no nested objects, no nulls). It is checked and bounded at decode, kept in a
//! canonical form (keys sorted, no whitespace), copied to every chunk of the document, stored in the
//! index under the payload key `metadata`, and returned with each context item. A query filters on it
//! with `filters.metadata`, evaluated by the engine inside the index query:
//!
//! - `{"team": "search"}`: equality (a string, an integer or a boolean; a list value matches when one
//!   of its elements does);
//! - `{"team": {"any": ["search", "infra"]}}`: one of the values;
//! - `{"year": {"gte": 2020, "lte": 2024}}`: a numeric range (integers and floats), or with RFC 3339
//!   strings (`"2024-05-01"`, `"2024-05-01T12:00:00Z"`) a date-time range.
//!
//! Keys named in the config (`[index.metadata]`) get a payload index of their type; the others are
//! still filterable, by a scan of the candidates the other conditions leave.

mod datetime;
mod declared;
mod document;
mod filter;

pub use datetime::{is_datetime, normal_datetime};
pub use declared::{check_declared, fits, MetaIndex};
pub use document::Metadata;
pub use filter::{
    conditions_to_json, parse_conditions, MetaCondition, MetaFilters, MetaMatch, MetaScalar,
    RangeBound,
};

/// Most keys of a document's metadata.
pub const MAX_KEYS: usize = 64;
/// Longest key, in bytes; keys are `[A-Za-z0-9_-]` (they become payload paths `metadata.<key>`).
pub const MAX_KEY_BYTES: usize = 64;
/// Longest string value (or list element), in bytes.
pub const MAX_STRING_BYTES: usize = 1024;
/// Most elements of a list value (and of a filter's `any`).
pub const MAX_LIST: usize = 64;
/// Largest metadata object in its canonical JSON form, in bytes (it is stored with every chunk).
pub const MAX_BYTES: usize = 16 * 1024;
/// Most metadata conditions of one query.
pub const MAX_CONDITIONS: usize = 16;

/// Checks a metadata key: 1 to [`MAX_KEY_BYTES`] bytes of `[A-Za-z0-9_-]`.
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "metadata key {:?} must be 1 to {MAX_KEY_BYTES} bytes",
            prefix(key)
        ));
    }
    if !key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(format!(
            "metadata key {:?} may hold only letters, digits, '_' and '-'",
            prefix(key)
        ));
    }
    Ok(())
}

fn prefix(text: &str) -> &str {
    let end = text.floor_char_boundary(64);
    &text[..end]
}

/// The JSON Schemas of metadata and of metadata filters (the wire contract; the decoder checks the
/// byte bounds the schemas can only describe).
#[cfg(feature = "schema")]
pub mod schema;

#[cfg(test)]
mod tests;
