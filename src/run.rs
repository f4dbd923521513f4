//! Starting and stopping a gateway: used by the binary and by the integration tests.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::fleet::discovery::{Resolve, SystemResolver};
use crate::fleet::{http::new_client, Fleet};
use crate::gateway::Gateway;
use crate::metrics::Metrics;
use crate::server::{self, ServeOptions};
use crate::tls::ReloadableTls;

/// How long before the drain deadline requests still waiting for a backend are answered
/// 503 (at most a quarter of the drain).
const CUT_MARGIN: Duration = Duration::from_millis(250);

pub struct Running {
    pub addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    /// The gRPC listener's address, when `server.grpc_listen` is set.
    pub grpc_addr: Option<SocketAddr>,
    pub gateway: Arc<Gateway>,
    /// The listener's TLS, when configured; reloaded on SIGHUP and file changes.
    pub tls: Option<Arc<ReloadableTls>>,
    stop: watch::Sender<bool>,
    shutdown_delay: Duration,
    /// `limits.drain_timeout_ms`.
    drain: Duration,
    /// The listeners; each says whether its drain deadline passed.
    tasks: Vec<JoinHandle<bool>>,
    /// Refresh, DNS rediscovery and the pin sweep: stopped at shutdown.
    background: Vec<JoinHandle<()>>,
}

impl Running {
    /// Reports not-ready at once; keeps serving for `limits.shutdown_delay_ms`, so that load
    /// balancers that poll readiness stop sending first; then stops accepting and waits for
    /// in-flight requests (up to the drain deadline).
    pub async fn shutdown(self) {
        let began = std::time::Instant::now();
        self.gateway.start_draining();
        if !self.shutdown_delay.is_zero() {
            tracing::info!(
                delay_ms = self.shutdown_delay.as_millis() as u64,
                "not ready; still accepting until the shutdown delay ends"
            );
            tokio::time::sleep(self.shutdown_delay).await;
        }
        self.gateway.start_closing();
        let _ = self.stop.send(true);
        // Shortly before the drain deadline, requests still waiting for a backend answer
        // 503, in time for the answer to be written before connections are closed.
        let gateway = self.gateway.clone();
        let cut_at = self.drain.saturating_sub(CUT_MARGIN.min(self.drain / 4));
        let cutter = tokio::spawn(async move {
            tokio::time::sleep(cut_at).await;
            gateway.cut_in_flight();
        });
        let mut expired = false;
        for t in self.tasks {
            if t.await.unwrap_or(false) {
                // The requests still open are cut off as the process ends: the gateway's
                // doing, which their records must say (not a client that went away).
                self.gateway.mark_drain_expired();
                expired = true;
            }
        }
        cutter.abort();
        // The last line of a shutdown says how it ended.
        let elapsed_ms = began.elapsed().as_millis() as u64;
        if expired {
            tracing::warn!(
                elapsed_ms,
                "shut down: the drain deadline (limits.drain_timeout_ms) passed, and the connections still open were closed"
            );
        } else {
            tracing::info!(elapsed_ms, "shut down: every connection drained");
        }
        for t in self.background {
            t.abort();
        }
    }

    /// Applies a new config (what SIGHUP and a file change do).
    pub async fn reload(&self, config: Config) -> Result<(), String> {
        self.gateway.reload(config).await
    }
}

async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener, String> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr} for {what}: {e}"))
}

/// The cap on client connections over the REST and gRPC listeners together:
/// `limits.max_connections`, or (0) what the open-file limit leaves, once raised to its hard
/// maximum, after the gateway's own needs: a backend connection per request in flight and a
/// margin for probes, Redis, model files and the listeners. Without a cap, idle clients could
/// take every descriptor; the gateway's health checks would then fail, and healthy backends
/// be ejected.
pub fn connection_cap(limits: &crate::config::LimitsConfig) -> usize {
    if limits.max_connections > 0 {
        return limits.max_connections;
    }
    let nofile = rlimit::increase_nofile_limit(u64::MAX).unwrap_or(1024);
    let reserve = limits.max_concurrent_requests as u64 + 256;
    let cap = nofile.saturating_sub(reserve).max(64);
    usize::try_from(cap).unwrap_or(usize::MAX)
}

/// What the process itself needs before any thread starts: a process that runs repository
/// models keeps their runs' memory between runs (`models::onnx::keep_run_memory`).
pub fn prepare_process(config: &Config) {
    #[cfg(feature = "onnx")]
    if config.backends.iter().any(|b| b.model_repository.is_some()) {
        crate::models::onnx::keep_run_memory();
    }
    #[cfg(not(feature = "onnx"))]
    let _ = config;
}

/// Starts a gateway from `config`. With `with_metrics`, the metrics listener starts too.
/// Returns once the listeners serve and the first discovery round is done.
pub async fn start(config: Config, with_metrics: bool) -> Result<Running, String> {
    let resolver: Arc<dyn Resolve> = Arc::new(SystemResolver::new()?);
    start_with_resolver(config, with_metrics, resolver).await
}

