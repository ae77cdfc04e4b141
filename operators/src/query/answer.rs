//! The query flow after the shards answered: Fuse, Rerank, Dedup, Mmr, Neighbours and Pack, one
//! extension trait ([`AnswerSteps`]) over the pure steps, and [`answer`], which builds a context.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use timely::container::CapacityContainerBuilder;
use timely::dataflow::channels::pact::{Exchange, Pipeline};
use timely::dataflow::operators::{Capability, Operator};
use timely::dataflow::StreamVec;

use super::adapt::adapt;
use super::cache::LruTtl;
use super::dedup::dedup;
use super::fuse::{attach_evidence, attach_vectors, fuse};
use super::mmr::{mmr, MmrConfig};
use super::modes::{
    budget_for, max_new_tokens, rank_files, sql_compact, sql_full, unknown_chunk,
    SQL_FULL_HINT_TOKENS,
};
use super::pack::{pack, render_full, AnswerCue, PackRequest};
use super::rerank::rerank;
use super::retrieve::results_wanted;
use super::surrogate::{choose, SurrogatePolicy, SurrogateTier};
use crate::stage::{flat_map_stage, map_stage};

use super::job::*;
use super::steps::*;
use super::{
    Action, Candidate, Cause, Context, Decision, Mode, QueryConfig, TraceCandidate, LIST_PAGE,
};
use crate::metrics::metrics;
use crate::store::{Bm25Encoder, SearchFilter, VectorStore};
use crate::tokens::{Encoding, TokenCounter};
use crate::wire::Wire;

/// Extension trait: the steps after the shards answered.
pub trait AnswerSteps<'scope> {
    /// Weighted reciprocal-rank fusion of the gathered lanes.
    fn fuse(self, config: Arc<QueryConfig>) -> StreamVec<'scope, u64, Working>;
    /// Answer-focused rerank of the top window.
    fn rerank(self, config: Arc<QueryConfig>) -> StreamVec<'scope, u64, Working>;
    /// Exact-duplicate removal (near-duplicates leave against each MMR pick).
    fn dedup(self) -> StreamVec<'scope, u64, Working>;
    /// MMR with per-document and per-section caps.
    fn mmr(self, config: Arc<QueryConfig>) -> StreamVec<'scope, u64, Working>;
    /// Fetches the neighbours of a bounded query's top candidate on the worker owning its shard (in
    /// this process or another of the cluster) and joins them back on the origin worker.
    fn neighbours(self, services: QueryServices) -> StreamVec<'scope, u64, Working>;
    /// Packs (or renders, for the other modes) the context.
    fn pack(
        self,
        services: QueryServices,
        cache: Arc<Mutex<LruTtl<String, Context>>>,
    ) -> StreamVec<'scope, u64, (Context, Reply)>;
}

fn ranked(working: &Working) -> bool {
    working.job.cached.is_none()
        && working.answer.error.is_none()
        && matches!(
            working.job.query.mode,
            Mode::Bounded | Mode::Deep | Mode::Files | Mode::SqlCompact | Mode::SqlFull
        )
}

fn step<'scope>(
    stream: StreamVec<'scope, u64, Working>,
    name: &'static str,
    mut logic: impl FnMut(&mut Working) + 'static,
) -> StreamVec<'scope, u64, Working> {
    map_stage(stream, name, move |mut working: Working| {
        if ranked(&working) {
            let started = Instant::now();
            logic(&mut working);
            working.job.record(&name.to_lowercase(), started);
        }
        working
    })
}

