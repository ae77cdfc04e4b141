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

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};

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

/// A document's metadata in canonical JSON (keys sorted, compact); empty when the document has none.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Metadata(String);

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
    let mut end = text.len().min(64);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A scalar metadata value, checked.
fn check_scalar(key: &str, value: &Value) -> Result<(), String> {
    match value {
        Value::String(text) if text.len() > MAX_STRING_BYTES => Err(format!(
            "metadata {key}: a string of {} bytes exceeds {MAX_STRING_BYTES}",
            text.len()
        )),
        Value::String(_) | Value::Bool(_) => Ok(()),
        // serde_json refuses NaN and infinities; an integer beyond i64 has no payload type.
        Value::Number(number) if number.is_i64() || number.is_f64() => Ok(()),
        Value::Number(_) => Err(format!("metadata {key}: integer out of the i64 range")),
        Value::Null => Err(format!(
            "metadata {key}: null is not a value (leave the key out)"
        )),
        Value::Array(_) | Value::Object(_) => Err(format!(
            "metadata {key}: a list element must be a string, a number or a boolean"
        )),
    }
}

impl Metadata {
    /// Checks a document event's `metadata` (an object, or null for none) and puts it in canonical
    /// form. The error says which key and why.
    pub fn parse(value: &Value) -> Result<Self, String> {
        let object = match value {
            Value::Null => return Ok(Self::default()),
            Value::Object(object) => object,
            _ => return Err("metadata must be a JSON object".into()),
        };
        if object.len() > MAX_KEYS {
            return Err(format!(
                "metadata has {} keys, over the limit of {MAX_KEYS}",
                object.len()
            ));
        }
        let mut sorted = BTreeMap::new();
        for (key, value) in object {
            check_key(key)?;
            match value {
                Value::Array(items) => {
                    if items.len() > MAX_LIST {
                        return Err(format!(
                            "metadata {key}: a list of {} values exceeds {MAX_LIST}",
                            items.len()
                        ));
                    }
                    for item in items {
                        check_scalar(key, item)?;
                    }
                }
                Value::Object(_) => {
                    return Err(format!(
                        "metadata {key}: nested objects are not supported (use flat keys)"
                    ))
                }
                scalar => check_scalar(key, scalar)?,
            }
            sorted.insert(key.as_str(), value);
        }
        if sorted.is_empty() {
            return Ok(Self::default());
        }
        let text = serde_json::to_string(&sorted).map_err(|e| e.to_string())?;
        if text.len() > MAX_BYTES {
            return Err(format!(
                "metadata of {} bytes exceeds the limit of {MAX_BYTES} bytes",
                text.len()
            ));
        }
        Ok(Self(text))
    }

    /// Whether the document has no metadata.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The canonical JSON text (empty for none).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The metadata as a JSON object (empty for none).
    pub fn to_object(&self) -> Map<String, Value> {
        if self.0.is_empty() {
            return Map::new();
        }
        match serde_json::from_str(&self.0) {
            Ok(Value::Object(object)) => object,
            _ => Map::new(),
        }
    }

    /// Metadata read back from the index's payload (what [`Metadata::to_object`] stored); a payload
    /// that does not check is dropped rather than failing the read.
    pub fn from_payload(value: Option<&Value>) -> Self {
        value.and_then(|v| Self::parse(v).ok()).unwrap_or_default()
    }
}

/// An equality operand: what a payload match can compare exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MetaScalar {
    /// A keyword.
    Keyword(String),
    /// An integer.
    Integer(i64),
    /// A boolean.
    Bool(bool),
}

/// One end of a range.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RangeBound {
    /// A number (integers and floats compare as numbers).
    Number(f64),
    /// An RFC 3339 date-time (or a date).
    Datetime(String),
}

