//! Property tests of the protobuf codec: random tensors of every datatype go protobuf →
//! tensor → JSON/binary → tensor → protobuf bit-exactly (NaN payloads aside, which JSON
//! cannot carry), typed contents read as the same bytes as raw ones, and no message makes
//! the decoder panic.

use bytes::Bytes;
use proptest::prelude::*;
use prost::Message;
use tensorgate::protocol::grpc::{
    decode_infer_request, decode_infer_request_bytes, decode_infer_response, encode_infer_request,
    encode_infer_response, pb,
};
use tensorgate::protocol::tensor::frame_bytes;
use tensorgate::protocol::{
    decode_request, encode_request, DataType, InferRequest, InferResponse, Limits, Parameters,
    RequestBody, RequestOptions, Tensor,
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

/// Over the wire and back: serialized, then decoded.
fn via_protobuf(req: &InferRequest) -> InferRequest {
    let bytes = encode_infer_request("m", "", req).encode_to_vec();
    decode_infer_request_bytes(Bytes::from(bytes), &Limits::default()).unwrap()
}

fn via_rest(req: &InferRequest, binary: bool) -> InferRequest {
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

/// Every NaN as one quiet NaN, since JSON carries no NaN payload.
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
        let through_rest = via_rest(&from_grpc, binary);
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
