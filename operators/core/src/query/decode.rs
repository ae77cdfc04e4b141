//! Decode: query bytes → a validated [`Query`], or a clear error for the DLQ (and an error context for
//! the caller when the query id could be read).

use super::{Mode, Query, LIST_MAX_PAGE};
use crate::tokens::Encoding;

pub use crate::ingest::dlq::DlqReason;

/// Why a query was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct QueryError {
    /// Why, bounded.
    pub reason: DlqReason,
    /// What is wrong.
    pub message: String,
    /// The query id, if it could be read: the caller gets an error context under it.
    pub query_id: Option<String>,
    /// The tenant, if it could be read.
    pub tenant: Option<String>,
}

/// Largest accepted `token_budget` or `context_window`.
pub const MAX_BUDGET: usize = 1_000_000;
/// Longest `cursor`: a document id ([`crate::ingest::decode::MAX_DOC_ID_BYTES`]).
pub const MAX_CURSOR_BYTES: usize = crate::ingest::decode::MAX_DOC_ID_BYTES;
/// Longest `query_id`, in bytes (it keys the context, the invalidations and the caches).
pub const MAX_QUERY_ID_BYTES: usize = 1024;
/// Longest `tenant`, in bytes: a document's ([`crate::ingest::decode::MAX_TENANT_BYTES`]).
pub const MAX_QUERY_TENANT_BYTES: usize = crate::ingest::decode::MAX_TENANT_BYTES;

/// At most the first `limit` bytes of `text`, cut at a character boundary.
fn cut(text: &str, limit: usize) -> &str {
    let end = text.floor_char_boundary(limit);
    &text[..end]
}

/// Decodes and validates a query; `max_bytes` bounds the whole event.
pub fn decode_query(bytes: &[u8], max_bytes: usize) -> Result<Query, QueryError> {
    let refuse = |reason, message: String, value: Option<&serde_json::Value>| {
        // A refused query's id and tenant are unchecked: cut to their limits.
        let field = |name: &str, limit: usize| {
            value
                .and_then(|v| v.get(name))
                .and_then(serde_json::Value::as_str)
                .map(|text| cut(text, limit).to_string())
        };
        QueryError {
            reason,
            message,
            query_id: field("query_id", MAX_QUERY_ID_BYTES),
            tenant: field("tenant", MAX_QUERY_TENANT_BYTES),
        }
    };
    if bytes.len() > max_bytes {
        return Err(refuse(
            DlqReason::Oversize,
            format!("query of {} bytes exceeds {max_bytes}", bytes.len()),
            None,
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        refuse(
            DlqReason::InvalidUtf8,
            format!("query is not UTF-8: {e}"),
            None,
        )
    })?;
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        refuse(
            DlqReason::MalformedJson,
            format!("query is not JSON: {e}"),
            None,
        )
    })?;
    // Counts first, so a negative or fractional one is named in the error (serde's message is not).
    for field in [
        "k",
        "token_budget",
        "context_window",
        "reserve_output",
        "num_hypotheses",
    ] {
        if let Some(given) = value.get(field).filter(|v| !v.is_null()) {
            if given.as_u64().is_none() {
                return Err(refuse(
                    DlqReason::InvalidQuery,
                    format!("{field} must be a positive integer, got {given}"),
                    Some(&value),
                ));
            }
        }
    }
    let query: Query = serde_json::from_value(value.clone())
        .map_err(|e| refuse(DlqReason::InvalidQuery, e.to_string(), Some(&value)))?;
    validate(&query).map_err(|message| refuse(DlqReason::InvalidQuery, message, Some(&value)))?;
    Ok(query)
}

/// Refuses a query whose `preset` is not one of `names` (the job's: `default` and its resolved
/// presets, [`super::QueryConfig::preset_names`]).
pub fn check_preset(query: &Query, names: &[String]) -> Result<(), QueryError> {
    match &query.preset {
        Some(name) if !names.iter().any(|known| known == name) => Err(QueryError {
            reason: DlqReason::InvalidQuery,
            message: format!(
                "unknown preset {name:?} (this job has {})",
                names.join(", ")
            ),
            query_id: Some(query.query_id.clone()),
            tenant: Some(query.tenant.clone()),
        }),
        _ => Ok(()),
    }
}

