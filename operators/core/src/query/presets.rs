//! Retrieval presets: named sets of query tunables a query picks with `preset` (`default`, `fast`,
//! `conservative`, or one the job defines under `[query.presets.<name>]`).
//!
//! A preset is a typed overlay on the job's `[query]` section ([`PresetOverlay`]): one `Option` per
//! key a single query is answered with (depths, fusion, rerank weights, dedup, MMR, packing, the
//! window, HyDE's strategy), tables within tables. The built-in overlay of that name (if any) is
//! applied over the section, then the job's own. What the job is built with (caches, limits, the
//! ACL rule, endpoints, invalidations) has no field, so serde refuses it by name at load, as it
//! does an unknown key. Each resolved preset passes the same load checks as the section itself
//! (the config's `validate`).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::endpoints::HydeStrategy;
use super::intent::Intent;
use super::modes::WindowConfig;
use super::pack::PackConfig;
use super::rerank::RerankConfig;
use super::surrogate::{SurrogateConfig, SurrogatePolicy};
use super::{endpoints::HydeConfig, QueryConfig};

/// The preset a query without `preset` is answered with: the `[query]` section itself.
pub const DEFAULT_PRESET: &str = "default";
/// Presets every job has; a job may change their keys or define more.
pub const BUILT_IN: [&str; 2] = ["fast", "conservative"];
/// Most presets a job may define (built-ins included).
pub const MAX_PRESETS: usize = 32;
/// Longest preset name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;

/// Declares the overlay of a config section: the section's keys a preset may set, each an
/// `Option` (absent: the section's value stays), its sub-tables overlays of their own, and
/// `apply`, which writes the keys that are set over a section.
macro_rules! overlay {
    (
        $(#[$meta:meta])*
        $name:ident over $section:ty {
            $($key:ident: $ty:ty,)*
        }
        $(tables { $($table:ident: $overlay:ty,)* })?
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $(
                #[doc = concat!("`", stringify!($key), "`, where the preset sets it.")]
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub $key: Option<$ty>,
            )*
            $($(
                #[doc = concat!("Keys of `", stringify!($table), "`, where the preset sets any.")]
                #[serde(default, skip_serializing_if = "Option::is_none")]
                pub $table: Option<$overlay>,
            )*)?
        }

        impl $name {
            /// Writes the keys this overlay sets over `section`.
            pub fn apply(&self, section: &mut $section) {
                $(
                    if let Some(value) = &self.$key {
                        section.$key = value.clone();
                    }
                )*
                $($(
                    if let Some(table) = &self.$table {
                        table.apply(&mut section.$table);
                    }
                )*)?
            }
        }
    };
}

overlay! {
    /// A preset: the `[query]` keys a single query is answered with.
    PresetOverlay over QueryConfig {
        default_k: usize,
        deep_k: usize,
        default_token_budget: usize,
        rrf_k: f32,
        min_pool: usize,
        similarity_threshold: f32,
        near_duplicate: f32,
        mmr_lambda: f32,
        mmr_file_penalty: f32,
        per_document_cap: usize,
        per_section_cap: usize,
        adapt_fusion: bool,
    }
    tables {
        rerank: RerankOverlay,
        pack: PackOverlay,
        window: WindowOverlay,
        hyde: HydeOverlay,
    }
}

overlay! {
    /// A preset's `rerank`: the window and weights (not `kind`, `endpoint` or `endpoint_window`,
    /// which the job is built with).
    RerankOverlay over RerankConfig {
        window: usize,
        lane_heads: usize,
        fused: f32,
        lanes: f32,
        sentence_evidence: f32,
        term_recall: f32,
        sentence_recall: f32,
        weighted_sentence_recall: f32,
        phrase: f32,
        term_precision: f32,
        entity: f32,
        date: f32,
        distractor: f32,
    }
}

overlay! {
    /// A preset's `pack`: every packing key.
    PackOverlay over PackConfig {
        section_reunification: bool,
        expanded_tokens: usize,
        snippet_tokens: usize,
        sentence_tokens: usize,
        surrogate_tokens: usize,
        max_snippets: usize,
        max_surrogates: usize,
        expansion_max_bytes: usize,
        standing_decay: f32,
        position_decay: f32,
        redundancy_weight: f32,
        deferred_value: f32,
        separator: String,
        untrusted_delimiters: bool,
        evidence_ratio: f32,
        sentence_ratio: f32,
        header_format: String,
        include_metadata_in_context: bool,
    }
    tables {
        surrogates: SurrogateOverlay,
    }
}

overlay! {
    /// A preset's `pack.surrogates`.
    SurrogateOverlay over SurrogateConfig {
        policy: SurrogatePolicy,
        age_full_days: f64,
        age_gist_days: f64,
        importance_full: f32,
        importance_gist: f32,
        query_boost: bool,
        gist_tokens: usize,
        micro_phrases: usize,
        access_entries: usize,
    }
}

overlay! {
    /// A preset's `window`.
    WindowOverlay over WindowConfig {
        reserve_ratio: f32,
        min_reserve: usize,
        safety_margin: usize,
    }
}

overlay! {
    /// A preset's `hyde`: which intents, the weight, the strategy and the passages per query (not
    /// `enabled`, the endpoint or its cache, which the job is built with).
    HydeOverlay over HydeConfig {
        intents: Vec<Intent>,
        weight: f32,
        strategy: HydeStrategy,
        num_hypotheses: usize,
    }
}

