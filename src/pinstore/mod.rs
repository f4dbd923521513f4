//! Shared sequence pins (`[fleet.pins] store = "redis"`): a live sequence's backend as one
//! fact in Redis that every replica reads, so that replicas that disagree about the fleet,
//! or one that just restarted, still send a sequence where its state is.
//!
//! The router's own pin table stays in front as a cache. The store is consulted:
//! - before routing a sequence request this replica holds no fresh pin for: a get-or-claim
//!   that returns the stored backend or claims the one the hash chose (`claim`), batched
//!   with the other claims in flight into one round trip (`claims`);
//! - after a start is served (the start decides, whatever an older sequence with the same
//!   id left), after a past owner served a sequence the hash had moved, and at its end;
//! - in the background, about four times per TTL while a sequence is in use, to renew its
//!   TTL there and to notice a pin another replica changed.
//!
//! Redis is never a reason to fail a request: when an operation fails or times out, the
//! request is routed as without a store (the hash table, the past owners, the local pins),
//! and the store is left alone for a second before it is tried again.

mod claims;
mod outage_log;
mod redis_pins;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::{IntCounter, IntGauge};

use crate::config::redis_url::{check_url, redact};
use crate::config::{PinStoreKind, PinsConfig};
use crate::metrics::Metrics;
use crate::protocol::{RequestOptions, SequenceId};
use crate::routing::pins::{Cached, PinTable};
pub use claims::Claimed;
pub use redis_pins::pin_key;

/// After a failure the store is not asked again for this long: requests meanwhile do not
/// each wait for a timeout.
const BACKOFF: Duration = Duration::from_secs(1);

/// How long the connection operations use may take to come back after an outage, per try.
const RECONNECT: Duration = Duration::from_millis(250);

#[derive(Clone, Copy)]
enum Op {
    Claim,
    Put,
    Remove,
    Refresh,
}

impl Op {
    const ALL: [Op; 4] = [Op::Claim, Op::Put, Op::Remove, Op::Refresh];

    fn name(self) -> &'static str {
        match self {
            Op::Claim => "claim",
            Op::Put => "put",
            Op::Remove => "remove",
            Op::Refresh => "refresh",
        }
    }
}

/// Counter handles resolved once: the request path does no label lookups.
struct OpMetrics {
    /// Round trips of this operation; `None` for claims and renewals, whose round trips the
    /// batcher counts (as "claim"), one per batch.
    calls: Option<IntCounter>,
    errors: IntCounter,
}

pub struct PinStore {
    redis: redis_pins::RedisPins,
    url: String,
    ttl: Duration,
    timeout: Duration,
    refresh_every: Duration,
    ops: [OpMetrics; 4],
    up: IntGauge,
    epoch: Instant,
    /// Milliseconds since `epoch` until which the store is skipped.
    skip_until: AtomicU64,
    outages: outage_log::OutageLog,
    /// Whether a refused announcement has been logged (`note_announcement`).
    announcements_refused: std::sync::atomic::AtomicBool,
    /// Pins this replica had to store and could not (the store did not answer): a start
    /// served while Redis was away, or a move to a past owner. Written back once it answers
    /// (`write_back`), so that the other replicas learn of them instead of following what the
    /// store held before.
    unstored: std::sync::Mutex<std::collections::HashMap<(String, SequenceId), String>>,
}

/// Pins waiting to be written back at most: beyond, the oldest store's word stands for the
/// others (as it would have without the write-back).
const MAX_UNSTORED: usize = 65_536;

/// A subscription silent for this long is asked whether it still answers (PING).
const QUIET_CHECK: Duration = Duration::from_secs(5);

/// How long the startup probe waits for Redis: long enough for a TLS handshake and AUTH to
/// fail with their own errors.
const STARTUP_PROBE: Duration = Duration::from_secs(3);

