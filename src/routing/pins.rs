//! The pin table: each live sequence's backend, from its first request until `sequence_end`
//! or an idle timeout, so that live sequences never move when the fleet changes.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use dashmap::DashMap;

use crate::protocol::SequenceId;

/// A pin costs its entry and nothing on the heap for a numeric id: the model's name and the
/// backend's key are shared with every other pin that names them (`Names`), and its times
/// are milliseconds on the table's clock. The table holds up to `fleet.max_sequences` pins
/// (a million by default), so each byte here is a megabyte there.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PinKey {
    model: Arc<str>,
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
    backend: Arc<str>,
    /// Milliseconds on the table's clock (`PinTable::now`).
    last_seen: u64,
    /// When a shared store last held this pin (set, read or refreshed there), or when it was
    /// made here. Unused without a shared store.
    confirmed: u64,
    /// No refresh of this pin is started before this time: one at a time.
    refresh_after: u64,
}

/// Model names and backend keys, each stored once for all the pins that use it. Names no pin
/// uses any more are dropped by the sweep.
#[derive(Default)]
struct Names(RwLock<HashSet<Arc<str>>>);

impl Names {
    fn get(&self, name: &str) -> Arc<str> {
        // The set is only ever left whole, so a panic elsewhere under its lock cannot have
        // broken it.
        if let Some(n) = self
            .0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
        {
            return n.clone();
        }
        let mut names = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = names.get(name) {
            return n.clone();
        }
        let n: Arc<str> = Arc::from(name);
        names.insert(n.clone());
        n
    }

    fn prune(&self) {
        self.0
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|n| Arc::strong_count(n) > 1);
    }
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
    names: Names,
    epoch: Instant,
    /// The number of pins, kept beside the map: `DashMap::len` read-locks every shard, and
    /// the cap is checked on every new sequence.
    count: AtomicUsize,
    cap: usize,
    idle: Duration,
    /// Pins confirmed before this time (ms on the table's clock) are `Stale` to a shared
    /// store: changes to them may have been missed (`distrust_all`). 0: none.
    trusted_since: AtomicU64,
    /// Changes announced by other replicas, counted per slot of keys (`change_mark`): a claim
    /// whose answer arrives after an announcement about its sequence may carry the backend
    /// from before the change, and must not be trusted as a cache.
    changes: Box<[AtomicU64]>,
    /// Bumped by `distrust_all`: every mark changes.
    changes_epoch: AtomicU64,
}

/// Slots of `PinTable::changes`: a change makes the claims in flight for the keys of its slot
/// ask again, so more slots mean fewer needless claims; 256 counters cost 2 KiB.
const CHANGE_SLOTS: usize = 256;

/// The changes announced for a slot of keys when a claim was sent (`PinTable::change_mark`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangeMark {
    slot: usize,
    count: u64,
}

/// `Pin::confirmed` of a pin the store has not vouched for since a change may have passed it.
const UNCONFIRMED: u64 = u64::MAX;

fn change_slot(model: &str, id: &SequenceId) -> usize {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(model.as_bytes());
    match id {
        SequenceId::Uint(u) => h.update(&u.to_le_bytes()),
        SequenceId::String(s) => h.update(s.as_bytes()),
    }
    (h.digest() % CHANGE_SLOTS as u64) as usize
}

