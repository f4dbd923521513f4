//! Encoding requests (for backends) and responses (for clients), output by output in JSON or
//! binary. Binary tensor data is never copied: the body is a list of `Bytes` parts, the JSON
//! header followed by the tensors' own buffers.

use bytes::Bytes;
use serde::Serialize;

use super::json_write::write_data;
use crate::protocol::error::{ProtocolError, Result, Role};
use crate::protocol::message::{InferRequest, InferResponse};
use crate::protocol::params::Parameters;
use crate::protocol::tensor::Tensor;

pub const CONTENT_TYPE_JSON: &str = "application/json";
pub const CONTENT_TYPE_BINARY: &str = "application/octet-stream";

/// An encoded body: the JSON header, then the binary chunks in tensor order.
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedBody {
    pub parts: Vec<Bytes>,
    pub json_len: usize,
}

impl EncodedBody {
    pub fn has_binary(&self) -> bool {
        self.parts.len() > 1
    }

    /// The `Inference-Header-Content-Length` to send: only when binary data follows the JSON.
    pub fn header_length(&self) -> Option<usize> {
        self.has_binary().then_some(self.json_len)
    }

    pub fn content_type(&self) -> &'static str {
        if self.has_binary() {
            CONTENT_TYPE_BINARY
        } else {
            CONTENT_TYPE_JSON
        }
    }

    pub fn len(&self) -> usize {
        self.parts.iter().map(Bytes::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole body in one buffer. Copies; meant for small bodies and tests.
    pub fn to_bytes(&self) -> Bytes {
        if self.parts.len() == 1 {
            return self.parts[0].clone();
        }
        let mut v = Vec::with_capacity(self.len());
        for p in &self.parts {
            v.extend_from_slice(p);
        }
        Bytes::from(v)
    }
}

fn put_json<T: Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) {
    serde_json::to_writer(&mut *out, v).expect("serializing to a Vec cannot fail");
}

fn put_parameters(out: &mut Vec<u8>, p: &Parameters, binary_size: Option<usize>) {
    out.extend_from_slice(b"{");
    let mut first = true;
    for (k, v) in p.iter() {
        if !first {
            out.push(b',');
        }
        first = false;
        put_json(out, k);
        out.push(b':');
        put_json(out, v);
    }
    if let Some(n) = binary_size {
        if !first {
            out.push(b',');
        }
        out.extend_from_slice(b"\"binary_data_size\":");
        out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    }
    out.push(b'}');
}

/// Writes one tensor object. Binary tensors push their buffer onto `chunks`; zero-byte
/// tensors add no chunk.
fn put_tensor(
    out: &mut Vec<u8>,
    chunks: &mut Vec<Bytes>,
    t: &Tensor,
    binary: bool,
    role: Role,
) -> Result<()> {
    out.extend_from_slice(b"{\"name\":");
    put_json(out, &t.name);
    out.extend_from_slice(b",\"datatype\":\"");
    out.extend_from_slice(t.datatype.as_str().as_bytes());
    out.extend_from_slice(b"\",\"shape\":[");
    let mut ibuf = itoa::Buffer::new();
    for (i, d) in t.shape.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(ibuf.format(*d).as_bytes());
    }
    out.push(b']');
    if binary {
        out.extend_from_slice(b",\"parameters\":");
        put_parameters(out, &t.parameters, Some(t.data.len()));
        if !t.data.is_empty() {
            chunks.push(t.data.clone());
        }
    } else {
        if !t.parameters.is_empty() {
            out.extend_from_slice(b",\"parameters\":");
            put_parameters(out, &t.parameters, None);
        }
        out.extend_from_slice(b",\"data\":");
        write_data(out, t.datatype, &t.data).map_err(|e| {
            let e = e.in_tensor(role, &t.name);
            match role {
                Role::Output => e.with_hint("request this output with \"binary_data\": true"),
                Role::Input => e,
            }
        })?;
    }
    out.push(b'}');
    Ok(())
}

fn finish(json: Vec<u8>, chunks: Vec<Bytes>) -> EncodedBody {
    let json_len = json.len();
    let mut parts = Vec::with_capacity(chunks.len() + 1);
    parts.push(Bytes::from(json));
    parts.extend(chunks);
    EncodedBody { parts, json_len }
}

