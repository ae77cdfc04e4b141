//! The phases of `bench volume` that feed documents or wait on the job, one function each.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ragstream_operators::io::query_source::HttpIngress;
use ragstream_operators::metrics::metrics;
use ragstream_operators::store::IndexTuning;
use serde_json::{json, Value};

use super::{
    ask_until, long_activations, long_activations_since, longest_during_optimization, memory,
    optimizations, reaches, summary, Feeder, Sample, VolumeBench, BANDS,
};

/// Counters when the job started.
#[derive(Clone, Copy)]
pub(super) struct Base {
    /// Chunks upserted.
    pub(super) chunks: u64,
    /// Source events.
    pub(super) events: u64,
}

/// What the phases with a client asking questions share: the job's ingress, the questions, the
/// arguments, the client's stop flag and the counters at the job's start.
#[derive(Clone, Copy)]
pub(super) struct Phase<'a> {
    pub(super) ingress: &'a HttpIngress,
    pub(super) questions: &'a [String],
    pub(super) args: &'a VolumeBench,
    pub(super) stop: &'a AtomicBool,
    pub(super) base: Base,
}

/// Chunks indexed since the counter stood at `base`.
fn indexed_since(base: u64) -> u64 {
    metrics().chunks_upserted.get() - base
}

/// The figures of the grow phase.
pub(super) struct Grow {
    /// Events produced.
    events: u64,
    /// The query client's round trips.
    samples: Vec<Sample>,
    /// How long the phase took.
    seconds: f64,
    /// Long worker activations during the phase.
    activations: Value,
    /// Chunks indexed at its end.
    chunks: u64,
    /// Ingest rate and memory per tenth of the target.
    bands: Vec<Value>,
}

impl Grow {
    /// The report's `grow` section, its round trips also split by tenth of `target` chunks.
    pub(super) fn report(self, target: u64, settle_seconds: f64) -> Value {
        let grow = &self.samples;
        let grow_by_band: Vec<Value> = (0..BANDS)
            .map(|band| {
                let (low, high) = (band * target / BANDS, (band + 1) * target / BANDS);
                let in_band = || {
                    grow.iter()
                        .filter(move |s| s.chunks >= low && s.chunks < high)
                };
                json!({"chunks_from": low, "chunks_to": high, "queries": summary(in_band()),
                    "longest_during_optimization_ms": longest_during_optimization(in_band())})
            })
            .collect();
        json!({
            "events": self.events, "chunks": self.chunks, "seconds": self.seconds,
            "chunks_per_s": self.chunks as f64 / self.seconds,
            "bands": self.bands,
            "queries": summary(grow.iter()),
            "queries_during_optimization": summary(grow.iter().filter(|s| s.during_optimization)),
            "longest_round_trip_during_optimization_ms": longest_during_optimization(grow.iter()),
            "queries_by_band": grow_by_band,
            "settle_seconds": settle_seconds,
            "long_activations": self.activations,
        })
    }
}

