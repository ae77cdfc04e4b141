//! Invalidate: which published contexts cite which chunks, so that the holder of a context hears when
//! a later index write deletes or changes a chunk it cites.
//!
//! The publishing worker records each context's citations ([`Citations::cite`]): the chunk ids of its
//! items and the wall-clock time its retrieval began. Every acknowledged index write reports the ids
//! it changed ([`Citations::changed`]): a chunk deleted (its text edited, the document shrunk or
//! deleted) or rewritten with a new layout (moved, a new header, ACL or language). A version bump that
//! changed nothing else is not a change. Each context that cites one of them gets one
//! [`Invalidation`] naming its stale chunks, and its citations are dropped, so a context is
//! invalidated at most once.
//!
//! A change acknowledged after a context's retrieval began and before its citations were recorded is
//! still caught: the registry keeps the changes of the last [`RECENT_MS`] (no query takes longer from
//! retrieval to publication), at most `max_citations` ids of them, and [`Citations::cite`] checks the
//! context against those newer than its retrieval. Bounds: citations
//! older than `ttl_ms` are forgotten, and at most `max_citations` chunk citations are kept (the oldest
//! contexts go first); a context forgotten is never invalidated.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::{Context, Watermark};

/// How long changes are kept to check contexts cited after them: the longest a query is waited for
/// (`POST /v1/query` gives up after 120 s).
pub const RECENT_MS: u64 = 120_000;

/// One context made stale by index writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Invalidation {
    /// Position in this process's log of invalidations (`GET /v1/invalidations?since=`), from 1.
    #[serde(default)]
    pub seq: u64,
    /// The query whose context is stale.
    pub query_id: String,
    /// Its tenant.
    pub tenant: String,
    /// The chunks it cites that were deleted or changed, sorted.
    pub stale_chunk_ids: Vec<String>,
    /// The ingest progress once the change was written.
    pub index_watermark: Watermark,
}

/// A context's citations.
#[derive(Debug, Clone)]
struct Cited {
    tenant: String,
    chunk_ids: Vec<uuid::Uuid>,
    at_ms: u64,
}

/// The registry of one worker: published contexts by the chunks they cite, and the recent changes.
#[derive(Debug)]
pub struct Citations {
    ttl_ms: u64,
    max_citations: usize,
    /// Query key ([`cited_key`]: tenant and query id) → its context's citations.
    contexts: HashMap<String, Cited>,
    /// Chunk id → the keys of the queries citing it.
    by_chunk: HashMap<uuid::Uuid, Vec<String>>,
    /// Query keys in citation order, with the time they were cited (oldest first).
    order: VecDeque<(u64, String)>,
    /// Chunk citations held.
    held: usize,
    /// Recent changes: acknowledgement time → chunk ids.
    recent: BTreeMap<u64, Vec<uuid::Uuid>>,
    /// Ids in `recent`.
    recent_ids: usize,
}

impl Citations {
    /// A registry keeping citations `ttl_ms` and at most `max_citations` chunk citations.
    pub fn new(ttl_ms: u64, max_citations: usize) -> Self {
        Self {
            ttl_ms,
            max_citations,
            contexts: HashMap::new(),
            by_chunk: HashMap::new(),
            order: VecDeque::new(),
            held: 0,
            recent: BTreeMap::new(),
            recent_ids: 0,
        }
    }

    /// Chunk citations held.
    pub fn len(&self) -> usize {
        self.held
    }

    /// Whether no citation is held.
    pub fn is_empty(&self) -> bool {
        self.held == 0
    }

