//! The fleet: the backends, what each one serves and supports, its health, and the catalog
//! of models that routing and validation read. Membership changes (config reloads, DNS)
//! swap in a new list atomically; requests in flight keep the handles they hold.

pub mod backend;
pub mod builtin;
pub mod catalog;
pub mod discovery;
pub mod health;
pub mod http;
pub mod pool;
pub mod repository;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::config::{BackendConfig, ClassificationMode, Config, Discovery, Encoding};
use crate::models::repository::Repository;
use crate::models::{builtin_models, builtin_names, BuiltinSettings};
use crate::protocol::metadata::extensions;
use crate::protocol::ServerMetadata;
use backend::{Backend, DiscoveredModel};
pub use catalog::{Catalog, CatalogEntry, HistoryWindow, PastTable};
use discovery::Resolve;
use health::{EjectionPolicy, Health};

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
    /// It classifies FP16 and BF16 outputs too (a tensorgate server; Triton refuses them).
    pub half_classification: bool,
    /// It loads and unloads models on request (the `model_repository` extension).
    pub repository: bool,
}

impl Capabilities {
    fn learn(server: &ServerMetadata, encoding: Encoding) -> Self {
        let lists_binary = server.supports(extensions::BINARY_TENSOR_DATA);
        // KServe's ModelServer reads and writes binary tensors (the extension is KServe's
        // own document) but does not list it (0.21 lists only "model_repository_extension"),
        // and refuses FP16 in JSON: it gets binary too. Not exact outputs: it ignores the
        // list of requested outputs.
        let kserve = server.name == "kserve";
        Capabilities {
            binary: match encoding {
                Encoding::Auto => lists_binary || kserve,
                Encoding::Json => false,
                Encoding::Binary => true,
            },
            exact_outputs: lists_binary && encoding != Encoding::Json,
            classification: server.supports(extensions::CLASSIFICATION),
            // Known by its name (`server.name`, "tensorgate" or "tensorgate-worker" unless
            // renamed): nothing in v2 metadata says which types a server classifies.
            half_classification: server.supports(extensions::CLASSIFICATION)
                && server.name.starts_with("tensorgate"),
            // KServe 0.21 lists it as "model_repository_extension".
            repository: server.supports(extensions::MODEL_REPOSITORY)
                || server.supports("model_repository_extension"),
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
    /// Models or versions it has but cannot serve, with why (from its repository).
    pub unavailable: Vec<crate::models::repository::IndexEntry>,
    pub last_error: Option<String>,
    /// Set when the backend answers but exposes no usable model: what discovery tried.
    pub no_models: Option<String>,
}

pub struct BackendHandle {
    /// Name for logs, metrics and the `x-tensorgate-backend` header; shared with the
    /// observations of the requests it serves.
    pub name: Arc<str>,
    /// Identity for hashing and pins: the URL (or `builtin`), the same on every replica.
    pub key: String,
    pub backend: Arc<dyn Backend>,
    pub encoding: Encoding,
    pub classification: ClassificationMode,
    pub weight: u32,
    /// Only these models are used from this backend (empty: all).
    pub only_models: Vec<String>,
    /// `[[backends]] model_repository` of a built-in backend.
    pub repository: Option<std::path::PathBuf>,
    pub state: ArcSwap<BackendState>,
    /// Requests sent and not yet answered, for load balancing.
    pub outstanding: AtomicUsize,
    pub health: Health,
    /// Active health checks failed in a row.
    failed_checks: AtomicU32,
}

impl crate::routing::Candidate for BackendHandle {
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
        self.health.is_ejected()
    }
}

impl BackendHandle {
    /// Whether the backend lists `version` of `model`: `None` when it does not report the
    /// model or lists no versions (KServe), so that it can be neither ruled in nor out.
    pub fn lists_version(&self, model: &str, version: &str) -> Option<bool> {
        let state = self.state.load();
        let versions = &state.models.get(model)?.metadata.versions;
        (!versions.is_empty()).then(|| versions.iter().any(|v| v == version))
    }

