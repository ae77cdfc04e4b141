//! How deep a query reads: its results and lane depths, from its token budget.
//!
//! A bounded query reads `k` results (`query.default_k`, 10) and its lanes to twice that. A filled
//! one (`fill: true`, no `k` given) asks for as much material as its budget holds plus a spare
//! ([`fill_target`]: the budget and [`FILL_SPARE_TOKENS`], at least a sixteenth and at most half of
//! the budget): its lanes keep their best hits, taken in turn, until the distinct chunks hold the
//! target in stored tokens ([`fill_pool`]), each searching `target ÷` [`FILL_CHUNK_TOKENS`] deep at
//! most (a chunk size below most indexed chunks) and keeping at least what it reads without filling,
//! and its results are counted
//! against the chunks actually retrieved: `k` when the first `k` ranked candidates already hold the
//! budget in their stored token counts, else as many as hold the target. The default context, with its
//! evidence stop, reads as before.
//!
//! The limits follow the budget too: `k` may be one result per [`MIN_RESULT_TOKENS`] of the budget,
//! at least [`DEEP_MAX_K`] and at most [`MAX_K`], and no lane reads more than twice the query's
//! limit, so the most a query can cost is bounded whatever it asks for.

use super::{Candidate, Depth, Mode, Query, QueryConfig, DEEP_MAX_K};
use crate::store::lanes::Pool;

/// Most results of any query (a bounded query's `k` limit at the largest budgets).
pub const MAX_K: usize = 400;
/// A bounded query's `k` may be one result per this many tokens of its budget.
pub const MIN_RESULT_TOKENS: usize = 32;
/// The chunk size a filled budget's lane depth assumes (most chunks are larger, so the lanes bring
/// back more than the budget holds).
pub const FILL_CHUNK_TOKENS: usize = 100;
/// What a filled query reads beyond its budget, in tokens: packing leaves some material out
/// (near-duplicates, the caps, a last chunk that does not fit), a few chunks' worth whatever the
/// budget. At least a sixteenth and at most half of the budget ([`fill_target`]). A spare growing
/// with the budget (a quarter of it) read more at 4 000 and 8 000 tokens and packed fewer tokens,
/// for no Answer Recall on SQuAD (decision 0047).
pub const FILL_SPARE_TOKENS: usize = 500;

/// The stored tokens a filled query's results hold: its budget and a spare of
/// [`FILL_SPARE_TOKENS`], at least a sixteenth and at most half of the budget (1.5 times a budget up
/// to 1 000 tokens, 500 tokens more up to 8 000, 1.0625 times one from 8 000 on).
pub fn fill_target(budget: usize) -> usize {
    budget.saturating_add(FILL_SPARE_TOKENS.clamp(budget / 16, budget / 2))
}

/// The budget a query asks for before its prompt is counted: `token_budget`, else its
/// `context_window`, else `default` (`query.default_token_budget`); never less than the budget
/// packed ([`super::modes::budget_for`] takes the prompt and the answer's reserve off the window).
pub fn budget_asked(query: &Query, default: usize) -> usize {
    query
        .token_budget
        .or(query.context_window)
        .unwrap_or(default)
}

/// Most results `query` may ask for: [`DEEP_MAX_K`], or for a bounded query one per
/// [`MIN_RESULT_TOKENS`] of the budget it asks for, at most [`MAX_K`].
pub fn k_limit(query: &Query, default_budget: usize) -> usize {
    if query.mode != Mode::Bounded {
        return DEEP_MAX_K;
    }
    (budget_asked(query, default_budget) / MIN_RESULT_TOKENS).clamp(DEEP_MAX_K, MAX_K)
}

/// Whether `query` is packed to its budget with as many results as the budget holds: bounded,
/// `fill: true`, no `k` given (a given `k` is the caller's word).
pub fn fills(query: &Query) -> bool {
    query.mode == Mode::Bounded && query.fill && query.k.is_none()
}

/// The lane depth a filled query's budget asks for: its [`fill_target`] `÷` [`FILL_CHUNK_TOKENS`] (0
/// for a query that does not fill).
pub fn fill_depth(query: &Query, default_budget: usize) -> usize {
    if !fills(query) {
        return 0;
    }
    fill_target(budget_asked(query, default_budget)) / FILL_CHUNK_TOKENS
}

