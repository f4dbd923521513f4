//! Golden tests built from the examples of the protocol documents (fixtures written for
//! these tests in tests/fixtures/seeds/).

use bytes::Bytes;
use tensorgate::protocol::rest::decode::{decode_request, decode_response, RequestBody};
use tensorgate::protocol::rest::encode::encode_response;
use tensorgate::protocol::rest::raw::expand_raw;
use tensorgate::protocol::{
    classify, DataType, InferResponse, Limits, ModelMetadata, Parameters, SequenceId, Tensor,
    TensorMetadata,
};

fn fixture(name: &str) -> Bytes {
    Bytes::from(
        std::fs::read(format!(
            "{}/tests/fixtures/seeds/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap(),
    )
}

fn ihcl(name: &str) -> String {
    String::from_utf8(fixture(name).to_vec()).unwrap()
}

fn message(body: &Bytes, header: Option<&str>) -> tensorgate::protocol::InferRequest {
    match decode_request(body, header.map(str::as_bytes), &Limits::default()).unwrap() {
        RequestBody::Message(r) => r,
        RequestBody::Raw(_) => panic!("unexpected raw request"),
    }
}

#[test]
fn the_published_rest_example_is_refused_for_its_bool_input() {
    // The example gives BOOL shape [3] but one element of data.
    let e = decode_request(
        &fixture("rest_request_as_published.json"),
        None,
        &Limits::default(),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "input 'input1': shape [3] needs 3 elements, data has 1"
    );
}

#[test]
fn rest_json_request() {
    let r = message(&fixture("rest_request.json"), None);
    assert_eq!(r.id.as_deref(), Some("42"));
    assert_eq!(r.inputs[0].datatype, DataType::Uint32);
    assert_eq!(r.inputs[0].shape, vec![2, 2]);
    let u: Vec<u32> = r.inputs[0]
        .data
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(u, vec![1, 2, 3, 4]);
    assert_eq!(&r.inputs[1].data[..], &[1, 0, 1]);
    let outs = r.outputs.as_ref().unwrap();
    assert_eq!(outs[0].name, "output0");
    // A listed output without binary_data is returned as JSON.
    assert!(!r.wants_binary("output0"));
}

#[test]
fn binary_request_and_response_of_the_extension_document() {
    let r = message(
        &fixture("binary_request.bin"),
        Some(&ihcl("binary_request.ihcl")),
    );
    assert_eq!(r.inputs.len(), 2);
    assert_eq!(r.inputs[0].data.len(), 16);
    assert_eq!(&r.inputs[1].data[..], &[1, 0, 1]);
    assert!(
        r.inputs[0].parameters.get("binary_data_size").is_none(),
        "an encoding detail, not a tensor parameter"
    );
    assert!(r.wants_binary("output0"));

    let resp = decode_response(
        &fixture("binary_response.bin"),
        Some(ihcl("binary_response.ihcl").as_bytes()),
        &Limits::default(),
    )
    .unwrap();
    let o = &resp.outputs[0];
    assert_eq!(
        (o.datatype, o.shape.clone(), o.data.len()),
        (DataType::Fp32, vec![3, 2], 24)
    );
    // Re-encoded for the client as it asked (binary): the same 24 bytes follow the header.
    let enc = encode_response(&resp, &[true]).unwrap();
    assert_eq!(enc.content_type(), "application/octet-stream");
    let body = enc.to_bytes();
    let hl = enc.header_length().unwrap();
    assert_eq!(
        &body[hl..],
        &fixture("binary_response.bin")[ihcl("binary_response.ihcl").parse::<usize>().unwrap()..]
    );
    let header: serde_json::Value = serde_json::from_slice(&body[..hl]).unwrap();
    assert_eq!(header["outputs"][0]["parameters"]["binary_data_size"], 24);
    // As JSON instead: no binary part, no header length, application/json.
    let enc = encode_response(&resp, &[false]).unwrap();
    assert_eq!(enc.header_length(), None);
    assert_eq!(enc.content_type(), "application/json");
    let v: serde_json::Value = serde_json::from_slice(&enc.to_bytes()).unwrap();
    assert_eq!(
        v["outputs"][0]["data"],
        serde_json::json!([1.0, 1.1, 2.0, 2.1, 3.0, 3.1])
    );
}

#[test]
fn mixed_json_and_binary_inputs() {
    let r = message(
        &fixture("mixed_request.bin"),
        Some(&ihcl("mixed_request.ihcl")),
    );
    assert_eq!(r.inputs[0].data.len(), 16);
    let h: Vec<f32> = r.inputs[1]
        .data
        .chunks(2)
        .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect();
    assert_eq!(h, vec![0.5, -2.0]);
    assert!(r.wants_binary("output0"));
    assert!(!r.wants_binary("output1"));
    // An unlisted output follows binary_data_output, which is absent: JSON.
    assert!(!r.wants_binary("output2"));
}

#[test]
fn raw_binary_request_is_batch_one_with_binary_outputs() {
    let body = fixture("raw_request.bin");
    let RequestBody::Raw(data) = decode_request(&body, Some(b"0"), &Limits::default()).unwrap()
    else {
        panic!("expected a raw request")
    };
    let model = ModelMetadata {
        name: "mymodel".into(),
        versions: vec![],
        platform: String::new(),
        inputs: vec![TensorMetadata {
            name: "input".into(),
            datatype: "FP32".into(),
            shape: vec![-1, 4],
        }],
        outputs: vec![],
    };
    let r = expand_raw(data, &model, &Limits::default()).unwrap();
    assert_eq!(r.inputs[0].shape, vec![1, 4]);
    assert!(r.wants_binary("output0") && r.wants_binary("output1"));
}

#[test]
fn zero_length_binary_outputs_add_no_bytes() {
    let resp = InferResponse {
        id: Some(String::new()),
        model_name: "m".into(),
        model_version: None,
        parameters: Parameters::new(),
        outputs: vec![
            Tensor {
                name: "E".into(),
                datatype: DataType::Fp32,
                shape: vec![0],
                parameters: Parameters::new(),
                data: Bytes::new(),
            },
            Tensor {
                name: "X".into(),
                datatype: DataType::Int8,
                shape: vec![1],
                parameters: Parameters::new(),
                data: Bytes::from_static(&[5]),
            },
        ],
    };
    let enc = encode_response(&resp, &[true, true]).unwrap();
    assert_eq!(enc.parts.len(), 2, "header and X only");
    assert_eq!(enc.len(), enc.json_len + 1);
    let v: serde_json::Value = serde_json::from_slice(&enc.to_bytes()[..enc.json_len]).unwrap();
    assert!(v.get("id").is_none(), "an empty id is not echoed");
    assert_eq!(v["outputs"][0]["parameters"]["binary_data_size"], 0);
}

fn published_error(name: &str) -> String {
    decode_request(&fixture(name), None, &Limits::default())
        .unwrap_err()
        .to_string()
}

fn uint32s(t: &Tensor) -> Vec<u32> {
    t.data
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn the_published_sequence_examples_are_not_json() {
    // Both lack the comma after "parameters" (and have one after the last field of the
    // output); the corrected fixtures below are the same requests.
    for name in [
        "sequence_uint_request_as_published.json",
        "sequence_string_request_as_published.json",
    ] {
        assert_eq!(
            published_error(name),
            "invalid JSON request: expected `,` or `}` at line 3 column 3",
            "{name}"
        );
    }
}

#[test]
fn sequence_request_with_a_uint64_id() {
    let r = message(&fixture("sequence_uint_request.json"), None);
    assert_eq!(r.options.sequence_id, Some(SequenceId::Uint(42)));
    // Neither start nor end: a request in the middle of the sequence.
    assert!(!r.options.sequence_start && !r.options.sequence_end);
    assert_eq!(
        (r.inputs[0].datatype, r.inputs[0].shape.clone()),
        (DataType::Uint32, vec![2, 2])
    );
    assert_eq!(uint32s(&r.inputs[0]), vec![1, 2, 3, 4]);
    assert_eq!(r.outputs.as_ref().unwrap()[0].name, "output0");
}

#[test]
fn sequence_request_with_a_uuid_string_id() {
    let r = message(&fixture("sequence_string_request.json"), None);
    assert_eq!(
        r.options.sequence_id,
        Some(SequenceId::String(
            "e333c95a-07fc-42d2-ab16-033b1a566ed5".into()
        ))
    );
    assert!(!r.options.sequence_start && !r.options.sequence_end);
    assert_eq!(uint32s(&r.inputs[0]), vec![1, 2, 3, 4]);
}

/// The classification example: the model produces [1.1, 3.3, 0.5, 2.4] and the request asks
/// for 2 classes. The document shows `"3.3:1"` and datatype STRING; Triton really sends
/// `std::to_string` values (`3.300000`) and datatype BYTES, and so does tensorgate.
#[test]
fn classification_example_with_and_without_labels() {
    let req = message(&fixture("classification_request.json"), None);
    let requested = &req.outputs.as_ref().unwrap()[0];
    assert_eq!(requested.name, "output0");
    let k = requested.options.classification.unwrap();
    assert_eq!(k, 2);
    let model = decode_response(
        &fixture("classification_model_output.json"),
        None,
        &Limits::default(),
    )
    .unwrap();
    let labels =
        classify::parse_labels(std::str::from_utf8(&fixture("classification_labels.txt")).unwrap());
    for (labels, golden) in [
        (None, "classification_response.json"),
        (Some(&labels[..]), "classification_response_labels.json"),
    ] {
        let classes = classify::classify(&model.outputs[0], k, false, labels).unwrap();
        let resp = InferResponse {
            id: req.id.clone(),
            model_name: model.model_name.clone(),
            model_version: None,
            parameters: Parameters::new(),
            outputs: vec![classes],
        };
        let enc = encode_response(&resp, &[false]).unwrap();
        assert_eq!(enc.content_type(), "application/json");
        let got: serde_json::Value = serde_json::from_slice(&enc.to_bytes()).unwrap();
        let want: serde_json::Value = serde_json::from_slice(&fixture(golden)).unwrap();
        assert_eq!(got, want, "{golden}");
    }
}
