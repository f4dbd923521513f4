//! What the small endpoints answer, whatever the transport: readiness, model readiness, the
//! repository index and statistics. The REST and gRPC edges only format it.

use serde_json::{json, Value};

use super::core::{lookup, lookup_for_readiness};
use super::Gateway;
use crate::error::GatewayError;
pub use crate::fleet::backend::RepositoryAction;
use crate::fleet::repository::ControlOutcome;
use crate::fleet::CatalogEntry;
use crate::protocol::metadata::extensions;

/// The extensions the gateway itself guarantees, whatever the backends support.
/// The extensions the gateway serves: `model_repository` only while a backend has a model
/// repository (a load or unload has nowhere to go otherwise).
pub fn extensions(gw: &Gateway) -> Vec<&'static str> {
    let repository = gw
        .fleet
        .backends()
        .iter()
        .any(|h| h.capabilities().repository);
    [
        extensions::BINARY_TENSOR_DATA,
        extensions::CLASSIFICATION,
        extensions::MODEL_REPOSITORY,
        extensions::SEQUENCE,
        extensions::STATISTICS,
    ]
    .into_iter()
    .filter(|e| repository || *e != extensions::MODEL_REPOSITORY)
    .collect()
}

/// Ready means: not draining, the first discovery round is done, and at least one model has
/// a backend that reports it ready.
pub fn server_ready(gw: &Gateway) -> Result<(), GatewayError> {
    if gw.is_draining() {
        return Err(GatewayError::Unavailable(
            "tensorgate is shutting down".into(),
        ));
    }
    if !gw.fleet.refreshed_once() {
        return Err(gw.still_starting());
    }
    if !gw.fleet.catalog().any_ready() {
        return Err(GatewayError::Unavailable(no_ready_model(gw)));
    }
    Ok(())
}

/// Why nothing is ready, with what discovery tried on each backend that exposes no models.
fn no_ready_model(gw: &Gateway) -> String {
    let unresolved = gw.fleet.unresolved();
    if gw.fleet.backends().is_empty() && unresolved.is_empty() {
        return "no [[backends]] are configured".to_string();
    }
    let mut why = String::from("no backend has a ready model");
    for u in unresolved.iter() {
        why.push_str(&format!("; backend '{}' has no address: {}", u.name, u.why));
    }
    for h in gw.fleet.backends().iter() {
        let state = h.state.load();
        if let Some(tried) = &state.no_models {
            why.push_str(&format!(
                "; backend '{}' exposes no models: {tried}",
                h.name
            ));
        } else if !state.reachable {
            match &state.last_error {
                Some(e) => why.push_str(&format!(
                    "; backend '{}' failed its health checks: {e}",
                    h.name
                )),
                None => why.push_str(&format!("; backend '{}' is unreachable", h.name)),
            }
        }
    }
    why
}

/// A model is ready when a backend reports it ready.
pub fn model_ready(
    gw: &Gateway,
    model: &str,
    version: Option<&str>,
) -> Result<CatalogEntry, GatewayError> {
    let entry = lookup_for_readiness(gw, model, version)?;
    if entry.ready.is_empty() {
        return Err(GatewayError::Unavailable(format!(
            "model '{model}' is not ready: no backend reports it ready"
        )));
    }
    Ok(entry)
}

/// One model (version) of the repository extension's index.
pub struct IndexEntry {
    pub name: String,
    pub version: Option<String>,
    pub state: &'static str,
    pub reason: String,
    /// The backends that serve it (READY) or that reported it (otherwise).
    pub backends: Vec<String>,
}

impl IndexEntry {
    pub fn ready(&self) -> bool {
        self.state == "READY"
    }
}

