//! Topic creation (idempotent) with librdkafka's admin client, without an async runtime.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;

/// Creates each `(topic, partitions)` that does not exist yet.
pub fn ensure_topics(client: &ClientConfig, topics: &[(&str, i32)]) -> Result<(), String> {
    let admin: AdminClient<DefaultClientContext> = client.create().map_err(|e| e.to_string())?;
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|(name, partitions)| NewTopic::new(name, *partitions, TopicReplication::Fixed(1)))
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = futures_lite::future::block_on(admin.create_topics(new.iter(), &options))
        .map_err(|e| e.to_string())?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(format!("creating topic {topic}: {code}")),
        }
    }
    Ok(())
}
