//! Inference requests and responses, independent of how they were encoded.

use super::params::{OutputOptions, Parameters, RequestOptions};
use super::tensor::Tensor;

#[derive(Debug, Clone, PartialEq)]
pub struct InferRequest {
    pub id: Option<String>,
    pub parameters: Parameters,
    /// The extension parameters of `parameters`, checked when the request was decoded.
    pub options: RequestOptions,
    pub inputs: Vec<Tensor>,
    /// `None` when the request lists no outputs: the model returns all of them.
    pub outputs: Option<Vec<RequestedOutput>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RequestedOutput {
    pub name: String,
    pub parameters: Parameters,
    pub options: OutputOptions,
}

impl InferRequest {
    pub fn requested_output(&self, name: &str) -> Option<&RequestedOutput> {
        self.outputs.as_ref()?.iter().find(|o| o.name == name)
    }

    /// Whether the client wants output `name` in binary form: a listed output follows its own
    /// `binary_data` (default JSON); an unlisted one follows `binary_data_output`.
    pub fn wants_binary(&self, name: &str) -> bool {
        match self.requested_output(name) {
            Some(o) => o.options.binary_data.unwrap_or(false),
            None => self.options.binary_data_output,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct InferResponse {
    pub id: Option<String>,
    pub model_name: String,
    pub model_version: Option<String>,
    pub parameters: Parameters,
    pub outputs: Vec<Tensor>,
}
