//! `ragstream bench standing`: standing queries while a corpus streams in, and many held idle.
//!
//! The job in this process on its embedded default (a watched directory holding one seed document,
//! the local model, a fresh embedded index, documents posted over HTTP). With `--subscriptions N`
//! (N > 0), N questions of the question file (spread evenly over it) subscribe first, on the empty
//! index; then the corpus is posted at full speed (`--posters` clients, `--batch` documents a
//! request, each answered once indexed) and the ingest throughput measured; then the job is left
//! to settle and a sample of subscriptions is compared with one-shot answers. With `--idle M`,
//! M more subscriptions are then made and held: the memory they take, and what one unrelated
//! upsert costs them. `--subscriptions 0` is the baseline (the same corpus, nothing subscribed):
//! `bench/standing.sh` runs both and reports the ratio.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ragstream_operators::metrics::{metrics, quantile, Moved};
use serde_json::{json, Value};

use crate::bench::{
    get_json as get, latency_summary, local_job, post_json as post, read_jsonl_lines,
};

/// Arguments of `bench standing`.
#[derive(clap::Args, Debug)]
pub struct StandingBench {
    /// The corpus (BEIR `{_id, title, text}` lines).
    #[arg(long, default_value = "../shared/data/squad-v1.1/corpus.jsonl")]
    pub corpus: std::path::PathBuf,
    /// The questions (`{text}` lines).
    #[arg(long, default_value = "../shared/data/squad-v1.1/questions.jsonl")]
    pub questions: std::path::PathBuf,
    /// Standing queries held while the corpus streams in (0: the baseline).
    #[arg(long, default_value_t = 1000)]
    pub subscriptions: usize,
    /// Standing queries made afterwards and held idle (0: none).
    #[arg(long, default_value_t = 0)]
    pub idle: usize,
    /// Documents a request.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Clients posting the corpus at once.
    #[arg(long, default_value_t = 2)]
    pub posters: usize,
    /// Subscriptions compared with one-shot answers once the job is quiet.
    #[arg(long, default_value_t = 100)]
    pub sample: usize,
}

/// This process's resident memory, MiB.
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// The items (chunk id, tokens) of a context, in order.
fn items(context: &Value) -> Vec<(String, u64)> {
    context["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|item| {
                    (
                        item["chunk_id"].as_str().unwrap_or_default().to_string(),
                        item["tokens"].as_u64().unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Makes the subscriptions of `questions` from `clients` threads; their ids, in order.
fn subscribe_all(
    agent: &ureq::Agent,
    base: &str,
    questions: &[String],
    clients: usize,
) -> anyhow::Result<Vec<String>> {
    let next = AtomicUsize::new(0);
    let ids = Mutex::new(vec![String::new(); questions.len()]);
    let failed = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..clients.max(1) {
            scope.spawn(|| loop {
                let at = next.fetch_add(1, Ordering::SeqCst);
                let Some(question) = questions.get(at) else {
                    break;
                };
                let body =
                    json!({"query": {"tenant": "squad", "text": question, "token_budget": 600}});
                let (status, answer) = post(agent, &format!("{base}/v1/subscriptions"), &body);
                if status != 201 {
                    *failed.lock().expect("lock") = Some(format!("{status}: {answer}"));
                    break;
                }
                ids.lock().expect("lock")[at] = answer["subscription_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
            });
        }
    });
    if let Some(failed) = failed.into_inner().expect("lock") {
        anyhow::bail!("a subscription was refused: {failed}");
    }
    Ok(ids.into_inner().expect("lock"))
}

/// Waits until none of `ids` is pending; how long it took.
fn quiet(agent: &ureq::Agent, base: &str, ids: &[String]) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut from = 0;
    while from < ids.len() {
        let (status, answer) = get(agent, &format!("{base}/v1/subscriptions/{}", ids[from]));
        anyhow::ensure!(status == 200, "a subscription answered {status}: {answer}");
        if answer["pending"] == false {
            from += 1;
        } else {
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(1800),
                "subscriptions still pending after 30 minutes"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // A last pass: all of them at once.
    for id in ids {
        let (_, answer) = get(agent, &format!("{base}/v1/subscriptions/{id}"));
        if answer["pending"] != false {
            return quiet(agent, base, ids);
        }
    }
    Ok(started.elapsed())
}

/// The corpus as upserts of the tenant `squad`, each text its title and body.
fn read_corpus(path: &std::path::Path) -> anyhow::Result<Vec<Value>> {
    Ok(read_jsonl_lines(path)?
        .into_iter()
        .map(|row| {
            let text = format!(
                "{}\n\n{}",
                row["title"].as_str().unwrap_or_default(),
                row["text"].as_str().unwrap_or_default()
            );
            json!({"tenant": "squad", "doc_id": row["_id"], "version": 1, "text": text})
        })
        .collect())
}

/// `n` questions spread evenly over `all` (its questions come article by article).
fn pick(all: &[String], n: usize, offset: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let at = (i * all.len() / n.max(1) + offset) % all.len();
            match i < all.len() {
                true => all[at].clone(),
                false => format!("{} ({i})", all[at]),
            }
        })
        .collect()
}

/// Posts the corpus from `posters` clients at once; the seconds and each round trip (ms).
fn post_corpus(
    agent: &ureq::Agent,
    base: &str,
    corpus: &[Value],
    (batch, posters): (usize, usize),
) -> (f64, Vec<f64>) {
    let batches: Vec<&[Value]> = corpus.chunks(batch.max(1)).collect();
    let next = AtomicUsize::new(0);
    let round_trips = Mutex::new(Vec::new());
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..posters.max(1) {
            scope.spawn(|| loop {
                let at = next.fetch_add(1, Ordering::SeqCst);
                let Some(batch) = batches.get(at) else {
                    break;
                };
                let posted = Instant::now();
                let (status, answer) = post(
                    agent,
                    &format!("{base}/v1/documents"),
                    &json!({ "documents": batch }),
                );
                if status != 200 {
                    eprintln!("a batch answered {status}: {answer}");
                }
                round_trips
                    .lock()
                    .expect("lock")
                    .push(posted.elapsed().as_secs_f64() * 1000.0);
            });
        }
    });
    let ingest_seconds = started.elapsed().as_secs_f64();
    (ingest_seconds, round_trips.into_inner().expect("lock"))
}

