//! A query's conditions on metadata (`filters.metadata`): their types, parsed and checked from
//! JSON, written back to the same JSON.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};

use super::{
    check_key, is_datetime, normal_datetime, prefix, MAX_CONDITIONS, MAX_LIST, MAX_STRING_BYTES,
};

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
