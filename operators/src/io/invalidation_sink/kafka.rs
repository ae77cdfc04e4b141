//! The invalidations topic (see the parent module).

use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};
use rdkafka::ClientConfig;

use ragstream_core::query::invalidate::Invalidation;

/// The longest a dropped publisher waits for its invalidations to reach the broker.
const FLUSH_ON_DROP: Duration = Duration::from_secs(2);

/// Waits of [`QUEUE_WAIT`] for room in a full producer queue before an invalidation is left to the
/// log: the worker is held at most 30 ms an invalidation.
const QUEUE_TRIES: usize = 3;
const QUEUE_WAIT: Duration = Duration::from_millis(10);

/// The invalidations topic and its producer.
pub(super) struct InvalidationsTopic {
    producer: BaseProducer<DefaultProducerContext>,
    topic: String,
}

impl InvalidationsTopic {
    pub(super) fn new(client: &ClientConfig, topic: &str) -> Result<Self, KafkaError> {
        let producer: BaseProducer<DefaultProducerContext> = client
            .clone()
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .create()?;
        Ok(Self {
            producer,
            topic: topic.to_string(),
        })
    }

    pub(super) fn topic(&self) -> &str {
        &self.topic
    }

    /// Queues one invalidation; a queue still full after [`QUEUE_TRIES`] waits, or a refusal,
    /// leaves it to the log (a warning says so).
    pub(super) fn send(&self, invalidation: &Invalidation) {
        let payload = serde_json::to_vec(invalidation).expect("invalidations serialise");
        let mut record = BaseRecord::to(&self.topic)
            .key(invalidation.query_id.as_bytes())
            .payload(&payload);
        let mut tries = 0;
        loop {
            match self.producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned))
                    if tries < QUEUE_TRIES =>
                {
                    tries += 1;
                    self.producer.poll(QUEUE_WAIT);
                    record = returned;
                }
                Err((error, _)) => {
                    tracing::warn!(%error, seq = invalidation.seq, "invalidation not published to the topic (it stays in the log)");
                    break;
                }
            }
        }
    }

    /// Serves the producer's delivery reports without waiting.
    pub(super) fn poll(&self) {
        self.producer.poll(Duration::ZERO);
    }
}

impl Drop for InvalidationsTopic {
    fn drop(&mut self) {
        let _ = self.producer.flush(FLUSH_ON_DROP);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::io::invalidation_sink::InvalidationPublisher;
    use crate::query::invalidation::InvalidationSink;
    use ragstream_core::query::invalidate::InvalidationLog;
    use ragstream_core::query::Watermark;

    #[test]
    fn a_broker_away_or_a_refused_record_never_holds_the_worker() {
        // No broker (a closed port), room for one message in the producer's queue, and a record
        // limit a long query id exceeds: the queue fills and the long one is refused outright.
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", "127.0.0.1:9")
            .set("queue.buffering.max.messages", "1")
            .set("message.max.bytes", "1000");
        let log = Arc::new(Mutex::new(InvalidationLog::new(100)));
        let mut publisher = InvalidationPublisher::new(log.clone())
            .to_topic(&client, "invalidations")
            .unwrap();
        let entry = |query: String| Invalidation {
            seq: 0,
            query_id: query,
            tenant: "t".into(),
            stale_chunk_ids: vec!["c".into()],
            index_watermark: Watermark::default(),
        };
        let started = std::time::Instant::now();
        let mut batch: Vec<Invalidation> = (0..20).map(|i| entry(format!("q{i}"))).collect();
        batch.push(entry("q".repeat(4000)));
        publisher.send(batch);
        // Twenty queued or waited out 30 ms each at most, the long one refused at once.
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        let (entries, last, _) = log.lock().unwrap().since(0);
        assert_eq!((entries.len(), last), (21, 21), "every one in the log");
        // Dropping it waits out its flush (2 s), not forever.
        drop(publisher);
    }
}
