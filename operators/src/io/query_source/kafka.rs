//! The queries topic: one consumer of the queries group per worker, the handover of revoked
//! partitions, and the read-your-writes watermarks (see the parent module).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::{ClientConfig, ClientContext, Message};

use super::route::StandingRoute;
use super::{decode_timed, refusal, Batch, DecodeRules, IngestProgress, StandingIntake};
use crate::ingest::dlq::Origin;
use crate::io::kafka_log::{log_client_error, ErrorDedup, QuietContext};
use crate::io::query_ledger::{Handover, Lease};
use crate::offload::{Background, Deliver, Ticket};
use crate::query::job::{QueryJob, Refusal, Reply};
use ragstream_core::progress::COMMITTED_REFRESH;

/// Settings of the Kafka side of the query source.
#[derive(Clone)]
pub struct QueryKafkaConfig {
    /// Client settings.
    pub client: ClientConfig,
    /// The queries topic.
    pub topic: String,
    /// The documents topic (for read-your-writes watermarks).
    pub documents_topic: String,
    /// The documents consumer group (its committed offsets tell what other processes indexed).
    pub documents_group: String,
    /// Consumer group.
    pub group_id: String,
    /// Static membership id prefix.
    pub instance_id: Option<String>,
    /// Group session timeout (see [`crate::io::kafka_source::group_client`]).
    pub session_timeout: Duration,
    /// Where query events with a `standing` object go instead of the dataflow (`None`: standing
    /// queries are off; such events are decoded as queries and refused).
    pub standing: Option<Arc<dyn StandingIntake>>,
}

impl QueryKafkaConfig {
    /// Hands the standing events of the topic to `intake`.
    pub fn with_standing(self, intake: Option<Arc<dyn StandingIntake>>) -> Self {
        Self {
            standing: intake,
            ..self
        }
    }
}

/// One worker's side of the queries topic: its consumer and its watermark fetcher.
pub(super) struct KafkaQueries {
    config: QueryKafkaConfig,
    consumer: BaseConsumer<QueryConsumerContext>,
    /// Read-your-writes: the documents topic's high watermarks, fetched on a helper thread (a
    /// broker that does not answer costs seconds per partition, which a worker must not wait).
    /// The same thread reads the documents group's committed offsets, for the cache and for
    /// read-your-writes queries whose partitions other processes consume.
    watermarks: Background<(), BTreeMap<i32, i64>>,
}

impl KafkaQueries {
    /// Subscribes `worker`'s consumer and starts its watermark fetcher.
    pub(super) fn start(
        config: QueryKafkaConfig,
        worker: usize,
        handover: &Handover,
        progress: &Arc<IngestProgress>,
        timely_worker: &timely::worker::Worker,
        address: &[usize],
    ) -> Self {
        let consumer = queries_consumer(&config, worker, handover);
        let watermarks = start_watermarks(&config, progress, timely_worker, address);
        Self {
            config,
            consumer,
            watermarks,
        }
    }

    /// Stores a partition's offset (the next query to read) once its batch is published.
    pub(super) fn store_offset(&self, partition: i32, offset: i64) {
        let _ = self
            .consumer
            .store_offset(&self.config.topic, partition, offset);
    }

    /// Commits what is stored (the job stops).
    pub(super) fn commit(&self) {
        let _ = self.consumer.commit_consumer_state(CommitMode::Sync);
    }

    /// Asks the helper for the documents topic's watermarks of now.
    pub(super) fn watermarks(&self) -> Ticket<BTreeMap<i32, i64>> {
        self.watermarks.submit(())
    }

