//! The fleet: the configured backends, what each one serves and supports, and the catalog
//! of models that routing and validation read. A background task refreshes it.

pub mod backend;
pub mod builtin;
pub mod catalog;
pub mod http;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::config::{BackendConfig, ClassificationMode, Config, Encoding};
use crate::models::{builtin_models, BuiltinSettings};
use crate::protocol::metadata::extensions;
use crate::protocol::ServerMetadata;
use backend::{Backend, DiscoveredModel};
pub use catalog::{Catalog, CatalogEntry};

/// What a backend supports, as learned from its server metadata and the config.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Send it binary tensors.
    pub binary: bool,
    /// It returns only the requested outputs, in the requested encodings (Triton-like
    /// servers that list `binary_tensor_data`). Its responses may then be passed through.
    pub exact_outputs: bool,
    /// It implements the classification extension itself.
    pub classification: bool,
}

impl Capabilities {
    fn learn(server: &ServerMetadata, encoding: Encoding) -> Self {
        let lists_binary = server.supports(extensions::BINARY_TENSOR_DATA);
        Capabilities {
            binary: match encoding {
                Encoding::Auto => lists_binary,
                Encoding::Json => false,
                Encoding::Binary => true,
            },
            exact_outputs: lists_binary && encoding != Encoding::Json,
            classification: server.supports(extensions::CLASSIFICATION),
        }
    }
}

/// The last refresh of one backend.
#[derive(Debug, Clone, Default)]
pub struct BackendState {
    pub reachable: bool,
    pub server: Option<ServerMetadata>,
    pub capabilities: Capabilities,
    pub models: HashMap<String, DiscoveredModel>,
    pub last_error: Option<String>,
}

pub struct BackendHandle {
    pub name: String,
    pub url: String,
    pub backend: Arc<dyn Backend>,
    pub encoding: Encoding,
    pub classification: ClassificationMode,
    /// Only these models are used from this backend (empty: all).
    pub only_models: Vec<String>,
    pub state: ArcSwap<BackendState>,
    /// Requests sent and not yet answered, for load balancing.
    pub outstanding: AtomicUsize,
}

impl BackendHandle {
    pub fn capabilities(&self) -> Capabilities {
        self.state.load().capabilities
    }
}

pub struct Fleet {
    backends: Vec<Arc<BackendHandle>>,
    catalog: ArcSwap<Catalog>,
    /// Model names to probe on backends that cannot list their models.
    hint: Vec<String>,
    refreshed_once: AtomicBool,
}

impl Fleet {
    pub fn from_config(config: &Config, client: http::HttpClient) -> Result<Fleet, String> {
        let settings = BuiltinSettings {
            sequence_idle_timeout: config
                .model("accumulate")
                .and_then(|m| m.sequence_idle_timeout_ms)
                .map(Duration::from_millis)
                .unwrap_or(BuiltinSettings::default().sequence_idle_timeout),
        };
        let probe = Duration::from_millis(config.fleet.probe_timeout_ms);
        let backends = config
            .backends
            .iter()
            .map(|b| build_handle(b, &settings, client.clone(), probe))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Fleet {
            backends,
            catalog: ArcSwap::from_pointee(Catalog::default()),
            hint: config.models.keys().cloned().collect(),
            refreshed_once: AtomicBool::new(false),
        })
    }

    pub fn backends(&self) -> &[Arc<BackendHandle>] {
        &self.backends
    }

    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog.load_full()
    }

    pub fn refreshed_once(&self) -> bool {
        self.refreshed_once.load(Ordering::Acquire)
    }

    /// Asks every backend, in parallel, for its metadata and models, then rebuilds the catalog.
    pub async fn refresh(&self) {
        let rounds = self.backends.iter().map(|h| refresh_backend(h, &self.hint));
        futures_util::future::join_all(rounds).await;
        self.catalog.store(Arc::new(Catalog::build(&self.backends)));
        self.refreshed_once.store(true, Ordering::Release);
    }

    /// Refreshes forever at `interval`.
    pub async fn run_refresh(self: Arc<Self>, interval: Duration) {
        loop {
            tokio::time::sleep(interval).await;
            self.refresh().await;
        }
    }
}

fn build_handle(
    b: &BackendConfig,
    settings: &BuiltinSettings,
    client: http::HttpClient,
    probe: Duration,
) -> Result<Arc<BackendHandle>, String> {
    let url = b.url.get_ref().clone();
    let backend: Arc<dyn Backend> = if url == "builtin" {
        Arc::new(builtin::BuiltinBackend::new(builtin_models(
            &b.models, settings,
        )?))
    } else {
        Arc::new(http::HttpBackend::new(&url, client, probe))
    };
    Ok(Arc::new(BackendHandle {
        name: b.name.get_ref().clone(),
        url,
        backend,
        encoding: b.encoding,
        classification: b.classification,
        only_models: b.models.clone(),
        state: ArcSwap::from_pointee(BackendState::default()),
        outstanding: AtomicUsize::new(0),
    }))
}

async fn refresh_backend(h: &BackendHandle, hint: &[String]) {
    let result = async {
        let server = h.backend.server_metadata().await?;
        let hint: Vec<String> = if h.only_models.is_empty() {
            hint.to_vec()
        } else {
            h.only_models.clone()
        };
        let models = h.backend.models(&hint).await?;
        Ok::<_, backend::BackendError>((server, models))
    }
    .await;
    let state = match result {
        Ok((server, models)) => BackendState {
            reachable: true,
            capabilities: Capabilities::learn(&server, h.encoding),
            server: Some(server),
            models: models
                .into_iter()
                .filter(|m| h.only_models.is_empty() || h.only_models.contains(&m.metadata.name))
                .map(|m| (m.metadata.name.clone(), m))
                .collect(),
            last_error: None,
        },
        Err(e) => {
            tracing::warn!(backend = %h.name, error = ?e, "backend refresh failed");
            BackendState {
                reachable: false,
                last_error: Some(format!("{e:?}")),
                ..BackendState::default()
            }
        }
    };
    h.state.store(Arc::new(state));
}
