//! Raw binary requests (`Inference-Header-Content-Length: 0`): the body is the data of the
//! model's only input, and the shape is deduced from the model's metadata and the byte size.

use bytes::Bytes;

use crate::protocol::datatype::DataType;
use crate::protocol::error::{ProtocolError, Result};
use crate::protocol::limits::Limits;
use crate::protocol::message::InferRequest;
use crate::protocol::metadata::ModelMetadata;
use crate::protocol::params::{ParamValue, Parameters, RequestOptions};
use crate::protocol::tensor::{checked_element_count, format_shape, Tensor};

/// Builds the request a raw body stands for. A leading -1 in a model shape of rank two or
/// more is the batch dimension (v2 metadata has no `max_batch_size`); a raw request is a
/// batch of one. All outputs are returned in binary form.
pub fn expand_raw(body: Bytes, model: &ModelMetadata, limits: &Limits) -> Result<InferRequest> {
    let [input] = model.inputs.as_slice() else {
        return Err(ProtocolError::invalid(format!(
            "a raw binary request (Inference-Header-Content-Length: 0) needs a model with exactly one input; model '{}' has {}",
            model.name,
            model.inputs.len()
        )));
    };
    let err = |m: String| {
        ProtocolError::invalid(format!(
            "raw binary request for input '{}': {m}",
            input.name
        ))
    };
    let datatype = DataType::parse(&input.datatype).ok_or_else(|| {
        err(format!(
            "the model declares unknown datatype '{}'",
            input.datatype
        ))
    })?;
    let batched = input.shape.len() >= 2 && input.shape[0] == -1;
    let dims = if batched {
        &input.shape[1..]
    } else {
        &input.shape[..]
    };
    let model_shape = format_shape(&input.shape);

    let (mut shape, data): (Vec<u64>, Bytes) = match datatype.fixed_size() {
        None => {
            // The extension allows BYTES only with shape [1] (after the batch dimension),
            // and so does Triton ("the model must have input shape [1]"): a variable
            // dimension would have to be read as one element, which is a guess.
            if dims != [1] {
                return Err(err(format!(
                    "BYTES needs the model shape [1] (or [-1,1] with a batch dimension), not {model_shape}"
                )));
            }
            let len = u32::try_from(body.len())
                .map_err(|_| err("the body is larger than a BYTES element can hold".into()))?;
            let mut framed = Vec::with_capacity(body.len() + 4);
            framed.extend_from_slice(&len.to_le_bytes());
            framed.extend_from_slice(&body);
            (vec![1], Bytes::from(framed))
        }
        Some(size) => {
            if dims.iter().filter(|d| **d < 0).count() > 1 {
                return Err(err(format!(
                    "the model shape {model_shape} has more than one variable dimension"
                )));
            }
            let fixed: u64 = dims
                .iter()
                .filter(|d| **d >= 0)
                .try_fold(size as u64, |acc, d| acc.checked_mul(*d as u64))
                .ok_or_else(|| err(format!("the model shape {model_shape} overflows")))?;
            let len = body.len() as u64;
            let has_variable = dims.iter().any(|d| *d < 0);
            if !has_variable && len != fixed {
                return Err(err(format!(
                    "a body of {len} bytes does not match shape {model_shape} of {datatype}, which needs {fixed} bytes"
                )));
            }
            // With a variable dimension, the body must be a whole number of fixed-size rows.
            if has_variable && (fixed == 0 || !len.is_multiple_of(fixed)) {
                return Err(err(format!(
                    "a body of {len} bytes is not a whole number of {datatype} elements of shape {model_shape}"
                )));
            }
            let variable = if has_variable { len / fixed } else { 0 };
            let shape = dims
                .iter()
                .map(|d| if *d < 0 { variable } else { *d as u64 })
                .collect();
            (shape, body)
        }
    };
    if batched {
        shape.insert(0, 1);
    }
    checked_element_count(&shape, limits.max_tensor_elements)
        .map_err(|e| e.in_tensor(crate::protocol::error::Role::Input, &input.name))?;
    if datatype == DataType::Bool {
        super::decode::check_binary(datatype, &shape, shape.iter().product(), &data)
            .map_err(|e| err(e.message().to_string()))?;
    }
    let mut parameters = Parameters::new();
    parameters.set("binary_data_output", ParamValue::Bool(true));
    Ok(InferRequest {
        id: None,
        options: RequestOptions::from_parameters(&parameters)?,
        parameters,
        inputs: vec![Tensor {
            name: input.name.clone(),
            datatype,
            shape,
            parameters: Parameters::new(),
            data,
        }],
        outputs: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::metadata::TensorMetadata;

    fn model(inputs: &[(&str, &str, &[i64])]) -> ModelMetadata {
        ModelMetadata {
            name: "m".into(),
            versions: vec![],
            platform: String::new(),
            inputs: inputs
                .iter()
                .map(|(n, d, s)| TensorMetadata {
                    name: n.to_string(),
                    datatype: d.to_string(),
                    shape: s.to_vec(),
                })
                .collect(),
            outputs: vec![],
        }
    }

    fn expand(body: &[u8], m: &ModelMetadata) -> Result<InferRequest> {
        expand_raw(Bytes::copy_from_slice(body), m, &Limits::default())
    }

    #[test]
    fn batch_dimension_becomes_one_and_variable_is_computed() {
        let r = expand(&[0u8; 64], &model(&[("X", "INT32", &[-1, 16])])).unwrap();
        assert_eq!(r.inputs[0].shape, vec![1, 16]);
        assert!(r.options.binary_data_output);
        let r = expand(&[0u8; 24], &model(&[("X", "FP32", &[2, -1])])).unwrap();
        assert_eq!(r.inputs[0].shape, vec![2, 3]);
        let r = expand(&[0u8; 12], &model(&[("X", "FP32", &[-1])])).unwrap();
        assert_eq!(r.inputs[0].shape, vec![3]);
    }

    #[test]
    fn bytes_becomes_one_framed_element() {
        let r = expand(b"hello", &model(&[("S", "BYTES", &[1])])).unwrap();
        assert_eq!(r.inputs[0].shape, vec![1]);
        assert_eq!(&r.inputs[0].data[..], b"\x05\x00\x00\x00hello");
        let r = expand(b"hi", &model(&[("S", "BYTES", &[-1, 1])])).unwrap();
        assert_eq!(r.inputs[0].shape, vec![1, 1]);
        assert_eq!(&r.inputs[0].data[..], b"\x02\x00\x00\x00hi");
        for shape in [&[2][..], &[-1], &[-1, -1], &[1, 1], &[-1, 2], &[]] {
            let e = expand(b"hello", &model(&[("S", "BYTES", shape)])).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!(
                    "raw binary request for input 'S': BYTES needs the model shape [1] (or [-1,1] with a batch dimension), not {}",
                    format_shape(shape)
                )
            );
        }
    }

    #[test]
    fn errors() {
        let e = expand(
            &[0; 4],
            &model(&[("A", "INT32", &[1]), ("B", "INT32", &[1])]),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "a raw binary request (Inference-Header-Content-Length: 0) needs a model with exactly one input; model 'm' has 2"
        );
        let e = expand(&[0; 4], &model(&[("X", "INT32", &[-1, -1, -1])])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "raw binary request for input 'X': the model shape [-1,-1,-1] has more than one variable dimension"
        );
        let e = expand(&[0; 10], &model(&[("X", "INT32", &[-1, 16])])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "raw binary request for input 'X': a body of 10 bytes does not match shape [-1,16] of INT32, which needs 64 bytes"
        );
        let e = expand(&[0; 10], &model(&[("X", "INT32", &[2, -1])])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "raw binary request for input 'X': a body of 10 bytes is not a whole number of INT32 elements of shape [2,-1]"
        );
        let e = expand(&[0; 8], &model(&[("X", "INT32", &[4])])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "raw binary request for input 'X': a body of 8 bytes does not match shape [4] of INT32, which needs 16 bytes"
        );
        let e = expand(&[2], &model(&[("X", "BOOL", &[1])])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "raw binary request for input 'X': BOOL element 0 is the byte 2; it must be 0 or 1"
        );
    }
}
