//! Pack: the context of each ranked query, by mode: `bounded` packed into its token budget
//! (`ragstream_core::query::pack`), with surrogate tiers where configured; `deep`, `files` and the
//! SQL modes rendered. The lookups and shard errors are answered before the ranking steps
//! ([`super::lookup`]). The context is cached under the index generation its retrieval read.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use timely::dataflow::StreamVec;

use super::cache_lookup::cache_key;
use super::job::{now_micros, QueryServices, Reply, Working};
use crate::metrics::metrics;
use crate::stage::map_stage;
use crate::tokens::{Encoding, TokenCounter};
use ragstream_core::query::cache::LruTtl;
use ragstream_core::query::depth::results_wanted;
use ragstream_core::query::modes::{
    budget_for, max_new_tokens, rank_files, sql_table, FileKey, SQL_FULL_HINT_TOKENS,
};
use ragstream_core::query::pack::{pack, render_full, AnswerCue, PackRequest};
use ragstream_core::query::surrogate::{choose, SurrogatePolicy, SurrogateTier};
use ragstream_core::query::{Candidate, Context, GenerationMeta, Mode, Stage};

/// Extension trait: the `Pack` operator.
///
/// # Examples
///
/// Two ranked chunks packed into a budget of 200 tokens: each item is headed by its source, and the
/// context never holds more than the budget:
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use std::time::Duration;
/// use ragstream_core::query::cache::LruTtl;
/// use ragstream_operators::query::example::{gathered, hit, job, services};
/// use ragstream_operators::query::fuse::Fuse;
/// use ragstream_operators::query::pack::Pack;
/// use timely::dataflow::operators::capture::{Capture, Extract};
/// use timely::dataflow::operators::vec::{Map, ToStream};
///
/// let contexts = timely::example(|scope| {
///     let query = job(r#"{"query_id": "q1", "tenant": "t", "text": "tide pools", "token_budget": 200}"#);
///     let dense = vec![
///         hit("a", "Tide pools hold sea water at low tide.", 0.9, &[1.0, 0.0]),
///         hit("b", "Anemones and crabs live in tide pools.", 0.8, &[0.0, 1.0]),
///     ];
///     let cache = Arc::new(Mutex::new(LruTtl::new(16, Duration::from_secs(60))));
///     vec![gathered(query, dense, Vec::new())]
///         .to_stream(scope)
///         .fuse()
///         .pack(services(), cache)
///         .map(|(context, _reply)| (context.tokens_used, context.items.len(), context.context))
///         .capture()
/// });
/// let (tokens, items, text) = contexts.extract()[0].1[0].clone();
/// assert!(tokens <= 200);
/// assert_eq!(items, 2);
/// assert!(text.contains("Source: a.txt"), "{text}");
/// ```
pub trait Pack<'scope> {
    /// Packs (or renders, for the other modes) the context.
    fn pack(
        self,
        services: QueryServices,
        cache: Arc<Mutex<LruTtl<String, Context>>>,
    ) -> StreamVec<'scope, u64, (Context, Reply)>;
}

impl<'scope> Pack<'scope> for StreamVec<'scope, u64, Working> {
    fn pack(
        self,
        services: QueryServices,
        cache: Arc<Mutex<LruTtl<String, Context>>>,
    ) -> StreamVec<'scope, u64, (Context, Reply)> {
        map_stage(self, "Pack", move |mut working: Working| {
            let started = Instant::now();
            let context = answer(&mut working, &services);
            working.job.record(Stage::Pack, started);
            deliver(context, working, &cache)
        })
    }
}

/// The surrogate tier of each candidate (picked, then deferred) by the configured policy; empty when
/// the policy is disabled.
fn surrogate_tiers(
    working: &Working,
    services: &QueryServices,
    plan: Option<&ragstream_core::query::Plan>,
) -> Vec<(SurrogateTier, String)> {
    let config = &working.settings.pack.surrogates;
    if config.policy == SurrogatePolicy::Disabled {
        return Vec::new();
    }
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let entities: &[String] = plan.map_or(&[], |p| p.entities.as_slice());
    let access = services.access.lock().expect("access counts");
    working
        .candidates
        .iter()
        .chain(&working.deferred)
        .map(|c| {
            let importance = access.frequency(&working.job.query.tenant, &c.id());
            choose(config, &c.stored.chunk, now_ms, importance, entities)
        })
        .collect()
}

