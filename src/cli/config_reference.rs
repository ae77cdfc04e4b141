//! `ragstream config-reference`: the configuration reference (docs/config-reference.md), generated
//! from the config types themselves: each section and key in the order the types declare them, the
//! key's default (the types' `Default`, serialised) and its `///` doc comment, read from the sources
//! the binary is built from. A test keeps the committed file current.

use serde_json::Value;

use ragstream_topologies::config::Config;

/// The sources of every config type, by path (their `///` comments are the reference's text).
const SOURCES: [&str; 15] = [
    include_str!("../../topologies/src/config/mod.rs"),
    include_str!("../../topologies/src/config/pipeline.rs"),
    include_str!("../../topologies/src/config/serving.rs"),
    include_str!("../../topologies/src/config/sources.rs"),
    include_str!("../../operators/core/src/query/mod.rs"),
    include_str!("../../operators/core/src/query/rerank.rs"),
    include_str!("../../operators/core/src/query/pack.rs"),
    include_str!("../../operators/core/src/query/endpoints.rs"),
    include_str!("../../operators/core/src/query/intent.rs"),
    include_str!("../../operators/core/src/query/adapt.rs"),
    include_str!("../../operators/core/src/query/modes.rs"),
    include_str!("../../operators/core/src/query/surrogate.rs"),
    include_str!("../../operators/core/src/store/mod.rs"),
    include_str!("../../operators/core/src/store/bm25.rs"),
    include_str!("../../operators/core/src/query/invalidate.rs"),
];

/// Structs rendered as one inline table rather than a section of their own.
const INLINE: [&str; 3] = ["Preset", "Weights", "Depth"];

/// One field of a config struct, as its source declares it.
#[derive(Debug, Clone)]
struct Field {
    name: String,
    /// The type's last path segment (`QueryConfig` for `ragstream_core::query::QueryConfig`).
    type_name: String,
    doc: String,
    /// Whether a missing key takes a default (a field or container `#[serde(default …)]`).
    defaulted: bool,
}

/// A config struct: its doc comment and fields in declaration order.
#[derive(Debug, Clone, Default)]
struct Struct {
    doc: String,
    fields: Vec<Field>,
}

/// Every `pub struct` of `SOURCES` with its documented `pub` fields.
fn structs() -> std::collections::BTreeMap<String, Struct> {
    let mut found = std::collections::BTreeMap::new();
    for source in SOURCES {
        // Only the code before the tests (a `#[cfg(test)]` import above does not end it).
        let source = source
            .split("\n#[cfg(test)]\nmod tests")
            .next()
            .unwrap_or(source);
        let lines: Vec<&str> = source.lines().collect();
        let mut index = 0;
        while index < lines.len() {
            let line = lines[index];
            let Some(rest) = line.strip_prefix("pub struct ") else {
                index += 1;
                continue;
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let attributes = preceding(&lines, index, "#[");
            let container_default = attributes
                .iter()
                .any(|a| a.contains("serde(") && a.contains("default"));
            let doc = doc_text(&preceding(&lines, index, "///"));
            let mut parsed = Struct {
                doc,
                fields: Vec::new(),
            };
            index += 1;
            while index < lines.len() && lines[index] != "}" {
                let line = lines[index].trim();
                if let Some(field) = line.strip_prefix("pub ") {
                    if let Some((name, type_path)) = field.split_once(": ") {
                        let type_path = type_path.trim_end_matches(',');
                        let type_name = type_path
                            .split('<')
                            .next()
                            .unwrap_or(type_path)
                            .rsplit("::")
                            .next()
                            .unwrap_or(type_path)
                            .to_string();
                        let attributes = preceding(&lines, index, "#[");
                        // A field serde skips is not a key.
                        if attributes.iter().any(|a| a.contains("serde(skip)")) {
                            index += 1;
                            continue;
                        }
                        let defaulted = container_default
                            || attributes
                                .iter()
                                .any(|a| a.contains("serde(") && a.contains("default"));
                        parsed.fields.push(Field {
                            name: name.to_string(),
                            type_name,
                            doc: doc_text(&preceding(&lines, index, "///")),
                            defaulted,
                        });
                    }
                }
                index += 1;
            }
            found.insert(name, parsed);
        }
    }
    found
}

/// The lines right above `index` that start with `prefix` (attributes and doc comments may
/// interleave), in order.
fn preceding<'a>(lines: &[&'a str], index: usize, prefix: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut at = index;
    while at > 0 {
        let line = lines[at - 1].trim();
        if !(line.starts_with("///") || line.starts_with("#[")) {
            break;
        }
        if line.starts_with(prefix) {
            out.push(line);
        }
        at -= 1;
    }
    out.reverse();
    out
}

/// A doc comment as one line of Markdown (intra-doc links as code, table pipes escaped).
fn doc_text(lines: &[&str]) -> String {
    let joined = lines
        .iter()
        .map(|l| l.trim_start_matches("///").trim())
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let mut out = String::with_capacity(joined.len());
    let mut rest = joined.as_str();
    // `[`x`]` (an intra-doc link) becomes `x`; `[text](url)` stays a link.
    while let Some(start) = rest.find("[`") {
        let Some(end) = rest[start..].find("`]") else {
            break;
        };
        let after = &rest[start + end + 2..];
        if after.starts_with('(') {
            out.push_str(&rest[..start + end + 2]);
        } else {
            out.push_str(&rest[..start]);
            out.push_str(&rest[start + 1..start + end + 1]);
        }
        rest = after;
    }
    out.push_str(rest);
    out.replace('|', "\\|")
}