/// `start` with a given DNS resolver (tests use a fixed table).
pub async fn start_with_resolver(
    config: Config,
    with_metrics: bool,
    resolver: Arc<dyn Resolve>,
) -> Result<Running, String> {
    let config = Arc::new(config);
    let client = new_client(
        Duration::from_millis(config.fleet.connect_timeout_ms),
        Duration::from_millis(config.fleet.pool_idle_timeout_ms),
        crate::tls::client_config(&config.fleet.tls)
            .map_err(|e| crate::tls::in_table("fleet.tls", &e))?,
    );
    let metrics = Arc::new(Metrics::new(config.server.triton_metrics));
    let fleet = Arc::new(Fleet::new(
        &config,
        client,
        resolver,
        metrics.backend_tolerated.clone(),
    ));
    let gateway = Arc::new(Gateway::new(
        config.clone(),
        fleet.clone(),
        metrics.clone(),
    )?);

    let listener = bind(config.server.listen, "the v2 API").await?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let metrics_listener = match config.server.metrics_listen.filter(|_| with_metrics) {
        Some(a) => Some(bind(a, "metrics").await?),
        None => None,
    };
    let metrics_addr = metrics_listener.as_ref().and_then(|l| l.local_addr().ok());
    let grpc_listener = match config.server.grpc_listen {
        Some(a) => Some(bind(a, "the v2 gRPC API").await?),
        None => None,
    };
    let grpc_addr = grpc_listener.as_ref().and_then(|l| l.local_addr().ok());

    let (stop, stopped) = watch::channel(false);
    let wait = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let tls = match &config.server.tls {
        Some(t) => {
            metrics.expect_tls();
            Some(Arc::new(
                ReloadableTls::new(t.clone())
                    .map_err(|e| crate::tls::in_table("server.tls", &e))?
                    .counting_failures(metrics.tls_handshake_failures.clone()),
            ))
        }
        None => None,
    };
    let connections = connection_cap(&config.limits);
    tracing::info!(
        max_connections = connections,
        "client connections over the REST and gRPC listeners are capped (limits.max_connections)"
    );
    tracing::info!(
        max_buffered_body_bytes = gateway.bodies.limit(),
        "request bodies held in memory at once are capped (limits.max_buffered_body_bytes)"
    );
    let options = ServeOptions {
        tls: tls.clone(),
        header_read_timeout: Duration::from_millis(config.limits.header_read_timeout_ms),
        max_header_bytes: config.limits.max_header_bytes,
        drain: Duration::from_millis(config.limits.drain_timeout_ms),
        connections: Some(Arc::new(tokio::sync::Semaphore::new(connections))),
        send_timeout: Duration::from_millis(config.limits.send_timeout_ms),
    };
    let mut tasks = vec![tokio::spawn(server::serve(
        listener,
        server::gateway_service(gateway.clone()),
        wait(stopped.clone()),
        options.clone(),
    ))];
    if let Some(l) = grpc_listener {
        tasks.push(tokio::spawn(server::serve(
            l,
            server::with_peer_extension(crate::grpc::grpc_service(gateway.clone())),
            wait(stopped.clone()),
            options,
        )));
    }
    if let Some(l) = metrics_listener {
        tasks.push(tokio::spawn(server::serve(
            l,
            {
                let metrics = server::metrics_service(gateway.clone());
                move |_| metrics.clone()
            },
            wait(stopped),
            ServeOptions::plain(Duration::from_secs(1)),
        )));
    }
    // The listeners serve while the first discovery round runs (a worker reading a large
    // model repository takes a while): liveness answers, readiness says not yet (503), as
    // the probes of an orchestrator expect, rather than connections left unanswered.
    if let Err(e) = fleet.reconcile(&config).await {
        let _ = stop.send(true);
        for t in &tasks {
            t.abort();
        }
        return Err(e);
    }
    let refresher = tokio::spawn(
        fleet
            .clone()
            .run_refresh(Duration::from_millis(config.fleet.refresh_interval_ms)),
    );
    let background = vec![
        refresher,
        tokio::spawn(rediscover(gateway.clone())),
        tokio::spawn(sweep_pins(gateway.clone())),
    ];
    Ok(Running {
        addr,
        metrics_addr,
        grpc_addr,
        gateway,
        tls,
        stop,
        shutdown_delay: Duration::from_millis(config.limits.shutdown_delay_ms),
        drain: Duration::from_millis(config.limits.drain_timeout_ms),
        tasks,
        background,
    })
}

/// Drops idle sequence pins periodically, off the async workers.
async fn sweep_pins(gateway: Arc<Gateway>) {
    let interval = gateway.router.pins.sweep_interval();
    loop {
        tokio::time::sleep(interval).await;
        let gw = gateway.clone();
        let _ = tokio::task::spawn_blocking(move || gw.router.pins.sweep_now()).await;
    }
}

/// Resolves DNS backends again every `fleet.dns_interval_ms`.
async fn rediscover(gateway: Arc<Gateway>) {
    loop {
        let interval = gateway.config().fleet.dns_interval_ms.max(100);
        tokio::time::sleep(Duration::from_millis(interval)).await;
        if let Err(e) = gateway.rediscover().await {
            tracing::warn!(error = %e, "DNS rediscovery failed");
        }
    }
}