/// The context a query's answer starts from (its ids, mode, tokenizer, intent and weights, the
/// index watermark), its notes and the tokenizer it is counted with.
pub(super) fn begin(working: &mut Working, services: &QueryServices) -> Output {
    let job = &working.job;
    let query = &job.query;
    let encoding = query
        .tokenizer
        .as_deref()
        .and_then(Encoding::parse)
        .unwrap_or(services.encoding);
    let plan = job.plan.as_ref();
    let context = Context {
        query_id: query.query_id.clone(),
        tenant: query.tenant.clone(),
        mode: Some(query.mode),
        tokenizer: encoding.name().to_string(),
        intent: plan.map(|p| p.intent),
        weights: plan.map(|p| p.weights).unwrap_or_default(),
        index_watermark: job.watermark.clone(),
        chunks_available: working.available,
        probe: working.answer.probe.take(),
        ..Context::default()
    };
    Output {
        context,
        notes: working.job.notes.clone(),
        counter: TokenCounter::new(encoding),
    }
}

/// The context of a ranked query (a lookup or a shard's error that reaches Pack is answered as
/// [`super::lookup`] answers it).
fn answer(working: &mut Working, services: &QueryServices) -> Context {
    if !working.is_ranked() {
        return super::lookup::answer(working, services);
    }
    let mut output = begin(working, services);
    match working.job.query.mode {
        Mode::Deep => deep(working, &mut output),
        Mode::Files => files(working, &mut output),
        Mode::SqlCompact | Mode::SqlFull => sql(working, &mut output),
        // `bounded` (the lookup modes were answered above).
        _ => bounded(working, services, &mut output),
    }
    let Output { context, notes, .. } = output;
    finish(context, notes, working)
}

/// The context handed on: its latencies (the query's total among them), cached under the index
/// generation its retrieval read unless it is an error or an optional endpoint was out (the next
/// asker then gets the endpoint's answer once it is back).
pub(super) fn deliver(
    mut context: Context,
    working: Working,
    cache: &Mutex<LruTtl<String, Context>>,
) -> (Context, Reply) {
    context.latency_ms = working
        .job
        .latency
        .iter()
        .map(|(stage, ms)| (stage.as_str().to_string(), *ms))
        .collect();
    let total = now_micros().saturating_sub(working.job.arrived_us) as f64 / 1000.0;
    context.latency_ms.insert("total".into(), total);
    if context.error.is_none() && !working.job.degraded {
        cache.lock().expect("cache").put(
            cache_key(&working.job.query),
            context.clone(),
            working.job.generation,
        );
    }
    (context, working.job.reply)
}

/// The context being built, its notes and the tokenizer it is counted with.
pub(super) struct Output {
    pub(super) context: Context,
    pub(super) notes: Vec<String>,
    pub(super) counter: TokenCounter,
}

/// `bounded`: the candidates packed into the token budget.
fn bounded(working: &mut Working, services: &QueryServices, output: &mut Output) {
    let Output {
        context,
        notes,
        counter,
    } = output;
    let counter = *counter;
    let query = &working.job.query;
    let config = working.settings.as_ref();
    let plan = working.job.plan.as_ref();
    let (budget, window) = budget_for(
        query,
        counter,
        (&config.window, config.default_token_budget),
    );
    let neighbours = std::mem::take(&mut working.neighbours);
    let terms = plan.as_ref().map(|p| p.terms.clone()).unwrap_or_default();
    let tiers = surrogate_tiers(working, services, plan);
    let packed = pack(PackRequest {
        picked: &working.candidates,
        deferred: &working.deferred,
        neighbours: &neighbours,
        budget,
        counter,
        terms: &terms,
        cue: AnswerCue::of_question(&query.text),
        config: &config.pack,
        fill: query.fill,
        whole: query.return_full,
        floor: working.score_floor,
        tiers: &tiers,
    });
    context.token_budget = Some(budget);
    context.tokens_used = packed.tokens_used;
    context.truncated = packed.truncated;
    if let Some(note) = packed.note {
        notes.push(note);
    }
    if let Some(derived) = window {
        context.max_new_tokens = Some(max_new_tokens(
            derived.window,
            derived.prompt,
            packed.tokens_used,
            &config.window,
        ));
        context.base_tokens = Some(derived.prompt);
        context.generation_budget = Some(derived.reserve);
        context.meta = Some(GenerationMeta {
            context_window: derived.window,
            remaining: derived.window.saturating_sub(derived.prompt),
            reserve_from: derived.reserve_from,
            reserve_ratio: config.window.reserve_ratio,
            min_reserve: config.window.min_reserve,
            safety_margin: config.window.safety_margin,
            capped_by_token_budget: query.token_budget.filter(|cap| *cap == budget),
        });
    }
    if config.pack.surrogates.policy == SurrogatePolicy::Importance {
        services.access.lock().expect("access counts").record(
            &query.tenant,
            packed.items.iter().map(|i| i.chunk_id.as_str()),
        );
    }
    context.items = packed.items;
    context.context = packed.context;
    working.trace.decisions.extend(packed.decisions);
}

