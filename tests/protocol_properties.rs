//! Property tests of the codec: random tensors of every datatype and random shapes
//! round-trip JSON → binary → JSON and binary → JSON → binary bit-exactly (NaN payloads
//! aside), and no body makes the decoders panic.

use bytes::Bytes;
use proptest::prelude::*;
use tensorgate::protocol::tensor::frame_bytes;
use tensorgate::protocol::{
    decode_request, decode_response, encode_request, encode_response, DataType, InferRequest,
    InferResponse, Limits, Parameters, RequestBody, RequestOptions, Tensor,
};

fn tensor_strategy() -> impl Strategy<Value = Tensor> {
    let shape = prop::collection::vec(0u64..4, 0..4);
    (prop::sample::select(DataType::ALL.to_vec()), shape).prop_flat_map(|(dt, shape)| {
        let n = shape.iter().product::<u64>() as usize;
        let data: BoxedStrategy<Bytes> = match dt.fixed_size() {
            Some(size) if dt == DataType::Bool => prop::collection::vec(0u8..2, n * size)
                .prop_map(Bytes::from)
                .boxed(),
            Some(size) => prop::collection::vec(any::<u8>(), n * size)
                .prop_map(Bytes::from)
                .boxed(),
            // JSON strings: any UTF-8, including quotes, backslashes and control characters.
            None => prop::collection::vec(".{0,12}", n)
                .prop_map(|v| frame_bytes(v.iter().map(|s| s.as_bytes())))
                .boxed(),
        };
        data.prop_map(move |data| Tensor {
            name: "T".into(),
            datatype: dt,
            shape: shape.clone(),
            parameters: Parameters::new(),
            data,
        })
    })
}

fn request(inputs: Vec<Tensor>) -> InferRequest {
    InferRequest {
        id: Some("p".into()),
        parameters: Parameters::new(),
        options: RequestOptions::default(),
        inputs,
        outputs: None,
    }
}

fn roundtrip_request(req: &InferRequest, binary: bool) -> InferRequest {
    let enc = encode_request(req, binary).unwrap();
    let hl = enc.header_length().map(|n| n.to_string());
    match decode_request(
        &enc.to_bytes(),
        hl.as_deref().map(str::as_bytes),
        &Limits::default(),
    )
    .unwrap()
    {
        RequestBody::Message(r) => r,
        RequestBody::Raw(_) => panic!("not raw"),
    }
}

