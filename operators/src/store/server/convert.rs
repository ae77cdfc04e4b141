//! Between this crate's records and the Qdrant client's: errors (transient or not), filters, point ids,
//! payload values.

use std::collections::HashMap;

use qdrant_client::qdrant::point_id::PointIdOptions;
use qdrant_client::qdrant::r#match::MatchValue;
use qdrant_client::qdrant::value::Kind;
use qdrant_client::qdrant::{
    Condition, DatetimeRange, Filter, ListValue, PointId, Range, RepeatedIntegers, RepeatedStrings,
    Struct, Value,
};
use qdrant_client::{Payload, QdrantError};
use ragstream_core::metadata::{
    check_declared, MetaCondition, MetaIndex, MetaMatch, MetaScalar, RangeBound,
};
use serde_json::{Map, Number, Value as JsonValue};

use crate::store::{chunk_from_payload, SearchFilter, StoreError, StoredChunk};

/// gRPC status codes (as `i32`, see `tonic::Code`) that are outages, not refusals of a request: the
/// server could not serve it now (the 5xx family: Unknown, Internal, Unavailable, DeadlineExceeded,
/// DataLoss; rate limiting: ResourceExhausted; Cancelled, Aborted), or the job's credentials or
/// collection are not right now (Unauthenticated, PermissionDenied: a rotated API key; NotFound: the
/// collection was deleted). None of these says anything about the document written, so the caller
/// retries with backoff and commits nothing meanwhile; a refused document is InvalidArgument and the
/// like. qdrant-client reports a failed connection as Internal. Unimplemented (also 5xx in HTTP terms)
/// is left out: retrying never helps.
pub(super) const TRANSIENT_CODES: [i32; 11] = [
    1,  // Cancelled
    2,  // Unknown
    4,  // DeadlineExceeded
    5,  // NotFound
    7,  // PermissionDenied
    8,  // ResourceExhausted
    10, // Aborted
    13, // Internal
    14, // Unavailable
    15, // DataLoss
    16, // Unauthenticated
];

/// gRPC `NotFound`: a missing collection is [`StoreError::Gone`], anything else not found an outage.
pub(super) const NOT_FOUND: i32 = 5;

/// gRPC `AlreadyExists`.
pub(super) const ALREADY_EXISTS: i32 = 6;

pub(super) fn store_error(error: QdrantError) -> StoreError {
    if let QdrantError::ResponseError { status } = &error {
        let message = status.message().to_lowercase();
        if i32::from(status.code()) == NOT_FOUND
            && message.contains("collection")
            && message.contains("doesn't exist")
        {
            return StoreError::Gone(status.message().to_string());
        }
    }
    let transient = match &error {
        QdrantError::ResponseError { status } => {
            TRANSIENT_CODES.contains(&i32::from(status.code()))
        }
        QdrantError::ResourceExhaustedError { .. } | QdrantError::Io(_) => true,
        _ => false,
    };
    if transient {
        StoreError::Unavailable(error.to_string())
    } else {
        StoreError::Invalid(error.to_string())
    }
}

/// Whether the server refused to create something because it exists (a collection, a payload index).
pub(super) fn already_exists(error: &QdrantError) -> bool {
    match error {
        QdrantError::ResponseError { status } => {
            i32::from(status.code()) == ALREADY_EXISTS
                || status.message().to_lowercase().contains("already exists")
        }
        _ => false,
    }
}

pub(super) fn any_of(field: &str, values: Vec<String>) -> Condition {
    // Explicitly keywords: `MatchValue::from(String)` turns values with whitespace into full-text.
    Condition::matches(
        field,
        MatchValue::Keywords(RepeatedStrings { strings: values }),
    )
}

/// The server filter for a [`SearchFilter`] (see [`SearchFilter::conditions`]); metadata conditions
/// are checked against the `declared` keys' types first.
pub(super) fn server_filter(
    filter: &SearchFilter,
    declared: &std::collections::BTreeMap<String, MetaIndex>,
) -> Result<Option<Filter>, StoreError> {
    check_declared(declared, &filter.metadata).map_err(StoreError::Invalid)?;
    let conditions = filter.conditions();
    let mut must: Vec<Condition> = conditions
        .must
        .into_iter()
        .map(|(field, values)| any_of(field, values))
        .collect();
    if let Some(acl) = conditions.acl {
        let mut should = vec![Condition::is_empty("acl")];
        if !acl.is_empty() {
            should.push(any_of("acl", acl));
        }
        must.push(Condition::from(Filter::should(should)));
    }
    for condition in &conditions.metadata {
        must.push(metadata_condition(condition));
    }
    Ok((!must.is_empty()).then(|| Filter::must(must)))
}

