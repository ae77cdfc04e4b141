//! Engine filters: a [`SearchFilter`] (tenant, documents, kinds, languages, ACL, source prefix,
//! metadata) as the engine's payload conditions, metadata conditions checked against the declared keys.

use std::collections::BTreeMap;

use qdrant_edge::{Condition, FieldCondition, Filter, JsonPath, Match};
use ragstream_core::metadata::{
    check_declared, MetaCondition, MetaIndex, MetaMatch, MetaScalar, RangeBound,
};

use crate::store::{SearchFilter, StoreError};

/// The payload path `name` (a known-good path: a bad one is a bug, and panics).
pub(super) fn json_path(name: &str) -> JsonPath {
    name.parse()
        .unwrap_or_else(|_| panic!("{name} is a valid payload path"))
}

/// The condition that payload field `field` is one of `values`.
fn any_of(field: &str, values: Vec<String>) -> Condition {
    Condition::Field(FieldCondition::new_match(
        json_path(field),
        Match::from(values),
    ))
}

/// The engine filter for a [`SearchFilter`] (see [`SearchFilter::conditions`]); metadata conditions
/// are checked against the `declared` keys' types first.
pub(super) fn engine_filter(
    filter: &SearchFilter,
    declared: &BTreeMap<String, MetaIndex>,
) -> Result<Option<Filter>, StoreError> {
    check_declared(declared, &filter.metadata).map_err(StoreError::Invalid)?;
    let conditions = filter.conditions();
    let mut must: Vec<Condition> = conditions
        .must
        .into_iter()
        .map(|(field, values)| any_of(field, values))
        .collect();
    if let Some(acl) = conditions.acl {
        // `PayloadField` is not exported by qdrant-edge; the condition deserialises from its REST form.
        let is_empty: Condition =
            serde_json::from_value(serde_json::json!({ "is_empty": { "key": "acl" } }))
                .expect("is_empty condition deserialises");
        let mut should = vec![is_empty];
        if !acl.is_empty() {
            should.push(any_of("acl", acl));
        }
        must.push(Condition::Filter(Filter {
            should: Some(should),
            ..Filter::default()
        }));
    }
    for condition in &conditions.metadata {
        // Like `is_empty` above: the engine's field conditions deserialise from their REST form.
        let rest = metadata_condition(condition);
        must.push(serde_json::from_value(rest).map_err(|error| {
            StoreError::Invalid(format!(
                "filters.metadata.{}: the engine does not read this condition: {error}",
                condition.key
            ))
        })?);
    }
    Ok((!must.is_empty()).then(|| Filter {
        must: Some(must),
        ..Filter::default()
    }))
}

/// The REST form of a metadata condition (`{"key", "match"|"range"}`), as the engine reads it.
fn metadata_condition(condition: &MetaCondition) -> serde_json::Value {
    let scalar = |value: &MetaScalar| match value {
        MetaScalar::Keyword(text) => serde_json::json!(text),
        MetaScalar::Integer(i) => serde_json::json!(i),
        MetaScalar::Bool(b) => serde_json::json!(b),
    };
    let bound = |value: &RangeBound| match value {
        RangeBound::Number(n) => serde_json::json!(n),
        RangeBound::Datetime(text) => serde_json::json!(text),
    };
    let key = condition.path();
    match &condition.matches {
        MetaMatch::Value(value) => {
            serde_json::json!({ "key": key, "match": { "value": scalar(value) } })
        }
        MetaMatch::Any(values) => serde_json::json!({
            "key": key,
            "match": { "any": values.iter().map(scalar).collect::<Vec<_>>() }
        }),
        MetaMatch::Range { gte, lte } => {
            let mut range = serde_json::Map::new();
            if let Some(gte) = gte {
                range.insert("gte".into(), bound(gte));
            }
            if let Some(lte) = lte {
                range.insert("lte".into(), bound(lte));
            }
            serde_json::json!({ "key": key, "range": range })
        }
    }
}