    /// Records what `context` cites, its retrieval having begun at `retrieved_ms`; `now_ms` is the
    /// wall clock. Returns the invalidation at once when a change newer than the retrieval already
    /// touched one of its chunks. Contexts without items (errors, list modes) cite nothing.
    pub fn cite(
        &mut self,
        context: &Context,
        retrieved_ms: u64,
        now_ms: u64,
        watermark: impl FnOnce() -> Watermark,
    ) -> Option<Invalidation> {
        self.expire(now_ms);
        let mut chunk_ids: Vec<uuid::Uuid> = context
            .items
            .iter()
            .filter_map(|item| uuid::Uuid::parse_str(&item.chunk_id).ok())
            .collect();
        chunk_ids.sort();
        chunk_ids.dedup();
        if context.query_id.is_empty() || chunk_ids.is_empty() || context.error.is_some() {
            return None;
        }
        let stale: Vec<uuid::Uuid> = self
            .recent
            .range(retrieved_ms..)
            .flat_map(|(_, ids)| ids)
            .filter(|id| chunk_ids.binary_search(id).is_ok())
            .copied()
            .collect();
        if !stale.is_empty() {
            return Some(invalidation(
                &context.query_id,
                &context.tenant,
                stale,
                watermark(),
            ));
        }
        // A query answered again (at-least-once delivery) replaces its earlier citations; the same
        // query id of another tenant is another query.
        let key = cited_key(&context.tenant, &context.query_id);
        self.forget(&key);
        for id in &chunk_ids {
            self.by_chunk.entry(*id).or_default().push(key.clone());
        }
        self.held += chunk_ids.len();
        self.order.push_back((now_ms, key.clone()));
        self.contexts.insert(
            key,
            Cited {
                tenant: context.tenant.clone(),
                chunk_ids,
                at_ms: now_ms,
            },
        );
        while self.held > self.max_citations {
            let Some((at, query_id)) = self.order.pop_front() else {
                break;
            };
            // An entry left by a query cited again since is not the citation held.
            if self
                .contexts
                .get(&query_id)
                .is_some_and(|cited| cited.at_ms == at)
            {
                self.forget(&query_id);
            }
        }
        None
    }

    /// Chunks `changed` by an index write acknowledged at `now_ms`: one invalidation per context
    /// citing any of them (their ids sorted), and those contexts forgotten.
    pub fn changed(
        &mut self,
        changed: &[uuid::Uuid],
        now_ms: u64,
        watermark: impl Fn() -> Watermark,
    ) -> Vec<Invalidation> {
        self.expire(now_ms);
        if changed.is_empty() {
            return Vec::new();
        }
        self.recent
            .entry(now_ms)
            .or_default()
            .extend_from_slice(changed);
        self.recent_ids += changed.len();
        // A bulk rewrite keeps at most as many ids as there may be citations; the oldest go first.
        while self.recent_ids > self.max_citations {
            match self.recent.pop_first() {
                Some((_, ids)) => self.recent_ids -= ids.len(),
                None => break,
            }
        }
        let mut stale: BTreeMap<String, Vec<uuid::Uuid>> = BTreeMap::new();
        for id in changed {
            for query_id in self.by_chunk.get(id).into_iter().flatten() {
                stale.entry(query_id.clone()).or_default().push(*id);
            }
        }
        let mut out = Vec::with_capacity(stale.len());
        for (key, ids) in stale {
            let tenant = self
                .contexts
                .get(&key)
                .map(|cited| cited.tenant.clone())
                .unwrap_or_default();
            self.forget(&key);
            let query_id = key.split_once('/').map_or(key.as_str(), |(_, id)| id);
            out.push(invalidation(query_id, &tenant, ids, watermark()));
        }
        out
    }

    /// Forgets the citations of the query `key` ([`cited_key`]).
    fn forget(&mut self, key: &str) {
        let Some(cited) = self.contexts.remove(key) else {
            return;
        };
        self.held -= cited.chunk_ids.len();
        for id in cited.chunk_ids {
            if let Some(queries) = self.by_chunk.get_mut(&id) {
                queries.retain(|q| q != key);
                if queries.is_empty() {
                    self.by_chunk.remove(&id);
                }
            }
        }
        // `order` keeps the id; a later pop of it finds nothing to forget, or (the query cited
        // again) a newer entry, which is checked by its time below.
    }

    /// Drops citations and changes older than the time to live.
    fn expire(&mut self, now_ms: u64) {
        let horizon = now_ms.saturating_sub(self.ttl_ms);
        while let Some((at, query_id)) = self.order.front().cloned() {
            if at >= horizon {
                break;
            }
            self.order.pop_front();
            if self
                .contexts
                .get(&query_id)
                .is_some_and(|cited| cited.at_ms == at)
            {
                self.forget(&query_id);
            }
        }
        let kept = self
            .recent
            .split_off(&now_ms.saturating_sub(self.ttl_ms.min(RECENT_MS)));
        let dropped: usize = self.recent.values().map(Vec::len).sum();
        self.recent_ids -= dropped;
        self.recent = kept;
    }
}

fn invalidation(
    query_id: &str,
    tenant: &str,
    mut stale: Vec<uuid::Uuid>,
    index_watermark: Watermark,
) -> Invalidation {
    stale.sort();
    stale.dedup();
    Invalidation {
        seq: 0,
        query_id: query_id.to_string(),
        tenant: tenant.to_string(),
        stale_chunk_ids: stale.iter().map(uuid::Uuid::to_string).collect(),
        index_watermark,
    }
}

