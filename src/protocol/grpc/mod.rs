//! The protobuf codec of the v2 gRPC API (`inference.GRPCInferenceService`, Triton's and
//! KServe's): messages to and from the encoding-neutral request, response and tensor.
//! Raw contents (`raw_input_contents`, `raw_output_contents`) are the tensor model's own
//! layout, so they pass as `Bytes` with no per-element work; typed `InferTensorContents` are
//! converted element by element, with each value checked against its datatype.

mod contents;
mod fanout;
mod head;
mod params;

use std::collections::HashSet;

use bytes::Bytes;

use super::datatype::DataType;
use super::error::{ProtocolError, Result, Role};
use super::limits::Limits;
use super::message::{InferRequest, InferResponse, RequestedOutput};
use super::params::{OutputOptions, RequestOptions};
use super::tensor::{
    check_bool_bytes, check_bytes_framing, checked_element_count, format_shape, Tensor,
};

pub use fanout::{
    check_contents, check_fanout, check_ranks, decoded_extra, INFER_REQUEST_FIELDS, MAX_REPEATED,
};
pub use head::MessageHead;
pub use params::{params_from_proto, params_to_proto, peek_sequence_id};

/// The messages of `proto/inference.proto`, generated at build time.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/messages/inference.rs"));
}

/// Decodes a serialized `ModelInferRequest` (what the fuzz target feeds).
pub fn decode_infer_request_bytes(buf: Bytes, limits: &Limits) -> Result<InferRequest> {
    use prost::Message;
    let msg = pb::ModelInferRequest::decode(buf)
        .map_err(|e| ProtocolError::invalid(format!("invalid ModelInferRequest: {e}")))?;
    decode_infer_request(msg, limits)
}

/// Decodes an inference request. Every input carries its data either typed in `contents`
/// or raw, one `raw_input_contents` entry per input in order; a request mixes neither.
pub fn decode_infer_request(msg: pb::ModelInferRequest, limits: &Limits) -> Result<InferRequest> {
    let raw = msg.raw_input_contents;
    if !raw.is_empty() && raw.len() != msg.inputs.len() {
        return Err(ProtocolError::invalid(format!(
            "raw_input_contents has {} entries for {} inputs; it needs one per input, in order (every input raw, or every input typed in contents, never a mix)",
            raw.len(),
            msg.inputs.len()
        )));
    }
    let parameters = params_from_proto(msg.parameters)?;
    let options = RequestOptions::from_parameters(&parameters)?;
    let mut raw = raw.into_iter();
    let mut inputs = Vec::with_capacity(msg.inputs.len());
    let mut seen = HashSet::with_capacity(msg.inputs.len());
    for input in msg.inputs {
        let name = input.name.clone();
        if !seen.insert(name.clone()) {
            return Err(ProtocolError::invalid(format!(
                "duplicate input name '{name}'"
            )));
        }
        let tensor =
            decode_input(input, raw.next(), limits).map_err(|e| e.in_tensor(Role::Input, &name))?;
        inputs.push(tensor);
    }
    let outputs = if msg.outputs.is_empty() {
        None
    } else {
        let mut list: Vec<RequestedOutput> = Vec::with_capacity(msg.outputs.len());
        let mut seen = HashSet::with_capacity(msg.outputs.len());
        for o in msg.outputs {
            if !seen.insert(o.name.clone()) {
                return Err(ProtocolError::invalid(format!(
                    "duplicate output name '{}'",
                    o.name
                )));
            }
            let parameters =
                params_from_proto(o.parameters).map_err(|e| e.in_tensor(Role::Output, &o.name))?;
            let options = OutputOptions::from_parameters(&parameters)
                .map_err(|e| e.in_tensor(Role::Output, &o.name))?;
            list.push(RequestedOutput {
                name: o.name,
                parameters,
                options,
            });
        }
        Some(list)
    };
    Ok(InferRequest {
        id: Some(msg.id).filter(|id| !id.is_empty()),
        parameters,
        options,
        inputs,
        outputs,
    })
}

