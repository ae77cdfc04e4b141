//! Hyde: for queries of the configured intents, asks the HyDE writer endpoint for a hypothetical
//! passage (off the worker, through [`remote`](super::remote)); EmbedQuery mixes its vector into the
//! query's. Passages are cached by query text; when the endpoint is out the query's own vector is
//! used and the context says so.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use timely::dataflow::StreamVec;

use super::job::{HydePassage, QueryJob};
use super::remote::{outcome, remote, EndpointCall};
use crate::metrics::metrics;
use ragstream_core::query::cache::LruTtl;
use ragstream_core::query::endpoints::{HydeConfig, PassageWriter};
use ragstream_core::query::Mode;

/// Extension trait: the `Hyde` operator.
pub trait Hyde<'scope> {
    /// Asks the HyDE writer for a hypothetical passage for queries of the configured intents.
    fn hyde(
        self,
        writer: Arc<dyn PassageWriter>,
        config: HydeConfig,
    ) -> StreamVec<'scope, u64, QueryJob>;
}

impl<'scope> Hyde<'scope> for StreamVec<'scope, u64, QueryJob> {
    fn hyde(
        self,
        writer: Arc<dyn PassageWriter>,
        config: HydeConfig,
    ) -> StreamVec<'scope, u64, QueryJob> {
        // Passages by query text; a cached one needs no call.
        let cache: Arc<Mutex<LruTtl<String, String>>> = Arc::new(Mutex::new(LruTtl::new(
            config.cache_entries.max(1),
            Duration::from_secs(config.cache_ttl_secs),
        )));
        let lookup = cache.clone();
        let intents = config.intents.clone();
        remote(
            self,
            "Hyde",
            config.endpoint.concurrency,
            Duration::from_millis(config.endpoint.timeout_ms),
            move |job: &mut QueryJob| {
                let wanted = matches!(job.query.mode, Mode::Bounded | Mode::Deep)
                    && job
                        .plan
                        .as_ref()
                        .is_some_and(|plan| intents.contains(&plan.intent));
                if !wanted {
                    return None;
                }
                if let Some(passage) = lookup.lock().expect("hyde cache").get(&job.query.text, 0) {
                    job.hyde = Some(HydePassage {
                        text: passage,
                        cached: true,
                    });
                    metrics()
                        .endpoint_calls
                        .with_label_values(&["hyde", "cached"])
                        .inc();
                    return None;
                }
                let writer = writer.clone();
                let text = job.query.text.clone();
                Some(Box::new(move || writer.write(&text)) as EndpointCall<String>)
            },
            move |job: &mut QueryJob, result: Result<String, String>, took| {
                job.record("hyde", Instant::now() - took);
                match result {
                    Ok(passage) => {
                        outcome("hyde", "ok", took);
                        cache.lock().expect("hyde cache").put(
                            job.query.text.clone(),
                            passage.clone(),
                            0,
                        );
                        job.hyde = Some(HydePassage {
                            text: passage,
                            cached: false,
                        });
                    }
                    Err(error) => {
                        outcome("hyde", "fallback", took);
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
