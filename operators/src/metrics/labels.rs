//! The bounded label values of the job's labelled metrics, as types, and the calls that record
//! them: a caller says what happened ([`QueryOutcome::Cached`], [`Lane::Bm25`]) and never spells a
//! label. Each type's `ALL` is pre-created at start, so dashboards see zeros rather than gaps.

use std::time::Duration;

use ragstream_core::query::endpoints::RerankKind;
use ragstream_core::query::Mode;

use super::Metrics;

/// Declares a label type: its variants and their label values, `as_str` and `ALL`.
macro_rules! labels {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $label:literal,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The label value.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)*
                }
            }
        }
    };
}

labels! {
    /// How a query ended (`ragstream_queries_total`'s `outcome`).
    QueryOutcome {
        /// A context was published.
        Ok => "ok",
        /// An error context was published.
        Error => "error",
        /// The query was refused (malformed, over its limits) and dead-lettered.
        Refused => "refused",
        /// The context came from the context cache.
        Cached => "cached",
        /// Its partition was revoked before it was answered: the next owner answers it.
        HandedOver => "handed_over",
    }
}

labels! {
    /// A context-cache lookup (`ragstream_query_cache_total`'s `result`).
    CacheResult {
        /// The context was cached.
        Hit => "hit",
        /// It was not.
        Miss => "miss",
    }
}

labels! {
    /// A model endpoint of the query flow (`ragstream_endpoint_calls_total`'s `endpoint`).
    Endpoint {
        /// A text-embeddings-inference rerank server.
        RerankHttp => "rerank_http",
        /// A Cohere/Jina rerank API.
        RerankCohere => "rerank_cohere",
        /// A chat model grading passages.
        RerankLlm => "rerank_llm",
        /// HyDE's chat model.
        Hyde => "hyde",
    }
}

impl Endpoint {
    /// The endpoint of a reranker of `kind` (`None` has none; counted as `rerank_http`).
    pub fn of_rerank(kind: RerankKind) -> Self {
        match kind {
            RerankKind::Llm => Endpoint::RerankLlm,
            RerankKind::Cohere => Endpoint::RerankCohere,
            RerankKind::Http | RerankKind::None => Endpoint::RerankHttp,
        }
    }
}

labels! {
    /// How a model endpoint call ended (`ragstream_endpoint_calls_total`'s `outcome`).
    EndpointOutcome {
        /// It answered.
        Ok => "ok",
        /// It failed or timed out: the query went on without it.
        Fallback => "fallback",
        /// Its answer was cached: no call.
        Cached => "cached",
    }
}

labels! {
    /// A retrieval lane (`ragstream_fusion_weight`'s `lane`).
    Lane {
        /// The dense (vector) lane.
        Dense => "dense",
        /// The BM25 (sparse) lane.
        Bm25 => "bm25",
    }
}

labels! {
    /// Where contexts are published (`ragstream_contexts_published_total`'s `sink`).
    Sink {
        /// The contexts topic.
        Kafka => "kafka",
        /// An HTTP caller waiting for its answer.
        Http => "http",
    }
}

labels! {
    /// Why a standing query may have moved (`ragstream_standing_moved_total`'s `reason`).
    Moved {
        /// No probe, or the change came without its chunks.
        Unfiltered => "unfiltered",
        /// A changed document has a candidate of the query.
        Cites => "cites",
        /// A new chunk enters the dense lane.
        Dense => "dense",
        /// A new chunk enters the BM25 lane.
        Bm25 => "bm25",
        /// Corpus statistics moved the BM25 scores.
        Drift => "drift",
        /// Drift caught up once the tenant was quiet.
        Rest => "rest",
    }
}

impl Metrics {
    /// A query of `mode` (`None`: refused before it had one, labelled `unknown`) ended with
    /// `outcome`.
    pub fn query_ended(&self, mode: Option<Mode>, outcome: QueryOutcome) {
        let mode = mode.map_or("unknown", Mode::as_str);
        self.queries
            .with_label_values(&[mode, outcome.as_str()])
            .inc();
    }

