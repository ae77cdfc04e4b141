//! SQL-schema JSON: one chunk per table, never split.
//!
//! Accepted shapes: one table object, an array of them, or `{"tables": [...]}`. A table object has
//! `database`, `schema`, `table_name`, `row_count`, `columns: [{name, type, distribution}]` and
//! `sample_rows`. Each table is rendered as compact text; when the rendering exceeds the budget, sample
//! rows are dropped from the end, then column distributions, and only then is the text cut — the table
//! stays one chunk.

use serde_json::Value;

use super::Piece;
use crate::tokens::TokenCounter;

/// Whether `text` parses as SQL-schema JSON with at least one table.
pub(super) fn looks_like_schema(text: &str) -> bool {
    serde_json::from_str::<Value>(text)
        .map(|value| !tables(&value).is_empty())
        .unwrap_or(false)
}

fn tables(value: &Value) -> Vec<&Value> {
    let is_table = |v: &Value| v.get("table_name").is_some_and(Value::is_string);
    match value {
        Value::Array(items) => items.iter().filter(|v| is_table(v)).collect(),
        Value::Object(map) => {
            if is_table(value) {
                vec![value]
            } else if let Some(Value::Array(items)) = map.get("tables") {
                items.iter().filter(|v| is_table(v)).collect()
            } else {
                Vec::new()
            }
        }
        _ => Vec::new(),
    }
}

fn str_field<'a>(table: &'a Value, name: &str) -> &'a str {
    table.get(name).and_then(Value::as_str).unwrap_or("")
}

/// The qualified name `database.schema.table` (empty parts omitted).
pub fn qualified_name(table: &Value) -> String {
    ["database", "schema", "table_name"]
        .iter()
        .map(|f| str_field(table, f))
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(".")
}

fn render(table: &Value, sample_rows: usize, distributions: bool) -> String {
    let mut out = format!("Table {}", qualified_name(table));
    if let Some(rows) = table.get("row_count").and_then(Value::as_u64) {
        out.push_str(&format!(" ({rows} rows)"));
    }
    out.push_str("\nColumns:");
    for column in table
        .get("columns")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        out.push_str(&format!(
            "\n- {} {}",
            str_field(column, "name"),
            str_field(column, "type")
        ));
        if distributions {
            if let Some(distribution) = column.get("distribution").filter(|d| !d.is_null()) {
                out.push_str(&format!(": {distribution}"));
            }
        }
    }
    let rows: Vec<&Value> = table
        .get("sample_rows")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .take(sample_rows)
        .collect();
    if !rows.is_empty() {
        out.push_str("\nSample rows:");
        for row in rows {
            out.push_str(&format!("\n{row}"));
        }
    }
    out
}

pub(super) fn chunk_schema(text: &str, counter: TokenCounter, budget: usize) -> Option<Vec<Piece>> {
    let value: Value = serde_json::from_str(text).ok()?;
    let tables = tables(&value);
    if tables.is_empty() {
        return None;
    }
    let pieces = tables
        .into_iter()
        .map(|table| {
            let all_rows = table
                .get("sample_rows")
                .and_then(Value::as_array)
                .map(Vec::len)
                .unwrap_or(0);
            let mut rendered = render(table, all_rows, true);
            let mut rows = all_rows;
            while counter.count(&rendered) > budget && rows > 0 {
                rows -= 1;
                rendered = render(table, rows, true);
            }
            if counter.count(&rendered) > budget {
                rendered = render(table, 0, false);
            }
            let rendered = counter.truncate(&rendered, budget).to_string();
            let name = str_field(table, "table_name");
            // Locate the table in the source for line numbers: the first `"table_name": "<name>"`.
            let needle = format!("\"{name}\"");
            let start = text.find(&needle).unwrap_or(0);
            let path: Vec<String> = ["database", "schema", "table_name"]
                .iter()
                .map(|f| str_field(table, f).to_string())
                .filter(|s| !s.is_empty())
                .collect();
            Piece {
                start,
                end: start + needle.len().min(text.len() - start),
                section_path: path,
                header: qualified_name(table),
                rendered: Some(rendered),
                page: None,
            }
        })
        .collect();
    Some(pieces)
}