fn decode_input(
    input: pb::model_infer_request::InferInputTensor,
    raw: Option<Bytes>,
    limits: &Limits,
) -> Result<Tensor> {
    let datatype = DataType::parse(&input.datatype)
        .ok_or_else(|| ProtocolError::invalid(format!("unknown datatype '{}'", input.datatype)))?;
    let shape = input
        .shape
        .iter()
        .map(|&d| {
            u64::try_from(d).map_err(|_| {
                ProtocolError::invalid(format!(
                    "shape {} has a negative dimension",
                    format_shape(&input.shape)
                ))
            })
        })
        .collect::<Result<Vec<u64>>>()?;
    let count = checked_element_count(&shape, limits.max_tensor_elements)?;
    let mut parameters = params_from_proto(input.parameters)?;
    parameters.refuse_shared_memory()?;
    // The REST binary extension's framing, which means nothing in a protobuf message (Triton
    // ignores it there): kept, it would reach a REST backend beside the encoder's own.
    parameters.remove("binary_data_size");
    let typed = input.contents.filter(|c| !contents::is_empty(c));
    let data = match (raw, typed) {
        (Some(_), Some(_)) => {
            return Err(ProtocolError::invalid(
                "has both typed contents and raw_input_contents",
            ))
        }
        (Some(raw), None) => {
            check_raw(&raw, datatype, &shape, count)?;
            raw
        }
        (None, Some(typed)) => contents::to_bytes(typed, datatype, &shape, count)?,
        (None, None) if count == 0 => Bytes::new(),
        (None, None) => {
            return Err(ProtocolError::invalid(
                "has neither contents nor an entry in raw_input_contents",
            ))
        }
    };
    Ok(Tensor {
        name: input.name,
        datatype,
        shape,
        parameters,
        data,
    })
}

/// Raw data must hold exactly the elements the shape describes.
fn check_raw(raw: &[u8], datatype: DataType, shape: &[u64], count: u64) -> Result<()> {
    match datatype.fixed_size() {
        Some(size) => {
            let need = count * size as u64;
            if raw.len() as u64 != need {
                return Err(ProtocolError::invalid(format!(
                    "raw_input_contents has {} bytes but shape {} of {datatype} needs {need}",
                    raw.len(),
                    format_shape(shape)
                )));
            }
            if datatype == DataType::Bool {
                check_bool_bytes(raw)?;
            }
            Ok(())
        }
        None => check_bytes_framing(raw, count),
    }
}

/// Encodes a response as Triton does: every output raw, in `raw_output_contents`.
pub fn encode_infer_response(resp: InferResponse) -> pb::ModelInferResponse {
    let mut raw = Vec::with_capacity(resp.outputs.len());
    let outputs = resp
        .outputs
        .into_iter()
        .map(|t| {
            raw.push(t.data);
            pb::model_infer_response::InferOutputTensor {
                name: t.name,
                datatype: t.datatype.as_str().to_string(),
                shape: t.shape.iter().map(|&d| d as i64).collect(),
                parameters: params_to_proto(&t.parameters),
                contents: None,
            }
        })
        .collect();
    pb::ModelInferResponse {
        model_name: resp.model_name,
        model_version: resp.model_version.unwrap_or_default(),
        id: resp.id.unwrap_or_default(),
        parameters: params_to_proto(&resp.parameters),
        outputs,
        raw_output_contents: raw,
    }
}

/// Encodes a request with raw contents, as tritonclient sends it (for clients and tests).
pub fn encode_infer_request(
    model: &str,
    version: &str,
    req: &InferRequest,
) -> pb::ModelInferRequest {
    pb::ModelInferRequest {
        model_name: model.to_string(),
        model_version: version.to_string(),
        id: req.id.clone().unwrap_or_default(),
        parameters: params_to_proto(&req.parameters),
        inputs: req
            .inputs
            .iter()
            .map(|t| pb::model_infer_request::InferInputTensor {
                name: t.name.clone(),
                datatype: t.datatype.as_str().to_string(),
                shape: t.shape.iter().map(|&d| d as i64).collect(),
                parameters: params_to_proto(&t.parameters),
                contents: None,
            })
            .collect(),
        outputs: req
            .outputs
            .iter()
            .flatten()
            .map(|o| pb::model_infer_request::InferRequestedOutputTensor {
                name: o.name.clone(),
                parameters: params_to_proto(&o.parameters),
            })
            .collect(),
        raw_input_contents: req.inputs.iter().map(|t| t.data.clone()).collect(),
    }
}