/// Encodes a response; `binary[i]` says whether output `i` goes in binary form.
pub fn encode_response(resp: &InferResponse, binary: &[bool]) -> Result<EncodedBody> {
    if binary.len() != resp.outputs.len() {
        return Err(ProtocolError::invalid(format!(
            "the response has {} outputs but {} output encodings were given",
            resp.outputs.len(),
            binary.len()
        )));
    }
    let json_guess: usize = resp
        .outputs
        .iter()
        .zip(binary)
        .map(|(t, b)| if *b { 96 } else { 96 + t.data.len() * 3 })
        .sum();
    let mut out = Vec::with_capacity(128 + json_guess);
    let mut chunks = Vec::new();
    out.extend_from_slice(b"{\"model_name\":");
    put_json(&mut out, &resp.model_name);
    if let Some(v) = &resp.model_version {
        out.extend_from_slice(b",\"model_version\":");
        put_json(&mut out, v);
    }
    if let Some(id) = resp.id.as_deref().filter(|id| !id.is_empty()) {
        out.extend_from_slice(b",\"id\":");
        put_json(&mut out, id);
    }
    if !resp.parameters.is_empty() {
        out.extend_from_slice(b",\"parameters\":");
        put_parameters(&mut out, &resp.parameters, None);
    }
    out.extend_from_slice(b",\"outputs\":[");
    for (i, (t, b)) in resp.outputs.iter().zip(binary).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // The only encoding error, BYTES that are not UTF-8, already says to ask for binary.
        put_tensor(&mut out, &mut chunks, t, *b, Role::Output)?;
    }
    out.extend_from_slice(b"]}");
    Ok(finish(out, chunks))
}

/// Encodes a request for a backend, with every input in binary form or every input in JSON.
pub fn encode_request(req: &InferRequest, binary_inputs: bool) -> Result<EncodedBody> {
    let mut out = Vec::with_capacity(256);
    let mut chunks = Vec::new();
    out.push(b'{');
    if let Some(id) = &req.id {
        out.extend_from_slice(b"\"id\":");
        put_json(&mut out, id);
        out.push(b',');
    }
    if !req.parameters.is_empty() {
        out.extend_from_slice(b"\"parameters\":");
        put_parameters(&mut out, &req.parameters, None);
        out.push(b',');
    }
    out.extend_from_slice(b"\"inputs\":[");
    for (i, t) in req.inputs.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        put_tensor(&mut out, &mut chunks, t, binary_inputs, Role::Input)?;
    }
    out.push(b']');
    if let Some(outputs) = &req.outputs {
        out.extend_from_slice(b",\"outputs\":[");
        for (i, o) in outputs.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"name\":");
            put_json(&mut out, &o.name);
            if !o.parameters.is_empty() {
                out.extend_from_slice(b",\"parameters\":");
                put_parameters(&mut out, &o.parameters, None);
            }
            out.push(b'}');
        }
        out.push(b']');
    }
    out.push(b'}');
    Ok(finish(out, chunks))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::datatype::DataType;
    use crate::protocol::tensor::frame_bytes;

    fn tensor(dt: DataType, shape: Vec<u64>, data: Bytes) -> Tensor {
        Tensor {
            name: "OUT".into(),
            datatype: dt,
            shape,
            parameters: Parameters::new(),
            data,
        }
    }

    fn response(outputs: Vec<Tensor>) -> InferResponse {
        InferResponse {
            id: None,
            model_name: "m".into(),
            model_version: None,
            parameters: Parameters::new(),
            outputs,
        }
    }

    #[test]
    fn encodings_must_match_the_outputs() {
        let t = tensor(DataType::Int8, vec![1], Bytes::from_static(&[7]));
        let resp = response(vec![t.clone(), t]);
        assert_eq!(
            encode_response(&resp, &[true]).unwrap_err().to_string(),
            "the response has 2 outputs but 1 output encodings were given"
        );
        assert_eq!(
            encode_response(&resp, &[true, false, true])
                .unwrap_err()
                .to_string(),
            "the response has 2 outputs but 3 output encodings were given"
        );
    }

    #[test]
    fn consistent_tensors_encode() {
        let resp = response(vec![
            tensor(DataType::Bytes, vec![2], frame_bytes([&b"a"[..], b"bc"])),
            tensor(DataType::Fp32, vec![0, 3], Bytes::new()),
        ]);
        let enc = encode_response(&resp, &[false, true]).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&enc.to_bytes()).unwrap();
        assert_eq!(v["outputs"][0]["data"], serde_json::json!(["a", "bc"]));
        assert_eq!(v["outputs"][1]["parameters"]["binary_data_size"], 0);
    }
}
