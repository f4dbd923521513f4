//! `classifier`: INPUT0 FP32 [-1,8] gives OUTPUT0 FP32 [-1,10], the logits of a fixed linear
//! model. The demo for classification; `config/labels/classifier.txt` names its classes.

use bytes::Bytes;

use super::{input, metadata, tensor_meta, Model, ModelError};
use crate::protocol::{DataType, InferRequest, ModelMetadata, Parameters, Tensor};

pub const FEATURES: usize = 8;
pub const CLASSES: usize = 10;

pub struct Classifier {
    meta: ModelMetadata,
    labels: std::sync::Arc<Vec<String>>,
}

impl Classifier {
    pub fn new() -> Self {
        Classifier {
            labels: std::sync::Arc::new(crate::protocol::classify::parse_labels(LABELS)),
            meta: metadata(
                "classifier",
                vec![tensor_meta(
                    "INPUT0",
                    DataType::Fp32,
                    &[-1, FEATURES as i64],
                )],
                vec![tensor_meta(
                    "OUTPUT0",
                    DataType::Fp32,
                    &[-1, CLASSES as i64],
                )],
            ),
        }
    }

    /// The fixed weights: small integers and quarters, so results are exact to check.
    pub fn weight(class: usize, feature: usize) -> f32 {
        (((class * FEATURES + feature) * 37 % 17) as f32 - 8.0) / 4.0
    }

    pub fn bias(class: usize) -> f32 {
        class as f32 * 0.5
    }

    /// The logits of one row of features.
    pub fn logits(features: &[f32]) -> [f32; CLASSES] {
        let mut out = [0f32; CLASSES];
        for (c, o) in out.iter_mut().enumerate() {
            *o = Self::bias(c)
                + features
                    .iter()
                    .enumerate()
                    .map(|(f, x)| Self::weight(c, f) * x)
                    .sum::<f32>();
        }
        out
    }
}

impl Default for Classifier {
    fn default() -> Self {
        Self::new()
    }
}

/// The labels of the 10 classes, the same text as `config/labels/classifier.txt`.
pub const LABELS: &str = include_str!("../../config/labels/classifier.txt");

impl Model for Classifier {
    fn metadata(&self) -> &ModelMetadata {
        &self.meta
    }

    fn labels(&self, output: &str) -> Option<std::sync::Arc<Vec<String>>> {
        (output == "OUTPUT0").then(|| self.labels.clone())
    }

    fn infer(&self, req: &InferRequest) -> Result<Vec<Tensor>, ModelError> {
        let x = input(req, "INPUT0")?;
        let batch = *x.shape.first().unwrap_or(&0) as usize;
        if x.data.len() != batch * FEATURES * 4 {
            return Err(ModelError::Invalid(format!(
                "INPUT0 must have shape [batch,{FEATURES}]"
            )));
        }
        let features: Vec<f32> = x
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let mut out = Vec::with_capacity(batch * CLASSES * 4);
        for row in features.chunks_exact(FEATURES) {
            for v in Self::logits(row) {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        Ok(vec![Tensor {
            name: "OUTPUT0".into(),
            datatype: DataType::Fp32,
            shape: vec![batch as u64, CLASSES as u64],
            parameters: Parameters::new(),
            data: Bytes::from(out),
        }])
    }
}
