//! The contract's checks of a query's reads: both lanes with their vectors in one call, and a
//! document's neighbours.

use super::{axis, ids, sample_point, Points};
use crate::store::{
    lanes, Bm25Encoder, Lane, LaneHits, LaneQuery, Pool, SearchFilter, VectorStore,
};

/// Hit ids and scores of a lane, for comparison.
fn scored(hits: &[crate::store::Hit]) -> Vec<(uuid::Uuid, f32)> {
    hits.iter().map(|hit| (hit.stored.id, hit.score)).collect()
}

fn assert_same(got: &LaneHits, expected: &LaneHits, dense_query: Option<&[f32]>, what: &str) {
    for (lane, got, expected) in [
        ("dense", &got.dense, &expected.dense),
        ("bm25", &got.bm25, &expected.bm25),
    ] {
        let (got, expected) = (scored(got), scored(expected));
        assert_eq!(got.len(), expected.len(), "{what}: {lane} lane {got:?}");
        for ((id, score), (expected_id, expected_score)) in got.iter().zip(&expected) {
            assert_eq!(id, expected_id, "{what}: {lane} lane order");
            assert!(
                (score - expected_score).abs() < 1e-5,
                "{what}: {lane} score {score} against {expected_score}"
            );
        }
    }
    // The dense vectors as stored; each hit's sentence evidence for the dense query, from the units
    // or as the engine scored them, within the engine's half-precision rounding.
    let evidence = |hits: &LaneHits, query: &[f32]| {
        let scored: std::collections::HashMap<uuid::Uuid, f32> = hits
            .evidence
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        let mut out: Vec<(uuid::Uuid, Vec<f32>, f32)> = hits
            .vectors
            .iter()
            .map(|(id, stored)| {
                let score = scored
                    .get(id)
                    .copied()
                    .unwrap_or_else(|| stored.evidence_score(query));
                (*id, stored.dense.clone(), score)
            })
            .collect();
        out.sort_by_key(|(id, _, _)| *id);
        out
    };
    if let Some(query) = dense_query {
        let (got, expected) = (evidence(got, query), evidence(expected, query));
        assert_eq!(got.len(), expected.len(), "{what}: vectors");
        for ((id, dense, score), (expected_id, expected_dense, expected_score)) in
            got.iter().zip(&expected)
        {
            assert_eq!(id, expected_id, "{what}: vectors");
            assert_eq!(dense, expected_dense, "{what}: dense vector");
            assert!(
                (score - expected_score).abs() < 2e-3,
                "{what}: evidence {score} against {expected_score}"
            );
        }
    }
    assert_eq!(
        got.vectors.len(),
        got.hit_ids().len(),
        "{what}: one entry of vectors per hit"
    );
}

/// `search_lanes` answers as the lanes searched one by one and the hits' vectors read after: the
/// same hits, scores and vectors (units included), filters and thresholds applied, a lane left out
/// or both.
pub(super) fn check_search_lanes(store: &dyn VectorStore, points: &Points) {
    let Points { a2, .. } = points;
    let tenant_a = SearchFilter {
        tenant: Some("a".into()),
        ..SearchFilter::default()
    };
    let eng = SearchFilter {
        acl: Some(vec!["eng".into()]),
        ..tenant_a.clone()
    };
    let words = Bm25Encoder::default().encode_query("kafka offsets packed context mmr");
    let both = LaneQuery {
        dense: Some(Lane {
            vector: a2.dense.clone(),
            limit: 10,
            score_threshold: None,
        }),
        bm25: Some(Lane {
            vector: words.clone(),
            limit: 10,
            score_threshold: None,
        }),
        pool: None,
    };
    for (what, query, filter) in [
        ("both lanes", both.clone(), &tenant_a),
        ("an ACL", both.clone(), &eng),
        (
            "thresholds",
            LaneQuery {
                dense: Some(Lane {
                    score_threshold: Some(0.99),
                    ..both.dense.clone().expect("dense")
                }),
                bm25: Some(Lane {
                    limit: 1,
                    ..both.bm25.clone().expect("bm25")
                }),
                pool: None,
            },
            &tenant_a,
        ),
        (
            "dense only",
            LaneQuery {
                dense: Some(Lane {
                    vector: axis(points.second),
                    limit: 10,
                    score_threshold: None,
                }),
                bm25: None,
                pool: None,
            },
            &tenant_a,
        ),
        (
            "bm25 only",
            LaneQuery {
                dense: None,
                ..both.clone()
            },
            &tenant_a,
        ),
        (
            "a pool of tokens",
            LaneQuery {
                pool: Some(Pool {
                    tokens: 4,
                    dense: 0,
                    bm25: 0,
                }),
                ..both.clone()
            },
            &tenant_a,
        ),
        ("no lane", LaneQuery::default(), &tenant_a),
    ] {
        let got = store.search_lanes(&query, filter).expect(what);
        let expected = lanes::sequential(store, &query, filter).expect(what);
        let dense_query = query.dense.as_ref().map(|lane| lane.vector.as_slice());
        assert_same(&got, &expected, dense_query, what);
    }
    check_lanes_of_tenant_a(store, points, &both, (&tenant_a, &eng));
}

