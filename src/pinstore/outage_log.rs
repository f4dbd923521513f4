//! When a failing pin store is worth a log line. Every failure is counted in the metric; the
//! log gets the first failure of each outage at once, then at most one line per
//! `WARN_EVERY` while it lasts, and the recovery line says how many failures went unlogged.
//! An outage that starts soon after another ended is still reported: a rate limit spanning
//! outages would let the recovery line announce the end of an outage nobody saw begin.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// At most one warning per this long within one outage.
const WARN_EVERY: Duration = Duration::from_secs(10);

#[derive(Default)]
pub struct OutageLog {
    /// Milliseconds (of the store's clock, never 0) of the last warning; 0: none in this outage.
    last_warning: AtomicU64,
    /// Failures since the last line about the store.
    unlogged: AtomicU64,
}

impl OutageLog {
    /// A failure at `now_ms`: `Some(failures not logged before this one)` when it is to be
    /// logged.
    pub fn failure(&self, now_ms: u64) -> Option<u64> {
        let now = now_ms.max(1);
        let last = self.last_warning.load(Ordering::Relaxed);
        let earlier = self.unlogged.fetch_add(1, Ordering::Relaxed);
        let quiet = last != 0 && now < last + WARN_EVERY.as_millis() as u64;
        if quiet
            || self
                .last_warning
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return None;
        }
        // This failure is the one logged; those counted meanwhile by other requests stay
        // for the next line.
        self.unlogged.fetch_sub(earlier + 1, Ordering::Relaxed);
        Some(earlier)
    }

    /// The store answered again: the outage is over. Returns the failures no line reported,
    /// and lets the next outage's first failure be logged at once.
    pub fn recovered(&self) -> u64 {
        self.last_warning.store(0, Ordering::Relaxed);
        self.unlogged.swap(0, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_of_an_outage_is_logged_then_one_line_per_period() {
        let log = OutageLog::default();
        assert_eq!(log.failure(5_000), Some(0));
        assert_eq!(log.failure(5_001), None);
        assert_eq!(log.failure(14_999), None);
        assert_eq!(log.failure(15_000), Some(2));
        assert_eq!(log.failure(15_001), None);
        assert_eq!(log.recovered(), 1);
    }

    #[test]
    fn an_outage_soon_after_another_is_logged_at_once() {
        let log = OutageLog::default();
        assert_eq!(log.failure(1_000), Some(0));
        assert_eq!(log.failure(1_500), None);
        assert_eq!(log.recovered(), 1);
        // Two seconds later, well inside the period: a new outage, a new first line.
        assert_eq!(log.failure(3_000), Some(0));
        assert_eq!(log.recovered(), 0);
    }

    #[test]
    fn a_failure_at_the_clocks_start_is_logged_once() {
        let log = OutageLog::default();
        assert_eq!(log.failure(0), Some(0));
        assert_eq!(log.failure(0), None);
    }
}
