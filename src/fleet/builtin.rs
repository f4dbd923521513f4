//! The in-process backend: the built-in models, and the models of a model repository
//! (`--model-repository`), called directly with decoded requests. Models that take real time
//! run on the blocking pool, as many at once as their instance count, never on the async
//! workers.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::{OnceCell, Semaphore};

use super::backend::{
    Backend, BackendError, BoxFuture, DiscoveredModel, InferCall, ModelList, Payload, Reply,
    RepositoryAction, StatedConfig,
};
use crate::models::repository::{IndexEntry, ModelState, Repository};
use crate::models::{Model, ModelError};
use crate::protocol::metadata::extensions;
use crate::protocol::{InferResponse, Parameters, Role, ServerMetadata};

/// A model and, for one that runs on the blocking pool, the permits of its instances.
#[derive(Clone)]
struct Slot {
    model: Arc<dyn Model>,
    permits: Option<Arc<Semaphore>>,
}

impl Slot {
    fn new(model: Arc<dyn Model>) -> Slot {
        let permits = model
            .instances()
            .map(|n| Arc::new(Semaphore::new(n.max(1))));
        Slot { model, permits }
    }
}

/// The repository behind the in-process models, and what became of each of its models.
struct RepositoryState {
    repo: Arc<Repository>,
    /// The repository models this server serves, when a models list names them
    /// (`--models`, `[[backends]] models`); `None`: all. The others are never loaded.
    only: Option<std::collections::BTreeSet<String>>,
    /// Loaded once, on the first discovery round (the worker is not ready until then).
    scanned: OnceCell<()>,
    /// Index entries by model name.
    index: Mutex<BTreeMap<String, Vec<IndexEntry>>>,
    /// One load or unload at a time.
    control: tokio::sync::Mutex<()>,
}

pub struct BuiltinBackend {
    models: ArcSwap<BTreeMap<String, Slot>>,
    /// The demo models compiled into the binary that this process serves: never unloaded,
    /// whatever the repository holds under their names.
    built_in: std::collections::BTreeSet<String>,
    repository: Option<RepositoryState>,
}

impl BuiltinBackend {
    pub fn new(models: BTreeMap<String, Arc<dyn Model>>) -> Self {
        BuiltinBackend {
            built_in: models.keys().cloned().collect(),
            models: ArcSwap::from_pointee(
                models.into_iter().map(|(n, m)| (n, Slot::new(m))).collect(),
            ),
            repository: None,
        }
    }

    /// The built-in `models` and those of `repo`, which are loaded on the first discovery
    /// round.
    /// `only`: the repository models to serve, when a models list names them; `None`: all.
    pub fn with_repository(
        models: BTreeMap<String, Arc<dyn Model>>,
        repo: Repository,
        only: Option<std::collections::BTreeSet<String>>,
    ) -> Self {
        BuiltinBackend {
            repository: Some(RepositoryState {
                repo: Arc::new(repo),
                only,
                scanned: OnceCell::new(),
                index: Mutex::new(BTreeMap::new()),
                control: tokio::sync::Mutex::new(()),
            }),
            ..BuiltinBackend::new(models)
        }
    }

