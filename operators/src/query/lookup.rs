//! Lookup: right after Gather, the queries that rank nothing leave the ranking chain and are
//! answered here: the lookup modes (`read_chunk`, `list_sources`, `index_stats`) and any query a
//! shard could not answer (its error context). The ranked queries go on to Fuse.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use timely::dataflow::operators::OkErr;
use timely::dataflow::StreamVec;

use super::job::{QueryServices, Reply, Working};
use super::pack::{begin, deliver, finish, Output};
use crate::stage::map_stage;
use ragstream_core::query::cache::LruTtl;
use ragstream_core::query::modes::unknown_chunk;
use ragstream_core::query::pack::render_full;
use ragstream_core::query::{Candidate, Context, Mode, Stage, LIST_PAGE};

/// The ranked queries, which go on to Fuse, and the contexts Lookup answered.
pub type Routed<'scope> = (
    StreamVec<'scope, u64, Working>,
    StreamVec<'scope, u64, (Context, Reply)>,
);

/// Extension trait: the `Lookup` operator.
///
/// # Examples
///
/// A `list_sources` query leaves with its page of documents; a bounded one goes on to be ranked:
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use std::time::Duration;
/// use ragstream_core::query::cache::LruTtl;
/// use ragstream_core::query::SourceEntry;
/// use ragstream_operators::query::example::{gathered, hit, job, services};
/// use ragstream_operators::query::lookup::Lookup;
/// use timely::dataflow::operators::capture::{Capture, Extract};
/// use timely::dataflow::operators::vec::{Map, ToStream};
///
/// let (ranked, answered) = timely::example(|scope| {
///     let mut listing = gathered(
///         job(r#"{"query_id": "q1", "tenant": "t", "mode": "list_sources"}"#),
///         Vec::new(),
///         Vec::new(),
///     );
///     listing.answer.sources.push(SourceEntry {
///         doc_id: "a".into(),
///         source: "a.txt".into(),
///         title: "Tide pools".into(),
///         chunks: 3,
///         hits: None,
///         score: None,
///         group: None,
///         documents: None,
///     });
///     let bounded = gathered(
///         job(r#"{"query_id": "q2", "tenant": "t", "text": "tide pools"}"#),
///         vec![hit("a", "Tide pools hold sea water at low tide.", 0.9, &[1.0, 0.0])],
///         Vec::new(),
///     );
///     let cache = Arc::new(Mutex::new(LruTtl::new(16, Duration::from_secs(60))));
///     let (ranked, answered) = vec![listing, bounded]
///         .to_stream(scope)
///         .lookup(services(), cache);
///     (
///         ranked.map(|working| working.job.query.query_id).capture(),
///         answered.map(|(context, _)| (context.query_id, context.context)).capture(),
///     )
/// });
/// assert_eq!(ranked.extract()[0].1, ["q2"]);
/// let answered = answered.extract()[0].1.clone();
/// assert_eq!(answered, [("q1".to_string(), "a.txt — Tide pools (3 chunks)".to_string())]);
/// ```
pub trait Lookup<'scope> {
    /// Answers the lookups and the shards' errors; returns the ranked queries and those answers.
    fn lookup(
        self,
        services: QueryServices,
        cache: Arc<Mutex<LruTtl<String, Context>>>,
    ) -> Routed<'scope>;
}

impl<'scope> Lookup<'scope> for StreamVec<'scope, u64, Working> {
    // The `Err` side is an answered context flowing on as data, not an error path.
    #[allow(clippy::result_large_err)]
    fn lookup(
        self,
        services: QueryServices,
        cache: Arc<Mutex<LruTtl<String, Context>>>,
    ) -> Routed<'scope> {
        map_stage(self, "Lookup", move |mut working: Working| {
            if working.is_ranked() {
                return Ok(working);
            }
            let started = Instant::now();
            let context = answer(&mut working, &services);
            working.job.record(Stage::Lookup, started);
            Err(deliver(context, working, &cache))
        })
        .ok_err(|result| result)
    }
}

/// The context of a lookup, or of a query a shard could not answer.
pub(super) fn answer(working: &mut Working, services: &QueryServices) -> Context {
    let mut output = begin(working, services);
    if let Some(error) = &working.answer.error {
        // A shard's error is a `StoreError`'s text: an outage, or a request the engine refused.
        let unavailable = error.starts_with("index unavailable");
        let context = &mut output.context;
        context.error = Some(if unavailable {
            error.clone()
        } else {
            format!("the index could not answer: {error}")
        });
        context.error_type = Some(
            if unavailable {
                "index_unavailable"
            } else {
                "index_refused"
            }
            .into(),
        );
    } else {
        match working.job.query.mode {
            Mode::ReadChunk => read_chunk(working, &mut output),
            Mode::ListSources => list_sources(working, &mut output),
            Mode::IndexStats => index_stats(working, &mut output),
            // A ranked mode reaches Lookup only through a shard's error, answered above.
            _ => {}
        }
    }
    let Output { context, notes, .. } = output;
    finish(context, notes, working)
}

/// `read_chunk`: one chunk's full text, or an error naming the tenant's documents.
fn read_chunk(working: &Working, output: &mut Output) {
    let Output {
        context, counter, ..
    } = output;
    let query = &working.job.query;
    let config = working.settings.as_ref();
    match &working.answer.chunk {
        Some(stored) => {
            let candidate = Candidate::new(stored.clone());
            let (items, text, tokens) = render_full(
                &[(candidate, stored.chunk.text.clone())],
                &config.pack,
                *counter,
            );
            (context.items, context.context, context.tokens_used) = (items, text, tokens);
            context.chunks_available = 1;
        }
        None => {
            let mut sources = working.answer.sources.clone();
            context.error = Some(unknown_chunk(query.text.trim(), &sources));
            context.error_type = Some("unknown_chunk".into());
            sources.truncate(LIST_PAGE);
            context.sources = sources;
        }
    }
}

/// `list_sources`: one page of the tenant's documents.
fn list_sources(working: &Working, output: &mut Output) {
    let Output {
        context, counter, ..
    } = output;
    let query = &working.job.query;
    // The shards' pages merged, cut to one page; one more document means a next page.
    let page = super::search::list_page(query);
    context.sources = working.answer.sources.clone();
    if context.sources.len() > page {
        context.sources.truncate(page);
        context.next_cursor = context.sources.last().map(|s| s.doc_id.clone());
    }
    context.chunks_available = context.sources.iter().map(|s| s.chunks).sum();
    context.context = context
        .sources
        .iter()
        .map(|s| format!("{} — {} ({} chunks)", s.source, s.title, s.chunks))
        .collect::<Vec<_>>()
        .join("\n");
    context.tokens_used = counter.count(&context.context);
}

/// `index_stats`: the shards' counts, and a line saying them.
fn index_stats(working: &Working, output: &mut Output) {
    let Output {
        context, counter, ..
    } = output;
    let stats = working.answer.stats.clone().unwrap_or_default();
    context.chunks_available = stats.chunks;
    let kinds: Vec<String> = stats
        .chunks_by_kind
        .iter()
        .filter(|(_, chunks)| **chunks > 0)
        .map(|(kind, chunks)| format!("{kind} {chunks}"))
        .collect();
    context.context = format!(
        "{} chunks ({}) on {} shard(s), {} index",
        stats.chunks,
        if kinds.is_empty() {
            "none".to_string()
        } else {
            kinds.join(", ")
        },
        stats.shards,
        stats.backend
    );
    context.tokens_used = counter.count(&context.context);
    context.index_stats = Some(stats);
}
