//! Durations in the configuration: held as [`Duration`], written as whole seconds or milliseconds
//! under keys that say which (`ttl_secs`, `timeout_ms`), so a file reads as it always did and the
//! code never converts a bare number.
//!
//! ```
//! use std::time::Duration;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Section {
//!     #[serde(with = "ragstream_core::duration::secs")]
//!     ttl_secs: Duration,
//!     #[serde(with = "ragstream_core::duration::millis")]
//!     timeout_ms: Duration,
//! }
//!
//! let section: Section = serde_json::from_str(r#"{"ttl_secs": 60, "timeout_ms": 250}"#).unwrap();
//! assert_eq!(section.ttl_secs, Duration::from_secs(60));
//! assert_eq!(section.timeout_ms, Duration::from_millis(250));
//! assert_eq!(serde_json::to_string(&section).unwrap(), r#"{"ttl_secs":60,"timeout_ms":250}"#);
//! ```

use std::time::Duration;

/// A [`Duration`] written as whole seconds.
pub mod secs {
    use super::Duration;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes whole seconds (a fraction is dropped).
    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(duration.as_secs())
    }

    /// Reads whole seconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        u64::deserialize(deserializer).map(Duration::from_secs)
    }
}

/// A [`Duration`] written as whole milliseconds.
pub mod millis {
    use super::Duration;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes whole milliseconds (saturating at `u64::MAX`).
    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
    }

    /// Reads whole milliseconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        u64::deserialize(deserializer).map(Duration::from_millis)
    }
}