/// Decodes a response, raw or typed (for clients and tests; the gateway only encodes them).
pub fn decode_infer_response(
    msg: pb::ModelInferResponse,
    limits: &Limits,
) -> Result<InferResponse> {
    if !msg.raw_output_contents.is_empty() && msg.raw_output_contents.len() != msg.outputs.len() {
        return Err(ProtocolError::invalid(format!(
            "raw_output_contents has {} entries for {} outputs",
            msg.raw_output_contents.len(),
            msg.outputs.len()
        )));
    }
    let mut raw = msg.raw_output_contents.into_iter();
    let mut outputs = Vec::with_capacity(msg.outputs.len());
    for o in msg.outputs {
        let name = o.name.clone();
        let input = pb::model_infer_request::InferInputTensor {
            name: o.name,
            datatype: o.datatype,
            shape: o.shape,
            parameters: o.parameters,
            contents: o.contents,
        };
        let tensor = decode_input(input, raw.next(), limits)
            .map_err(|e| e.in_tensor(Role::Output, &name))?;
        outputs.push(tensor);
    }
    Ok(InferResponse {
        id: Some(msg.id).filter(|id| !id.is_empty()),
        model_name: msg.model_name,
        model_version: Some(msg.model_version).filter(|v| !v.is_empty()),
        parameters: params_from_proto(msg.parameters)?,
        outputs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::infer_parameter::ParameterChoice;

    /// Shared memory is refused by name on inputs and requested outputs, as over REST.
    #[test]
    fn shared_memory_is_refused() {
        let region: std::collections::HashMap<String, pb::InferParameter> = [(
            "shared_memory_region".to_string(),
            pb::InferParameter {
                parameter_choice: Some(ParameterChoice::StringParam("r".into())),
            },
        )]
        .into();
        let input = pb::model_infer_request::InferInputTensor {
            name: "X".into(),
            datatype: "INT8".into(),
            shape: vec![1],
            parameters: region.clone(),
            ..Default::default()
        };
        let output = pb::model_infer_request::InferRequestedOutputTensor {
            name: "O".into(),
            parameters: region,
        };
        let with_input = pb::ModelInferRequest {
            inputs: vec![input],
            ..Default::default()
        };
        let with_output = pb::ModelInferRequest {
            outputs: vec![output],
            ..Default::default()
        };
        let why = "parameter 'shared_memory_region': shared memory is not supported (the gateway forwards tensors over the network); send the tensor's data in the request, and take outputs in the response";
        for (msg, tensor) in [(with_input, "input 'X'"), (with_output, "output 'O'")] {
            let e = decode_infer_request(msg, &Limits::default()).unwrap_err();
            assert_eq!(e.to_string(), format!("{tensor}: {why}"));
        }
    }

    /// `binary_data_size` on a gRPC input is dropped, as Triton ignores it: re-encoded for a
    /// REST backend, the input would carry it twice (a worker refused the duplicate key, and
    /// the client was blamed for JSON it never sent; tests/grpc_front.rs sends one through a
    /// worker). Other parameters stay.
    #[test]
    fn binary_data_size_is_not_an_inputs_parameter_over_grpc() {
        let param = |c| pb::InferParameter {
            parameter_choice: Some(c),
        };
        let input = pb::model_infer_request::InferInputTensor {
            name: "X".into(),
            datatype: "FP32".into(),
            shape: vec![1, 1],
            parameters: [
                (
                    "binary_data_size".to_string(),
                    param(ParameterChoice::Int64Param(4)),
                ),
                (
                    "custom".to_string(),
                    param(ParameterChoice::StringParam("kept".into())),
                ),
            ]
            .into(),
            ..Default::default()
        };
        let msg = pb::ModelInferRequest {
            inputs: vec![input],
            raw_input_contents: vec![1.5f32.to_le_bytes().to_vec().into()],
            ..Default::default()
        };
        let req = decode_infer_request(msg, &Limits::default()).unwrap();
        let names: Vec<&str> = req.inputs[0].parameters.iter().map(|(k, _)| k).collect();
        assert_eq!(names, ["custom"]);
    }
}