impl PinTable {
    pub fn new(cap: usize, idle: Duration) -> Self {
        PinTable {
            pins: DashMap::with_shard_amount(PIN_SHARDS),
            names: Names::default(),
            epoch: Instant::now(),
            count: AtomicUsize::new(0),
            cap,
            idle,
            trusted_since: AtomicU64::new(0),
            changes: (0..CHANGE_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            changes_epoch: AtomicU64::new(0),
        }
    }

    /// A mark of the changes announced so far that concern this sequence's slot: read before
    /// a claim is sent, and compared by `unconfirm_if_changed` once its answer is in.
    pub fn change_mark(&self, model: &str, id: &SequenceId) -> ChangeMark {
        let slot = change_slot(model, id);
        ChangeMark {
            slot,
            count: self.changes_at(slot),
        }
    }

    fn changes_at(&self, slot: usize) -> u64 {
        self.changes[slot]
            .load(Ordering::Acquire)
            .wrapping_add(self.changes_epoch.load(Ordering::Acquire))
    }

    /// After a claim whose mark was `mark`: if a change was announced meanwhile (perhaps of
    /// this very sequence, after Redis had answered the claim with the backend before it),
    /// the pin is kept but `Stale`, so that the sequence's next request asks the store again.
    pub fn unconfirm_if_changed(&self, model: &str, id: &SequenceId, mark: ChangeMark) {
        if self.changes_at(mark.slot) == mark.count {
            return;
        }
        if let Some(mut pin) = self.pins.get_mut(&(model, id) as &dyn KeyParts) {
            pin.confirmed = UNCONFIRMED;
        }
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn idle_ms(&self) -> u64 {
        self.idle.as_millis() as u64
    }

    pub fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The backend key a live sequence is pinned to; touching it keeps it alive.
    pub fn get(&self, model: &str, id: &SequenceId) -> Option<Arc<str>> {
        let key = (model, id);
        let key = &key as &dyn KeyParts;
        let (now, idle) = (self.now(), self.idle_ms());
        let mut pin = self.pins.get_mut(key)?;
        if now.saturating_sub(pin.last_seen) >= idle {
            drop(pin);
            if self
                .pins
                .remove_if(key, |_, p| now.saturating_sub(p.last_seen) >= idle)
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
            model: self.names.get(model),
            id: id.clone(),
        };
        let now = self.now();
        let before = self.pins.insert(
            key,
            Pin {
                backend: self.names.get(backend),
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
        let (ttl, refresh_every) = (ttl.as_millis() as u64, refresh_every.as_millis() as u64);
        let now = self.now();
        let age = now.saturating_sub(pin.confirmed);
        if pin.confirmed == UNCONFIRMED
            || age >= ttl
            || pin.confirmed < self.trusted_since.load(Ordering::Relaxed)
        {
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
            if &*pin.backend != backend {
                pin.backend = self.names.get(backend);
            }
            pin.confirmed = self.now();
        }
    }

    /// Another replica moved a sequence to `backend`, or removed its pin (`None`), in the
    /// shared store: a pin here that names another backend goes, and the sequence's next
    /// request asks the store. One that names `backend` already stays.
    pub fn follow_change(&self, model: &str, id: &SequenceId, backend: Option<&str>) {
        self.changes[change_slot(model, id)].fetch_add(1, Ordering::AcqRel);
        let key = (model, id);
        let key = &key as &dyn KeyParts;
        if self
            .pins
            .remove_if(key, |_, p| backend != Some(&*p.backend))
            .is_some()
        {
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Makes every pin confirmed so far `Stale` to a shared store, so that each asks it once
    /// more: the changes announced meanwhile may have been missed.
    pub fn distrust_all(&self) {
        // A pin confirmed in this very millisecond is distrusted too: its claim may have been
        // answered before the subscription began. Claims still in flight see the epoch move.
        self.trusted_since.store(self.now() + 1, Ordering::Relaxed);
        self.changes_epoch.fetch_add(1, Ordering::AcqRel);
    }

    pub fn remove(&self, model: &str, id: &SequenceId) {
        if self.pins.remove(&(model, id) as &dyn KeyParts).is_some() {
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Drops idle pins. It visits the whole table, so it runs on a blocking thread, every
    /// `sweep_interval`, never on a request's path.
    pub fn sweep_now(&self) {
        let (now, idle) = (self.now(), self.idle_ms());
        let mut removed = 0;
        self.pins.retain(|_, p| {
            let keep = now.saturating_sub(p.last_seen) < idle;
            removed += usize::from(!keep);
            keep
        });
        self.count.fetch_sub(removed, Ordering::Relaxed);
        self.names.prune();
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
    fn announced_changes_drop_pins_that_name_another_backend() {
        let t = PinTable::new(10, Duration::from_secs(60));
        let (one, two) = (SequenceId::Uint(1), SequenceId::Uint(2));
        assert!(t.insert("m", &one, "b1"));
        assert!(t.insert("m", &two, "b1"));
        // Moved to where this replica already sends it: nothing to do.
        t.follow_change("m", &one, Some("b1"));
        assert_eq!(t.get("m", &one).as_deref(), Some("b1"));
        t.follow_change("m", &one, Some("b2"));
        assert_eq!(t.get("m", &one), None);
        t.follow_change("m", &two, None);
        assert_eq!(t.get("m", &two), None);
        assert!(t.is_empty());
        // A change to a sequence this replica never saw is no pin to drop.
        t.follow_change("m", &SequenceId::Uint(3), None);
        assert!(t.is_empty());
    }

    #[test]
    fn distrusted_pins_are_stale_until_confirmed_again() {
        let t = PinTable::new(10, Duration::from_secs(60));
        let (ttl, every) = (Duration::from_secs(60), Duration::from_secs(15));
        let id = SequenceId::Uint(1);
        assert!(t.insert("m", &id, "b1"));
        std::thread::sleep(Duration::from_millis(3));
        t.distrust_all();
        assert_eq!(t.cached("m", &id, ttl, every), Cached::Stale);
        // Confirmed in the same millisecond as the distrust: its claim may predate it.
        t.confirm("m", &id, "b1");
        std::thread::sleep(Duration::from_millis(3));
        t.confirm("m", &id, "b1");
        assert_eq!(
            t.cached("m", &id, ttl, every),
            Cached::Fresh { refresh: false }
        );
    }

    /// A claim answered after an announcement about its slot leaves its pin `Stale`: Redis
    /// may have answered it before the change it heard of.
    #[test]
    fn a_claim_that_crossed_an_announcement_is_not_trusted() {
        let t = PinTable::new(10, Duration::from_secs(60));
        let (ttl, every) = (Duration::from_secs(60), Duration::from_secs(15));
        let (one, two) = (SequenceId::Uint(1), SequenceId::Uint(2));
        std::thread::sleep(Duration::from_millis(2));
        assert!(t.insert("m", &one, "b1"));
        assert!(t.insert("m", &two, "b1"));
        // No change since the mark: trusted.
        let mark = t.change_mark("m", &one);
        t.confirm("m", &one, "b1");
        t.unconfirm_if_changed("m", &one, mark);
        assert_eq!(
            t.cached("m", &one, ttl, every),
            Cached::Fresh { refresh: false }
        );
        // The change of this sequence arrives before the claim's answer is used.
        let mark = t.change_mark("m", &one);
        t.follow_change("m", &one, Some("b2"));
        assert!(t.insert("m", &one, "b1"));
        t.unconfirm_if_changed("m", &one, mark);
        assert_eq!(t.cached("m", &one, ttl, every), Cached::Stale);
        assert_eq!(
            t.get("m", &one).as_deref(),
            Some("b1"),
            "kept, to be asked about"
        );
        // A resubscription moves every mark.
        let mark = t.change_mark("m", &two);
        t.distrust_all();
        assert_ne!(t.change_mark("m", &two), mark);
    }

    #[test]
    fn names_are_stored_once_and_dropped_with_their_last_pin() {
        let t = PinTable::new(10, Duration::from_millis(20));
        let names = || t.names.0.read().unwrap().len();
        for id in 0..3 {
            assert!(t.insert("m", &SequenceId::Uint(id), "http://b1"));
        }
        assert!(t.insert("m", &SequenceId::String("s".into()), "http://b2"));
        assert_eq!(names(), 3, "m, http://b1 and http://b2, once each");
        let a = t.get("m", &SequenceId::Uint(0)).unwrap();
        let b = t.get("m", &SequenceId::Uint(1)).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "pins share their backend's key");
        drop((a, b));
        t.confirm("m", &SequenceId::Uint(0), "http://b2");
        assert_eq!(
            t.get("m", &SequenceId::Uint(0)).as_deref(),
            Some("http://b2")
        );
        t.remove("m", &SequenceId::String("s".into()));
        t.sweep_now();
        assert_eq!(names(), 3, "every name is still in use");
        std::thread::sleep(Duration::from_millis(40));
        t.sweep_now();
        assert_eq!(
            (t.len(), names()),
            (0, 0),
            "idle pins and their names are gone"
        );
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
