//! `ragstream eval`: retrieval and packing quality on a BEIR-layout dataset, through the real job.
//!
//! 1. The corpus is indexed by the real ingest flow (JSONL events → chunk → embed → index), into an
//!    index directory that later runs reuse: documents already indexed at the same version are skipped
//!    by the version guard, unchanged chunks are never re-embedded.
//! 2. Every query goes through the real query flow of the running job (the same ingress as
//!    `POST /v1/query`): intent, both lanes, fusion, rerank, dedup, MMR, packing.
//! 3. Reported, side by side with a naive baseline computed in the same run (dense top-k, budget by
//!    characters ÷ 4, no dedup, MMR or rerank; its ranking is the first ten distinct documents of the
//!    dense lane, as the job's ranking counts a document once):
//!    - with qrels: nDCG@10 and Recall@10 / Recall@pool over the ranked documents (the trace's candidates
//!      after fusion and rerank);
//!    - with answer strings: Answer Recall@Budget (an answer string occurs in the packed context);
//!    - redundancy ratio (packed item tokens ÷ tokens of their distinct sentences), garbage fraction
//!      (share of packed item tokens from non-relevant documents), budget overruns, latency percentiles.
//!    - each question is asked at each budget twice: as the job answers by default (evidence stop,
//!      `by_budget`) and with `fill: true` (packed to the budget, `by_budget_fill`), each with its
//!      round trips (`round_trip_ms`; `--concurrency 1` for one client's) and the median of each of
//!      the job's stages (`stage_p50_ms`).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use ragstream_core::query::Context;
use ragstream_operators::metrics::metrics;
use ragstream_operators::store::{SearchFilter, SearchVector};
use ragstream_operators::tokens::{Encoding, TokenCounter};
use ragstream_topologies::config::{Config, IndexKind, SourceKind};
use serde_json::{json, Value};

/// Chunks the dense-only baseline reads for its ranking: its nDCG@10 and Recall@10 are over the
/// first ten distinct documents of these (a document of several chunks takes one place, as in the
/// job's ranking), not over the documents of the top ten chunks.
const NAIVE_RANKING_DEPTH: usize = 4 * ragstream_core::query::DEFAULT_K;

/// Arguments of `ragstream eval`.
pub struct EvalArgs {
    /// `squad`, `scifact` or `cosqa` (a directory under `data`).
    pub dataset: String,
    /// The document kind the corpus is indexed as (default: the dataset's own, `code` for CoSQA).
    pub kind: Option<String>,
    /// The BEIR data root.
    pub data: PathBuf,
    /// Index directory (reused across runs; with `index_url` only its events and config files).
    pub index: PathBuf,
    /// A Qdrant server's gRPC URL to index into instead of the directory (collection
    /// `eval_<tenant>`).
    pub index_url: Option<String>,
    /// Use only the first N queries.
    pub limit: Option<usize>,
    /// Index only the first N documents of the corpus and those judged relevant to the questions
    /// asked (a quick run; its figures are not the whole corpus's).
    pub corpus_limit: Option<usize>,
    /// Budgets for Answer Recall@Budget.
    pub budgets: Vec<usize>,
    /// Queries in flight at once.
    pub concurrency: usize,
    /// Where to write one line per question and budget (JSONL), if anywhere.
    pub details: Option<PathBuf>,
    /// Extra configuration (TOML lines appended to the job's), e.g. `[query]\nadapt_fusion = false`.
    pub config_extra: String,
    /// The retrieval preset every question names (`fast`, `conservative`, …; none: the job's
    /// `[query]` section).
    pub preset: Option<String>,
}

mod dataset;
mod measures;

use dataset::*;
use measures::*;

