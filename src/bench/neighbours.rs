//! `ragstream bench neighbours`: one tenant's large documents against another tenant's small ones.
//!
//! The job in this process on its embedded default (a watched directory holding one seed document,
//! the local model, a fresh embedded index, documents posted over HTTP), with `ingest.fair` as
//! given. Tenant `b` asks a question every `interval_ms` and posts a document of about 1 KiB every
//! `probe_every_ms` (answered at once, `wait=0`), each looked for once a round until a query finds
//! it: first for `loaded_seconds` with nothing else going on, then for as long again while tenant
//! `a` posts documents of `size_mib` of prose without pause (each answered 202 at once; a refusal for
//! room is retried a second later). Reported: how long after its post each of `b`'s documents was
//! found (those never found within the phase counted apart), `b`'s round trips in both phases and
//! their ratio, and how much the model embedded meanwhile. `bench/neighbours.sh` runs it with the
//! defaults, with `--query-headroom-secs 0` (every ingest executor runs while b asks) and with
//! `--fair false` (one queue).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ragstream_operators::metrics::metrics;
use serde_json::{json, Value};

use crate::bench::{latency_summary as summary, local_job, post_json as post};

/// Arguments of `bench neighbours`.
#[derive(clap::Args, Debug)]
pub struct NeighboursBench {
    /// `ingest.fair` of the job: tenants take turns (true) or one queue (false).
    #[arg(long, action = clap::ArgAction::Set, default_value_t = true)]
    pub fair: bool,
    /// `embedder.query_headroom_secs` of the job (0: every ingest executor runs while b asks).
    #[arg(long, default_value_t = 5)]
    pub query_headroom_secs: u64,
    /// Size of tenant a's documents, MiB.
    #[arg(long, default_value_t = 7)]
    pub size_mib: usize,
    /// How long each phase lasts (tenant a posts in the second), seconds.
    #[arg(long, default_value_t = 90)]
    pub loaded_seconds: u64,
    /// Least milliseconds between the starts of two of tenant b's questions.
    #[arg(long, default_value_t = 250)]
    pub interval_ms: u64,
    /// Milliseconds between two of tenant b's documents while a posts.
    #[arg(long, default_value_t = 3000)]
    pub probe_every_ms: u64,
}

/// Questions tenant b asks in turn (each with a serial, so no cache answers it).
const QUESTIONS: [&str; 3] = [
    "when does the ferry leave the harbour",
    "who inspects the lighthouse lamp",
    "how are the tide tables published",
];

/// A paragraph of tenant a's prose, numbered.
fn paragraph(n: usize) -> String {
    format!(
        "Section {n}. The survey of district {n} recorded the rainfall, the river levels and the \
         state of the roads in the spring of that year. Inspectors walked every route twice and \
         wrote down what they found at each crossing, numbered {n} in the ledger.\n\n"
    )
}

/// One of tenant a's documents: about `bytes` of prose.
fn large_document(bytes: usize, serial: usize) -> String {
    let mut text = String::with_capacity(bytes + 512);
    let mut n = serial * 1_000_000;
    while text.len() < bytes {
        text.push_str(&paragraph(n));
        n += 1;
    }
    text
}

/// One of tenant b's documents (about 1 KiB) and the word that finds it.
fn small_document(serial: usize) -> (String, String) {
    let word = format!("quayside{serial}marker");
    let mut text = format!(
        "The harbour master of pier {serial} keeps the {word} log. Ferries leave at dawn and return at \
         dusk; the lighthouse lamp is inspected weekly and the tide tables are published monthly.\n"
    );
    while text.len() < 1024 {
        text.push_str(
            "The quay is swept each morning and the moorings are checked before the first ferry.\n",
        );
    }
    (text, word)
}

/// Tenant b: posts documents and finds them.
struct TenantB {
    agent: ureq::Agent,
    base: String,
    run: String,
    serial: usize,
}

impl TenantB {
    /// One round trip of a question; milliseconds.
    fn ask(&mut self) -> anyhow::Result<f64> {
        self.serial += 1;
        let text = format!(
            "{} {}",
            QUESTIONS[self.serial % QUESTIONS.len()],
            self.serial
        );
        let body = json!({"query_id": format!("b-{}-{}", self.serial, self.run), "tenant": "b", "text": text, "token_budget": 600});
        let started = Instant::now();
        let (status, _) = post(&self.agent, &format!("{}/v1/query", self.base), &body);
        anyhow::ensure!(status == 200, "a query of b answered {status}");
        Ok(started.elapsed().as_secs_f64() * 1000.0)
    }

