//! Tests of one shard's search: its lanes, filters, patterns, listings and counts.

use super::*;
use crate::store::lanes::Pool;
use ragstream_core::query::decode::decode_query;
use ragstream_core::query::depth::{lane_depths, lane_pool, results_wanted};
use ragstream_core::query::{QueryConfig, DEEP_MAX_K};
use ragstream_core::testing::stored;

#[test]
fn list_sources_pages_through_every_document_once_with_its_chunk_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = crate::store::edge::EdgeStore::open(dir.path(), ragstream_core::testing::DIMENSION)
        .expect("open");
    // 23 documents, document i with i % 4 + 1 chunks, written in an order unrelated to their ids.
    let mut points = Vec::new();
    for i in (0..23).rev() {
        for chunk in 0..(i % 4 + 1) {
            points.push(ragstream_core::testing::sample_point(
                "t",
                &format!("doc{:02}", (i * 7) % 23),
                1,
                &format!("text {i} part {chunk}"),
                &[],
            ));
        }
    }
    store.upsert(&points).expect("upsert");
    store.flush().expect("flush");
    let filter = SearchFilter {
        tenant: Some("t".into()),
        ..SearchFilter::default()
    };
    let everything = list_sources(&store, (&filter, None), None, 1000).expect("list");
    assert_eq!(everything.len(), 23);
    assert_eq!(
        everything.iter().map(|s| s.chunks).sum::<usize>(),
        points.len()
    );
    let mut paged = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut page = list_sources(&store, (&filter, None), cursor.as_deref(), 5).expect("page");
        assert!(page.len() <= 6, "at most the page and one more");
        let more = page.len() > 5;
        page.truncate(5);
        cursor = page.last().map(|s| s.doc_id.clone());
        paged.extend(page);
        if !more {
            break;
        }
    }
    assert_eq!(paged, everything, "the pages are the whole list, in order");
}

