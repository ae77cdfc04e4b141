//! Shared by the fault cases: a seeded workload of document events folded into the oracle, waiting for
//! the group to commit the end of the topic, and the figures each case reports.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::common::broker::Broker;
use super::common::job::{metric_labeled, Job};
use super::common::oracle::{compare, default_chunker, index_contents, squad, Oracle, Paragraph};

/// The documents topic of the fault cases.
pub const DOCS: &str = "docs";
/// Their dead-letter topic.
pub const DLQ: &str = "dlq";

/// A broker with the documents topic (`partitions` partitions) and the DLQ topic.
pub fn broker_with_topics(partitions: i32) -> Broker {
    let broker = Broker::start();
    broker.create_topic(DOCS, partitions);
    broker.create_topic(DLQ, 1);
    broker
}

/// A job reading [`DOCS`] as `group` and dead-lettering to [`DLQ`]; `kafka`: further `[kafka]` lines,
/// `sections`: further TOML sections.
pub fn group_config(broker: &Broker, group: &str, kafka: &str, sections: &str) -> String {
    super::common::kafka_config(
        &broker.bootstrap(),
        &format!(
            "documents_topic = \"{DOCS}\"\ndlq_topic = \"{DLQ}\"\ngroup_id = \"{group}\"\n{kafka}"
        ),
        sections,
    )
}

/// Waits until `group` committed the high watermark of every partition of `topic`; returns seconds.
/// Fails after 5 minutes (each case's lag drains in well under a minute).
pub fn wait_committed(
    broker: &Broker,
    group: &str,
    topic: &str,
    partitions: i32,
    job: &Job,
) -> f64 {
    wait_committed_within(
        broker,
        group,
        topic,
        partitions,
        job,
        Duration::from_secs(300),
    )
}

