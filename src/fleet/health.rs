//! Passive health: a backend is ejected after consecutive failures (connection failures, 5xx
//! answers, unusable 200s, overruns of the configured timeout), for a backoff that doubles
//! with each ejection, and comes back when it passes.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
pub struct EjectionPolicy {
    pub after_failures: u32,
    pub base: Duration,
    pub max: Duration,
}

pub struct Health {
    epoch: Instant,
    consecutive_failures: AtomicU32,
    /// Ejections in a row without a success in between, for the backoff.
    streak: AtomicU32,
    /// Milliseconds since `epoch` until which the backend is ejected (0: not ejected).
    ejected_until_ms: AtomicU64,
    /// Total ejections, for metrics.
    pub ejections: AtomicU64,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            epoch: Instant::now(),
            consecutive_failures: AtomicU32::new(0),
            streak: AtomicU32::new(0),
            ejected_until_ms: AtomicU64::new(0),
            ejections: AtomicU64::new(0),
        }
    }
}

impl Health {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub fn is_ejected(&self) -> bool {
        self.ejected_until_ms.load(Ordering::Relaxed) > self.now_ms()
    }

    pub fn record_success(&self) {
        self.consecutive_failures.store(0, Ordering::Relaxed);
        self.streak.store(0, Ordering::Relaxed);
    }

    /// Counts a failure; returns true when it ejects the backend.
    pub fn record_failure(&self, policy: &EjectionPolicy) -> bool {
        let failures = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures < policy.after_failures || self.is_ejected() {
            return false;
        }
        self.consecutive_failures.store(0, Ordering::Relaxed);
        let streak = self.streak.fetch_add(1, Ordering::Relaxed).min(16);
        let backoff = policy.base.saturating_mul(1 << streak).min(policy.max);
        self.ejected_until_ms.store(
            self.now_ms() + backoff.as_millis() as u64,
            Ordering::Relaxed,
        );
        self.ejections.fetch_add(1, Ordering::Relaxed);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ejects_after_consecutive_failures_and_comes_back() {
        let p = EjectionPolicy {
            after_failures: 2,
            base: Duration::from_millis(30),
            max: Duration::from_secs(1),
        };
        let h = Health::default();
        assert!(!h.record_failure(&p));
        h.record_success();
        assert!(!h.record_failure(&p));
        assert!(h.record_failure(&p));
        assert!(h.is_ejected());
        std::thread::sleep(Duration::from_millis(50));
        assert!(!h.is_ejected());
        assert_eq!(h.ejections.load(Ordering::Relaxed), 1);
    }
}
