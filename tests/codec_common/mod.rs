//! What the codec property suites share: random tensors of every datatype, a request
//! around them, a REST round trip, and bytes compared with every NaN made one.
#![allow(dead_code)] // each suite uses its own part

use bytes::Bytes;
use proptest::prelude::*;
use tensorgate::protocol::rest::decode::{decode_request, RequestBody};
use tensorgate::protocol::rest::encode::encode_request;
use tensorgate::protocol::tensor::frame_bytes;
use tensorgate::protocol::{DataType, InferRequest, Limits, Parameters, RequestOptions, Tensor};

pub fn tensor_strategy() -> impl Strategy<Value = Tensor> {
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

pub fn request(inputs: Vec<Tensor>) -> InferRequest {
    InferRequest {
        id: Some("p".into()),
        parameters: Parameters::new(),
        options: RequestOptions::default(),
        inputs,
        outputs: None,
    }
}

pub fn roundtrip_request(req: &InferRequest, binary: bool) -> InferRequest {
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
pub fn canonical(t: &Tensor) -> Vec<u8> {
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
