//! The Open Inference Protocol (KServe v2) REST layer: types, the JSON and binary codecs,
//! validation and transcoding. Pure: no sockets, no tokio. The tensor model is neutral to the
//! encoding, so other fronts (gRPC) can share it.

pub mod classify;
pub mod datatype;
pub mod decode;
pub mod encode;
pub mod error;
mod fast_request;
pub mod grpc;
mod json_count;
pub mod json_data;
mod json_number;
pub mod json_write;
pub mod limits;
pub mod message;
pub mod metadata;
pub mod params;
pub mod raw;
pub mod tensor;
pub mod tolerance;
pub mod validate;

pub use datatype::DataType;
pub use decode::{
    decode_backend_response, decode_request, decode_response, RequestBody, HEADER_CONTENT_LENGTH,
};
pub use encode::{encode_request, encode_response, EncodedBody};
pub use error::{ProtocolError, Role};
pub use limits::Limits;
pub use message::{InferRequest, InferResponse, RequestedOutput};
pub use metadata::{ModelMetadata, ServerMetadata, TensorMetadata};
pub use params::{OutputOptions, ParamValue, Parameters, RequestOptions, SequenceId};
pub use raw::expand_raw;
pub use tensor::Tensor;
pub use tolerance::{Tolerance, Tolerated};
pub use validate::validate_request;
