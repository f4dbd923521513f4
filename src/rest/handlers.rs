//! The small REST endpoints: the gateway's answers (`gateway::queries`) as v2 JSON.

use http::{Response, StatusCode};
use serde_json::json;

use super::status_json;
use crate::body::Body;
use crate::error::GatewayError;
use crate::gateway::core::lookup;
use crate::gateway::observe::Observation;
use crate::gateway::queries;
use crate::gateway::queries::RepositoryAction;
use crate::gateway::Gateway;

pub fn server_metadata(gw: &Gateway) -> Response<Body> {
    status_json(
        StatusCode::OK,
        json!({
            "name": gw.config().server.name,
            "version": env!("CARGO_PKG_VERSION"),
            "extensions": queries::extensions(gw),
        }),
    )
}

pub fn live() -> Response<Body> {
    status_json(StatusCode::OK, json!({ "live": true }))
}

pub fn ready(gw: &Gateway) -> Result<Response<Body>, GatewayError> {
    queries::server_ready(gw)?;
    Ok(status_json(StatusCode::OK, json!({ "ready": true })))
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
    queries::model_ready(gw, model, version)?;
    Ok(status_json(
        StatusCode::OK,
        json!({ "name": model, "ready": true }),
    ))
}

/// The fleet's index; `{"ready": true}` lists only the models that can serve, as Triton.
pub fn repository_index(
    gw: &Gateway,
    body: Option<&serde_json::Value>,
) -> Result<Response<Body>, GatewayError> {
    let ready_only = match body.and_then(|b| b.get("ready")) {
        None => false,
        Some(serde_json::Value::Bool(b)) => *b,
        Some(other) => {
            return Err(GatewayError::BadRequest(format!(
                "'ready' must be a bool, not {other}"
            )))
        }
    };
    let list: Vec<serde_json::Value> = queries::repository_index(gw)
        .iter()
        .filter(|e| !ready_only || e.ready())
        .map(|e| {
            let mut v = json!({ "name": e.name, "state": e.state, "backends": e.backends });
            if let Some(version) = &e.version {
                v["version"] = json!(version);
            }
            if !e.reason.is_empty() {
                v["reason"] = json!(e.reason);
            }
            v
        })
        .collect();
    Ok(status_json(StatusCode::OK, serde_json::Value::Array(list)))
}

/// A load or unload across the fleet: 200 when every backend with a repository did it; 400
/// when every one refused it (no such model, a model that cannot load); 502 otherwise, naming
/// each backend that failed; each backend's result in the body either way.
pub async fn repository_control(
    gw: &Gateway,
    model: &str,
    action: RepositoryAction,
    body: Option<&serde_json::Value>,
    obs: &mut Observation,
) -> Result<Response<Body>, GatewayError> {
    let names = match body.and_then(|b| b.get("parameters")) {
        None => Vec::new(),
        Some(serde_json::Value::Object(p)) => p.keys().map(String::as_str).collect(),
        Some(other) => {
            return Err(GatewayError::BadRequest(format!(
                "'parameters' must be an object, not {other}"
            )))
        }
    };
    let report = queries::control(gw, model, action, names).await?;
    let status = match (report.failed().is_empty(), report.refused) {
        (true, _) => StatusCode::OK,
        (false, true) => StatusCode::BAD_REQUEST,
        (false, false) => StatusCode::BAD_GATEWAY,
    };
    // The access line carries the message the client got, as for any refused request.
    obs.error = report.error(model, action);
    Ok(status_json(status, report.json(model, action)))
}

pub fn stats(
    gw: &Gateway,
    model: Option<&str>,
    version: Option<&str>,
) -> Result<Response<Body>, GatewayError> {
    Ok(status_json(
        StatusCode::OK,
        queries::stats(gw, model, version)?,
    ))
}

/// The model configuration as Triton's HTTP endpoint writes it (field names of
/// model_config.proto, `TYPE_*` names, dims as numbers), with the fields the gateway knows.
pub async fn model_config(
    gw: &Gateway,
    model: &str,
    version: Option<&str>,
) -> Result<Response<Body>, GatewayError> {
    use crate::protocol::grpc::pb;
    let c = crate::gateway::model_config::model_config(gw, model, version)?;
    let data_type = |t: i32| {
        pb::DataType::try_from(t)
            .unwrap_or(pb::DataType::TypeInvalid)
            .as_str_name()
    };
    let inputs: Vec<serde_json::Value> = c
        .input
        .iter()
        .map(|t| json!({"name": t.name, "data_type": data_type(t.data_type), "dims": t.dims}))
        .collect();
    let outputs: Vec<serde_json::Value> = c
        .output
        .iter()
        .map(|t| {
            let mut v =
                json!({"name": t.name, "data_type": data_type(t.data_type), "dims": t.dims});
            if !t.label_filename.is_empty() {
                v["label_filename"] = json!(t.label_filename);
            }
            v
        })
        .collect();
    let mut body = json!({
        "name": c.name,
        "platform": c.platform,
        "max_batch_size": c.max_batch_size,
        "input": inputs,
        "output": outputs,
    });
    if let Some(pb::model_config::SchedulingChoice::SequenceBatching(_)) = c.scheduling_choice {
        body["sequence_batching"] = json!({});
    }
    Ok(status_json(StatusCode::OK, body))
}
