//! The REST codec of the v2 protocol: JSON bodies, binary tensor chunks after an
//! `Inference-Header-Content-Length` JSON header, and raw binary requests, to and from the
//! encoding-neutral model at `protocol`'s root.

pub mod decode;
pub mod encode;
mod fast_request;
mod json_count;
pub mod json_data;
mod json_number;
pub mod json_write;
pub mod raw;
mod wire;