impl PinStore {
    /// The shared store the config asks for, or `None` for pins in memory only.
    pub fn from_config(
        pins: &PinsConfig,
        idle: Duration,
        metrics: &Metrics,
    ) -> Result<Option<Arc<Self>>, String> {
        if pins.store == PinStoreKind::Memory {
            return Ok(None);
        }
        let url = pins
            .resolve_url()?
            .ok_or("fleet.pins.url is required with store = \"redis\"")?;
        check_url(&url).map_err(|e| format!("fleet.pins.url: {e}"))?;
        let ca = match &pins.ca {
            Some(path) => Some(crate::config::redis_url::read_ca(path)?),
            None => None,
        };
        let timeout = Duration::from_millis(pins.timeout_ms.max(1));
        let round_trips = |op: Op| metrics.pin_store_operations.with_label_values(&[op.name()]);
        let store = PinStore {
            redis: redis_pins::RedisPins::new(
                &url,
                ca,
                &pins.key_prefix,
                idle,
                timeout,
                round_trips(Op::Claim),
            )?,
            url: redact(&url),
            ttl: idle,
            timeout,
            refresh_every: (idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(30)),
            ops: Op::ALL.map(|op| OpMetrics {
                calls: matches!(op, Op::Put | Op::Remove).then(|| round_trips(op)),
                errors: metrics.pin_store_errors.with_label_values(&[op.name()]),
            }),
            up: metrics.pin_store_up.clone(),
            epoch: Instant::now(),
            skip_until: AtomicU64::new(0),
            outages: outage_log::OutageLog::default(),
            announcements_refused: std::sync::atomic::AtomicBool::new(false),
            unstored: Default::default(),
        };
        metrics.expose_pin_store();
        store.up.set(1);
        tracing::info!(url = %store.url, ttl_ms = idle.as_millis() as u64, "sequence pins are shared through Redis");
        Ok(Some(Arc::new(store)))
    }

    /// Starts what the store does beside requests, for `pins`, its cache: `watch` and
    /// `follow_changes`. Both end with the store.
    pub fn start_tasks(self: &Arc<Self>, pins: Arc<PinTable>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(Self::watch(Arc::downgrade(self), pins.clone()));
        self.follow_changes(&runtime, pins);
    }

    /// Says at startup whether Redis accepts this gateway, and if not, why; then, once a
    /// second: while the store is down, probes it, so that `tensorgate_pin_store_up` and the
    /// log say when it answers again even if no sequence request comes to find out; while it
    /// answers, writes back the pins it did not take while it was away (`write_back`).
    async fn watch(store: std::sync::Weak<Self>, pins: Arc<PinTable>) {
        let Some(s) = store.upgrade() else { return };
        // Whether this outage's cause was logged: a request's operation only knows that no
        // answer came within timeout_ms, which reads as a slow Redis when it is down.
        let mut cause_logged = false;
        match s.redis.probe(STARTUP_PROBE).await {
            Ok(()) => tracing::info!(url = %s.url, "the pin store answers"),
            Err(e) => {
                cause_logged = true;
                s.up.set(0);
                tracing::error!(
                    url = %s.url,
                    error = %e,
                    "the pin store cannot be used; sequences are routed as with pins in memory until it can (check the URL's password, fleet.pins.ca, and that Redis runs)"
                )
            }
        }
        drop(s);
        loop {
            tokio::time::sleep(BACKOFF).await;
            let Some(s) = store.upgrade() else { return };
            if s.up.get() != 0 {
                cause_logged = false;
                let waiting = !s
                    .unstored
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .is_empty();
                if waiting && s.now_ms() >= s.skip_until.load(Ordering::Relaxed) {
                    s.write_back(&pins).await;
                }
                continue;
            }
            match s.redis.probe(s.timeout.max(BACKOFF)).await {
                // A new connection answers; the one operations use must too, or the first
                // writes after the outage fail on what it still holds from it. If it does
                // not yet, the next probe tries again.
                Ok(()) => {
                    if s.redis.reconnect(s.timeout.max(RECONNECT)).await.is_ok() {
                        s.mark_up();
                        // At once: a start served during the outage is the newest word on
                        // its id, and other replicas read the store.
                        s.write_back(&pins).await;
                    }
                }
                Err(e) if !cause_logged => {
                    cause_logged = true;
                    tracing::warn!(url = %s.url, error = %e, "the pin store does not answer a new connection either");
                }
                Err(_) => {}
            }
        }
    }

