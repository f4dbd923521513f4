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