    /// Reads queries until `batch` holds 256, recording each partition's highest offset read with
    /// its lease epoch; standing events go to `route` instead of the batch.
    pub(super) fn read(
        &self,
        time: u64,
        reader: Reading<'_>,
        batch: &mut Batch,
        offsets: &mut BTreeMap<i32, (i64, u64)>,
        job: &mut impl FnMut(ragstream_core::query::Query, Reply) -> QueryJob,
    ) {
        let topic = &self.config.topic;
        while batch.len() < 256 {
            match self.consumer.poll(Duration::ZERO) {
                None => break,
                Some(Err(error)) => {
                    tracing::warn!(%error, "queries poll error");
                    break;
                }
                Some(Ok(message)) => {
                    let lease = reader
                        .handover
                        .ledger
                        .read(message.partition(), message.offset());
                    offsets.insert(message.partition(), (message.offset(), lease.epoch));
                    let payload = message.payload().unwrap_or_default();
                    if let Some(route) = reader
                        .route
                        .filter(|_| super::is_standing(payload, reader.rules.max_bytes))
                    {
                        let origin = Origin::Kafka {
                            topic: topic.clone(),
                            partition: message.partition(),
                            offset: message.offset(),
                        };
                        route.push(time, message.key(), payload, origin);
                        continue;
                    }
                    batch.push(kafka_query(&message, topic, lease, reader.rules, job));
                }
            }
        }
    }
}

/// What a read of the queries topic takes from the worker's reader.
pub(super) struct Reading<'a> {
    pub(super) handover: &'a Handover,
    pub(super) rules: &'a DecodeRules,
    pub(super) route: Option<&'a StandingRoute>,
}

/// The queries consumer's context: errors logged as [`QuietContext`] does, and the handover of
/// revoked partitions.
struct QueryConsumerContext {
    errors: ErrorDedup,
    topic: String,
    handover: Handover,
}

impl ClientContext for QueryConsumerContext {
    fn error(&self, error: KafkaError, reason: &str) {
        log_client_error(&self.errors, "queries consumer", error, reason);
    }
}

impl ConsumerContext for QueryConsumerContext {
    /// Before partitions move: the contexts sent are flushed to the broker, each revoked partition is
    /// stored and committed up to its first query not answered, and the leases of its queries in
    /// flight end (their contexts are dropped; the next owner answers them).
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(revoked) = rebalance else {
            return;
        };
        let partitions: Vec<i32> = revoked
            .elements_for_topic(&self.topic)
            .iter()
            .map(|element| element.partition())
            .collect();
        let flushed = (self.handover.flush)();
        let commit = self.handover.ledger.revoke(&partitions);
        if !flushed {
            // Committing past contexts not on the broker could lose them: the next owner answers
            // these queries again instead.
            tracing::warn!(
                ?partitions,
                "contexts not acknowledged before a revocation; its queries may be answered twice"
            );
            return;
        }
        if commit.is_empty() {
            return;
        }
        let mut list = TopicPartitionList::new();
        for (partition, offset) in &commit {
            if let Err(error) =
                list.add_partition_offset(&self.topic, *partition, Offset::Offset(*offset))
            {
                tracing::warn!(%error, partition, "cannot list a revoked partition's offset");
            }
        }
        // Stored too: the automatic commit when the partitions go must not take an older offset.
        let stored = consumer.store_offsets(&list);
        match stored.and_then(|()| consumer.commit(&list, CommitMode::Sync)) {
            Ok(()) => tracing::info!(?commit, "revoked query partitions committed"),
            Err(error) => {
                tracing::warn!(%error, ?commit, "cannot commit revoked query partitions")
            }
        }
    }
}

/// Documents-topic high watermarks, with the partition list refreshed every 30 s, and the documents
/// group's committed offsets (`group`: a client of that group that never joins it, only reads).
struct Watermarks {
    consumer: BaseConsumer<QuietContext>,
    group: BaseConsumer<QuietContext>,
    topic: String,
    partitions: Vec<i32>,
    listed: Option<Instant>,
}

impl Watermarks {
    /// Reads the documents group's committed offsets into `progress` when a read is due (one per
    /// [`COMMITTED_REFRESH`] per process); on a helper thread.
    fn refresh_committed(&mut self, progress: &IngestProgress) {
        if self.partitions.is_empty() || !progress.claim_refresh() {
            return;
        }
        let mut wanted = TopicPartitionList::new();
        for &partition in &self.partitions {
            wanted.add_partition(&self.topic, partition);
        }
        if let Ok(committed) = self.group.committed_offsets(wanted, Duration::from_secs(2)) {
            progress.set_committed(
                committed
                    .elements()
                    .iter()
                    .filter_map(|e| match e.offset() {
                        Offset::Offset(offset) => Some((e.partition(), offset)),
                        _ => None,
                    })
                    .collect(),
            );
        }
    }