/// A filled query's pool, in stored tokens: the lanes keep their best hits, in turn, until the
/// distinct chunks hold its [`fill_target`], so they read as deep as the chunks actually indexed
/// need ([`fill_depth`] hits a lane at most); `None` for a query that does not fill.
pub fn fill_pool(query: &Query, default_budget: usize) -> Option<usize> {
    fills(query).then(|| fill_target(budget_asked(query, default_budget)))
}

/// Results a filled query needs, from the stored token counts of its ranked candidates (best
/// first): `k` when the first `k` already hold the budget (more would only be shortened to fit);
/// else the fewest whose tokens reach its [`fill_target`], or all of them; at most
/// `limit`.
pub fn fill_results(
    tokens: impl IntoIterator<Item = u32>,
    budget: usize,
    k: usize,
    limit: usize,
) -> usize {
    let target = fill_target(budget);
    let (mut held, mut needed) = (0usize, 0usize);
    for chunk in tokens {
        if held >= target || (needed == k && held >= budget) {
            break;
        }
        held = held.saturating_add(chunk as usize);
        needed += 1;
    }
    needed.max(k).min(limit)
}

/// Results asked for: `k`, defaulting to `default_k` (`deep_k` for `deep`), at most the query's
/// [`k_limit`] (50; a bounded query's grows with its budget).
///
/// Here and below, `config` is the query's settings: the `[query]` section with its preset resolved
/// ([`QueryConfig::settings`]).
pub fn results_wanted(query: &Query, config: &QueryConfig) -> usize {
    let default = if query.mode == Mode::Deep {
        config.deep_k
    } else {
        config.default_k
    };
    query
        .k
        .unwrap_or(default)
        .clamp(1, k_limit(query, config.default_token_budget))
}

/// Results of a query at its ranked `candidates`: [`results_wanted`], or for a query that fills its
/// budget ([`fills`]) as many as its budget needs, counted in the candidates' stored tokens
/// ([`fill_results`]).
pub fn results_for(query: &Query, config: &QueryConfig, candidates: &[Candidate]) -> usize {
    let k = results_wanted(query, config);
    if !fills(query) {
        return k;
    }
    let budget = budget_asked(query, config.default_token_budget);
    let limit = k_limit(query, config.default_token_budget);
    fill_results(
        candidates.iter().map(|c| c.stored.chunk.tokens),
        budget,
        k,
        limit,
    )
}

/// Candidates per lane: the intent's depth for that lane, at least twice the results wanted, the
/// `min_pool` and a filled budget's [`fill_depth`]; at most twice the deep mode's most
/// results, or that floor where it is deeper, never past twice the query's [`k_limit`]; a `files`
/// query's `pool` when it gives one.
pub fn lane_depths(query: &Query, intent: Depth, config: &QueryConfig) -> Depth {
    depths(query, intent, config, true)
}

/// The pool of a filled query's lanes ([`fill_pool`]): they keep their best hits, in turn, until the
/// distinct chunks hold the query's fill target, each at least as many as it reads without filling.
pub fn lane_pool(query: &Query, intent: Depth, config: &QueryConfig) -> Option<Pool> {
    let tokens = fill_pool(query, config.default_token_budget)?;
    let floor = depths(query, intent, config, false);
    Some(Pool {
        tokens,
        dense: floor.dense,
        bm25: floor.bm25,
    })
}