    async fn scan(&self, state: &RepositoryState) {
        state
            .scanned
            .get_or_init(|| async {
                let names = match state.repo.model_names() {
                    Ok(names) => names,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot read the model repository");
                        return;
                    }
                };
                let served = |n: &String| state.only.as_ref().is_none_or(|o| o.contains(n));
                for name in names.into_iter().filter(served) {
                    // A model some of whose versions loaded serves; `load_one` said which
                    // did not.
                    if let Err(e) = self.load_one(state, &name).await {
                        if !self.models.load().contains_key(&name) {
                            tracing::error!(model = %name, error = %e, "model not loaded");
                        }
                    }
                }
            })
            .await;
    }

    /// Loads (or loads again) one model of the repository. On failure a model already
    /// serving keeps serving.
    async fn load_one(&self, state: &RepositoryState, name: &str) -> Result<(), String> {
        if !state.repo.has(name) {
            return Err(format!(
                "no model '{name}' in the model repository {}",
                state.repo.dir().display()
            ));
        }
        set_index(
            state,
            name,
            vec![entry(name, ModelState::Loading, String::new())],
        );
        let repo = state.repo.clone();
        let owned = name.to_string();
        let loaded = tokio::task::spawn_blocking(move || repo.load(&owned))
            .await
            .map_err(|e| format!("loading model '{name}' failed: {e}"))?;
        // A built-in model of the same name serves on, but it is not this one: the
        // repository's model is unavailable, not a failed reload of a serving one.
        let serving = self.models.load().contains_key(name) && !state.repo.is_reserved(name);
        let failed = |entries: &[IndexEntry]| {
            entries
                .iter()
                .filter(|e| e.state != ModelState::Ready)
                .map(|e| match &e.version {
                    Some(v) => format!("version {v}: {}", e.reason),
                    None => e.reason.clone(),
                })
                .collect::<Vec<_>>()
                .join("; ")
        };
        match loaded.model {
            Some(model) => {
                let mut models = (**self.models.load()).clone();
                models.insert(name.to_string(), Slot::new(model.clone()));
                self.models.store(Arc::new(models));
                let reason = failed(&loaded.entries);
                set_index(state, name, loaded.entries);
                if reason.is_empty() {
                    tracing::info!(model = name, "model loaded");
                    return Ok(());
                }
                // Some versions failed: the others serve, and the load says what failed
                // (a deploy script must not read it as done), as Triton's does.
                let versions = &model.metadata().versions;
                let serving = match versions.len() {
                    1 => format!("version {} serves", versions[0]),
                    _ => format!("versions {} serve", versions.join(", ")),
                };
                tracing::warn!(model = name, %reason, %serving, "model loaded, but not every version");
                Err(format!("{reason} ({serving})"))
            }
            None => {
                let reason = failed(&loaded.entries);
                if serving {
                    set_index(
                        state,
                        name,
                        vec![entry(
                            name,
                            ModelState::Ready,
                            format!("a new load failed, the loaded model keeps serving: {reason}"),
                        )],
                    );
                } else {
                    set_index(state, name, loaded.entries);
                }
                Err(reason)
            }
        }
    }

    fn unload_one(&self, state: &RepositoryState, name: &str) -> Result<(), String> {
        let mut models = (**self.models.load()).clone();
        let known = state.index.lock().expect("index lock").contains_key(name);
        if !known && !models.contains_key(name) {
            return Err(format!("no model '{name}' in the model repository"));
        }
        models.remove(name);
        self.models.store(Arc::new(models));
        set_index(
            state,
            name,
            vec![entry(name, ModelState::Unavailable, "unloaded".into())],
        );
        tracing::info!(model = name, "model unloaded");
        Ok(())
    }
}

/// A run that panicked (a runtime's bug: tract panics on some bad inputs) is this request's
/// 500, with the panic's message; the worker goes on.
fn panicked(model: &str, e: tokio::task::JoinError) -> String {
    let detail = match e.try_into_panic() {
        Ok(payload) => crate::error::panic_message(&*payload).to_string(),
        Err(e) => e.to_string(),
    };
    format!("model '{model}' failed: the runtime panicked: {detail}")
}

fn entry(name: &str, state: ModelState, reason: String) -> IndexEntry {
    IndexEntry {
        name: name.to_string(),
        version: None,
        state,
        reason,
    }
}

fn set_index(state: &RepositoryState, name: &str, entries: Vec<IndexEntry>) {
    state
        .index
        .lock()
        .expect("index lock")
        .insert(name.to_string(), entries);
}

impl Backend for BuiltinBackend {
    fn in_process(&self) -> bool {
        true
    }

