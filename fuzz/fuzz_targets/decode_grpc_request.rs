//! Any bytes as a protobuf ModelInferRequest: decoding never panics, and whatever decodes
//! encodes (raw) and decodes again to the same request.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use tensorgate::protocol::grpc::{
    check_contents, check_fanout, decode_infer_request, decode_infer_request_bytes,
    encode_infer_request,
};
use tensorgate::protocol::Limits;

fuzz_target!(|data: &[u8]| {
    // The look at the wire bytes the gRPC edge takes first never panics either.
    let _ = check_fanout(data, tensorgate::protocol::grpc::INFER_REQUEST_FIELDS);
    let contents_ok = check_contents(data).is_ok();
    let limits = Limits {
        max_tensor_elements: 1 << 16,
        ..Limits::default()
    };
    let Ok(req) = decode_infer_request_bytes(Bytes::copy_from_slice(data), &limits) else {
        return;
    };
    // What the early look refuses, the decoder refuses too.
    assert!(contents_ok, "check_contents refused a request that decodes");
    let again = decode_infer_request(encode_infer_request("m", "", &req), &limits)
        .expect("a decoded request encodes to a valid one");
    assert_eq!(again.inputs, req.inputs);
    assert_eq!(again.outputs, req.outputs);
    assert_eq!(again.options, req.options);
});
