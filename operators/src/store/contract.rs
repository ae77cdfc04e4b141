//! The contract every [`VectorStore`] backend must pass (run against qdrant-edge always, and against a
//! Qdrant server when `QDRANT_URL` is set).

use super::*;
use crate::metadata::{parse_conditions, MetaIndex, Metadata};
use crate::model::DocKind;

pub use ragstream_core::testing::{sample_point, DIMENSION};

mod reads;

/// A unit vector along dimension `at`.
fn axis(at: usize) -> Vec<f32> {
    let mut vector = vec![0.0; DIMENSION];
    vector[at] = 1.0;
    vector
}

fn ids(hits: &[Hit]) -> Vec<String> {
    hits.iter()
        .map(|h| format!("{}/{}", h.stored.key.tenant, h.stored.key.doc_id))
        .collect()
}

/// The points the contract writes: three of tenant `a` (with metadata, ACL labels, a language and
/// evidence units), one of tenant `b`.
struct Points {
    a1: PointWrite,
    a2: PointWrite,
    a3: PointWrite,
    b1: PointWrite,
    /// The axis of a2's second evidence unit.
    second: usize,
}

/// Runs the whole contract. `open` must return a store over the same (initially empty) collection each call.
pub fn run(open: &dyn Fn() -> Box<dyn VectorStore>) {
    let store = open();
    let points = sample_points();
    let tenant_a = SearchFilter {
        tenant: Some("a".into()),
        ..SearchFilter::default()
    };
    check_writes(store.as_ref(), &points, &tenant_a);
    check_scroll(store.as_ref(), &points, &tenant_a);
    check_tenant_isolation(store.as_ref(), &points, &tenant_a);
    check_acl(store.as_ref(), &points);
    check_score_threshold(store.as_ref(), &points, &tenant_a);
    check_bm25(store.as_ref(), &tenant_a);
    check_doc_and_kind_filters(store.as_ref());
    check_lang_filter(store.as_ref(), &points);
    check_source_prefix(store.as_ref(), &points);
    check_metadata_filters(store.as_ref(), &points);
    check_metadata_refusals_and_searches(store.as_ref(), &points);
    check_get(store.as_ref(), &points);
    check_vectors(store.as_ref(), &points);
    reads::check_search_lanes(store.as_ref(), &points);
    reads::check_neighbours(store.as_ref());
    check_replace_current(store.as_ref(), &points);
    check_delete(store.as_ref(), &points, &tenant_a);
    check_embedder_guard(store.as_ref());

    // Durable across close and reopen.
    drop(store);
    check_reopen(open);
}

/// The contract's points.
fn sample_points() -> Points {
    let a1 = sample_point(
        "a",
        "one",
        1,
        "kafka offsets are committed after the index flush",
        &[],
    );
    let mut a2 = sample_point(
        "a",
        "two",
        1,
        "mmr diversifies the packed context",
        &["eng"],
    );
    // Two evidence units, each a vector of its own, on axes other than the chunk's.
    let own = (0..DIMENSION)
        .max_by(|&i, &j| a2.dense[i].total_cmp(&a2.dense[j]))
        .expect("dimensions");
    let (first, second) = ((own + 1) % DIMENSION, (own + 2) % DIMENSION);
    a2.evidence = vec![axis(first), axis(second)];
    let mut a3 = sample_point(
        "a",
        "three",
        1,
        "token budgets are counted with tiktoken",
        &["sales"],
    );
    a3.chunk.lang = "fra".into();
    let metadata = |value: serde_json::Value| Metadata::parse(&value).expect("valid metadata");
    let mut a1 = a1;
    a1.chunk.metadata = metadata(serde_json::json!({
        "team": "search", "year": 2021, "score": 0.5, "draft": false,
        "published": "2021-03-01T00:00:00Z", "tags": ["kafka", "index"]
    }));
    a2.chunk.metadata = metadata(serde_json::json!({
        "team": "infra", "year": 2023, "score": 2.5, "draft": true,
        "published": "2023-06-15T12:00:00Z", "tags": ["mmr"]
    }));
    a3.chunk.metadata = metadata(serde_json::json!({
        "team": "search", "year": 2024, "score": 9.5,
        "published": "2024-01-01T00:00:00Z"
    }));
    let b1 = sample_point(
        "b",
        "one",
        1,
        "kafka offsets are committed after the index flush",
        &[],
    );
    let mut b1 = b1;
    b1.chunk.metadata = metadata(serde_json::json!({ "team": "search", "year": 2024 }));
    Points {
        a1,
        a2,
        a3,
        b1,
        second,
    }
}

