//! `identity_<type>`: INPUT0 [-1,-1] comes back unchanged as OUTPUT0, for each datatype.

use super::{input, metadata, tensor_meta, Model, ModelError};
use crate::protocol::{DataType, InferRequest, ModelMetadata, Tensor};

pub struct Identity {
    meta: ModelMetadata,
}

impl Identity {
    pub fn name_for(dt: DataType) -> String {
        format!("identity_{}", dt.as_str().to_ascii_lowercase())
    }

    pub fn new(dt: DataType) -> Self {
        Identity {
            meta: metadata(
                &Self::name_for(dt),
                vec![tensor_meta("INPUT0", dt, &[-1, -1])],
                vec![tensor_meta("OUTPUT0", dt, &[-1, -1])],
            ),
        }
    }
}

impl Model for Identity {
    fn metadata(&self) -> &ModelMetadata {
        &self.meta
    }

    fn infer(&self, req: &InferRequest) -> Result<Vec<Tensor>, ModelError> {
        let x = input(req, "INPUT0")?;
        // The output shares the input's buffer: no copy.
        Ok(vec![Tensor {
            name: "OUTPUT0".into(),
            parameters: Default::default(),
            ..x.clone()
        }])
    }
}
