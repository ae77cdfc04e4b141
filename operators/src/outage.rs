//! Outages being retried right now, per dependency: what `/readyz` lists and the
//! `ragstream_outage` gauge shows (the `RagstreamOutage` alert fires on it).
//!
//! An outage begins at the first retryable failure of a call and ends when the call succeeds (or
//! gives up with an error that is not an outage). Several threads may retry the same dependency at
//! once (one index writer per shard): the dependency is out while any of them retries, and the gauge
//! counts them.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::events::InternalEvent;
use crate::metrics::metrics;

/// Capped exponential backoff: the waits between the tries of a call that meets an outage. Every
/// retry loop of the job (helper threads' writes, the inference service's ingest slices, the
/// command-line client) waits by one of these.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// First wait after an outage is seen.
    pub const FIRST: Duration = Duration::from_millis(100);
    /// Longest wait between tries.
    pub const MAX: Duration = Duration::from_secs(30);

    /// Waits of `first`, doubling, at most `max`.
    pub fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max,
            next: first.min(max),
        }
    }

    /// The wait before the next try; the one after is twice as long, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = delay.saturating_mul(2).min(self.max);
        delay
    }

    /// Back to the first wait (the call succeeded).
    pub fn reset(&mut self) {
        self.next = self.first.min(self.max);
    }
}

impl Default for Backoff {
    /// [`Backoff::FIRST`] doubling to [`Backoff::MAX`].
    fn default() -> Self {
        Self::new(Self::FIRST, Self::MAX)
    }
}

/// A dependency whose outages are tracked: the `ragstream_outage` gauge's label and the name
/// `/readyz` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dependency {
    /// The vector index (embedded or a Qdrant server).
    Index,
    /// The embedder (ONNX Runtime or an HTTP endpoint).
    Embedder,
    /// The documents' DLQ.
    Dlq,
    /// The queries' DLQ.
    QueryDlq,
    /// The index read that rebuilds a shard's state when its partitions are assigned.
    Rehydrate,
}

impl Dependency {
    /// Every dependency (the gauge shows each at 0 from the start).
    pub const ALL: [Dependency; 5] = [
        Dependency::Index,
        Dependency::Embedder,
        Dependency::Dlq,
        Dependency::QueryDlq,
        Dependency::Rehydrate,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Dependency::Index => "index",
            Dependency::Embedder => "embedder",
            Dependency::Dlq => "dlq",
            Dependency::QueryDlq => "query_dlq",
            Dependency::Rehydrate => "rehydrate",
        }
    }
}

impl std::fmt::Display for Dependency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a call that meets an outage is tried again: waits from a [`Backoff`] (by default
/// [`Backoff::default`]) while `/readyz` and the gauge show the outage, and, where the caller sets
/// them, at most so many tries and a flag that ends the retries when the job stops.
///
/// ```
/// use std::sync::atomic::AtomicBool;
/// use std::time::Duration;
/// use ragstream_operators::outage::{Backoff, Dependency, GaveUp, Retry};
///
/// let mut failures = 2;
/// let stopping = AtomicBool::new(false);
/// let written = Retry::new(Dependency::Index)
///     .waits(Backoff::new(Duration::from_millis(1), Duration::from_millis(4)))
///     .at_most(5)
///     .until(&stopping)
///     .run(|_: &String| true, || {
///         if failures > 0 {
///             failures -= 1;
///             return Err("unavailable".to_string());
///         }
///         Ok("written")
///     });
/// assert_eq!(written, Ok("written"));
///
/// let refused = Retry::new(Dependency::Index).run(|e: &String| e != "refused", || {
///     Err::<(), _>("refused".to_string())
/// });
/// assert_eq!(refused, Err(GaveUp::Refused("refused".to_string())));
/// ```
#[derive(Debug)]
pub struct Retry<'a> {
    dependency: Dependency,
    backoff: Backoff,
    tries: Option<u32>,
    patience: Option<Duration>,
    stop: Option<&'a AtomicBool>,
}

/// Why [`Retry::run`] gave up, with the last error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GaveUp<E> {
    /// The error is not an outage: retrying would not help.
    Refused(E),
    /// Every try allowed ([`Retry::at_most`], [`Retry::within`]) failed.
    Exhausted(E),
    /// The job is stopping ([`Retry::until`]).
    Stopped(E),
}

impl<E> GaveUp<E> {
    /// The last error.
    pub fn into_error(self) -> E {
        match self {
            GaveUp::Refused(error) | GaveUp::Exhausted(error) | GaveUp::Stopped(error) => error,
        }
    }
}

impl<E: std::fmt::Display> std::fmt::Display for GaveUp<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GaveUp::Refused(error) => write!(f, "{error}"),
            GaveUp::Exhausted(error) => write!(f, "{error} (gave up after every try)"),
            GaveUp::Stopped(error) => write!(f, "{error} (the job is stopping)"),
        }
    }
}

