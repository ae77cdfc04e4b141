//! Retrieval presets: named sets of query tunables a query picks with `preset` (`default`, `fast`,
//! `conservative`, or one the job defines under `[query.presets.<name>]`).
//!
//! A preset is an overlay on the job's `[query]` section: the built-in overlay of that name (if any),
//! then the job's own keys for it, merged key by key over the section. Only the tunables a single
//! query is answered with may be set (depths, fusion, rerank weights, dedup, MMR, packing, the
//! window, HyDE's strategy); what the job is built with (caches, limits, the ACL rule, endpoints,
//! invalidations) is refused by name, as is an unknown key. Each resolved preset passes the same
//! load checks as the section itself (the config's `validate`).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::QueryConfig;

/// The preset a query without `preset` is answered with: the `[query]` section itself.
pub const DEFAULT_PRESET: &str = "default";
/// Presets every job has; a job may change their keys or define more.
pub const BUILT_IN: [&str; 2] = ["fast", "conservative"];
/// Most presets a job may define (built-ins included).
pub const MAX_PRESETS: usize = 32;
/// Longest preset name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;

/// The top-level `[query]` keys a preset may set.
const PER_QUERY: [&str; 16] = [
    "default_k",
    "deep_k",
    "default_token_budget",
    "rrf_k",
    "min_pool",
    "similarity_threshold",
    "rerank",
    "near_duplicate",
    "mmr_lambda",
    "mmr_file_penalty",
    "per_document_cap",
    "per_section_cap",
    "pack",
    "window",
    "adapt_fusion",
    "hyde",
];
/// Keys of `rerank` and `hyde` that the job is built with, so no preset may set them.
const JOB_LEVEL_NESTED: [(&str, &[&str]); 2] = [
    ("rerank", &["kind", "endpoint", "endpoint_window"]),
    (
        "hyde",
        &[
            "enabled",
            "endpoint",
            "max_tokens",
            "cache_entries",
            "cache_ttl_secs",
        ],
    ),
];

/// The built-in overlay of `name`.
///
/// - `fast`: fewer candidates per lane (`min_pool` 10) and in the rerank window (20), no section
///   reunification (no neighbour fetch), no HyDE passage unless the query asks for one.
/// - `conservative`: fewer and surer items: a dense floor (`similarity_threshold` 0.2), an evidence
///   stop and band set higher (0.75, 0.85), near-duplicates removed from cosine 0.9.
pub fn built_in(name: &str) -> Option<Value> {
    match name {
        "fast" => Some(json!({
            "min_pool": 10,
            "rerank": {"window": 20},
            "pack": {"section_reunification": false},
            "hyde": {"strategy": "skip"},
        })),
        "conservative" => Some(json!({
            "similarity_threshold": 0.2,
            "near_duplicate": 0.9,
            "pack": {"evidence_ratio": 0.75, "sentence_ratio": 0.85},
        })),
        _ => None,
    }
}

