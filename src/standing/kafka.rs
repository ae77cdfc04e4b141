//! Standing queries over Kafka. A queries-topic event with a top-level `standing` object
//! subscribes (the rest of the event is the query, as any query event); each version goes to the
//! contexts topic keyed by the subscription id (its value a [`Version`]: `version`, the index
//! watermark, the diff and the full context); an event whose `standing` says `"end": true` ends it,
//! and an ended subscription's last record is a tombstone (its key, no value), so a compacted
//! contexts topic forgets it.
//!
//! The subscription id is the client's (`standing.subscription_id`, else the event's `query_id`), so
//! an event read twice (a restart before its offset was stored) subscribes once: a subscription that
//! exists already has its latest version published again. Events are handed over by the queries
//! topic's reader without waiting ([`StandingIntake`]) and taken on a thread of their own, which
//! makes the first answer through the dataflow; a refused one (a bad `standing` object, an invalid
//! query, a cap) gets a DLQ record with its value. Kafka-made subscriptions carry the credential
//! `kafka`: the queries topic's own access control stands for a token, and after a restart they come
//! back where the job still reads Kafka.

use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use ragstream_core::ingest::dlq::{DlqReason, DlqRecord, DlqSink, Origin};
use ragstream_operators::io::query_source::StandingIntake;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, ThreadedProducer};
use rdkafka::ClientConfig;
use serde_json::{Map, Value};

use super::{Publish, Refused, Request, Standing, Version};

use super::event::StandingEvent;
pub use super::KAFKA_CREDENTIAL;
/// Standing events waiting for the intake thread; beyond, an event is refused to the DLQ.
const QUEUE: usize = 1024;
/// Refusals of a full queue waiting for their DLQ records; beyond, they are logged and counted.
const OVERFLOW: usize = 4096;

struct Intake {
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
    origin: Origin,
}

/// The queries topic's side of the standing queries: takes events from the reader, hands them to
/// the intake thread.
pub struct KafkaStanding {
    sender: mpsc::SyncSender<Intake>,
    overflow: Arc<Mutex<Vec<DlqRecord>>>,
}

impl StandingIntake for KafkaStanding {
    fn take(&self, key: Option<&[u8]>, payload: &[u8], origin: Origin) {
        let intake = Intake {
            key: key.map(<[u8]>::to_vec),
            payload: payload.to_vec(),
            origin,
        };
        if let Err(mpsc::TrySendError::Full(intake) | mpsc::TrySendError::Disconnected(intake)) =
            self.sender.try_send(intake)
        {
            let mut overflow = super::lock(&self.overflow);
            if overflow.len() < OVERFLOW {
                overflow.push(refusal(
                    &intake,
                    DlqReason::QuotaExceeded,
                    format!("{QUEUE} standing events are waiting already: sent again later"),
                    None,
                ));
            } else {
                tracing::error!("standing events arrive faster than they are taken: one dropped (no DLQ record)");
            }
        }
    }
}

/// Versions of Kafka-made subscriptions to the contexts topic.
struct ContextsTopic {
    producer: ThreadedProducer<DefaultProducerContext>,
    topic: String,
}

impl ContextsTopic {
    fn send(&self, key: &str, payload: Option<&[u8]>) {
        let mut record = BaseRecord::<str, [u8]>::to(&self.topic).key(key);
        if let Some(payload) = payload {
            record = record.payload(payload);
        }
        if let Err((error, _)) = self.producer.send(record) {
            tracing::warn!(subscription = key, %error, "a standing version not sent to the contexts topic (the next one, or GET /v1/subscriptions/{{id}}, has the latest)");
        }
    }
}

impl Publish for ContextsTopic {
    fn version(&self, version: &Version) {
        match serde_json::to_vec(version) {
            Ok(payload) => self.send(&version.subscription_id, Some(&payload)),
            Err(error) => tracing::warn!(%error, "cannot encode a standing version"),
        }
    }

    fn end(&self, id: &str) {
        self.send(id, None);
    }
}

