//! Reloading the config on SIGHUP and when its file changes. The file is polled (by
//! modification time and content), which also works for Kubernetes ConfigMap volumes,
//! where the file is swapped through a symlink.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::gateway::Gateway;
use crate::tls::ReloadableTls;

/// How often the config file is checked for changes.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// Builds the config again (the file plus command-line overrides).
pub type Loader = Arc<dyn Fn() -> Result<Config, String> + Send + Sync>;

async fn apply(gateway: &Gateway, load: &Loader, why: &str) {
    // `Gateway::reload` counts its own outcome; a file that does not load counts here.
    let result = match load() {
        Ok(config) => gateway.reload(config).await,
        Err(e) => {
            gateway
                .metrics
                .config_reloads
                .with_label_values(&["failure"])
                .inc();
            Err(e)
        }
    };
    match result {
        Ok(()) => tracing::info!(trigger = why, "config reloaded"),
        Err(e) => {
            tracing::error!(trigger = why, error = %e, "config reload failed; keeping the old config")
        }
    }
}

fn fingerprint(path: &PathBuf) -> Option<(std::time::SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    let text = std::fs::read(path).ok()?;
    Some((meta.modified().ok()?, xxhash_rust::xxh3::xxh3_64(&text)))
}

fn reload_tls(
    gateway: &Gateway,
    tls: &ReloadableTls,
    result: Option<Result<(), String>>,
    why: &str,
) {
    if let Some(r) = &result {
        let outcome = if r.is_ok() { "success" } else { "failure" };
        gateway
            .metrics
            .tls_reloads
            .with_label_values(&[outcome])
            .inc();
    }
    match result {
        Some(Ok(())) => {
            tracing::info!(trigger = why, files = ?tls.files(), "TLS certificates reloaded")
        }
        Some(Err(e)) => {
            tracing::error!(trigger = why, error = %e, "TLS reload failed; keeping the old certificates")
        }
        None => {}
    }
}

/// Reloads the config on SIGHUP and on changes to `watch` when given, and the listener's
/// certificates (if any) on SIGHUP and when their files change. Runs until aborted.
pub async fn run(
    gateway: Arc<Gateway>,
    load: Loader,
    watch: Option<PathBuf>,
    tls: Option<Arc<ReloadableTls>>,
) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGHUP; reloads are disabled");
            return;
        }
    };
    let mut last = watch.as_ref().and_then(fingerprint);
    // The tokens file, as the config in force names it, and how it read when last loaded.
    let tokens_file = || gateway.config().auth.tokens_file.clone();
    let mut last_tokens = tokens_file().as_ref().and_then(fingerprint);
    let mut tick = tokio::time::interval(POLL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
                        _ = hup.recv() => {
                apply(&gateway, &load, "SIGHUP").await;
                last = watch.as_ref().and_then(fingerprint);
                last_tokens = tokens_file().as_ref().and_then(fingerprint);
                if let Some(t) = &tls {
                    reload_tls(&gateway, t, Some(t.reload()), "SIGHUP");
                }
            }
            _ = tick.tick() => {
                if let Some(t) = &tls {
                    reload_tls(&gateway, t, t.reload_if_changed(), "file change");
                }
                // A revoked token must stop working without a signal (a Kubernetes Secret
                // is updated in place), as certificates do.
                let tokens_now = tokens_file().as_ref().and_then(fingerprint);
                let counted = |result: &str| {
                    gateway.metrics.token_reloads.with_label_values(&[result]).inc();
                };
                if tokens_now.is_some() && tokens_now.map(|f| f.1) != last_tokens.map(|f| f.1) {
                    last_tokens = tokens_now;
                    match gateway.reload_tokens() {
                        Ok(()) => {
                            counted("success");
                            tracing::info!(trigger = "file change", "auth tokens reloaded")
                        }
                        Err(e) => {
                            counted("failure");
                            tracing::error!(trigger = "file change", error = %e, "auth tokens reload failed; keeping the old tokens")
                        }
                    }
                } else if tokens_now.is_none() && last_tokens.is_some() {
                    // Said once: the old tokens stay, and a restart would fail to start.
                    last_tokens = None;
                    counted("failure");
                    tracing::error!(
                        file = %tokens_file().map(|p| p.display().to_string()).unwrap_or_default(),
                        "the auth tokens file cannot be read any more (removed, or its Secret unmounted?); keeping the old tokens, but a restart would refuse to start"
                    );
                }
                if watch.is_none() {
                    continue;
                }
                let now = watch.as_ref().and_then(fingerprint);
                // Compare content too: a rewrite within the clock's resolution keeps the mtime.
                if now.is_some() && now.map(|f| f.1) != last.map(|f| f.1) {
                    last = now;
                    apply(&gateway, &load, "file change").await;
                    last_tokens = tokens_file().as_ref().and_then(fingerprint);
                }
            }
        }
    }
}