/// [`wait_committed`], failing after `limit`.
pub fn wait_committed_within(
    broker: &Broker,
    group: &str,
    topic: &str,
    partitions: i32,
    job: &Job,
    limit: Duration,
) -> f64 {
    let started = Instant::now();
    let high = broker.high_watermarks(topic, partitions);
    loop {
        let committed = broker.committed(group, topic, partitions);
        if committed == high {
            return started.elapsed().as_secs_f64();
        }
        assert!(
            started.elapsed() < limit,
            "{group} never committed the end of {topic} within {limit:?} (committed {committed:?}, end {high:?}); log tail:\n{}",
            tail(&job.log())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Holds an outage of `dependency` for `seconds`: meanwhile the job must stay up and `group`'s
/// offsets of [`DOCS`] stay at `committed`. Returns the highest `ragstream_outage` gauge seen.
pub fn hold_outage(
    job: &mut Job,
    broker: &Broker,
    group: &str,
    partitions: i32,
    dependency: &str,
    seconds: u64,
) -> f64 {
    let committed = broker.committed(group, DOCS, partitions);
    let started = Instant::now();
    let label = format!("dependency=\"{dependency}\"");
    let mut gauge = 0.0;
    while started.elapsed() < Duration::from_secs(seconds) {
        assert!(job.running(), "the job died:\n{}", job.log());
        assert_eq!(
            broker.committed(group, DOCS, partitions),
            committed,
            "offsets moved during the {dependency} outage"
        );
        gauge = f64::max(
            gauge,
            metric_labeled(&job.metrics(), "ragstream_outage", &label),
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    gauge
}

/// The last 40 lines of a log.
/// Two tenants' runbooks as document events (JSONL lines): acme rolls back with `deployctl`,
/// globex with `shipit`.
/// A `docs` directory under `dir` holding one good file, `runbook.md` (how to roll back a release).
pub fn docs_with_runbook(dir: &std::path::Path) -> std::path::PathBuf {
    let docs = dir.join("docs");
    std::fs::create_dir_all(&docs).expect("docs");
    std::fs::write(
        docs.join("runbook.md"),
        "# Rollback\n\nRun deployctl rollback to return to the previous release.\n",
    )
    .expect("runbook");
    docs
}

pub fn two_tenant_runbooks() -> String {
    let runbook = |tenant: &str, text: &str| {
        serde_json::json!({"op": "upsert", "tenant": tenant, "doc_id": "runbook", "version": 1,
            "source": format!("{tenant}/runbook.md"), "kind": "markdown", "title": "Runbook",
            "text": format!("# Rollback\n\n{text}")})
    };
    format!(
        "{}\n{}\n",
        runbook(
            "acme",
            "Run deployctl rollback to return to the previous release."
        ),
        runbook("globex", "Globex rolls back with shipit revert.")
    )
}

pub fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Lost and stale chunks of the index under `dir/index` against the oracle, with examples.
pub fn lost_stale(oracle: &Oracle, dir: &std::path::Path) -> (usize, usize, String) {
    let expected = oracle.expected(&default_chunker());
    let actual = index_contents(&dir.join("index"));
    compare(&expected, &actual)
}

/// A seeded stream of upserts, updates (grow and shrink), deletes, tombstones and stale
/// (out-of-order) versions over SQuAD paragraphs; every event is folded into the oracle.
pub struct Workload {
    pool: Vec<Paragraph>,
    next: usize,
    versions: BTreeMap<String, (u64, bool)>,
    state: u64,
    /// The expected index.
    pub oracle: Oracle,
    /// Events produced so far.
    pub produced: usize,
}

impl Workload {
    /// A workload over the first `pool` SQuAD paragraphs.
    pub fn new(seed: u64, pool: usize) -> Self {
        Self {
            pool: squad().into_iter().take(pool).collect(),
            next: 0,
            versions: BTreeMap::new(),
            state: seed.max(1),
            oracle: Oracle::default(),
            produced: 0,
        }
    }

    fn random(&mut self, below: usize) -> usize {
        // xorshift64*
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        (self.state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % below.max(1)
    }

    fn existing(&mut self, live: bool) -> Option<String> {
        let ids: Vec<String> = self
            .versions
            .iter()
            .filter(|(_, (_, l))| *l == live)
            .map(|(id, _)| id.clone())
            .collect();
        if ids.is_empty() {
            return None;
        }
        let pick = self.random(ids.len());
        Some(ids[pick].clone())
    }

    /// `n` more events.
    pub fn batch(&mut self, n: usize) -> Vec<(String, Option<Vec<u8>>)> {
        let mut events = Vec::with_capacity(n);
        while events.len() < n {
            let roll = self.random(100);
            let event = if roll < 45 && self.next < self.pool.len() {
                let p = self.pool[self.next].clone();
                self.next += 1;
                self.versions.insert(p.id.clone(), (1, true));
                Some(self.oracle.upsert("squad", &p.id, 1, &p.title, &p.text))
            } else if roll < 70 {
                // Update: grow (append another paragraph) or shrink (first sentence only).
                self.existing(true).map(|id| {
                    let base = self
                        .pool
                        .iter()
                        .find(|p| p.id == id)
                        .expect("pooled")
                        .clone();
                    let pick = self.random(self.pool.len());
                    let other = self.pool[pick].text.clone();
                    let text = if self.random(2) == 0 {
                        format!("{}\n\n{other}", base.text)
                    } else {
                        base.text
                            .split(". ")
                            .next()
                            .unwrap_or(&base.text)
                            .to_string()
                    };
                    let version = self.versions[&id].0 + 1;
                    self.versions.insert(id.clone(), (version, true));
                    self.oracle
                        .upsert("squad", &id, version, &base.title, &text)
                })
            } else if roll < 80 {
                self.existing(true).map(|id| {
                    let version = self.versions[&id].0 + 1;
                    self.versions.insert(id.clone(), (version, false));
                    self.oracle.delete("squad", &id, version)
                })
            } else if roll < 85 {
                self.existing(true).map(|id| {
                    let version = self.versions[&id].0;
                    self.versions.insert(id.clone(), (version, false));
                    self.oracle.tombstone("squad", &id)
                })
            } else if roll < 92 {
                // Re-create a deleted document with a newer version.
                self.existing(false).map(|id| {
                    let base = self
                        .pool
                        .iter()
                        .find(|p| p.id == id)
                        .expect("pooled")
                        .clone();
                    let version = self.versions[&id].0 + 1;
                    self.versions.insert(id.clone(), (version, true));
                    self.oracle
                        .upsert("squad", &id, version, &base.title, &base.text)
                })
            } else {
                // A stale version arriving late: older than what the document has, must be ignored.
                self.existing(true).and_then(|id| {
                    let version = self.versions[&id].0;
                    (version > 1).then(|| {
                        self.oracle.upsert(
                            "squad",
                            &id,
                            version - 1,
                            "stale",
                            "A stale version that must never be indexed.",
                        )
                    })
                })
            };
            events.extend(event);
        }
        self.produced += events.len();
        events
    }
}

/// Median of `values` (0 when empty).
pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Dimension of the stand-in embedder's vectors.
pub const DIMENSION: usize = 384;

/// An OpenAI-compatible `/v1/embeddings` server on loopback, a stand-in for a GPU embedding server (none
/// can run here): hashed bag-of-words vectors of [`DIMENSION`], 7-d vectors for any request holding the
/// text `WRONG-DIMENSION` (a broken server), an adjustable delay per text (a server at capacity), and a
/// switch that makes it answer `503 Service Unavailable` to everything (a server that is down).
pub struct EmbeddingServer {
    /// Base URL.
    pub url: String,
    delay_micros_per_text: Arc<AtomicU64>,
    /// The status every request is answered with while set (0: serve).
    failing: Arc<AtomicU64>,
}

/// The `[embedder]` section of a job that embeds through the stand-in at `url`.
pub fn embedder_section(url: &str) -> String {
    format!(
        "[embedder]\nkind = \"http\"\nurl = \"{url}\"\ndimension = {DIMENSION}\nbatch_size = 64\n"
    )
}

impl EmbeddingServer {
    /// Starts serving on a free loopback port.
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let delay = Arc::new(AtomicU64::new(0));
        let down = Arc::new(AtomicU64::new(0));
        let (shared, shared_down) = (delay.clone(), down.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (delay, down) = (shared.clone(), shared_down.clone());
                std::thread::spawn(move || {
                    let _ = answer(stream, &delay, &down);
                });
            }
        });
        Self {
            url,
            delay_micros_per_text: delay,
            failing: down,
        }
    }

    /// Down (every request answered 503 at once) or back up.
    pub fn set_down(&self, down: bool) {
        self.answer_all(if down { 503 } else { 0 });
    }

    /// Every request answered `status` at once (401: a revoked key), or served again with 0.
    pub fn answer_all(&self, status: u16) {
        self.failing.store(u64::from(status), Ordering::SeqCst);
    }

    /// Each request takes `per_text` for each of its texts (zero: as fast as it can).
    pub fn throttle(&self, per_text: Duration) {
        self.delay_micros_per_text
            .store(per_text.as_micros() as u64, Ordering::SeqCst);
    }
}

fn answer(stream: std::net::TcpStream, delay: &AtomicU64, down: &AtomicU64) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut length = 0;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        if line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let failing = down.load(Ordering::SeqCst);
    if failing != 0 {
        let mut stream = stream;
        return stream.write_all(
            format!("HTTP/1.1 {failing} Failing\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        );
    }
    let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let texts: Vec<&str> = request["input"]
        .as_array()
        .map(|a| a.iter().filter_map(|t| t.as_str()).collect())
        .unwrap_or_default();
    let per_text = delay.load(Ordering::SeqCst);
    if per_text > 0 {
        std::thread::sleep(Duration::from_micros(per_text * texts.len() as u64));
    }
    let broken = texts.iter().any(|t| t.contains("WRONG-DIMENSION"));
    let data: Vec<serde_json::Value> = texts
        .iter()
        .enumerate()
        .map(|(index, text)| {
            let mut vector = vec![0.0f32; if broken { 7 } else { DIMENSION }];
            for word in text.split_whitespace() {
                let hash = word.bytes().fold(1469598103934665603u64, |h, b| {
                    (h ^ b as u64).wrapping_mul(1099511628211)
                });
                let slot = (hash % vector.len() as u64) as usize;
                vector[slot] += 1.0;
            }
            vector[0] += 0.01;
            serde_json::json!({ "index": index, "embedding": vector })
        })
        .collect();
    let response =
        serde_json::json!({ "data": data, "usage": { "prompt_tokens": texts.len() } }).to_string();
    // One write: pieces written separately would wait on Nagle's algorithm.
    let mut stream = stream;
    stream.set_nodelay(true)?;
    stream.write_all(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{response}",
            response.len()
        )
        .as_bytes(),
    )
}
