//! The Open Inference Protocol (KServe v2), pure: no sockets, no tokio. At the root, the
//! encoding-neutral model (datatypes, parameters, tensors, requests and responses, metadata,
//! validation, classification, limits, backend tolerances); beside it, one codec per
//! transport: `rest` (JSON and binary tensors) and `grpc` (protobuf). The codecs depend on
//! the model, never on each other.

pub mod classify;
pub mod datatype;
pub mod error;
pub mod grpc;
pub mod limits;
pub mod message;
pub mod metadata;
pub mod params;
pub mod rest;
pub mod tensor;
pub mod tolerance;
pub mod validate;

pub use datatype::DataType;
pub use error::{ProtocolError, Role};
pub use limits::Limits;
pub use message::{InferRequest, InferResponse, RequestedOutput};
pub use metadata::{ModelMetadata, ServerMetadata, TensorMetadata};
pub use params::{OutputOptions, ParamValue, Parameters, RequestOptions, SequenceId};
pub use tensor::Tensor;
pub use tolerance::{Tolerance, Tolerated};
pub use validate::{check_max_batch_size, validate_request};