    /// Posts document `serial` (answered at once: `wait=0`); its search word, or `None` where the job
    /// had no room for it (503 `busy`: b's earlier batches are all still being written).
    fn post(&mut self, serial: usize) -> anyhow::Result<Option<String>> {
        let (text, word) = small_document(serial);
        let body = json!({"documents": [{"tenant": "b", "doc_id": format!("b{serial}"), "version": 1, "text": text}]});
        let (status, answer) = post(
            &self.agent,
            &format!("{}/v1/documents?wait=0", self.base),
            &body,
        );
        if status == 503 {
            return Ok(None);
        }
        anyhow::ensure!(
            status == 200 || status == 202,
            "b's post answered {status}: {answer}"
        );
        Ok(Some(word))
    }

    /// Whether a query for `word` finds document `serial`.
    fn finds(&mut self, serial: usize, word: &str) -> bool {
        self.serial += 1;
        let body = json!({"query_id": format!("f-{}-{}", self.serial, self.run), "tenant": "b", "text": word, "mode": "deep", "k": 1, "filters": {"doc_ids": [format!("b{serial}")]}});
        let (status, context) = post(&self.agent, &format!("{}/v1/query", self.base), &body);
        status == 200
            && context["items"]
                .as_array()
                .is_some_and(|items| !items.is_empty())
    }
}

