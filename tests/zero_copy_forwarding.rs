//! A 64 MB binary request, decoded and re-encoded for forwarding, keeps its tensor bytes in
//! the original buffer: the encoded body's tensor parts are slices of the received body.

use bytes::Bytes;
use tensorgate::protocol::rest::decode::{decode_request, decode_response, RequestBody};
use tensorgate::protocol::rest::encode::{encode_request, encode_response};
use tensorgate::protocol::Limits;

fn within(part: &Bytes, body: &Bytes) -> bool {
    let (start, end) = (body.as_ptr() as usize, body.as_ptr() as usize + body.len());
    let p = part.as_ptr() as usize;
    p >= start && p + part.len() <= end
}

#[test]
fn a_64_mb_request_is_forwarded_without_copying_tensors() {
    let n = 16 << 20; // FP32 elements: 64 MB
    let header = format!(
        r#"{{"inputs":[{{"name":"BIG","shape":[1,{n}],"datatype":"FP32","parameters":{{"binary_data_size":{}}}}},{{"name":"SMALL","shape":[2],"datatype":"INT8","parameters":{{"binary_data_size":2}}}}]}}"#,
        n * 4
    );
    let mut raw = header.clone().into_bytes();
    raw.extend(std::iter::repeat_n(0x3f, n * 4));
    raw.extend([1, 2]);
    let body = Bytes::from(raw);
    let limits = Limits {
        max_tensor_elements: 1 << 30,
        ..Limits::default()
    };
    let RequestBody::Message(req) =
        decode_request(&body, Some(header.len().to_string().as_bytes()), &limits).unwrap()
    else {
        panic!("not raw")
    };
    for t in &req.inputs {
        assert!(
            within(&t.data, &body),
            "decoded tensor {} was copied",
            t.name
        );
    }
    let enc = encode_request(&req, true).unwrap();
    assert_eq!(enc.parts.len(), 3, "JSON header plus one part per tensor");
    assert!(!within(&enc.parts[0], &body), "the header is newly written");
    for part in &enc.parts[1..] {
        assert!(within(part, &body), "a tensor part was copied");
    }
    assert_eq!(enc.parts[1].len(), n * 4);
    assert_eq!(enc.len() - enc.json_len, n * 4 + 2);
}

#[test]
fn binary_responses_are_reencoded_without_copying() {
    let n = 1 << 20;
    let header = format!(
        r#"{{"model_name":"m","outputs":[{{"name":"O","shape":[{n}],"datatype":"UINT8","parameters":{{"binary_data_size":{n}}}}}]}}"#
    );
    let mut raw = header.clone().into_bytes();
    raw.extend(std::iter::repeat_n(7u8, n));
    let body = Bytes::from(raw);
    let resp = decode_response(
        &body,
        Some(header.len().to_string().as_bytes()),
        &Limits::default(),
    )
    .unwrap();
    let enc = encode_response(&resp, &[true]).unwrap();
    assert_eq!(enc.parts.len(), 2);
    assert!(within(&enc.parts[1], &body));
}