/// What a metadata key must satisfy.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaMatch {
    /// Equal to this value (or, for a list, holding it).
    Value(MetaScalar),
    /// Equal to one of these (all of one type).
    Any(Vec<MetaScalar>),
    /// Within `[gte, lte]` (either end may be open; both of one type).
    Range {
        /// Lowest value admitted.
        gte: Option<RangeBound>,
        /// Highest value admitted.
        lte: Option<RangeBound>,
    },
}

/// A query's condition on one metadata key.
#[derive(Debug, Clone, PartialEq)]
pub struct MetaCondition {
    /// The key (checked like a document's keys).
    pub key: String,
    /// What its value must be.
    pub matches: MetaMatch,
}

impl MetaCondition {
    /// The payload path of the key.
    pub fn path(&self) -> String {
        format!("metadata.{}", self.key)
    }
}

fn scalar(key: &str, value: &Value) -> Result<MetaScalar, String> {
    match value {
        Value::String(text) if text.len() <= MAX_STRING_BYTES => {
            Ok(MetaScalar::Keyword(text.clone()))
        }
        Value::String(_) => Err(format!(
            "filters.metadata.{key}: a string over {MAX_STRING_BYTES} bytes"
        )),
        Value::Bool(b) => Ok(MetaScalar::Bool(*b)),
        Value::Number(number) if number.is_f64() => Err(format!(
            "filters.metadata.{key}: a float compares by range (gte, lte), not by equality"
        )),
        Value::Number(number) => number
            .as_i64()
            .map(MetaScalar::Integer)
            .ok_or_else(|| format!("filters.metadata.{key}: integer out of the i64 range")),
        _ => Err(format!(
            "filters.metadata.{key}: expected a string, an integer or a boolean"
        )),
    }
}

fn bound(key: &str, value: &Value) -> Result<RangeBound, String> {
    match value {
        Value::Number(number) => number
            .as_f64()
            .filter(|f| f.is_finite())
            .map(RangeBound::Number)
            .ok_or_else(|| format!("filters.metadata.{key}: a range bound out of range")),
        Value::String(text) if is_datetime(text) => Ok(RangeBound::Datetime(normal_datetime(text))),
        _ => Err(format!(
            "filters.metadata.{key}: a range bound is a number or an RFC 3339 date-time"
        )),
    }
}

fn same_type(values: &[&MetaScalar]) -> bool {
    values
        .windows(2)
        .all(|pair| std::mem::discriminant(pair[0]) == std::mem::discriminant(pair[1]))
}

/// Parses `filters.metadata` of a query (a JSON object of key → condition).
pub fn parse_conditions(value: &Value) -> Result<Vec<MetaCondition>, String> {
    let object = match value {
        Value::Null => return Ok(Vec::new()),
        Value::Object(object) => object,
        _ => return Err("filters.metadata must be an object of key → condition".into()),
    };
    if object.len() > MAX_CONDITIONS {
        return Err(format!(
            "filters.metadata has {} keys, over the limit of {MAX_CONDITIONS}",
            object.len()
        ));
    }
    let mut conditions = Vec::with_capacity(object.len());
    for (key, condition) in object {
        check_key(key).map_err(|e| format!("filters.{e}"))?;
        let matches = match condition {
            Value::Object(operators) => {
                let any = operators.get("any");
                let (gte, lte) = (operators.get("gte"), operators.get("lte"));
                if let Some(unknown) = operators
                    .keys()
                    .find(|name| !matches!(name.as_str(), "any" | "gte" | "lte"))
                {
                    return Err(format!(
                        "filters.metadata.{key}: unknown operator {:?} (any, gte, lte)",
                        prefix(unknown)
                    ));
                }
                match (any, gte.is_some() || lte.is_some()) {
                    (Some(_), true) => {
                        return Err(format!(
                            "filters.metadata.{key}: either any or a range, not both"
                        ))
                    }
                    (Some(Value::Array(values)), false) => {
                        if values.is_empty() || values.len() > MAX_LIST {
                            return Err(format!(
                                "filters.metadata.{key}: any takes 1 to {MAX_LIST} values"
                            ));
                        }
                        let values = values
                            .iter()
                            .map(|v| scalar(key, v))
                            .collect::<Result<Vec<_>, _>>()?;
                        if !same_type(&values.iter().collect::<Vec<_>>())
                            || matches!(values[0], MetaScalar::Bool(_))
                        {
                            return Err(format!(
                                "filters.metadata.{key}: any takes strings or integers, all of one type"
                            ));
                        }
                        MetaMatch::Any(values)
                    }
                    (Some(_), false) => {
                        return Err(format!("filters.metadata.{key}: any takes a list"))
                    }
                    (None, true) => {
                        let gte = gte.map(|v| bound(key, v)).transpose()?;
                        let lte = lte.map(|v| bound(key, v)).transpose()?;
                        if let (Some(low), Some(high)) = (&gte, &lte) {
                            if std::mem::discriminant(low) != std::mem::discriminant(high) {
                                return Err(format!(
                                    "filters.metadata.{key}: gte and lte must both be numbers or both date-times"
                                ));
                            }
                        }
                        MetaMatch::Range { gte, lte }
                    }
                    (None, false) => {
                        return Err(format!(
                            "filters.metadata.{key}: an empty condition (give a value, any, gte or lte)"
                        ))
                    }
                }
            }
            value => MetaMatch::Value(scalar(key, value)?),
        };
        conditions.push(MetaCondition {
            key: key.clone(),
            matches,
        });
    }
    // Whatever order the caller wrote them in (the cache key is their JSON form).
    conditions.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(conditions)
}

