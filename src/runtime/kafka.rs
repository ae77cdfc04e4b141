//! The job's side of Kafka outside the dataflow: the topics it creates, the broker probe of
//! `/readyz`, the documents producer of `POST /v1/documents`, the standing events' intake.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use ragstream_operators::io::kafka_log::QuietContext;
use ragstream_operators::io::query_source::StandingIntake;
use ragstream_topologies::config::Config;
use ragstream_topologies::factory;

use crate::http::documents::{DocumentsTarget, KafkaDocuments};
use crate::http::Readiness;
use crate::standing::Standing;

/// Creates the topics the broker misses (when `kafka.create_topics`) and starts the broker probe.
pub(super) fn connect(
    config: &Config,
    readiness: &Arc<Readiness>,
    shutdown: &Arc<AtomicBool>,
) -> anyhow::Result<()> {
    if config.kafka.create_topics {
        ensure_topics(config);
    }
    probe_broker(
        config.kafka.client_config(),
        readiness.clone(),
        shutdown.clone(),
    )
}

/// `POST /v1/documents` writes to the documents topic.
pub(super) fn documents(config: &Config) -> anyhow::Result<DocumentsTarget> {
    let producer = KafkaDocuments::new(
        &config.kafka.client_config(),
        &config.kafka.documents_topic,
        config.ingest.max_document_bytes,
    )
    .map_err(|e| anyhow::anyhow!("the documents producer: {e}"))?;
    Ok(DocumentsTarget::Kafka(Arc::new(producer)))
}

/// The registry's intake of the queries topic's standing events (versions to the contexts topic,
/// refusals to the DLQ).
pub(super) fn standing_intake(
    standing: &Arc<Standing>,
    config: &Config,
) -> anyhow::Result<Arc<dyn StandingIntake>> {
    Ok(crate::standing::kafka::start(
        standing,
        &config.kafka.client_config(),
        &config.kafka.contexts_topic,
        factory::dlq_sink(config)?,
    )?)
}

/// Creates the queries, contexts, invalidations and DLQ topics the broker misses (one partition
/// each); a failure is logged, and a missing topic is then an outage the sources retry.
fn ensure_topics(config: &Config) {
    let client = config.kafka.client_config();
    let topics = [
        (config.kafka.queries_topic.as_str(), 1),
        (config.kafka.contexts_topic.as_str(), 1),
        (config.kafka.invalidations_topic.as_str(), 1),
        (config.kafka.dlq_topic.as_str(), 1),
    ];
    if let Err(error) = ragstream_operators::io::kafka_admin::ensure_topics(&client, &topics) {
        tracing::warn!(%error, "could not ensure the queries/contexts/invalidations/dlq topics exist");
    }
}

/// Probes the broker every 5 s (cluster metadata within 3 s) for `/readyz`.
fn probe_broker(
    client: rdkafka::ClientConfig,
    readiness: Arc<Readiness>,
    shutdown: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer<QuietContext> = client
        .create_with_context(QuietContext::new("broker probe"))
        .context("creating the broker probe")?;
    std::thread::Builder::new()
        .name("broker-probe".into())
        .spawn(move || {
            while !shutdown.load(Ordering::SeqCst) {
                let reachable = consumer
                    .fetch_metadata(None, std::time::Duration::from_secs(3))
                    .is_ok();
                if readiness.broker.swap(reachable, Ordering::SeqCst) != reachable {
                    if reachable {
                        tracing::info!("broker reachable again");
                    } else {
                        tracing::warn!("broker unreachable: /readyz answers 503");
                    }
                }
                for _ in 0..50 {
                    if shutdown.load(Ordering::SeqCst) {
                        return;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            }
        })
        .context("starting the broker probe")?;
    Ok(())
}
