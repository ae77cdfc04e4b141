//! InvalidationSink: invalidations to the process's log (`GET /v1/invalidations?since=`) and, with Kafka,
//! to the invalidations topic (key = query id, JSON value, idempotent producer).
//!
//! Invalidations are advice: the producer's own retries deliver them, and none holds a dataflow time
//! or an offset. This runs on a dataflow worker, so a full local queue (a broker away for long) is
//! waited out briefly, then the invalidation is left to the log alone (a warning says so), as is one
//! the producer refuses outright.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};
use rdkafka::ClientConfig;

use crate::query::invalidation::InvalidationSink;
use ragstream_core::query::invalidate::{Invalidation, InvalidationLog};

/// The longest a dropped publisher waits for its invalidations to reach the broker.
const FLUSH_ON_DROP: Duration = Duration::from_secs(2);

/// Waits of [`QUEUE_WAIT`] for room in a full producer queue before an invalidation is left to the
/// log: the worker is held at most 30 ms an invalidation.
const QUEUE_TRIES: usize = 3;
const QUEUE_WAIT: Duration = Duration::from_millis(10);

/// Where one worker's invalidations go.
pub struct InvalidationPublisher {
    log: Arc<Mutex<InvalidationLog>>,
    kafka: Option<(BaseProducer<DefaultProducerContext>, String)>,
}

impl std::fmt::Debug for InvalidationPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InvalidationPublisher")
            .field("kafka_topic", &self.kafka.as_ref().map(|(_, t)| t))
            .finish()
    }
}

impl InvalidationPublisher {
    /// Appends to `log` (shared by the process's workers and its HTTP server) and, with
    /// `kafka = (client, topic)`, publishes to the invalidations topic.
    pub fn new(
        log: Arc<Mutex<InvalidationLog>>,
        kafka: Option<(&ClientConfig, &str)>,
    ) -> Result<Self, String> {
        let kafka = match kafka {
            Some((client, topic)) => {
                let producer: BaseProducer<DefaultProducerContext> = client
                    .clone()
                    .set("enable.idempotence", "true")
                    .set("linger.ms", "5")
                    .create()
                    .map_err(|e| e.to_string())?;
                Some((producer, topic.to_string()))
            }
            None => None,
        };
        Ok(Self { log, kafka })
    }
}

impl InvalidationSink for InvalidationPublisher {
    fn send(&mut self, invalidations: Vec<Invalidation>) {
        for mut invalidation in invalidations {
            invalidation.seq = self
                .log
                .lock()
                .expect("invalidation log")
                .push(invalidation.clone());
            tracing::debug!(query = %invalidation.query_id, stale = invalidation.stale_chunk_ids.len(), "context invalidated");
            let Some((producer, topic)) = &self.kafka else {
                continue;
            };
            let payload = serde_json::to_vec(&invalidation).expect("invalidations serialise");
            let mut record = BaseRecord::to(topic)
                .key(invalidation.query_id.as_bytes())
                .payload(&payload);
            let mut tries = 0;
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned))
                        if tries < QUEUE_TRIES =>
                    {
                        tries += 1;
                        producer.poll(QUEUE_WAIT);
                        record = returned;
                    }
                    Err((error, _)) => {
                        tracing::warn!(%error, seq = invalidation.seq, "invalidation not published to the topic (it stays in the log)");
                        break;
                    }
                }
            }
        }
        if let Some((producer, _)) = &self.kafka {
            producer.poll(Duration::ZERO);
        }
    }
}

impl Drop for InvalidationPublisher {
    fn drop(&mut self) {
        if let Some((producer, _)) = &self.kafka {
            let _ = producer.flush(FLUSH_ON_DROP);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ragstream_core::query::Watermark;

    #[test]
    fn numbers_each_invalidation_in_the_shared_log() {
        let log = Arc::new(Mutex::new(InvalidationLog::new(10)));
        let mut one = InvalidationPublisher::new(log.clone(), None).unwrap();
        let mut two = InvalidationPublisher::new(log.clone(), None).unwrap();
        let entry = |query: &str| Invalidation {
            seq: 0,
            query_id: query.into(),
            tenant: "t".into(),
            stale_chunk_ids: vec!["c".into()],
            index_watermark: Watermark::default(),
        };
        one.send(vec![entry("a")]);
        two.send(vec![entry("b"), entry("c")]);
        let (entries, last, truncated) = log.lock().unwrap().since(0);
        let seen: Vec<(u64, &str)> = entries
            .iter()
            .map(|e| (e.seq, e.query_id.as_str()))
            .collect();
        assert_eq!(seen, vec![(1, "a"), (2, "b"), (3, "c")]);
        assert_eq!((last, truncated), (3, false));
    }

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
        let mut publisher =
            InvalidationPublisher::new(log.clone(), Some((&client, "invalidations"))).unwrap();
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