    fn server_metadata(&self) -> BoxFuture<'_, Result<ServerMetadata, BackendError>> {
        Box::pin(async {
            let mut extensions = vec![
                extensions::BINARY_TENSOR_DATA.into(),
                extensions::SEQUENCE.into(),
            ];
            if self.repository.is_some() {
                extensions.push(extensions::MODEL_REPOSITORY.into());
            }
            Ok(ServerMetadata {
                name: "tensorgate-builtin".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                extensions,
            })
        })
    }

    fn models<'a>(
        &'a self,
        _configured: &'a [String],
    ) -> BoxFuture<'a, Result<ModelList, BackendError>> {
        Box::pin(async move {
            if let Some(state) = &self.repository {
                self.scan(state).await;
            }
            let models = self
                .models
                .load()
                .values()
                .map(|slot| DiscoveredModel {
                    metadata: slot.model.metadata().clone(),
                    ready: true,
                    stated: Some(StatedConfig {
                        max_batch_size: slot.model.max_batch_size(),
                        sequence_batching: slot.model.sequence_batching(),
                        labeled_outputs: slot.model.label_files(),
                    }),
                })
                .collect();
            Ok(ModelList {
                models,
                tried: if self.repository.is_some() {
                    "no built-in model is on, and no repository model is serving (the \
                     repository index says why each is not)"
                } else {
                    "the built-in backend was configured with no models"
                }
                .into(),
                tolerated: vec![],
                unavailable: self.unavailable(),
                answers_index: self.repository.is_some(),
                unanswered: vec![],
            })
        })
    }

    fn ready(&self) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async { Ok(()) })
    }

    fn infer<'a>(&'a self, call: InferCall<'a>) -> BoxFuture<'a, Result<Reply, BackendError>> {
        Box::pin(async move {
            let Payload::Decoded(req) = call.payload else {
                return Err(BackendError::Failed(
                    "the built-in backend takes decoded requests".into(),
                ));
            };
            // Gone since the gateway looked it up: an unload raced the request. Not the
            // client's error (a 400), but the 404 the lookup would answer now.
            let slot = self.models.load().get(call.model).cloned().ok_or_else(|| {
                BackendError::Status {
                    status: http::StatusCode::NOT_FOUND,
                    message: format!("model '{}' is not available: it was unloaded", call.model),
                }
            })?;
            let version = call.version.map(str::to_string);
            let (outputs, req, queued) = match &slot.permits {
                None => (
                    slot.model.infer_version(version.as_deref(), &req),
                    req,
                    Duration::ZERO,
                ),
                Some(permits) => {
                    let called = Instant::now();
                    let _permit = permits
                        .clone()
                        .acquire_owned()
                        .await
                        .map_err(|_| BackendError::Broken("the model was unloaded".into()))?;
                    let model = slot.model.clone();
                    // The run goes on if the request is cancelled or times out: it keeps
                    // its model's permit (or one request's deadline could start runs past
                    // the model's instances) and its part of the budget for bodies.
                    let held = call.held;
                    let (outputs, req, ran) = tokio::task::spawn_blocking(move || {
                        let (_permit, _held) = (_permit, held);
                        let running = Instant::now();
                        let outputs = model.infer_version(version.as_deref(), &req);
                        (outputs, req, running.elapsed())
                    })
                    .await
                    .map_err(|e| BackendError::Broken(panicked(call.model, e)))?;
                    (outputs, req, called.elapsed().saturating_sub(ran))
                }
            };
            let outputs = outputs.map_err(|e| match e {
                ModelError::Invalid(m) => BackendError::Rejected(m),
                ModelError::Failed(m) => BackendError::Broken(m),
            })?;
            // The one place tensors enter the gateway without having been decoded: checked
            // here, once, so that encoding and classification can rely on them.
            for t in &outputs {
                t.check_consistent().map_err(|e| {
                    BackendError::Broken(format!(
                        "model '{}': {}",
                        call.model,
                        e.in_tensor(Role::Output, &t.name)
                    ))
                })?;
            }
            let response = InferResponse {
                id: req.id.clone(),
                model_name: call.model.to_string(),
                // The version that ran: the one asked for, else the latest (as Triton says).
                model_version: call
                    .version
                    .map(str::to_string)
                    .or_else(|| slot.model.metadata().versions.last().cloned())
                    .or_else(|| Some("1".into())),
                parameters: Parameters::new(),
                outputs,
            };
            Ok(Reply::Decoded { response, queued })
        })
    }

    fn labels(&self, model: &str, output: &str) -> Option<Arc<Vec<String>>> {
        self.models.load().get(model)?.model.labels(output)
    }

    fn control<'a>(
        &'a self,
        model: &'a str,
        action: RepositoryAction,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            let Some(state) = &self.repository else {
                return Err(BackendError::Rejected(
                    "this server has no model repository".into(),
                ));
            };
            self.scan(state).await;
            let _one_at_a_time = state.control.lock().await;
            let listed = state.only.as_ref().is_none_or(|o| o.contains(model));
            if !listed && !self.built_in.contains(model) {
                return Err(BackendError::Rejected(format!(
                    "model '{model}' is not among the models this server serves (--models, or [[backends]] models)"
                )));
            }
            if self.built_in.contains(model) {
                // Always loaded: an unload could not be undone (a load reads the repository,
                // which does not hold it), also when a directory of the repository has its
                // name, which a load refuses by name.
                match action {
                    RepositoryAction::Load if !state.repo.has(model) => return Ok(()),
                    RepositoryAction::Load => {}
                    RepositoryAction::Unload => {
                        return Err(BackendError::Rejected(format!(
                            "model '{model}' is built into tensorgate, not loaded from the model repository: it cannot be unloaded"
                        )))
                    }
                }
            }
            match action {
                RepositoryAction::Load => self.load_one(state, model).await,
                RepositoryAction::Unload => self.unload_one(state, model),
            }
            .map_err(BackendError::Rejected)
        })
    }
}

