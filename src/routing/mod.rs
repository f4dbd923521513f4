//! Choosing a backend: sequences by their pin or by a consistent hash that every replica
//! computes alike, everything else by load (power of two choices on outstanding requests).

pub mod pins;
pub mod table;

use std::sync::Arc;
use std::time::Duration;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::error::GatewayError;
use crate::protocol::{RequestOptions, SequenceId};
use pins::PinTable;
use table::{PastTable, SequenceTable};

/// What routing needs to know of a backend. The fleet's handles provide it; routing never
/// reaches up into the fleet.
pub trait Candidate {
    /// Identity for hashing and pins: the same on every replica.
    fn key(&self) -> &str;
    fn weight(&self) -> u32;
    /// Requests sent and not yet answered.
    fn outstanding(&self) -> usize;
    fn is_ejected(&self) -> bool;
}

/// A model's backends as routing sees them: those that report it ready, its current
/// sequence table over them, and its past tables.
pub struct Choices<'a, C> {
    pub ready: &'a [Arc<C>],
    pub table: &'a SequenceTable,
    pub history: &'a [PastTable],
}

/// The hash seed is fixed: replicas must agree, so nothing here may vary per process.
const SEED: u64 = 0x7465_6e73_6f72_6761;

/// The routing key of a sequence: the model name and the id. No allocation: the model's
/// hash seeds the hash of the id, and the id's kind is folded in so that 7 and "7" differ.
pub fn sequence_key(model: &str, id: &SequenceId) -> u64 {
    let model_seed = xxh3_64_with_seed(model.as_bytes(), SEED);
    match id {
        SequenceId::Uint(u) => xxh3_64_with_seed(&u.to_le_bytes(), model_seed ^ 0x75),
        SequenceId::String(s) => xxh3_64_with_seed(s.as_bytes(), model_seed ^ 0x73),
    }
}

pub fn describe_sequence(id: &SequenceId) -> String {
    match id {
        SequenceId::Uint(u) => u.to_string(),
        SequenceId::String(s) => format!("'{s}'"),
    }
}

/// Power of two choices on outstanding requests, among backends not ejected (all of them
/// if every one is ejected, rather than failing outright). The two candidates are drawn in
/// proportion to their weights and compared by outstanding requests per unit of weight, so
/// weights hold both when idle (the first draw wins ties) and under load.
pub fn pick_by_load<C: Candidate>(candidates: &[Arc<C>], exclude: Option<&str>) -> Option<Arc<C>> {
    let usable: Vec<&Arc<C>> = candidates
        .iter()
        .filter(|h| Some(h.key()) != exclude && !h.is_ejected())
        .collect();
    let usable = if usable.is_empty() {
        candidates
            .iter()
            .filter(|h| Some(h.key()) != exclude)
            .collect()
    } else {
        usable
    };
    match usable.len() {
        0 => None,
        1 => Some(usable[0].clone()),
        _ => {
            let (a, b) = two_by_weight(&usable);
            let load = |h: &C| h.outstanding() as f64 / h.weight().max(1) as f64;
            Some(if load(usable[b]) < load(usable[a]) {
                usable[b].clone()
            } else {
                usable[a].clone()
            })
        }
    }
}

/// Two distinct indices of `usable` (at least two long), each drawn with probability
/// proportional to weight (the second among the rest).
fn two_by_weight<C: Candidate>(usable: &[&Arc<C>]) -> (usize, usize) {
    let n = usable.len();
    if usable.iter().all(|h| h.weight() == usable[0].weight()) {
        let a = fastrand::usize(..n);
        let mut b = fastrand::usize(..n - 1);
        if b >= a {
            b += 1;
        }
        return (a, b);
    }
    let weight = |i: usize| u64::from(usable[i].weight().max(1));
    let total: u64 = (0..n).map(weight).sum();
    let draw = |skip: Option<usize>, total: u64| {
        let mut r = fastrand::u64(..total);
        for i in (0..n).filter(|i| Some(*i) != skip) {
            if r < weight(i) {
                return i;
            }
            r -= weight(i);
        }
        unreachable!("r < total, the sum of the weights drawn over")
    };
    let a = draw(None, total);
    (a, draw(Some(a), total - weight(a)))
}

