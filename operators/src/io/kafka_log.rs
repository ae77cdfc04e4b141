//! Kafka client logging that stays readable through an outage.
//!
//! librdkafka reports a down broker from every client (each source consumer, the query consumers, the
//! DLQ and contexts producers) many times a second; logged as they come, a 30-second outage buffers
//! thousands of identical error lines. [`QuietContext`] logs each distinct client error once, then at
//! most once per [`REPEAT_EVERY`] with the number of repeats it held back, at `warn` (an outage is
//! retried, not a failure of the job).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::consumer::ConsumerContext;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, DeliveryResult, ProducerContext};
use rdkafka::{ClientConfig, ClientContext};

/// Shortest interval between two log lines of the same client error.
pub const REPEAT_EVERY: Duration = Duration::from_secs(30);

/// Deduplicates a stream of error messages: what to log now, if anything.
#[derive(Debug, Default)]
pub struct ErrorDedup {
    last: Mutex<Option<(String, Instant, u64)>>,
}

impl ErrorDedup {
    /// Records `message`; returns it (with the count of repeats held back) when it should be logged.
    pub fn admit(&self, message: String, now: Instant) -> Option<(String, u64)> {
        let mut last = self.last.lock().expect("error dedup");
        match last.as_mut() {
            Some((previous, at, held))
                if *previous == message && now.duration_since(*at) < REPEAT_EVERY =>
            {
                *held += 1;
                None
            }
            Some((previous, at, held)) if *previous == message => {
                let repeats = std::mem::take(held);
                *at = now;
                Some((message, repeats))
            }
            _ => {
                *last = Some((message.clone(), now, 0));
                Some((message, 0))
            }
        }
    }
}

/// A client context whose errors go through [`ErrorDedup`]; `client` names the client in the log.
#[derive(Debug)]
pub struct QuietContext {
    client: &'static str,
    errors: ErrorDedup,
}

impl QuietContext {
    /// A context for the client named `client` (e.g. `"dlq producer"`).
    pub fn new(client: &'static str) -> Self {
        Self {
            client,
            errors: ErrorDedup::default(),
        }
    }
}

/// Logs a client error through `dedup`.
pub fn log_client_error(dedup: &ErrorDedup, client: &str, error: KafkaError, reason: &str) {
    if let Some((message, repeats)) = dedup.admit(format!("{error}: {reason}"), Instant::now()) {
        tracing::warn!(client, repeats, "kafka client error: {message}");
    }
}

impl ClientContext for QuietContext {
    fn error(&self, error: KafkaError, reason: &str) {
        log_client_error(&self.errors, self.client, error, reason);
    }
}

impl ConsumerContext for QuietContext {}

/// A producer's context that keeps the failed deliveries: each message is sent with its index in
/// the batch as opaque, and a flush that returns `Ok` only says the queue drained, not that every
/// message arrived (a missing topic or a refused message is reported here, after
/// `message.timeout.ms` at most).
#[derive(Debug)]
pub struct DeliveryContext {
    quiet: QuietContext,
    failed: Mutex<Vec<(usize, KafkaError)>>,
}

impl DeliveryContext {
    /// A context for the producer named `client`.
    pub fn new(client: &'static str) -> Self {
        Self {
            quiet: QuietContext::new(client),
            failed: Mutex::new(Vec::new()),
        }
    }

    /// The deliveries that failed since the last call: the message's index and the error.
    pub fn take_failed(&self) -> Vec<(usize, KafkaError)> {
        std::mem::take(&mut *self.failed.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl ClientContext for DeliveryContext {
    fn error(&self, error: KafkaError, reason: &str) {
        self.quiet.error(error, reason);
    }
}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = usize;
    fn delivery(&self, report: &DeliveryResult<'_>, index: Self::DeliveryOpaque) {
        if let Err((error, _)) = report {
            self.failed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((index, error.clone()));
        }
    }
}

/// An idempotent producer (retries never duplicate or reorder a message) named `name` in its logs,
/// whose messages are reported failed after `delivery_timeout` (librdkafka's `message.timeout.ms`;
/// keep it under the caller's flush deadline, so a flush sees every report).
pub fn idempotent_producer(
    client: &ClientConfig,
    delivery_timeout: Duration,
    name: &'static str,
) -> Result<BaseProducer<DeliveryContext>, KafkaError> {
    client
        .clone()
        .set("enable.idempotence", "true")
        .set(
            "message.timeout.ms",
            delivery_timeout.as_millis().to_string(),
        )
        .create_with_context(DeliveryContext::new(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_error_is_logged_once_per_interval_with_its_repeat_count() {
        let dedup = ErrorDedup::default();
        let start = Instant::now();
        let down = || "AllBrokersDown".to_string();
        assert_eq!(dedup.admit(down(), start), Some((down(), 0)));
        for i in 1..=100 {
            assert_eq!(
                dedup.admit(down(), start + Duration::from_millis(i * 10)),
                None
            );
        }
        assert_eq!(
            dedup.admit(down(), start + REPEAT_EVERY + Duration::from_secs(1)),
            Some((down(), 100)),
            "logged again after the interval, counting what was held back"
        );
        assert_eq!(
            dedup.admit(
                "Timed out".into(),
                start + REPEAT_EVERY + Duration::from_secs(2)
            ),
            Some(("Timed out".to_string(), 0)),
            "a different error is logged at once"
        );
    }
}