impl<'scope> AnswerSteps<'scope> for StreamVec<'scope, u64, Working> {
    fn fuse(self, config: Arc<QueryConfig>) -> StreamVec<'scope, u64, Working> {
        step(self, "Fuse", move |working| {
            if let Some(plan) = working.job.plan.as_mut().filter(|_| config.adapt_fusion) {
                if let Some(reason) = adapt(plan, &working.answer.dense) {
                    metrics()
                        .fusion_adapted
                        .with_label_values(&[plan.intent.as_str()])
                        .inc();
                    working.trace.decisions.push(Decision::new(
                        "",
                        Action::Adapted,
                        Cause::EvidenceRule,
                        reason,
                    ));
                }
            }
            let weights = working
                .job
                .plan
                .as_ref()
                .map(|p| p.weights)
                .unwrap_or_default();
            // The weights fusion uses, after any adaptation (the intent's preset where none).
            let m = metrics();
            m.fusion_weight
                .with_label_values(&["dense"])
                .observe(weights.dense as f64);
            m.fusion_weight
                .with_label_values(&["bm25"])
                .observe(weights.bm25 as f64);
            let (mut candidates, decisions) = fuse(
                std::mem::take(&mut working.answer.dense),
                std::mem::take(&mut working.answer.bm25),
                weights,
                config.rrf_k,
            );
            attach_vectors(&mut candidates, std::mem::take(&mut working.answer.vectors));
            attach_evidence(
                &mut candidates,
                std::mem::take(&mut working.answer.evidence),
            );
            working.available = candidates.len();
            working.candidates = candidates;
            working.trace.decisions.extend(decisions);
        })
    }

    fn rerank(self, config: Arc<QueryConfig>) -> StreamVec<'scope, u64, Working> {
        let bm25 = Bm25Encoder::default();
        step(self, "Rerank", move |working| {
            working.score_floor = match &working.job.plan {
                Some(plan) => rerank(&mut working.candidates, plan, &config.rerank, &bm25),
                None => working
                    .candidates
                    .iter()
                    .map(|c| c.score)
                    .fold(f32::INFINITY, f32::min),
            };
            if working.job.query.trace {
                working.trace.candidates = working
                    .candidates
                    .iter()
                    .map(TraceCandidate::from)
                    .collect();
            }
        })
    }

    fn dedup(self) -> StreamVec<'scope, u64, Working> {
        step(self, "Dedup", move |working| {
            let (kept, decisions) = dedup(std::mem::take(&mut working.candidates));
            working.candidates = kept;
            working.trace.decisions.extend(decisions);
        })
    }

    fn mmr(self, config: Arc<QueryConfig>) -> StreamVec<'scope, u64, Working> {
        step(self, "Mmr", move |working| {
            let query = &working.job.query;
            let k = results_wanted(query);
            match query.mode {
                Mode::Bounded | Mode::Deep => {
                    let caps = if query.mode == Mode::Deep {
                        (k, k)
                    } else {
                        (config.per_document_cap, config.per_section_cap)
                    };
                    let selection = mmr(
                        std::mem::take(&mut working.candidates),
                        k,
                        MmrConfig {
                            lambda: config.mmr_lambda,
                            per_document: caps.0,
                            per_section: caps.1,
                            near_duplicate: config.near_duplicate,
                        },
                    );
                    working.candidates = selection.picked;
                    working.deferred = selection.deferred;
                    working.trace.decisions.extend(selection.decisions);
                }
                Mode::SqlCompact | Mode::SqlFull => working.candidates.truncate(k),
                _ => {}
            }
        })
    }

    fn neighbours(self, services: QueryServices) -> StreamVec<'scope, u64, Working> {
        type Request = Wire<((usize, u64), crate::store::StoredChunk)>;
        type Answer = Wire<((usize, u64), Vec<crate::store::StoredChunk>)>;
        let wants = |working: &Working| {
            working.job.cached.is_none()
                && working.job.query.mode == Mode::Bounded
                && !working.candidates.is_empty()
        };
        let route = services.clone();
        let requests = flat_map_stage(
            self.clone(),
            "NeighbourRequests",
            move |working: Working| -> Option<Request> {
                wants(&working).then(|| {
                    let top = working.candidates[0].stored.clone();
                    Wire(((working.job.origin, working.job.id), top))
                })
            },
        );
        let fetch = services.clone();
        let worker_of =
            move |key: &crate::model::DocKey, origin: usize| route.owner_of(key, origin);
        let answers = requests.unary::<CapacityContainerBuilder<Vec<Answer>>, _, _, _>(
            Exchange::new(move |Wire(((origin, _), top)): &Request| {
                worker_of(&top.key, *origin) as u64
            }),
            "FetchNeighbours",
            move |_, _| {
                move |input, output| {
                    input.for_each(|cap, data| {
                        let mut session = output.session(&cap);
                        for Wire((id, top)) in data.drain(..) {
                            let owner = fetch.owner_of(&top.key, id.0);
                            let neighbours = match fetch.local_shard(owner) {
                                Some(shard) => neighbours_of(shard.as_ref(), &top),
                                None => Vec::new(),
                            };
                            session.give(Wire((id, neighbours)));
                        }
                    });
                }
            },
        );
        self.binary::<_, CapacityContainerBuilder<Vec<Working>>, _, _, _, _>(
            answers,
            Pipeline,
            Exchange::new(|Wire(((origin, _), _)): &Answer| *origin as u64),
            "Neighbours",
            move |_, _| {
                let mut waiting: HashMap<(usize, u64), (Capability<u64>, Working)> = HashMap::new();
                let mut arrived: HashMap<(usize, u64), Vec<crate::store::StoredChunk>> =
                    HashMap::new();
                move |working_input, answer_input, output| {
                    working_input.for_each(|cap, data| {
                        for mut working in data.drain(..) {
                            if !wants(&working) {
                                output.session(&cap).give(working);
                                continue;
                            }
                            let id = (working.job.origin, working.job.id);
                            match arrived.remove(&id) {
                                Some(neighbours) => {
                                    working.neighbours = neighbours;
                                    output.session(&cap).give(working);
                                }
                                None => {
                                    let retained = cap.retain_least(0).expect("time of the batch");
                                    waiting.insert(id, (retained, working));
                                }
                            }
                        }
                    });
                    answer_input.for_each(|_, data| {
                        for Wire((id, neighbours)) in data.drain(..) {
                            match waiting.remove(&id) {
                                Some((cap, mut working)) => {
                                    working.neighbours = neighbours;
                                    output.session(&cap).give(working);
                                }
                                None => {
                                    arrived.insert(id, neighbours);
                                }
                            }
                        }
                    });
                }
            },
        )
    }

    fn pack(
        self,
        services: QueryServices,
        cache: Arc<Mutex<LruTtl<String, Context>>>,
    ) -> StreamVec<'scope, u64, (Context, Reply)> {
        map_stage(self, "Pack", move |mut working: Working| {
            if let Some(cached) = working.job.cached.take() {
                metrics()
                    .queries
                    .with_label_values(&[working.job.query.mode.as_str(), "cached"])
                    .inc();
                return (*cached, working.job.reply);
            }
            let started = Instant::now();
            let mut context = answer(&mut working, &services);
            working.job.record("pack", started);
            context.latency_ms = working.job.latency.clone();
            let total = now_micros().saturating_sub(working.job.arrived_us) as f64 / 1000.0;
            context.latency_ms.insert("total".into(), total);
            // A context built while an optional endpoint was out is not kept: the next asker gets
            // the endpoint's answer once it is back.
            if context.error.is_none() && !working.job.degraded {
                cache.lock().expect("cache").put(
                    cache_key(&working.job.query),
                    context.clone(),
                    working.job.generation,
                );
            }
            (context, working.job.reply)
        })
    }
}

