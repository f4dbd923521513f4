//! The gateway's shared state (config, fleet, router, metrics, statistics, auth tokens,
//! load-shedding permits, draining) and the transport-neutral inference core (`core`). The
//! REST (`crate::rest`) and gRPC (`crate::grpc`) edges sit on top of it.

pub mod auth;
pub mod core;
pub mod heavy;
pub mod inflate;
pub mod labels;
pub mod layers;
pub mod model_config;
pub mod observe;
pub mod queries;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use http::HeaderValue;

use crate::config::Config;
use crate::error::GatewayError;
use crate::fleet::Fleet;
use crate::metrics::Metrics;
use crate::pinstore::PinStore;
use crate::routing::Router;

pub use crate::headers::{BACKEND as BACKEND_HEADER, REQUEST_ID};

pub struct Gateway {
    config: ArcSwap<Config>,
    pub labels: ArcSwap<labels::Labels>,
    pub fleet: Arc<Fleet>,
    pub router: Router,
    /// Where pins are shared between replicas; `None` keeps them in `router` only.
    pub pin_store: Option<Arc<PinStore>>,
    pub metrics: Arc<Metrics>,
    pub stats: observe::Stats,
    draining: AtomicBool,
    drain_expired: AtomicBool,
    /// `true` once the listeners close (the shutdown delay is over): open streams take no
    /// more messages.
    closing: tokio::sync::watch::Sender<bool>,
    /// Set just before the drain deadline: requests still waiting for a backend answer 503.
    cutting: tokio::sync::watch::Sender<bool>,
    tokens: ArcSwap<Option<auth::Tokens>>,
    /// One permit per request being handled; none left means shed (503).
    permits: Arc<tokio::sync::Semaphore>,
    max_concurrent: usize,
    /// Request bodies held in memory, across all requests.
    pub bodies: Arc<crate::body_budget::BodyBudget>,
    /// Serializes reloads and DNS rediscoveries: each reconciles the fleet with a config and
    /// must not interleave with another, or an older config could be applied last.
    reload_lock: tokio::sync::Mutex<()>,
    /// When a request last made the fleet resolve its DNS backends again (`catch_up`).
    caught_up: tokio::sync::Mutex<Option<std::time::Instant>>,
}

/// Keeps a gauge raised while a request is handled, even if the client goes away.
pub struct Raised(prometheus::IntGauge);

impl Raised {
    pub fn new(g: prometheus::IntGauge) -> Self {
        g.inc();
        Raised(g)
    }
}

impl Drop for Raised {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Gateway {
    /// Sets the model (and version) of a request its handler did not observe (a layer
    /// answered it, or its client went away): only a model the gateway serves and a version
    /// it lists, so that a name the client made up opens no series, and under the version
    /// label a served request of it would have.
    pub fn observe_model(
        &self,
        model: String,
        version: Option<String>,
        obs: &mut observe::Observation,
    ) {
        if let Some(entry) = self.fleet.catalog().get(&model) {
            // A version the model does not list opens no series.
            if version
                .as_ref()
                .is_some_and(|v| !entry.metadata.versions.contains(v))
            {
                return;
            }
            obs.version = Some(entry.metadata.version_label(version.as_deref()));
            obs.model = Some(model);
        }
    }

