//! Mmr: maximal marginal relevance with per-document and per-section caps
//! (`ragstream_core::query::mmr`) for the bounded and deep modes; the SQL modes keep their top k.

use std::sync::Arc;

use timely::dataflow::StreamVec;

use super::job::{ranked_step, Working};
use super::search::results_wanted;
use ragstream_core::query::mmr::{mmr, MmrConfig};
use ragstream_core::query::{Mode, QueryConfig};

/// Extension trait: the `Mmr` operator.
pub trait Mmr<'scope> {
    /// MMR with per-document and per-section caps.
    fn mmr(self, config: Arc<QueryConfig>) -> StreamVec<'scope, u64, Working>;
}

impl<'scope> Mmr<'scope> for StreamVec<'scope, u64, Working> {
    fn mmr(self, config: Arc<QueryConfig>) -> StreamVec<'scope, u64, Working> {
        ranked_step(self, "Mmr", move |working| {
            let query = &working.job.query;
            let k = results_wanted(query);
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
