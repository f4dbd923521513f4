//! Shaping requests for a backend and responses for the client: each backend gets what it
//! handles best, each client gets exactly what it asked for, output by output.

use http::Response;

use super::classification::{self, Classification};
use super::observe::Observation;
use crate::body::{encoded_response, Body};
use crate::error::GatewayError;
use crate::fleet::Capabilities;
use crate::protocol::{
    encode_response, InferRequest, InferResponse, ParamValue, RequestOptions, Tensor,
};

/// The request as a backend should see it: outputs in binary when it supports that (the
/// cheapest to transcode), otherwise without any binary parameters at all.
/// Outputs the gateway classifies are asked for raw.
pub fn adapt_request(
    req: &InferRequest,
    caps: Capabilities,
    classifications: &[Classification],
) -> InferRequest {
    let mut r = req.clone();
    r.parameters.remove("binary_data_output");
    match &mut r.outputs {
        Some(outputs) => {
            for o in outputs.iter_mut() {
                o.parameters.remove("binary_data");
                if caps.binary {
                    o.parameters.set("binary_data", ParamValue::Bool(true));
                }
                o.options.binary_data = caps.binary.then_some(true);
                if classifications.iter().any(|c| c.output == o.name) {
                    o.parameters.remove("classification");
                    o.options.classification = None;
                }
            }
        }
        None => {
            if caps.binary {
                r.parameters
                    .set("binary_data_output", ParamValue::Bool(true));
            }
        }
    }
    r.options =
        RequestOptions::from_parameters(&r.parameters).unwrap_or_else(|_| req.options.clone());
    r
}

/// Keeps the outputs the client asked for, in its order; all of them when it listed none.
fn select_outputs(
    req: &InferRequest,
    outputs: Vec<Tensor>,
    backend: &str,
) -> Result<Vec<Tensor>, GatewayError> {
    let Some(wanted) = &req.outputs else {
        return Ok(outputs);
    };
    let mut outputs: Vec<Option<Tensor>> = outputs.into_iter().map(Some).collect();
    wanted
        .iter()
        .map(|w| {
            outputs
                .iter_mut()
                .find(|o| o.as_ref().is_some_and(|o| o.name == w.name))
                .and_then(Option::take)
                .ok_or_else(|| {
                    GatewayError::BadGateway(format!(
                        "backend '{backend}' did not return the requested output '{}'",
                        w.name
                    ))
                })
        })
        .collect()
}

/// The client's response: its outputs, its id, and each output in the encoding it asked for.
pub fn client_response(
    req: &InferRequest,
    mut resp: InferResponse,
    backend: &str,
    classifications: &[Classification],
    from_binary: bool,
    obs: &mut Observation,
) -> Result<Response<Body>, GatewayError> {
    resp.outputs = select_outputs(req, std::mem::take(&mut resp.outputs), backend)?;
    classification::apply(classifications, &mut resp.outputs)?;
    obs.classified += classifications.len() as u64;
    // `from_binary`: the backend's outputs were binary; decides what counts as transcoded.
    for o in &resp.outputs {
        match (from_binary, req.wants_binary(&o.name)) {
            (true, false) => obs.binary_to_json += o.data.len() as u64,
            (false, true) => obs.json_to_binary += o.data.len() as u64,
            _ => {}
        }
    }
    resp.id = req.id.clone().filter(|id| !id.is_empty());
    let binary: Vec<bool> = resp
        .outputs
        .iter()
        .map(|o| req.wants_binary(&o.name))
        .collect();
    let encoded = encode_response(&resp, &binary)?;
    Ok(encoded_response(encoded))
}
