//! Any bytes as a protobuf ModelInferRequest: decoding never panics, and whatever decodes
//! encodes (raw) and decodes again to the same request.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use tensorgate::protocol::grpc::{
    check_contents, check_fanout, check_ranks, decode_infer_request, decode_infer_request_bytes,
    decoded_extra, encode_infer_request, pb, MessageHead,
};
use tensorgate::protocol::Limits;

fuzz_target!(|data: &[u8]| {
    // The look at the wire bytes the gRPC edge takes first never panics either.
    let _ = check_fanout(data, tensorgate::protocol::grpc::INFER_REQUEST_FIELDS);
    let contents = check_contents(data);
    let contents_ok = contents.is_ok();
    let _ = check_ranks(data);
    // A message's head reads what the whole message says of itself, and the size the
    // early look expects is what the decoded message takes.
    let head = MessageHead::read(data);
    if let Ok(msg) = <pb::ModelInferRequest as prost::Message>::decode(data) {
        assert_eq!(
            head.expect("a message that decodes has a head"),
            MessageHead::of(&msg)
        );
        if let Ok(extra) = &contents {
            assert_eq!(*extra, decoded_extra(&msg));
        }
    }
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
