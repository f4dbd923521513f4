//! What the small endpoints answer, whatever the transport: readiness, model readiness, the
//! repository index and statistics. The REST and gRPC edges only format it.

use serde_json::Value;

use super::core::lookup;
use super::Gateway;
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

/// Ready means: not draining, the first discovery round is done, and at least one model has
/// a backend that reports it ready.
pub fn server_ready(gw: &Gateway) -> Result<(), GatewayError> {
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
    Ok(())
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

/// A model is ready when a backend reports it ready.
pub fn model_ready(
    gw: &Gateway,
    model: &str,
    version: Option<&str>,
) -> Result<CatalogEntry, GatewayError> {
    let entry = lookup(gw, model, version)?;
    if entry.ready.is_empty() {
        return Err(GatewayError::Unavailable(format!(
            "model '{model}' is not ready: no backend reports it ready"
        )));
    }
    Ok(entry)
}

/// One model of the repository extension's index.
pub struct IndexEntry {
    pub name: String,
    pub version: Option<String>,
    pub ready: bool,
}

impl IndexEntry {
    pub fn state(&self) -> &'static str {
        if self.ready {
            "READY"
        } else {
            "UNAVAILABLE"
        }
    }
}

/// Every known model, READY when a backend has it ready. Lets a gateway discover the
/// models of another tensorgate (a worker, or a gateway tier).
pub fn repository_index(gw: &Gateway) -> Vec<IndexEntry> {
    gw.fleet
        .catalog()
        .models
        .iter()
        .map(|(name, e)| IndexEntry {
            name: name.clone(),
            version: e.metadata.versions.first().cloned(),
            ready: !e.ready.is_empty(),
        })
        .collect()
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
    // Every version a model lists: a request names any of them (`lookup` refuses others).
    let known: Vec<(String, String)> = gw
        .fleet
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
        .collect();
    Ok(gw.stats.json(model, version, &known))
}
