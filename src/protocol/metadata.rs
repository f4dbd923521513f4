//! Server and model metadata, as the v2 metadata endpoints return them.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorMetadata {
    pub name: String,
    pub datatype: String,
    /// -1 marks a variable dimension.
    pub shape: Vec<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelMetadata {
    pub name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<String>,
    #[serde(default)]
    pub platform: String,
    #[serde(default)]
    pub inputs: Vec<TensorMetadata>,
    #[serde(default)]
    pub outputs: Vec<TensorMetadata>,
}

impl ModelMetadata {
    pub fn input(&self, name: &str) -> Option<&TensorMetadata> {
        self.inputs.iter().find(|t| t.name == name)
    }

    pub fn output(&self, name: &str) -> Option<&TensorMetadata> {
        self.outputs.iter().find(|t| t.name == name)
    }

    /// MLServer reports empty input and output lists for models whose settings declare none;
    /// such a model's signature is unknown and only protocol-level checks apply.
    pub fn has_signature(&self) -> bool {
        !self.inputs.is_empty() || !self.outputs.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerMetadata {
    pub name: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub extensions: Vec<String>,
}

impl ServerMetadata {
    pub fn supports(&self, extension: &str) -> bool {
        self.extensions.iter().any(|e| e == extension)
    }
}

/// Extension names as servers report them.
pub mod extensions {
    pub const BINARY_TENSOR_DATA: &str = "binary_tensor_data";
    pub const CLASSIFICATION: &str = "classification";
    pub const SEQUENCE: &str = "sequence";
    pub const STATISTICS: &str = "statistics";
}