/// The last invalidations of a process, numbered, for `GET /v1/invalidations?since=`.
#[derive(Debug)]
pub struct InvalidationLog {
    capacity: usize,
    next: u64,
    entries: VecDeque<Invalidation>,
}

impl InvalidationLog {
    /// A log keeping the last `capacity` invalidations.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            next: 1,
            entries: VecDeque::new(),
        }
    }

    /// Appends `invalidation`, numbering it; returns its number.
    pub fn push(&mut self, mut invalidation: Invalidation) -> u64 {
        invalidation.seq = self.next;
        self.next += 1;
        self.entries.push_back(invalidation);
        while self.entries.len() > self.capacity {
            self.entries.pop_front();
        }
        self.next - 1
    }

    /// The invalidations numbered above `since`, oldest first, and the number to ask from next time.
    /// `truncated` is set when some after `since` were already dropped from the log.
    pub fn since(&self, since: u64) -> (Vec<Invalidation>, u64, bool) {
        let entries: Vec<Invalidation> = self
            .entries
            .iter()
            .filter(|entry| entry.seq > since)
            .cloned()
            .collect();
        let oldest = self.entries.front().map_or(self.next, |entry| entry.seq);
        (entries, self.next - 1, since + 1 < oldest)
    }
}

/// The key a query's citations are held under: its tenant and its id (a tenant holds no `/`), so two
/// tenants' queries of the same id neither replace nor invalidate each other's.
fn cited_key(tenant: &str, query_id: &str) -> String {
    format!("{tenant}/{query_id}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::ContextItem;
    use crate::query::Tier;

    fn id(n: u8) -> uuid::Uuid {
        uuid::Uuid::from_bytes([n; 16])
    }

    fn context(query_id: &str, chunks: &[u8]) -> Context {
        Context {
            query_id: query_id.into(),
            tenant: "acme".into(),
            items: chunks
                .iter()
                .map(|n| ContextItem {
                    chunk_id: id(*n).to_string(),
                    doc_id: "d".into(),
                    source: "d.md".into(),
                    lines: (1, 2),
                    page: None,
                    section_path: vec![],
                    tier: Tier::Snippet,
                    score: 1.0,
                    tokens: 3,
                    full_tokens: 3,
                    lanes: vec![],
                    text: "x".into(),
                    metadata: Default::default(),
                })
                .collect(),
            ..Context::default()
        }
    }

    fn mark() -> Watermark {
        Watermark {
            frontier_ms: 7,
            ..Watermark::default()
        }
    }

    #[test]
    fn the_same_query_id_of_two_tenants_is_two_queries() {
        let mut citations = Citations::new(60_000, 1000);
        let mut other = context("q1", &[5]);
        other.tenant = "globex".into();
        assert!(citations
            .cite(&context("q1", &[1]), 90, 100, mark)
            .is_none());
        // globex's q1 neither replaces acme's q1 nor is replaced by it.
        assert!(citations.cite(&other, 90, 100, mark).is_none());
        assert_eq!(citations.len(), 2);
        let out = citations.changed(&[id(1)], 200, mark);
        assert_eq!(out.len(), 1);
        assert_eq!(
            (out[0].tenant.as_str(), out[0].query_id.as_str()),
            ("acme", "q1")
        );
        let out = citations.changed(&[id(5)], 300, mark);
        assert_eq!(out.len(), 1);
        assert_eq!(
            (out[0].tenant.as_str(), out[0].query_id.as_str()),
            ("globex", "q1")
        );
    }

    #[test]
    fn a_change_to_a_cited_chunk_invalidates_each_citing_context_once() {
        let mut citations = Citations::new(60_000, 1000);
        assert!(citations
            .cite(&context("q1", &[1, 2]), 90, 100, mark)
            .is_none());
        assert!(citations
            .cite(&context("q2", &[2, 3]), 95, 100, mark)
            .is_none());
        assert_eq!(citations.len(), 4);
        // An uncited chunk: nothing.
        assert!(citations.changed(&[id(9)], 200, mark).is_empty());
        let out = citations.changed(&[id(2), id(1)], 300, mark);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].query_id, "q1");
        assert_eq!(
            out[0].stale_chunk_ids,
            vec![id(1).to_string(), id(2).to_string()]
        );
        assert_eq!(out[0].tenant, "acme");
        assert_eq!(out[0].index_watermark.frontier_ms, 7);
        assert_eq!(out[1].query_id, "q2");
        assert_eq!(out[1].stale_chunk_ids, vec![id(2).to_string()]);
        // Each was told once: a second change to their chunks finds nobody.
        assert!(citations
            .changed(&[id(1), id(2), id(3)], 400, mark)
            .is_empty());
        assert!(citations.is_empty());
    }

    #[test]
    fn a_change_after_retrieval_and_before_the_citation_is_caught_when_citing() {
        let mut citations = Citations::new(60_000, 1000);
        assert!(citations.changed(&[id(1)], 150, mark).is_empty());
        // Retrieval began at 100, before the change at 150: the context may hold the old chunk.
        let out = citations
            .cite(&context("q1", &[1, 2]), 100, 200, mark)
            .expect("stale at once");
        assert_eq!(out.stale_chunk_ids, vec![id(1).to_string()]);
        assert!(citations.is_empty(), "an invalidated context is not kept");
        // Retrieval after the change saw the new state.
        assert!(citations
            .cite(&context("q2", &[1]), 160, 200, mark)
            .is_none());
    }

    #[test]
    fn changes_are_kept_only_as_long_as_a_query_can_take_and_within_the_bound() {
        let mut citations = Citations::new(3_600_000, 3);
        citations.changed(&[id(1)], 1000, mark);
        // Past RECENT_MS the change is forgotten: a context retrieved before it is not told.
        let later = 1000 + RECENT_MS + 1;
        assert!(citations
            .cite(&context("q1", &[1]), 0, later, mark)
            .is_none());
        // A bulk change keeps at most `max_citations` ids, the newest.
        citations.changed(&[id(2), id(3)], later, mark);
        citations.changed(&[id(4), id(5)], later + 1, mark);
        assert!(citations
            .cite(&context("q2", &[2]), 0, later + 2, mark)
            .is_none());
        assert!(citations
            .cite(&context("q3", &[4]), 0, later + 2, mark)
            .is_some());
    }

    #[test]
    fn contexts_without_items_or_with_errors_cite_nothing() {
        let mut citations = Citations::new(60_000, 1000);
        let mut failed = context("q1", &[1]);
        failed.error = Some("boom".into());
        assert!(citations.cite(&failed, 0, 1, mark).is_none());
        assert!(citations.cite(&context("q2", &[]), 0, 1, mark).is_none());
        assert!(citations.is_empty());
        assert!(citations.changed(&[id(1)], 2, mark).is_empty());
    }

    #[test]
    fn bounded_by_age_and_by_count() {
        let mut citations = Citations::new(1000, 3);
        citations.cite(&context("old", &[1]), 0, 0, mark);
        citations.cite(&context("a", &[2, 3]), 0, 500, mark);
        assert_eq!(citations.len(), 3);
        // Over the count: the oldest context goes.
        citations.cite(&context("b", &[4]), 0, 600, mark);
        assert_eq!(citations.len(), 3);
        assert!(citations.changed(&[id(1)], 700, mark).is_empty());
        // Past the age: "a" (cited at 500) is forgotten at 1501, "b" (600) is not.
        let out = citations.changed(&[id(2), id(4)], 1501, mark);
        assert_eq!(
            out.iter().map(|i| i.query_id.as_str()).collect::<Vec<_>>(),
            vec!["b"]
        );
    }

    #[test]
    fn a_query_answered_again_replaces_its_citations() {
        let mut citations = Citations::new(60_000, 1000);
        citations.cite(&context("q1", &[1]), 0, 10, mark);
        citations.cite(&context("q1", &[2]), 0, 20, mark);
        assert_eq!(citations.len(), 1);
        assert!(citations.changed(&[id(1)], 30, mark).is_empty());
        assert_eq!(citations.changed(&[id(2)], 40, mark).len(), 1);
    }

    #[test]
    fn the_log_numbers_entries_and_answers_since() {
        let mut log = InvalidationLog::new(2);
        let entry = |q: &str| invalidation(q, "t", vec![id(1)], mark());
        assert_eq!(log.since(0), (vec![], 0, false));
        assert_eq!(log.push(entry("a")), 1);
        assert_eq!(log.push(entry("b")), 2);
        assert_eq!(log.push(entry("c")), 3);
        let (entries, next, truncated) = log.since(0);
        assert_eq!(
            entries.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![2, 3]
        );
        assert_eq!(next, 3);
        assert!(truncated, "entry 1 was dropped");
        let (entries, next, truncated) = log.since(2);
        assert_eq!(entries.len(), 1);
        assert_eq!((next, truncated), (3, false));
        assert_eq!(log.since(3), (vec![], 3, false));
    }
}
