//! Mmr: maximal marginal relevance with per-document and per-section caps
//! (`ragstream_core::query::mmr`) for the bounded and deep modes; the SQL modes keep their top k.

use timely::dataflow::StreamVec;

use super::job::{ranked_step, Working};
use ragstream_core::query::depth::results_for;
use ragstream_core::query::mmr::{mmr, MmrConfig};
use ragstream_core::query::{Mode, Stage};

/// Extension trait: the `Mmr` operator.
///
/// # Examples
///
/// At most `query.per_document_cap` chunks of one document (2 by default) are picked; the others
/// are deferred, and the next document's chunk is picked instead:
///
/// ```
/// use ragstream_operators::query::example::{documents, gathered, hit, job};
/// use timely::dataflow::operators::capture::{Capture, Extract};
/// use timely::dataflow::operators::vec::{Map, ToStream};
/// use ragstream_operators::query::fuse::Fuse;
/// use ragstream_operators::query::mmr::Mmr;
///
/// let picked = timely::example(|scope| {
///     let query = job(r#"{"query_id": "q1", "tenant": "t", "text": "tide pools", "k": 3}"#);
///     let dense = vec![
///         hit("a", "tide pools form at low tide", 0.9, &[1.0, 0.0, 0.0]),
///         hit("a", "tide pools hold anemones", 0.85, &[0.0, 1.0, 0.0]),
///         hit("a", "tide pools hold crabs", 0.8, &[0.0, 0.0, 1.0]),
///         hit("b", "rock pools on the shore", 0.7, &[0.5, 0.5, 0.0]),
///     ];
///     vec![gathered(query, dense, Vec::new())]
///         .to_stream(scope)
///         .fuse()
///         .mmr()
///         .map(|working| documents(&working))
///         .capture()
/// });
/// let picked = &picked.extract()[0].1[0];
/// assert_eq!(picked.iter().filter(|doc| *doc == "a").count(), 2);
/// assert!(picked.contains(&"b".to_string()));
/// ```
pub trait Mmr<'scope> {
    /// MMR with per-document and per-section caps.
    fn mmr(self) -> StreamVec<'scope, u64, Working>;
}

impl<'scope> Mmr<'scope> for StreamVec<'scope, u64, Working> {
    fn mmr(self) -> StreamVec<'scope, u64, Working> {
        ranked_step(self, "Mmr", Stage::Mmr, move |working| {
            let query = &working.job.query;
            let config = &working.settings;
            let k = results_for(query, config, &working.candidates);
            match query.mode {
                Mode::Bounded | Mode::Deep => {
                    let caps = if query.mode == Mode::Deep {
                        (k, k)
                    } else {
                        (config.per_document_cap, config.per_section_cap)
                    };
                    let selection = mmr(
                        std::mem::take(&mut working.candidates),
                        k,
                        MmrConfig {
                            lambda: config.mmr_lambda,
                            per_document: caps.0,
                            per_section: caps.1,
                            near_duplicate: config.near_duplicate,
                            file_penalty: config.mmr_file_penalty,
                        },
                    );
                    working.candidates = selection.picked;
                    working.deferred = selection.deferred;
                    working.trace.decisions.extend(selection.decisions);
                }
                Mode::SqlCompact | Mode::SqlFull => working.candidates.truncate(k),
                _ => {}
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use timely::dataflow::operators::capture::{Capture, Extract};
    use timely::dataflow::operators::vec::{Map, ToStream};

    use super::Mmr;
    use crate::query::example::{gathered, hit, job};
    use crate::query::fuse::Fuse;

    /// Picks of `body` over 80 documents of 50 tokens each, all unlike one another.
    fn picks(body: &str) -> usize {
        let body = body.to_string();
        let picked = timely::example(move |scope| {
            let dense = (0..80)
                .map(|i| {
                    let mut vector = vec![0.0; 80];
                    vector[i] = 1.0;
                    let text = vec![format!("word{i}"); 50].join(" ");
                    hit(&format!("d{i:02}"), &text, 0.9 - i as f32 * 0.001, &vector)
                })
                .collect();
            vec![gathered(job(&body), dense, Vec::new())]
                .to_stream(scope)
                .fuse()
                .mmr()
                .map(|working| working.candidates.len())
                .capture()
        });
        picked.extract()[0].1[0]
    }

    #[test]
    fn a_filled_budget_picks_as_many_as_hold_one_and_a_half_times_it() {
        let query = |extra: &str| {
            format!(
                r#"{{"query_id":"q","tenant":"t","text":"anything","token_budget":1000{extra}}}"#
            )
        };
        // 1000 tokens and a spare of 500 in 50-token chunks: 30 picks; the default and an explicit k: k.
        assert_eq!(picks(&query(r#","fill":true"#)), 30);
        assert_eq!(picks(&query("")), 10);
        assert_eq!(picks(&query(r#","fill":true,"k":5"#)), 5);
        // A budget larger than the pool holds: every candidate.
        let all =
            r#"{"query_id":"q","tenant":"t","text":"anything","token_budget":8000,"fill":true}"#;
        assert_eq!(picks(all), 80);
    }
}
