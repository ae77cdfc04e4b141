//! Hyde: for queries of the configured intents (or that ask with `hyde`), asks the HyDE writer
//! endpoint for `num_hypotheses` hypothetical passages (off the worker, through
//! [`remote`](super::remote)); EmbedQuery mixes their mean vector into the query's by the strategy.
//! Passages are cached by query text and count; when the endpoint is out the query's own vector is
//! used and the context says so.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use timely::dataflow::StreamVec;

use super::job::{HydePassage, QueryJob};
use super::remote::{outcome, remote, EndpointCall};
use crate::metrics::{metrics, Endpoint, EndpointOutcome};
use ragstream_core::query::cache::LruTtl;
use ragstream_core::query::endpoints::{EndpointError, HydeConfig, HydeStrategy, PassageWriter};
use ragstream_core::query::{Mode, QueryConfig, Stage};

/// Passages a query asks for: its `num_hypotheses`, else its preset's.
fn hypotheses(job: &QueryJob, config: &HydeConfig) -> usize {
    job.query
        .num_hypotheses
        .unwrap_or(config.num_hypotheses)
        .max(1)
}

/// What a query gets of HyDE (by its preset's `hyde`): its strategy, the passages' share and how
/// many, or `None` (no passage: another mode, an intent HyDE is not configured for, or `original`
/// / `skip`).
fn wanted(job: &QueryJob, config: &QueryConfig) -> Option<(HydeStrategy, f32, usize)> {
    if !matches!(job.query.mode, Mode::Bounded | Mode::Deep) {
        return None;
    }
    let config = &config.preset(job.query.preset.as_deref()).hyde;
    let strategy = match job.query.hyde {
        Some(asked) => asked,
        None if job
            .plan
            .as_ref()
            .is_some_and(|plan| config.intents.contains(&plan.intent)) =>
        {
            config.strategy
        }
        None => return None,
    };
    let weight = strategy.weight(config.weight)?;
    Some((strategy, weight, hypotheses(job, config)))
}

/// Extension trait: the `Hyde` operator.
///
/// # Examples
///
/// A query that asks for `combined` HyDE gets the writer's passages (EmbedQuery then mixes their
/// vector into its own); one that asks for its `original` vector gets none:
///
/// ```
/// use std::sync::Arc;
/// use ragstream_core::query::endpoints::{EndpointError, PassageWriter};
/// use ragstream_core::query::QueryConfig;
/// use ragstream_operators::query::example::job;
/// use ragstream_operators::query::hyde::Hyde;
/// use timely::dataflow::operators::capture::{Capture, Extract};
/// use timely::dataflow::operators::vec::{Map, ToStream};
///
/// /// Writes `n` passages that restate the query.
/// struct Restate;
///
/// impl PassageWriter for Restate {
///     fn write(&self, query: &str, n: usize) -> Result<Vec<String>, EndpointError> {
///         Ok((1..=n).map(|i| format!("Passage {i} on {query}.")).collect())
///     }
/// }
///
/// let written = timely::example(|scope| {
///     vec![
///         job(r#"{"query_id": "q1", "tenant": "t", "text": "tide pools", "hyde": "combined", "num_hypotheses": 2}"#),
///         job(r#"{"query_id": "q2", "tenant": "t", "text": "tide pools", "hyde": "original"}"#),
///     ]
///     .to_stream(scope)
///     .hyde(Arc::new(Restate), Arc::new(QueryConfig::default()))
///     .map(|job| (job.query.query_id, job.hyde.map(|hyde| hyde.texts)))
///     .capture()
/// });
/// let mut written: Vec<_> = written.extract().into_iter().flat_map(|(_, jobs)| jobs).collect();
/// written.sort();
/// assert_eq!(
///     written,
///     [
///         (
///             "q1".to_string(),
///             Some(vec!["Passage 1 on tide pools.".to_string(), "Passage 2 on tide pools.".to_string()])
///         ),
///         ("q2".to_string(), None),
///     ]
/// );
/// ```
pub trait Hyde<'scope> {
    /// Asks the HyDE writer for hypothetical passages for queries of the configured intents (each
    /// query by its preset's `hyde`; the cache and the endpoint are the job's `query.hyde`).
    fn hyde(
        self,
        writer: Arc<dyn PassageWriter>,
        config: Arc<QueryConfig>,
    ) -> StreamVec<'scope, u64, QueryJob>;
}

impl<'scope> Hyde<'scope> for StreamVec<'scope, u64, QueryJob> {
    fn hyde(
        self,
        writer: Arc<dyn PassageWriter>,
        config: Arc<QueryConfig>,
    ) -> StreamVec<'scope, u64, QueryJob> {
        let job_level = &config.hyde;
        // Passages by count and query text; cached ones need no call.
        let cache: Arc<Mutex<LruTtl<String, Vec<String>>>> = Arc::new(Mutex::new(LruTtl::new(
            job_level.cache_entries.max(1),
            job_level.cache_ttl_secs,
        )));
        let lookup = cache.clone();
        let (concurrency, timeout) = (
            job_level.endpoint.concurrency.get(),
            job_level.endpoint.timeout_ms,
        );
        let key = |n: usize, text: &str| format!("{n}\u{0}{text}");
        remote(
            self,
            "Hyde",
            concurrency,
            timeout,
            move |job: &mut QueryJob| {
                let (strategy, weight, n) = wanted(job, &config)?;
                let cached = lookup
                    .lock()
                    .expect("hyde cache")
                    .get(&key(n, &job.query.text), 0);
                job.hyde = Some(HydePassage {
                    texts: cached.clone().unwrap_or_default(),
                    cached: cached.is_some(),
                    weight,
                    asked: n,
                    strategy,
                    joined: false,
                });
                if cached.is_some() {
                    metrics().endpoint_call(Endpoint::Hyde, EndpointOutcome::Cached, None);
                    return None;
                }
                let writer = writer.clone();
                let text = job.query.text.clone();
                Some(Box::new(move || writer.write(&text, n)) as EndpointCall<Vec<String>>)
            },
            move |job: &mut QueryJob, result: Result<Vec<String>, EndpointError>, took| {
                job.record(Stage::Hyde, Instant::now() - took);
                match result {
                    Ok(passages) => {
                        outcome(Endpoint::Hyde, EndpointOutcome::Ok, took);
                        if let Some(hyde) = &mut job.hyde {
                            cache.lock().expect("hyde cache").put(
                                key(hyde.asked, &job.query.text),
                                passages.clone(),
                                0,
                            );
                            hyde.texts = passages;
                        }
                    }
                    Err(error) => {
                        outcome(Endpoint::Hyde, EndpointOutcome::Fallback, took);
                        job.hyde = None;
                        job.degraded = true;
                        job.notes.push(format!(
                            "hyde endpoint unavailable ({error}): the query's own vector was used"
                        ));
                    }
                }
            },
        )
    }
}