/// Standing-query counters: re-evaluations, versions published, evaluations the filter skipped.
#[derive(Clone, Copy)]
struct Churn {
    evaluations: u64,
    moved: u64,
    filtered: u64,
}

impl Churn {
    /// The counters now.
    fn now() -> Self {
        Self {
            evaluations: metrics().standing_evaluations.get(),
            moved: metrics().standing_versions.get(),
            filtered: metrics().standing_filtered.get(),
        }
    }

    /// The counters now, less `self`.
    fn since(self) -> Self {
        Self {
            evaluations: metrics().standing_evaluations.get() - self.evaluations,
            moved: metrics().standing_versions.get() - self.moved,
            filtered: metrics().standing_filtered.get() - self.filtered,
        }
    }
}

/// Compares a sample of the subscriptions with one-shot answers; (compared, equal).
fn compare_at_rest(
    agent: &ureq::Agent,
    (base, run): (&str, &str),
    (ids, questions): (&[String], &[String]),
    sample: usize,
) -> (usize, usize) {
    let step = (ids.len() / sample.max(1)).max(1);
    let (mut compared, mut equal) = (0, 0);
    for (at, id) in ids.iter().enumerate().step_by(step) {
        let (_, status) = get(agent, &format!("{base}/v1/subscriptions/{id}"));
        let body = json!({"query_id": format!("one-shot-{at}-{run}"), "tenant": "squad", "text": questions[at], "token_budget": 600});
        let (_, one_shot) = post(agent, &format!("{base}/v1/query"), &body);
        compared += 1;
        if items(&status["latest"]["context"]) == items(&one_shot) {
            equal += 1;
        }
    }
    (compared, equal)
}

/// The report's `standing` section: what the ingest cost the subscriptions, and how they ended.
fn standing_section(churn: Churn, settle: Duration, (compared, equal): (usize, usize)) -> Value {
    let Churn {
        evaluations,
        moved,
        filtered,
    } = churn;
    let moved_by: serde_json::Map<String, Value> = Moved::ALL
        .iter()
        .map(|&reason| {
            let count = metrics().standing_moved_count(reason);
            (reason.as_str().to_string(), json!(count))
        })
        .collect();
    let histogram = &metrics().standing_change_to_version_seconds;
    json!({
        "re_evaluations": evaluations,
        "versions_after_the_first": moved,
        "re_evaluations_per_changed_context": evaluations as f64 / (moved.max(1)) as f64,
        "skipped_by_the_filter": filtered,
        "moved_by": moved_by,
        "change_to_version_ms": {
            "p50": quantile(histogram, 0.5) * 1000.0,
            "p99": quantile(histogram, 0.99) * 1000.0,
            "n": histogram.get_sample_count(),
        },
        "seconds_to_quiet_after_ingest": settle.as_secs_f64(),
        "at_rest_equal_to_one_shot": format!("{equal} of {compared}"),
    })
}

