//! Per-credential request rates: a token bucket per bearer token (by the name of its environment
//! variable), refilled at `http.token_requests_per_second` up to `http.token_burst`. A request of
//! the data routes and `/mcp` takes one; with none left it is answered 429 `rate_limited` with
//! `Retry-After`, so one credential's flood cannot crowd out the others' requests. A job with no
//! token (loopback, or `http.anonymous`) has no credential to tell callers apart by, and limits
//! none. Health, readiness, metrics and the OpenAPI document are not counted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The buckets of every credential seen (as many as there are tokens configured, plus one).
pub(super) struct RateLimits {
    per_second: f64,
    burst: f64,
    buckets: Mutex<HashMap<Arc<str>, Bucket>>,
}

struct Bucket {
    left: f64,
    at: Instant,
}

impl RateLimits {
    /// `per_second` requests a second, `burst` at once; `per_second` 0: no limit.
    pub(super) fn new(per_second: f64, burst: std::num::NonZeroU32) -> Self {
        Self {
            per_second,
            burst: f64::from(burst.get()),
            buckets: Mutex::default(),
        }
    }

    /// Takes one request of `credential`'s at `now`; `Err`: how long until it may send the next.
    pub(super) fn take(&self, credential: &Arc<str>, now: Instant) -> Result<(), Duration> {
        if self.per_second <= 0.0 || &**credential == super::access::ANONYMOUS {
            return Ok(());
        }
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = buckets.entry(credential.clone()).or_insert(Bucket {
            left: self.burst,
            at: now,
        });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.left = (bucket.left + elapsed * self.per_second).min(self.burst);
        bucket.at = now;
        if bucket.left >= 1.0 {
            bucket.left -= 1.0;
            return Ok(());
        }
        Err(Duration::from_secs_f64(
            (1.0 - bucket.left) / self.per_second,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_gets_its_burst_then_its_rate_and_others_are_not_touched() {
        let limits = RateLimits::new(10.0, std::num::NonZeroU32::new(5).expect("not zero"));
        let (flood, other): (Arc<str>, Arc<str>) = (Arc::from("FLOOD"), Arc::from("OTHER"));
        let start = Instant::now();
        for _ in 0..5 {
            limits.take(&flood, start).expect("within the burst");
        }
        let wait = limits.take(&flood, start).unwrap_err();
        assert!(
            (Duration::from_millis(99)..=Duration::from_millis(101)).contains(&wait),
            "{wait:?}"
        );
        limits
            .take(&other, start)
            .expect("another credential has its own bucket");
        // A tenth of a second later one more request is allowed, and only one.
        let later = start + Duration::from_millis(100);
        limits.take(&flood, later).expect("refilled by one");
        assert!(limits.take(&flood, later).is_err());
        // Never more than the burst, however long the credential was quiet.
        let much_later = start + Duration::from_secs(3600);
        let allowed = (0..100)
            .filter(|_| limits.take(&flood, much_later).is_ok())
            .count();
        assert_eq!(allowed, 5);
        // Rate 0: no limit; no token: no credential to limit.
        let off = RateLimits::new(0.0, std::num::NonZeroU32::MIN);
        assert!((0..1000).all(|_| off.take(&flood, start).is_ok()));
        let anonymous: Arc<str> = Arc::from(crate::http::access::ANONYMOUS);
        assert!((0..1000).all(|_| limits.take(&anonymous, start).is_ok()));
    }
}