impl<'a> Retry<'a> {
    /// Retries of a call to `dependency`: without limit, waits of [`Backoff::default`].
    pub fn new(dependency: Dependency) -> Self {
        Self {
            dependency,
            backoff: Backoff::default(),
            tries: None,
            patience: None,
            stop: None,
        }
    }

    /// Waits from `backoff`.
    pub fn waits(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// At most `tries` tries in all (at least one).
    pub fn at_most(mut self, tries: u32) -> Self {
        self.tries = Some(tries.max(1));
        self
    }

    /// No more tries once `patience` has passed since the first.
    pub fn within(mut self, patience: Duration) -> Self {
        self.patience = Some(patience);
        self
    }

    /// No more tries once `stop` is set.
    pub fn until(mut self, stop: &'a AtomicBool) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Runs `attempt` until it succeeds; a failure `retryable` accepts is an outage, waited out and
    /// tried again (the outage shown meanwhile), any other failure is returned at once.
    pub fn run<T, E: std::fmt::Display>(
        mut self,
        retryable: impl Fn(&E) -> bool,
        mut attempt: impl FnMut() -> Result<T, E>,
    ) -> Result<T, GaveUp<E>> {
        // Lives while this call retries: the outage `/readyz` and the `ragstream_outage` gauge show.
        let mut outage: Option<Retrying> = None;
        let mut tried = 0u32;
        let started = Instant::now();
        loop {
            let error = match attempt() {
                Ok(value) => return Ok(value),
                Err(error) if !retryable(&error) => return Err(GaveUp::Refused(error)),
                Err(error) => error,
            };
            tried = tried.saturating_add(1);
            if self.tries.is_some_and(|tries| tried >= tries)
                || self
                    .patience
                    .is_some_and(|patience| started.elapsed() >= patience)
            {
                return Err(GaveUp::Exhausted(error));
            }
            if self.stop.is_some_and(|stop| stop.load(Ordering::SeqCst)) {
                return Err(GaveUp::Stopped(error));
            }
            match &outage {
                Some(outage) => outage.failed_again(&error),
                None => outage = Some(Retrying::begin(self.dependency, &error)),
            }
            let delay = self.backoff.next_delay();
            crate::events::Retrying {
                component: self.dependency.as_str(),
                error: &error,
                delay,
            }
            .emit();
            std::thread::sleep(delay);
        }
    }
}

/// One dependency's outage: since when, how many callers are retrying it, the last error.
#[derive(Debug, Clone)]
struct Down {
    since: Instant,
    callers: usize,
    error: String,
}

static OUTAGES: Mutex<BTreeMap<Dependency, Down>> = Mutex::new(BTreeMap::new());

fn outages() -> std::sync::MutexGuard<'static, BTreeMap<Dependency, Down>> {
    OUTAGES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Longest error text kept for `/readyz`.
const MAX_ERROR_CHARS: usize = 200;

/// A caller retrying `dependency`: the outage lasts while any such guard lives.
#[derive(Debug)]
pub struct Retrying {
    dependency: Dependency,
}

impl Retrying {
    /// Marks `dependency` out (one more caller retrying it), with the error that made it so.
    pub fn begin(dependency: Dependency, error: &dyn std::fmt::Display) -> Self {
        let error: String = error.to_string().chars().take(MAX_ERROR_CHARS).collect();
        let mut outages = outages();
        let down = outages.entry(dependency).or_insert(Down {
            since: Instant::now(),
            callers: 0,
            error: String::new(),
        });
        down.callers += 1;
        down.error = error;
        metrics()
            .outage
            .with_label_values(&[dependency.as_str()])
            .set(down.callers as i64);
        Self { dependency }
    }

    /// Records a later failure of the same outage (the error `/readyz` shows).
    pub fn failed_again(&self, error: &dyn std::fmt::Display) {
        if let Some(down) = outages().get_mut(&self.dependency) {
            down.error = error.to_string().chars().take(MAX_ERROR_CHARS).collect();
        }
    }
}

impl Drop for Retrying {
    fn drop(&mut self) {
        let mut outages = outages();
        let callers = match outages.get_mut(&self.dependency) {
            Some(down) => {
                down.callers = down.callers.saturating_sub(1);
                down.callers
            }
            None => 0,
        };
        if callers == 0 {
            if let Some(down) = outages.remove(&self.dependency) {
                tracing::info!(
                    dependency = %self.dependency,
                    seconds = down.since.elapsed().as_secs_f64(),
                    "outage over"
                );
            }
        }
        metrics()
            .outage
            .with_label_values(&[self.dependency.as_str()])
            .set(callers as i64);
    }
}

/// Exit status of a job stopped by [`stop_job`].
pub const STOPPED_EXIT_CODE: i32 = 3;

/// Stops the process at once with a clear error: a condition the job must not work around (its
/// index collection deleted under it). Nothing is lost: offsets and checkpoints cover only what
/// was acknowledged, so what was in flight is read again at the next start.
pub fn stop_job(reason: &str) -> ! {
    tracing::error!(reason, "stopping the job");
    eprintln!("ragstream: {reason}: stopping the job");
    std::process::exit(STOPPED_EXIT_CODE)
}

/// Goes on after a DLQ write, or stops the job when the DLQ refused the records for good
/// ([`DlqError::Refused`]): they have nowhere else to go, and dropping them would lose them. Nothing
/// of the batch is acknowledged, so the next start (with the DLQ fixed) reads it again.
///
/// [`DlqError::Refused`]: crate::ingest::dlq::DlqError::Refused
pub fn stop_if_refused(written: Result<(), crate::ingest::dlq::DlqError>) {
    if let Err(error) = written {
        stop_job(&format!(
            "{error}; fix the DLQ (`runtime.dlq_path` or `kafka.dlq_topic`) and start the job again: nothing was committed"
        ));
    }
}

/// One outage as `/readyz` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outage {
    /// The dependency.
    pub dependency: Dependency,
    /// How long it has been out.
    pub duration: Duration,
    /// The last error seen (bounded).
    pub error: String,
}

/// The outages being retried now, by dependency.
pub fn current() -> Vec<Outage> {
    outages()
        .iter()
        .map(|(dependency, down)| Outage {
            dependency: *dependency,
            duration: down.since.elapsed(),
            error: down.error.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {

    #[test]
    fn backoff_doubles_to_its_cap_and_starts_over_after_a_success() {
        let mut backoff = Backoff::default();
        let waits: Vec<u128> = (0..11).map(|_| backoff.next_delay().as_millis()).collect();
        assert_eq!(
            waits,
            [100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]
        );
        backoff.reset();
        assert_eq!(backoff.next_delay(), Backoff::FIRST);
        let mut capped = Backoff::new(Duration::from_secs(5), Duration::from_secs(1));
        assert_eq!(capped.next_delay(), Duration::from_secs(1));
    }

    use super::*;

    #[test]
    fn a_retry_gives_up_after_its_tries_or_when_the_job_stops() {
        let quick = || Backoff::new(Duration::from_millis(1), Duration::from_millis(2));
        let mut tries = 0;
        let exhausted = Retry::new(Dependency::Dlq).waits(quick()).at_most(3).run(
            |_: &String| true,
            || {
                tries += 1;
                Err::<(), _>(format!("down {tries}"))
            },
        );
        assert_eq!(exhausted, Err(GaveUp::Exhausted("down 3".to_string())));
        assert_eq!(tries, 3);
        assert!(
            current().iter().all(|o| o.dependency != Dependency::Dlq),
            "the outage is over once the call gave up"
        );

        let stopping = AtomicBool::new(true);
        let mut tries = 0;
        let stopped = Retry::new(Dependency::Dlq)
            .waits(quick())
            .until(&stopping)
            .run(
                |_: &String| true,
                || {
                    tries += 1;
                    Err::<(), _>("down".to_string())
                },
            );
        assert_eq!(stopped, Err(GaveUp::Stopped("down".to_string())));
        assert_eq!(tries, 1, "no try after the job began to stop");

        // Waits of 20 ms against a patience of 50 ms: a few tries, then it gives up.
        let mut tries = 0;
        let started = Instant::now();
        let impatient = Retry::new(Dependency::Dlq)
            .waits(Backoff::new(
                Duration::from_millis(20),
                Duration::from_millis(20),
            ))
            .within(Duration::from_millis(50))
            .run(
                |_: &String| true,
                || {
                    tries += 1;
                    Err::<(), _>("down".to_string())
                },
            );
        assert_eq!(impatient, Err(GaveUp::Exhausted("down".to_string())));
        assert!((2..=4).contains(&tries), "{tries} tries");
        assert!(started.elapsed() >= Duration::from_millis(50));
    }

    #[test]
    fn a_dependency_is_out_while_any_caller_retries_it() {
        // No other unit test makes the rehydrating read fail.
        let dependency = Dependency::Rehydrate;
        let gauge = || {
            metrics()
                .outage
                .with_label_values(&[dependency.as_str()])
                .get()
        };
        let listed = || current().into_iter().find(|o| o.dependency == dependency);
        assert!(listed().is_none());
        let first = Retrying::begin(dependency, &"connection refused");
        let second = Retrying::begin(dependency, &"timed out");
        assert_eq!(gauge(), 2);
        assert_eq!(listed().expect("out").error, "timed out");
        second.failed_again(&"x".repeat(1000));
        assert_eq!(listed().expect("out").error.len(), MAX_ERROR_CHARS);
        drop(first);
        assert_eq!(gauge(), 1);
        assert!(listed().is_some(), "one caller still retries");
        drop(second);
        assert_eq!(gauge(), 0);
        assert!(listed().is_none(), "over once the last caller succeeded");
    }
}