/// `deep`: full chunk texts, no budget.
fn deep(working: &Working, output: &mut Output) {
    let Output {
        context,
        notes,
        counter,
    } = output;
    let config = working.settings.as_ref();
    let items: Vec<(Candidate, String)> = working
        .candidates
        .iter()
        .map(|c| (c.clone(), c.stored.chunk.text.clone()))
        .collect();
    let (items, text, tokens) = render_full(&items, &config.pack, *counter);
    (context.items, context.context, context.tokens_used) = (items, text, tokens);
    notes.push(format!(
        "deep mode: no token budget; {} full chunks, {} tokens — check they fit your model's window",
        context.items.len(),
        context.tokens_used
    ));
}

/// `files`: files ranked by the concentration of chunk hits.
fn files(working: &Working, output: &mut Output) {
    let Output {
        context, counter, ..
    } = output;
    let k = results_wanted(&working.job.query, &working.settings);
    let key = working
        .job
        .query
        .file_key
        .as_deref()
        .and_then(|key| FileKey::parse(key).ok())
        .unwrap_or_default();
    context.sources = rank_files(&working.candidates, &working.answer.sources, k, &key);
    context.context = context
        .sources
        .iter()
        .map(|s| match (&s.group, s.documents) {
            (Some(group), Some(documents)) => format!(
                "{} ({} of {} chunks match, in {} documents; best {})",
                if group.is_empty() { "(none)" } else { group },
                s.hits.unwrap_or(0),
                s.chunks,
                documents,
                s.source
            ),
            _ => format!(
                "{} ({} of {} chunks match)",
                s.source,
                s.hits.unwrap_or(0),
                s.chunks
            ),
        })
        .collect::<Vec<_>>()
        .join("\n");
    context.tokens_used = counter.count(&context.context);
}

/// `sql_compact` and `sql_full`: schema tables rendered whole.
fn sql(working: &Working, output: &mut Output) {
    let Output {
        context,
        notes,
        counter,
    } = output;
    let query = &working.job.query;
    let config = working.settings.as_ref();
    let full = query.mode == Mode::SqlFull;
    let distributions = query.include_distributions.unwrap_or(full);
    let samples = query.include_samples.unwrap_or(full);
    let items: Vec<(Candidate, String)> = working
        .candidates
        .iter()
        .map(|c| {
            let text = sql_table(&c.stored.chunk.text, distributions, samples);
            (c.clone(), text)
        })
        .collect();
    let (items, text, tokens) = render_full(&items, &config.pack, *counter);
    (context.items, context.context, context.tokens_used) = (items, text, tokens);
    if query.mode == Mode::SqlFull && context.tokens_used > SQL_FULL_HINT_TOKENS {
        notes.push(format!(
            "sql_full used {} tokens; mode sql_compact returns names, row counts and column types only",
            context.tokens_used
        ));
    }
}

/// The counts, notes and trace every context ends with.
pub(super) fn finish(mut context: Context, notes: Vec<String>, working: &mut Working) -> Context {
    context.chunks_returned = context.items.len().max(context.sources.len());
    let files: std::collections::BTreeSet<&str> =
        context.items.iter().map(|i| i.source.as_str()).collect();
    context.unique_files = files.len();
    context.file_diversity_ratio = if context.items.is_empty() {
        0.0
    } else {
        files.len() as f32 / context.items.len() as f32
    };
    metrics().record_decisions(&working.trace.decisions);
    if !notes.is_empty() {
        context.note = Some(notes.join("; "));
    }
    if working.job.query.trace {
        let mut trace = std::mem::take(&mut working.trace);
        trace.signals = working
            .job
            .plan
            .as_ref()
            .map(|p| p.signals.clone())
            .unwrap_or_default();
        context.trace = Some(trace);
    }
    context
}