    /// Lists the topic's partitions when the list is missing or 30 s old.
    fn list(&mut self) {
        if self
            .listed
            .is_none_or(|at| at.elapsed() > Duration::from_secs(30))
        {
            if let Ok(metadata) = self
                .consumer
                .fetch_metadata(Some(&self.topic), Duration::from_secs(2))
            {
                self.partitions = metadata
                    .topics()
                    .iter()
                    .flat_map(|t| t.partitions().iter().map(|p| p.id()))
                    .collect();
                self.listed = Some(Instant::now());
            }
        }
    }

    /// The high watermark of every partition that answers (2 s each at most).
    fn fetch(&mut self) -> BTreeMap<i32, i64> {
        self.list();
        self.partitions
            .iter()
            .filter_map(|&p| {
                self.consumer
                    .fetch_watermarks(&self.topic, p, Duration::from_secs(2))
                    .ok()
                    .map(|(_, high)| (p, high))
            })
            .collect()
    }
}

/// Builds the queries consumer of `worker` (subscribed), handing revoked partitions over.
fn queries_consumer(
    config: &QueryKafkaConfig,
    worker: usize,
    handover: &Handover,
) -> BaseConsumer<QueryConsumerContext> {
    let member = config
        .instance_id
        .as_ref()
        .map(|instance| format!("{instance}-queries-{worker}"));
    let context = QueryConsumerContext {
        errors: ErrorDedup::default(),
        topic: config.topic.clone(),
        handover: handover.clone(),
    };
    let consumer: BaseConsumer<QueryConsumerContext> = crate::io::kafka_source::group_client(
        &config.client,
        &config.group_id,
        member,
        config.session_timeout,
    )
    .create_with_context(context)
    .unwrap_or_else(|e| panic!("cannot create the queries consumer: {e}"));
    consumer
        .subscribe(&[&config.topic])
        .unwrap_or_else(|e| panic!("cannot subscribe to {}: {e}", config.topic));
    consumer
}

/// Starts the helper thread fetching watermarks and refreshing committed offsets into `progress`.
fn start_watermarks(
    config: &QueryKafkaConfig,
    progress: &Arc<IngestProgress>,
    worker: &timely::worker::Worker,
    address: &[usize],
) -> Background<(), BTreeMap<i32, i64>> {
    let mut marks = Watermarks {
        consumer: config
            .client
            .clone()
            .create_with_context(QuietContext::new("watermark client"))
            .unwrap_or_else(|e| panic!("cannot create the watermark client: {e}")),
        group: config
            .client
            .clone()
            .set("group.id", &config.documents_group)
            .set("enable.auto.commit", "false")
            .create_with_context(QuietContext::new("committed offsets reader"))
            .unwrap_or_else(|e| panic!("cannot create the committed offsets reader: {e}")),
        topic: config.documents_topic.clone(),
        partitions: Vec::new(),
        listed: None,
    };
    let progress = progress.clone();
    let waker = crate::offload::operator_waker(worker, address);
    Background::start_idle(
        "watermarks",
        Some(COMMITTED_REFRESH),
        move |job: Option<()>, deliver: &Deliver<BTreeMap<i32, i64>>| {
            if job.is_some() {
                deliver.send(marks.fetch());
            } else {
                marks.list();
            }
            marks.refresh_committed(&progress);
        },
        waker,
    )
}

/// Decodes a query read from the queries topic, answered under `lease`, into its job or refusal.
// The `Err` side is a refusal flowing through the dataflow as data, not an error path.
#[allow(clippy::result_large_err)]
fn kafka_query<M: Message>(
    message: &M,
    topic: &str,
    lease: Lease,
    rules: &DecodeRules,
    job: &mut impl FnMut(ragstream_core::query::Query, Reply) -> QueryJob,
) -> Result<QueryJob, Refusal> {
    let payload = message.payload().unwrap_or_default();
    let origin = Origin::Kafka {
        topic: topic.to_string(),
        partition: message.partition(),
        offset: message.offset(),
    };
    match decode_timed(payload, rules) {
        Ok(query) => Ok(job(query, Reply::Kafka(lease))),
        Err(error) => Err(refusal(
            error,
            origin,
            message.key(),
            payload,
            Reply::Kafka(lease),
        )),
    }
}