    /// Whether the backend serves `model` with other tensors than `metadata`: `false` when it
    /// does not report the model.
    pub fn has_other_tensors(
        &self,
        model: &str,
        metadata: &crate::protocol::ModelMetadata,
    ) -> bool {
        let state = self.state.load();
        state
            .models
            .get(model)
            .is_some_and(|m| !m.metadata.same_tensors(metadata))
    }

    pub fn capabilities(&self) -> Capabilities {
        self.state.load().capabilities
    }

    /// A handle with no backend behind it that reports `models` ready, for tests of the
    /// catalog and of routing.
    #[cfg(test)]
    pub fn for_test(key: &str, weight: u32, models: &[&str]) -> BackendHandle {
        let models = models
            .iter()
            .map(|m| {
                let metadata = crate::protocol::ModelMetadata {
                    name: m.to_string(),
                    versions: vec![],
                    platform: String::new(),
                    inputs: vec![],
                    outputs: vec![],
                };
                (
                    m.to_string(),
                    DiscoveredModel {
                        metadata,
                        ready: true,
                        stated: None,
                    },
                )
            })
            .collect();
        BackendHandle {
            name: key.trim_start_matches("http://").into(),
            key: key.to_string(),
            backend: Arc::new(builtin::BuiltinBackend::new(Default::default())),
            encoding: Encoding::Auto,
            classification: ClassificationMode::Auto,
            weight,
            only_models: vec![],
            repository: None,
            state: ArcSwap::from_pointee(BackendState {
                reachable: true,
                models,
                ..BackendState::default()
            }),
            outstanding: AtomicUsize::new(0),
            health: Health::default(),
            failed_checks: AtomicU32::new(0),
        }
    }

    /// Whether this handle can stand for `b` at `url` after a reload, keeping its health,
    /// state and pooled connections.
    fn same_as(&self, name: &str, url: &str, b: &BackendConfig) -> bool {
        *self.name == *name
            && self.key == url
            && self.encoding == b.encoding
            && self.classification == b.classification
            && self.weight == b.weight
            && self.only_models == only_models(url, b)
            && self.repository == b.model_repository
    }
}

/// The models of a backend the gateway uses (empty: all). A built-in backend with a model
/// repository builds only the built-in models its list names (`models::selected_builtin`),
/// and serves every repository model unless the list names some of them too: then the list
/// filters both, so that a list of repository models alone serves those and nothing else.
fn only_models(url: &str, b: &BackendConfig) -> Vec<String> {
    if url == "builtin" && b.model_repository.is_some() && repository_models_named(b).is_empty() {
        Vec::new()
    } else {
        b.models.clone()
    }
}

/// The names of a built-in backend's `models` list that are not built-in models: with a
/// repository, the repository models it names.
fn repository_models_named(b: &BackendConfig) -> std::collections::BTreeSet<String> {
    let builtin = crate::models::builtin_names();
    b.models
        .iter()
        .filter(|m| !builtin.contains(m))
        .cloned()
        .collect()
}

/// A `[[backends]]` entry with DNS discovery that has no address: its name resolves to
/// none (a headless Service before any pod is ready) or not at all, and none was known.
#[derive(Debug, Clone, PartialEq)]
pub struct Unresolved {
    pub name: String,
    pub why: String,
    /// The models the config names for it (empty: any).
    pub only_models: Vec<String>,
}

pub struct Fleet {
    backends: ArcSwap<Vec<Arc<BackendHandle>>>,
    unresolved: ArcSwap<Vec<Unresolved>>,
    catalog: ArcSwap<Catalog>,
    /// `tensorgate_backend_tolerated_total`, labels backend and tolerance.
    tolerated: prometheus::IntCounterVec,
    refreshed_once: AtomicBool,
    client: http::HttpClient,
    resolver: Arc<dyn Resolve>,
    builtin: BuiltinSettings,
    probe_timeout: Duration,
    unhealthy_after_checks: u32,
    /// `fleet.hash_table_size`; a reload may change it.
    hash_table_size: AtomicUsize,
    /// `fleet.sequence_idle_timeout_ms`: how long a model's past hash tables are kept.
    history_ms: AtomicU64,
    pub ejection: EjectionPolicy,
    /// Serializes reconciliations (reload and DNS) so that they cannot interleave.
    reconcile_lock: tokio::sync::Mutex<()>,
    /// Serializes refreshes (the periodic one, a load's, a reload's): each stores the
    /// states it found and the catalog built from them, so a round that began earlier and
    /// waited on a slow backend would otherwise store older news over newer.
    refresh_lock: tokio::sync::Mutex<()>,
}

impl Fleet {
    /// `tolerated` counts what backends' metadata needed forgiving (`protocol::tolerance`).
    pub fn new(
        config: &Config,
        client: http::HttpClient,
        resolver: Arc<dyn Resolve>,
        tolerated: prometheus::IntCounterVec,
    ) -> Fleet {
        Fleet {
            backends: ArcSwap::from_pointee(Vec::new()),
            catalog: ArcSwap::from_pointee(Catalog::default()),
            tolerated,
            refreshed_once: AtomicBool::new(false),
            unresolved: ArcSwap::from_pointee(Vec::new()),
            client,
            resolver,
            builtin: BuiltinSettings {
                sequence_idle_timeout: config
                    .model("accumulate")
                    .and_then(|m| m.sequence_idle_timeout_ms)
                    .map(Duration::from_millis)
                    .unwrap_or(BuiltinSettings::default().sequence_idle_timeout),
            },
            probe_timeout: Duration::from_millis(config.fleet.probe_timeout_ms),
            unhealthy_after_checks: config.fleet.unhealthy_after_checks.max(1),
            hash_table_size: AtomicUsize::new(config.fleet.hash_table_size),
            history_ms: AtomicU64::new(config.fleet.sequence_idle_timeout_ms),
            ejection: EjectionPolicy {
                after_failures: config.fleet.eject_after_failures.max(1),
                base: Duration::from_millis(config.fleet.eject_base_ms),
                max: Duration::from_millis(config.fleet.eject_max_ms),
            },
            reconcile_lock: tokio::sync::Mutex::new(()),
            refresh_lock: tokio::sync::Mutex::new(()),
        }
    }