/// [`lane_depths`], with or without a filled budget's depth.
fn depths(query: &Query, intent: Depth, config: &QueryConfig, filled: bool) -> Depth {
    if let (Mode::Files, Some(pool)) = (query.mode, query.pool) {
        let pool = pool.clamp(1, super::modes::MAX_FILES_POOL);
        return Depth {
            dense: pool,
            bm25: pool,
        };
    }
    let filled = if filled {
        fill_depth(query, config.default_token_budget)
    } else {
        0
    };
    let floor = (2 * results_wanted(query, config))
        .max(config.min_pool)
        .max(filled);
    // Twice the deep mode's most results, or the floor where the budget asks for more: never past
    // twice the query's limit.
    let most = floor
        .max(2 * DEEP_MAX_K)
        .min(2 * k_limit(query, config.default_token_budget));
    let depth = |lane: usize| lane.max(floor).min(most);
    Depth {
        dense: depth(intent.dense),
        bm25: depth(intent.bm25),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(json: &str) -> Query {
        serde_json::from_str(json).expect("query")
    }

    #[test]
    fn k_limit_grows_with_the_budget_within_bounds() {
        let bounded = |budget: usize| {
            query(&format!(
                r#"{{"query_id":"q","tenant":"t","text":"x","token_budget":{budget}}}"#
            ))
        };
        assert_eq!(k_limit(&bounded(500), 3000), DEEP_MAX_K);
        assert_eq!(k_limit(&bounded(8000), 3000), 250);
        assert_eq!(k_limit(&bounded(1_000_000), 3000), MAX_K);
        let windowed = query(r#"{"query_id":"q","tenant":"t","text":"x","context_window":6400}"#);
        assert_eq!(k_limit(&windowed, 3000), 200);
        let default = query(r#"{"query_id":"q","tenant":"t","text":"x"}"#);
        assert_eq!(k_limit(&default, 16_000), MAX_K);
        let deep =
            query(r#"{"query_id":"q","tenant":"t","text":"x","mode":"deep","token_budget":8000}"#);
        assert_eq!(k_limit(&deep, 3000), DEEP_MAX_K);
    }

    #[test]
    fn only_a_filled_query_without_k_reads_deeper() {
        let filled =
            query(r#"{"query_id":"q","tenant":"t","text":"x","token_budget":8000,"fill":true}"#);
        assert_eq!(fill_depth(&filled, 3000), 85);
        let given_k = query(
            r#"{"query_id":"q","tenant":"t","text":"x","token_budget":8000,"fill":true,"k":5}"#,
        );
        assert_eq!(fill_depth(&given_k, 3000), 0);
        let stopped = query(r#"{"query_id":"q","tenant":"t","text":"x","token_budget":8000}"#);
        assert_eq!(fill_depth(&stopped, 3000), 0);
        let huge =
            query(r#"{"query_id":"q","tenant":"t","text":"x","token_budget":1000000,"fill":true}"#);
        assert_eq!(
            fill_depth(&huge, 3000),
            10_625,
            "the caller caps it at twice the k limit"
        );
    }

    #[test]
    fn the_fill_target_spares_a_few_chunks_whatever_the_budget() {
        // Half of a small budget, 500 tokens in between, a sixteenth of a large one.
        assert_eq!(fill_target(100), 150);
        assert_eq!(fill_target(500), 750);
        assert_eq!(fill_target(1000), 1500);
        assert_eq!(fill_target(1500), 2000);
        assert_eq!(fill_target(2000), 2500);
        assert_eq!(fill_target(4000), 4500);
        assert_eq!(fill_target(8000), 8500);
        assert_eq!(fill_target(16_000), 17_000);
        assert_eq!(fill_target(32_000), 34_000);
        assert_eq!(fill_target(0), 0);
        assert_eq!(fill_target(usize::MAX), usize::MAX);
    }

    #[test]
    fn fill_results_count_the_candidates_tokens() {
        // 100-token chunks: ten hold a 1000-token budget, so k stays; a 2000-token budget needs 25
        // of them to hold it and its 500 spare tokens, and 90-token chunks 17 for 1000 (1.5 times).
        assert_eq!(fill_results([100; 50], 1000, 10, 400), 10);
        assert_eq!(fill_results([100; 50], 2000, 10, 400), 25);
        assert_eq!(fill_results([90; 50], 1000, 10, 400), 17);
        // Never fewer than k, never more than the limit or than there are.
        assert_eq!(fill_results([1000; 50], 1000, 10, 400), 10);
        assert_eq!(fill_results([10; 50], 1000, 10, 30), 30);
        assert_eq!(fill_results([10; 25], 1000, 10, 400), 25);
        // Uneven sizes: counted as they come, best first.
        assert_eq!(
            fill_results([150, 100, 100, 400, 100, 900], 1000, 1, 400),
            6
        );
        assert_eq!(fill_results([150, 100, 100, 400, 100, 900], 400, 2, 400), 4);
        assert_eq!(fill_results([1500, 100, 100], 1000, 1, 400), 1);
        assert_eq!(fill_results(std::iter::empty(), 1000, 10, 400), 10);
    }
}