/// Phase 1: feeds documents up to `args.chunks` chunks while one client asks questions.
pub(super) fn grow_phase(phase: Phase<'_>, feeder: &mut Feeder<'_>) -> anyhow::Result<Grow> {
    let bands: Mutex<Vec<Value>> = Mutex::new(Vec::new());
    let grow_started = Instant::now();
    let grow_activations = long_activations();
    let (grow_events, grow) = std::thread::scope(|scope| -> anyhow::Result<_> {
        let client = scope.spawn(|| {
            ask_until(
                phase.ingress,
                phase.questions,
                0,
                usize::MAX,
                phase.stop,
                phase.base.chunks,
            )
        });
        let band_size = (phase.args.chunks / BANDS).max(1);
        let mut band_start = (Instant::now(), 0u64);
        let enough = reaches(
            phase.args.chunks,
            phase.base.chunks,
            phase.base.events,
            (phase.base.chunks, phase.base.events),
        );
        let fed = feeder.feed(phase.base.events, &enough, || {
            let chunks = indexed_since(phase.base.chunks);
            if chunks >= band_start.1 + band_size {
                let seconds = band_start.0.elapsed().as_secs_f64();
                let mut bands = bands.lock().expect("bands");
                bands.push(json!({"chunks": chunks, "chunks_per_s": (chunks - band_start.1) as f64 / seconds,
                    "at_s": grow_started.elapsed().as_secs_f64(), "memory": memory()}));
                eprintln!("{}", bands.last().expect("pushed"));
                band_start = (Instant::now(), chunks);
            }
        });
        phase.stop.store(true, Ordering::SeqCst);
        let samples = client.join().expect("query client")?;
        Ok((fed?, samples))
    })?;
    let grow_seconds = grow_started.elapsed().as_secs_f64();
    let grow_activations = long_activations_since(&grow_activations);
    let grown = indexed_since(phase.base.chunks);
    eprintln!("grown to {grown} chunks from {grow_events} events in {grow_seconds:.0} s");
    Ok(Grow {
        events: grow_events,
        samples: grow,
        seconds: grow_seconds,
        activations: grow_activations,
        chunks: grown,
        bands: bands.into_inner().expect("bands"),
    })
}

/// Waits for the writer's optimization on going idle to be done; the seconds it took.
pub(super) fn settle(tuning: IndexTuning) -> f64 {
    let settle = Instant::now();
    std::thread::sleep(tuning.optimize_when_idle().unwrap_or_default() + Duration::from_secs(1));
    while optimizations().0 > 0 {
        std::thread::sleep(Duration::from_millis(100));
    }
    settle.elapsed().as_secs_f64()
}

/// The figures of the loaded phase.
pub(super) struct Loaded {
    /// Events produced.
    events: u64,
    /// The query client's round trips.
    samples: Vec<Sample>,
    /// How long the phase took.
    seconds: f64,
    /// Long worker activations during the phase.
    activations: Value,
    /// Chunks indexed during the phase.
    chunks: u64,
}

impl Loaded {
    /// The report's `loaded` section.
    pub(super) fn report(self) -> Value {
        let loaded = &self.samples;
        json!({
            "events": self.events, "chunks": self.chunks, "seconds": self.seconds,
            "chunks_per_s": self.chunks as f64 / self.seconds,
            "queries": summary(loaded.iter()),
            "longest_round_trip_during_optimization_ms": longest_during_optimization(loaded.iter()),
            "long_activations": self.activations,
        })
    }
}

/// Phase 3: feeds `args.extra_chunks` more chunks while one client asks questions.
pub(super) fn loaded_phase(phase: Phase<'_>, feeder: &mut Feeder<'_>) -> anyhow::Result<Loaded> {
    let loaded_base = indexed_since(phase.base.chunks);
    let loaded_events_base = metrics().source_events.get();
    let loaded_started = Instant::now();
    let loaded_activations = long_activations();
    let (loaded_events, loaded) = std::thread::scope(|scope| -> anyhow::Result<_> {
        let client = scope.spawn(|| {
            ask_until(
                phase.ingress,
                phase.questions,
                phase.questions.len() / 2 + phase.args.queries,
                phase.args.queries,
                phase.stop,
                phase.base.chunks,
            )
        });
        let enough = reaches(
            phase.args.extra_chunks,
            loaded_base + phase.base.chunks,
            loaded_events_base,
            (phase.base.chunks, phase.base.events),
        );
        let fed = feeder.feed(loaded_events_base, &enough, || {});
        phase.stop.store(true, Ordering::SeqCst);
        let samples = client.join().expect("query client")?;
        Ok((fed?, samples))
    })?;
    let loaded_seconds = loaded_started.elapsed().as_secs_f64();
    let loaded_activations = long_activations_since(&loaded_activations);
    let loaded_chunks = indexed_since(phase.base.chunks) - loaded_base;
    Ok(Loaded {
        events: loaded_events,
        samples: loaded,
        seconds: loaded_seconds,
        activations: loaded_activations,
        chunks: loaded_chunks,
    })
}