/// A metadata condition as a server filter condition. Date-time bounds were checked at decode
/// ([`ragstream_core::metadata::is_datetime`]); one that still does not parse matches nothing.
fn metadata_condition(condition: &MetaCondition) -> Condition {
    let key = condition.path();
    match &condition.matches {
        MetaMatch::Value(MetaScalar::Keyword(text)) => {
            Condition::matches(key, MatchValue::Keyword(text.clone()))
        }
        MetaMatch::Value(MetaScalar::Integer(i)) => {
            Condition::matches(key, MatchValue::Integer(*i))
        }
        MetaMatch::Value(MetaScalar::Bool(b)) => Condition::matches(key, MatchValue::Boolean(*b)),
        MetaMatch::Any(values) => match values.first() {
            Some(MetaScalar::Integer(_)) => Condition::matches(
                key,
                MatchValue::Integers(RepeatedIntegers {
                    integers: values
                        .iter()
                        .filter_map(|v| match v {
                            MetaScalar::Integer(i) => Some(*i),
                            _ => None,
                        })
                        .collect(),
                }),
            ),
            _ => any_of(
                &key,
                values
                    .iter()
                    .filter_map(|v| match v {
                        MetaScalar::Keyword(text) => Some(text.clone()),
                        _ => None,
                    })
                    .collect(),
            ),
        },
        MetaMatch::Range { gte, lte } => {
            let datetime = matches!(gte, Some(RangeBound::Datetime(_)))
                || matches!(lte, Some(RangeBound::Datetime(_)));
            if datetime {
                // A bound that cannot be read (none passes the decoder's check) admits nothing:
                // `unreadable` is far in the future for `gte`, far in the past for `lte`.
                let timestamp = |bound: &Option<RangeBound>, unreadable: i64| match bound {
                    Some(RangeBound::Datetime(text)) => Some(
                        text.parse::<prost_types::Timestamp>()
                            .unwrap_or(prost_types::Timestamp {
                                seconds: unreadable,
                                nanos: 0,
                            }),
                    ),
                    _ => None,
                };
                const FAR: i64 = 1 << 40;
                Condition::datetime_range(
                    key,
                    DatetimeRange {
                        gte: timestamp(gte, FAR),
                        lte: timestamp(lte, -FAR),
                        ..DatetimeRange::default()
                    },
                )
            } else {
                let number = |bound: &Option<RangeBound>| match bound {
                    Some(RangeBound::Number(n)) => Some(*n),
                    _ => None,
                };
                Condition::range(
                    key,
                    Range {
                        gte: number(gte),
                        lte: number(lte),
                        ..Range::default()
                    },
                )
            }
        }
    }
}

pub(super) fn point_id(id: uuid::Uuid) -> PointId {
    PointId::from(id.to_string())
}

pub(super) fn uuid_of(id: Option<&PointId>) -> Option<uuid::Uuid> {
    match id?.point_id_options.as_ref()? {
        PointIdOptions::Uuid(text) => uuid::Uuid::parse_str(text).ok(),
        PointIdOptions::Num(_) => None,
    }
}

/// A JSON value as a payload value (qdrant-client's serde conversions are behind a feature we do
/// not enable).
pub(super) fn to_value(json: &JsonValue) -> Value {
    let kind = match json {
        JsonValue::Null => Kind::NullValue(0),
        JsonValue::Bool(b) => Kind::BoolValue(*b),
        JsonValue::Number(n) => match n.as_i64() {
            Some(i) => Kind::IntegerValue(i),
            None => Kind::DoubleValue(n.as_f64().unwrap_or(f64::NAN)),
        },
        JsonValue::String(s) => Kind::StringValue(s.clone()),
        JsonValue::Array(items) => Kind::ListValue(ListValue {
            values: items.iter().map(to_value).collect(),
        }),
        JsonValue::Object(map) => Kind::StructValue(Struct {
            fields: map.iter().map(|(k, v)| (k.clone(), to_value(v))).collect(),
        }),
    };
    Value { kind: Some(kind) }
}

/// A payload value as JSON, its strings moved.
fn to_json(value: Value) -> JsonValue {
    match value.kind {
        None | Some(Kind::NullValue(_)) => JsonValue::Null,
        Some(Kind::BoolValue(b)) => JsonValue::Bool(b),
        Some(Kind::IntegerValue(i)) => JsonValue::Number(Number::from(i)),
        Some(Kind::DoubleValue(d)) => Number::from_f64(d)
            .map(JsonValue::Number)
            .unwrap_or(JsonValue::Null),
        Some(Kind::StringValue(s)) => JsonValue::String(s),
        Some(Kind::ListValue(list)) => {
            JsonValue::Array(list.values.into_iter().map(to_json).collect())
        }
        Some(Kind::StructValue(object)) => JsonValue::Object(
            object
                .fields
                .into_iter()
                .map(|(k, v)| (k, to_json(v)))
                .collect(),
        ),
    }
}

pub(super) fn to_payload(map: &Map<String, JsonValue>) -> Payload {
    let fields: HashMap<String, Value> =
        map.iter().map(|(k, v)| (k.clone(), to_value(v))).collect();
    Payload::from(fields)
}

/// A stored chunk from a point's id and payload; `None` if it is not a ragstream point. Takes the
/// payload, so its strings (the chunk's text the largest) move instead of being copied.
pub(super) fn stored_chunk(
    id: Option<&PointId>,
    payload: HashMap<String, Value>,
) -> Option<StoredChunk> {
    let id = uuid_of(id)?;
    let payload: Map<String, JsonValue> =
        payload.into_iter().map(|(k, v)| (k, to_json(v))).collect();
    chunk_from_payload(id, payload)
}
