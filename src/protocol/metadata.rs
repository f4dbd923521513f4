//! Server and model metadata, as the v2 metadata endpoints return them.

use serde::{Deserialize, Serialize};

use super::tolerance::{Tolerance, Tolerated};

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

/// Model metadata as backends really send it: KServe 0.21 writes `"versions": null`, and
/// a missing `platform` costs nothing to forgive. Clients never send metadata, so this is
/// the only way in.
#[derive(Deserialize)]
struct BackendModelMetadata {
    name: String,
    #[serde(default)]
    versions: Option<Vec<String>>,
    #[serde(default)]
    platform: Option<String>,
    #[serde(default)]
    inputs: Vec<TensorMetadata>,
    #[serde(default)]
    outputs: Vec<TensorMetadata>,
}

impl ModelMetadata {
    /// Whether `other` takes and gives the same tensors (names, datatypes, shapes): a request
    /// checked against one is right for the other.
    pub fn same_tensors(&self, other: &ModelMetadata) -> bool {
        self.inputs == other.inputs && self.outputs == other.outputs
    }

    /// The version label of a request for this model (metrics and statistics): the version it
    /// asked for, else the one a request without a version runs, else none (`""`). Callers
    /// check first that an asked version is listed, so that label values stay bounded.
    pub fn version_label(&self, asked: Option<&str>) -> String {
        asked
            .or(self.latest_version())
            .unwrap_or_default()
            .to_string()
    }

    /// The version a request without one runs, as Triton (and a tensorgate worker) picks it:
    /// the highest number the model lists; among versions that are not numbers, the last.
    pub fn latest_version(&self) -> Option<&str> {
        self.versions
            .iter()
            .max_by_key(|v| v.parse::<u64>().ok())
            .map(String::as_str)
    }

    /// Reads a backend's `GET /v2/models/{name}` answer, and says what it had to forgive.
    pub fn from_backend(body: &[u8]) -> Result<(ModelMetadata, Tolerated), serde_json::Error> {
        let wire: BackendModelMetadata = serde_json::from_slice(body)?;
        let mut tolerated = Tolerated::default();
        if wire.versions.is_none() {
            tolerated.insert(Tolerance::VersionsAbsent);
        }
        if wire.platform.is_none() {
            tolerated.insert(Tolerance::PlatformAbsent);
        }
        let metadata = ModelMetadata {
            name: wire.name,
            versions: wire.versions.unwrap_or_default(),
            platform: wire.platform.unwrap_or_default(),
            inputs: wire.inputs,
            outputs: wire.outputs,
        };
        Ok((metadata, tolerated))
    }

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
    pub const MODEL_REPOSITORY: &str = "model_repository";
    pub const SEQUENCE: &str = "sequence";
    pub const STATISTICS: &str = "statistics";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_labels() {
        let mut m = ModelMetadata {
            name: "m".into(),
            versions: vec!["3".into(), "4".into()],
            platform: String::new(),
            inputs: vec![],
            outputs: vec![],
        };
        assert_eq!(m.version_label(Some("3")), "3");
        assert_eq!(m.version_label(None), "4", "the latest, which runs");
        m.versions = vec!["10".into(), "9".into()];
        assert_eq!(m.version_label(None), "10");
        m.versions = vec!["a".into(), "b".into()];
        assert_eq!(m.version_label(None), "b");
        m.versions.clear();
        assert_eq!(m.version_label(None), "");
    }

    #[test]
    fn backends_may_leave_versions_and_platform_out() {
        // KServe 0.21's answer for a custom model.
        let kserve = br#"{"name":"addsub","versions":null,"platform":"","inputs":[],"outputs":[]}"#;
        let (m, t) = ModelMetadata::from_backend(kserve).unwrap();
        assert_eq!(m.versions, Vec::<String>::new());
        assert_eq!(t.iter().collect::<Vec<_>>(), [Tolerance::VersionsAbsent]);
        let (m, t) = ModelMetadata::from_backend(br#"{"name":"m","platform":null}"#).unwrap();
        assert_eq!((m.platform.as_str(), m.inputs.len()), ("", 0));
        assert_eq!(
            t.iter().collect::<Vec<_>>(),
            [Tolerance::VersionsAbsent, Tolerance::PlatformAbsent]
        );
        let (m, t) = ModelMetadata::from_backend(
            br#"{"name":"m","versions":["1","2"],"platform":"onnxruntime_onnx"}"#,
        )
        .unwrap();
        assert_eq!(m.versions, ["1", "2"]);
        assert!(t.is_empty());
    }

    #[test]
    fn triton_metadata_needs_no_forgiveness() {
        for (fixture, platform) in [
            (
                include_str!("../../tests/fixtures/triton/model_metadata_onnx.json"),
                "onnxruntime_onnx",
            ),
            (
                include_str!("../../tests/fixtures/triton/model_metadata_python.json"),
                "python",
            ),
        ] {
            let (m, t) = ModelMetadata::from_backend(fixture.as_bytes()).unwrap();
            assert_eq!(m.platform, platform);
            assert!(!m.versions.is_empty() && !m.inputs.is_empty());
            assert!(t.is_empty(), "{fixture}");
        }
    }

    #[test]
    fn what_cannot_be_forgiven_is_still_an_error() {
        let e = ModelMetadata::from_backend(br#"{"name":"m","versions":[1]}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid type: integer `1`, expected a string at line 1 column 25"
        );
        let e = ModelMetadata::from_backend(br#"{"versions":[]}"#).unwrap_err();
        assert_eq!(e.to_string(), "missing field `name` at line 1 column 15");
    }
}