/// A default as TOML writes it.
fn toml_value(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::String(s) => format!("{s:?}"),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(toml_value).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(map) if map.is_empty() => "{}".into(),
        Value::Object(map) => format!(
            "{{ {} }}",
            map.iter()
                .map(|(k, v)| format!("{k} = {}", toml_value(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        // Config floats are f32: print the shortest form that reads back as the same f32.
        Value::Number(n) if n.is_f64() => {
            let short = format!("{}", n.as_f64().unwrap_or_default() as f32);
            if short.contains(['.', 'e', 'N', 'i']) {
                short
            } else {
                format!("{short}.0")
            }
        }
        other => other.to_string(),
    }
}

/// The reference, in Markdown.
pub fn reference() -> String {
    let defaults: Config = serde_json::from_value(serde_json::json!({"source": {"kind": "kafka"}}))
        .expect("a config of defaults");
    let defaults = serde_json::to_value(&defaults).expect("the config serialises");
    let structs = structs();
    let mut out = String::from(
        "# Configuration reference\n\n\
         Every key of the job's TOML configuration, its default and what it does, section by section.\n\
         Generated from the config types (`ragstream config-reference > docs/config-reference.md`; a\n\
         test fails when this file is stale), so it is as current as the code. How configuration is\n\
         loaded, overridden from the environment and validated: [configuration.md](configuration.md).\n",
    );
    section(&mut out, &structs, "Config", "", &defaults);
    out
}

/// Writes the section of struct `name` at `path` (and its sub-sections after it).
fn section(
    out: &mut String,
    structs: &std::collections::BTreeMap<String, Struct>,
    name: &str,
    path: &str,
    defaults: &Value,
) {
    let Some(parsed) = structs.get(name) else {
        return;
    };
    let mut rows = Vec::new();
    let mut nested = Vec::new();
    for field in &parsed.fields {
        let value = defaults.get(&field.name).unwrap_or(&Value::Null);
        let key = if path.is_empty() {
            field.name.clone()
        } else {
            format!("{path}.{}", field.name)
        };
        if structs.contains_key(&field.type_name)
            && !INLINE.contains(&field.type_name.as_str())
            && value.is_object()
        {
            nested.push((key, field));
            continue;
        }
        let default = match (field.defaulted, value) {
            (false, _) => "*(required)*".to_string(),
            (true, Value::Null) => "*(unset)*".to_string(),
            (true, value) => format!("`{}`", toml_value(value)),
        };
        rows.push(format!("| `{}` | {default} | {} |", field.name, field.doc));
    }
    if !rows.is_empty() {
        out.push_str(&format!("\n## `[{path}]`\n\n"));
        if !parsed.doc.is_empty() {
            out.push_str(&format!("{}\n\n", parsed.doc));
        }
        out.push_str("| key | default | meaning |\n|---|---|---|\n");
        for row in rows {
            out.push_str(&row);
            out.push('\n');
        }
    }
    for (key, field) in nested {
        let value = defaults.get(&field.name).unwrap_or(&Value::Null);
        section(out, structs, &field.type_name, &key, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_reference_is_current() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/config-reference.md");
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == reference(),
            "docs/config-reference.md is stale: run `cargo run -- config-reference > docs/config-reference.md`"
        );
    }

    #[test]
    fn every_key_of_every_section_is_listed_with_its_default_and_doc() {
        let text = reference();
        for (section, row) in [
            ("## `[query]`", "| `rrf_k` | `60.0` |"),
            ("## `[query.window]`", "| `reserve_ratio` | `0.25` |"),
            ("## `[query.code_search]`", "| `share` | `0.6` |"),
            (
                "## `[query.intents]`",
                "| `procedure` | `{ weights = { dense = 0.6, bm25 = 0.4 }, depth = { dense = 24, bm25 = 16 } }` |",
            ),
            ("## `[query.hyde]`", "| `intents` | `[\"exploratory\"]` |"),
            ("## `[source]`", "| `kind` | *(required)* |"),
            ("## `[index.tuning]`", "| `m` |"),
            ("## `[query.rerank]`", "| `window` | `40` |"),
        ] {
            let at = text.find(section).unwrap_or_else(|| panic!("{section} missing"));
            let next = text[at + 1..].find("\n## ").map_or(text.len(), |n| at + 1 + n);
            assert!(text[at..next].contains(row), "{section}: {row} missing");
        }
        // Every key a config file may hold appears: a key unknown to the reference would be one the
        // types accept but nobody documented.
        let defaults: Config =
            serde_json::from_value(serde_json::json!({"source": {"kind": "kafka"}})).unwrap();
        let value = serde_json::to_value(&defaults).unwrap();
        let mut missing = Vec::new();
        walk(&value, "", &text, &mut missing);
        assert!(missing.is_empty(), "keys not in the reference: {missing:?}");
    }

    /// Collects the keys of `value` (a section) that have no row under their section's heading.
    fn walk(value: &Value, path: &str, text: &str, missing: &mut Vec<String>) {
        let Value::Object(map) = value else { return };
        for (key, inner) in map {
            let full = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            let heading = format!("## `[{full}]`");
            if inner.is_object() && text.contains(&heading) {
                walk(inner, &full, text, missing);
                continue;
            }
            let section = format!("## `[{path}]`");
            let found = text.find(&section).is_some_and(|at| {
                let next = text[at + 1..]
                    .find("\n## ")
                    .map_or(text.len(), |n| at + 1 + n);
                text[at..next].contains(&format!("| `{key}` |"))
            });
            if !found {
                missing.push(full);
            }
        }
    }
}