    /// The store answered: up again (and said so) if it was down, and used at once.
    fn mark_up(&self) {
        if self.up.get() == 0 {
            self.up.set(1);
            self.skip_until.store(0, Ordering::Relaxed);
            let unlogged = self.outages.recovered();
            tracing::info!(url = %self.url, failures_not_logged = unlogged, "the pin store answers again; sequences are shared through it");
        }
    }

    /// Before routing a request of a sequence: whether the route must be claimed in the store
    /// (`claim`) because this replica holds no pin the store still vouches for. A fresh pin
    /// whose turn has come is renewed in the background, off the request's path.
    pub fn before_route(
        self: &Arc<Self>,
        pins: &Arc<PinTable>,
        model: &str,
        opts: &RequestOptions,
    ) -> bool {
        let Some(id) = &opts.sequence_id else {
            return false;
        };
        // A start always asks: it must run where the store pins the id, if anywhere, for
        // the replicas whose cache sends the id there (see `Attempt`).
        if opts.sequence_start {
            return true;
        }
        match pins.cached(model, id, self.ttl, self.refresh_every) {
            Cached::Absent | Cached::Stale => true,
            Cached::Fresh { refresh: false } => false,
            Cached::Fresh { refresh: true } => {
                self.refresh_later(pins.clone(), model, id.clone());
                false
            }
        }
    }

    /// Claims the sequence for `chosen`, the backend routing picked: returns the backend the
    /// store holds, `chosen` (created) if no replica had pinned it yet. Without an answer from
    /// the store, `None`: the route stands. The caller reads `PinTable::change_mark` before
    /// and calls `unconfirm_if_changed` once it has pinned what the answer says: the answer
    /// and an announcement of a change come over different connections, in either order.
    pub async fn claim(
        &self,
        pins: &PinTable,
        model: &str,
        id: &SequenceId,
        chosen: &str,
    ) -> Option<Claimed> {
        let key = self.redis.key(model, id);
        let claimed = self.run(Op::Claim, self.redis.claim(key, chosen)).await?;
        pins.confirm(model, id, &claimed.holder);
        Some(claimed)
    }

    /// After a backend served a request of a sequence: an end removes the pin, and a
    /// sequence served where the store does not hold it (`moved`: a past owner served it, or
    /// the store had no answer, or held a backend this request could not use) is stored.
    /// Other requests need nothing: their pin is in the store already.
    pub async fn served(
        &self,
        pins: &PinTable,
        model: &str,
        opts: &RequestOptions,
        backend: &str,
        moved: bool,
    ) {
        let Some(id) = &opts.sequence_id else { return };
        if opts.sequence_end {
            let key = self.redis.key(model, id);
            let removed = self.run(Op::Remove, self.redis.remove(&key, backend)).await;
            self.note_announcement(removed);
        } else if moved {
            let key = self.redis.key(model, id);
            let stored = self.run(Op::Put, self.redis.put(&key, backend)).await;
            match stored {
                Some(_) => pins.confirm(model, id, backend),
                None => self.remember_unstored(model, id, backend),
            }
            self.note_announcement(stored);
        }
    }

    fn remember_unstored(&self, model: &str, id: &SequenceId, backend: &str) {
        let mut unstored = self.unstored.lock().unwrap_or_else(|e| e.into_inner());
        if unstored.len() < MAX_UNSTORED {
            unstored.insert((model.to_string(), id.clone()), backend.to_string());
        }
    }