/// Declares metadata keys, upserts every point twice (idempotent) and counts them.
fn check_writes(store: &dyn VectorStore, points: &Points, tenant_a: &SearchFilter) {
    let Points { a1, a2, a3, b1, .. } = points;
    // Declared keys get payload indexes of their type; `tags` and `draft` stay undeclared (filtered
    // all the same).
    store
        .index_metadata(&[
            ("team".into(), MetaIndex::Keyword),
            ("year".into(), MetaIndex::Integer),
            ("score".into(), MetaIndex::Float),
            ("published".into(), MetaIndex::Datetime),
        ])
        .expect("metadata indexes");
    let all = [a1.clone(), a2.clone(), a3.clone(), b1.clone()];
    store.upsert(&all).expect("upsert");
    store.upsert(&all).expect("idempotent upsert");
    store.flush().expect("flush");
    assert_eq!(
        store.count(&SearchFilter::default()).expect("count"),
        4,
        "idempotent: same ids"
    );
    assert_eq!(store.count(tenant_a).expect("count a"), 3);
}

/// Scroll returns exactly what was written.
fn check_scroll(store: &dyn VectorStore, points: &Points, tenant_a: &SearchFilter) {
    let a2 = &points.a2;
    let mut scrolled = Vec::new();
    store
        .scroll(tenant_a, &mut |stored| scrolled.push(stored))
        .expect("scroll");
    assert_eq!(scrolled.len(), 3);
    let two = scrolled
        .iter()
        .find(|s| s.key.doc_id == "two")
        .expect("two");
    assert_eq!(two.chunk, a2.chunk);
    assert_eq!(two.id, a2.id);
    assert_eq!(two.embedder_version, "test-embedder");
}

/// Tenant isolation inside the search: b's identical vector never shows up for tenant a.
fn check_tenant_isolation(store: &dyn VectorStore, points: &Points, tenant_a: &SearchFilter) {
    let Points { a1, a2, .. } = points;
    let hits = store
        .search(&SearchVector::Dense(a1.dense.clone()), tenant_a, 10, None)
        .expect("dense");
    assert_eq!(ids(&hits)[0], "a/one");
    assert!(
        ids(&hits).iter().all(|id| id.starts_with("a/")),
        "{:?}",
        ids(&hits)
    );
    let tenant_b = SearchFilter {
        tenant: Some("b".into()),
        ..SearchFilter::default()
    };
    let hits = store
        .search(&SearchVector::Dense(a2.dense.clone()), &tenant_b, 10, None)
        .expect("dense b");
    assert_eq!(ids(&hits), vec!["b/one"]);
}

/// ACL: public points plus those sharing a label.
fn check_acl(store: &dyn VectorStore, points: &Points) {
    let a3 = &points.a3;
    let eng = SearchFilter {
        tenant: Some("a".into()),
        acl: Some(vec!["eng".into()]),
        ..SearchFilter::default()
    };
    let mut seen = ids(&store
        .search(&SearchVector::Dense(a3.dense.clone()), &eng, 10, None)
        .expect("acl"));
    seen.sort();
    assert_eq!(seen, vec!["a/one", "a/two"]);
    let nobody = SearchFilter {
        tenant: Some("a".into()),
        acl: Some(vec![]),
        ..SearchFilter::default()
    };
    assert_eq!(store.count(&nobody).expect("count public"), 1);
}

