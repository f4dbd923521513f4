//! Phase 6: the response as the client asked for it, whatever the transport: exactly the
//! outputs it listed, in its order, classified where the gateway classifies, with its id.
//! Encoding it (JSON, binary, protobuf) is the edge's job.

use super::plan::{apply_classifications, Classification};
use crate::error::GatewayError;
use crate::gateway::observe::Observation;
use crate::protocol::{InferRequest, InferResponse, Tensor};

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

/// The client's response, before its edge encodes it.
pub fn shape_response(
    req: &InferRequest,
    mut resp: InferResponse,
    backend: &str,
    classifications: &[Classification],
    obs: &mut Observation,
) -> Result<InferResponse, GatewayError> {
    resp.outputs = select_outputs(req, std::mem::take(&mut resp.outputs), backend)?;
    apply_classifications(classifications, &mut resp.outputs)?;
    obs.classified += classifications.len() as u64;
    resp.id = req.id.clone().filter(|id| !id.is_empty());
    Ok(resp)
}
