//! The in-process backend: the built-in models, called directly with decoded requests.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::backend::{
    Backend, BackendError, BoxFuture, DiscoveredModel, InferCall, ModelList, Payload, Reply,
};
use crate::models::{Model, ModelError};
use crate::protocol::metadata::extensions;
use crate::protocol::{InferResponse, Parameters, Role, ServerMetadata};

pub struct BuiltinBackend {
    models: BTreeMap<String, Arc<dyn Model>>,
}

impl BuiltinBackend {
    pub fn new(models: BTreeMap<String, Arc<dyn Model>>) -> Self {
        BuiltinBackend { models }
    }
}

impl Backend for BuiltinBackend {
    fn in_process(&self) -> bool {
        true
    }

    fn server_metadata(&self) -> BoxFuture<'_, Result<ServerMetadata, BackendError>> {
        Box::pin(async {
            Ok(ServerMetadata {
                name: "tensorgate-builtin".into(),
                version: env!("CARGO_PKG_VERSION").into(),
                extensions: vec![
                    extensions::BINARY_TENSOR_DATA.into(),
                    extensions::SEQUENCE.into(),
                ],
            })
        })
    }

    fn models<'a>(
        &'a self,
        _configured: &'a [String],
    ) -> BoxFuture<'a, Result<ModelList, BackendError>> {
        Box::pin(async move {
            let models = self
                .models
                .values()
                .map(|m| DiscoveredModel {
                    metadata: m.metadata().clone(),
                    ready: true,
                })
                .collect();
            Ok(ModelList {
                models,
                tried: "the built-in backend was configured with no models".into(),
                tolerated: vec![],
            })
        })
    }

    fn ready(&self) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async { Ok(()) })
    }

    fn infer<'a>(&'a self, call: InferCall<'a>) -> BoxFuture<'a, Result<Reply, BackendError>> {
        Box::pin(async move {
            let Payload::Decoded(req) = call.payload else {
                return Err(BackendError::Failed(
                    "the built-in backend takes decoded requests".into(),
                ));
            };
            let model = self
                .models
                .get(call.model)
                .ok_or_else(|| BackendError::Rejected(format!("unknown model '{}'", call.model)))?;
            let outputs = model.infer(&req).map_err(|e| match e {
                ModelError::Invalid(m) => BackendError::Rejected(m),
            })?;
            // The one place tensors enter the gateway without having been decoded: checked
            // here, once, so that encoding and classification can rely on them.
            for t in &outputs {
                t.check_consistent().map_err(|e| {
                    BackendError::Broken(format!(
                        "model '{}': {}",
                        call.model,
                        e.in_tensor(Role::Output, &t.name)
                    ))
                })?;
            }
            Ok(Reply::Decoded(InferResponse {
                id: req.id.clone(),
                model_name: call.model.to_string(),
                model_version: Some(call.version.unwrap_or("1").to_string()),
                parameters: Parameters::new(),
                outputs,
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::protocol::{DataType, InferRequest, ModelMetadata, Tensor};

    /// A model with a bug: its FP32 [2] output carries one element's bytes.
    struct Broken(ModelMetadata);

    impl Model for Broken {
        fn metadata(&self) -> &ModelMetadata {
            &self.0
        }
        fn infer(&self, _: &InferRequest) -> Result<Vec<Tensor>, ModelError> {
            Ok(vec![Tensor {
                name: "OUT".into(),
                datatype: DataType::Fp32,
                shape: vec![2],
                parameters: Parameters::new(),
                data: Bytes::from_static(&[0; 4]),
            }])
        }
    }

    #[tokio::test]
    async fn an_output_that_contradicts_its_shape_is_the_servers_fault() {
        let metadata = crate::models::metadata("broken", vec![], vec![]);
        let backend = BuiltinBackend::new(BTreeMap::from([(
            "broken".to_string(),
            Arc::new(Broken(metadata)) as Arc<dyn Model>,
        )]));
        let call = InferCall {
            model: "broken",
            version: None,
            payload: Payload::Decoded(InferRequest {
                id: None,
                parameters: Parameters::new(),
                options: Default::default(),
                inputs: vec![],
                outputs: None,
            }),
            headers: Default::default(),
        };
        match backend.infer(call).await {
            Err(BackendError::Broken(m)) => assert_eq!(
                m,
                "model 'broken': output 'OUT': inconsistent tensor: shape [2] of FP32 needs 8 bytes, data has 4"
            ),
            other => panic!("expected Broken, got {:?}", other.map(|_| ())),
        }
    }
}