/// Canonical bytes for comparison: every NaN of a float type becomes one quiet NaN, since
/// JSON carries no NaN payload.
fn canonical(t: &Tensor) -> Vec<u8> {
    let d = &t.data;
    match t.datatype {
        DataType::Fp32 => d
            .chunks_exact(4)
            .flat_map(|c| {
                let v = f32::from_le_bytes(c.try_into().unwrap());
                (if v.is_nan() { f32::NAN } else { v }).to_le_bytes()
            })
            .collect(),
        DataType::Fp64 => d
            .chunks_exact(8)
            .flat_map(|c| {
                let v = f64::from_le_bytes(c.try_into().unwrap());
                (if v.is_nan() { f64::NAN } else { v }).to_le_bytes()
            })
            .collect(),
        DataType::Fp16 => d
            .chunks_exact(2)
            .flat_map(|c| {
                let v = half::f16::from_le_bytes([c[0], c[1]]);
                (if v.is_nan() { half::f16::NAN } else { v }).to_le_bytes()
            })
            .collect(),
        DataType::Bf16 => d
            .chunks_exact(2)
            .flat_map(|c| {
                let v = half::bf16::from_le_bytes([c[0], c[1]]);
                (if v.is_nan() { half::bf16::NAN } else { v }).to_le_bytes()
            })
            .collect(),
        _ => d.to_vec(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn binary_json_binary_is_exact(t in tensor_strategy()) {
        let req = request(vec![t.clone()]);
        let via_json = roundtrip_request(&req, false);
        let back = roundtrip_request(&via_json, true);
        prop_assert_eq!(&back.inputs[0].shape, &t.shape);
        prop_assert_eq!(back.inputs[0].datatype, t.datatype);
        prop_assert_eq!(canonical(&back.inputs[0]), canonical(&t));
    }

    #[test]
    fn json_binary_json_is_exact(t in tensor_strategy()) {
        // Start from JSON text: encode once as JSON, then go through binary and back.
        let req = roundtrip_request(&request(vec![t]), false);
        let json1 = encode_request(&req, false).unwrap().to_bytes();
        let via_binary = roundtrip_request(&req, true);
        let json2 = encode_request(&via_binary, false).unwrap().to_bytes();
        prop_assert_eq!(json1, json2);
    }

    #[test]
    fn responses_round_trip_output_by_output(ts in prop::collection::vec(tensor_strategy(), 1..4), flags in prop::collection::vec(any::<bool>(), 4)) {
        let outputs: Vec<Tensor> = ts.into_iter().enumerate().map(|(i, mut t)| { t.name = format!("O{i}"); t }).collect();
        let resp = InferResponse { id: None, model_name: "m".into(), model_version: None, parameters: Parameters::new(), outputs };
        let binary: Vec<bool> = (0..resp.outputs.len()).map(|i| flags[i]).collect();
        let enc = encode_response(&resp, &binary).unwrap();
        let hl = enc.header_length().map(|n| n.to_string());
        let back = decode_response(&enc.to_bytes(), hl.as_deref().map(str::as_bytes), &Limits::default()).unwrap();
        for (a, b) in back.outputs.iter().zip(&resp.outputs) {
            prop_assert_eq!(canonical(a), canonical(b));
            prop_assert_eq!(&a.shape, &b.shape);
        }
    }

    #[test]
    fn decoders_never_panic(body in prop::collection::vec(any::<u8>(), 0..512), header in prop::option::of("[0-9-]{0,4}")) {
        let body = Bytes::from(body);
        let _ = decode_request(&body, header.as_deref().map(str::as_bytes), &Limits::default());
        let _ = decode_response(&body, header.as_deref().map(str::as_bytes), &Limits::default());
    }

    #[test]
    fn json_shaped_garbage_never_panics(body in r#"\{"inputs":\[\{"name":"[A-Z]{1,3}","shape":\[[0-9,-]{0,6}\],"datatype":"(FP32|BYTES|BOOL|INT8|UINT64)","data":[\[\]0-9,."a-z\\ -]{0,40}\}\]\}"#) {
        let _ = decode_request(&Bytes::from(body), None, &Limits::default());
    }

    /// Whichever decoder reads a body (the fast path when `datatype` comes before `data`,
    /// serde otherwise), what serde_json rejects as JSON is rejected, and a valid number in
    /// range is accepted.
    #[test]
    fn data_elements_are_judged_alike_in_either_key_order(
        tok in r"[-+]?[0-9.eE+-]{1,6}",
        dt in prop::sample::select(vec!["FP32", "FP64", "INT32", "UINT8", "FP16"]),
    ) {
        let valid_json = serde_json::from_str::<serde_json::Value>(&tok).is_ok();
        for body in [
            format!(r#"{{"inputs":[{{"name":"X","datatype":"{dt}","shape":[1],"data":[{tok}]}}]}}"#),
            format!(r#"{{"inputs":[{{"name":"X","data":[{tok}],"shape":[1],"datatype":"{dt}"}}]}}"#),
        ] {
            let accepted = decode_request(&Bytes::from(body.clone()), None, &Limits::default()).is_ok();
            if !valid_json {
                prop_assert!(!accepted, "{}", body);
            }
            let small_int = tok.parse::<u8>().is_ok_and(|v| v < 100) && valid_json;
            if small_int {
                prop_assert!(accepted, "{}", body);
            }
        }
    }
}
