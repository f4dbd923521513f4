//! Deciding which requested classifications the gateway applies itself, and applying them.

use std::sync::Arc;

use crate::config::ClassificationMode;
use crate::error::GatewayError;
use crate::fleet::BackendHandle;
use crate::protocol::classify::{classify, supported, unsupported};
use crate::protocol::{DataType, InferRequest, ModelMetadata, Tensor};

use super::labels::Labels;

/// One output the gateway classifies.
pub struct Classification {
    pub output: String,
    pub k: u64,
    /// The model's output shape starts with -1: results are [batch, k].
    pub batched: bool,
    pub labels: Option<Arc<Vec<String>>>,
}

/// Checks every requested classification against the model's output types, and returns the
/// ones the gateway must apply for `backend`. `classification: 0` means none, as in Triton.
pub fn plan(
    req: &InferRequest,
    model: &ModelMetadata,
    backend: &BackendHandle,
    labels: &Labels,
) -> Result<Vec<Classification>, GatewayError> {
    let mut out = Vec::new();
    let in_process = backend.backend.in_process();
    // In auto mode, labels configured here win: a backend that classifies would use its
    // own labels, or none, and the user asked for these.
    let gateway_applies = |output: &str| {
        in_process
            || match backend.classification {
                ClassificationMode::Gateway => true,
                ClassificationMode::Backend => false,
                ClassificationMode::Auto => {
                    !backend.capabilities().classification
                        || labels.is_configured(&model.name, output)
                }
            }
    };
    for o in req.outputs.iter().flatten() {
        let Some(k) = o.options.classification.filter(|k| *k > 0) else {
            continue;
        };
        let meta = model.output(&o.name);
        if let Some(dt) = meta.and_then(|m| DataType::parse(&m.datatype)) {
            if !supported(dt) {
                return Err(unsupported(&o.name, dt).into());
            }
        }
        if gateway_applies(&o.name) {
            out.push(Classification {
                output: o.name.clone(),
                k,
                batched: meta.is_some_and(|m| m.shape.len() >= 2 && m.shape[0] == -1),
                labels: labels.get(&model.name, &o.name, in_process),
            });
        }
    }
    Ok(out)
}

/// Replaces each classified output by its classes.
pub fn apply(plan: &[Classification], outputs: &mut [Tensor]) -> Result<(), GatewayError> {
    for c in plan {
        if let Some(t) = outputs.iter_mut().find(|t| t.name == c.output) {
            *t = classify(t, c.k, c.batched, c.labels.as_deref().map(Vec::as_slice))?;
        }
    }
    Ok(())
}
