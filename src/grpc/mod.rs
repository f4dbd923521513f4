//! The gRPC edge: `inference.GRPCInferenceService` (Triton's and KServe's v2 gRPC API) and
//! `grpc.health.v1.Health`, on the same port. Each RPC decodes its message with the
//! protobuf codec (`protocol::grpc`), asks the gateway (`gateway::core` for inference,
//! `gateway::queries` for the rest), and encodes the answer; errors are `GatewayError`s,
//! mapped to gRPC codes in `crate::error`, but for the few statuses tonic's framing and the
//! shutdown make here (`routes`, `infer`). The service runs on the same hyper server as
//! REST (`server::serve`): TLS, certificate reload, limits and drain are shared.

mod body;
pub mod codec;
mod decode;
mod health;
mod infer;
mod inflated_messages;
mod only_grpc;
mod raw_stream;
mod routes;
mod rpc_log;
mod statistics;
mod stream_end;
mod unary;
mod whole_messages;

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use tonic::body::Body;
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};
use tower_http::catch_panic::{CatchPanic, CatchPanicLayer};
use tower_http::request_id::{PropagateRequestId, PropagateRequestIdLayer};

use crate::error::GatewayError;
use crate::gateway::core::lookup;
use crate::gateway::layers::{Auth, AuthLayer, Policy, Shed, ShedLayer};
use crate::gateway::queries::RepositoryAction;
use crate::gateway::Gateway;
use crate::gateway::{model_config, queries};
use crate::protocol::grpc::pb;

use only_grpc::OnlyGrpc;
pub use routes::GrpcRoutes;

/// The generated service and client (the client is for tests and tools).
#[allow(clippy::all, missing_docs)]
pub mod service {
    include!(concat!(env!("OUT_DIR"), "/services/inference.rs"));
}

use service::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};

/// The whole gRPC listener's service: inference and health on one port, behind the layers
/// every listener shares (request id, auth, shedding), for gRPC requests only.
pub type GrpcService = CatchPanic<
    OnlyGrpc<PropagateRequestId<Auth<Shed<GrpcRoutes, GrpcPolicy>, GrpcPolicy>>>,
    PanicHandler,
>;

/// Turns a caught panic into a gRPC answer.
type PanicHandler = fn(Box<dyn std::any::Any + Send + 'static>) -> http::Response<Body>;

/// A request message that leaves the model's name (its `field`) out is the client's error,
/// not an unknown model named "". REST's paths always name one.
pub(crate) fn required(field: &str, name: &str) -> Result<(), GatewayError> {
    if name.is_empty() {
        return Err(GatewayError::BadRequest(format!("{field} is required")));
    }
    Ok(())
}

/// A handler that panicked (our bug) answers INTERNAL for that RPC alone, as REST answers
/// 500; without this the stream would be reset with no status and no log line.
fn panicked(panic: Box<dyn std::any::Any + Send + 'static>) -> http::Response<Body> {
    tracing::error!(
        panic = crate::error::panic_message(&*panic),
        "an RPC handler panicked; answered INTERNAL"
    );
    Status::internal(crate::error::PANICKED).into_http()
}

const SERVICE: &str = "/inference.GRPCInferenceService/";

/// gRPC's part in the shared layers: the health RPCs need no token and are never shed;
/// inference takes its permit once its message has arrived (`infer`: a unary call after
/// reading it, a stream per message) rather than while a client may still be sending, or
/// not: a permit held by a message that never comes would shed everyone else; a refusal is
/// a gRPC status, counted and logged like any RPC.
#[derive(Clone, Copy)]
pub struct GrpcPolicy {
    /// Also let ModelInfer and ModelStreamInfer through (the shedding layer).
    inference_exempt: bool,
}

fn is_health(path: &str) -> bool {
    path.starts_with("/grpc.health.v1.Health/")
        || path
            .strip_prefix(SERVICE)
            .is_some_and(|m| matches!(m, "ServerLive" | "ServerReady" | "ModelReady"))
}

impl Policy for GrpcPolicy {
    type Body = Body;

    fn exempt(&self, path: &str) -> bool {
        is_health(path)
            || (self.inference_exempt && (path == infer::STREAM_PATH || path == infer::INFER_PATH))
    }

    fn deny(
        &self,
        gw: &Gateway,
        path: &str,
        extensions: &http::Extensions,
        e: GatewayError,
    ) -> http::Response<Body> {
        let peer = crate::gateway::observe::PeerAddr::of(extensions);
        infer::observe_refusal(gw, path, peer, &e);
        e.to_grpc().into_http()
    }
}

pub fn grpc_service(gw: Arc<Gateway>) -> GrpcService {
    let routes = routes_for(gw.clone());
    tower::ServiceBuilder::new()
        .layer(CatchPanicLayer::custom(panicked as PanicHandler))
        .layer(tower::layer::layer_fn(OnlyGrpc))
        .layer(PropagateRequestIdLayer::new(crate::headers::REQUEST_ID))
        .layer(AuthLayer::auth(
            gw.clone(),
            GrpcPolicy {
                inference_exempt: false,
            },
        ))
        .layer(ShedLayer::shed(
            gw,
            GrpcPolicy {
                inference_exempt: true,
            },
        ))
        .service(routes)
}

fn routes_for(gw: Arc<Gateway>) -> GrpcRoutes {
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
    let body_timeout = Duration::from_millis(gw.config().limits.body_read_timeout_ms);
    GrpcRoutes::new(
        gw.clone(),
        inference,
        health::service(gw),
        max,
        body_timeout,
    )
}

/// `limits.stream_idle_timeout_ms`, read per stream, so that a reload applies to the
/// streams opened after it; 0: none.
fn stream_idle(gw: &Gateway) -> Option<Duration> {
    Some(gw.config().limits.stream_idle_timeout_ms)
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis)
}

