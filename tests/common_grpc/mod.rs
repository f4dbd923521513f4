//! Helpers for tests that speak gRPC to a gateway: building `ModelInferRequest`s and
//! reading raw outputs.

#![allow(dead_code)]

use bytes::Bytes;
use tensorgate::grpc::service::grpc_inference_service_client::GrpcInferenceServiceClient;
use tensorgate::protocol::grpc::pb;
use tensorgate::protocol::grpc::pb::infer_parameter::ParameterChoice;
use tonic::transport::Channel;

pub type Client = GrpcInferenceServiceClient<Channel>;

/// A channel to the gRPC listener at `addr`.
pub async fn channel(addr: std::net::SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect to the gRPC listener")
}

/// A client of the gRPC listener at `addr`.
pub async fn connect(addr: std::net::SocketAddr) -> Client {
    GrpcInferenceServiceClient::new(channel(addr).await)
}

pub fn int64(v: i64) -> pb::InferParameter {
    pb::InferParameter {
        parameter_choice: Some(ParameterChoice::Int64Param(v)),
    }
}

pub fn boolean(v: bool) -> pb::InferParameter {
    pb::InferParameter {
        parameter_choice: Some(ParameterChoice::BoolParam(v)),
    }
}

pub fn input(
    name: &str,
    datatype: &str,
    shape: &[i64],
) -> pb::model_infer_request::InferInputTensor {
    pb::model_infer_request::InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape: shape.to_vec(),
        ..Default::default()
    }
}

pub fn le_i32(values: &[i32]) -> Bytes {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub fn i32s(raw: &[u8]) -> Vec<i32> {
    raw.chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

pub fn output<'a>(r: &'a pb::ModelInferResponse, name: &str) -> &'a [u8] {
    let i = r
        .outputs
        .iter()
        .position(|o| o.name == name)
        .unwrap_or_else(|| panic!("no output {name} in {r:?}"));
    &r.raw_output_contents[i]
}

pub fn backend_of<T>(r: &tonic::Response<T>) -> String {
    r.metadata()
        .get("x-tensorgate-backend")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// `accumulate` over gRPC: its running sum after `value`.
pub async fn accumulate_grpc(
    c: &mut Client,
    id: pb::InferParameter,
    value: i32,
    start: bool,
) -> Result<(i32, String), tonic::Status> {
    let mut req = pb::ModelInferRequest {
        model_name: "accumulate".into(),
        inputs: vec![input("INPUT0", "INT32", &[1])],
        raw_input_contents: vec![le_i32(&[value])],
        ..Default::default()
    };
    req.parameters.insert("sequence_id".into(), id);
    req.parameters
        .insert("sequence_start".into(), boolean(start));
    let r = c.model_infer(req).await?;
    let backend = backend_of(&r);
    Ok((i32s(output(r.get_ref(), "OUTPUT0"))[0], backend))
}