/// Whether `name` may name a preset: 1 to 64 bytes of lowercase ASCII letters, digits, `_`, `-`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// `overlay` merged into `base`, key by key (tables recursively; any other value replaces).
fn merge(base: &mut Value, overlay: &Value) {
    match (base, overlay) {
        (Value::Object(base), Value::Object(overlay)) => {
            for (key, value) in overlay {
                match base.get_mut(key) {
                    Some(existing) => merge(existing, value),
                    None => {
                        base.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (base, overlay) => *base = overlay.clone(),
    }
}

/// Refuses an overlay that sets a key the job is built with.
fn check_keys(overlay: &Map<String, Value>) -> Result<(), String> {
    for (key, value) in overlay {
        if !PER_QUERY.contains(&key.as_str()) {
            return Err(format!(
                "`{key}` is the job's, not a query's: a preset may set {}",
                PER_QUERY.join(", ")
            ));
        }
        for (section, refused) in JOB_LEVEL_NESTED {
            if key == section {
                if let Some(nested) = value.as_object() {
                    if let Some(bad) = nested.keys().find(|k| refused.contains(&k.as_str())) {
                        return Err(format!("`{section}.{bad}` is the job's, not a query's"));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Every preset of `base` (the built-ins and the job's `presets`), resolved to whole query
/// configurations; `default` is not among them (it is `base`).
pub fn resolve(base: &QueryConfig) -> Result<BTreeMap<String, Arc<QueryConfig>>, String> {
    let mut names: Vec<&str> = BUILT_IN.to_vec();
    names.extend(base.presets.keys().map(String::as_str));
    names.sort_unstable();
    names.dedup();
    if names.len() > MAX_PRESETS {
        return Err(format!("at most {MAX_PRESETS} presets"));
    }
    let mut plain = base.clone();
    plain.presets.clear();
    plain.resolved_presets = Default::default();
    let plain = serde_json::to_value(&plain).map_err(|e| e.to_string())?;
    let mut resolved = BTreeMap::new();
    for name in names {
        if name == DEFAULT_PRESET {
            return Err("`default` is the [query] section itself; set its keys there".into());
        }
        if !valid_name(name) {
            return Err(format!(
                "preset name {name:?}: 1 to {MAX_NAME_BYTES} bytes of a-z, 0-9, _ and -"
            ));
        }
        let mut config = plain.clone();
        let own = base.presets.get(name);
        for overlay in [built_in(name).as_ref(), own].into_iter().flatten() {
            let Some(table) = overlay.as_object() else {
                return Err(format!("preset {name}: must be a table of [query] keys"));
            };
            check_keys(table).map_err(|e| format!("preset {name}: {e}"))?;
            merge(&mut config, overlay);
        }
        let config: QueryConfig =
            serde_json::from_value(config).map_err(|e| format!("preset {name}: {e}"))?;
        resolved.insert(name.to_string(), Arc::new(config));
    }
    Ok(resolved)
}

impl QueryConfig {
    /// The configuration a query naming `preset` is answered with: a resolved preset (see
    /// [`Self::with_presets`]), or this section itself for `default`, no name, or a name it does
    /// not hold (a query naming one is refused when it is decoded).
    pub fn preset(&self, preset: Option<&str>) -> &QueryConfig {
        preset
            .and_then(|name| self.resolved_presets.get(name))
            .map_or(self, |resolved| resolved.as_ref())
    }

    /// The settings a query naming `preset` is answered with, shared: [`Self::preset`] without a
    /// copy. The query flow resolves them once per query and carries them on its record.
    pub fn settings(self: &Arc<Self>, preset: Option<&str>) -> Arc<QueryConfig> {
        preset
            .and_then(|name| self.resolved_presets.get(name))
            .unwrap_or(self)
            .clone()
    }

    /// This section with its presets resolved ([`resolve`]).
    pub fn with_presets(mut self) -> Result<Self, String> {
        self.resolved_presets = Arc::new(resolve(&self)?);
        Ok(self)
    }

    /// The names a query's `preset` may take: `default` and every resolved preset.
    pub fn preset_names(&self) -> Vec<String> {
        std::iter::once(DEFAULT_PRESET.to_string())
            .chain(self.resolved_presets.keys().cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(presets: Value) -> Result<QueryConfig, String> {
        let presets: BTreeMap<String, Value> = serde_json::from_value(presets).expect("a table");
        QueryConfig {
            presets,
            ..QueryConfig::default()
        }
        .with_presets()
    }

    #[test]
    fn the_built_in_presets_change_their_keys_and_nothing_else() {
        let base = QueryConfig::default();
        let config = base.clone().with_presets().expect("built-ins resolve");
        assert_eq!(config.preset_names(), ["default", "conservative", "fast"]);
        assert_eq!(config.preset(None), &config);
        assert_eq!(config.preset(Some("default")), &config);
        assert_eq!(config.preset(Some("unknown")), &config);
        let fast = config.preset(Some("fast"));
        assert_eq!(fast.min_pool, 10);
        assert_eq!(fast.rerank.window, 20);
        assert!(!fast.pack.section_reunification);
        assert_eq!(
            fast.hyde.strategy,
            super::super::endpoints::HydeStrategy::Skip
        );
        // Everything else is the section's.
        let mut expected = base.clone();
        expected.min_pool = 10;
        expected.rerank.window = 20;
        expected.pack.section_reunification = false;
        expected.hyde.strategy = super::super::endpoints::HydeStrategy::Skip;
        assert_eq!(fast, &expected);
        let conservative = config.preset(Some("conservative"));
        let mut expected = base;
        expected.similarity_threshold = 0.2;
        expected.near_duplicate = 0.9;
        expected.pack.evidence_ratio = 0.75;
        expected.pack.sentence_ratio = 0.85;
        assert_eq!(conservative, &expected);
    }

    #[test]
    fn a_jobs_keys_merge_over_a_built_in_and_over_the_section() {
        let config = QueryConfig {
            mmr_lambda: 0.6,
            ..QueryConfig::default()
        };
        let presets = serde_json::from_value(json!({
            "fast": {"rerank": {"window": 12}},
            "wide": {"min_pool": 40, "pack": {"max_snippets": 3}},
        }))
        .expect("a table");
        let config = QueryConfig { presets, ..config }
            .with_presets()
            .expect("valid");
        assert_eq!(
            config.preset_names(),
            ["default", "conservative", "fast", "wide"]
        );
        let fast = config.preset(Some("fast"));
        assert_eq!(fast.rerank.window, 12, "the job's key wins");
        assert_eq!(fast.min_pool, 10, "the built-in's other keys stay");
        assert_eq!(fast.rerank.lanes, 1.0, "untouched nested keys stay");
        let wide = config.preset(Some("wide"));
        assert_eq!((wide.min_pool, wide.pack.max_snippets), (40, 3));
        assert_eq!(wide.mmr_lambda, 0.6, "the section's own values carry over");
        assert!(wide.presets.is_empty() && wide.resolved_presets.is_empty());
        // The shared settings are the same resolved sections, not copies; a resolved preset
        // resolves to itself.
        let shared = Arc::new(config);
        let wide = shared.settings(Some("wide"));
        assert!(Arc::ptr_eq(&wide, &shared.resolved_presets["wide"]));
        assert!(Arc::ptr_eq(&wide.settings(Some("wide")), &wide));
        for name in [None, Some("default"), Some("unknown")] {
            assert!(Arc::ptr_eq(&shared.settings(name), &shared), "{name:?}");
        }
    }

    #[test]
    fn job_level_keys_unknown_keys_and_bad_names_are_refused() {
        for (presets, names) in [
            (json!({"x": {"cache_entries": 0}}), "cache_entries"),
            (json!({"x": {"absent_acl": "all"}}), "absent_acl"),
            (json!({"x": {"max_query_bytes": 1}}), "max_query_bytes"),
            (
                json!({"x": {"rerank": {"endpoint": {"url": "http://h"}}}}),
                "rerank.endpoint",
            ),
            (json!({"x": {"hyde": {"enabled": true}}}), "hyde.enabled"),
            (json!({"x": {"rerank": {"windw": 3}}}), "windw"),
            (json!({"x": {"min_pool": "many"}}), "invalid type"),
            (json!({"default": {"min_pool": 3}}), "default"),
            (json!({"Fast!": {"min_pool": 3}}), "Fast!"),
            (json!({"x": 3}), "table"),
        ] {
            let error = with(presets.clone()).expect_err(&presets.to_string());
            assert!(error.contains(names), "{presets}: {error}");
        }
        let many: Map<String, Value> = (0..MAX_PRESETS)
            .map(|i| (format!("p{i}"), json!({})))
            .collect();
        assert!(with(Value::Object(many)).is_err());
    }
}