/// Where a request goes.
pub struct Route<C> {
    pub backend: Arc<C>,
    /// For a request inside a sequence that this replica has no pin for, routed by the
    /// hash: the owners of the sequence under the model's past tables (newest first) that
    /// are still ready. After a membership change, a sequence that started under an older
    /// table lives on its owner there. Another replica would have pinned it, but this one
    /// cannot tell, so a backend that rejects the request as an unknown sequence (a 400,
    /// which changes no state) is followed by these, in order.
    pub fallbacks: Vec<Arc<C>>,
    /// This request pinned the sequence (it had no pin here): a pin to forget if no backend
    /// takes the request, so that requests nothing accepts do not fill the pin table.
    pub pinned_now: bool,
    /// The route is a pin held before this request: as far as this replica knows, the
    /// sequence is live on that backend.
    pub followed_pin: bool,
}

impl<C> Route<C> {
    /// The route's backend is to be pinned if it serves the request: a sequence routed by
    /// the hash with past owners to fall back on, which `route` left unpinned.
    pub fn pin_when_served(&self) -> bool {
        !self.fallbacks.is_empty()
    }
}

pub struct Router {
    pub pins: std::sync::Arc<PinTable>,
}

impl Router {
    pub fn new(max_sequences: usize, idle: Duration) -> Self {
        Router {
            pins: std::sync::Arc::new(PinTable::new(max_sequences, idle)),
        }
    }

    /// The backend for a request. `exclude` names a backend that just refused a connection.
    pub fn route<C: Candidate>(
        &self,
        entry: Choices<'_, C>,
        model: &str,
        opts: &RequestOptions,
        exclude: Option<&str>,
    ) -> Result<Route<C>, GatewayError> {
        let Some(id) = &opts.sequence_id else {
            let backend = pick_by_load(entry.ready, exclude).ok_or_else(|| no_backend(model))?;
            return Ok(Route {
                backend,
                fallbacks: Vec::new(),
                pinned_now: false,
                followed_pin: false,
            });
        };
        if !opts.sequence_start {
            if let Some(pinned) = self.pins.get(model, id) {
                // A pinned sequence goes to its backend or nowhere: its state lives there.
                return match entry.ready.iter().find(|h| h.key() == &*pinned) {
                    // The pin outlives an end request until the end is served
                    // (`ended`): a retry of a failed end must find the same backend.
                    Some(h) => Ok(Route {
                        backend: h.clone(),
                        fallbacks: Vec::new(),
                        pinned_now: false,
                        followed_pin: true,
                    }),
                    None => {
                        self.pins.remove(model, id);
                        Err(sequence_lost(
                            model,
                            id,
                            &pinned,
                            "is not available to this replica (unhealthy, ejected, or not in its fleet); if it is gone, the sequence's state is lost",
                        ))
                    }
                };
            }
        }
        if opts.sequence_start {
            // A start of an id this replica pins restarts that sequence where it lives, as
            // the shared store has it run: the server ends the old one there, and replicas
            // that pinned it too keep reaching the new one. Sent by the hash instead, it left
            // the old state live on its server, and another replica's pin sent the id's next
            // request to it: a 200 with the old sum. The pin stands if the start is refused.
            if let Some(pinned) = self.pins.get(model, id) {
                let usable = entry
                    .ready
                    .iter()
                    .find(|h| h.key() == &*pinned && !h.is_ejected() && Some(h.key()) != exclude);
                if let Some(h) = usable {
                    return Ok(Route {
                        backend: h.clone(),
                        fallbacks: Vec::new(),
                        pinned_now: false,
                        followed_pin: false,
                    });
                }
            }
        }
        // A start, or a sequence this replica has not seen: the consistent hash decides,
        // as it does on every replica.
        let key = sequence_key(model, id);
        let owner = entry
            .table
            .lookup(key)
            .map(|i| entry.ready[i].clone())
            .ok_or_else(|| no_backend(model))?;
        let chosen = if opts.sequence_start && (owner.is_ejected() || Some(owner.key()) == exclude)
        {
            // A new sequence need not go to an ejected owner; pick by a fallback hash
            // so that this replica's choice is still stable.
            entry
                .ready
                .iter()
                .filter(|h| !h.is_ejected() && Some(h.key()) != exclude)
                .max_by_key(|h| xxh3_64_with_seed(h.key().as_bytes(), key))
                .cloned()
                .unwrap_or(owner)
        } else {
            owner
        };
        let fallbacks = if opts.sequence_start {
            Vec::new()
        } else {
            past_owners(&entry, key, chosen.key())
        };
        // With past owners to try, which backend holds the sequence is known only once one
        // accepts the request: it is pinned then (`pin_when_served`). Pinned now, the guess
        // sent the sequence's concurrent requests to the hash owner as to a fact, and its
        // refusal read as a lost sequence (503) while the state lived on a past owner.
        let pin_now = fallbacks.is_empty();
        if pin_now {
            self.pin(model, opts, chosen.as_ref());
        }
        Ok(Route {
            backend: chosen,
            fallbacks,
            pinned_now: pin_now && !opts.sequence_end,
            followed_pin: false,
        })
    }

