//! Property tests of the protobuf codec: random tensors of every datatype go protobuf →
//! tensor → JSON/binary → tensor → protobuf bit-exactly (NaN payloads aside, which JSON
//! cannot carry), typed contents read as the same bytes as raw ones, and no message makes
//! the decoder panic.

use crate::codec_common;

use bytes::Bytes;
use codec_common::{canonical, request, roundtrip_request, tensor_strategy};
use proptest::prelude::*;
use prost::Message;
use tensorgate::protocol::grpc::{
    decode_infer_request, decode_infer_request_bytes, decode_infer_response, encode_infer_request,
    encode_infer_response, pb,
};
use tensorgate::protocol::{DataType, InferRequest, InferResponse, Limits, Parameters, Tensor};

/// Over the wire and back: serialized, then decoded.
fn via_protobuf(req: &InferRequest) -> InferRequest {
    let bytes = encode_infer_request("m", "", req).encode_to_vec();
    decode_infer_request_bytes(Bytes::from(bytes), &Limits::default()).unwrap()
}

/// The same tensor as typed `InferTensorContents`, where protobuf has a field for its type.
fn typed(t: &Tensor) -> Option<pb::InferTensorContents> {
    let d = &t.data;
    let mut c = pb::InferTensorContents::default();
    macro_rules! le {
        ($ty:ty, $n:expr) => {
            d.chunks_exact($n)
                .map(|x| <$ty>::from_le_bytes(x.try_into().unwrap()))
        };
    }
    match t.datatype {
        DataType::Bool => c.bool_contents = d.iter().map(|b| *b != 0).collect(),
        DataType::Int8 => c.int_contents = le!(i8, 1).map(i32::from).collect(),
        DataType::Int16 => c.int_contents = le!(i16, 2).map(i32::from).collect(),
        DataType::Int32 => c.int_contents = le!(i32, 4).collect(),
        DataType::Int64 => c.int64_contents = le!(i64, 8).collect(),
        DataType::Uint8 => c.uint_contents = d.iter().map(|b| u32::from(*b)).collect(),
        DataType::Uint16 => c.uint_contents = le!(u16, 2).map(u32::from).collect(),
        DataType::Uint32 => c.uint_contents = le!(u32, 4).collect(),
        DataType::Uint64 => c.uint64_contents = le!(u64, 8).collect(),
        DataType::Fp32 => c.fp32_contents = le!(f32, 4).collect(),
        DataType::Fp64 => c.fp64_contents = le!(f64, 8).collect(),
        DataType::Bytes => {
            c.bytes_contents = t.bytes_elements().map(Bytes::copy_from_slice).collect()
        }
        DataType::Fp16 | DataType::Bf16 => return None,
    }
    Some(c)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn protobuf_to_rest_and_back_is_exact(t in tensor_strategy(), binary in any::<bool>()) {
        let req = request(vec![t.clone()]);
        let from_grpc = via_protobuf(&req);
        prop_assert_eq!(&from_grpc.inputs, &req.inputs);
        let through_rest = roundtrip_request(&from_grpc, binary);
        let back = via_protobuf(&through_rest);
        prop_assert_eq!(&back.inputs[0].shape, &t.shape);
        prop_assert_eq!(back.inputs[0].datatype, t.datatype);
        if binary {
            prop_assert_eq!(&back.inputs[0].data, &t.data);
        } else {
            prop_assert_eq!(canonical(&back.inputs[0]), canonical(&t));
        }
    }

    #[test]
    fn typed_contents_read_as_the_raw_bytes(t in tensor_strategy()) {
        let Some(contents) = typed(&t) else { return Ok(()) };
        let mut msg = encode_infer_request("m", "", &request(vec![t.clone()]));
        msg.raw_input_contents.clear();
        msg.inputs[0].contents = Some(contents);
        let count: u64 = t.shape.iter().product();
        match decode_infer_request(msg, &Limits::default()) {
            Ok(req) => prop_assert_eq!(&req.inputs[0].data, &t.data),
            // An empty tensor has no contents to tell typed from raw.
            Err(e) => prop_assert!(count == 0, "{e}"),
        }
    }

    #[test]
    fn responses_round_trip(ts in prop::collection::vec(tensor_strategy(), 1..4)) {
        let outputs: Vec<Tensor> = ts.into_iter().enumerate().map(|(i, mut t)| { t.name = format!("O{i}"); t }).collect();
        let resp = InferResponse { id: Some("r".into()), model_name: "m".into(), model_version: Some("1".into()), parameters: Parameters::new(), outputs };
        let wire = encode_infer_response(resp.clone()).encode_to_vec();
        let back = decode_infer_response(pb::ModelInferResponse::decode(&wire[..]).unwrap(), &Limits::default()).unwrap();
        prop_assert_eq!(back, resp);
    }

    #[test]
    fn the_decoder_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_infer_request_bytes(Bytes::from(bytes), &Limits::default());
    }
}
