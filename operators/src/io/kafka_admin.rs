//! Topic creation (idempotent) with librdkafka's admin client, without an async runtime.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;

/// Why a topic could not be made sure of.
#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    /// The admin client could not be created, or the request did not complete.
    #[error("{0}")]
    Client(#[from] KafkaError),
    /// The broker refused to create a topic.
    #[error("creating topic {topic}: {code}")]
    Create {
        /// The topic.
        topic: String,
        /// The broker's answer.
        code: RDKafkaErrorCode,
    },
}

/// Creates each `(topic, partitions)` that does not exist yet.
pub fn ensure_topics(client: &ClientConfig, topics: &[(&str, i32)]) -> Result<(), TopicError> {
    let admin: AdminClient<DefaultClientContext> = client.create()?;
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|(name, partitions)| NewTopic::new(name, *partitions, TopicReplication::Fixed(1)))
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = futures_lite::future::block_on(admin.create_topics(new.iter(), &options))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(TopicError::Create { topic, code }),
        }
    }
    Ok(())
}