    /// After a backend served the last request of a sequence: its pin goes.
    pub fn ended(&self, model: &str, opts: &RequestOptions) {
        if let (Some(id), true) = (&opts.sequence_id, opts.sequence_end) {
            self.pins.remove(model, id);
        }
    }

    /// Forgets the pin `route` made for a request that no backend accepted.
    pub fn unpin(&self, model: &str, opts: &RequestOptions) {
        if let Some(id) = &opts.sequence_id {
            self.pins.remove(model, id);
        }
    }

    /// Pins a sequence's request to `backend` (after the hash chose it, or after a fallback
    /// found the sequence there); its last request adds none.
    pub fn pin<C: Candidate>(&self, model: &str, opts: &RequestOptions, backend: &C) {
        let Some(id) = &opts.sequence_id else { return };
        if !opts.sequence_end && !self.pins.insert(model, id, backend.key()) {
            tracing::warn!(model, "sequence pin table is full; routing by hash alone");
        }
    }
}

/// The answer to a request of a live sequence whose backend cannot take it (`why`): it may
/// go nowhere else, since its state lives there.
pub fn sequence_lost(model: &str, id: &SequenceId, backend: &str, why: &str) -> GatewayError {
    GatewayError::SequenceLost(format!(
        "the backend of sequence {} of model '{model}' ({backend}) {why}",
        describe_sequence(id)
    ))
}

fn no_backend(model: &str) -> GatewayError {
    GatewayError::Unavailable(format!("no healthy backend serves model '{model}'"))
}

/// The distinct owners of `key` under `entry`'s past tables that are ready now, other than
/// `current`, newest table first.
fn past_owners<C: Candidate>(entry: &Choices<'_, C>, key: u64, current: &str) -> Vec<Arc<C>> {
    let mut owners: Vec<Arc<C>> = Vec::new();
    for past in entry.history {
        let Some(member) = past.table.lookup(key).and_then(|i| past.members.get(i)) else {
            continue;
        };
        if member == current || owners.iter().any(|h| h.key() == member) {
            continue;
        }
        if let Some(h) = entry.ready.iter().find(|h| h.key() == member) {
            owners.push(h.clone());
        }
    }
    owners
}

