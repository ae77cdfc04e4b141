//! Case 9, overload: documents offered at ten times the embedding capacity. Memory must stay bounded
//! (the source pauses its partitions at `kafka.max_in_flight` unacknowledged messages instead of
//! buffering), and once capacity returns the lag drains with nothing lost or stale.
//!
//! The capacity is set by the suite's embedding stand-in ([`EmbeddingServer`], a fixed delay per text;
//! no embedding server runs here) and measured before the soak. The soak lasts 40 s in the default
//! suite and 10 minutes with `RAGSTREAM_FAULTS_LONG=1`.

use std::time::{Duration, Instant};

use rdkafka::producer::Producer;

use super::common::broker::Broker;
use super::common::job::{metric, metric_labeled, Job};
use super::common::oracle::{squad, Oracle};
use super::support::{
    embedder_section, lost_stale, wait_committed, wait_committed_within, EmbeddingServer,
};

const DOCS: &str = "docs";
const DLQ: &str = "dlq";
const PARTITIONS: i32 = 2;
const GROUP: &str = "soak";
const MAX_BATCH: usize = 100;
const MAX_IN_FLIGHT: usize = 1000;
const WORKERS: usize = 2;
/// librdkafka's prefetch (the default, 64 MiB per consumer, is sized for 50 MB documents; these are
/// ~1 KiB): with `MAX_IN_FLIGHT`, what the job may hold besides its index.
const PREFETCH_KBYTES: usize = 4096;
/// The stand-in embedder's time per text while the job is overloaded: 20 ms in the short soak; 100 ms
/// in the long one, so that ten times its capacity for 10 minutes (~120 000 events) stays within what
/// the loopback broker on a 2-core machine takes in.
const PER_TEXT: Duration = Duration::from_millis(20);
/// Most events offered per second: what the loopback broker takes in on two cores shared with the job
/// (at 2476 per second the producer's queue did not drain within a minute after the soak).
const MAX_OFFERED: f64 = 2000.0;
const PER_TEXT_LONG: Duration = Duration::from_millis(100);
/// The group session: Kafka's default 45 s, longer than the job's 10 s, since the broker this suite runs (Tansu on
/// SQLite, sharing two cores with the job and the producer) may leave a heartbeat unanswered for
/// longer while it takes in the overload; a member that rejoins then can be left with no partitions
/// (docs/operations.md, "Tansu 0.6 limits").
const SESSION_TIMEOUT_MS: u64 = 45_000;
/// Distinct documents: each event updates one of them with another text, so the index stays small and
/// memory growth can only come from buffering.
const POOL: usize = 500;

fn config(broker: &Broker, embedder: &str) -> String {
    super::common::kafka_config(
        &broker.bootstrap(),
        &format!(
            "documents_topic = \"{DOCS}\"\ndlq_topic = \"{DLQ}\"\ngroup_id = \"{GROUP}\"\nmax_batch = {MAX_BATCH}\nmax_in_flight = {MAX_IN_FLIGHT}\nprefetch_kbytes = {PREFETCH_KBYTES}\nsession_timeout_ms = {SESSION_TIMEOUT_MS}"
        ),
        // Without the chunks' evidence units: what this soak checks is that the job does not buffer
        // the backlog, and the units' vectors of the rewritten points grow the index itself until an
        // optimization (70 MiB over a 40 s soak against 16 MiB without them, and not always less with
        // an optimization every 2000 points; docs/decisions/0024-sentence-evidence.md).
        // No index optimization inside the measured window either: the first one (every 20 000
        // points written by default, or when the writer waited 2 s for a batch while the broker was
        // slow to serve the resumed partitions) steps RSS up by ~70 MiB once with its new segment,
        // which says when it ran, not whether the job buffers the backlog.
        &format!(
            "{}evidence_units = false\n[index.tuning]\noptimize_every = 1000000\noptimize_idle_ms = 0\n",
            embedder_section(embedder)
        ),
    )
}

/// Endless updates over [`POOL`] documents, each with the text of another SQuAD paragraph.
struct Updates {
    texts: Vec<(String, String)>,
    versions: Vec<u64>,
    next: usize,
    oracle: Oracle,
    bytes: usize,
}

impl Updates {
    fn new() -> Self {
        Self {
            texts: squad().into_iter().map(|p| (p.title, p.text)).collect(),
            versions: vec![0; POOL],
            next: 0,
            oracle: Oracle::default(),
            bytes: 0,
        }
    }

