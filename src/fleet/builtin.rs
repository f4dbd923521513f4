//! The in-process backend: the built-in models, called directly with decoded requests.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::backend::{
    Backend, BackendError, BoxFuture, DiscoveredModel, InferCall, Payload, Reply,
};
use crate::models::{Model, ModelError};
use crate::protocol::metadata::extensions;
use crate::protocol::{InferResponse, Parameters, ServerMetadata};

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
        _hint: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<DiscoveredModel>, BackendError>> {
        Box::pin(async move {
            Ok(self
                .models
                .values()
                .map(|m| DiscoveredModel {
                    metadata: m.metadata().clone(),
                    ready: true,
                })
                .collect())
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