/// Checks the fields serde cannot.
pub fn validate(query: &Query) -> Result<(), String> {
    if query.query_id.trim().is_empty() {
        return Err("query_id is empty".into());
    }
    if query.query_id.len() > MAX_QUERY_ID_BYTES {
        return Err(format!(
            "query_id of {} bytes exceeds the limit of {MAX_QUERY_ID_BYTES} bytes",
            query.query_id.len()
        ));
    }
    if query.tenant.is_empty() || query.tenant.contains('/') {
        return Err("tenant must be non-empty and contain no '/'".into());
    }
    if query.tenant.len() > MAX_QUERY_TENANT_BYTES {
        return Err(format!(
            "tenant of {} bytes exceeds the limit of {MAX_QUERY_TENANT_BYTES} bytes",
            query.tenant.len()
        ));
    }
    if query.text.trim().is_empty() && !query.mode.textless() {
        return Err(format!("text is empty (mode {})", query.mode.as_str()));
    }
    if let Some(k) = query.k {
        // A bounded query's limit follows the budget it gives (50 without one).
        let most = if query.mode == Mode::ListSources {
            LIST_MAX_PAGE
        } else {
            super::depth::k_limit(query, 0)
        };
        if k == 0 || k > most {
            return Err(format!("k must be in 1..={most}, got {k}"));
        }
    }
    if let Some(pattern) = &query.filters.source_pattern {
        super::pattern::SourcePattern::parse(pattern)?;
        if query.mode == Mode::IndexStats {
            return Err(
                "index_stats counts with the index's own filters: use filters.source_prefix, not source_pattern"
                    .into(),
            );
        }
    }
    if let Some(name) = &query.preset {
        if !super::presets::valid_name(name) {
            return Err(format!(
                "preset must be 1 to {} bytes of a-z, 0-9, _ and -",
                super::presets::MAX_NAME_BYTES
            ));
        }
    }
    if query.mode != Mode::Files && (query.pool.is_some() || query.file_key.is_some()) {
        return Err("pool and file_key apply to mode files".into());
    }
    if let Some(pool) = query.pool {
        let most = super::modes::MAX_FILES_POOL;
        if pool == 0 || pool > most {
            return Err(format!("pool must be in 1..={most}, got {pool}"));
        }
    }
    if let Some(key) = &query.file_key {
        super::modes::FileKey::parse(key)?;
    }
    if let Some(n) = query.num_hypotheses {
        let most = super::endpoints::MAX_HYPOTHESES;
        if n == 0 || n > most {
            return Err(format!("num_hypotheses must be in 1..={most}, got {n}"));
        }
    }
    if query
        .cursor
        .as_ref()
        .is_some_and(|cursor| cursor.len() > MAX_CURSOR_BYTES)
    {
        return Err(format!("cursor exceeds {MAX_CURSOR_BYTES} bytes"));
    }
    for (name, value) in [
        ("token_budget", query.token_budget),
        ("context_window", query.context_window),
    ] {
        if let Some(value) = value {
            if value == 0 || value > MAX_BUDGET {
                return Err(format!("{name} must be in 1..={MAX_BUDGET}, got {value}"));
            }
        }
    }
    if let Some(reserve) = query.reserve_output {
        if reserve > MAX_BUDGET {
            return Err(format!(
                "reserve_output must be in 0..={MAX_BUDGET}, got {reserve}"
            ));
        }
    }
    if let Some(name) = &query.tokenizer {
        if Encoding::parse(name).is_none() {
            return Err(format!(
                "tokenizer {name:?} is unknown (o200k_base or cl100k_base)"
            ));
        }
    }
    if query.prompt.is_some() && query.context_window.is_none() {
        return Err("prompt needs context_window".into());
    }
    for (name, threshold) in [
        ("score_threshold", query.score_threshold),
        ("bm25_score_threshold", query.bm25_score_threshold),
    ] {
        if threshold.is_some_and(|t| !t.is_finite()) {
            return Err(format!("{name} must be a finite number"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn index_stats_needs_no_text_and_refuses_a_source_pattern() {
        let stats = decode_query(
            br#"{"query_id":"q","tenant":"t","mode":"index_stats","filters":{"source_prefix":"docs"}}"#,
            8192,
        )
        .expect("no text needed");
        assert_eq!(stats.mode, Mode::IndexStats);
        let error = decode_query(
            br#"{"query_id":"q","tenant":"t","mode":"index_stats","filters":{"source_pattern":"docs/*.md"}}"#,
            8192,
        )
        .expect_err("a pattern cannot be counted inside the index");
        assert_eq!(error.reason, DlqReason::InvalidQuery);
        assert!(error.message.contains("source_prefix"), "{}", error.message);
        // A bounded mode still needs its text.
        assert!(decode_query(br#"{"query_id":"q","tenant":"t"}"#, 8192).is_err());
    }

    #[test]
    fn pool_and_file_key_are_bounded_and_only_for_files() {
        let decode = |extra: &str| {
            decode_query(
                format!(r#"{{"query_id":"q","tenant":"t","text":"x"{extra}}}"#).as_bytes(),
                8192,
            )
        };
        let files = decode(r#","mode":"files","pool":500,"file_key":"metadata.repo""#)
            .expect("the largest pool, a metadata key");
        assert_eq!(
            (files.pool, files.file_key.as_deref()),
            (Some(500), Some("metadata.repo"))
        );
        for (extra, says) in [
            (r#","mode":"files","pool":0"#, "pool must be in 1..=500"),
            (r#","mode":"files","pool":501"#, "pool must be in 1..=500"),
            (
                r#","mode":"files","pool":18446744073709551615"#,
                "pool must be in 1..=500",
            ),
            (r#","mode":"files","pool":-1"#, "expected usize"),
            (r#","pool":10"#, "apply to mode files"),
            (
                r#","mode":"deep","file_key":"source""#,
                "apply to mode files",
            ),
            (r#","mode":"files","file_key":"path""#, "file_key must be"),
            (
                r#","mode":"files","file_key":"metadata.a b""#,
                "metadata key",
            ),
        ] {
            let error = decode(extra).expect_err(extra);
            assert_eq!(error.reason, DlqReason::InvalidQuery, "{extra}");
            assert!(error.message.contains(says), "{extra}: {}", error.message);
        }
        let long = format!(
            r#","mode":"files","file_key":"metadata.{}""#,
            "k".repeat(10_000)
        );
        assert!(decode(&long).is_err());
    }

    #[test]
    fn a_preset_must_be_well_formed_and_one_the_job_has() {
        let decode = |preset: &str| {
            decode_query(
                format!(r#"{{"query_id":"q","tenant":"t","text":"x","preset":{preset}}}"#)
                    .as_bytes(),
                8192,
            )
        };
        let names = crate::query::QueryConfig::default()
            .with_presets()
            .expect("built-ins")
            .preset_names();
        for good in ["\"fast\"", "\"default\"", "\"conservative\"", "null"] {
            let query = decode(good).expect(good);
            check_preset(&query, &names).expect(good);
        }
        let unknown = decode("\"fastest\"").expect("well formed");
        let error = check_preset(&unknown, &names).expect_err("unknown");
        assert_eq!(error.reason, DlqReason::InvalidQuery);
        assert!(
            error.message.contains("fastest") && error.message.contains("conservative"),
            "{}",
            error.message
        );
        assert_eq!(error.query_id.as_deref(), Some("q"));
        for bad in [
            "\"\"",
            "\"Fast\"",
            "\"a b\"",
            &format!("\"{}\"", "p".repeat(65)),
            "3",
        ] {
            let error = decode(bad).expect_err(bad);
            assert_eq!(error.reason, DlqReason::InvalidQuery, "{bad}");
        }
    }

    #[test]
    fn list_sources_pages_have_their_own_bounds_and_the_cursor_is_bounded() {
        let decode = |extra: &str| {
            decode_query(
                format!(r#"{{"query_id":"q","tenant":"t","mode":"list_sources"{extra}}}"#)
                    .as_bytes(),
                1 << 20,
            )
        };
        assert_eq!(
            decode(r#","k":1000"#).expect("a page of 1000").k,
            Some(1000)
        );
        assert!(decode(r#","k":1001"#).is_err());
        let cursor = "d".repeat(MAX_CURSOR_BYTES);
        assert_eq!(
            decode(&format!(r#","cursor":"{cursor}""#))
                .expect("a cursor of a longest doc id")
                .cursor
                .map(|c| c.len()),
            Some(MAX_CURSOR_BYTES)
        );
        let error = decode(&format!(r#","cursor":"{cursor}d""#)).unwrap_err();
        assert!(
            error.message.contains("cursor exceeds"),
            "{}",
            error.message
        );
        // Other modes keep the deep mode's bound; a bounded query without a budget too.
        assert!(decode_query(br#"{"query_id":"q","tenant":"t","text":"x","k":51}"#, 8192).is_err());
        let deep =
            br#"{"query_id":"q","tenant":"t","text":"x","mode":"deep","k":51,"token_budget":8000}"#;
        assert!(decode_query(deep, 8192).is_err());
    }

    #[test]
    fn a_bounded_querys_k_limit_follows_its_budget() {
        let with = |k: usize, budget: usize| {
            decode_query(
                format!(
                    r#"{{"query_id":"q","tenant":"t","text":"x","k":{k},"token_budget":{budget}}}"#
                )
                .as_bytes(),
                8192,
            )
        };
        // One result per 32 tokens of the budget: 250 at 8 000, 50 below 1 600.
        assert_eq!(with(250, 8000).expect("250 at 8000").k, Some(250));
        let error = with(251, 8000).unwrap_err();
        assert!(error.message.contains("1..=250"), "{}", error.message);
        assert!(with(51, 1000).is_err());
        // The budget's ceiling does not lift the limit past 400.
        assert!(with(400, MAX_BUDGET).is_ok());
        assert!(with(401, MAX_BUDGET).is_err());
    }

    #[test]
    fn defaults_and_errors() {
        let query = decode_query(
            br#"{"query_id":"q1","tenant":"t","text":"what is x"}"#,
            8192,
        )
        .expect("valid");
        assert_eq!(query.mode, Mode::Bounded);
        assert_eq!(query.token_budget, None);
        assert!(!query.fill, "the evidence stop is on unless asked");
        let filled = decode_query(
            br#"{"query_id":"q1","tenant":"t","text":"what is x","fill":true}"#,
            8192,
        )
        .expect("valid");
        assert!(filled.fill);
        let cases: [(&[u8], DlqReason); 7] = [
            (b"{not json", DlqReason::MalformedJson),
            (b"\xff\xfe", DlqReason::InvalidUtf8),
            (br#"{"query_id":"q","text":"x"}"#, DlqReason::InvalidQuery),
            (
                br#"{"query_id":"q","tenant":"t","text":"x","mode":"psychic"}"#,
                DlqReason::InvalidQuery,
            ),
            (
                br#"{"query_id":"q","tenant":"t","text":"x","k":0}"#,
                DlqReason::InvalidQuery,
            ),
            (
                br#"{"query_id":"q","tenant":"t","text":"x","surprise":1}"#,
                DlqReason::InvalidQuery,
            ),
            (
                br#"{"query_id":"q","tenant":"t","text":"x","tokenizer":"gpt2"}"#,
                DlqReason::InvalidQuery,
            ),
        ];
        for (bytes, reason) in cases {
            let error = decode_query(bytes, 8192).expect_err("refused");
            assert_eq!(error.reason, reason, "{}", String::from_utf8_lossy(bytes));
        }
        // An id or tenant over its limit is refused, and the refusal carries them cut (they key
        // the error context and the DLQ record's headers).
        let long_id = "é".repeat(MAX_QUERY_ID_BYTES);
        let long_tenant = "t".repeat(MAX_QUERY_TENANT_BYTES + 1);
        for (id, tenant, field) in [
            (long_id.as_str(), "t", "query_id"),
            ("q", long_tenant.as_str(), "tenant"),
        ] {
            let body = serde_json::json!({"query_id": id, "tenant": tenant, "text": "x"});
            let error = decode_query(body.to_string().as_bytes(), 1 << 20).expect_err("refused");
            assert_eq!(error.reason, DlqReason::InvalidQuery);
            assert!(error.message.starts_with(field), "{}", error.message);
            let (kept_id, kept_tenant) = (error.query_id.unwrap(), error.tenant.unwrap());
            assert!(kept_id.len() <= MAX_QUERY_ID_BYTES && id.starts_with(&kept_id));
            assert!(
                kept_tenant.len() <= MAX_QUERY_TENANT_BYTES && tenant.starts_with(&kept_tenant)
            );
        }
        let at_limit = serde_json::json!({"query_id": "q".repeat(MAX_QUERY_ID_BYTES),
            "tenant": "t".repeat(MAX_QUERY_TENANT_BYTES), "text": "x"});
        assert!(decode_query(at_limit.to_string().as_bytes(), 1 << 20).is_ok());
        // A negative or fractional count names its field.
        for (bytes, field) in [
            (
                &br#"{"query_id":"q","tenant":"t","text":"x","k":-1}"#[..],
                "k",
            ),
            (
                br#"{"query_id":"q","tenant":"t","text":"x","token_budget":1.5}"#,
                "token_budget",
            ),
        ] {
            let error = decode_query(bytes, 8192).expect_err("refused");
            assert!(error.message.starts_with(field), "{}", error.message);
            assert_eq!(error.query_id.as_deref(), Some("q"));
        }
        let error = decode_query(br#"{"query_id":"q9","tenant":"t","text":""}"#, 8192)
            .expect_err("empty text");
        assert_eq!(error.query_id.as_deref(), Some("q9"));
        let big = format!(
            r#"{{"query_id":"q","tenant":"t","text":"{}"}}"#,
            "x".repeat(100)
        );
        assert_eq!(
            decode_query(big.as_bytes(), 50).unwrap_err().reason,
            DlqReason::Oversize
        );
        // list_sources needs no text.
        decode_query(
            br#"{"query_id":"q","tenant":"t","mode":"list_sources"}"#,
            8192,
        )
        .expect("list_sources without text");
    }

    /// Numbers at and beyond every bound a numeric field has (as JSON text).
    const EXTREMES: [&str; 10] = [
        "0",
        "1",
        "-1",
        "50",
        "1000000",
        "1000001",
        "4294967296",
        "9223372036854775807",
        "18446744073709551615",
        "18446744073709551616",
    ];

    #[test]
    fn an_overflowing_reserve_is_refused() {
        let error = decode_query(
            br#"{"query_id":"r","tenant":"local","text":"x","context_window":1000,"reserve_output":18446744073709551615}"#,
            8192,
        )
        .unwrap_err();
        assert_eq!(error.reason, DlqReason::InvalidQuery);
        assert!(
            error.message.contains("reserve_output"),
            "{}",
            error.message
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]

        /// Fuzz: arbitrary bytes decode or refuse with a reason; never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)) {
            if let Err(error) = decode_query(&bytes, 8192) {
                proptest::prop_assert!(!error.reason.as_str().is_empty());
            }
        }

        /// Fuzz: queries with random field values (numbers of every sign and size, strings, arrays).
        #[test]
        fn hostile_fields_never_panic(
            fields in proptest::collection::vec((
                proptest::sample::select(vec!["query_id", "tenant", "text", "mode", "k", "token_budget",
                    "context_window", "reserve_output", "acl", "score_threshold", "bm25_score_threshold", "consistency",
                    "tokenizer", "trace", "filters"]),
                proptest::prop_oneof![
                    proptest::prelude::any::<i64>().prop_map(|n| n.to_string()),
                    proptest::prelude::any::<f64>().prop_map(|f| format!("{f:?}")),
                    "\\PC{0,30}".prop_map(|s| serde_json::to_string(&s).unwrap()),
                    proptest::strategy::Just("[\"a\"]".to_string()),
                    proptest::strategy::Just("true".to_string()),
                    proptest::strategy::Just("null".to_string()),
                ],
            ), 0..8),
        ) {
            let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            let _ = decode_query(format!("{{{}}}", body.join(",")).as_bytes(), 8192);
        }

        /// Fuzz: every accepted combination of the numeric fields, at 0, 1, the limits and beyond,
        /// decodes or refuses, and an accepted one computes its budget without overflow.
        #[test]
        fn numeric_extremes_never_overflow(
            k in proptest::sample::select(EXTREMES.to_vec()),
            budget in proptest::sample::select(EXTREMES.to_vec()),
            window in proptest::sample::select(EXTREMES.to_vec()),
            reserve in proptest::sample::select(EXTREMES.to_vec()),
            prompt in proptest::prelude::any::<bool>(),
        ) {
            let prompt = if prompt { r#","prompt":{"system":"be brief","history":["a","b"]}"# } else { "" };
            let body = format!(
                r#"{{"query_id":"q","tenant":"t","text":"x","k":{k},"token_budget":{budget},"context_window":{window},"reserve_output":{reserve}{prompt}}}"#
            );
            if let Ok(query) = decode_query(body.as_bytes(), 8192) {
                let counter = crate::tokens::TokenCounter::new(Encoding::O200kBase);
                let (budget, window) = crate::query::modes::budget_for(&query, counter, (&Default::default(), crate::query::DEFAULT_BUDGET));
                proptest::prop_assert!(budget <= MAX_BUDGET);
                if let Some(derived) = window {
                    let _ = crate::query::modes::max_new_tokens(derived.window, derived.prompt, budget, &Default::default());
                }
            }
        }
    }
}
