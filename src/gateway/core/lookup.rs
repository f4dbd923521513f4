//! Phase 1: the model in the fleet's catalog, and the version a path names.

use std::sync::Arc;

use crate::error::GatewayError;
use crate::fleet::CatalogEntry;
use crate::gateway::Gateway;
use crate::models::repository::ModelState;

/// Finds a model (and version) in the catalog: NotFound when unknown, Unavailable while the
/// first discovery round runs or while a backend loads it.
pub fn lookup(
    gw: &Gateway,
    model: &str,
    version: Option<&str>,
) -> Result<CatalogEntry, GatewayError> {
    find(gw, model, version, false)
}

/// [`lookup`] for a readiness probe: a model that a backend's repository knows but cannot
/// serve (unloaded, failed to load) is not ready (503), where infer and metadata answer 404
/// as Triton does ("has no available versions"). Only an unknown name is a 404 here.
pub fn lookup_for_readiness(
    gw: &Gateway,
    model: &str,
    version: Option<&str>,
) -> Result<CatalogEntry, GatewayError> {
    find(gw, model, version, true)
}

fn find(
    gw: &Gateway,
    model: &str,
    version: Option<&str>,
    readiness: bool,
) -> Result<CatalogEntry, GatewayError> {
    let catalog = gw.fleet.catalog();
    let Some(entry) = catalog.get(model) else {
        if !gw.fleet.refreshed_once() {
            return Err(gw.still_starting());
        }
        return Err(not_served(gw, model, readiness));
    };
    // A version in the path must be one the model lists. A model that lists none (KServe's,
    // MLServer's without a version) is refused any: metadata and readiness could not vouch
    // for it, and such servers refuse versioned infer paths themselves (KServe with 501).
    let Some(v) = version else {
        return Ok(entry.clone());
    };
    let versions = &entry.metadata.versions;
    if versions.is_empty() {
        return Err(GatewayError::NotFound(format!(
            "model '{model}' lists no versions; address it without '/versions/{v}'"
        )));
    }
    if versions.iter().any(|x| x == v) {
        return Ok(entry.clone());
    }
    // The catalog lists the versions of the ready backends that serve the tensors it
    // shows. During a rolling update to other tensors, another may serve the version
    // already (or still), with tensors of its own: the request is checked against the
    // metadata of a backend that lists it, and routing sends it only there.
    let lister = entry.ready.iter().find_map(|h| {
        let state = h.state.load();
        let m = &state.models.get(model)?.metadata;
        m.versions
            .iter()
            .any(|x| x == v)
            .then(|| Arc::new(m.clone()))
    });
    if let Some(metadata) = lister {
        return Ok(CatalogEntry {
            metadata,
            mixed_tensors: true,
            ..entry.clone()
        });
    }
    // A version only backends that are not ready list: theirs to serve again.
    let down: Vec<String> = gw
        .fleet
        .backends()
        .iter()
        .filter_map(|h| {
            let state = h.state.load();
            let m = state.models.get(model)?;
            (!m.ready && m.metadata.versions.iter().any(|x| x == v))
                .then(|| with_last_error(&h.name, &state))
        })
        .collect();
    if !down.is_empty() {
        return Err(GatewayError::Unavailable(format!(
            "model '{model}' version {v} is served only by backends that are not ready: {}",
            down.join(", ")
        )));
    }
    // A version a repository has but cannot serve (it failed to load) is named with why.
    let (reasons, loading) = unavailable(gw, model, Some(v));
    if reasons.is_empty() {
        return Err(GatewayError::NotFound(format!(
            "model '{model}' has no version '{v}' (its versions are {})",
            versions.join(", ")
        )));
    }
    let message = format!(
        "model '{model}' version {v} is not available: {} (its versions are {})",
        reasons.join("; "),
        versions.join(", ")
    );
    Err(not_available(message, loading || readiness))
}

/// An unknown name is a 404 only when every backend that could serve it has said what it
/// serves. While one has never been reached (a gateway started before its backends, or
/// pointed at a wrong address), the model may be one of its own: 503, naming the backend
/// and why it was not reached, since clients and their retry policies take a 404 as final.
fn unknown(gw: &Gateway, model: &str) -> GatewayError {
    let may_serve = |only: &[String]| only.is_empty() || only.iter().any(|m| m == model);
    let mut unreached: Vec<String> = gw
        .fleet
        .backends()
        .iter()
        .filter(|h| may_serve(&h.only_models))
        .filter_map(|h| {
            let state = h.state.load();
            // Never answered: a backend that did and went down keeps its server metadata.
            (!state.reachable && state.server.is_none()).then(|| with_last_error(&h.name, &state))
        })
        .collect();
    // A DNS backend with no address yet (a headless Service before its first ready pod).
    unreached.extend(
        gw.fleet
            .unresolved()
            .iter()
            .filter(|u| may_serve(&u.only_models))
            .map(|u| format!("backend '{}' ({})", u.name, u.why)),
    );
    if unreached.is_empty() {
        return GatewayError::NotFound(format!("unknown model '{model}'"));
    }
    GatewayError::Unavailable(not_yet_known(model, &unreached))
}