/// Score threshold.
fn check_score_threshold(store: &dyn VectorStore, points: &Points, tenant_a: &SearchFilter) {
    let a1 = &points.a1;
    let strict = store
        .search(
            &SearchVector::Dense(a1.dense.clone()),
            tenant_a,
            10,
            Some(0.99),
        )
        .expect("threshold");
    assert_eq!(ids(&strict), vec!["a/one"]);
}

/// BM25 lane (IDF by the engine): the only chunk with "tiktoken".
fn check_bm25(store: &dyn VectorStore, tenant_a: &SearchFilter) {
    let query = Bm25Encoder::default().encode_query("tiktoken budget");
    let hits = store
        .search(&SearchVector::Sparse(query), tenant_a, 10, None)
        .expect("sparse");
    assert_eq!(ids(&hits).first().map(String::as_str), Some("a/three"));
}

/// Doc-id and kind filters.
fn check_doc_and_kind_filters(store: &dyn VectorStore) {
    let only_two = SearchFilter {
        tenant: Some("a".into()),
        doc_ids: vec!["two".into()],
        ..SearchFilter::default()
    };
    assert_eq!(store.count(&only_two).expect("doc filter"), 1);
    let code = SearchFilter {
        tenant: Some("a".into()),
        kinds: vec![DocKind::Code],
        ..SearchFilter::default()
    };
    assert_eq!(store.count(&code).expect("kind filter"), 0);
}

/// Language filter (the `lang` payload field).
fn check_lang_filter(store: &dyn VectorStore, points: &Points) {
    let Points { a1, a3, .. } = points;
    let langs = |langs: &[&str]| SearchFilter {
        tenant: Some("a".into()),
        langs: langs.iter().map(|l| l.to_string()).collect(),
        ..SearchFilter::default()
    };
    assert_eq!(store.count(&langs(&["fra"])).expect("lang filter"), 1);
    assert_eq!(store.count(&langs(&["eng"])).expect("lang filter"), 2);
    assert_eq!(
        store.count(&langs(&["eng", "fra"])).expect("lang filter"),
        3
    );
    assert_eq!(store.count(&langs(&["deu"])).expect("lang filter"), 0);
    let hits = store
        .search(
            &SearchVector::Dense(a1.dense.clone()),
            &langs(&["fra"]),
            10,
            None,
        )
        .expect("lang search");
    assert_eq!(ids(&hits), vec!["a/three"]);
    assert_eq!(store.get(&[a3.id]).expect("get")[0].chunk.lang, "fra");
}

/// Source-prefix filter, by whole path components, inside the search.
fn check_source_prefix(store: &dyn VectorStore, points: &Points) {
    let a1 = &points.a1;
    let under = |prefix: &str| SearchFilter {
        tenant: Some("a".into()),
        source_prefix: Some(prefix.into()),
        ..SearchFilter::default()
    };
    assert_eq!(store.count(&under("docs/")).expect("prefix"), 3);
    assert_eq!(store.count(&under("docs/two")).expect("prefix"), 1);
    assert_eq!(store.count(&under("doc")).expect("partial component"), 0);
    let hits = store
        .search(
            &SearchVector::Dense(a1.dense.clone()),
            &under("docs/three"),
            10,
            None,
        )
        .expect("prefix search");
    assert_eq!(ids(&hits), vec!["a/three"]);
}

/// A filter of tenant `a` with metadata `conditions`.
fn meta(conditions: serde_json::Value) -> SearchFilter {
    SearchFilter {
        tenant: Some("a".into()),
        metadata: parse_conditions(&conditions).expect("valid conditions"),
        ..SearchFilter::default()
    }
}

