//! Phase 1: the model in the fleet's catalog, and the version a path names.

use crate::error::GatewayError;
use crate::fleet::CatalogEntry;
use crate::gateway::Gateway;

/// Finds a model (and version) in the catalog: NotFound when unknown, Unavailable while the
/// first discovery round runs.
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
        return Err(GatewayError::NotFound(not_served(gw, model)));
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
        // The metadata is the first backend's; during a rolling update another may have
        // the version already, and routing sends the request there.
        let elsewhere = || {
            entry
                .ready
                .iter()
                .any(|h| h.lists_version(model, v) == Some(true))
        };
        if !versions.iter().any(|x| x == v) && !elsewhere() {
            return Err(GatewayError::NotFound(format!(
                "model '{model}' has no version '{v}' (its versions are {})",
                versions.join(", ")
            )));
        }
    }
    Ok(entry.clone())
}

/// Why a model is not in the catalog: unknown, or known to a backend's repository that
/// cannot serve it (a failed load, an unload), with the backend's reason: a user who just
/// loaded a broken model learns why, not only that the name is unknown.
fn not_served(gw: &Gateway, model: &str) -> String {
    let reasons: Vec<String> = gw
        .fleet
        .backends()
        .iter()
        .flat_map(|h| {
            let state = h.state.load();
            state
                .unavailable
                .iter()
                .filter(|e| e.name == model)
                .map(|e| {
                    let version = e
                        .version
                        .as_deref()
                        .map(|v| format!(" version {v}"))
                        .unwrap_or_default();
                    format!(
                        "{} on backend '{}'{version}: {}",
                        e.state.as_str(),
                        h.name,
                        e.reason
                    )
                })
                .collect::<Vec<_>>()
        })
        .collect();
    if reasons.is_empty() {
        format!("unknown model '{model}'")
    } else {
        format!("model '{model}' is not available: {}", reasons.join("; "))
    }
}