/// A backend named in an error, with why its last health check failed, if it did.
fn with_last_error(name: &str, state: &crate::fleet::BackendState) -> String {
    match &state.last_error {
        Some(why) => format!("backend '{name}' ({why})"),
        None => format!("backend '{name}'"),
    }
}

/// Why `model` is not known yet, for the backends (described) that were never reached.
fn not_yet_known(model: &str, unreached: &[String]) -> String {
    let (have, they) = if unreached.len() == 1 {
        ("has", "it serves")
    } else {
        ("have", "they serve")
    };
    let named = match unreached {
        [.., last] if unreached.len() > 1 => {
            format!("{} and {last}", unreached[..unreached.len() - 1].join(", "))
        }
        _ => unreached.join(""),
    };
    format!(
        "unknown model '{model}', but {named} {have} not been reached to say which models {they}; retry later"
    )
}

/// Why a model is not in the catalog: unknown, or known to a backend's repository that
/// cannot serve it (a failed load, an unload), with the backend's reason: a user who just
/// loaded a broken model learns why, not only that the name is unknown. A model that is
/// loading is unavailable for now (503: come back), not missing.
fn not_served(gw: &Gateway, model: &str, readiness: bool) -> GatewayError {
    let (reasons, loading) = unavailable(gw, model, None);
    if reasons.is_empty() {
        return unknown(gw, model);
    }
    let message = format!("model '{model}' is not available: {}", reasons.join("; "));
    not_available(message, loading || readiness)
}

/// Infer and metadata answer 404 for a model or version that cannot serve, as Triton does;
/// a readiness probe, and anything while a load runs, 503.
fn not_available(message: String, unavailable: bool) -> GatewayError {
    if unavailable {
        GatewayError::Unavailable(message)
    } else {
        GatewayError::NotFound(message)
    }
}

/// What the backends' repositories say of `model` (of its `version` only, if given) that
/// they cannot serve, one sentence each, and whether one is loading it.
fn unavailable(gw: &Gateway, model: &str, version: Option<&str>) -> (Vec<String>, bool) {
    let mut loading = false;
    let reasons = gw
        .fleet
        .backends()
        .iter()
        .flat_map(|h| {
            let state = h.state.load();
            state
                .unavailable
                .iter()
                .filter(|e| e.name == model)
                // An entry without a version (a load in progress, an unload) is the
                // whole model's.
                .filter(|e| {
                    e.version.is_none() || version.is_none() || e.version.as_deref() == version
                })
                .map(|e| {
                    loading |= e.state == ModelState::Loading;
                    let version = match (version, e.version.as_deref()) {
                        (None, Some(v)) => format!(" version {v}"),
                        _ => String::new(),
                    };
                    // MLServer gives an unloaded model an empty reason.
                    let reason = if e.reason.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", e.reason)
                    };
                    format!(
                        "{} on backend '{}'{version}{reason}",
                        e.state.as_str(),
                        h.name
                    )
                })
                .collect::<Vec<_>>()
        })
        .collect();
    (reasons, loading)
}

#[cfg(test)]
mod tests {
    use super::not_yet_known;

    #[test]
    fn unreached_backends_are_named_in_a_sentence() {
        let named = |n: &[&str]| {
            let n: Vec<String> = n.iter().map(|s| s.to_string()).collect();
            not_yet_known("m", &n)
        };
        assert_eq!(
            named(&["backend 'a' (refused)"]),
            "unknown model 'm', but backend 'a' (refused) has not been reached to say which models it serves; retry later"
        );
        assert_eq!(
            named(&["backend 'a'", "backend 'b' (timed out)"]),
            "unknown model 'm', but backend 'a' and backend 'b' (timed out) have not been reached to say which models they serve; retry later"
        );
        assert_eq!(
            named(&["backend 'a'", "backend 'b'", "backend 'c'"]),
            "unknown model 'm', but backend 'a', backend 'b' and backend 'c' have not been reached to say which models they serve; retry later"
        );
    }
}