/// Runs the benchmark and returns its report.
pub fn neighbours(args: NeighboursBench) -> anyhow::Result<Value> {
    let run = format!(
        "{}-{}",
        std::process::id(),
        ragstream_operators::now_millis()
    );
    let (running, _) = local_job(
        ("neighbours", &run),
        ("seed", 60),
        &[("seed.md", "# Seed\n\nThe job starts with one document.\n")],
        &format!(
            "[ingest]\nfair = {}\n[embedder]\nquery_headroom_secs = {}\n",
            args.fair, args.query_headroom_secs
        ),
    )?;
    let base = format!("http://{}", running.address);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let deadline = Instant::now() + Duration::from_secs(600);
    while metrics().chunks_upserted.get() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut b = TenantB {
        agent: agent.clone(),
        base: base.clone(),
        run: run.clone(),
        serial: 0,
    };

    for serial in 0..3 {
        let word = b
            .post(serial)?
            .ok_or_else(|| anyhow::anyhow!("an idle job had no room for b's document"))?;
        let posted = Instant::now();
        while !b.finds(serial, &word) {
            anyhow::ensure!(
                posted.elapsed() < Duration::from_secs(120),
                "a document of b was not found within 120 s of an idle job"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    for _ in 0..5 {
        b.ask()?;
    }
    let phase = Duration::from_secs(args.loaded_seconds);
    // The same for b in both phases: a question every `interval_ms`, a document every
    // `probe_every_ms`, each looked for once a round; a alone differs.
    let idle = b_phase(&mut b, &args, phase, 1_000)?;
    eprintln!(
        "idle: {} round trips, {} documents of b found",
        idle.asked.len(),
        idle.found.len()
    );

    // Loaded: a posts large documents without pause.
    let stop = Arc::new(AtomicBool::new(false));
    let posted_a = Arc::new(AtomicUsize::new(0));
    let refused_a = Arc::new(AtomicUsize::new(0));
    let a = {
        let (stop, posted_a, refused_a) = (stop.clone(), posted_a.clone(), refused_a.clone());
        let (agent, url) = (agent.clone(), format!("{base}/v1/documents?wait=0"));
        let bytes = args.size_mib << 20;
        std::thread::spawn(move || {
            lower_priority();
            let mut serial = 0;
            let document = |serial: usize| json!({"documents": [{"tenant": "a", "doc_id": format!("a{serial}"), "version": 1, "text": large_document(bytes - 4096, serial)}]});
            // Built once per document: a retry sends the same body again.
            let mut body = document(serial);
            while !stop.load(Ordering::SeqCst) {
                match post(&agent, &url, &body).0 {
                    200 | 202 => {
                        posted_a.fetch_add(1, Ordering::SeqCst);
                        serial += 1;
                        body = document(serial);
                    }
                    _ => {
                        refused_a.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
            }
        })
    };
    let embedded_before = metrics().embed_texts.get();
    let loaded = b_phase(&mut b, &args, phase, 2_000)?;
    stop.store(true, Ordering::SeqCst);
    let embedded = metrics().embed_texts.get() - embedded_before;
    let _ = a.join();
    eprintln!(
        "loaded ({}): {} round trips; {} documents of b found, {} not found within the phase; a posted {} documents of {} MiB, {embedded} texts embedded (chunks and sentences, both tenants); b refused for room {} times",
        if args.fair { "fair" } else { "one queue" },
        loaded.asked.len(),
        loaded.found.len(),
        loaded.not_found.len(),
        posted_a.load(Ordering::SeqCst),
        args.size_mib,
        loaded.busy,
    );
    // The job is not stopped gracefully (that would finish a's documents first): the process ends
    // after the report; `bench/neighbours.sh` removes its working directory.
    drop(running);
    let p = |v: &[f64], key: &str| summary(v.to_vec())[key].as_f64().unwrap_or(0.0);
    Ok(json!({
        "fair": args.fair,
        "query_headroom_secs": args.query_headroom_secs,
        "a": {"size_mib": args.size_mib, "documents_posted": posted_a.load(Ordering::SeqCst), "refused_for_room": refused_a.load(Ordering::SeqCst), "texts_embedded_in_phase": embedded, "phase_seconds": args.loaded_seconds},
        "b_searchable": {"idle": idle.searchable(), "loaded": loaded.searchable()},
        "b_queries": {
            "idle": summary(idle.asked.clone()),
            "loaded": summary(loaded.asked.clone()),
            "loaded_over_idle": {"p50": p(&loaded.asked, "p50_ms") / p(&idle.asked, "p50_ms"), "p99": p(&loaded.asked, "p99_ms") / p(&idle.asked, "p99_ms")},
        },
    }))
}

/// What tenant b saw in one phase.
struct Phase {
    /// Round trips of its questions, ms.
    asked: Vec<f64>,
    /// Post to found, ms, of each document found within the phase.
    found: Vec<f64>,
    /// Post to the phase's end, ms, of each document not found within it.
    not_found: Vec<f64>,
    /// Posts answered 503 (no room).
    busy: usize,
}

impl Phase {
    fn searchable(&self) -> Value {
        json!({
            "found": summary(self.found.clone()),
            "not_found": self.not_found.len(),
            "not_found_oldest_ms": self.not_found.iter().copied().fold(0.0, f64::max),
            "refused_for_room": self.busy,
        })
    }
}

/// Tenant b for `phase`: a question every `interval_ms`, a document every `probe_every_ms` (the
/// first `first_ms` in), each document looked for once a round until found. Documents are numbered
/// from `first_ms` on, so the two phases never share one.
fn b_phase(
    b: &mut TenantB,
    args: &NeighboursBench,
    phase: Duration,
    first_ms: u64,
) -> anyhow::Result<Phase> {
    let interval = Duration::from_millis(args.interval_ms);
    let probe_every = Duration::from_millis(args.probe_every_ms);
    let started = Instant::now();
    let mut next_probe = started + Duration::from_millis(first_ms);
    let mut serial = first_ms as usize;
    let mut waiting: Vec<(usize, String, Instant)> = Vec::new();
    let mut seen = Phase {
        asked: Vec::new(),
        found: Vec::new(),
        not_found: Vec::new(),
        busy: 0,
    };
    while started.elapsed() < phase {
        let step = Instant::now();
        if step >= next_probe {
            match b.post(serial)? {
                Some(word) => waiting.push((serial, word, Instant::now())),
                None => seen.busy += 1,
            }
            serial += 1;
            next_probe += probe_every;
        }
        let mut still = Vec::new();
        for (serial, word, posted) in waiting.drain(..) {
            if b.finds(serial, &word) {
                seen.found.push(posted.elapsed().as_secs_f64() * 1000.0);
            } else {
                still.push((serial, word, posted));
            }
        }
        waiting = still;
        seen.asked.push(b.ask()?);
        std::thread::sleep(interval.saturating_sub(step.elapsed()));
    }
    seen.not_found = waiting
        .iter()
        .map(|(_, _, posted)| posted.elapsed().as_secs_f64() * 1000.0)
        .collect();
    Ok(seen)
}

/// Tenant a's client stands for another machine: in this process its thread runs at the lowest CPU
/// priority, so what b sees is the job's doing, not the client's (building and sending 7 MiB bodies).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: `gettid` has no preconditions; `setpriority` on the caller's own thread id only
    // changes that thread's nice value (raising it needs no privilege).
    unsafe {
        let _ = libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
    }
}
