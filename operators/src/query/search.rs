//! Retrieve: the dense and BM25 lanes against one shard, with every filter inside the index query.
//!
//! A query is broadcast to every worker; each searches its own shard ([`search_shard`]) and the
//! answers are gathered by query id ([`gather`]). With the Qdrant server backend all workers share one
//! collection, so only worker 0 searches it. Besides the lanes, a shard answers the non-retrieval modes
//! (`list_sources`: its documents and chunk counts; `read_chunk`: the chunk if it holds it) and returns
//! the stored vectors of its hits for dedup and MMR.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::metrics::metrics;
use crate::model::DocKind;
use crate::store::{
    Hit, SearchFilter, SearchVector, SparseVector, StoreError, StoredChunk, VectorStore,
};
use ragstream_core::query::pattern::{literal_prefix, SourcePattern, PATTERN_DEPTH_FACTOR};
use ragstream_core::query::{
    Depth, Mode, Query, QueryConfig, SourceEntry, DEEP_MAX_K, LIST_MAX_PAGE, LIST_PAGE,
};

/// The filter of a query: tenant, ACL, source prefix, kinds and documents, all inside the search
/// (a source pattern's literal directories as the prefix when the query gives none; the rest of the
/// pattern is [`pattern_of`]'s).
pub fn filter_for(query: &Query) -> SearchFilter {
    let mut kinds = query.filters.kinds.clone();
    if matches!(query.mode, Mode::SqlCompact | Mode::SqlFull) {
        kinds = vec![DocKind::SqlSchema];
    }
    let source_prefix = query.filters.source_prefix.clone().or_else(|| {
        let pattern = query.filters.source_pattern.as_deref()?;
        Some(literal_prefix(pattern)).filter(|p| !p.is_empty())
    });
    SearchFilter {
        tenant: Some(query.tenant.clone()),
        acl: query.acl.clone(),
        kinds,
        doc_ids: query.filters.doc_ids.clone(),
        source_prefix,
        langs: query.filters.langs.clone(),
        metadata: query.filters.metadata.0.clone(),
    }
}

/// The query's source pattern (checked when the query was decoded).
pub fn pattern_of(query: &Query) -> Option<SourcePattern> {
    query
        .filters
        .source_pattern
        .as_deref()
        .and_then(|p| SourcePattern::parse(p).ok())
}

/// Results asked for: `k`, defaulting to `query.default_k` (`query.deep_k` for `deep`), at most 50.
pub fn results_wanted(query: &Query, config: &QueryConfig) -> usize {
    let default = if query.mode == Mode::Deep {
        config.deep_k
    } else {
        config.default_k
    };
    query.k.unwrap_or(default).clamp(1, DEEP_MAX_K)
}

/// Candidates per lane: the intent's depth for that lane, at least twice the results wanted and
/// `min_pool`, at most twice the deep mode's most results.
pub fn lane_depths(query: &Query, intent: Depth, config: &QueryConfig) -> Depth {
    let floor = (2 * results_wanted(query, config)).max(config.min_pool);
    let depth = |lane: usize| lane.max(floor).min(2 * DEEP_MAX_K);
    Depth {
        dense: depth(intent.dense),
        bm25: depth(intent.bm25),
    }
}

/// The query's vectors.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueryVectors {
    /// Dense embedding of the query text (empty for modes that do not retrieve).
    pub dense: Vec<f32>,
    /// BM25 query vector.
    pub sparse: SparseVector,
}

/// One shard's answer to one query.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ShardAnswer {
    /// Dense lane, best first.
    pub dense: Vec<Hit>,
    /// BM25 lane, best first.
    pub bm25: Vec<Hit>,
    /// Stored vectors of the hits.
    pub vectors: Vec<(uuid::Uuid, Vec<f32>)>,
    /// Sentence evidence of the hits ([`crate::store::StoredVectors::evidence_score`]), computed
    /// where the vectors are (only a number per hit leaves the shard).
    pub evidence: Vec<(uuid::Uuid, f32)>,
    /// Documents and chunk counts (`list_sources`, `files`, unknown `read_chunk` ids).
    pub sources: Vec<SourceEntry>,
    /// The chunk asked for (`read_chunk`).
    pub chunk: Option<StoredChunk>,
    /// Set when the shard failed.
    pub error: Option<String>,
}