/// The built-in overlay of `name`.
///
/// - `fast`: fewer candidates per lane (`min_pool` 10) and in the rerank window (20), no section
///   reunification (no neighbour fetch), no HyDE passage unless the query asks for one.
/// - `conservative`: fewer and surer items: a dense floor (`similarity_threshold` 0.2), an evidence
///   stop and band set higher (0.75, 0.85), near-duplicates removed from cosine 0.9.
pub fn built_in(name: &str) -> Option<PresetOverlay> {
    match name {
        "fast" => Some(PresetOverlay {
            min_pool: Some(10),
            rerank: Some(RerankOverlay {
                window: Some(20),
                ..RerankOverlay::default()
            }),
            pack: Some(PackOverlay {
                section_reunification: Some(false),
                ..PackOverlay::default()
            }),
            hyde: Some(HydeOverlay {
                strategy: Some(HydeStrategy::Skip),
                ..HydeOverlay::default()
            }),
            ..PresetOverlay::default()
        }),
        "conservative" => Some(PresetOverlay {
            similarity_threshold: Some(0.2),
            near_duplicate: Some(0.9),
            pack: Some(PackOverlay {
                evidence_ratio: Some(0.75),
                sentence_ratio: Some(0.85),
                ..PackOverlay::default()
            }),
            ..PresetOverlay::default()
        }),
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
        for overlay in [built_in(name).as_ref(), base.presets.get(name)]
            .into_iter()
            .flatten()
        {
            overlay.apply(&mut config);
        }
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
    use serde_json::{json, Map, Value};

    use super::*;

    /// A `[query]` section with `presets`, decoded and resolved as a loaded config is.
    fn with(presets: Value) -> Result<QueryConfig, String> {
        serde_json::from_value::<QueryConfig>(json!({ "presets": presets }))
            .map_err(|e| e.to_string())?
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
            "wide": {"min_pool": 40, "pack": {"max_snippets": 3, "surrogates": {"gist_tokens": 9}}},
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
        assert_eq!(wide.pack.surrogates.gist_tokens, 9, "tables within tables");
        assert_eq!(
            wide.pack.surrogates.micro_phrases,
            SurrogateConfig::default().micro_phrases
        );
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

    /// Every key of the section is either a preset's (a field of the overlay) or the job's (named
    /// here): a key added to a config type must be placed on one side or the other.
    #[test]
    fn every_key_of_the_section_is_a_presets_or_the_jobs() {
        const JOBS: [(&str, &[&str]); 3] = [
            (
                "",
                &[
                    "embedding_cache",
                    "cache_entries",
                    "cache_ttl_secs",
                    "consistency_timeout_ms",
                    "max_query_bytes",
                    "absent_acl",
                    "intents",
                    "code_search",
                    "invalidations",
                    "presets",
                ],
            ),
            ("rerank", &["kind", "endpoint_window", "endpoint"]),
            (
                "hyde",
                &[
                    "enabled",
                    "max_tokens",
                    "cache_entries",
                    "cache_ttl_secs",
                    "endpoint",
                ],
            ),
        ];
        // A section unlike the default in every per-query key, so each key's apply shows.
        let mut other = QueryConfig::default();
        other.min_pool += 1;
        other.rerank.window += 1;
        other.pack.surrogates.gist_tokens += 1;
        other.window.min_reserve += 1;
        other.hyde.num_hypotheses += 1;
        let mut section = serde_json::to_value(&other).expect("serialises");
        for (table, keys) in JOBS {
            let table = if table.is_empty() {
                &mut section
            } else {
                &mut section[table]
            };
            for key in keys {
                assert!(
                    table
                        .as_object_mut()
                        .expect("a table")
                        .remove(*key)
                        .is_some(),
                    "{key}"
                );
            }
        }
        let overlay: PresetOverlay = serde_json::from_value(section.clone())
            .unwrap_or_else(|e| panic!("a key is neither the preset's nor the job's: {e}"));
        assert_eq!(serde_json::to_value(&overlay).expect("serialises"), section);
        let mut config = QueryConfig::default();
        overlay.apply(&mut config);
        let mut expected = other;
        expected.presets.clear();
        assert_eq!(config, expected, "every key applies");
    }

    #[test]
    fn job_level_keys_unknown_keys_and_bad_names_are_refused() {
        for (presets, names) in [
            (json!({"x": {"cache_entries": 0}}), "cache_entries"),
            (json!({"x": {"absent_acl": "all"}}), "absent_acl"),
            (json!({"x": {"max_query_bytes": 1}}), "max_query_bytes"),
            (
                json!({"x": {"rerank": {"endpoint": {"url": "http://h"}}}}),
                "unknown field `endpoint`",
            ),
            (
                json!({"x": {"hyde": {"enabled": true}}}),
                "unknown field `enabled`",
            ),
            (json!({"x": {"rerank": {"windw": 3}}}), "windw"),
            (json!({"x": {"min_pool": "many"}}), "invalid type"),
            (json!({"default": {"min_pool": 3}}), "default"),
            (json!({"Fast!": {"min_pool": 3}}), "Fast!"),
            (json!({"x": 3}), "invalid type"),
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
