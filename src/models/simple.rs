//! `simple`: OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1, INT32 [-1,16], like
//! Triton's example model of the same name (wrapping on overflow, as int32 arithmetic does).

use bytes::Bytes;

use super::{input, metadata, tensor_meta, Model, ModelError};
use crate::protocol::{DataType, InferRequest, ModelMetadata, Parameters, Tensor};

pub struct Simple {
    meta: ModelMetadata,
}

impl Simple {
    pub fn new() -> Self {
        let t = |n| tensor_meta(n, DataType::Int32, &[-1, 16]);
        Simple {
            meta: metadata(
                "simple",
                vec![t("INPUT0"), t("INPUT1")],
                vec![t("OUTPUT0"), t("OUTPUT1")],
            ),
        }
    }
}

impl Default for Simple {
    fn default() -> Self {
        Self::new()
    }
}

fn ints(t: &Tensor) -> impl Iterator<Item = i32> + '_ {
    t.data
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

impl Model for Simple {
    fn metadata(&self) -> &ModelMetadata {
        &self.meta
    }

    fn infer(&self, req: &InferRequest) -> Result<Vec<Tensor>, ModelError> {
        let a = input(req, "INPUT0")?;
        let b = input(req, "INPUT1")?;
        if a.shape != b.shape {
            return Err(ModelError::Invalid(format!(
                "INPUT0 and INPUT1 must have the same shape, got {:?} and {:?}",
                a.shape, b.shape
            )));
        }
        let mut sum = Vec::with_capacity(a.data.len());
        let mut diff = Vec::with_capacity(a.data.len());
        for (x, y) in ints(a).zip(ints(b)) {
            sum.extend_from_slice(&x.wrapping_add(y).to_le_bytes());
            diff.extend_from_slice(&x.wrapping_sub(y).to_le_bytes());
        }
        let out = |name: &str, data: Vec<u8>| Tensor {
            name: name.into(),
            datatype: DataType::Int32,
            shape: a.shape.clone(),
            parameters: Parameters::new(),
            data: Bytes::from(data),
        };
        Ok(vec![out("OUTPUT0", sum), out("OUTPUT1", diff)])
    }
}