#[test]
fn filters_and_sizes() {
    let query = decode_query(
        br#"{"query_id":"q","tenant":"acme","text":"x","acl":["eng"],"filters":{"source_prefix":"docs/","kinds":["code"],"doc_ids":["a"],"langs":["fra"]}}"#,
        8192,
    )
    .unwrap();
    let filter = filter_for(&query);
    assert_eq!(filter.tenant.as_deref(), Some("acme"));
    assert_eq!(filter.acl, Some(vec!["eng".to_string()]));
    assert_eq!(filter.kinds, vec![DocKind::Code]);
    assert_eq!(filter.source_prefix.as_deref(), Some("docs/"));
    assert_eq!(filter.langs, vec!["fra".to_string()]);
    let config = QueryConfig::default();
    assert_eq!(results_wanted(&query, &config), 10);
    let no_pool = QueryConfig {
        min_pool: 0,
        ..QueryConfig::default()
    };
    let intent = Depth {
        dense: 12,
        bm25: 30,
    };
    assert_eq!(
        lane_depths(&query, intent, &no_pool),
        Depth {
            dense: 20,
            bm25: 30
        },
        "twice k is the floor; a deeper lane keeps its depth"
    );
    assert_eq!(
        lane_depths(
            &query,
            intent,
            &QueryConfig {
                min_pool: 40,
                ..QueryConfig::default()
            }
        ),
        Depth {
            dense: 40,
            bm25: 40
        }
    );
    let huge = Depth {
        dense: 500,
        bm25: 1,
    };
    assert_eq!(lane_depths(&query, huge, &no_pool).dense, 2 * DEEP_MAX_K);
    // A filled budget reads deeper (its fill target ÷ 100), the intent's lanes too, within twice the
    // budget's k limit; an explicit k is the caller's word.
    let filled = |json: &str| decode_query(json.as_bytes(), 8192).unwrap();
    let at_8000 =
        filled(r#"{"query_id":"q","tenant":"t","text":"x","token_budget":8000,"fill":true}"#);
    assert_eq!(
        lane_depths(&at_8000, intent, &config),
        Depth {
            dense: 85,
            bm25: 85
        }
    );
    assert_eq!(lane_depths(&at_8000, huge, &config).dense, 100);
    assert_eq!(results_wanted(&at_8000, &config), 10);
    let at_ceiling =
        filled(r#"{"query_id":"q","tenant":"t","text":"x","token_budget":1000000,"fill":true}"#);
    assert_eq!(lane_depths(&at_ceiling, intent, &config).dense, 800);
    let explicit =
        filled(r#"{"query_id":"q","tenant":"t","text":"x","token_budget":8000,"k":250}"#);
    assert_eq!(results_wanted(&explicit, &config), 250);
    assert_eq!(lane_depths(&explicit, intent, &config).dense, 500);
    let given_k =
        filled(r#"{"query_id":"q","tenant":"t","text":"x","token_budget":8000,"fill":true,"k":5}"#);
    assert_eq!(lane_depths(&given_k, intent, &config).bm25, 30);
    // At 1 000 tokens a filled query's depth is the default's.
    let at_1000 =
        filled(r#"{"query_id":"q","tenant":"t","text":"x","token_budget":1000,"fill":true}"#);
    assert_eq!(
        lane_depths(&at_1000, intent, &config),
        lane_depths(&query, intent, &config)
    );
    let sql = decode_query(
        br#"{"query_id":"q","tenant":"t","text":"x","mode":"sql_compact"}"#,
        8192,
    )
    .unwrap();
    assert_eq!(filter_for(&sql).kinds, vec![DocKind::SqlSchema]);
    let deep = decode_query(
        br#"{"query_id":"q","tenant":"t","text":"x","mode":"deep"}"#,
        8192,
    )
    .unwrap();
    assert_eq!(results_wanted(&deep, &config), 20, "the design's deep k");
    let configured = QueryConfig {
        default_k: 4,
        deep_k: 7,
        ..QueryConfig::default()
    };
    assert_eq!(results_wanted(&deep, &configured), 7);
    assert_eq!(results_wanted(&query, &configured), 4);
}

#[test]
fn gather_merges_shards_by_score() {
    let hit = |doc: &str, score: f32| Hit {
        stored: stored(doc, 0, doc),
        score,
    };
    let one = ShardAnswer {
        dense: vec![hit("a", 0.9), hit("c", 0.5)],
        sources: vec![SourceEntry {
            doc_id: "a".into(),
            source: "a".into(),
            title: String::new(),
            chunks: 2,
            hits: None,
            score: None,
            group: None,
            documents: None,
        }],
        ..ShardAnswer::default()
    };
    let two = ShardAnswer {
        dense: vec![hit("b", 0.7)],
        sources: vec![SourceEntry {
            doc_id: "b".into(),
            source: "b".into(),
            title: String::new(),
            chunks: 1,
            hits: None,
            score: None,
            group: None,
            documents: None,
        }],
        ..ShardAnswer::default()
    };
    let merged = gather(
        vec![one.clone(), two.clone()],
        (Depth { dense: 2, bm25: 2 }, None),
    );
    let docs: Vec<&str> = merged
        .dense
        .iter()
        .map(|h| h.stored.key.doc_id.as_str())
        .collect();
    assert_eq!(docs, vec!["a", "b"]);
    assert_eq!(merged.sources.len(), 2);
    // The dense lane dropped a hit at the merge: cut. The empty BM25 lane holds all there is.
    assert_eq!(merged.cut, [true, false]);
    // A lane read short of its depth and kept whole is not cut: a lower chunk would join it.
    let short = gather(
        vec![one.clone(), two.clone()],
        (Depth { dense: 5, bm25: 5 }, None),
    );
    assert_eq!(short.cut, [false, false]);
    let probe = probe(&QueryVectors::default(), &short, Vec::new());
    assert_eq!((probe.dense_floor, probe.bm25_floor), (None, None));
    assert_eq!(probe.docs, vec!["a", "b", "c"]);
    // Each lane is cut to its own depth.
    let with_bm25 = |mut answer: ShardAnswer| {
        answer.bm25 = answer.dense.clone();
        answer
    };
    let merged = gather(
        vec![with_bm25(one.clone()), with_bm25(two.clone())],
        (Depth { dense: 3, bm25: 1 }, None),
    );
    assert_eq!((merged.dense.len(), merged.bm25.len()), (3, 1));
    assert_eq!(merged.cut, [true, true], "read to their depths");
    // And to its pool of stored tokens.
    let merged = gather(
        vec![with_bm25(one.clone()), with_bm25(two.clone())],
        (
            Depth { dense: 3, bm25: 3 },
            Some(Pool {
                tokens: 1,
                dense: 1,
                bm25: 2,
            }),
        ),
    );
    assert_eq!(
        (merged.dense.len(), merged.bm25.len()),
        (1, 2),
        "the first hit holds the pool; the BM25 lane keeps its floor of two"
    );
    // The pool filled with each lane at its floor: a lower chunk would not be walked.
    assert_eq!(merged.cut, [true, true]);
    let unfilled = gather(
        vec![with_bm25(one.clone()), with_bm25(two.clone())],
        (
            Depth { dense: 5, bm25: 5 },
            Some(Pool {
                tokens: 1 << 20,
                dense: 1,
                bm25: 1,
            }),
        ),
    );
    assert_eq!(
        unfilled.cut,
        [false, false],
        "a pool never filled walked every hit: a lower chunk would be walked too"
    );
}

/// `score_threshold` bounds the dense lane's cosine, `bm25_score_threshold` the BM25 lane's score;
/// neither touches the other lane.
#[test]
fn each_lane_has_its_own_threshold() {
    use crate::store::contract::{sample_point, DIMENSION};
    use crate::store::edge::EdgeStore;
    use crate::store::Bm25Encoder;
    let dir = tempfile::tempdir().unwrap();
    let store = EdgeStore::open(dir.path(), DIMENSION).unwrap();
    let point = sample_point("t", "a", 1, "rollback the release", &[]);
    store.upsert(std::slice::from_ref(&point)).unwrap();
    store.flush().unwrap();
    let vectors = QueryVectors {
        dense: point.dense.clone(),
        sparse: Bm25Encoder::default().encode_query("rollback release"),
        ..QueryVectors::default()
    };
    let lanes = |thresholds: &str| {
        let query = decode_query(
            format!(r#"{{"query_id":"q","tenant":"t","text":"rollback release"{thresholds}}}"#)
                .as_bytes(),
            8192,
        )
        .unwrap();
        let depth = Depth {
            dense: 10,
            bm25: 10,
        };
        let answer = search_shard(&store, &query, &vectors, (depth, None));
        assert_eq!(answer.error, None);
        (answer.dense.len(), answer.bm25.len())
    };
    assert_eq!(lanes(""), (1, 1));
    // The point's cosine is 1.0 and its BM25 score (two terms of weight 1) under 3.
    assert_eq!(lanes(r#","score_threshold":0.999"#), (1, 1));
    assert_eq!(lanes(r#","score_threshold":1.5"#), (0, 1));
    assert_eq!(lanes(r#","bm25_score_threshold":1.5"#), (1, 1));
    assert_eq!(lanes(r#","bm25_score_threshold":5.0"#), (1, 0));
}

/// A source pattern: its literal directories inside the index query, the rest on the hits, in
/// both lanes and in `list_sources`.
#[test]
fn a_source_pattern_keeps_the_matching_sources_in_every_lane_and_listing() {
    use crate::store::contract::{sample_point, DIMENSION};
    use crate::store::edge::EdgeStore;
    use crate::store::Bm25Encoder;
    let dir = tempfile::tempdir().unwrap();
    let store = EdgeStore::open(dir.path(), DIMENSION).unwrap();
    let mut points = Vec::new();
    for (doc, source) in [
        ("a", "docs/guide/a.md"),
        ("b", "docs/b.rs"),
        ("c", "src/c.md"),
        ("d", "docs/d.md"),
    ] {
        let mut point = sample_point("t", doc, 1, "rollback the release", &[]);
        point.chunk.source = source.into();
        points.push(point);
    }
    store.upsert(&points).unwrap();
    store.flush().unwrap();
    let vectors = QueryVectors {
        dense: points[0].dense.clone(),
        sparse: Bm25Encoder::default().encode_query("rollback release"),
        ..QueryVectors::default()
    };
    let ask = |extra: &str| {
        let query = decode_query(
            format!(r#"{{"query_id":"q","tenant":"t","text":"rollback release"{extra}}}"#)
                .as_bytes(),
            8192,
        )
        .unwrap();
        let depth = Depth {
            dense: 10,
            bm25: 10,
        };
        let answer = search_shard(&store, &query, &vectors, (depth, None));
        assert_eq!(answer.error, None);
        let docs = |hits: &[Hit]| {
            let mut docs: Vec<String> = hits.iter().map(|h| h.stored.key.doc_id.clone()).collect();
            docs.sort();
            docs
        };
        (docs(&answer.dense), docs(&answer.bm25), answer.sources)
    };
    let (dense, bm25, _) = ask(r#","filters":{"source_pattern":"docs/**/*.md"}"#);
    assert_eq!(dense, ["a", "d"]);
    assert_eq!(bm25, ["a", "d"]);
    let (dense, _, _) = ask(r#","filters":{"source_pattern":"**/*.md"}"#);
    assert_eq!(dense, ["a", "c", "d"]);
    let (dense, _, _) = ask(r#","filters":{"source_pattern":"docs/*.*"}"#);
    assert_eq!(dense, ["b", "d"], "* stays in one directory");
    let (_, _, sources) = ask(r#","mode":"list_sources","filters":{"source_pattern":"*/*.md"}"#);
    let listed: Vec<&str> = sources.iter().map(|s| s.doc_id.as_str()).collect();
    assert_eq!(listed, ["c", "d"]);
    // The literal directories go into the index query as a prefix.
    let query = decode_query(
        br#"{"query_id":"q","tenant":"t","text":"x","filters":{"source_pattern":"docs/guide/*.md"}}"#,
        8192,
    )
    .unwrap();
    assert_eq!(
        filter_for(&query).source_prefix.as_deref(),
        Some("docs/guide")
    );
    // A pattern that does not compile is refused when the query is decoded.
    let bad = decode_query(
        br#"{"query_id":"q","tenant":"t","text":"x","filters":{"source_pattern":"docs/[a"}}"#,
        8192,
    )
    .unwrap_err();
    assert!(bad.message.contains("source_pattern"), "{}", bad.message);
}

/// A filled query's lanes keep their best hits, in turn, until they hold its pool of stored tokens,
/// and two shards cut and merged keep the same hits, in the same order, as one shard holding everything.
#[test]
fn a_pool_cut_on_shards_and_merged_is_the_one_shard_cut() {
    use crate::store::contract::{sample_point, DIMENSION};
    use crate::store::edge::EdgeStore;
    use crate::store::Bm25Encoder;
    let points: Vec<_> = (0..30usize)
        .map(|i| {
            let text = format!("rollback {} item{i}", "release ".repeat(i + 1));
            let mut point = sample_point("t", &format!("d{i:02}"), 1, &text, &[]);
            point.chunk.tokens = 100 + (i as u32 * 37) % 150;
            let mut dense = vec![0.01; DIMENSION];
            (dense[0], dense[1]) = (1.0, i as f32 / 30.0);
            ragstream_core::embed::l2_normalize(&mut dense);
            point.dense = dense;
            point
        })
        .collect();
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let open = |dir: &tempfile::TempDir, points: Vec<_>| {
        let store = EdgeStore::open(dir.path(), DIMENSION).unwrap();
        store.upsert(&points).unwrap();
        store.flush().unwrap();
        store
    };
    let whole = open(&dirs[0], points.clone());
    let (even, odd): (Vec<_>, Vec<_>) = points
        .iter()
        .cloned()
        .enumerate()
        .partition(|(i, _)| i % 2 == 0);
    let strip = |half: Vec<(usize, _)>| half.into_iter().map(|(_, p)| p).collect::<Vec<_>>();
    let shards = [open(&dirs[1], strip(even)), open(&dirs[2], strip(odd))];
    let mut query_vector = vec![0.0; DIMENSION];
    query_vector[0] = 1.0;
    let vectors = QueryVectors {
        dense: query_vector,
        sparse: Bm25Encoder::default().encode_query("rollback release"),
        ..QueryVectors::default()
    };
    let query = decode_query(
        br#"{"query_id":"q","tenant":"t","text":"rollback release","token_budget":1000,"fill":true}"#,
        8192,
    )
    .unwrap();
    // Two results wanted: each lane reads at least four hits without filling.
    let config = QueryConfig {
        default_k: 2,
        min_pool: 0,
        ..QueryConfig::default()
    };
    let intent = Depth { dense: 1, bm25: 1 };
    let depth = lane_depths(&query, intent, &config);
    let pool = lane_pool(&query, intent, &config).expect("a filled query's pool");
    assert_eq!(pool.tokens, 1500, "the budget and half of it");
    assert_eq!(
        (pool.dense, pool.bm25),
        (4, 4),
        "the depths without filling"
    );
    let pool = Some(pool);
    let ids = |hits: &[Hit]| {
        hits.iter()
            .map(|h| h.stored.key.doc_id.clone())
            .collect::<Vec<_>>()
    };
    let one = gather(
        vec![search_shard(&whole, &query, &vectors, (depth, pool))],
        (depth, pool),
    );
    let two = gather(
        shards
            .iter()
            .map(|shard| search_shard(shard, &query, &vectors, (depth, pool)))
            .collect(),
        (depth, pool),
    );
    let uncut = search_shard(&whole, &query, &vectors, (depth, None));
    for (lane, cut, merged, all) in [
        ("dense", &one.dense, &two.dense, &uncut.dense),
        ("bm25", &one.bm25, &two.bm25, &uncut.bm25),
    ] {
        assert_eq!(ids(cut), ids(merged), "{lane}: two shards merged as one");
        assert!(cut.len() < all.len(), "{lane}: the pool cuts it");
        assert_eq!(ids(cut), ids(&all[..cut.len()]), "{lane}: its best hits");
    }
    // The distinct chunks of both lanes hold the pool, and need the last hit walked.
    let held = |dense: &[Hit], bm25: &[Hit]| {
        let mut chunks = std::collections::HashMap::new();
        for hit in dense.iter().chain(bm25) {
            chunks.insert(hit.stored.id, hit.stored.chunk.tokens);
        }
        chunks.values().sum::<u32>()
    };
    let all = held(&one.dense, &one.bm25);
    let short = held(
        &one.dense[..one.dense.len() - 1],
        &one.bm25[..one.bm25.len() - 1],
    );
    assert!(
        all >= 1500 && short < 1500,
        "{all} tokens, {short} without each lane's last hit"
    );
    let kept: std::collections::HashSet<_> = one
        .dense
        .iter()
        .chain(&one.bm25)
        .map(|h| h.stored.id)
        .collect();
    assert_eq!(
        one.vectors.len(),
        kept.len(),
        "the vectors of the hits kept only"
    );
}