impl BuiltinBackend {
    /// Repository models that are not serving, with why.
    fn unavailable(&self) -> Vec<IndexEntry> {
        let Some(state) = &self.repository else {
            return Vec::new();
        };
        let serving = self.models.load();
        state
            .index
            .lock()
            .expect("index lock")
            .values()
            .flatten()
            .filter(|e| e.state != ModelState::Ready || !serving.contains_key(&e.name))
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_builtin_classifier_carries_its_labels() {
        let models = crate::models::builtin_models(&[], &Default::default()).unwrap();
        let backend = BuiltinBackend::new(models);
        assert_eq!(backend.labels("classifier", "OUTPUT0").unwrap()[3], "cat");
        assert_eq!(backend.labels("simple", "OUTPUT0"), None);
    }

    use bytes::Bytes;

    use super::*;
    use crate::protocol::{DataType, InferRequest, ModelMetadata, Tensor};

    /// A model with a bug: its FP32 [2] output carries one element's bytes.
    struct Broken(ModelMetadata);

    impl Model for Broken {
        fn metadata(&self) -> &ModelMetadata {
            &self.0
        }
        fn infer(&self, _: &InferRequest) -> Result<Vec<Tensor>, ModelError> {
            Ok(vec![Tensor {
                name: "OUT".into(),
                datatype: DataType::Fp32,
                shape: vec![2],
                parameters: Parameters::new(),
                data: Bytes::from_static(&[0; 4]),
            }])
        }
    }

    fn one_model(name: &str, model: impl Model + 'static) -> BuiltinBackend {
        BuiltinBackend::new(BTreeMap::from([(
            name.to_string(),
            Arc::new(model) as Arc<dyn Model>,
        )]))
    }

    static NO_HEADERS: std::sync::LazyLock<http::HeaderMap> =
        std::sync::LazyLock::new(http::HeaderMap::new);

    /// A call without inputs to `model`.
    fn call(model: &str) -> InferCall<'_> {
        InferCall {
            model,
            version: None,
            payload: Payload::Decoded(InferRequest {
                id: None,
                parameters: Parameters::new(),
                options: Default::default(),
                inputs: vec![],
                outputs: None,
            }),
            headers: &NO_HEADERS,
            held: Default::default(),
        }
    }

    #[tokio::test]
    async fn an_output_that_contradicts_its_shape_is_the_servers_fault() {
        let metadata = crate::models::metadata("broken", vec![], vec![]);
        let backend = one_model("broken", Broken(metadata));
        match backend.infer(call("broken")).await {
            Err(BackendError::Broken(m)) => assert_eq!(
                m,
                "model 'broken': output 'OUT': inconsistent tensor: shape [2] of FP32 needs 8 bytes, data has 4"
            ),
            other => panic!("expected Broken, got {:?}", other.map(|_| ())),
        }
    }