/// The JSON form of conditions (what [`parse_conditions`] reads back).
pub fn conditions_to_json(conditions: &[MetaCondition]) -> Value {
    let scalar = |value: &MetaScalar| match value {
        MetaScalar::Keyword(text) => Value::String(text.clone()),
        MetaScalar::Integer(i) => Value::Number((*i).into()),
        MetaScalar::Bool(b) => Value::Bool(*b),
    };
    let bound = |value: &RangeBound| match value {
        RangeBound::Number(n) => Number::from_f64(*n).map_or(Value::Null, Value::Number),
        RangeBound::Datetime(text) => Value::String(text.clone()),
    };
    let mut object = Map::new();
    for condition in conditions {
        let value = match &condition.matches {
            MetaMatch::Value(value) => scalar(value),
            MetaMatch::Any(values) => {
                serde_json::json!({ "any": values.iter().map(scalar).collect::<Vec<_>>() })
            }
            MetaMatch::Range { gte, lte } => {
                let mut range = Map::new();
                if let Some(gte) = gte {
                    range.insert("gte".into(), bound(gte));
                }
                if let Some(lte) = lte {
                    range.insert("lte".into(), bound(lte));
                }
                Value::Object(range)
            }
        };
        object.insert(condition.key.clone(), value);
    }
    Value::Object(object)
}

/// A query's `filters.metadata`: its conditions, all required.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Value", into = "Value")]
pub struct MetaFilters(pub Vec<MetaCondition>);

impl TryFrom<Value> for MetaFilters {
    type Error = String;

    fn try_from(value: Value) -> Result<Self, String> {
        parse_conditions(&value).map(Self)
    }
}

impl From<MetaFilters> for Value {
    fn from(filters: MetaFilters) -> Value {
        conditions_to_json(&filters.0)
    }
}

/// A date-time [`is_datetime`] accepts, in one form both index engines parse alike:
/// `YYYY-MM-DDTHH:MM:SS[.f](Z|±HH:MM)` (an upper-case `T` and `Z`, seconds, and `Z` where no offset
/// was given, a date alone being its midnight UTC).
pub fn normal_datetime(text: &str) -> String {
    let mut out: String = text
        .chars()
        .enumerate()
        .map(|(i, c)| match c {
            ' ' | 't' if i == 10 => 'T',
            'z' => 'Z',
            c => c,
        })
        .collect();
    if out.len() == 10 {
        out.push_str("T00:00:00");
    }
    let offset = out.len() > 19 && out[19..].contains(['Z', '+', '-']);
    if !offset {
        out.push('Z');
    }
    out
}

