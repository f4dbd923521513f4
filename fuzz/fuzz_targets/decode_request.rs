//! Request bodies with an optional Inference-Header-Content-Length: decoding must never
//! panic; whatever decodes must validate, expand (raw) and re-encode without panicking.
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use tensorgate::protocol::rest::decode::{decode_request, RequestBody};
use tensorgate::protocol::rest::encode::{encode_request, encode_response};
use tensorgate::protocol::rest::raw::expand_raw;
use tensorgate::protocol::{
    validate_request, InferResponse, Limits, ModelMetadata, TensorMetadata,
};

fn model() -> ModelMetadata {
    let t = |n: &str, d: &str, s: &[i64]| TensorMetadata {
        name: n.into(),
        datatype: d.into(),
        shape: s.to_vec(),
    };
    ModelMetadata {
        name: "m".into(),
        versions: vec!["1".into()],
        platform: String::new(),
        inputs: vec![t("INPUT0", "FP32", &[-1, 4])],
        outputs: vec![t("OUTPUT0", "FP32", &[-1, 4])],
    }
}

fuzz_target!(|data: &[u8]| {
    // The first byte picks the header: absent, 0 (raw), or a length within the body.
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let body = Bytes::copy_from_slice(rest);
    let header = match sel % 3 {
        0 => None,
        1 => Some("0".to_string()),
        _ => Some((sel as usize * 7 % (rest.len() + 1)).to_string()),
    };
    let limits = Limits {
        max_json_bytes: 1 << 20,
        max_json_depth: 32,
        max_tensor_elements: 1 << 20,
    };
    let req = match decode_request(&body, header.as_deref().map(str::as_bytes), &limits) {
        Ok(RequestBody::Message(r)) => r,
        Ok(RequestBody::Raw(raw)) => match expand_raw(raw, &model(), &limits) {
            Ok(r) => r,
            Err(_) => return,
        },
        Err(_) => return,
    };
    let _ = validate_request(&req, &model());
    let _ = encode_request(&req, true);
    let _ = encode_request(&req, false);
    let echo = InferResponse {
        id: req.id.clone(),
        model_name: "m".into(),
        model_version: None,
        parameters: req.parameters.clone(),
        outputs: req.inputs.clone(),
    };
    let flags: Vec<bool> = echo
        .outputs
        .iter()
        .map(|o| req.wants_binary(&o.name))
        .collect();
    let _ = encode_response(&echo, &flags);
});
