//! The gRPC edge: `inference.GRPCInferenceService` (Triton's and KServe's v2 gRPC API) and
//! `grpc.health.v1.Health`, on the same port. Each RPC decodes its message with the
//! protobuf codec (`protocol::grpc`), asks the gateway (`gateway::core` for inference,
//! `gateway::queries` for the rest), and encodes the answer; errors are `GatewayError`s,
//! mapped to gRPC codes in `crate::error`. The service runs on the same hyper server as
//! REST (`server::serve`): TLS, certificate reload, limits and drain are shared.

mod health;
mod infer;
mod model_config;
mod routes;
mod statistics;

use std::pin::Pin;
use std::sync::Arc;

use futures_util::Stream;
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};

use crate::gateway::core::lookup;
use crate::gateway::queries::{self, GATEWAY_EXTENSIONS};
use crate::gateway::Gateway;
use crate::protocol::grpc::pb;

pub use routes::GrpcRoutes;

/// The generated service and client (the client is for tests and tools).
#[allow(clippy::all, missing_docs)]
pub mod service {
    include!(concat!(env!("OUT_DIR"), "/services/inference.rs"));
}

use service::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};

/// The whole gRPC listener's service: inference and health, on one port.
pub fn grpc_service(gw: Arc<Gateway>) -> GrpcRoutes {
    let max = gw.config().limits.max_body_bytes;
    // Compressed requests are accepted, as Triton does; answers go uncompressed (the CPU is
    // better spent elsewhere, and clients on a LAN rarely want it).
    let inference = GrpcInferenceServiceServer::new(GrpcFront {
        gw: gw.clone(),
        max_message: max,
    })
    .max_decoding_message_size(max)
    .max_encoding_message_size(usize::MAX)
    .accept_compressed(CompressionEncoding::Gzip)
    .accept_compressed(CompressionEncoding::Deflate);
    GrpcRoutes::new(inference, health::service(gw), max)
}

pub struct GrpcFront {
    gw: Arc<Gateway>,
    /// `limits.max_body_bytes`, for the words of a too-large message's refusal.
    max_message: usize,
}

fn unimplemented(what: &str) -> Status {
    Status::unimplemented(format!(
        "{what} is not supported by tensorgate: it forwards tensors in the request itself; \
         send inputs as raw_input_contents or typed contents"
    ))
}

/// Shared-memory, trace and log settings belong to each backend, not to the gateway.
fn not_for_a_gateway(what: &str) -> Status {
    Status::unimplemented(format!(
        "{what} is not supported by tensorgate: set it on the backends themselves"
    ))
}