/// The surrogate tier of each candidate (picked, then deferred) by the configured policy; empty when
/// the policy is disabled.
fn surrogate_tiers(
    working: &Working,
    services: &QueryServices,
    plan: Option<&crate::query::Plan>,
) -> Vec<(SurrogateTier, String)> {
    let config = &services.config.pack.surrogates;
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

/// Builds the context of a gathered query (every mode).
fn answer(working: &mut Working, services: &QueryServices) -> Context {
    let job = &working.job;
    let query = &job.query;
    let encoding = query
        .tokenizer
        .as_deref()
        .and_then(Encoding::parse)
        .unwrap_or(services.encoding);
    let counter = TokenCounter::new(encoding);
    let plan = job.plan.clone();
    let mut context = Context {
        query_id: query.query_id.clone(),
        tenant: query.tenant.clone(),
        mode: query.mode.as_str().to_string(),
        tokenizer: encoding.name().to_string(),
        intent: plan.as_ref().map_or_else(String::new, |p| p.intent.clone()),
        weights: plan.as_ref().map(|p| p.weights).unwrap_or_default(),
        index_watermark: job.watermark.clone(),
        chunks_available: working.available,
        ..Context::default()
    };
    let mut notes = job.notes.clone();
    if let Some(error) = &working.answer.error {
        // A shard's error is a `StoreError`'s text: an outage, or a request the engine refused.
        let unavailable = error.starts_with("index unavailable");
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
        return finish(context, notes, working);
    }
    let k = results_wanted(query);
    match query.mode {
        Mode::Bounded => {
            let (budget, window) = budget_for(query, counter);
            let neighbours = std::mem::take(&mut working.neighbours);
            let terms = plan.as_ref().map(|p| p.terms.clone()).unwrap_or_default();
            let tiers = surrogate_tiers(working, services, plan.as_ref());
            let packed = pack(PackRequest {
                picked: &working.candidates,
                deferred: &working.deferred,
                neighbours: &neighbours,
                budget,
                counter,
                terms: &terms,
                cue: AnswerCue::of_question(&query.text),
                config: &services.config.pack,
                fill: query.fill,
                floor: working.score_floor,
                tiers: &tiers,
            });
            context.token_budget = Some(budget);
            context.tokens_used = packed.tokens_used;
            context.truncated = packed.truncated;
            if let Some(note) = packed.note {
                notes.push(note);
            }
            if let Some((window, prompt)) = window {
                context.max_new_tokens = Some(max_new_tokens(window, prompt, packed.tokens_used));
            }
            if services.config.pack.surrogates.policy == SurrogatePolicy::Importance {
                services.access.lock().expect("access counts").record(
                    &query.tenant,
                    packed.items.iter().map(|i| i.chunk_id.as_str()),
                );
            }
            context.items = packed.items;
            context.context = packed.context;
            working.trace.decisions.extend(packed.decisions);
        }
        Mode::Deep => {
            let items: Vec<(Candidate, String)> = working
                .candidates
                .iter()
                .map(|c| (c.clone(), c.stored.chunk.text.clone()))
                .collect();
            let (items, text, tokens) = render_full(&items, &services.config.pack, counter);
            (context.items, context.context, context.tokens_used) = (items, text, tokens);
            notes.push(format!(
                "deep mode: no token budget; {} full chunks, {} tokens — check they fit your model's window",
                context.items.len(),
                context.tokens_used
            ));
        }
        Mode::ReadChunk => match &working.answer.chunk {
            Some(stored) => {
                let candidate = Candidate::new(stored.clone());
                let (items, text, tokens) = render_full(
                    &[(candidate, stored.chunk.text.clone())],
                    &services.config.pack,
                    counter,
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
        },
        Mode::ListSources => {
            // The shards' pages merged, cut to one page; one more document means a next page.
            let page = super::retrieve::list_page(query);
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
        Mode::Files => {
            context.sources = rank_files(&working.candidates, &working.answer.sources, k);
            context.context = context
                .sources
                .iter()
                .map(|s| {
                    format!(
                        "{} ({} of {} chunks match)",
                        s.source,
                        s.hits.unwrap_or(0),
                        s.chunks
                    )
                })
                .collect::<Vec<_>>()
                .join("\n");
            context.tokens_used = counter.count(&context.context);
        }
        Mode::SqlCompact | Mode::SqlFull => {
            let render = if query.mode == Mode::SqlCompact {
                sql_compact
            } else {
                sql_full
            };
            let items: Vec<(Candidate, String)> = working
                .candidates
                .iter()
                .map(|c| (c.clone(), render(&c.stored.chunk.text)))
                .collect();
            let (items, text, tokens) = render_full(&items, &services.config.pack, counter);
            (context.items, context.context, context.tokens_used) = (items, text, tokens);
            if query.mode == Mode::SqlFull && context.tokens_used > SQL_FULL_HINT_TOKENS {
                notes.push(format!(
                    "sql_full used {} tokens; mode sql_compact returns names, row counts and column types only",
                    context.tokens_used
                ));
            }
        }
    }
    finish(context, notes, working)
}

fn finish(mut context: Context, notes: Vec<String>, working: &mut Working) -> Context {
    context.chunks_returned = context.items.len().max(context.sources.len());
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

/// Chunks of `top`'s document within 3 positions of it, from `shard` (the one holding it).
fn neighbours_of(
    shard: &dyn VectorStore,
    top: &crate::store::StoredChunk,
) -> Vec<crate::store::StoredChunk> {
    let filter = SearchFilter {
        tenant: Some(top.key.tenant.clone()),
        doc_ids: vec![top.key.doc_id.clone()],
        ..SearchFilter::default()
    };
    let order = top.chunk.order_index;
    let mut out = Vec::new();
    let _ = shard.scroll(&filter, &mut |stored| {
        if stored.chunk.order_index.abs_diff(order) <= 3 && stored.chunk.acl == top.chunk.acl {
            out.push(stored);
        }
    });
    out
}