/// The fleet's index: every model of the catalog (one entry per version it lists), READY when
/// a backend has it ready, with those backends; then what backends reported they have but
/// cannot serve (a model that failed to load, with why). Lets a gateway discover the models
/// of another tensorgate (a worker, or a gateway tier).
pub fn repository_index(gw: &Gateway) -> Vec<IndexEntry> {
    let mut entries: Vec<IndexEntry> = Vec::new();
    for (name, e) in gw.fleet.catalog().models.iter() {
        if e.ready.is_empty() {
            for version in listed_versions(&e.metadata.versions) {
                entries.push(IndexEntry {
                    name: name.clone(),
                    version,
                    state: "UNAVAILABLE",
                    reason: "no backend reports it ready".into(),
                    backends: vec![],
                });
            }
            continue;
        }
        // Each backend's own versions: during a rolling update they differ, and the index
        // says which backend serves which.
        let mut by_version: Vec<(Option<String>, Vec<String>)> = Vec::new();
        for h in &e.ready {
            let state = h.state.load();
            let listed = state
                .models
                .get(name.as_str())
                .map(|m| m.metadata.versions.as_slice())
                .unwrap_or_default();
            for v in listed_versions(listed) {
                match by_version.iter_mut().find(|(x, _)| *x == v) {
                    Some((_, backends)) => backends.push(h.name.to_string()),
                    None => by_version.push((v, vec![h.name.to_string()])),
                }
            }
        }
        for (version, backends) in by_version {
            entries.push(IndexEntry {
                name: name.clone(),
                version,
                state: "READY",
                reason: String::new(),
                backends,
            });
        }
    }
    for h in gw.fleet.backends().iter() {
        for u in &h.state.load().unavailable {
            // Hidden when another backend serves it: the fleet has the model. Shown when the
            // same backend serves the name and reports it unavailable too (a repository
            // model named like one of the worker's built-in models, or a reload that failed
            // while the old model serves on): that backend's operator has something to fix.
            let served = entries.iter().any(|e| {
                e.name == u.name
                    && e.ready()
                    && (u.version.is_none() || e.version == u.version)
                    && !e.backends.iter().any(|b| **b == *h.name)
            });
            if !served {
                entries.push(IndexEntry {
                    name: u.name.clone(),
                    version: u.version.clone(),
                    state: u.state.as_str(),
                    reason: u.reason.clone(),
                    backends: vec![h.name.to_string()],
                });
            }
        }
    }
    entries
}

/// A model's versions as index entries: one per version, or one without a version for a
/// model that lists none (KServe's).
fn listed_versions(versions: &[String]) -> Vec<Option<String>> {
    if versions.is_empty() {
        vec![None]
    } else {
        versions.iter().cloned().map(Some).collect()
    }
}

/// What a load or unload across the fleet came to.
pub struct ControlReport {
    pub outcomes: Vec<ControlOutcome>,
    /// Every backend refused the request itself (no such model, a model that cannot load:
    /// Triton answers 400), so it is the client's to fix; otherwise a backend failed, or the
    /// backends disagree (502).
    pub refused: bool,
}

impl ControlReport {
    pub fn failed(&self) -> Vec<&ControlOutcome> {
        self.outcomes.iter().filter(|o| o.result.is_err()).collect()
    }

    /// The error message naming each backend that failed, or `None` if none did.
    pub fn error(&self, model: &str, action: RepositoryAction) -> Option<String> {
        let failed = self.failed();
        if failed.is_empty() {
            return None;
        }
        // A worker, whose only backend is its own models: no fleet to count (a gateway in
        // front counts and names the workers itself).
        if let [only] = &self.outcomes[..] {
            if only.in_process {
                let why = only.result.as_ref().err()?;
                return Some(format!(
                    "{} of model '{model}' failed: {why}",
                    action.as_str()
                ));
            }
        }
        let each: Vec<String> = failed
            .iter()
            .map(|o| format!("{}: {}", o.backend, o.result.as_ref().unwrap_err()))
            .collect();
        Some(format!(
            "{} of model '{model}' failed on {} of {} backends: {}",
            action.as_str(),
            failed.len(),
            self.outcomes.len(),
            each.join("; ")
        ))
    }