/// Whether `text` is an RFC 3339 date-time or a date (`YYYY-MM-DD`, optionally `THH:MM:SS[.f]` and
/// `Z` or an offset `±HH:MM`; no offset is UTC), as the index's date-time ranges take them.
pub fn is_datetime(text: &str) -> bool {
    fn digits(text: &str, at: usize, n: usize) -> Option<u32> {
        let part = text.get(at..at + n)?;
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())
            .flatten()
    }
    let bytes = text.as_bytes();
    let (Some(year), Some(month), Some(day)) =
        (digits(text, 0, 4), digits(text, 5, 2), digits(text, 8, 2))
    else {
        return false;
    };
    if bytes.get(4) != Some(&b'-') || bytes.get(7) != Some(&b'-') {
        return false;
    }
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    if !(1..=days).contains(&day) {
        return false;
    }
    if text.len() == 10 {
        return true;
    }
    if !matches!(bytes.get(10), Some(b'T' | b't' | b' ')) {
        return false;
    }
    let (Some(hour), Some(minute)) = (digits(text, 11, 2), digits(text, 14, 2)) else {
        return false;
    };
    if bytes.get(13) != Some(&b':') || hour > 23 || minute > 59 {
        return false;
    }
    let mut at = 16;
    match (bytes.get(at), digits(text, at + 1, 2)) {
        (Some(b':'), Some(second)) if second <= 60 => at += 3,
        _ => return false,
    }
    if bytes.get(at) == Some(&b'.') {
        at += 1;
        let start = at;
        while bytes.get(at).is_some_and(u8::is_ascii_digit) {
            at += 1;
        }
        if at == start {
            return false;
        }
    }
    match bytes.get(at) {
        None => true,
        Some(b'Z' | b'z') => at + 1 == bytes.len(),
        Some(b'+' | b'-') => {
            bytes.get(at + 3) == Some(&b':')
                && digits(text, at + 1, 2).is_some_and(|h| h <= 23)
                && digits(text, at + 4, 2).is_some_and(|m| m <= 59)
                && at + 6 == bytes.len()
        }
        _ => false,
    }
}

/// Whether a condition applies to a key declared with `index`: equality and `any` on keywords,
/// integers and booleans of that type, numeric ranges on integers and floats, date-time ranges on
/// date-times. (On an index of another type the engine would compare unlike values: a number against
/// a date-time's microseconds.)
pub fn fits(index: MetaIndex, matches: &MetaMatch) -> bool {
    let scalar_fits = |value: &MetaScalar| {
        matches!(
            (index, value),
            (MetaIndex::Keyword, MetaScalar::Keyword(_))
                | (MetaIndex::Integer, MetaScalar::Integer(_))
                | (MetaIndex::Bool, MetaScalar::Bool(_))
        )
    };
    match matches {
        MetaMatch::Value(value) => scalar_fits(value),
        MetaMatch::Any(values) => values.iter().all(scalar_fits),
        MetaMatch::Range { gte, lte } => {
            let datetime = matches!(gte, Some(RangeBound::Datetime(_)))
                || matches!(lte, Some(RangeBound::Datetime(_)));
            match index {
                MetaIndex::Integer | MetaIndex::Float => !datetime,
                MetaIndex::Datetime => datetime,
                MetaIndex::Keyword | MetaIndex::Bool => false,
            }
        }
    }
}

/// Checks `conditions` against the declared keys' types ([`fits`]): the message names the first that
/// does not fit. Undeclared keys take any condition.
pub fn check_declared(
    declared: &BTreeMap<String, MetaIndex>,
    conditions: &[MetaCondition],
) -> Result<(), String> {
    for condition in conditions {
        if let Some(index) = declared.get(&condition.key) {
            if !fits(*index, &condition.matches) {
                return Err(format!(
                    "filters.metadata.{}: the key is declared {} ([index.metadata]); this condition does not apply to it",
                    condition.key,
                    index.as_str()
                ));
            }
        }
    }
    Ok(())
}

