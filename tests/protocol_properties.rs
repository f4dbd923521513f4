//! Property tests of the codec: random tensors of every datatype and random shapes
//! round-trip JSON → binary → JSON and binary → JSON → binary bit-exactly (NaN payloads
//! aside), and no body makes the decoders panic.

use crate::codec_common;

use bytes::Bytes;
use codec_common::{canonical, request, roundtrip_request, tensor_strategy};
use proptest::prelude::*;
use tensorgate::protocol::rest::decode::{decode_request, decode_response};
use tensorgate::protocol::rest::encode::{encode_request, encode_response};
use tensorgate::protocol::{InferResponse, Limits, Parameters, Tensor};

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