    pub fn backends(&self) -> Arc<Vec<Arc<BackendHandle>>> {
        self.backends.load_full()
    }

    /// The DNS backends that have no address now, and why.
    pub fn unresolved(&self) -> Arc<Vec<Unresolved>> {
        self.unresolved.load_full()
    }

    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog.load_full()
    }

    pub fn refreshed_once(&self) -> bool {
        self.refreshed_once.load(Ordering::Acquire)
    }

    /// Makes the backend list match `config`, resolving DNS backends, reusing the handles
    /// of backends that stay, then refreshes. Built-in backends are built once and kept.
    pub async fn reconcile(&self, config: &Config) -> Result<(), String> {
        let _guard = self.reconcile_lock.lock().await;
        let old = self.backends.load_full();
        let mut new = Vec::new();
        let mut unresolved = Vec::new();
        for b in &config.backends {
            let name = b.name.get_ref();
            let url = b.url.get_ref();
            let concrete: Vec<(String, String)> = match b.discovery {
                Discovery::Static => vec![(name.clone(), discovery::canonical_url(url))],
                Discovery::Dns => {
                    let (found, why) = match self.resolve(url).await {
                        Ok(list) => (
                            list.into_iter()
                                .map(|u| (format!("{name}/{}", u.trim_start_matches("http://")), u))
                                .collect(),
                            format!("DNS discovery of {url} found no address"),
                        ),
                        Err(e) => {
                            // Keep what we had rather than dropping a fleet on a DNS hiccup.
                            tracing::warn!(backend = %name, error = %e, "DNS discovery failed; keeping the previous addresses");
                            let kept: Vec<(String, String)> = old
                                .iter()
                                .filter(|h| h.name.starts_with(&format!("{name}/")))
                                .map(|h| (h.name.to_string(), h.key.clone()))
                                .collect();
                            (kept, format!("DNS discovery failed: {e}"))
                        }
                    };
                    if found.is_empty() {
                        unresolved.push(Unresolved {
                            name: name.clone(),
                            why,
                            only_models: only_models(url, b),
                        });
                    }
                    found
                }
            };
            for (n, u) in concrete {
                match old.iter().find(|h| h.same_as(&n, &u, b)) {
                    Some(h) => new.push(h.clone()),
                    None => new.push(self.build_handle(&n, &u, b)?),
                }
            }
        }
        self.hash_table_size
            .store(config.fleet.hash_table_size, Ordering::Relaxed);
        self.history_ms
            .store(config.fleet.sequence_idle_timeout_ms, Ordering::Relaxed);
        self.backends.store(Arc::new(new));
        self.unresolved.store(Arc::new(unresolved));
        drop(_guard);
        self.refresh().await;
        Ok(())
    }

