//! Phase 6: the response as the client asked for it, whatever the transport: exactly the
//! outputs it listed, in its order, classified where the gateway classifies, with its id.
//! Encoding it (JSON, binary, protobuf) is the edge's job.

use super::plan::{apply_classifications, Classification};
use crate::error::GatewayError;
use crate::gateway::observe::Observation;
use crate::protocol::{InferRequest, InferResponse, ModelMetadata, Tensor};

/// Keeps the outputs the client asked for, in its order; all of them when it listed none.
/// An answer with no output at all, for a model that declares some, is the backend's fault:
/// a 200 with nothing in it would tell the client its request had worked.
fn select_outputs(
    req: &InferRequest,
    outputs: Vec<Tensor>,
    (backend, metadata): (&str, &ModelMetadata),
) -> Result<Vec<Tensor>, GatewayError> {
    let Some(wanted) = &req.outputs else {
        if outputs.is_empty() && !metadata.outputs.is_empty() {
            let declared: Vec<String> = metadata
                .outputs
                .iter()
                .map(|o| format!("'{}'", o.name))
                .collect();
            return Err(GatewayError::BadGateway(format!(
                "backend '{backend}' returned no outputs; model '{}' declares {}",
                metadata.name,
                declared.join(", ")
            )));
        }
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
    backend: (&str, &ModelMetadata),
    classifications: &[Classification],
    obs: &mut Observation,
) -> Result<InferResponse, GatewayError> {
    resp.outputs = select_outputs(req, std::mem::take(&mut resp.outputs), backend)?;
    apply_classifications(classifications, &mut resp.outputs)?;
    obs.classified += classifications.len() as u64;
    resp.id = req.id.clone().filter(|id| !id.is_empty());
    Ok(resp)
}
