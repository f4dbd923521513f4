//! One port for the inference service and the health service: a request goes to the one
//! whose package its path names. Unknown services answer UNIMPLEMENTED, as gRPC servers do.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use tonic::body::Body;
use tonic::server::NamedService;

use super::health::HealthServer;
use super::service::grpc_inference_service_server::GrpcInferenceServiceServer;
use super::GrpcFront;
use crate::body::BoxError;

#[derive(Clone)]
pub struct GrpcRoutes {
    inference: GrpcInferenceServiceServer<GrpcFront>,
    health: HealthServer,
}

impl GrpcRoutes {
    pub(super) fn new(
        inference: GrpcInferenceServiceServer<GrpcFront>,
        health: HealthServer,
    ) -> Self {
        GrpcRoutes { inference, health }
    }
}

/// `/<service>/<method>` names its service.
fn service_of(path: &str) -> &str {
    path.trim_start_matches('/').split('/').next().unwrap_or("")
}

impl<B> tower::Service<Request<B>> for GrpcRoutes
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        use tower::ServiceExt;
        let service = service_of(req.uri().path()).to_string();
        if service == <GrpcInferenceServiceServer<GrpcFront> as NamedService>::NAME {
            let svc = self.inference.clone();
            Box::pin(async move { svc.oneshot(req).await })
        } else if service == <HealthServer as NamedService>::NAME {
            let svc = self.health.clone();
            Box::pin(async move { svc.oneshot(req).await })
        } else {
            let status = tonic::Status::unimplemented(format!(
                "tensorgate serves inference.GRPCInferenceService and grpc.health.v1.Health, not '{service}'"
            ));
            Box::pin(async move { Ok(status.into_http()) })
        }
    }
}