    /// Fails when a configured label file cannot be read.
    pub fn new(
        config: Arc<Config>,
        fleet: Arc<Fleet>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, String> {
        let limit = crate::body_budget::budget_limit(
            config.limits.max_buffered_body_bytes,
            config.limits.max_body_bytes,
        );
        metrics
            .buffered_body_limit
            .set(i64::try_from(limit).unwrap_or(i64::MAX));
        let bodies =
            crate::body_budget::BodyBudget::new(limit, metrics.buffered_body_bytes.clone());
        let gw = Gateway {
            labels: ArcSwap::from_pointee(labels::Labels::load(&config)?),
            router: Router::new(
                config.fleet.max_sequences,
                Duration::from_millis(config.fleet.sequence_idle_timeout_ms),
            ),
            pin_store: PinStore::from_config(
                &config.fleet.pins,
                Duration::from_millis(config.fleet.sequence_idle_timeout_ms),
                &metrics,
            )?,
            fleet,
            metrics,
            stats: observe::Stats::default(),
            draining: AtomicBool::new(false),
            drain_expired: AtomicBool::new(false),
            closing: tokio::sync::watch::channel(false).0,
            cutting: tokio::sync::watch::channel(false).0,
            tokens: ArcSwap::from_pointee(auth::Tokens::load(&config.auth)?),
            permits: Arc::new(tokio::sync::Semaphore::new(
                config.limits.max_concurrent_requests.max(1),
            )),
            max_concurrent: config.limits.max_concurrent_requests.max(1),
            bodies,
            reload_lock: tokio::sync::Mutex::new(()),
            caught_up: tokio::sync::Mutex::new(None),
            config: ArcSwap::new(config),
        };
        if let Some(store) = &gw.pin_store {
            store.start_tasks(gw.router.pins.clone());
        }
        Ok(gw)
    }

    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// Applies a new config: backends (with DNS resolved again), model settings and labels.
    /// Requests in flight finish on the backends they hold.
    pub async fn reload(&self, config: Config) -> Result<(), String> {
        let result = self.apply_config(config).await;
        let outcome = if result.is_ok() { "success" } else { "failure" };
        self.metrics
            .config_reloads
            .with_label_values(&[outcome])
            .inc();
        result
    }

    /// Reads the tokens again (the tokens file changed); on failure the old ones stay.
    pub fn reload_tokens(&self) -> Result<(), String> {
        let tokens = auth::Tokens::load(&self.config().auth)?;
        self.tokens.store(Arc::new(tokens));
        Ok(())
    }

    async fn apply_config(&self, mut config: Config) -> Result<(), String> {
        let _serial = self.reload_lock.lock().await;
        // An editor's truncate-then-write, or a file copied in two steps, is seen half-way:
        // read as a config without backends, it would take every model offline until the
        // next poll. Emptying a serving fleet takes a restart.
        if config.backends.is_empty() && !self.config().backends.is_empty() {
            return Err(
                "the new config has no backends (a file caught half-written?); a reload never \
                 empties a serving fleet (restart to do that)"
                    .into(),
            );
        }
        let labels = labels::Labels::load(&config)?;
        let tokens = auth::Tokens::load(&config.auth)?;
        if self.config().auth.enabled() && !config.auth.enabled() {
            tracing::warn!(
                "the reloaded config names no token source ([auth] is gone): bearer auth is off, and every request is accepted"
            );
        }
        let not_applied = crate::config::keep_restart_only(&self.config(), &mut config);
        if !not_applied.is_empty() {
            tracing::warn!(
                settings = %not_applied.join(", "),
                "config reloaded, but these changed settings take effect only after a restart"
            );
        }
        let names = |fleet: &crate::fleet::Fleet| -> std::collections::BTreeSet<String> {
            fleet
                .backends()
                .iter()
                .map(|h| h.name.to_string())
                .collect()
        };
        let before = names(&self.fleet);
        self.fleet.reconcile(&config).await?;
        let after = names(&self.fleet);
        // Which backends a reload added and removed, for an operator matching the log
        // against traffic that moved.
        let listed = |a: &std::collections::BTreeSet<String>,
                      b: &std::collections::BTreeSet<String>| {
            a.difference(b).cloned().collect::<Vec<_>>().join(", ")
        };
        let (added, removed) = (listed(&after, &before), listed(&before, &after));
        if !added.is_empty() || !removed.is_empty() {
            tracing::info!(added = %added, removed = %removed, "the reload changed the fleet");
        }
        self.forget_removed_backends();
        self.labels.store(Arc::new(labels));
        self.tokens.store(Arc::new(tokens));
        self.config.store(Arc::new(config));
        Ok(())
    }

    /// The answer before the first discovery round has ended: a gateway with only the
    /// built-in backend (a worker) is loading its models, not discovering anything.
    pub fn still_starting(&self) -> GatewayError {
        let builtin_only = self
            .config()
            .backends
            .iter()
            .all(|b| b.url.get_ref() == "builtin");
        GatewayError::Unavailable(if builtin_only {
            "tensorgate has not finished loading its models".into()
        } else {
            "tensorgate has not finished discovering its backends".into()
        })
    }

    /// Resolves the DNS backends of the current config again. Serialized with reloads, so
    /// that it cannot apply the config a reload is replacing.
    pub async fn rediscover(&self) -> Result<(), String> {
        let _serial = self.reload_lock.lock().await;
        let config = self.config();
        if !config
            .backends
            .iter()
            .any(|b| b.discovery == crate::config::Discovery::Dns)
        {
            return Ok(());
        }
        self.fleet.reconcile(&config).await?;
        self.forget_removed_backends();
        Ok(())
    }

    /// Resolves the DNS backends again now, for a request that the shared pin store sends to
    /// `holder`, a backend this replica has not discovered yet (another replica saw it
    /// first). However many requests ask, it runs at most once a second; those that asked
    /// meanwhile wait for the run in progress and take its result. Nothing to do for a
    /// backend this replica already has but cannot use now (unhealthy, ejected: DNS would
    /// only find it again), nor without DNS backends.
    pub async fn catch_up(&self, holder: &str) {
        let dns = |b: &crate::config::BackendConfig| b.discovery == crate::config::Discovery::Dns;
        if !self.config().backends.iter().any(dns) {
            return;
        }
        let mut last = self.caught_up.lock().await;
        // Asked after the lock: a run in progress adds the backend to the fleet before its
        // models reach the catalog, which the caller reads once this returns.
        if self.fleet.backends().iter().any(|h| h.key == holder)
            || last.is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        tracing::info!(
            backend = holder,
            "a shared pin names a backend this replica does not know; resolving DNS backends now"
        );
        if let Err(e) = self.rediscover().await {
            tracing::warn!(error = %e, "DNS rediscovery failed");
        }
        *last = Some(std::time::Instant::now());
    }

    /// Drops the per-backend series of backends no longer in the fleet: a DNS backend is
    /// named `name/IP:port`, so without this every address it ever had would stay a label
    /// value. Also run at each scrape, for a request that finished on a removed backend
    /// after the fleet was rebuilt.
    fn forget_removed_backends(&self) {
        let backends = self.fleet.backends();
        let unresolved = self.fleet.unresolved();
        let live: std::collections::HashSet<&str> = backends
            .iter()
            .map(|h| &*h.name)
            .chain(unresolved.iter().map(|u| u.name.as_str()))
            .collect();
        self.metrics.forget_backends(|b| live.contains(b));
        self.stats.forget_backends(|b| live.contains(b));
    }

    /// Sets the gauges that describe state rather than events, just before a scrape.
    pub fn update_gauges(&self) {
        self.metrics
            .sequence_pins
            .set(self.router.pins.len() as i64);
        for (model, version) in queries::known_versions(self) {
            self.stats.expose(&self.metrics, &model, &version);
        }
        // Backends that a reload or DNS removed must vanish from every series, not report
        // their last state forever.
        self.forget_removed_backends();
        // A DNS backend with no address is a backend down, to alert on as any other.
        for u in self.fleet.unresolved().iter() {
            self.metrics
                .backend_healthy
                .with_label_values(&[&u.name])
                .set(0);
        }
        for h in self.fleet.backends().iter() {
            let healthy = h.state.load().reachable;
            self.metrics
                .backend_healthy
                .with_label_values(&[&h.name])
                .set(healthy as i64);
            self.metrics
                .backend_ejected
                .with_label_values(&[&h.name])
                .set(h.health.is_ejected() as i64);
            let total = h
                .health
                .ejections
                .load(std::sync::atomic::Ordering::Relaxed);
            let counter = self.metrics.ejections.with_label_values(&[&h.name]);
            counter.inc_by(total.saturating_sub(counter.get()));
            // At 0 from the backend's first scrape, so that its first retry is an increase.
            self.metrics.retries.with_label_values(&[&h.name]);
        }
    }

    /// Checks the bearer token when tokens are configured (`[auth]`).
    pub fn authorize(&self, authorization: Option<&HeaderValue>) -> Result<(), GatewayError> {
        match self.tokens.load().as_ref() {
            Some(tokens) if !tokens.accepts(authorization) => Err(GatewayError::Unauthorized(
                "missing or invalid bearer token".into(),
            )),
            _ => Ok(()),
        }
    }

    /// One of `limits.max_concurrent_requests` permits, held while the request is handled;
    /// none left sheds the request at once (never queued).
    pub fn admit(&self) -> Result<tokio::sync::OwnedSemaphorePermit, GatewayError> {
        self.permits.clone().try_acquire_owned().map_err(|_| {
            GatewayError::Unavailable(format!(
                "tensorgate is handling its limit of {} concurrent requests (limits.max_concurrent_requests); retry later",
                self.max_concurrent
            ))
        })
    }

    /// From now on readiness reports 503, so load balancers stop sending new requests.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// The listeners close: a connection finishes what it has, and an open stream, which
    /// could stay open for the whole drain while its client sends nothing, ends once its
    /// messages in flight are answered.
    pub fn start_closing(&self) {
        self.closing.send_replace(true);
    }

    /// Completes once the listeners close.
    pub fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.closing.subscribe();
        async move {
            let _ = rx.wait_for(|closing| *closing).await;
        }
    }

    /// The drain deadline is about to pass: requests still waiting for a backend stop
    /// waiting and answer 503 (`observe::SHUT_DOWN`), which their clients can tell from a
    /// crash and retry, where the deadline itself would only close their connections.
    pub fn cut_in_flight(&self) {
        self.cutting.send_replace(true);
    }

    /// Completes once requests in flight are to be cut off.
    pub(crate) fn cut(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.cutting.subscribe();
        async move {
            let _ = rx.wait_for(|cut| *cut).await;
        }
    }

    /// The drain deadline passed: requests still in flight are cut off by the shutdown.
    pub fn mark_drain_expired(&self) {
        self.drain_expired.store(true, Ordering::Release);
    }

    /// Why a request ended before its answer, as its records say it: cut off by the
    /// shutdown, or its client went away.
    pub fn cut_off(&self) -> observe::CutOff {
        if self.drain_expired.load(Ordering::Acquire) {
            observe::CutOff::Shutdown
        } else {
            observe::CutOff::ClientWentAway
        }
    }
}
