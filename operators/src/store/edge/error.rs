//! The engine's errors as [`StoreError`]s: outages (retried) apart from refusals.

use crate::store::StoreError;

/// The engine's errors that say it cannot serve now (its runtime, storage, memory, a deadline; a
/// full disk shows as a runtime error), not that the request is wrong: retried, never dead-lettered.
/// The engine's error type is not exported, so its messages are matched.
const ENGINE_OUTAGES: [&str; 5] = [
    "Service runtime error",
    "Inconsistent storage",
    "Out of memory",
    "Operation cancelled",
    "Timeout error",
];

/// An engine error: [`StoreError::Unavailable`] for an outage ([`ENGINE_OUTAGES`]), else
/// [`StoreError::Invalid`].
pub(super) fn engine_error(error: impl std::fmt::Display) -> StoreError {
    let message = error.to_string();
    if ENGINE_OUTAGES
        .iter()
        .any(|outage| message.starts_with(outage))
    {
        StoreError::Unavailable(message)
    } else {
        StoreError::Invalid(message)
    }
}

/// A file-system error: the store cannot serve now.
pub(super) fn io_error(error: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(error.to_string())
}
