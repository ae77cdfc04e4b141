//! The documents consumer: its context (consumer lag from librdkafka's statistics, assigned
//! partitions started at the index checkpoint) and the group settings it shares with the queries
//! source.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientConfig, ClientContext, Offset, Statistics, TopicPartitionList};

use super::KafkaSourceConfig;
use crate::io::checkpoint::IndexCheckpoint;
use crate::metrics::metrics;

/// Consumer context: exports consumer lag from librdkafka statistics and starts assigned partitions
/// at the index checkpoint.
pub struct LagContext {
    topic: String,
    checkpoint: Option<Arc<IndexCheckpoint>>,
    errors: crate::io::kafka_log::ErrorDedup,
    /// Set by an assignment, taken by the source operator after its poll.
    pub(super) assigned: AtomicBool,
    /// Set by an assignment, taken by the flow control: partitions newly assigned come unpaused (and
    /// one paused before it was revoked may come back paused), so the flow control's state is applied
    /// to the whole assignment again.
    pub(super) reassigned: AtomicBool,
}

impl LagContext {
    /// Sets, in an assignment, the start of every partition the index has a checkpoint for; returns
    /// those partitions with their start.
    fn start_at_checkpoint(&self, assignment: &mut TopicPartitionList) -> Vec<(i32, i64)> {
        let mut starts = Vec::new();
        let Some(checkpoint) = &self.checkpoint else {
            return starts;
        };
        let partitions: Vec<i32> = assignment
            .elements_for_topic(&self.topic)
            .iter()
            .map(|element| element.partition())
            .collect();
        for partition in partitions {
            let Some(next) = checkpoint.next_offset(partition) else {
                continue;
            };
            match assignment.set_partition_offset(&self.topic, partition, Offset::Offset(next)) {
                Ok(()) => {
                    tracing::info!(
                        partition,
                        next,
                        "assigned: resuming at the index checkpoint"
                    );
                    starts.push((partition, next));
                }
                Err(error) => {
                    tracing::warn!(partition, %error, "cannot start at the index checkpoint")
                }
            }
        }
        starts
    }
}

impl ClientContext for LagContext {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        crate::io::kafka_log::log_client_error(&self.errors, "documents consumer", error, reason);
    }

    fn stats(&self, statistics: Statistics) {
        for topic in statistics.topics.values() {
            for (partition, stats) in &topic.partitions {
                if *partition >= 0 && stats.consumer_lag >= 0 {
                    metrics()
                        .consumer_lag
                        .with_label_values(&[&partition.to_string()])
                        .set(stats.consumer_lag);
                }
            }
        }
    }
}

impl ConsumerContext for LagContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        error: RDKafkaRespErr,
        assignment: &mut TopicPartitionList,
    ) {
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let result = match error {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                self.assigned.store(true, Ordering::SeqCst);
                self.reassigned.store(true, Ordering::SeqCst);
                let starts = self.start_at_checkpoint(assignment);
                let assigned = if cooperative {
                    consumer.incremental_assign(assignment)
                } else {
                    consumer.assign(assignment)
                };
                // The group's offset follows the index: a partition whose checkpoint is already at the
                // end of its log would otherwise never commit it (nothing left to consume and store).
                for (partition, next) in starts.into_iter().filter(|(_, next)| *next > 0) {
                    if let Err(error) = consumer.store_offset(&self.topic, partition, next - 1) {
                        tracing::debug!(partition, %error, "checkpoint offset not stored");
                    }
                }
                assigned
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                tracing::info!(partitions = assignment.count(), "partitions revoked");
                if cooperative {
                    consumer.incremental_unassign(assignment)
                } else {
                    consumer.unassign()
                }
            }
            other => {
                tracing::warn!(error = ?other, "rebalance error");
                consumer.unassign()
            }
        };
        if let Err(error) = result {
            tracing::warn!(%error, "applying a rebalance failed");
        }
    }
}

/// Group-consumer settings shared by the documents and queries sources: offsets stored by us only
/// after the work they carried is acknowledged (librdkafka commits what is stored), new groups start
/// from the beginning, static membership as `<member>` when given. A member whose coordinator has not
/// answered for `session_timeout` drops its partitions and rejoins; a killed job's member is evicted
/// after it, so a restarted job gets its partitions back then. Heartbeats go every tenth of it (at
/// most every 3 s).
pub fn group_client(
    client: &ClientConfig,
    group_id: &str,
    member: Option<String>,
    session_timeout: Duration,
) -> ClientConfig {
    let session_ms = session_timeout.as_millis().max(1);
    let heartbeat_ms = (session_ms / 10).clamp(1, 3000);
    let mut client = client.clone();
    if let Some(member) = member {
        client.set("group.instance.id", member);
    }
    client
        .set("group.id", group_id)
        .set("enable.auto.offset.store", "false")
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "1000")
        // A new group starts from the beginning of the topic: the index must hold every document.
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", session_ms.to_string())
        .set("heartbeat.interval.ms", heartbeat_ms.to_string());
    client
}

/// Builds the group consumer of `worker` (subscribed).
pub fn consumer(
    config: &KafkaSourceConfig,
    worker: usize,
) -> Result<BaseConsumer<LagContext>, rdkafka::error::KafkaError> {
    let member = config
        .instance_id
        .as_ref()
        .map(|instance| format!("{instance}-{worker}"));
    let consumer: BaseConsumer<LagContext> = group_client(
        &config.client,
        &config.group_id,
        member,
        config.session_timeout,
    )
    // Lag per partition for the metrics.
    .set("statistics.interval.ms", "5000")
    // What librdkafka may prefetch besides our in-flight messages (see `prefetch_kbytes`).
    .set(
        "queued.max.messages.kbytes",
        config.prefetch_kbytes.to_string(),
    )
    // A fetch may return a whole event of up to the prefetch size: brokers that do not hand out an
    // oversized first batch anyway (Tansu) would otherwise stall the partition on a large document
    // instead of letting it reach the size check and the DLQ.
    .set(
        "fetch.max.bytes",
        config.prefetch_kbytes.saturating_mul(1024).to_string(),
    )
    .set(
        "max.partition.fetch.bytes",
        config.prefetch_kbytes.saturating_mul(1024).to_string(),
    )
    .set(
        "receive.message.max.bytes",
        config
            .prefetch_kbytes
            .saturating_mul(1024)
            .saturating_add(1 << 20)
            .to_string(),
    )
    .create_with_context(LagContext {
        topic: config.topic.clone(),
        checkpoint: config.checkpoint.clone(),
        errors: Default::default(),
        assigned: AtomicBool::new(false),
        reassigned: AtomicBool::new(false),
    })?;
    consumer.subscribe(&[&config.topic])?;
    Ok(consumer)
}