/// One page of the documents matching `filter` (and `pattern`) with their chunk counts: the first
/// `limit` document ids after `after`, in id order, plus the next one when there is one (so the
/// caller knows a next page exists). Memory stays within `limit + 1` entries whatever the tenant's
/// size.
pub fn list_sources(
    store: &dyn VectorStore,
    (filter, pattern): (&SearchFilter, Option<&SourcePattern>),
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<SourceEntry>, StoreError> {
    let mut by_doc: BTreeMap<String, SourceEntry> = BTreeMap::new();
    store.scroll(filter, &mut |stored| {
        let doc_id = stored.key.doc_id.as_str();
        if after.is_some_and(|after| doc_id <= after)
            || pattern.is_some_and(|p| !p.matches(&stored.chunk.source))
        {
            return;
        }
        if let Some(entry) = by_doc.get_mut(doc_id) {
            entry.chunks += 1;
            return;
        }
        // Full: an id past the last kept one is on a later page (the last kept id only decreases,
        // so a document left out is never counted partially).
        if by_doc.len() > limit
            && by_doc
                .last_key_value()
                .is_some_and(|(last, _)| doc_id > last.as_str())
        {
            return;
        }
        by_doc.insert(
            doc_id.to_string(),
            SourceEntry {
                doc_id: doc_id.to_string(),
                source: stored.chunk.source.clone(),
                title: stored.chunk.doc_title.clone(),
                chunks: 1,
                hits: None,
                score: None,
            },
        );
        if by_doc.len() > limit + 1 {
            by_doc.pop_last();
        }
    })?;
    Ok(by_doc.into_values().collect())
}

/// Documents per `list_sources` page: `k`, [`LIST_PAGE`] by default, at most [`LIST_MAX_PAGE`].
pub fn list_page(query: &Query) -> usize {
    query.k.unwrap_or(LIST_PAGE).clamp(1, LIST_MAX_PAGE)
}

/// The dense and BM25 lanes of `query` on one shard, best first. A source pattern filters their
/// hits, each lane reading [`PATTERN_DEPTH_FACTOR`] times deeper so that as many pass.
fn search_lanes(
    store: &dyn VectorStore,
    query: &Query,
    vectors: &QueryVectors,
    (filter, pattern): (&SearchFilter, Option<&SourcePattern>),
    wanted: Depth,
) -> Result<(Vec<Hit>, Vec<Hit>), StoreError> {
    let factor = if pattern.is_some() {
        PATTERN_DEPTH_FACTOR
    } else {
        1
    };
    let lane = |name: &str, vector: SearchVector, threshold: Option<f32>, most: usize| {
        let started = std::time::Instant::now();
        let mut hits = store.search(&vector, filter, most * factor, threshold)?;
        if let Some(pattern) = pattern {
            hits.retain(|hit| pattern.matches(&hit.stored.chunk.source));
            hits.truncate(most);
        }
        metrics()
            .query_stage_seconds
            .with_label_values(&[name])
            .observe(started.elapsed().as_secs_f64());
        Ok::<_, StoreError>(hits)
    };
    let dense = if vectors.dense.is_empty() {
        Vec::new()
    } else {
        lane(
            "retrieve_dense",
            SearchVector::Dense(vectors.dense.clone()),
            query.score_threshold,
            wanted.dense,
        )?
    };
    let bm25 = if vectors.sparse.indices.is_empty() {
        Vec::new()
    } else {
        lane(
            "retrieve_bm25",
            SearchVector::Sparse(vectors.sparse.clone()),
            query.bm25_score_threshold,
            wanted.bm25,
        )?
    };
    Ok((dense, bm25))
}

/// Runs `query` against one shard.
pub fn search_shard(
    store: &dyn VectorStore,
    query: &Query,
    vectors: &QueryVectors,
    depth: Depth,
) -> ShardAnswer {
    let filter = filter_for(query);
    let pattern = pattern_of(query);
    let pattern = pattern.as_ref();
    let result = (|| -> Result<ShardAnswer, StoreError> {
        let mut answer = ShardAnswer::default();
        match query.mode {
            Mode::ListSources => {
                answer.sources = list_sources(
                    store,
                    (&filter, pattern),
                    query.cursor.as_deref(),
                    list_page(query),
                )?;
            }
            Mode::ReadChunk => {
                let id = uuid::Uuid::parse_str(query.text.trim()).ok();
                let found = match id {
                    Some(id) => store.get(&[id])?,
                    None => Vec::new(),
                };
                // The chunk must belong to the tenant and pass the ACL like any search result.
                answer.chunk = found.into_iter().find(|stored| {
                    stored.key.tenant == query.tenant
                        && (stored.chunk.acl.is_empty()
                            || query.acl.as_ref().is_none_or(|labels| {
                                stored.chunk.acl.iter().any(|l| labels.contains(l))
                            }))
                });
                if answer.chunk.is_none() {
                    // What the caller could read instead: the first page of documents.
                    answer.sources = list_sources(store, (&filter, pattern), None, LIST_PAGE)?;
                }
            }
            _ => {
                (answer.dense, answer.bm25) =
                    search_lanes(store, query, vectors, (&filter, pattern), depth)?;
                let mut ids: Vec<uuid::Uuid> = answer
                    .dense
                    .iter()
                    .chain(&answer.bm25)
                    .map(|h| h.stored.id)
                    .collect();
                ids.sort();
                ids.dedup();
                for (id, stored) in store.vectors(&ids)? {
                    if !vectors.dense.is_empty() {
                        answer
                            .evidence
                            .push((id, stored.evidence_score(&vectors.dense)));
                    }
                    answer.vectors.push((id, stored.dense));
                }
                if query.mode == Mode::Files {
                    // Chunk counts of the files found here (a document lives on one shard).
                    let mut files = filter.clone();
                    files.doc_ids = answer
                        .dense
                        .iter()
                        .chain(&answer.bm25)
                        .map(|hit| hit.stored.key.doc_id.clone())
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .collect();
                    if !files.doc_ids.is_empty() {
                        let count = files.doc_ids.len();
                        answer.sources = list_sources(store, (&files, None), None, count)?;
                    }
                }
            }
        }
        Ok(answer)
    })();
    result.unwrap_or_else(|error| ShardAnswer {
        error: Some(error.to_string()),
        ..ShardAnswer::default()
    })
}

/// Merges the answers of every shard: lanes re-sorted by score and cut to their depth, sources summed.
pub fn gather(answers: Vec<ShardAnswer>, depth: Depth) -> ShardAnswer {
    let mut merged = ShardAnswer::default();
    let mut sources: BTreeMap<String, SourceEntry> = BTreeMap::new();
    for answer in answers {
        merged.dense.extend(answer.dense);
        merged.bm25.extend(answer.bm25);
        merged.vectors.extend(answer.vectors);
        merged.evidence.extend(answer.evidence);
        merged.chunk = merged.chunk.or(answer.chunk);
        if merged.error.is_none() {
            merged.error = answer.error;
        }
        for source in answer.sources {
            match sources.get_mut(&source.doc_id) {
                Some(entry) => entry.chunks += source.chunks,
                None => {
                    sources.insert(source.doc_id.clone(), source);
                }
            }
        }
    }
    for (lane, depth) in [
        (&mut merged.dense, depth.dense),
        (&mut merged.bm25, depth.bm25),
    ] {
        lane.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then_with(|| a.stored.id.cmp(&b.stored.id))
        });
        lane.truncate(depth);
    }
    merged.sources = sources.into_values().collect();
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use ragstream_core::query::decode::decode_query;
    use ragstream_core::testing::stored;

    #[test]
    fn list_sources_pages_through_every_document_once_with_its_chunk_count() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store =
            crate::store::edge::EdgeStore::open(dir.path(), ragstream_core::testing::DIMENSION)
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
            let mut page =
                list_sources(&store, (&filter, None), cursor.as_deref(), 5).expect("page");
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
            }],
            ..ShardAnswer::default()
        };
        let merged = gather(vec![one.clone(), two.clone()], Depth { dense: 2, bm25: 2 });
        let docs: Vec<&str> = merged
            .dense
            .iter()
            .map(|h| h.stored.key.doc_id.as_str())
            .collect();
        assert_eq!(docs, vec!["a", "b"]);
        assert_eq!(merged.sources.len(), 2);
        // Each lane is cut to its own depth.
        let with_bm25 = |mut answer: ShardAnswer| {
            answer.bm25 = answer.dense.clone();
            answer
        };
        let merged = gather(
            vec![with_bm25(one), with_bm25(two)],
            Depth { dense: 3, bm25: 1 },
        );
        assert_eq!((merged.dense.len(), merged.bm25.len()), (3, 1));
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
            let answer = search_shard(&store, &query, &vectors, depth);
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
        };
        let ask = |extra: &str| {
            let query = decode_query(
                format!(r#"{{"query_id":"q","tenant":"t","text":"rollback release"{extra}}}"#)
                    .as_bytes(),
                8192,
            )
            .unwrap();
            let answer = search_shard(
                &store,
                &query,
                &vectors,
                Depth {
                    dense: 10,
                    bm25: 10,
                },
            );
            assert_eq!(answer.error, None);
            let docs = |hits: &[Hit]| {
                let mut docs: Vec<String> =
                    hits.iter().map(|h| h.stored.key.doc_id.clone()).collect();
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
        let (_, _, sources) =
            ask(r#","mode":"list_sources","filters":{"source_pattern":"*/*.md"}"#);
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
}