/// The payload index type of a declared metadata key (`[index.metadata]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetaIndex {
    /// Exact strings (equality, any).
    Keyword,
    /// Integers (equality, any, ranges).
    Integer,
    /// Floats (ranges).
    Float,
    /// Booleans (equality).
    Bool,
    /// RFC 3339 date-times (ranges).
    Datetime,
}

impl MetaIndex {
    /// The config name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Keyword => "keyword",
            Self::Integer => "integer",
            Self::Float => "float",
            Self::Bool => "bool",
            Self::Datetime => "datetime",
        }
    }
}

/// The JSON Schemas of metadata and of metadata filters (the wire contract; the decoder checks the
/// byte bounds the schemas can only describe).
#[cfg(feature = "schema")]
pub mod schema {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn metadata_is_canonical_and_bounded() {
        let a = Metadata::parse(&json!({"b": 1, "a": ["x", 2.5, true]})).expect("valid");
        let b = Metadata::parse(&json!({"a": ["x", 2.5, true], "b": 1})).expect("valid");
        assert_eq!(a, b);
        assert_eq!(a.as_str(), r#"{"a":["x",2.5,true],"b":1}"#);
        assert_eq!(Metadata::parse(&a.to_object().into()).expect("again"), a);
        assert!(Metadata::parse(&json!(null)).expect("none").is_empty());
        assert!(Metadata::parse(&json!({})).expect("none").is_empty());
        for (bad, says) in [
            (json!([1]), "object"),
            (json!({"a": {"b": 1}}), "nested"),
            (json!({"a": null}), "null"),
            (json!({"a": [[1]]}), "list element"),
            (json!({"a.b": 1}), "letters"),
            (json!({"": 1}), "1 to 64"),
            (json!({"a": "x".repeat(MAX_STRING_BYTES + 1)}), "exceeds"),
            (json!({"a": vec![1; MAX_LIST + 1]}), "exceeds"),
            (json!({"a": 18446744073709551615u64}), "i64"),
        ] {
            let error = Metadata::parse(&bad).expect_err("refused");
            assert!(error.contains(says), "{bad}: {error}");
        }
        let many: Map<String, Value> = (0..=MAX_KEYS)
            .map(|i| (format!("k{i}"), json!(i)))
            .collect();
        assert!(Metadata::parse(&Value::Object(many)).is_err());
        let big: Map<String, Value> = (0..20)
            .map(|i| (format!("k{i}"), json!("x".repeat(1000))))
            .collect();
        assert!(Metadata::parse(&Value::Object(big))
            .expect_err("over 16 KiB")
            .contains("limit"));
    }

    #[test]
    fn conditions_parse_and_round_trip() {
        let value = json!({
            "team": "search",
            "year": {"gte": 2020, "lte": 2024},
            "tier": {"any": [1, 2]},
            "published": {"gte": "2024-05-01T00:00:00Z"},
            "draft": false,
        });
        let conditions = parse_conditions(&value).expect("valid");
        assert_eq!(conditions.len(), 5);
        assert_eq!(
            parse_conditions(&conditions_to_json(&conditions)).expect("again"),
            conditions
        );
        let year = conditions.iter().find(|c| c.key == "year").expect("year");
        assert_eq!(year.path(), "metadata.year");
        assert_eq!(
            year.matches,
            MetaMatch::Range {
                gte: Some(RangeBound::Number(2020.0)),
                lte: Some(RangeBound::Number(2024.0))
            }
        );
        for (bad, says) in [
            (json!({"a": 1.5}), "range"),
            (json!({"a": {"any": []}}), "1 to 64"),
            (json!({"a": {"any": ["x", 1]}}), "one type"),
            (json!({"a": {"any": [true]}}), "one type"),
            (json!({"a": {"gte": 1, "lte": "2024-01-01"}}), "both"),
            (json!({"a": {"gte": "yesterday"}}), "RFC 3339"),
            (json!({"a": {"any": ["x"], "gte": 1}}), "not both"),
            (json!({"a": {"eq": 1}}), "unknown operator"),
            (json!({"a": {}}), "empty"),
            (json!({"a": null}), "expected"),
            (json!({"a b": 1}), "letters"),
            (json!(["a"]), "object"),
        ] {
            let error = parse_conditions(&bad).expect_err("refused");
            assert!(error.contains(says), "{bad}: {error}");
        }
        let many: Map<String, Value> = (0..=MAX_CONDITIONS)
            .map(|i| (format!("k{i}"), json!(i)))
            .collect();
        assert!(parse_conditions(&Value::Object(many)).is_err());
    }

