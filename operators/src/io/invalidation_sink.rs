//! InvalidationSink: invalidations to the process's log (`GET /v1/invalidations?since=`) and, with Kafka,
//! to the invalidations topic (the `kafka` feature; key = query id, JSON value, idempotent producer).
//!
//! Invalidations are advice: the producer's own retries deliver them, and none holds a dataflow time
//! or an offset. This runs on a dataflow worker, so a full local queue (a broker away for long) is
//! waited out briefly, then the invalidation is left to the log alone (a warning says so), as is one
//! the producer refuses outright.

use std::sync::{Arc, Mutex};

use crate::query::invalidation::InvalidationSink;
use ragstream_core::query::invalidate::{Invalidation, InvalidationLog};

#[cfg(feature = "kafka")]
mod kafka;

/// Where one worker's invalidations go.
pub struct InvalidationPublisher {
    log: Arc<Mutex<InvalidationLog>>,
    /// The invalidations topic (the `kafka` feature).
    #[cfg(feature = "kafka")]
    kafka: Option<kafka::InvalidationsTopic>,
}

impl std::fmt::Debug for InvalidationPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut debug = f.debug_struct("InvalidationPublisher");
        #[cfg(feature = "kafka")]
        debug.field("kafka_topic", &self.kafka.as_ref().map(|k| k.topic()));
        debug.finish()
    }
}

impl InvalidationPublisher {
    /// Appends to `log` (shared by the process's workers and its HTTP server).
    pub fn new(log: Arc<Mutex<InvalidationLog>>) -> Self {
        Self {
            log,
            #[cfg(feature = "kafka")]
            kafka: None,
        }
    }

    /// Publishes to the invalidations `topic` as well, through an idempotent producer of `client`.
    #[cfg(feature = "kafka")]
    pub fn to_topic(
        mut self,
        client: &rdkafka::ClientConfig,
        topic: &str,
    ) -> Result<Self, rdkafka::error::KafkaError> {
        self.kafka = Some(kafka::InvalidationsTopic::new(client, topic)?);
        Ok(self)
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
            #[cfg(feature = "kafka")]
            if let Some(kafka) = &self.kafka {
                kafka.send(&invalidation);
            }
        }
        #[cfg(feature = "kafka")]
        if let Some(kafka) = &self.kafka {
            kafka.poll();
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
        let mut one = InvalidationPublisher::new(log.clone());
        let mut two = InvalidationPublisher::new(log.clone());
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
}