/// `search_lanes` over tenant `a` with `both` lanes: the best dense hit, a2's evidence from its
/// units, a pool of tokens cutting the lanes, and the ACL filter `eng` inside the request.
fn check_lanes_of_tenant_a(
    store: &dyn VectorStore,
    points: &Points,
    both: &LaneQuery,
    (tenant_a, eng): (&SearchFilter, &SearchFilter),
) {
    let Points { a1, a2, .. } = points;
    let got = store.search_lanes(both, tenant_a).expect("both");
    assert_eq!(ids(&got.dense).first().map(String::as_str), Some("a/two"));
    assert_eq!(got.vectors.len(), 3, "three chunks of tenant a");
    let a2_vectors = &got
        .vectors
        .iter()
        .find(|(id, _)| *id == a2.id)
        .expect("a2's vectors")
        .1;
    let a2_evidence = match &got.evidence {
        Some(scores) => {
            scores
                .iter()
                .find(|(id, _)| *id == a2.id)
                .expect("a2 scored")
                .1
        }
        None => a2_vectors.evidence_score(&a2.dense),
    };
    // a2's units lie on other axes than its own vector: its evidence is theirs, not its own cosine.
    assert!(a2_evidence < 0.5, "a2's evidence {a2_evidence}");
    // A pool of 4 tokens over 3-token chunks: the lanes' best hits in turn, dense first, until two
    // distinct chunks are in (the second lane's best counts only where it is another chunk); only
    // their vectors.
    let pooled = LaneQuery {
        pool: Some(Pool {
            tokens: 4,
            dense: 0,
            bm25: 0,
        }),
        ..both.clone()
    };
    let cut = store.search_lanes(&pooled, tenant_a).expect("pool");
    assert_eq!(
        got.dense.len(),
        3,
        "tenant a's three chunks in the dense lane"
    );
    assert!(got.bm25.len() >= 2, "two chunks of tenant a with the words");
    let same_best = got.dense[0].stored.id == got.bm25[0].stored.id;
    let expected = if same_best { (2, 1) } else { (1, 1) };
    assert_eq!((cut.dense.len(), cut.bm25.len()), expected);
    assert_eq!(ids(&cut.dense), ids(&got.dense)[..expected.0]);
    assert_eq!(ids(&cut.bm25), ids(&got.bm25)[..expected.1]);
    assert_eq!(cut.hit_ids().len(), 2, "two distinct chunks hold the pool");
    assert_eq!(
        cut.vectors.len(),
        cut.hit_ids().len(),
        "vectors of the hits kept only"
    );
    let got = store.search_lanes(both, eng).expect("acl");
    assert!(
        got.hit_ids().iter().all(|id| *id == a1.id || *id == a2.id),
        "the ACL inside the request"
    );
}

/// `neighbours`: the document's chunks within the radius of a position, never another document's
/// or another tenant's.
pub(super) fn check_neighbours(store: &dyn VectorStore) {
    let chunk = |tenant: &str, doc: &str, order: u32| {
        let mut point = sample_point(tenant, doc, 1, &format!("{doc} part {order}"), &[]);
        point.chunk.order_index = order;
        point
    };
    let mut written: Vec<_> = (0..9).map(|order| chunk("n", "long", order)).collect();
    written.push(chunk("n", "other", 4));
    written.push(chunk("m", "long", 4));
    store.upsert(&written).expect("upsert neighbours");
    store.flush().expect("flush");
    let key = crate::model::DocKey::new("n", "long");
    for (order, radius, expected) in [
        (4, 3, vec![1, 2, 3, 4, 5, 6, 7]),
        (0, 3, vec![0, 1, 2, 3]),
        (8, 2, vec![6, 7, 8]),
        (4, 0, vec![4]),
        (u32::MAX, 3, vec![]),
    ] {
        let found = store.neighbours(&key, order, radius).expect("neighbours");
        assert!(found.iter().all(|stored| stored.key == key));
        let mut orders: Vec<u32> = found.iter().map(|s| s.chunk.order_index).collect();
        orders.sort();
        assert_eq!(orders, expected, "around {order}, radius {radius}");
    }
    let ids: Vec<uuid::Uuid> = written.iter().map(|point| point.id).collect();
    store.delete(&ids).expect("delete neighbours");
    store.flush().expect("flush");
}