fn wait_indexed(
    expected_events: u64,
    started_events: u64,
    running: &crate::runtime::Running,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(6 * 3600);
    loop {
        let seen = metrics().source_events.get().saturating_sub(started_events);
        if seen >= expected_events && metrics().in_flight_messages.get() == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("indexing did not finish");
        }
        if !running.is_running() {
            bail!("the job stopped while indexing (see its log above)");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The job running on the indexed corpus, and what indexing it took.
struct Indexed {
    running: crate::runtime::Running,
    /// The embedder of the naive baseline (the job's own model, outside the job).
    baseline_embedder: Box<dyn ragstream_operators::embed::Embedder>,
    counter: TokenCounter,
    documents: usize,
    seconds: f64,
    chunks_written: u64,
}

/// Step 1: writes the corpus as document events and starts the job on them (the real ingest flow:
/// chunk, embed, index), until every event is indexed.
fn index(
    args: &EvalArgs,
    data: &Dataset,
    kind: &str,
    queries: &[EvalQuery],
) -> anyhow::Result<Indexed> {
    std::fs::create_dir_all(&args.index)
        .with_context(|| format!("creating {}", args.index.display()))?;
    let events_path = args
        .index
        .with_extension(format!("{}.events.jsonl", data.tenant));
    let judged: std::collections::BTreeSet<String> = queries
        .iter()
        .flat_map(|(_, _, _, relevant)| relevant.keys().cloned())
        .collect();
    let sample = args.corpus_limit.map(|first| (first, &judged));
    let documents = write_events(
        &data.corpus,
        &data.tenant,
        (kind, data.extension),
        sample,
        &events_path,
    )?;
    let config_path = args.index.with_extension("eval.toml");
    let index_section = match &args.index_url {
        Some(url) => format!(
            "kind = \"server\"\nurl = {url:?}\ncollection = \"eval_{}\"",
            data.tenant
        ),
        None => format!(
            "kind = \"edge\"\npath = {:?}",
            args.index.display().to_string()
        ),
    };
    std::fs::write(&config_path, format!(
        "[source]\nkind = \"jsonl\"\npath = {:?}\n[index]\n{index_section}\n[http]\nlisten = \"127.0.0.1:0\"\n[runtime]\nworkers = 1\nserve = true\ndlq_path = {:?}\n{}\n",
        events_path.display().to_string(),
        args.index.with_extension("dlq.jsonl").display().to_string(),
        args.config_extra,
    ))?;
    let config = Config::load(&config_path)?;
    assert_eq!(config.source.kind, SourceKind::Jsonl);
    let backend = if args.index_url.is_some() {
        IndexKind::Server
    } else {
        IndexKind::Edge
    };
    assert_eq!(config.index.kind, backend);
    let encoding = Encoding::parse(&config.chunking.tokenizer).expect("validated");
    let started_events = metrics().source_events.get();
    let upserted_before = metrics().chunks_upserted.get();
    let started = Instant::now();
    let baseline_embedder = ragstream_topologies::factory::embedder(&config)?;
    let running = crate::runtime::start(config)?;
    wait_indexed(documents as u64, started_events, &running)?;
    let seconds = started.elapsed().as_secs_f64();
    let chunks_written = metrics().chunks_upserted.get() - upserted_before;
    eprintln!(
        "indexed {documents} documents ({chunks_written} chunks written this run) in {seconds:.1} s; job at http://{}",
        running.address
    );
    Ok(Indexed {
        running,
        baseline_embedder,
        counter: TokenCounter::new(encoding),
        documents,
        seconds,
        chunks_written,
    })
}

/// The contexts of step 2, by (question, slot): slot `b` is budget `b` as the job answers by default,
/// slot `b + budgets` the same budget with `fill: true`; each with its round trip (ms).
type Contexts = HashMap<(usize, usize), (Context, f64)>;

/// Step 2: every question at every budget, default and filled, through the real query flow (the
/// ingress of `POST /v1/query`), `concurrency` at a time; answers the contexts, the requests made and
/// the seconds they took.
fn ask(
    running: &crate::runtime::Running,
    tenant: &str,
    queries: &[EvalQuery],
    (budgets, preset): (&[usize], Option<&str>),
    concurrency: usize,
) -> anyhow::Result<(Contexts, usize, f64)> {
    let mut requests: Vec<(usize, usize, Vec<u8>)> = Vec::new();
    for (qi, (id, text, _, _)) in queries.iter().enumerate() {
        for (bi, budget) in budgets.iter().enumerate() {
            for fill in [false, true] {
                let mut body = json!({
                    "query_id": format!("{id}@{budget}{}", if fill { "+fill" } else { "" }),
                    "tenant": tenant,
                    "text": text,
                    "token_budget": budget,
                    "trace": true,
                    "fill": fill,
                });
                if let Some(preset) = preset {
                    body["preset"] = json!(preset);
                }
                let slot = if fill { bi + budgets.len() } else { bi };
                requests.push((qi, slot, body.to_string().into_bytes()));
            }
        }
    }
    let mut contexts = Contexts::new();
    let started = Instant::now();
    let mut in_flight = std::collections::VecDeque::new();
    let mut next = 0;
    while next < requests.len() || !in_flight.is_empty() {
        while next < requests.len() && in_flight.len() < concurrency {
            let (qi, bi, body) = requests[next].clone();
            let (_, receiver) = running.ingress.submit(body);
            in_flight.push_back((qi, bi, receiver, Instant::now()));
            next += 1;
        }
        let (qi, bi, receiver, sent) = in_flight.pop_front().expect("in flight");
        let context = await_context(running, &receiver, qi, sent)?;
        if let Some(error) = &context.error {
            bail!("query {} failed: {error}", context.query_id);
        }
        contexts.insert((qi, bi), (context, sent.elapsed().as_secs_f64() * 1000.0));
        if contexts.len().is_multiple_of(500) {
            eprintln!("{} / {} contexts", contexts.len(), requests.len());
        }
    }
    Ok((contexts, requests.len(), started.elapsed().as_secs_f64()))
}

/// Waits up to 120 s for question `qi`'s context, but not for a job that stopped (a worker that
/// panicked answers nothing).
fn await_context(
    running: &crate::runtime::Running,
    receiver: &mpsc::Receiver<Context>,
    qi: usize,
    sent: Instant,
) -> anyhow::Result<Context> {
    loop {
        match receiver.recv_timeout(Duration::from_secs(1)) {
            Ok(context) => return Ok(context),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                bail!("the job stopped before answering query {qi}")
            }
            Err(mpsc::RecvTimeoutError::Timeout) if !running.is_running() => {
                bail!("the job stopped before answering query {qi} (see its log above)")
            }
            Err(mpsc::RecvTimeoutError::Timeout) if sent.elapsed() > Duration::from_secs(120) => {
                bail!("no context for query {qi} within 120 s")
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
}

/// The naive baseline's answers, per question: its ranked documents, the chunks it packs (the top
/// k, as document and text) and its latency (ms).
struct Naive {
    ranked: Vec<Vec<String>>,
    items: Vec<Vec<(String, String)>>,
    latency: Vec<f64>,
}

/// Step 3: the naive baseline in the same run: dense top-k from the job's shard, nothing else.
fn naive_baseline(
    indexed: &mut Indexed,
    tenant: &str,
    queries: &[EvalQuery],
) -> anyhow::Result<Naive> {
    let shard = indexed.running.shards[0].clone();
    let filter = SearchFilter {
        tenant: Some(tenant.to_string()),
        ..SearchFilter::default()
    };
    let mut naive = Naive {
        ranked: Vec::new(),
        items: Vec::new(),
        latency: Vec::new(),
    };
    for chunk in queries.chunks(64) {
        let texts: Vec<&str> = chunk.iter().map(|q| q.1.as_str()).collect();
        let started = Instant::now();
        let vectors = indexed.baseline_embedder.embed(&texts)?;
        let per_query = started.elapsed().as_secs_f64() * 1000.0 / texts.len() as f64;
        for vector in vectors {
            let started = Instant::now();
            // Deep enough for ten distinct documents where a document has several chunks; the
            // naive context packs the top k chunks, as a plain top-k retriever would.
            let hits = shard.search(
                &SearchVector::Dense(vector),
                &filter,
                NAIVE_RANKING_DEPTH,
                None,
            )?;
            naive
                .latency
                .push(per_query + started.elapsed().as_secs_f64() * 1000.0);
            naive
                .ranked
                .push(hits.iter().map(|h| h.stored.key.doc_id.clone()).collect());
            naive.items.push(
                hits.iter()
                    .take(ragstream_core::query::DEFAULT_K)
                    .map(|h| (h.stored.key.doc_id.clone(), h.stored.chunk.text.clone()))
                    .collect(),
            );
        }
    }
    Ok(naive)
}

/// Each document once, in the order first seen.
fn distinct_in_order<'a>(docs: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    let mut distinct: Vec<String> = Vec::new();
    for doc in docs {
        if !distinct.contains(doc) {
            distinct.push(doc.clone());
        }
    }
    distinct
}

/// Step 4a: ranking measures over the documents in the order the job ranked them (the trace's
/// candidates) and the baseline's (SQuAD: the gold paragraph is the one relevant document).
fn ranking_scores(
    queries: &[EvalQuery],
    contexts: &Contexts,
    naive_ranked: &[Vec<String>],
    ragstream: &mut Value,
    naive: &mut Value,
) {
    let (mut ndcg, mut r10, mut rpool, mut naive_ndcg, mut naive_r10) = (0.0, 0.0, 0.0, 0.0, 0.0);
    let (mut r1, mut r3) = (0.0, 0.0);
    let mut by_intent: BTreeMap<String, (usize, f64)> = BTreeMap::new();
    for (qi, (_, _, _, relevant)) in queries.iter().enumerate() {
        let (context, _) = &contexts[&(qi, 0)];
        let ranked = distinct_in_order(
            context
                .trace
                .as_ref()
                .map(|t| t.candidates.as_slice())
                .unwrap_or_default()
                .iter()
                .map(|candidate| &candidate.doc_id),
        );
        let query_ndcg = ndcg_at(&ranked, relevant, 10);
        ndcg += query_ndcg;
        let entry = by_intent
            .entry(context.intent_name().to_string())
            .or_default();
        entry.0 += 1;
        entry.1 += query_ndcg;
        r10 += recall_at(&ranked, relevant, 10);
        r1 += recall_at(&ranked, relevant, 1);
        r3 += recall_at(&ranked, relevant, 3);
        rpool += recall_at(&ranked, relevant, ranked.len());
        let naive_docs = distinct_in_order(&naive_ranked[qi]);
        naive_ndcg += ndcg_at(&naive_docs, relevant, 10);
        naive_r10 += recall_at(&naive_docs, relevant, 10);
    }
    let n = queries.len().max(1) as f64;
    ragstream["ndcg_at_10"] = json!(ndcg / n);
    ragstream["recall_at_10"] = json!(r10 / n);
    ragstream["recall_at_1"] = json!(r1 / n);
    ragstream["recall_at_3"] = json!(r3 / n);
    ragstream["recall_at_pool"] = json!(rpool / n);
    ragstream["ndcg_at_10_by_intent"] = by_intent
        .into_iter()
        .map(|(intent, (count, sum))| {
            (
                intent,
                json!({"queries": count, "ndcg_at_10": sum / count as f64}),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into();
    naive["ndcg_at_10"] = json!(naive_ndcg / n);
    naive["recall_at_10"] = json!(naive_r10 / n);
}

/// The naive context of one question at `budget`: whole chunks while characters ÷ 4 stay within it.
fn naive_context(items: &[(String, String)], budget: usize) -> (Vec<(String, String)>, String) {
    let mut chars = 0;
    let mut kept = Vec::new();
    for (doc, text) in items {
        if (chars + text.len()) / 4 > budget {
            break;
        }
        chars += text.len() + 2;
        kept.push((doc.clone(), text.clone()));
    }
    let context = kept
        .iter()
        .map(|(_, t)| t.as_str())
        .collect::<Vec<_>>()
        .join("\n\n");
    (kept, context)
}

/// Step 4b: the packing measures and round trips at each budget (`by_budget`, `by_budget_fill`, and
/// the baseline's `by_budget`); answers the detail lines when they are asked for.
#[allow(clippy::too_many_arguments)]
fn budget_scores(
    queries: &[EvalQuery],
    budgets: &[usize],
    contexts: &Contexts,
    naive_items: &[Vec<(String, String)>],
    (counter, by_lines, with_answers): (TokenCounter, bool, bool),
    details: bool,
    ragstream: &mut Value,
    naive: &mut Value,
) -> String {
    let mut by_budget = serde_json::Map::new();
    let mut by_budget_fill = serde_json::Map::new();
    let mut naive_by_budget = serde_json::Map::new();
    let mut lines = String::new();
    for (bi, &budget) in budgets.iter().enumerate() {
        let tally = || Tally {
            by_lines,
            ..Tally::default()
        };
        let (mut ours, mut filled, mut theirs) = (tally(), tally(), tally());
        let (mut ours_ms, mut filled_ms) = (Vec::new(), Vec::new());
        let (mut ours_stages, mut filled_stages) = (BTreeMap::new(), BTreeMap::new());
        for (qi, (_, _, answers, relevant)) in queries.iter().enumerate() {
            let (context, ms) = &contexts[&(qi, bi)];
            ours_ms.push(*ms);
            filled_ms.push(contexts[&(qi, bi + budgets.len())].1);
            for (stages, context) in [
                (&mut ours_stages, context),
                (&mut filled_stages, &contexts[&(qi, bi + budgets.len())].0),
            ] {
                for (stage, ms) in &context.latency_ms {
                    stages
                        .entry(stage.clone())
                        .or_insert_with(Vec::new)
                        .push(*ms);
                }
            }
            for (tally, context) in [
                (&mut ours, context),
                (&mut filled, &contexts[&(qi, bi + budgets.len())].0),
            ] {
                let items: Vec<(String, String)> = context
                    .items
                    .iter()
                    .map(|i| (i.doc_id.clone(), i.text.clone()))
                    .collect();
                tally.add(
                    &items,
                    &context.context,
                    context.tokens_used,
                    budget,
                    relevant,
                    answers,
                    counter,
                );
            }
            if details {
                lines.push_str(&detail_line(&queries[qi], budget, context));
            }
            let (kept, naive_context) = naive_context(&naive_items[qi], budget);
            let naive_tokens = counter.count(&naive_context);
            theirs.add(
                &kept,
                &naive_context,
                naive_tokens,
                budget,
                relevant,
                answers,
                counter,
            );
        }
        let mut report = ours.report(with_answers);
        report["round_trip_ms"] = latency_summary(ours_ms);
        report["stage_p50_ms"] = stage_medians(ours_stages);
        by_budget.insert(budget.to_string(), report);
        let mut report = filled.report(with_answers);
        report["round_trip_ms"] = latency_summary(filled_ms);
        report["stage_p50_ms"] = stage_medians(filled_stages);
        by_budget_fill.insert(budget.to_string(), report);
        naive_by_budget.insert(budget.to_string(), theirs.report(with_answers));
    }
    ragstream["by_budget"] = Value::Object(by_budget);
    ragstream["by_budget_fill"] = Value::Object(by_budget_fill);
    naive["by_budget"] = Value::Object(naive_by_budget);
    lines
}

/// The median of each stage's milliseconds (the job's `latency_ms`).
fn stage_medians(stages: BTreeMap<String, Vec<f64>>) -> Value {
    stages
        .into_iter()
        .map(|(stage, ms)| (stage, latency_summary(ms)["p50_ms"].clone()))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Round-trip and per-stage latency of the default contexts (the `fill` ones are the same queries
/// again), and how many questions took each intent.
fn latency_and_intents(queries: &[EvalQuery], budgets: &[usize], contexts: &Contexts) -> Value {
    let mut stage_latency: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut round_trip = Vec::new();
    for ((_, slot), (context, latency)) in contexts {
        if *slot >= budgets.len() {
            continue;
        }
        round_trip.push(*latency);
        for (stage, ms) in &context.latency_ms {
            stage_latency.entry(stage.clone()).or_default().push(*ms);
        }
    }
    let mut intents: BTreeMap<String, usize> = BTreeMap::new();
    for (qi, _) in queries.iter().enumerate() {
        if let Some((context, _)) = contexts.get(&(qi, 0)) {
            *intents
                .entry(context.intent_name().to_string())
                .or_default() += 1;
        }
    }
    json!({
        "latency_round_trip": latency_summary(round_trip),
        "latency_stages": stage_latency.into_iter().map(|(k, v)| (k, latency_summary(v))).collect::<serde_json::Map<_, _>>(),
        "intents": intents,
    })
}

/// Runs the evaluation; returns the report.
pub fn eval(args: EvalArgs) -> anyhow::Result<Value> {
    let data = dataset(&args)?;
    let mut queries = data.queries.clone();
    if let Some(limit) = args.limit {
        queries.truncate(limit);
    }
    let kind = args.kind.as_deref().unwrap_or(data.kind).to_string();
    let mut indexed = index(&args, &data, &kind, &queries)?;
    // SQuAD is measured by answers at each budget; the qrels sets by ranking, at the default budget.
    let qrels_mode = data.tenant != "squad";
    let budgets = match qrels_mode {
        true => vec![ragstream_core::query::DEFAULT_BUDGET],
        false => args.budgets.clone(),
    };
    let (contexts, requests, query_seconds) = ask(
        &indexed.running,
        &data.tenant,
        &queries,
        (&budgets, args.preset.as_deref()),
        args.concurrency,
    )?;
    let baseline = naive_baseline(&mut indexed, &data.tenant, &queries)?;
    let mut report = json!({
        "dataset": args.dataset,
        "kind": kind,
        "index": if args.index_url.is_some() { "qdrant server" } else { "embedded" },
        "config_extra": args.config_extra,
        "preset": args.preset,
        "documents": indexed.documents,
        "corpus_limit": args.corpus_limit,
        "queries": queries.len(),
        "index_seconds": indexed.seconds,
        "chunks_written_this_run": indexed.chunks_written,
        "query_seconds": query_seconds,
        "queries_per_second": requests as f64 / query_seconds.max(1e-9),
    });
    let mut ragstream = latency_and_intents(&queries, &budgets, &contexts);
    let mut naive = json!({ "latency": latency_summary(baseline.latency) });
    ranking_scores(
        &queries,
        &contexts,
        &baseline.ranked,
        &mut ragstream,
        &mut naive,
    );
    let details = budget_scores(
        &queries,
        &budgets,
        &contexts,
        &baseline.items,
        (indexed.counter, kind == "code", !qrels_mode),
        args.details.is_some(),
        &mut ragstream,
        &mut naive,
    );
    if let Some(path) = &args.details {
        std::fs::write(path, details).with_context(|| format!("writing {}", path.display()))?;
    }
    report["ragstream"] = ragstream;
    report["naive_dense_topk"] = naive;
    indexed
        .running
        .shutdown
        .store(true, std::sync::atomic::Ordering::SeqCst);
    indexed.running.join()?;
    Ok(report)
}