    /// Stores the pins the store did not take while it was away, if this replica still
    /// routes their sequences there: a start served meanwhile is the newest word on its id,
    /// and without it the replicas that cached the id's older pin would keep sending its
    /// requests to the older sequence's state (a user saw 200s with wrong sums for as long as
    /// the sequence lived). Each write announces the move. Stops at the first failure.
    async fn write_back(&self, pins: &PinTable) {
        let pending = std::mem::take(&mut *self.unstored.lock().unwrap_or_else(|e| e.into_inner()));
        let mut pending = pending.into_iter();
        for ((model, id), backend) in pending.by_ref() {
            if pins.get(&model, &id).as_deref() != Some(backend.as_str()) {
                continue;
            }
            let key = self.redis.key(&model, &id);
            let stored = self.run(Op::Put, self.redis.put(&key, &backend)).await;
            self.note_announcement(stored);
            if stored.is_none() {
                self.remember_unstored(&model, &id, &backend);
                break;
            }
            pins.confirm(&model, &id, &backend);
        }
        for ((model, id), backend) in pending {
            self.remember_unstored(&model, &id, &backend);
        }
    }

    /// Forgets the pin of a sequence on `backend`: a claim this request created that no
    /// backend took (requests nothing accepts leave no keys behind), or a sequence whose
    /// backend lost it. Only while the store still names `backend`: a replica whose cached
    /// pin is out of date must not remove the pin of a sequence that lives elsewhere.
    pub async fn forget(&self, model: &str, id: &SequenceId, backend: &str) {
        let key = self.redis.key(model, id);
        let removed = self.run(Op::Remove, self.redis.remove(&key, backend)).await;
        self.note_announcement(removed);
    }

    /// A write that Redis took but whose announcement it refused (an ACL user without the
    /// changes channel) is no outage: said once until an announcement goes through again.
    fn note_announcement(&self, written: Option<redis_pins::Announced>) {
        match written {
            Some(redis_pins::Announced::Refused)
                if !self.announcements_refused.swap(true, Ordering::Relaxed) =>
            {
                tracing::warn!(
                    url = %self.url,
                    channel = %redis_pins::changes_channel(self.redis.prefix()),
                    "the pin store refuses to announce moved and removed pins (PUBLISH on the changes channel): other replicas follow them only at their renewal, up to a quarter of the idle timeout later; give the Redis user the channel"
                );
            }
            Some(redis_pins::Announced::Refused) => {}
            Some(redis_pins::Announced::Yes) => {
                self.announcements_refused.store(false, Ordering::Relaxed);
            }
            None => {}
        }
    }