/// Metadata: stored with each chunk, read back as written, filtered inside the engine.
fn check_metadata_filters(store: &dyn VectorStore, points: &Points) {
    let a1 = &points.a1;
    assert_eq!(
        store.get(&[a1.id]).expect("get")[0].chunk.metadata,
        a1.chunk.metadata
    );
    let count = |conditions: serde_json::Value| {
        let filter = meta(conditions.clone());
        let mut found = Vec::new();
        store
            .scroll(&filter, &mut |s| found.push(s.key.doc_id.clone()))
            .expect("metadata scroll");
        found.sort();
        assert_eq!(
            store.count(&filter).expect("metadata count"),
            found.len(),
            "{conditions}"
        );
        found
    };
    use serde_json::json;
    for (conditions, expected) in [
        (json!({"team": "search"}), vec!["one", "three"]),
        (json!({"team": {"any": ["infra", "sales"]}}), vec!["two"]),
        (json!({"year": {"any": [2021, 2024]}}), vec!["one", "three"]),
        (json!({"year": 2023}), vec!["two"]),
        (json!({"year": {"gte": 2022}}), vec!["three", "two"]),
        (json!({"year": {"gte": 2022, "lte": 2023}}), vec!["two"]),
        (json!({"score": {"gte": 1.0, "lte": 3.0}}), vec!["two"]),
        (json!({"score": {"lte": 0.5}}), vec!["one"]),
        (
            json!({"published": {"gte": "2023-01-01"}}),
            vec!["three", "two"],
        ),
        (
            json!({"published": {"lte": "2022-12-31T23:59:59Z"}}),
            vec!["one"],
        ),
        (
            json!({"published": {"gte": "2023-06-15t00:00:00"}}),
            vec!["three", "two"],
        ),
        (
            json!({"published": {"gte": "2023-06-15T13:00:00+02:00", "lte": "2023-06-15T14:00:00+02:00"}}),
            vec!["two"],
        ),
        (json!({"tags": "kafka"}), vec!["one"]),
        (json!({"tags": {"any": ["mmr", "none"]}}), vec!["two"]),
        (json!({"draft": true}), vec!["two"]),
        (
            json!({"team": "search", "year": {"gte": 2022}}),
            vec!["three"],
        ),
        (json!({"team": "nobody"}), vec![]),
        (json!({"missing": 1}), vec![]),
    ] {
        assert_eq!(count(conditions.clone()), expected, "{conditions}");
    }
}

/// A condition that does not fit a declared key's type is refused, not compared; metadata filters
/// inside the dense and the BM25 search.
fn check_metadata_refusals_and_searches(store: &dyn VectorStore, points: &Points) {
    use serde_json::json;
    let a1 = &points.a1;
    for unfit in [
        json!({"published": {"gte": 2023}}),
        json!({"year": {"gte": "2024-01-01"}}),
        json!({"team": 1}),
    ] {
        assert!(
            matches!(
                store.count(&meta(unfit.clone())),
                Err(StoreError::Invalid(_))
            ),
            "{unfit}"
        );
    }
    let hits = store
        .search(
            &SearchVector::Dense(a1.dense.clone()),
            &meta(json!({"team": "infra"})),
            10,
            None,
        )
        .expect("metadata search");
    assert_eq!(ids(&hits), vec!["a/two"]);
    let query = Bm25Encoder::default().encode_query("tiktoken kafka mmr");
    let hits = store
        .search(
            &SearchVector::Sparse(query),
            &meta(json!({"year": {"lte": 2021}})),
            10,
            None,
        )
        .expect("metadata sparse search");
    assert_eq!(ids(&hits), vec!["a/one"]);
}

/// Chunks by id (read_chunk).
fn check_get(store: &dyn VectorStore, points: &Points) {
    let a2 = &points.a2;
    let got = store.get(&[a2.id, uuid::Uuid::nil()]).expect("get");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].chunk, a2.chunk);
}

