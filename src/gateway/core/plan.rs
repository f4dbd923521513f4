//! Phase 4: the plan for one backend. Which requested classifications the gateway applies
//! itself (and applying them, in the shape phase), and the request as the backend should
//! see it.

use std::sync::Arc;

use crate::config::ClassificationMode;
use crate::error::GatewayError;
use crate::fleet::{BackendHandle, Capabilities};
use crate::gateway::labels::Labels;
use crate::protocol::classify::{classify, supported, unsupported};
use crate::protocol::{DataType, InferRequest, ModelMetadata, ParamValue, RequestOptions, Tensor};

/// One output the gateway classifies.
pub struct Classification {
    pub output: String,
    pub k: u64,
    /// Whether the output's first dimension is a batch dimension (results [batch, k]): the
    /// model's shape starts with -1. `None` when the model's metadata does not describe the
    /// output (MLServer models without a signature): decided by the output's rank.
    pub batched: Option<bool>,
    pub labels: Option<Arc<Vec<String>>>,
}

/// Who applies a classification, for one output on one backend.
fn gateway_applies(
    mode: ClassificationMode,
    in_process: bool,
    caps: Capabilities,
    labels_configured: bool,
    datatype: Option<DataType>,
) -> bool {
    if in_process {
        return true;
    }
    match mode {
        ClassificationMode::Gateway => true,
        ClassificationMode::Backend => false,
        // A backend that lists the extension classifies, except that:
        // - labels configured here win: it would use its own labels, or none, and the user
        //   asked for these;
        // - Triton rejects FP16 and BF16 outputs, which we promise to classify, so those are
        //   classified here, unless the backend is a tensorgate server, which classifies
        //   them with the labels it holds. (An output the metadata does not describe has no
        //   known type; it goes to the backend.)
        ClassificationMode::Auto => {
            !caps.classification
                || labels_configured
                || (matches!(datatype, Some(DataType::Fp16 | DataType::Bf16))
                    && !caps.half_classification)
        }
    }
}

/// Whether an output is [batch, classes]: per an in-process model's `max_batch_size`, else
/// per its metadata when the model describes it (a leading -1, as Triton's
/// `max_batch_size > 0` shows in v2 metadata), and otherwise when
/// the output itself has rank 2 or more, which is how batched models' outputs look.
fn is_batched(batched: Option<bool>, t: &Tensor) -> bool {
    batched.unwrap_or(t.shape.len() >= 2)
}

/// Checks every requested classification against the model's output types, and returns the
/// ones the gateway must apply for `backend`. `classification: 0` means none, as in Triton.
pub fn classifications(
    req: &InferRequest,
    model: &ModelMetadata,
    batches: Option<bool>,
    backend: &BackendHandle,
    labels: &Labels,
) -> Result<Vec<Classification>, GatewayError> {
    let mut out = Vec::new();
    let in_process = backend.backend.in_process();
    for o in req.outputs.iter().flatten() {
        let Some(k) = o.options.classification.filter(|k| *k > 0) else {
            continue;
        };
        let meta = model.output(&o.name);
        let datatype = meta.and_then(|m| DataType::parse(&m.datatype));
        if let Some(dt) = datatype {
            if !supported(dt) {
                return Err(unsupported(&o.name, dt).into());
            }
        }
        if gateway_applies(
            backend.classification,
            in_process,
            backend.capabilities(),
            labels.is_configured(&model.name, &o.name),
            datatype,
        ) {
            out.push(Classification {
                output: o.name.clone(),
                k,
                batched: batches.or_else(|| meta.map(|m| m.shape.len() >= 2 && m.shape[0] == -1)),
                labels: labels.get(&model.name, &o.name).or_else(|| {
                    in_process
                        .then(|| backend.backend.labels(&model.name, &o.name))
                        .flatten()
                }),
            });
        }
    }
    Ok(out)
}

/// Replaces each classified output by its classes.
pub fn apply_classifications(
    plan: &[Classification],
    outputs: &mut [Tensor],
) -> Result<(), GatewayError> {
    for c in plan {
        if let Some(t) = outputs.iter_mut().find(|t| t.name == c.output) {
            let batched = is_batched(c.batched, t);
            *t = classify(t, c.k, batched, c.labels.as_deref().map(Vec::as_slice))?;
        }
    }
    Ok(())
}

