//! Declared metadata keys (`[index.metadata]`): their payload index types, and which conditions
//! apply to a key of each type.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{MetaCondition, MetaMatch, MetaScalar, RangeBound};

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
