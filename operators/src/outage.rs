//! Outages being retried right now, per dependency: what `/readyz` lists and the
//! `ragstream_outage` gauge shows (the `RagstreamOutage` alert fires on it).
//!
//! An outage begins at the first retryable failure of a call and ends when the call succeeds (or
//! gives up with an error that is not an outage). Several threads may retry the same dependency at
//! once (one index writer per shard): the dependency is out while any of them retries, and the gauge
//! counts them.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

/// The dependencies whose outages are tracked (the gauge's label values, exposed at 0 from start).
pub const DEPENDENCIES: [&str; 5] = ["index", "embedder", "dlq", "query_dlq", "rehydrate"];

/// One dependency's outage: since when, how many callers are retrying it, the last error.
#[derive(Debug, Clone)]
struct Down {
    since: Instant,
    callers: usize,
    error: String,
}

static OUTAGES: Mutex<BTreeMap<String, Down>> = Mutex::new(BTreeMap::new());

fn outages() -> std::sync::MutexGuard<'static, BTreeMap<String, Down>> {
    OUTAGES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Longest error text kept for `/readyz`.
const MAX_ERROR_CHARS: usize = 200;

/// A caller retrying `dependency`: the outage lasts while any such guard lives.
#[derive(Debug)]
pub struct Retrying {
    dependency: String,
}

impl Retrying {
    /// Marks `dependency` out (one more caller retrying it), with the error that made it so.
    pub fn begin(dependency: &str, error: &dyn std::fmt::Display) -> Self {
        let error: String = error.to_string().chars().take(MAX_ERROR_CHARS).collect();
        let mut outages = outages();
        let down = outages.entry(dependency.to_string()).or_insert(Down {
            since: Instant::now(),
            callers: 0,
            error: String::new(),
        });
        down.callers += 1;
        down.error = error;
        metrics()
            .outage
            .with_label_values(&[dependency])
            .set(down.callers as i64);
        Self {
            dependency: dependency.to_string(),
        }
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
            .with_label_values(&[&self.dependency])
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

/// One outage as `/readyz` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outage {
    /// The dependency (`index`, `embedder`, `dlq`, …).
    pub dependency: String,
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
            dependency: dependency.clone(),
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
    fn a_dependency_is_out_while_any_caller_retries_it() {
        let dependency = "outage-test";
        let gauge = || metrics().outage.with_label_values(&[dependency]).get();
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
