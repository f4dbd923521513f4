//! The pin table: each live sequence's backend, from its first request until `sequence_end`
//! or an idle timeout, so that live sequences never move when the fleet changes.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dashmap::DashMap;

use crate::protocol::SequenceId;

#[derive(Debug, Clone, PartialEq, Eq)]
struct PinKey {
    model: String,
    id: SequenceId,
}

/// A key as lookups see it: the map is searched with the request's own model and id,
/// borrowed, instead of an owned key built (one or two allocations) for every lookup.
trait KeyParts {
    fn parts(&self) -> (&str, &SequenceId);
}

impl KeyParts for PinKey {
    fn parts(&self) -> (&str, &SequenceId) {
        (&self.model, &self.id)
    }
}

impl KeyParts for (&str, &SequenceId) {
    fn parts(&self) -> (&str, &SequenceId) {
        (self.0, self.1)
    }
}

// A stored key and a borrowed one hash and compare by the same parts, as `Borrow` requires.
impl Hash for PinKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.parts().hash(state)
    }
}

impl Hash for dyn KeyParts + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.parts().hash(state)
    }
}

impl PartialEq for dyn KeyParts + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn KeyParts + '_ {}

impl<'a> Borrow<dyn KeyParts + 'a> for PinKey {
    fn borrow(&self) -> &(dyn KeyParts + 'a) {
        self
    }
}

struct Pin {
    backend: String,
    last_seen: Instant,
    /// When a shared store last held this pin (set, read or refreshed there), or when it was
    /// made here. Unused without a shared store.
    confirmed: Instant,
    /// No refresh of this pin is started before this instant: one at a time.
    refresh_after: Instant,
}

/// A pin as the cache of a shared store sees it (`crate::pinstore`).
#[derive(Debug, PartialEq, Eq)]
pub enum Cached {
    Absent,
    /// Confirmed within the store's TTL: the store still holds it. `refresh` says that it is
    /// this request's turn to refresh it there.
    Fresh {
        refresh: bool,
    },
    /// Not confirmed for a whole TTL: the store may have let it expire, and another replica
    /// may have pinned the sequence since.
    Stale,
}

/// The table's lock shards. A shard is locked whole while the sweep visits it and while it
/// grows (a rehash of all its entries), and a request that needs it waits: with dashmap's
/// default of four per core (4 on a gateway pinned to one core) and millions of live
/// sequences, such a wait reached 24 to 140 ms (the p99 of bench/proxy_core.sh's P2, a new
/// sequence per request); with 64 shards it was 2 to 12 ms. 256 shards cost a few KiB.
const PIN_SHARDS: usize = 256;

pub struct PinTable {
    pins: DashMap<PinKey, Pin>,
    /// The number of pins, kept beside the map: `DashMap::len` read-locks every shard, and
    /// the cap is checked on every new sequence.
    count: AtomicUsize,
    cap: usize,
    idle: Duration,
}

impl PinTable {
    pub fn new(cap: usize, idle: Duration) -> Self {
        PinTable {
            pins: DashMap::with_shard_amount(PIN_SHARDS),
            count: AtomicUsize::new(0),
            cap,
            idle,
        }
    }

    pub fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The backend key a live sequence is pinned to; touching it keeps it alive.
    pub fn get(&self, model: &str, id: &SequenceId) -> Option<String> {
        let key = (model, id);
        let key = &key as &dyn KeyParts;
        let now = Instant::now();
        let mut pin = self.pins.get_mut(key)?;
        if now.duration_since(pin.last_seen) >= self.idle {
            drop(pin);
            if self
                .pins
                .remove_if(key, |_, p| now.duration_since(p.last_seen) >= self.idle)
                .is_some()
            {
                self.count.fetch_sub(1, Ordering::Relaxed);
            }
            return None;
        }
        pin.last_seen = now;
        Some(pin.backend.clone())
    }