pub struct GrpcFront {
    gw: Arc<Gateway>,
    /// `limits.max_body_bytes`, for the words of a too-large message's refusal.
    max_message: usize,
}

impl GrpcFront {
    /// A load or unload across the fleet (`queries::control`): OK when every backend with a
    /// repository did it; INVALID_ARGUMENT when every one refused it (no such model, a model
    /// that cannot load); otherwise INTERNAL; the message names each backend that failed.
    async fn control<'a>(
        &self,
        model: &str,
        action: RepositoryAction,
        parameters: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), Status> {
        required("model_name", model).map_err(|e| e.to_grpc())?;
        let report = queries::control(&self.gw, model, action, parameters)
            .await
            .map_err(|e| e.to_grpc())?;
        match report.error(model, action) {
            None => Ok(()),
            Some(message) if report.refused => Err(Status::invalid_argument(message)),
            Some(message) => Err(Status::internal(message)),
        }
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
        _: Request<pb::ServerMetadataRequest>,
    ) -> Result<Response<pb::ServerMetadataResponse>, Status> {
        Ok(Response::new(pb::ServerMetadataResponse {
            name: self.gw.config().server.name.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            extensions: queries::extensions(&self.gw)
                .iter()
                .map(|e| e.to_string())
                .collect(),
        }))
    }

    async fn model_metadata(
        &self,
        req: Request<pb::ModelMetadataRequest>,
    ) -> Result<Response<pb::ModelMetadataResponse>, Status> {
        let r = req.into_inner();
        required("name", &r.name).map_err(|e| e.to_grpc())?;
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

    /// Served by `raw_stream`, which decodes each message itself; this, tonic's generated
    /// path, serves the same stream from messages tonic decoded (a client of the service
    /// without `GrpcRoutes` in front).
    async fn model_stream_infer(
        &self,
        req: Request<tonic::Streaming<pb::ModelInferRequest>>,
    ) -> Result<Response<Self::ModelStreamInferStream>, Status> {
        use futures_util::StreamExt;
        let req = req.map(|messages| messages.map(|m| m.map(infer::Incoming::Decoded)));
        Ok(Response::new(infer::stream(
            self.gw.clone(),
            req,
            self.max_message,
            stream_idle(&self.gw),
        )))
    }

    async fn model_config(
        &self,
        req: Request<pb::ModelConfigRequest>,
    ) -> Result<Response<pb::ModelConfigResponse>, Status> {
        let r = req.into_inner();
        required("name", &r.name).map_err(|e| e.to_grpc())?;
        let version = Some(r.version.as_str()).filter(|v| !v.is_empty());
        let config =
            model_config::model_config(&self.gw, &r.name, version).map_err(|e| e.to_grpc())?;
        Ok(Response::new(pb::ModelConfigResponse {
            config: Some(config),
        }))
    }

    async fn model_statistics(
        &self,
        req: Request<pb::ModelStatisticsRequest>,
    ) -> Result<Response<pb::ModelStatisticsResponse>, Status> {
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
        let ready_only = req.get_ref().ready;
        let models = queries::repository_index(&self.gw)
            .into_iter()
            .filter(|e| !ready_only || e.ready())
            .map(|e| pb::repository_index_response::ModelIndex {
                state: e.state.to_string(),
                name: e.name,
                version: e.version.unwrap_or_default(),
                reason: e.reason,
            })
            .collect();
        Ok(Response::new(pb::RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        req: Request<pb::RepositoryModelLoadRequest>,
    ) -> Result<Response<pb::RepositoryModelLoadResponse>, Status> {
        let r = req.get_ref();
        let names = r.parameters.keys().map(String::as_str);
        self.control(&r.model_name, RepositoryAction::Load, names)
            .await?;
        Ok(Response::new(pb::RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        req: Request<pb::RepositoryModelUnloadRequest>,
    ) -> Result<Response<pb::RepositoryModelUnloadResponse>, Status> {
        let r = req.get_ref();
        let names = r.parameters.keys().map(String::as_str);
        self.control(&r.model_name, RepositoryAction::Unload, names)
            .await?;
        Ok(Response::new(pb::RepositoryModelUnloadResponse {}))
    }

    async fn system_shared_memory_status(
        &self,
        _: Request<pb::SystemSharedMemoryStatusRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryStatusResponse>, Status> {
        Err(GatewayError::shared_memory("system shared memory").to_grpc())
    }

    async fn system_shared_memory_register(
        &self,
        _: Request<pb::SystemSharedMemoryRegisterRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryRegisterResponse>, Status> {
        Err(GatewayError::shared_memory("system shared memory").to_grpc())
    }

    async fn system_shared_memory_unregister(
        &self,
        _: Request<pb::SystemSharedMemoryUnregisterRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryUnregisterResponse>, Status> {
        Err(GatewayError::shared_memory("system shared memory").to_grpc())
    }

    async fn cuda_shared_memory_status(
        &self,
        _: Request<pb::CudaSharedMemoryStatusRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryStatusResponse>, Status> {
        Err(GatewayError::shared_memory("CUDA shared memory").to_grpc())
    }

    async fn cuda_shared_memory_register(
        &self,
        _: Request<pb::CudaSharedMemoryRegisterRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryRegisterResponse>, Status> {
        Err(GatewayError::shared_memory("CUDA shared memory").to_grpc())
    }

    async fn cuda_shared_memory_unregister(
        &self,
        _: Request<pb::CudaSharedMemoryUnregisterRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryUnregisterResponse>, Status> {
        Err(GatewayError::shared_memory("CUDA shared memory").to_grpc())
    }

    async fn trace_setting(
        &self,
        _: Request<pb::TraceSettingRequest>,
    ) -> Result<Response<pb::TraceSettingResponse>, Status> {
        Err(GatewayError::backend_setting("trace settings").to_grpc())
    }

    async fn log_settings(
        &self,
        _: Request<pb::LogSettingsRequest>,
    ) -> Result<Response<pb::LogSettingsResponse>, Status> {
        Err(GatewayError::backend_setting("log settings").to_grpc())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handler's panic answers that RPC INTERNAL, in a trailers-only answer gRPC clients read.
    #[test]
    fn a_panic_is_an_internal_status() {
        let r = panicked(Box::new("a bug in a handler"));
        assert_eq!(r.status(), http::StatusCode::OK);
        assert_eq!(r.headers()["grpc-status"], "13");
        // Percent-encoded on the wire, as gRPC's spec has it.
        assert_eq!(
            r.headers()["grpc-message"],
            "internal%20error%20while%20handling%20this%20request"
        );
    }
}