    pub fn json(&self, model: &str, action: RepositoryAction) -> Value {
        let results: Vec<Value> = self
            .outcomes
            .iter()
            .map(|o| match &o.result {
                Ok(()) if o.skipped => json!({
                    "backend": o.backend,
                    "status": "skipped",
                    "reason": "unreachable at the last health checks; it reads its repository when it returns"
                }),
                Ok(()) => json!({"backend": o.backend, "status": "ok"}),
                Err(e) => json!({"backend": o.backend, "status": "failed", "error": e}),
            })
            .collect();
        let mut body = json!({"model": model, "action": action.as_str(), "results": results});
        if let Some(error) = self.error(model, action) {
            body["error"] = json!(error);
        }
        body
    }
}

/// Loads or unloads `model` on every backend with a model repository; the catalog is
/// refreshed before this returns.
/// `parameters`: the names of the request's parameters (see `check_control_parameters`).
pub async fn control<'a>(
    gw: &Gateway,
    model: &str,
    action: RepositoryAction,
    parameters: impl IntoIterator<Item = &'a str>,
) -> Result<ControlReport, GatewayError> {
    check_control_parameters(parameters)?;
    let timeout = gw.config().limits.request_timeout();
    let outcomes = gw.fleet.control(model, action, timeout).await;
    if outcomes.is_empty() {
        return Err(GatewayError::BadRequest(format!(
            "cannot {} model '{model}': no backend of this gateway has a model repository (the model_repository extension)",
            action.as_str()
        )));
    }
    if outcomes.iter().all(|o| o.skipped) {
        return Err(GatewayError::Unavailable(format!(
            "cannot {} model '{model}': every backend with a model repository is unreachable",
            action.as_str()
        )));
    }
    // Where some backends did it and others refused, the fleet disagrees about the model:
    // a backend's matter (502), as for any other failure.
    let refused = outcomes
        .iter()
        .filter(|o| !o.skipped)
        .all(|o| o.result.is_err() && o.refused);
    Ok(ControlReport { outcomes, refused })
}

/// The parameters of a load or unload. A load from the repository as it is needs none;
/// Triton's overrides (`config`, a configuration to use instead of the repository's, and
/// `file:<path>`, model files sent in the request) are refused rather than ignored: a 200
/// would tell the client its override took effect. Others (`unload_dependents`) change
/// nothing here and pass.
fn check_control_parameters<'a>(
    names: impl IntoIterator<Item = &'a str>,
) -> Result<(), GatewayError> {
    for name in names {
        if name == "config" || name.starts_with("file:") {
            return Err(GatewayError::BadRequest(format!(
                "parameter '{name}' is not supported: tensorgate loads a model as its repository holds it (no configuration overrides or model files in the request)"
            )));
        }
    }
    Ok(())
}

/// The statistics extension, from the gateway's point of view (see `observe::Stats`):
/// `{"model_stats": [...]}`.
pub fn stats(
    gw: &Gateway,
    model: Option<&str>,
    version: Option<&str>,
) -> Result<Value, GatewayError> {
    if let Some(m) = model {
        lookup(gw, m, version)?;
    }
    Ok(gw.stats.json(model, version, &known_versions(gw)))
}

/// Every (model, version) of the catalog: a request names any version a model lists
/// (`lookup` refuses others); a model that lists none has the one version "".
pub fn known_versions(gw: &Gateway) -> Vec<(String, String)> {
    gw.fleet
        .catalog()
        .models
        .iter()
        .flat_map(|(name, e)| {
            let versions = &e.metadata.versions;
            let listed: Vec<String> = if versions.is_empty() {
                vec![String::new()]
            } else {
                versions.clone()
            };
            listed.into_iter().map(move |v| (name.clone(), v))
        })
        .collect()
}