/// Stored vectors come back for MMR, with the evidence units' vectors in their order; a point
/// written without any has none.
fn check_vectors(store: &dyn VectorStore, points: &Points) {
    let Points { a2, a3, second, .. } = points;
    let second = *second;
    let vectors = store
        .vectors(&[a2.id, a3.id, uuid::Uuid::nil()])
        .expect("vectors");
    assert_eq!(vectors.len(), 2);
    let of = |id| &vectors.iter().find(|(v, _)| *v == id).expect("returned").1;
    let cosine = crate::embed::cosine(&of(a2.id).dense, &a2.dense);
    assert!(cosine > 0.999, "stored vector cosine {cosine}");
    assert_eq!(of(a2.id).evidence.len(), 2);
    for (stored, written) in of(a2.id).evidence.iter().zip(&a2.evidence) {
        let cosine = crate::embed::cosine(stored, written);
        assert!(cosine > 0.999, "stored evidence cosine {cosine}");
    }
    assert!(of(a3.id).evidence.is_empty());
    // The sentence evidence of a2 is its closest unit's, not its own vector's; a3 has no units and
    // counts its own.
    let score = of(a2.id).evidence_score(&axis(second));
    assert!(score > 0.999, "evidence score {score}");
    let score = of(a2.id).evidence_score(&a2.dense);
    assert!(
        score < 0.5,
        "evidence score {score}: the chunk's own vector is not a unit"
    );
    let score = of(a3.id).evidence_score(&a3.dense);
    assert!(score > 0.999, "evidence score {score}");
}

/// `replace_current` rewrites a point only while the index holds it at the same version and
/// content: never a newer one, never one deleted.
fn check_replace_current(store: &dyn VectorStore, points: &Points) {
    let a3 = &points.a3;
    let dense_of = |id| {
        store
            .vectors(&[id])
            .expect("vectors")
            .pop()
            .expect("held")
            .1
            .dense
    };
    let mut renewed = a3.clone();
    renewed.dense = axis(DIMENSION - 1);
    assert_eq!(
        store.replace_current(&[renewed.clone()]).expect("replace"),
        1
    );
    assert!(crate::embed::cosine(&dense_of(a3.id), &axis(DIMENSION - 1)) > 0.999);
    // Another version, other content, a point the index does not hold: nothing written.
    let mut newer = renewed.clone();
    newer.version += 1;
    newer.dense = axis(1);
    let mut edited = renewed.clone();
    edited.chunk.content_hash = "another".into();
    edited.dense = axis(1);
    let mut absent = renewed.clone();
    absent.id = uuid::Uuid::new_v4();
    assert_eq!(
        store
            .replace_current(&[newer, edited, absent.clone()])
            .expect("replace"),
        0
    );
    assert!(crate::embed::cosine(&dense_of(a3.id), &axis(DIMENSION - 1)) > 0.999);
    assert!(
        store.get(&[absent.id]).expect("get").is_empty(),
        "not resurrected"
    );
    assert_eq!(store.replace_current(&[]).expect("nothing"), 0);
    // Back as it was for the checks that follow.
    assert_eq!(
        store
            .replace_current(std::slice::from_ref(a3))
            .expect("restore"),
        1
    );
}

/// Deletes; absent ids are fine.
fn check_delete(store: &dyn VectorStore, points: &Points, tenant_a: &SearchFilter) {
    let a1 = &points.a1;
    store.delete(&[a1.id, uuid::Uuid::nil()]).expect("delete");
    store.flush().expect("flush");
    assert_eq!(store.count(tenant_a).expect("count after delete"), 2);
}

/// Embedder guard.
fn check_embedder_guard(store: &dyn VectorStore) {
    assert!(store.check_embedder("test-embedder", DIMENSION).is_ok());
    assert!(matches!(
        store.check_embedder("other-model", DIMENSION),
        Err(StoreError::EmbedderMismatch { .. })
    ));
    assert!(matches!(
        store.check_embedder("test-embedder", DIMENSION + 1),
        Err(StoreError::EmbedderMismatch { .. })
    ));
}

/// Durable across close and reopen: the store `open` returns again holds what is left.
fn check_reopen(open: &dyn Fn() -> Box<dyn VectorStore>) {
    let store = open();
    assert_eq!(
        store
            .count(&SearchFilter::default())
            .expect("count after reopen"),
        3
    );
    let mut after = Vec::new();
    store
        .scroll(&SearchFilter::default(), &mut |s| {
            after.push(s.key.to_string())
        })
        .expect("scroll after reopen");
    after.sort();
    assert_eq!(after, vec!["a/three", "a/two", "b/one"]);
}
