//! The small endpoints: server metadata, health, model metadata and readiness.

use http::{Response, StatusCode};
use serde_json::json;

use super::{status_json, Gateway};
use crate::body::Body;
use crate::error::GatewayError;
use crate::fleet::CatalogEntry;
use crate::protocol::metadata::extensions;

/// The extensions the gateway itself guarantees, whatever the backends support.
pub const GATEWAY_EXTENSIONS: &[&str] = &[
    extensions::BINARY_TENSOR_DATA,
    extensions::CLASSIFICATION,
    extensions::SEQUENCE,
    extensions::STATISTICS,
];

pub fn server_metadata(gw: &Gateway) -> Response<Body> {
    status_json(
        StatusCode::OK,
        json!({
            "name": gw.config().server.name,
            "version": env!("CARGO_PKG_VERSION"),
            "extensions": GATEWAY_EXTENSIONS,
        }),
    )
}

pub fn live() -> Response<Body> {
    status_json(StatusCode::OK, json!({ "live": true }))
}

/// Ready means: not draining, the first discovery round is done, and at least one model has
/// a backend that reports it ready.
pub fn ready(gw: &Gateway) -> Result<Response<Body>, GatewayError> {
    if gw.is_draining() {
        return Err(GatewayError::Unavailable(
            "tensorgate is shutting down".into(),
        ));
    }
    if !gw.fleet.refreshed_once() {
        return Err(GatewayError::Unavailable(
            "tensorgate has not finished discovering its backends".into(),
        ));
    }
    if !gw.fleet.catalog().any_ready() {
        return Err(GatewayError::Unavailable(no_ready_model(gw)));
    }
    Ok(status_json(StatusCode::OK, json!({ "ready": true })))
}

/// Why nothing is ready, with what discovery tried on each backend that exposes no models.
fn no_ready_model(gw: &Gateway) -> String {
    let mut why = String::from("no backend has a ready model");
    for h in gw.fleet.backends().iter() {
        let state = h.state.load();
        if let Some(tried) = &state.no_models {
            why.push_str(&format!(
                "; backend '{}' exposes no models: {tried}",
                h.name
            ));
        } else if !state.reachable {
            why.push_str(&format!("; backend '{}' is unreachable", h.name));
        }
    }
    why
}

/// Finds a model (and version) in the catalog: 404 when unknown.
pub fn lookup(
    gw: &Gateway,
    model: &str,
    version: Option<&str>,
) -> Result<CatalogEntry, GatewayError> {
    let catalog = gw.fleet.catalog();
    let Some(entry) = catalog.get(model) else {
        if !gw.fleet.refreshed_once() {
            return Err(GatewayError::Unavailable(
                "tensorgate has not finished discovering its backends".into(),
            ));
        }
        return Err(GatewayError::NotFound(format!("unknown model '{model}'")));
    };
    // A version in the path must be one the model lists. A model that lists none (KServe's,
    // MLServer's without a version) is refused any: metadata and readiness could not vouch
    // for it, and such servers refuse versioned infer paths themselves (KServe with 501).
    if let Some(v) = version {
        let versions = &entry.metadata.versions;
        if versions.is_empty() {
            return Err(GatewayError::NotFound(format!(
                "model '{model}' lists no versions; address it without '/versions/{v}'"
            )));
        }
        if !versions.iter().any(|x| x == v) {
            return Err(GatewayError::NotFound(format!(
                "model '{model}' has no version '{v}' (its versions are {})",
                versions.join(", ")
            )));
        }
    }
    Ok(entry.clone())
}

pub fn model_metadata(
    gw: &Gateway,
    model: &str,
    version: Option<&str>,
) -> Result<Response<Body>, GatewayError> {
    let entry = lookup(gw, model, version)?;
    let value = serde_json::to_value(&*entry.metadata)
        .map_err(|e| GatewayError::Internal(e.to_string()))?;
    Ok(status_json(StatusCode::OK, value))
}

pub fn model_ready(
    gw: &Gateway,
    model: &str,
    version: Option<&str>,
) -> Result<Response<Body>, GatewayError> {
    let entry = lookup(gw, model, version)?;
    if entry.ready.is_empty() {
        return Err(GatewayError::Unavailable(format!(
            "model '{model}' is not ready: no backend reports it ready"
        )));
    }
    Ok(status_json(
        StatusCode::OK,
        json!({ "name": model, "ready": true }),
    ))
}

/// The repository extension's index: every known model, READY when a backend has it ready.
/// Lets a gateway discover the models of another tensorgate (a worker, or a gateway tier).
pub fn repository_index(gw: &Gateway) -> Response<Body> {
    let catalog = gw.fleet.catalog();
    let list: Vec<serde_json::Value> = catalog
        .models
        .iter()
        .map(|(name, e)| {
            let mut v = json!({
                "name": name,
                "state": if e.ready.is_empty() { "UNAVAILABLE" } else { "READY" },
            });
            if let Some(version) = e.metadata.versions.first() {
                v["version"] = json!(version);
            }
            v
        })
        .collect();
    status_json(StatusCode::OK, serde_json::Value::Array(list))
}

/// The statistics extension, from the gateway's point of view (see `observe::Stats`).
pub fn stats(
    gw: &Gateway,
    model: Option<&str>,
    version: Option<&str>,
) -> Result<Response<Body>, GatewayError> {
    if let Some(m) = model {
        lookup(gw, m, version)?;
    }
    let catalog = gw.fleet.catalog();
    let known: Vec<(String, String)> = catalog
        .models
        .iter()
        .map(|(name, e)| {
            (
                name.clone(),
                e.metadata.versions.first().cloned().unwrap_or_default(),
            )
        })
        .collect();
    Ok(status_json(
        StatusCode::OK,
        gw.stats.json(model, version, &known),
    ))
}