    /// An unload between the gateway's lookup and the run: a 404 that routing may retry
    /// elsewhere (nothing ran), not a 400 that blames the client.
    #[tokio::test]
    async fn a_model_unloaded_under_a_request_is_not_found() {
        let metadata = crate::models::metadata("broken", vec![], vec![]);
        let backend = one_model("broken", Broken(metadata));
        let e = backend.infer(call("gone")).await.err().unwrap();
        assert_eq!(
            e,
            BackendError::Status {
                status: http::StatusCode::NOT_FOUND,
                message: "model 'gone' is not available: it was unloaded".into(),
            }
        );
        assert_eq!(e.retry(), crate::fleet::backend::Retry::Anywhere);
    }

    /// A one-instance model that takes 300 ms a run.
    struct Slow(ModelMetadata);

    impl Model for Slow {
        fn metadata(&self) -> &ModelMetadata {
            &self.0
        }
        fn instances(&self) -> Option<usize> {
            Some(1)
        }
        fn infer(&self, _: &InferRequest) -> Result<Vec<Tensor>, ModelError> {
            std::thread::sleep(RUN);
            Ok(vec![])
        }
    }

    const RUN: Duration = Duration::from_millis(300);

    /// The wait for a busy instance is queue time, not the model's: of two calls at once to
    /// a one-instance model, the second reports the first's run as queued, and neither its
    /// own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_wait_for_an_instance_is_reported_as_queued() {
        let metadata = crate::models::metadata("slow", vec![], vec![]);
        let backend = one_model("slow", Slow(metadata));
        let (a, b) = tokio::join!(backend.infer(call("slow")), backend.infer(call("slow")));
        let queued = |r: Result<Reply, BackendError>| match r {
            Ok(Reply::Decoded { queued, .. }) => queued,
            _ => panic!("expected an answer"),
        };
        // One of them waited for the other's whole run (the permit is held through it), on
        // top of its own hop to the blocking pool; the other only for that hop. Had a call's
        // own run been counted, the first would show a whole run and the second two.
        let (a, b) = (queued(a), queued(b));
        let (shorter, longer) = (a.min(b), a.max(b));
        assert!(longer >= RUN && longer < 2 * RUN, "{a:?} {b:?}");
        assert!(shorter < RUN, "{a:?} {b:?}");
    }

    /// A one-instance model whose run begins, says so, and waits to be let go.
    struct Gated {
        metadata: ModelMetadata,
        started: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
        release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    }

    impl Model for Gated {
        fn metadata(&self) -> &ModelMetadata {
            &self.metadata
        }
        fn instances(&self) -> Option<usize> {
            Some(1)
        }
        fn infer(&self, _: &InferRequest) -> Result<Vec<Tensor>, ModelError> {
            self.started.lock().unwrap().send(()).unwrap();
            let released = self.release.lock().unwrap();
            released.recv_timeout(Duration::from_secs(10)).unwrap();
            Ok(vec![])
        }
    }

    /// A run whose request is cancelled (a client gone, a deadline passed) goes on, and
    /// keeps its model's instance and the request's part of the budget for bodies until it
    /// ends: had they been given back with the request, another run could start beside it
    /// and cancelled requests could hold memory past the budget.
    #[tokio::test(flavor = "current_thread")]
    async fn a_cancelled_run_keeps_its_instance_and_its_budget_until_it_ends() {
        use crate::body_budget::BodyBudget;
        let (started_tx, started) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel();
        let backend = one_model(
            "gated",
            Gated {
                metadata: crate::models::metadata("gated", vec![], vec![]),
                started: started_tx.into(),
                release: release_rx.into(),
            },
        );
        let permits = backend.models.load()["gated"].permits.clone().unwrap();
        let gauge = prometheus::IntGauge::new("held", "held").unwrap();
        let budget = BodyBudget::new(100, gauge.clone());
        let mut held = budget.reserve();
        held.hold(60).unwrap();
        let mut cancelled = call("gated");
        cancelled.held = held.keep();
        tokio::select! {
            _ = backend.infer(cancelled) => unreachable!("the run waits to be let go"),
            _ = tokio::task::spawn_blocking(move || started.recv().unwrap()) => {}
        }
        drop(held);
        assert_eq!(permits.available_permits(), 0);
        assert_eq!(gauge.get(), 60);
        release.send(()).unwrap();
        // Both given back once the run has ended (bounded: 10 s).
        for _ in 0..1000 {
            if permits.available_permits() == 1 && gauge.get() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(permits.available_permits(), 1);
        assert_eq!(gauge.get(), 0);
    }
}