    async fn resolve(&self, url: &str) -> Result<Vec<String>, String> {
        let uri: ::http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        let host = uri.host().ok_or_else(|| format!("{url} has no host"))?;
        let mut ips = self.resolver.resolve(host).await?;
        ips.sort();
        ips.dedup();
        Ok(ips
            .into_iter()
            .map(|ip| discovery::address_url(&uri, ip))
            .collect())
    }

    fn build_handle(
        &self,
        name: &str,
        url: &str,
        b: &BackendConfig,
    ) -> Result<Arc<BackendHandle>, String> {
        let backend: Arc<dyn Backend> = if url == "builtin" {
            crate::models::check_model_names(&b.models, b.model_repository.as_deref())?;
            // A list that names repository models only builds no built-in model.
            let models = match crate::models::selected_builtin(&b.models) {
                Some(only) => builtin_models(&only, &self.builtin)?,
                None => Default::default(),
            };
            match &b.model_repository {
                Some(dir) => {
                    // A list that names any repository model serves only what it names.
                    let named = repository_models_named(b);
                    let only = (!named.is_empty()).then_some(named);
                    Arc::new(builtin::BuiltinBackend::with_repository(
                        models,
                        Repository::open(dir, builtin_names())?,
                        only,
                    ))
                }
                None => Arc::new(builtin::BuiltinBackend::new(models)),
            }
        } else {
            Arc::new(http::HttpBackend::new(
                url,
                self.client.clone(),
                self.probe_timeout,
            ))
        };
        Ok(Arc::new(BackendHandle {
            name: name.into(),
            key: url.to_string(),
            backend,
            encoding: b.encoding,
            classification: b.classification,
            weight: b.weight.max(1),
            only_models: only_models(url, b),
            repository: b.model_repository.clone(),
            state: ArcSwap::from_pointee(BackendState::default()),
            outstanding: AtomicUsize::new(0),
            health: Health::default(),
            failed_checks: AtomicU32::new(0),
        }))
    }