    fn take(&mut self, n: usize) -> Vec<(String, Option<Vec<u8>>)> {
        (0..n)
            .map(|_| {
                let slot = self.next % POOL;
                self.versions[slot] += 1;
                let (title, text) = &self.texts[self.next % self.texts.len()];
                self.next += 1;
                let event = self.oracle.upsert(
                    "squad",
                    &format!("doc{slot}"),
                    self.versions[slot],
                    title,
                    text,
                );
                self.bytes += event.1.as_ref().map_or(0, Vec::len);
                event
            })
            .collect()
    }
}

fn applied(text: &str) -> f64 {
    metric_labeled(text, "ragstream_documents_total", "outcome=\"applied\"")
}

#[test]
fn overload_at_ten_times_capacity_keeps_memory_bounded_and_drains() {
    let long = std::env::var("RAGSTREAM_FAULTS_LONG").is_ok_and(|v| v == "1");
    let soak = Duration::from_secs(if long { 600 } else { 40 });
    let broker = Broker::start();
    broker.create_topic(DOCS, PARTITIONS);
    broker.create_topic(DLQ, 1);
    let embedder = EmbeddingServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut job = Job::start(dir.path(), &config(&broker, &embedder.url), WORKERS);
    job.wait_ready(Duration::from_secs(60));
    let mut updates = Updates::new();
    // Fill the pool at full speed, then measure the capacity at the overload's speed.
    broker.produce(DOCS, &updates.take(POOL));
    wait_committed(&broker, GROUP, DOCS, PARTITIONS, &job);
    embedder.throttle(if long { PER_TEXT_LONG } else { PER_TEXT });
    let calibration = 200;
    let before = applied(&job.metrics());
    let started = Instant::now();
    broker.produce(DOCS, &updates.take(calibration));
    job.wait_for(Duration::from_secs(120), "calibration applied", |text| {
        applied(text) >= before + calibration as f64
    });
    let capacity = calibration as f64 / started.elapsed().as_secs_f64();
    let offered = (10.0 * capacity).min(MAX_OFFERED);

    // The soak: offered at ten times the capacity, in 100 ms ticks.
    let producer = broker.producer();
    let rss_start = job.rss_bytes().unwrap_or(0);
    let bytes_start = updates.bytes;
    let applied_start = applied(&job.metrics());
    let (mut rss_early, mut rss_late, mut in_flight_max) = (Vec::new(), Vec::new(), 0f64);
    // Index optimizations finished by the start of the middle third, the last third and the soak's end.
    let optimized = |text: &str| metric(text, "ragstream_index_optimize_seconds_count");
    let mut optimizations = [None::<f64>; 3];
    let mut produced = 0usize;
    let soak_started = Instant::now();
    let mut next_sample = Instant::now();
    while soak_started.elapsed() < soak {
        let due = (offered * soak_started.elapsed().as_secs_f64()) as usize;
        for (key, value) in updates.take(due.saturating_sub(produced)) {
            let record = rdkafka::producer::BaseRecord::<str, [u8]>::to(DOCS)
                .key(key.as_str())
                .payload(value.as_deref().unwrap_or_default());
            let mut pending = record;
            while let Err((_, back)) = producer.send(pending) {
                producer.poll(Duration::from_millis(10));
                pending = back;
            }
            produced += 1;
        }
        producer.poll(Duration::ZERO);
        if Instant::now() >= next_sample {
            next_sample += Duration::from_millis(500);
            assert!(job.running(), "the job died under overload:\n{}", job.log());
            let rss = job.rss_bytes().unwrap_or(0);
            let text = job.metrics();
            // Middle third against last third: the start (prefetch filling, pauses kicking in) is
            // excluded; a job that buffers keeps growing into the last third.
            let elapsed = soak_started.elapsed();
            if elapsed >= soak / 3 && elapsed < soak * 2 / 3 {
                rss_early.push(rss);
                optimizations[0].get_or_insert(optimized(&text));
            } else if elapsed >= soak * 2 / 3 {
                rss_late.push(rss);
                optimizations[1].get_or_insert(optimized(&text));
            }
            optimizations[2] = Some(optimized(&text));
            in_flight_max = in_flight_max.max(metric(&text, "ragstream_in_flight_messages"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    producer.flush(Duration::from_secs(60)).expect("flushed");
    let applied_soak = applied(&job.metrics()) - applied_start;
    let backlog_bytes = (updates.bytes - bytes_start) as f64
        * (1.0 - applied_soak / produced.max(1) as f64).max(0.0);

    // Capacity returns; the lag drains.
    embedder.throttle(Duration::ZERO);
    let back = Instant::now();
    wait_committed_within(
        &broker,
        GROUP,
        DOCS,
        PARTITIONS,
        &job,
        Duration::from_secs(if long { 1500 } else { 600 }),
    );
    let drained = back.elapsed().as_secs_f64();
    let log = job.log();
    // Group churn: each session the coordinator let lapse costs a rebalance (and a replay of what was
    // not yet committed).
    let sessions_lost = log.matches("SESSTMOUT").count();
    let revocations = log.matches("partitions revoked").count();
    let dlq = metric(&job.metrics(), "ragstream_dlq_records_total");
    assert!(job.stop().success());
    let (lost, stale, example) = lost_stale(&updates.oracle, dir.path());
    let mib = |bytes: f64| bytes / 1048576.0;
    // Medians of each third's samples (every 0.5 s): a job that buffers grows steadily, so its median
    // moves as its peak does; a moment's peak (an index optimization rebuilding a segment beside the
    // old one, an allocator burst) moves only the peak. A cold CI run failed on a peak of +131 MiB (two
    // runs with librdkafka debug logging on: +138, +189) whose cause was not found; the peaks are
    // reported beside the medians.
    let median = |samples: &mut Vec<u64>| {
        samples.sort_unstable();
        samples.get(samples.len() / 2).copied().unwrap_or(0)
    };
    let peak = |samples: &[u64]| samples.iter().copied().max().unwrap_or(0);
    let (peak_early, peak_late) = (peak(&rss_early), peak(&rss_late));
    let (rss_early, rss_late) = (median(&mut rss_early), median(&mut rss_late));
    let [middle, last, end] = optimizations.map(Option::unwrap_or_default);
    let (optimized_middle, optimized_last) = (last - middle, end - last);
    println!(
        "FAULT overload {:.0} s at 10x (at most {MAX_OFFERED} events/s): capacity {capacity:.1} docs/s, offered {offered:.0} docs/s, {produced} events offered, {applied_soak:.0} applied during the soak; in flight at most {in_flight_max} (limit {MAX_IN_FLIGHT} per worker, {WORKERS} workers); RSS {:.0} MiB at start, median {:.0} MiB (peak {:.0}) in the middle third, {:.0} MiB (peak {:.0}) in the last third, backlog left in the broker {:.0} MiB; index optimizations {optimized_middle} in the middle third, {optimized_last} in the last; drained {drained:.1} s after capacity returned; group sessions lost {sessions_lost}, partition revocations {revocations}; lost {lost}, stale {stale}, DLQ {dlq}",
        soak.as_secs_f64(),
        mib(rss_start as f64),
        mib(rss_early as f64),
        mib(peak_early as f64),
        mib(rss_late as f64),
        mib(peak_late as f64),
        mib(backlog_bytes),
    );
    assert!(
        log.contains("flow control") && log.contains("paused=true"),
        "the source never paused"
    );
    assert!(
        // The limit holds per worker (each pauses its own partitions); the gauge is their sum.
        in_flight_max <= (WORKERS * (MAX_IN_FLIGHT + MAX_BATCH)) as f64,
        "{in_flight_max} messages in flight"
    );
    // Memory does not follow the backlog: from the middle to the last third the median RSS grows by at most
    // 32 MiB (index churn between optimizations, allocator noise), and, once the backlog is large
    // enough to tell (the long soak), by less than a quarter of what buffering it would cost.
    // The soak's config turns the writer's optimizations off (`optimize_idle_ms = 0`, and
    // `optimize_every` past the soak), so none steps memory inside the measured window.
    assert_eq!(
        (optimized_middle, optimized_last),
        (0.0, 0.0),
        "index optimizations ran in the measured window"
    );
    let growth = rss_late.saturating_sub(rss_early) as f64;
    let bound = if backlog_bytes > 256.0 * 1048576.0 {
        (32.0 * 1048576.0f64).min(backlog_bytes / 4.0)
    } else {
        32.0 * 1048576.0
    };
    assert!(
        growth <= bound,
        "RSS grew by {:.0} MiB from the middle to the last third (backlog {:.0} MiB; index optimizations {optimized_middle} in the middle third, {optimized_last} in the last)",
        mib(growth),
        mib(backlog_bytes),
    );
    assert_eq!((lost, stale), (0, 0), "{example}");
    assert_eq!(dlq, 0.0);
}
