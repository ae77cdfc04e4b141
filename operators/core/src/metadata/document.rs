//! A document's metadata: checked against the bounds, kept in canonical JSON, read back from the
//! index's payload.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{check_key, MAX_BYTES, MAX_KEYS, MAX_LIST, MAX_STRING_BYTES};

/// A document's metadata in canonical JSON (keys sorted, compact); empty when the document has none.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Metadata(String);

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