impl GrpcFront {
    /// Checks the bearer token of an RPC that is not a health check.
    fn authorize<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let header = req
            .metadata()
            .get("authorization")
            .and_then(|v| http::HeaderValue::from_bytes(v.as_bytes()).ok());
        self.gw.authorize(header.as_ref()).map_err(|e| e.to_grpc())
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl GrpcInferenceService for GrpcFront {
    async fn server_live(
        &self,
        _: Request<pb::ServerLiveRequest>,
    ) -> Result<Response<pb::ServerLiveResponse>, Status> {
        Ok(Response::new(pb::ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        _: Request<pb::ServerReadyRequest>,
    ) -> Result<Response<pb::ServerReadyResponse>, Status> {
        let ready = queries::server_ready(&self.gw).is_ok();
        Ok(Response::new(pb::ServerReadyResponse { ready }))
    }

    /// As Triton: `ready: false` for a model that is unknown or not ready, not an error.
    async fn model_ready(
        &self,
        req: Request<pb::ModelReadyRequest>,
    ) -> Result<Response<pb::ModelReadyResponse>, Status> {
        let r = req.into_inner();
        let version = Some(r.version.as_str()).filter(|v| !v.is_empty());
        let ready = queries::model_ready(&self.gw, &r.name, version).is_ok();
        Ok(Response::new(pb::ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        req: Request<pb::ServerMetadataRequest>,
    ) -> Result<Response<pb::ServerMetadataResponse>, Status> {
        self.authorize(&req)?;
        Ok(Response::new(pb::ServerMetadataResponse {
            name: self.gw.config().server.name.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            extensions: GATEWAY_EXTENSIONS.iter().map(|e| e.to_string()).collect(),
        }))
    }

    async fn model_metadata(
        &self,
        req: Request<pb::ModelMetadataRequest>,
    ) -> Result<Response<pb::ModelMetadataResponse>, Status> {
        self.authorize(&req)?;
        let r = req.into_inner();
        let version = Some(r.version.as_str()).filter(|v| !v.is_empty());
        let entry = lookup(&self.gw, &r.name, version).map_err(|e| e.to_grpc())?;
        let m = &entry.metadata;
        let tensors = |list: &[crate::protocol::TensorMetadata]| {
            list.iter()
                .map(|t| pb::model_metadata_response::TensorMetadata {
                    name: t.name.clone(),
                    datatype: t.datatype.clone(),
                    shape: t.shape.clone(),
                })
                .collect()
        };
        Ok(Response::new(pb::ModelMetadataResponse {
            name: m.name.clone(),
            versions: m.versions.clone(),
            platform: m.platform.clone(),
            inputs: tensors(&m.inputs),
            outputs: tensors(&m.outputs),
        }))
    }

    async fn model_infer(
        &self,
        req: Request<pb::ModelInferRequest>,
    ) -> Result<Response<pb::ModelInferResponse>, Status> {
        infer::unary(&self.gw, req).await
    }

    type ModelStreamInferStream = BoxStream<pb::ModelStreamInferResponse>;

    async fn model_stream_infer(
        &self,
        req: Request<tonic::Streaming<pb::ModelInferRequest>>,
    ) -> Result<Response<Self::ModelStreamInferStream>, Status> {
        self.authorize(&req)?;
        Ok(Response::new(infer::stream(
            self.gw.clone(),
            req,
            self.max_message,
        )))
    }

    async fn model_config(
        &self,
        req: Request<pb::ModelConfigRequest>,
    ) -> Result<Response<pb::ModelConfigResponse>, Status> {
        self.authorize(&req)?;
        let r = req.into_inner();
        let version = Some(r.version.as_str()).filter(|v| !v.is_empty());
        let entry = lookup(&self.gw, &r.name, version).map_err(|e| e.to_grpc())?;
        let labels = self.gw.labels.load();
        Ok(Response::new(pb::ModelConfigResponse {
            config: Some(model_config::from_metadata(&entry.metadata, &labels)),
        }))
    }

    async fn model_statistics(
        &self,
        req: Request<pb::ModelStatisticsRequest>,
    ) -> Result<Response<pb::ModelStatisticsResponse>, Status> {
        self.authorize(&req)?;
        let r = req.into_inner();
        let model = Some(r.name.as_str()).filter(|v| !v.is_empty());
        let version = Some(r.version.as_str()).filter(|v| !v.is_empty());
        let json = queries::stats(&self.gw, model, version).map_err(|e| e.to_grpc())?;
        Ok(Response::new(statistics::from_json(&json)))
    }

    async fn repository_index(
        &self,
        req: Request<pb::RepositoryIndexRequest>,
    ) -> Result<Response<pb::RepositoryIndexResponse>, Status> {
        self.authorize(&req)?;
        let ready_only = req.get_ref().ready;
        let models = queries::repository_index(&self.gw)
            .into_iter()
            .filter(|e| !ready_only || e.ready)
            .map(|e| pb::repository_index_response::ModelIndex {
                state: e.state().to_string(),
                name: e.name,
                version: e.version.unwrap_or_default(),
                reason: String::new(),
            })
            .collect();
        Ok(Response::new(pb::RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        req: Request<pb::RepositoryModelLoadRequest>,
    ) -> Result<Response<pb::RepositoryModelLoadResponse>, Status> {
        self.authorize(&req)?;
        Err(not_for_a_gateway("RepositoryModelLoad"))
    }

    async fn repository_model_unload(
        &self,
        req: Request<pb::RepositoryModelUnloadRequest>,
    ) -> Result<Response<pb::RepositoryModelUnloadResponse>, Status> {
        self.authorize(&req)?;
        Err(not_for_a_gateway("RepositoryModelUnload"))
    }

    async fn system_shared_memory_status(
        &self,
        _: Request<pb::SystemSharedMemoryStatusRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryStatusResponse>, Status> {
        Err(unimplemented("system shared memory"))
    }

    async fn system_shared_memory_register(
        &self,
        _: Request<pb::SystemSharedMemoryRegisterRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryRegisterResponse>, Status> {
        Err(unimplemented("system shared memory"))
    }

    async fn system_shared_memory_unregister(
        &self,
        _: Request<pb::SystemSharedMemoryUnregisterRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryUnregisterResponse>, Status> {
        Err(unimplemented("system shared memory"))
    }

    async fn cuda_shared_memory_status(
        &self,
        _: Request<pb::CudaSharedMemoryStatusRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryStatusResponse>, Status> {
        Err(unimplemented("CUDA shared memory"))
    }

    async fn cuda_shared_memory_register(
        &self,
        _: Request<pb::CudaSharedMemoryRegisterRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryRegisterResponse>, Status> {
        Err(unimplemented("CUDA shared memory"))
    }

    async fn cuda_shared_memory_unregister(
        &self,
        _: Request<pb::CudaSharedMemoryUnregisterRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryUnregisterResponse>, Status> {
        Err(unimplemented("CUDA shared memory"))
    }

    async fn trace_setting(
        &self,
        _: Request<pb::TraceSettingRequest>,
    ) -> Result<Response<pb::TraceSettingResponse>, Status> {
        Err(not_for_a_gateway("TraceSetting"))
    }

    async fn log_settings(
        &self,
        _: Request<pb::LogSettingsRequest>,
    ) -> Result<Response<pb::LogSettingsResponse>, Status> {
        Err(not_for_a_gateway("LogSettings"))
    }
}