    #[test]
    fn conditions_are_sorted_and_date_times_normal() {
        let conditions = parse_conditions(
            &json!({"b": 1, "a": {"gte": "2024-05-01t12:00:00", "lte": "2024-05-02"}}),
        )
        .expect("valid");
        assert_eq!(conditions[0].key, "a");
        assert_eq!(
            conditions[0].matches,
            MetaMatch::Range {
                gte: Some(RangeBound::Datetime("2024-05-01T12:00:00Z".into())),
                lte: Some(RangeBound::Datetime("2024-05-02T00:00:00Z".into())),
            }
        );
        for (text, normal) in [
            ("2024-05-01 12:00:00.5+02:00", "2024-05-01T12:00:00.5+02:00"),
            ("2024-05-01T12:00:00z", "2024-05-01T12:00:00Z"),
            ("2024-05-01T12:00:00-05:30", "2024-05-01T12:00:00-05:30"),
        ] {
            assert!(is_datetime(text), "{text}");
            assert_eq!(normal_datetime(text), normal);
            assert!(is_datetime(&normal_datetime(text)), "{normal}");
        }
    }

    #[test]
    fn declared_types_take_only_their_conditions() {
        let declared: BTreeMap<String, MetaIndex> = [
            ("year".to_string(), MetaIndex::Integer),
            ("when".to_string(), MetaIndex::Datetime),
            ("team".to_string(), MetaIndex::Keyword),
            ("score".to_string(), MetaIndex::Float),
        ]
        .into();
        for (conditions, ok) in [
            (
                json!({"year": {"gte": 2020}, "team": "a", "score": {"lte": 1.5}}),
                true,
            ),
            (json!({"when": {"gte": "2024-01-01"}, "other": "x"}), true),
            (json!({"year": {"any": [1, 2]}}), true),
            (json!({"when": {"gte": 2023}}), false),
            (json!({"year": {"gte": "2024-01-01"}}), false),
            (json!({"team": 3}), false),
            (json!({"score": 2}), false),
            (json!({"when": "2024-01-01"}), false),
        ] {
            let parsed = parse_conditions(&conditions).expect("valid");
            assert_eq!(
                check_declared(&declared, &parsed).is_ok(),
                ok,
                "{conditions}"
            );
        }
    }

    #[test]
    fn datetimes_are_checked() {
        for good in [
            "2024-05-01",
            "2024-05-01T12:00:00",
            "2024-05-01T12:00:59Z",
            "2024-05-01 12:00:00.123+02:00",
            "2024-12-31T23:59:60.5-05:30",
            "2024-02-29",
            "2024-05-01t12:00:00",
        ] {
            assert!(is_datetime(good), "{good}");
        }
        for bad in [
            "2024-5-1",
            "2024-13-01",
            "2024-05-00",
            "2023-02-29",
            "2024-04-31",
            "2024-05-01T24:00:00",
            "2024-05-01T12:00",
            "2024-05-01T12:00Zx",
            "2024-05-01T12:00:00.",
            "2024-05-01T12:00:00+2:00",
            "yesterday",
            "",
            "２０２４-05-01",
        ] {
            assert!(!is_datetime(bad), "{bad}");
        }
    }
}
