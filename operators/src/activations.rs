//! How long a worker stays in each operator: what a query waits out when it arrives mid-step.
//!
//! [`record_activations`] registers a timely logger on a worker that pairs each operator's schedule
//! start and stop events and observes the activation's length in
//! `ragstream_operator_activation_seconds{operator}`. A scope's activation contains those of its
//! operators, so `Dataflow` (the job's dataflow, one per worker) is a whole worker step.
//!
//! # Guarantees
//! - Every completed activation of every operator is observed once, with the worker's own clock
//!   (timely's event times), whenever the logger's buffer is flushed.
//! - Nothing is kept beyond the names of the operators and the starts of the activations under way.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use timely::logging::{StartStop, TimelyEvent, TimelyEventBuilder};

use crate::metrics::metrics;

/// Bucket bounds of the activation histogram, in seconds.
pub const BUCKETS: [f64; 13] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
];

/// Pairs schedule events into activations.
#[derive(Debug, Default)]
pub struct Activations {
    names: HashMap<usize, String>,
    started: HashMap<usize, Duration>,
}

impl Activations {
    /// Takes one event; returns the operator and length of an activation it completes.
    pub fn observe(&mut self, time: Duration, event: &TimelyEvent) -> Option<(&str, Duration)> {
        match event {
            TimelyEvent::Operates(operates) => {
                self.names.insert(operates.id, operates.name.clone());
                None
            }
            TimelyEvent::Schedule(schedule) => match schedule.start_stop {
                StartStop::Start => {
                    self.started.insert(schedule.id, time);
                    None
                }
                StartStop::Stop => {
                    let start = self.started.remove(&schedule.id)?;
                    let name = self.names.get(&schedule.id)?;
                    Some((name.as_str(), time.saturating_sub(start)))
                }
            },
            _ => None,
        }
    }
}

/// Observes the activations of the worker's operators in `ragstream_operator_activation_seconds`.
pub fn record_activations(worker: &mut timely::worker::Worker) {
    let Some(mut registry) = worker.log_register() else {
        return;
    };
    let mut activations = Activations::default();
    let histogram = &metrics().operator_activation_seconds;
    registry.insert::<TimelyEventBuilder, _>("timely", move |_time, data| {
        for (time, event) in data.iter().flatten() {
            if let Some((name, length)) = activations.observe(*time, event) {
                histogram
                    .with_label_values(&[name])
                    .observe(length.as_secs_f64());
            }
        }
    });
}

/// Activations longer than `bound` seconds (one of [`BUCKETS`]) so far, per operator that had any.
pub fn longer_than(bound: f64) -> BTreeMap<String, u64> {
    use prometheus::core::Collector;
    let mut out = BTreeMap::new();
    for family in metrics().operator_activation_seconds.collect() {
        for metric in family.get_metric() {
            let histogram = metric.get_histogram();
            let within = histogram
                .get_bucket()
                .iter()
                .find(|bucket| (bucket.upper_bound() - bound).abs() < 1e-9)
                .map_or(0, |bucket| bucket.cumulative_count());
            let longer = histogram.get_sample_count().saturating_sub(within);
            if longer > 0 {
                let operator = metric
                    .get_label()
                    .iter()
                    .find(|label| label.name() == "operator")
                    .map_or_else(String::new, |label| label.value().to_string());
                out.insert(operator, longer);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use timely::dataflow::operators::{Inspect, ToStream};
    use timely::dataflow::StreamVec;

    /// A dataflow whose one operator sleeps 30 ms in an activation: that activation is counted
    /// under the operator's name as longer than 20 ms, and the worker step (`Dataflow`) that
    /// contains it too.
    #[test]
    fn a_long_activation_is_observed_under_its_operator() {
        let before = longer_than(0.02);
        timely::execute_directly(|worker| {
            record_activations(worker);
            worker.dataflow::<u64, _, _>(|scope| {
                let numbers: StreamVec<'_, u64, u64> = (0..1u64).to_stream(scope);
                numbers.inspect(|_| std::thread::sleep(Duration::from_millis(30)));
            });
        });
        let after = longer_than(0.02);
        let added = |name: &str| {
            after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0)
        };
        assert_eq!(added("Inspect"), 1, "{after:?}");
        assert_eq!(added("Dataflow"), 1, "{after:?}");
        assert_eq!(added("ToStream"), 0, "{after:?}");
    }
}