/// The request as a backend should see it: outputs in binary when it supports that (the
/// cheapest to transcode), otherwise without any binary parameters at all.
/// Outputs the gateway classifies are asked for raw.
pub fn adapt_request(
    req: &InferRequest,
    caps: Capabilities,
    classifications: &[Classification],
) -> InferRequest {
    let mut r = req.clone();
    let classified: std::collections::HashSet<&str> =
        classifications.iter().map(|c| c.output.as_str()).collect();
    r.parameters.remove("binary_data_output");
    // The client's stream asked it of the gateway, which answers it (gRPC's edge).
    r.parameters
        .remove(crate::protocol::params::ENABLE_EMPTY_FINAL_RESPONSE);
    match &mut r.outputs {
        Some(outputs) => {
            for o in outputs.iter_mut() {
                o.parameters.remove("binary_data");
                if caps.binary {
                    o.parameters.set("binary_data", ParamValue::Bool(true));
                }
                o.options.binary_data = caps.binary.then_some(true);
                if classified.contains(o.name.as_str()) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Parameters;
    use bytes::Bytes;

    fn caps(classification: bool, half_classification: bool) -> Capabilities {
        Capabilities {
            classification,
            half_classification,
            ..Capabilities::default()
        }
    }

    #[test]
    fn auto_mode_classifies_half_precision_where_the_backend_cannot() {
        use ClassificationMode::*;
        let applies = |mode, classifies, labels, dt| {
            gateway_applies(mode, false, caps(classifies, false), labels, dt)
        };
        for dt in [DataType::Fp16, DataType::Bf16] {
            assert!(applies(Auto, true, false, Some(dt)), "{dt}");
            assert!(applies(Gateway, true, false, Some(dt)), "{dt}");
            assert!(
                !applies(Backend, true, false, Some(dt)),
                "{dt}: backend mode is the user's call"
            );
            // A tensorgate backend classifies them, with the labels it holds.
            assert!(
                !gateway_applies(Auto, false, caps(true, true), false, Some(dt)),
                "{dt}"
            );
        }
        for dt in [
            DataType::Fp32,
            DataType::Fp64,
            DataType::Int8,
            DataType::Uint64,
        ] {
            assert!(!applies(Auto, true, false, Some(dt)), "{dt}");
            assert!(applies(Auto, false, false, Some(dt)), "{dt}");
            assert!(
                applies(Auto, true, true, Some(dt)),
                "{dt}: configured labels"
            );
        }
        assert!(
            !applies(Auto, true, false, None),
            "unknown type: the backend knows it"
        );
        assert!(
            gateway_applies(
                Backend,
                true,
                caps(true, false),
                false,
                Some(DataType::Fp32)
            ),
            "in process"
        );
    }

    fn tensor(shape: Vec<u64>, values: &[f32]) -> Tensor {
        Tensor {
            name: "OUT".into(),
            datatype: DataType::Fp32,
            shape,
            parameters: Parameters::new(),
            data: Bytes::from(
                values
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<u8>>(),
            ),
        }
    }

    fn strings(t: &Tensor) -> Vec<String> {
        t.bytes_elements()
            .map(|e| String::from_utf8(e.to_vec()).unwrap())
            .collect()
    }

    fn plan_for(batched: Option<bool>) -> Vec<Classification> {
        vec![Classification {
            output: "OUT".into(),
            k: 1,
            batched,
            labels: None,
        }]
    }

    #[test]
    fn without_metadata_rank_two_or_more_is_batched() {
        let values: Vec<f32> = (0..36).map(|i| ((i * 7) % 12) as f32).collect();
        // [3,12] with no metadata: three rows, each with its own best class.
        let mut outputs = vec![tensor(vec![3, 12], &values)];
        apply_classifications(&plan_for(None), &mut outputs).unwrap();
        assert_eq!(outputs[0].shape, vec![3, 1]);
        assert_eq!(
            strings(&outputs[0]),
            ["11.000000:5", "11.000000:5", "11.000000:5"]
        );
        // Rank 1: one row.
        let mut outputs = vec![tensor(vec![36], &values)];
        apply_classifications(&plan_for(None), &mut outputs).unwrap();
        assert_eq!(outputs[0].shape, vec![1]);
        assert_eq!(strings(&outputs[0]), ["11.000000:5"]);
        // Metadata that says there is no batch dimension ([3,12]) is followed.
        let mut outputs = vec![tensor(vec![3, 12], &values)];
        apply_classifications(&plan_for(Some(false)), &mut outputs).unwrap();
        assert_eq!(outputs[0].shape, vec![1]);
        assert_eq!(strings(&outputs[0]), ["11.000000:5"]);
    }

    #[test]
    fn an_inconsistent_model_output_is_an_internal_error() {
        let mut t = tensor(vec![2, 3], &[1.0; 6]);
        t.data = t.data.slice(..20);
        let e = apply_classifications(&plan_for(Some(true)), &mut [t]).unwrap_err();
        assert_eq!(
            e.message(),
            "output 'OUT': inconsistent tensor: shape [2,3] of FP32 needs 24 bytes, data has 20"
        );
        assert_eq!(e.status(), http::StatusCode::INTERNAL_SERVER_ERROR);
    }
}