    /// Asks every backend, in parallel, for its metadata, models and readiness (the active
    /// health check), then rebuilds the catalog.
    pub async fn refresh(&self) {
        let _one_at_a_time = self.refresh_lock.lock().await;
        let backends = self.backends.load_full();
        let threshold = self.unhealthy_after_checks;
        let rounds = backends
            .iter()
            .map(|h| refresh_backend(h, threshold, &self.tolerated));
        let states = futures_util::future::join_all(rounds).await;
        let previous = self.catalog.load_full();
        // Building hash tables takes milliseconds; keep it off the async workers.
        let table_size = self.hash_table_size.load(Ordering::Relaxed);
        let window = HistoryWindow {
            keep: Duration::from_millis(self.history_ms.load(Ordering::Relaxed)),
            now: std::time::Instant::now(),
        };
        let (catalog, backends, states) = tokio::task::spawn_blocking(move || {
            let catalog = Catalog::build_from(&backends, &states, &previous, table_size, window);
            (catalog, backends, states)
        })
        .await
        .expect("building the catalog does not panic");
        // The catalog first, then the states it was built from: see `Catalog::build_from`.
        self.catalog.store(Arc::new(catalog));
        for (h, state) in backends.iter().zip(states) {
            h.state.store(state);
        }
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

/// One backend's new state, for the caller to store.
async fn refresh_backend(
    h: &BackendHandle,
    unhealthy_after_checks: u32,
    tolerated: &prometheus::IntCounterVec,
) -> Arc<BackendState> {
    let result = async {
        h.backend.ready().await?;
        let server = h.backend.server_metadata().await?;
        // Only what the backend lists, or what the config names for this backend, is ever
        // probed: a model configured for the whole fleet is not asked of every server.
        let list = h.backend.models(&h.only_models).await?;
        Ok::<_, backend::BackendError>((server, list))
    }
    .await;
    let state = match result {
        Ok((server, list)) => {
            let failed_before = h.failed_checks.swap(0, Ordering::Relaxed);
            for t in &list.tolerated {
                tolerated.with_label_values(&[&h.name, t.label()]).inc();
            }
            let mut models: HashMap<String, DiscoveredModel> = list
                .models
                .into_iter()
                .filter(|m| h.only_models.is_empty() || h.only_models.contains(&m.metadata.name))
                .map(|m| (m.metadata.name.clone(), m))
                .collect();
            // A model whose metadata got no answer is not gone: it keeps what was known of
            // it, not ready (a 503 to retry, not a 404 that clients take as final).
            let previous = h.state.load();
            for name in &list.unanswered {
                if let Some(known) = previous.models.get(name) {
                    models
                        .entry(name.clone())
                        .or_insert_with(|| DiscoveredModel {
                            ready: false,
                            ..known.clone()
                        });
                }
            }
            let no_models = models.is_empty().then(|| {
                if list.tried.is_empty() {
                    format!(
                        "none of the models it lists is among those the config names for it ({})",
                        h.only_models.join(", ")
                    )
                } else {
                    list.tried
                }
            });
            // The counterpart of the health-check warnings: an operator following an outage
            // in the log sees where it ended.
            // Failed checks below the threshold leave it reachable, but were logged too.
            if previous.server.is_some() && (!previous.reachable || failed_before > 0) {
                tracing::info!(backend = %h.name, url = %h.key, models = models.len(), "backend reachable again");
            } else if !previous.reachable && h.key == "builtin" {
                // A worker's own models: no backend was reached.
                tracing::info!(backend = %h.name, models = models.len(), "models serving");
            } else if !previous.reachable {
                tracing::info!(backend = %h.name, url = %h.key, models = models.len(), "backend reached");
            }
            // Said once when it starts (or its reason changes), not at every refresh.
            if no_models.is_some() && no_models != previous.no_models {
                tracing::warn!(backend = %h.name, tried = %no_models.as_deref().unwrap_or_default(), "backend exposes no models");
            }
            let mut capabilities = Capabilities::learn(&server, h.encoding);
            // MLServer 1.7 lists no extensions yet has the repository endpoints; a server that
            // lists its extensions (Triton, KServe, tensorgate) is taken at its word: a
            // tensorgate worker without a repository answers the index, but cannot load.
            capabilities.repository |= list.answers_index && server.extensions.is_empty();
            BackendState {
                reachable: true,
                capabilities,
                server: Some(server),
                models,
                unavailable: list.unavailable,
                last_error: None,
                no_models,
            }
        }
        Err(e) => {
            let failed = h.failed_checks.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::warn!(backend = %h.name, url = %h.key, error = %e, failed_checks = failed, "backend health check failed");
            let previous = h.state.load();
            // A backend that answers "not ready" or with an error is believed at once. One
            // that did not answer may have lost a single probe (a connection closed under
            // it, a pause): that is not yet an outage, and requests meanwhile meet passive
            // ejection if the backend is really gone.
            let no_answer = matches!(
                e,
                backend::BackendError::Connect(_)
                    | backend::BackendError::Reset(_)
                    | backend::BackendError::Failed(_)
            );
            if previous.reachable && no_answer && failed < unhealthy_after_checks {
                let mut kept = BackendState::clone(&previous);
                kept.last_error = Some(e.to_string());
                return Arc::new(kept);
            }
            // Its models stay known, not ready: clients get a retryable 503 rather than a
            // 404 that says the model does not exist.
            BackendState {
                reachable: false,
                last_error: Some(e.to_string()),
                models: previous
                    .models
                    .iter()
                    .map(|(n, m)| {
                        (
                            n.clone(),
                            DiscoveredModel {
                                ready: false,
                                ..m.clone()
                            },
                        )
                    })
                    .collect(),
                capabilities: previous.capabilities,
                server: previous.server.clone(),
                unavailable: previous.unavailable.clone(),
                no_models: None,
            }
        }
    };
    Arc::new(state)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use ::http::StatusCode;

    use super::backend::{BackendError, BoxFuture, InferCall, ModelList, Reply};
    use super::*;
    use crate::protocol::ModelMetadata;

    #[test]
    fn kserve_gets_binary_tensors_without_listing_them() {
        let server = |name: &str, extensions: &[&str]| ServerMetadata {
            name: name.into(),
            version: "0.21.0".into(),
            extensions: extensions.iter().map(|e| e.to_string()).collect(),
        };
        let kserve = Capabilities::learn(
            &server("kserve", &["model_repository_extension"]),
            Encoding::Auto,
        );
        assert_eq!(
            kserve,
            Capabilities {
                binary: true,
                exact_outputs: false,
                classification: false,
                half_classification: false,
                repository: true,
            }
        );
        let triton = Capabilities::learn(&server("triton", &["classification"]), Encoding::Auto);
        assert!(triton.classification && !triton.half_classification);
        let worker = Capabilities::learn(
            &server("tensorgate-worker", &["classification"]),
            Encoding::Auto,
        );
        assert!(worker.classification && worker.half_classification);
        let json = Capabilities::learn(&server("kserve", &[]), Encoding::Json);
        assert!(!json.binary, "the config's encoding wins");
        let mlserver = Capabilities::learn(&server("mlserver", &[]), Encoding::Auto);
        assert!(!mlserver.binary);
    }

    /// A list of ready models with these names, without tensors.
    fn listing(names: &[&str]) -> ModelList {
        ModelList {
            models: names
                .iter()
                .map(|n| DiscoveredModel {
                    metadata: ModelMetadata {
                        name: n.to_string(),
                        versions: vec![],
                        platform: String::new(),
                        inputs: vec![],
                        outputs: vec![],
                    },
                    ready: true,
                    stated: None,
                })
                .collect(),
            ..ModelList::default()
        }
    }

    /// Answers readiness probes from a script, one entry per probe; lists one model, `m`,
    /// or the next of `lists` while there is one.
    struct Scripted(Mutex<Vec<Result<(), BackendError>>>, Mutex<Vec<ModelList>>);

    impl Backend for Scripted {
        fn in_process(&self) -> bool {
            false
        }
        fn server_metadata(&self) -> BoxFuture<'_, Result<ServerMetadata, BackendError>> {
            Box::pin(async {
                Ok(ServerMetadata {
                    name: "scripted".into(),
                    version: "1".into(),
                    extensions: vec![],
                })
            })
        }
        fn models<'a>(
            &'a self,
            _configured: &'a [String],
        ) -> BoxFuture<'a, Result<ModelList, BackendError>> {
            let scripted = {
                let mut lists = self.1.lock().unwrap();
                (!lists.is_empty()).then(|| lists.remove(0))
            };
            Box::pin(async {
                if let Some(list) = scripted {
                    return Ok(list);
                }
                Ok(listing(&["m"]))
            })
        }
        fn ready(&self) -> BoxFuture<'_, Result<(), BackendError>> {
            let next = self.0.lock().unwrap().remove(0);
            Box::pin(async move { next })
        }
        fn infer<'a>(&'a self, _: InferCall<'a>) -> BoxFuture<'a, Result<Reply, BackendError>> {
            Box::pin(async { Err(BackendError::Failed("not used".into())) })
        }
    }

    fn handle(script: Vec<Result<(), BackendError>>) -> BackendHandle {
        scripted(Arc::new(Scripted(Mutex::new(script), Mutex::new(vec![]))))
    }

    fn scripted(backend: Arc<Scripted>) -> BackendHandle {
        BackendHandle {
            name: "b".into(),
            key: "http://b".into(),
            backend,
            encoding: Encoding::Auto,
            classification: ClassificationMode::Auto,
            weight: 1,
            only_models: vec![],
            repository: None,
            state: ArcSwap::from_pointee(BackendState::default()),
            outstanding: AtomicUsize::new(0),
            health: Health::default(),
            failed_checks: AtomicU32::new(0),
        }
    }

    /// Runs one health check per script entry and returns `reachable` after each.
    async fn reachability(h: &BackendHandle, checks: usize, threshold: u32) -> Vec<bool> {
        let mut seen = Vec::new();
        for _ in 0..checks {
            h.state
                .store(refresh_backend(h, threshold, &counter()).await);
            seen.push(h.state.load().reachable);
        }
        seen
    }

    fn counter() -> prometheus::IntCounterVec {
        prometheus::IntCounterVec::new(prometheus::Opts::new("t", "t"), &["backend", "tolerance"])
            .unwrap()
    }

    fn lost() -> Result<(), BackendError> {
        Err(BackendError::Connect("connection refused".into()))
    }

    #[tokio::test]
    async fn a_backend_goes_unreachable_only_after_the_threshold_of_lost_probes() {
        let h = handle(vec![Ok(()), lost(), Ok(()), lost(), lost(), Ok(())]);
        assert_eq!(
            reachability(&h, 6, 2).await,
            [true, true, true, true, false, true]
        );
        // While it stays reachable, the models stay ready and the error is kept for logs.
        let h = handle(vec![Ok(()), lost()]);
        reachability(&h, 2, 2).await;
        let state = h.state.load();
        assert!(state.models["m"].ready);
        assert_eq!(state.last_error.as_deref(), Some("connection refused"));
    }

    #[tokio::test]
    async fn an_answer_of_not_ready_takes_effect_at_once() {
        let not_ready = Err(BackendError::Status {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "draining".into(),
        });
        let h = handle(vec![Ok(()), not_ready, Ok(())]);
        assert_eq!(reachability(&h, 3, 3).await, [true, false, true]);
        let h = handle(vec![Ok(()), lost()]);
        assert_eq!(reachability(&h, 2, 1).await, [true, false]);
        // A backend never seen reachable is not given the benefit of the doubt.
        let h = handle(vec![lost(), Ok(())]);
        assert_eq!(reachability(&h, 2, 5).await, [false, true]);
    }

    /// A backend that goes down between its index and a model's metadata: the model it
    /// listed stays known, not ready, rather than vanish (which made it a 404); one the
    /// fleet never knew is not made up.
    #[tokio::test]
    async fn a_model_whose_metadata_got_no_answer_stays_known_and_not_ready() {
        let backend = Arc::new(Scripted(
            Mutex::new(vec![Ok(()), Ok(()), Ok(())]),
            Mutex::new(vec![]),
        ));
        let h = scripted(backend.clone());
        let cut_off = |names: &[&str]| ModelList {
            tried: "the index lists models, but GET /v2/models/m failed".into(),
            unanswered: names.iter().map(|n| n.to_string()).collect(),
            ..ModelList::default()
        };
        h.state.store(refresh_backend(&h, 1, &counter()).await);
        assert!(h.state.load().models["m"].ready);
        *backend.1.lock().unwrap() = vec![cut_off(&["m", "new"])];
        h.state.store(refresh_backend(&h, 1, &counter()).await);
        let state = h.state.load();
        assert!(state.reachable);
        assert_eq!(state.models.keys().collect::<Vec<_>>(), ["m"]);
        assert!(!state.models["m"].ready);
        assert_eq!(state.models["m"].metadata.name, "m");
        assert_eq!(state.no_models, None);
        // Its metadata answers again: ready again.
        h.state.store(refresh_backend(&h, 1, &counter()).await);
        assert!(h.state.load().models["m"].ready);
    }

    /// Its first readiness probe waits for its `Notify`; the others answer at once.
    struct Gated(Arc<tokio::sync::Notify>, AtomicBool);

    impl Backend for Gated {
        fn in_process(&self) -> bool {
            false
        }
        fn server_metadata(&self) -> BoxFuture<'_, Result<ServerMetadata, BackendError>> {
            Box::pin(async {
                Ok(ServerMetadata {
                    name: "gated".into(),
                    version: "1".into(),
                    extensions: vec![],
                })
            })
        }
        fn models<'a>(&'a self, _: &'a [String]) -> BoxFuture<'a, Result<ModelList, BackendError>> {
            Box::pin(async { Ok(ModelList::default()) })
        }
        fn ready(&self) -> BoxFuture<'_, Result<(), BackendError>> {
            Box::pin(async {
                if self.1.swap(false, Ordering::SeqCst) {
                    self.0.notified().await;
                }
                Ok(())
            })
        }
        fn infer<'a>(&'a self, _: InferCall<'a>) -> BoxFuture<'a, Result<Reply, BackendError>> {
            Box::pin(async { Err(BackendError::Failed("not used".into())) })
        }
    }

    /// A refresh stores the states it found only after the catalog built from them: while a
    /// slow backend holds the round up, a fast one's stored state is still the old one, like the
    /// catalog. Stored first, a model just loaded was briefly in neither the old catalog nor
    /// its backend's list of unavailable models (which lookup reads for why a model is
    /// missing), and was "unknown" (404).
    #[tokio::test]
    async fn a_refresh_stores_backend_states_after_its_catalog() {
        let (fleet, open) = fleet_with_a_slow_backend(handle(vec![Ok(())]));
        let round = tokio::spawn({
            let fleet = fleet.clone();
            async move { fleet.refresh().await }
        });
        // The fast backend's round is done long before this (it answers at once).
        tokio::time::sleep(Duration::from_millis(200)).await;
        let fast = fleet.backends()[0].clone();
        assert!(
            fast.state.load().models.is_empty(),
            "stored before the catalog"
        );
        assert!(fleet.catalog().get("m").is_none());
        open.notify_one();
        tokio::time::timeout(Duration::from_secs(5), round)
            .await
            .expect("the round ends")
            .unwrap();
        assert!(fast.state.load().models["m"].ready);
        assert_eq!(fleet.catalog().get("m").unwrap().ready.len(), 1);
    }

    /// A fleet of `fast` and a backend whose first readiness probe waits for the `Notify`.
    fn fleet_with_a_slow_backend(fast: BackendHandle) -> (Arc<Fleet>, Arc<tokio::sync::Notify>) {
        let config = crate::config::parse_and_check("").unwrap();
        let client = http::new_client(
            Duration::from_secs(1),
            Duration::from_secs(1),
            crate::tls::client_config(&Default::default()).unwrap(),
        );
        let resolver = Arc::new(discovery::StaticResolver(Default::default()));
        let fleet = Arc::new(Fleet::new(&config, client, resolver, counter()));
        let open = Arc::new(tokio::sync::Notify::new());
        let slow = BackendHandle {
            name: "slow".into(),
            key: "http://slow".into(),
            backend: Arc::new(Gated(open.clone(), AtomicBool::new(true))),
            ..handle(vec![])
        };
        fleet
            .backends
            .store(Arc::new(vec![Arc::new(fast), Arc::new(slow)]));
        (fleet, open)
    }

    /// Refreshes run one at a time: a round that began first and waits on a slow backend
    /// cannot store its older news over a later round's (a load's own refresh, which found
    /// the model it loaded).
    #[tokio::test]
    async fn a_later_refresh_is_not_undone_by_an_earlier_one() {
        let fast = Arc::new(Scripted(
            Mutex::new(vec![Ok(()), Ok(())]),
            Mutex::new(vec![listing(&["m"]), listing(&["m", "new"])]),
        ));
        let (fleet, open) = fleet_with_a_slow_backend(scripted(fast));
        let earlier = tokio::spawn({
            let fleet = fleet.clone();
            async move { fleet.refresh().await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let later = tokio::spawn({
            let fleet = fleet.clone();
            async move { fleet.refresh().await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        open.notify_one();
        for round in [earlier, later] {
            tokio::time::timeout(Duration::from_secs(5), round)
                .await
                .expect("the round ends")
                .unwrap();
        }
        assert!(
            fleet.catalog().get("new").is_some(),
            "the later round's news"
        );
        assert!(fleet.backends()[0].state.load().models.contains_key("new"));
    }
}