    /// A context-cache lookup.
    pub fn context_cache(&self, result: CacheResult) {
        self.query_cache.with_label_values(&[result.as_str()]).inc();
    }

    /// Context-cache lookups of this process with `result` so far.
    pub fn context_cache_count(&self, result: CacheResult) -> u64 {
        self.query_cache.with_label_values(&[result.as_str()]).get()
    }

    /// A call of `endpoint` ended with `outcome`; `took` unless no call was made (cached).
    pub fn endpoint_call(
        &self,
        endpoint: Endpoint,
        outcome: EndpointOutcome,
        took: Option<Duration>,
    ) {
        self.endpoint_calls
            .with_label_values(&[endpoint.as_str(), outcome.as_str()])
            .inc();
        if let Some(took) = took {
            self.endpoint_seconds
                .with_label_values(&[endpoint.as_str()])
                .observe(took.as_secs_f64());
        }
    }

    /// The weight fusion gave `lane` in one query.
    pub fn observe_fusion_weight(&self, lane: Lane, weight: f32) {
        self.fusion_weight
            .with_label_values(&[lane.as_str()])
            .observe(f64::from(weight));
    }

    /// A context published to `sink`.
    pub fn context_published(&self, sink: Sink) {
        self.contexts_published
            .with_label_values(&[sink.as_str()])
            .inc();
    }

    /// `count` standing queries may have moved, for `reason`.
    pub fn count_moved(&self, reason: Moved, count: usize) {
        self.standing_moved
            .with_label_values(&[reason.as_str()])
            .inc_by(count as u64);
    }

    /// Standing queries counted as moved for `reason` so far.
    pub fn standing_moved_count(&self, reason: Moved) -> u64 {
        self.standing_moved
            .with_label_values(&[reason.as_str()])
            .get()
    }

    /// Creates every label value of the typed labels (zeros from the start).
    pub(super) fn create_typed_labels(&self) {
        for lane in Lane::ALL {
            self.fusion_weight.with_label_values(&[lane.as_str()]);
        }
        for result in CacheResult::ALL {
            self.query_cache.with_label_values(&[result.as_str()]);
        }
        for sink in Sink::ALL {
            self.contexts_published.with_label_values(&[sink.as_str()]);
        }
        for reason in Moved::ALL {
            self.standing_moved.with_label_values(&[reason.as_str()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use prometheus::core::Collector;

    use super::*;
    use crate::metrics::metrics;

    /// Every label value a type records is named in its metric's help (the metric's documentation
    /// in `/metrics` and the reference), and is distinct.
    #[test]
    fn every_label_value_is_named_in_its_metrics_help() {
        fn names<T: Copy>(all: &[T], as_str: fn(T) -> &'static str) -> Vec<&'static str> {
            all.iter().map(|&value| as_str(value)).collect()
        }
        let m = metrics();
        let cases: [(&dyn Collector, Vec<&str>); 7] = [
            (&m.queries, names(QueryOutcome::ALL, QueryOutcome::as_str)),
            (&m.query_cache, names(CacheResult::ALL, CacheResult::as_str)),
            (&m.endpoint_calls, names(Endpoint::ALL, Endpoint::as_str)),
            (
                &m.endpoint_calls,
                names(EndpointOutcome::ALL, EndpointOutcome::as_str),
            ),
            (&m.fusion_weight, names(Lane::ALL, Lane::as_str)),
            (&m.contexts_published, names(Sink::ALL, Sink::as_str)),
            (&m.standing_moved, names(Moved::ALL, Moved::as_str)),
        ];
        for (metric, labels) in cases {
            let help = &metric.desc()[0].help;
            for label in &labels {
                assert!(help.contains(label), "{label} in {help}");
            }
            let mut distinct = labels.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(distinct.len(), labels.len(), "{labels:?}");
        }
        // Pre-created: a dashboard sees zeros before the first event.
        let text = m.render();
        for reason in Moved::ALL {
            let series = format!(
                "ragstream_standing_moved_total{{reason=\"{}\"}}",
                reason.as_str()
            );
            assert!(text.contains(&series), "{series}");
        }
    }
}