    /// Follows the pins other replicas move or remove, announced on the store's changes
    /// channel: a cached pin that names another backend is dropped, so that the sequence's
    /// next request asks the store, instead of reaching the old sequence's state until the
    /// next renewal. While the subscription is down, announcements are missed: each new
    /// subscription therefore makes every cached pin ask the store once more. Ends with the
    /// store.
    fn follow_changes(self: &Arc<Self>, runtime: &tokio::runtime::Handle, pins: Arc<PinTable>) {
        let store = Arc::downgrade(self);
        runtime.spawn(async move {
            // Said once per outage: while Redis is down the other operations warn already.
            let mut failing = false;
            loop {
                let Some(s) = store.upgrade() else { return };
                let subscribed =
                    tokio::time::timeout(STARTUP_PROBE, s.redis.subscribe_to_changes()).await;
                let prefix = s.redis.prefix().to_string();
                let url = s.url.clone();
                drop(s);
                let pubsub = match subscribed {
                    Ok(Ok(pubsub)) => pubsub,
                    failed => {
                        if !failing {
                            // The ACL hint only where Redis refused the channel itself: a
                            // refused connection or a wrong password is no ACL matter. By
                            // the reply's code: the client words it "NoPerm: ...".
                            let (error, no_permission) = match failed {
                                Ok(Err(e)) => (e.to_string(), e.code() == Some("NOPERM")),
                                _ => (
                                    format!("no answer within {} ms", STARTUP_PROBE.as_millis()),
                                    false,
                                ),
                            };
                            if no_permission {
                                tracing::warn!(url = %url, error, "cannot subscribe to the pin store's changes channel; pins other replicas move are followed at their renewal until it can (a Redis ACL user needs the channel {prefix}changes)");
                            } else {
                                tracing::warn!(url = %url, error, "cannot subscribe to the pin store's changes channel; pins other replicas move are followed at their renewal until it can");
                            }
                        }
                        failing = true;
                        tokio::time::sleep(BACKOFF).await;
                        continue;
                    }
                };
                if std::mem::take(&mut failing) {
                    tracing::info!(url = %url, "subscribed to the pin store's changes channel again");
                }
                pins.distrust_all();
                let (mut sink, mut messages) = pubsub.split();
                let mut heard = Instant::now();
                loop {
                    // Woken once a second at least, to end with the store.
                    let next =
                        tokio::time::timeout(BACKOFF, futures_util::StreamExt::next(&mut messages))
                            .await;
                    if store.strong_count() == 0 {
                        return;
                    }
                    match next {
                        // A connection that died without a word (a host gone, a partition)
                        // would otherwise be waited on for ever: a quiet one is asked.
                        Err(_) if heard.elapsed() >= QUIET_CHECK => {
                            let pong = tokio::time::timeout(STARTUP_PROBE, sink.ping::<redis::Value>());
                            if !matches!(pong.await, Ok(Ok(_))) {
                                break;
                            }
                            heard = Instant::now();
                        }
                        Err(_) => continue,
                        Ok(None) => break,
                        Ok(Some(message)) => {
                            heard = Instant::now();
                            if let Some((backend, model, id)) =
                                redis_pins::parse_change(&prefix, message.get_payload_bytes())
                            {
                                pins.follow_change(&model, &id, backend.as_deref());
                            }
                        }
                    }
                }
                tokio::time::sleep(BACKOFF).await;
            }
        });
    }

    fn refresh_later(self: &Arc<Self>, pins: Arc<PinTable>, model: &str, id: SequenceId) {
        let Some(backend) = pins.get(model, &id) else {
            return;
        };
        let store = self.clone();
        let model = model.to_string();
        tokio::spawn(async move {
            let key = store.redis.key(&model, &id);
            let mark = pins.change_mark(&model, &id);
            let Some(Claimed { holder, .. }) = store
                .run(Op::Refresh, store.redis.claim(key, &backend))
                .await
            else {
                return;
            };
            if *holder != *backend {
                tracing::warn!(
                    model = %model,
                    sequence = %crate::routing::describe_sequence(&id),
                    here = %backend,
                    store = %holder,
                    "another replica pinned this sequence elsewhere; following the store"
                );
            }
            pins.confirm(&model, &id, &holder);
            pins.unconfirm_if_changed(&model, &id, mark);
        });
    }

    /// Runs one operation within the timeout, unless the store failed less than `BACKOFF`
    /// ago. `None` means no answer, for whatever reason; the caller routes without one.
    async fn run<T, E: std::fmt::Display>(
        &self,
        op: Op,
        call: impl std::future::Future<Output = Result<T, E>>,
    ) -> Option<T> {
        let now = self.now_ms();
        let m = &self.ops[op as usize];
        if now < self.skip_until.load(Ordering::Relaxed) {
            // Counted all the same: the metric says how many requests went without the store.
            m.errors.inc();
            return None;
        }
        if let Some(calls) = &m.calls {
            calls.inc();
        }
        let error = match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(v)) => {
                self.mark_up();
                return Some(v);
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {} ms", self.timeout.as_millis()),
        };
        m.errors.inc();
        self.up.set(0);
        self.skip_until.store(
            self.now_ms() + BACKOFF.as_millis() as u64,
            Ordering::Relaxed,
        );
        self.warn(op, &error);
        None
    }

    fn warn(&self, op: Op, error: &str) {
        let Some(unlogged) = self.outages.failure(self.now_ms()) else {
            return;
        };
        tracing::warn!(
            url = %self.url,
            op = op.name(),
            error,
            failures_since_last_warning = unlogged,
            "pin store unavailable; routing by the hash table and this replica's pins until it answers"
        );
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}