/// Holds `idle` more subscriptions and times one unrelated upsert; the report's `idle` section.
fn idle_subscriptions(
    agent: &ureq::Agent,
    (base, run): (&str, &str),
    (ids, all_questions): (&[String], &[String]),
    idle: usize,
) -> anyhow::Result<Value> {
    let rss = rss_mib();
    let started = Instant::now();
    let idle_ids = subscribe_all(agent, base, &pick(all_questions, idle, 1), 4)?;
    let idle_subscribe = started.elapsed().as_secs_f64();
    quiet(agent, base, &idle_ids)?;
    let rss_idle = rss_mib();
    // One unrelated upsert: a document none of the questions is about.
    let evaluations = metrics().standing_evaluations.get();
    let filtered = metrics().standing_filtered.get();
    let posted = Instant::now();
    let (status, answer) = post(
        agent,
        &format!("{base}/v1/documents"),
        &json!({"documents": [{"tenant": "squad", "doc_id": format!("unrelated-{run}"), "version": 1, "text": "Sourdough loaves need a night of slow proving; the bakery sells rye bread and seed rolls from six."}]}),
    );
    anyhow::ensure!(
        status == 200,
        "the unrelated upsert answered {status}: {answer}"
    );
    let upsert_ms = posted.elapsed().as_secs_f64() * 1000.0;
    let mut everyone = ids.to_vec();
    everyone.extend(idle_ids.iter().cloned());
    let quiet_after = quiet(agent, base, &everyone)?;
    Ok(json!({
        "held": everyone.len(),
        "subscribe_seconds": idle_subscribe,
        "rss_mib": rss_idle,
        "rss_mib_per_1000": (rss_idle - rss) * 1000.0 / idle as f64,
        "unrelated_upsert": {
            "round_trip_ms": upsert_ms,
            "re_evaluations": metrics().standing_evaluations.get() - evaluations,
            "skipped_by_the_filter": metrics().standing_filtered.get() - filtered,
            "seconds_until_none_pending": quiet_after.as_secs_f64(),
        },
    }))
}

/// Runs the benchmark and returns its report.
pub fn standing(args: StandingBench) -> anyhow::Result<Value> {
    let run = format!(
        "{}-{}",
        std::process::id(),
        ragstream_operators::now_millis()
    );
    let corpus = read_corpus(&args.corpus)?;
    let all_questions: Vec<String> = read_jsonl_lines(&args.questions)?
        .into_iter()
        .filter_map(|row| row["text"].as_str().map(str::to_string))
        .collect();
    anyhow::ensure!(!all_questions.is_empty(), "no questions");

    let held = args.subscriptions + args.idle + 1;
    let (running, _) = local_job(
        ("standing", &run),
        ("seed", 60),
        &[("seed.md", "# Seed\n\nThe job starts with one document.\n")],
        &format!("[standing]\nmax_per_tenant = {held}\nmax_total = {held}\n"),
    )?;
    let base = format!("http://{}", running.address);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(600)))
        .max_idle_connections_per_host(16)
        .build()
        .into();
    let deadline = Instant::now() + Duration::from_secs(600);
    while metrics().chunks_upserted.get() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }

    // Subscriptions on the empty tenant.
    let started = Instant::now();
    let questions = pick(&all_questions, args.subscriptions, 0);
    let ids = subscribe_all(&agent, &base, &questions, 4)?;
    let subscribe_seconds = started.elapsed().as_secs_f64();

    // The corpus at full speed.
    let churn = Churn::now();
    let (ingest_seconds, round_trips) =
        post_corpus(&agent, &base, &corpus, (args.batch, args.posters));
    let settle = quiet(&agent, &base, &ids)?;
    let rss_after_ingest = rss_mib();
    let churn = churn.since();

    // Exact at rest: a sample against one-shot answers.
    let at_rest = compare_at_rest(&agent, (&base, &run), (&ids, &questions), args.sample);

    let mut report = json!({
        "corpus_documents": corpus.len(),
        "subscriptions": args.subscriptions,
        "subscribe_seconds": subscribe_seconds,
        "ingest": {
            "seconds": ingest_seconds,
            "documents_per_second": corpus.len() as f64 / ingest_seconds,
            "batch_round_trips": latency_summary(round_trips),
        },
        "rss_mib_after_ingest": rss_after_ingest,
    });
    if args.subscriptions > 0 {
        report["standing"] = standing_section(churn, settle, at_rest);
    }
    if args.idle > 0 {
        report["idle"] =
            idle_subscriptions(&agent, (&base, &run), (&ids, &all_questions), args.idle)?;
    }
    // The job is not stopped gracefully: the process ends after the report; the script removes
    // its working directory.
    drop(running);
    Ok(report)
}
