//! Backend response bodies: decoding must never panic, and whatever decodes must encode in
//! all-JSON and all-binary form and decode again to the same response.
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use tensorgate::protocol::rest::decode::decode_response;
use tensorgate::protocol::rest::encode::encode_response;
use tensorgate::protocol::Limits;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let body = Bytes::copy_from_slice(rest);
    let header = (sel % 2 == 1).then(|| (sel as usize * 13 % (rest.len() + 1)).to_string());
    let limits = Limits {
        max_json_bytes: 1 << 20,
        max_json_depth: 32,
        max_tensor_elements: 1 << 20,
    };
    let Ok(resp) = decode_response(&body, header.as_deref().map(str::as_bytes), &limits) else {
        return;
    };
    let binary = vec![true; resp.outputs.len()];
    let enc = encode_response(&resp, &binary).expect("binary encoding cannot fail");
    let hl = enc.header_length().map(|n| n.to_string());
    let again = decode_response(&enc.to_bytes(), hl.as_deref().map(str::as_bytes), &limits)
        .expect("our own encoding decodes");
    assert_eq!(again.outputs.len(), resp.outputs.len());
    for (a, b) in again.outputs.iter().zip(&resp.outputs) {
        assert_eq!(a.data, b.data);
        assert_eq!(a.shape, b.shape);
    }
    let _ = encode_response(&resp, &vec![false; resp.outputs.len()]);
});