/// Starts the Kafka side of `standing`: versions of Kafka-made subscriptions go to `contexts_topic`,
/// refusals to `dlq`. Returns what the queries topic's reader hands standing events to.
pub fn start(
    standing: &Arc<Standing>,
    client: &ClientConfig,
    contexts_topic: &str,
    mut dlq: Box<dyn DlqSink>,
) -> anyhow::Result<Arc<KafkaStanding>> {
    let producer: ThreadedProducer<DefaultProducerContext> = client
        .clone()
        .set("enable.idempotence", "true")
        .create()
        .map_err(|error| anyhow::anyhow!("the standing versions' producer: {error}"))?;
    standing.set_publisher(Arc::new(ContextsTopic {
        producer,
        topic: contexts_topic.to_string(),
    }));
    let (sender, receiver) = mpsc::sync_channel::<Intake>(QUEUE);
    let overflow: Arc<Mutex<Vec<DlqRecord>>> = Arc::default();
    let registry = Arc::downgrade(standing);
    let refused = overflow.clone();
    std::thread::Builder::new()
        .name("standing-kafka".into())
        .spawn(move || loop {
            let next = receiver.recv_timeout(Duration::from_millis(100));
            let Some(standing) = registry.upgrade() else {
                return;
            };
            let mut records = std::mem::take(&mut *super::lock(&refused));
            match next {
                Ok(intake) => records.extend(take(&standing, intake)),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
            drop(standing);
            // A DLQ outage is retried until the records are durable (an outage is not a refusal).
            while !records.is_empty() {
                match dlq.write(&records) {
                    Ok(()) => records.clear(),
                    Err(error) => {
                        tracing::warn!(%error, "standing refusals wait for the DLQ");
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
            }
        })?;
    Ok(Arc::new(KafkaStanding { sender, overflow }))
}

/// The DLQ record of a refused standing event.
fn refusal(
    intake: &Intake,
    reason: DlqReason,
    message: String,
    tenant: Option<String>,
) -> DlqRecord {
    DlqRecord::new(
        reason,
        message,
        intake.origin.clone(),
        tenant,
        intake.key.as_deref(),
        Some(&intake.payload),
    )
}

/// Subscribes, re-publishes or ends as the event says; the DLQ record of a refusal.
fn take(standing: &Standing, intake: Intake) -> Option<DlqRecord> {
    let invalid = |message: String, tenant: Option<String>| {
        Some(refusal(&intake, DlqReason::InvalidQuery, message, tenant))
    };
    let Ok(mut query) = serde_json::from_slice::<Map<String, Value>>(&intake.payload) else {
        return invalid("the event is not a JSON object".into(), None);
    };
    let tenant = query
        .get("tenant")
        .and_then(Value::as_str)
        .map(str::to_string);
    let event = match query
        .remove("standing")
        .map(serde_json::from_value::<StandingEvent>)
    {
        Some(Ok(event)) => event,
        Some(Err(error)) => return invalid(format!("the standing object: {error}"), tenant),
        None => return invalid("no standing object".into(), tenant),
    };
    let Some(tenant) = tenant else {
        return invalid("the query names no tenant".into(), None);
    };
    let id = event.subscription_id.clone().or_else(|| {
        query
            .get("query_id")
            .and_then(Value::as_str)
            .map(str::to_string)
    });
    let Some(id) = id.filter(|id| super::store::safe_id(id)) else {
        return invalid(
            "standing.subscription_id (or query_id) must be 1 to 128 letters, digits, `-` or `_`"
                .into(),
            Some(tenant),
        );
    };
    if event.end {
        if !standing.end(&id, &tenant) {
            tracing::info!(subscription = %id, %tenant, "an end event for no subscription of the tenant");
        }
        return None;
    }
    let request = || Request {
        query: query.clone(),
        min_interval_ms: event.min_interval_ms,
        ttl_secs: event.ttl_secs,
        credential: KAFKA_CREDENTIAL.into(),
        id: Some(id.clone()),
        publish: true,
    };
    // An index outage is no refusal: the first answer is asked again until the index is back (or
    // the job stops).
    let mut made = standing.subscribe(request());
    while let Err(Refused::Query(context)) = &made {
        if context.error_type.as_deref() != Some("index_unavailable") {
            break;
        }
        tracing::warn!(subscription = %id, "the index is unavailable: the subscription waits for it");
        std::thread::sleep(Duration::from_secs(1));
        made = standing.subscribe(request());
    }
    match made {
        Ok(_) => None,
        Err(Refused::Query(context)) => {
            let message = context
                .error
                .clone()
                .unwrap_or_else(|| "the first evaluation failed".into());
            invalid(message, Some(tenant))
        }
        Err(refused @ (Refused::TenantFull(_) | Refused::Full(_))) => Some(refusal(
            &intake,
            DlqReason::QuotaExceeded,
            refused.message(),
            Some(tenant),
        )),
        Err(Refused::Invalid(message)) => invalid(message, Some(tenant)),
        Err(Refused::Stopping) => None,
    }
}
