//! Tests of document metadata, conditions, date-times and declared keys.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::*;

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