#[cfg(test)]
const GOLDEN_UINT: u64 = 1408428525561239483;
#[cfg(test)]
const GOLDEN_STRING: u64 = 5227969456568744064;

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::protocol::RequestOptions;

    struct Backend {
        key: String,
        weight: u32,
        outstanding: AtomicUsize,
    }

    impl Candidate for Backend {
        fn key(&self) -> &str {
            &self.key
        }
        fn weight(&self) -> u32 {
            self.weight
        }
        fn outstanding(&self) -> usize {
            self.outstanding.load(Ordering::Relaxed)
        }
        fn is_ejected(&self) -> bool {
            false
        }
    }

    fn handles(keys: &[(&str, u32)]) -> Vec<Arc<Backend>> {
        keys.iter()
            .map(|(k, w)| {
                Arc::new(Backend {
                    key: k.to_string(),
                    weight: *w,
                    outstanding: AtomicUsize::new(0),
                })
            })
            .collect()
    }

    fn options(id: u64, start: bool) -> RequestOptions {
        RequestOptions {
            sequence_id: Some(SequenceId::Uint(id)),
            sequence_start: start,
            ..RequestOptions::default()
        }
    }

    #[test]
    fn weights_hold_when_idle_and_under_load() {
        fastrand::seed(7);
        let backends = handles(&[
            ("http://heavy", 3),
            ("http://light", 1),
            ("http://other", 1),
        ]);
        let share = |picks: &[String], key: &str| {
            picks.iter().filter(|k| *k == key).count() as f64 / picks.len() as f64
        };
        let idle: Vec<String> = (0..5000)
            .map(|_| pick_by_load(&backends, None).unwrap().key.clone())
            .collect();
        // Draw probabilities 3/5, 1/5, 1/5; idle ties go to the first draw.
        assert!(
            (share(&idle, "http://heavy") - 0.6).abs() < 0.03,
            "{}",
            share(&idle, "http://heavy")
        );
        assert!((share(&idle, "http://light") - 0.2).abs() < 0.03);

        // Under load, outstanding requests per unit of weight decide.
        backends[0].outstanding.store(6, Ordering::Relaxed); // 2 per unit
        backends[1].outstanding.store(1, Ordering::Relaxed); // 1 per unit
        backends[2].outstanding.store(3, Ordering::Relaxed); // 3 per unit
        for _ in 0..200 {
            let pick = pick_by_load(&backends, None).unwrap();
            assert_ne!(
                pick.key(),
                "http://other",
                "the most loaded per unit is never picked"
            );
        }
        assert_eq!(
            pick_by_load(&backends, Some("http://light"))
                .map(|h| h.key.clone())
                .as_deref(),
            Some("http://heavy"),
            "heavy (2 per unit) beats other (3 per unit)"
        );
    }

    #[test]
    fn pin_and_unpin_follow_the_fallback() {
        let backends = handles(&[("http://a", 1), ("http://b", 1)]);
        let router = Router::new(100, Duration::from_secs(300));
        router.pin("m", &options(5, false), backends[1].as_ref());
        assert_eq!(
            router.pins.get("m", &SequenceId::Uint(5)).as_deref(),
            Some("http://b")
        );
        router.unpin("m", &options(5, false));
        assert_eq!(router.pins.get("m", &SequenceId::Uint(5)), None);
        let mut end = options(6, false);
        end.sequence_end = true;
        router.pin("m", &end, backends[0].as_ref());
        assert_eq!(
            router.pins.get("m", &SequenceId::Uint(6)),
            None,
            "an end leaves no pin"
        );
    }

    /// Two backends, a router, and sequence `id` pinned to the backend its hash does not
    /// choose (where a sequence lives after a fleet change moved its hash): the backends,
    /// their table, the router, the hash's owner and the pinned one.
    fn pinned_off_hash(id: u64) -> (Vec<Arc<Backend>>, SequenceTable, Router, String, String) {
        let backends = handles(&[("http://a", 1), ("http://b", 1)]);
        let table = SequenceTable::new(&[("http://a", 1), ("http://b", 1)], 1024);
        let router = Router::new(100, Duration::from_secs(300));
        let choices = Choices {
            ready: &backends,
            table: &table,
            history: &[],
        };
        let owner = router
            .route(choices, "m", &options(id, true), None)
            .unwrap()
            .backend
            .key
            .clone();
        let elsewhere = if owner == "http://a" {
            "http://b"
        } else {
            "http://a"
        };
        router.pins.insert("m", &SequenceId::Uint(id), elsewhere);
        (backends, table, router, owner, elsewhere.to_string())
    }

    /// The last request of a sequence goes where the pin says and leaves the pin in place
    /// until it is served: a client that retries a failed end reaches the same backend.
    #[test]
    fn an_end_keeps_its_pin_until_it_is_served() {
        let (backends, table, router, _, elsewhere) = pinned_off_hash(9);
        let choices = || Choices {
            ready: &backends,
            table: &table,
            history: &[],
        };
        let mut end = options(9, false);
        end.sequence_end = true;
        for _ in 0..2 {
            let r = router.route(choices(), "m", &end, None).unwrap();
            assert_eq!(r.backend.key, elsewhere, "the end and its retry");
        }
        router.ended("m", &end);
        assert_eq!(router.pins.get("m", &SequenceId::Uint(9)), None);
    }

    /// A start of a pinned id runs where the pin says, not where the hash would put a new
    /// sequence: the old one is restarted there, not left live beside the new one. Elsewhere
    /// only when the pinned backend is the one that just failed.
    #[test]
    fn a_start_of_a_pinned_id_restarts_it_where_it_lives() {
        let (backends, table, router, owner, elsewhere) = pinned_off_hash(11);
        let choices = || Choices {
            ready: &backends,
            table: &table,
            history: &[],
        };
        let start = router
            .route(choices(), "m", &options(11, true), None)
            .unwrap();
        assert_eq!(start.backend.key, elsewhere);
        assert!(
            !start.pinned_now,
            "a refused start leaves the live sequence's pin"
        );
        let retried = router
            .route(choices(), "m", &options(11, true), Some(&elsewhere))
            .unwrap();
        assert_eq!(retried.backend.key, owner);
        assert_eq!(
            router.pins.get("m", &SequenceId::Uint(11)).as_deref(),
            Some(owner.as_str())
        );
    }

    #[test]
    fn sequence_keys_are_stable_and_typed() {
        // Golden values: replicas running different builds must route alike, so a change
        // here is a breaking change that needs a release note.
        assert_eq!(
            sequence_key("accumulate", &SequenceId::Uint(7)),
            GOLDEN_UINT
        );
        assert_eq!(
            sequence_key("accumulate", &SequenceId::String("7".into())),
            GOLDEN_STRING
        );
        assert_ne!(GOLDEN_UINT, GOLDEN_STRING);
        assert_ne!(sequence_key("other", &SequenceId::Uint(7)), GOLDEN_UINT);
    }
}