    /// Pins a sequence. Returns false when the table is full; the sequence is then routed by
    /// the hash alone. A full table is not swept here: with every pin live, each new sequence
    /// would scan the whole table on a request's path. The periodic sweep makes room.
    pub fn insert(&self, model: &str, id: &SequenceId, backend: &str) -> bool {
        if self.len() >= self.cap && !self.pins.contains_key(&(model, id) as &dyn KeyParts) {
            return false;
        }
        let key = PinKey {
            model: model.to_string(),
            id: id.clone(),
        };
        let now = Instant::now();
        let before = self.pins.insert(
            key,
            Pin {
                backend: backend.to_string(),
                last_seen: now,
                confirmed: now,
                refresh_after: now,
            },
        );
        if before.is_none() {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// The state of a pin against a shared store whose entries live `ttl` after their last
    /// refresh. At most one caller per `refresh_every` is told to refresh it.
    pub fn cached(
        &self,
        model: &str,
        id: &SequenceId,
        ttl: Duration,
        refresh_every: Duration,
    ) -> Cached {
        let Some(mut pin) = self.pins.get_mut(&(model, id) as &dyn KeyParts) else {
            return Cached::Absent;
        };
        let now = Instant::now();
        let age = now.duration_since(pin.confirmed);
        if age >= ttl {
            return Cached::Stale;
        }
        let refresh = age >= refresh_every && now >= pin.refresh_after;
        if refresh {
            pin.refresh_after = now + refresh_every;
        }
        Cached::Fresh { refresh }
    }

    /// Records that the shared store holds `backend` for a sequence pinned here (after
    /// reading it there, or writing it). A pin that ended meanwhile stays ended.
    pub fn confirm(&self, model: &str, id: &SequenceId, backend: &str) {
        if let Some(mut pin) = self.pins.get_mut(&(model, id) as &dyn KeyParts) {
            if pin.backend != backend {
                pin.backend = backend.to_string();
            }
            pin.confirmed = Instant::now();
        }
    }

    pub fn remove(&self, model: &str, id: &SequenceId) {
        if self.pins.remove(&(model, id) as &dyn KeyParts).is_some() {
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Drops idle pins. It visits the whole table, so it runs on a blocking thread, every
    /// `sweep_interval`, never on a request's path.
    pub fn sweep_now(&self) {
        let now = Instant::now();
        let mut removed = 0;
        self.pins.retain(|_, p| {
            let keep = now.duration_since(p.last_seen) < self.idle;
            removed += usize::from(!keep);
            keep
        });
        self.count.fetch_sub(removed, Ordering::Relaxed);
    }

    /// A quarter of the idle timeout, within 100 ms and 60 s: a pin outlives its timeout
    /// by at most that much, unless a request touches it first.
    pub fn sweep_interval(&self) -> Duration {
        (self.idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(60))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_live_until_removed() {
        let t = PinTable::new(10, Duration::from_secs(60));
        let id = SequenceId::Uint(5);
        assert_eq!(t.get("m", &id), None);
        assert!(t.insert("m", &id, "b1"));
        assert_eq!(t.get("m", &id).as_deref(), Some("b1"));
        assert_eq!(t.get("other", &id), None);
        t.remove("m", &id);
        assert_eq!(t.get("m", &id), None);
    }

    #[test]
    fn cached_pins_turn_stale_after_the_ttl_and_refresh_one_at_a_time() {
        let t = PinTable::new(10, Duration::from_secs(60));
        let id = SequenceId::Uint(9);
        let (ttl, every) = (Duration::from_millis(80), Duration::from_millis(20));
        assert_eq!(t.cached("m", &id, ttl, every), Cached::Absent);
        t.insert("m", &id, "b1");
        assert_eq!(
            t.cached("m", &id, ttl, every),
            Cached::Fresh { refresh: false }
        );
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(
            t.cached("m", &id, ttl, every),
            Cached::Fresh { refresh: true }
        );
        assert_eq!(
            t.cached("m", &id, ttl, every),
            Cached::Fresh { refresh: false },
            "one refresh at a time"
        );
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(t.cached("m", &id, ttl, every), Cached::Stale);
        t.confirm("m", &id, "b2");
        assert_eq!(
            t.cached("m", &id, ttl, every),
            Cached::Fresh { refresh: false }
        );
        assert_eq!(t.get("m", &id).as_deref(), Some("b2"));
        t.remove("m", &id);
        t.confirm("m", &id, "b3");
        assert_eq!(t.get("m", &id), None, "an ended pin stays ended");
    }

    #[test]
    fn the_cap_holds_and_idle_pins_make_room() {
        let t = PinTable::new(2, Duration::from_millis(30));
        assert!(t.insert("m", &SequenceId::Uint(1), "a"));
        assert!(t.insert("m", &SequenceId::String("x".into()), "a"));
        assert!(!t.insert("m", &SequenceId::Uint(3), "a"));
        assert_eq!(t.len(), 2);
        std::thread::sleep(Duration::from_millis(50));
        // Touching an idle pin drops it, which makes room; the sweep drops the others.
        assert_eq!(t.get("m", &SequenceId::Uint(1)), None);
        assert!(t.insert("m", &SequenceId::Uint(3), "a"));
        assert_eq!(t.len(), 2);
        std::thread::sleep(Duration::from_millis(50));
        t.sweep_now();
        assert_eq!(t.len(), 0);
        assert_eq!(t.sweep_interval(), Duration::from_millis(100));
    }

    #[test]
    fn the_count_follows_every_way_in_and_out() {
        let t = PinTable::new(10, Duration::from_secs(60));
        let (one, two) = (SequenceId::Uint(1), SequenceId::String("1".into()));
        assert!(t.insert("m", &one, "a"));
        // Re-pinning a live sequence replaces it; it is not a second pin.
        assert!(t.insert("m", &one, "b"));
        assert!(t.insert("m", &two, "a"));
        assert_eq!(t.len(), 2);
        t.remove("m", &one);
        t.remove("m", &one);
        assert_eq!(t.len(), 1);
        t.remove("other", &two);
        assert_eq!(t.len(), 1);
        t.sweep_now();
        assert_eq!(t.len(), 1);
        t.remove("m", &two);
        assert!(t.is_empty());
    }
}
