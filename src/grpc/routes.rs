//! One port for the inference service and the health service: a request goes to the one
//! whose package its path names. Unknown services answer UNIMPLEMENTED, as gRPC servers do.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use tonic::body::Body;
use tonic::server::NamedService;

use super::body::BoundedBody;
use super::health::HealthServer;
use super::service::grpc_inference_service_server::GrpcInferenceServiceServer;
use super::whole_messages::WholeMessages;
use super::GrpcFront;
use crate::body::BoxError;
use crate::gateway::Gateway;

#[derive(Clone)]
pub struct GrpcRoutes {
    gw: Arc<Gateway>,
    inference: GrpcInferenceServiceServer<GrpcFront>,
    health: HealthServer,
    /// `limits.max_body_bytes`, the largest message the inference service decodes.
    max_message: usize,
    /// `limits.body_read_timeout_ms`, for the message of a unary call.
    body_timeout: Duration,
}

/// Health calls need no token, so their messages, which are empty, may not be large.
const HEALTH_MESSAGE_LIMIT: usize = 64 << 10;

impl GrpcRoutes {
    pub(super) fn new(
        gw: Arc<Gateway>,
        inference: GrpcInferenceServiceServer<GrpcFront>,
        health: HealthServer,
        max_message: usize,
        body_timeout: Duration,
    ) -> Self {
        GrpcRoutes {
            gw,
            inference,
            health,
            max_message,
            body_timeout,
        }
    }

    /// The bounds a request's body gets: a deadline unless it is a stream, and a small size
    /// for the health calls.
    fn bounded<B>(&self, req: Request<B>) -> Request<BoundedBody<B>> {
        let path = req.uri().path();
        let stream = path == super::infer::STREAM_PATH || path.ends_with("/Watch");
        let limit = super::is_health(path).then_some(HEALTH_MESSAGE_LIMIT);
        let timeout = (!stream).then_some(self.body_timeout);
        req.map(|b| BoundedBody::new(b, timeout, limit))
    }
}

/// Why a request message was refused for its size, whoever read it (tonic or
/// `unary::model_infer`).
pub(super) fn message_too_large(max: usize, decompressed: bool) -> String {
    let which = if decompressed {
        "the request message, decompressed,"
    } else {
        "the request message"
    };
    format!("{which} is larger than the limit of {max} bytes (limits.max_body_bytes)")
}

/// tonic refuses some requests before any handler sees them: a message over its decoding
/// limit (OUT_OF_RANGE) and one that is not protobuf (INTERNAL). Both are the client's
/// doing: RESOURCE_EXHAUSTED, as for every other limit of the gateway, and INVALID_ARGUMENT.
pub(super) fn as_client_error(status: tonic::Status, max: usize) -> tonic::Status {
    let message = status.message();
    match status.code() {
        _ if message.starts_with("Error decompressing: size limit") => {
            tonic::Status::resource_exhausted(message_too_large(max, true))
        }
        tonic::Code::OutOfRange
            if message.starts_with("Error, decoded message length too large") =>
        {
            tonic::Status::resource_exhausted(message_too_large(max, false))
        }
        tonic::Code::Internal
            if message.starts_with("failed to decode Protobuf message")
                || message.starts_with("Error decompressing")
                || message.starts_with("Missing request message")
                // A body that ends inside a message (a cut-off frame header or payload).
                || message.starts_with("Unexpected EOF decoding stream")
                // A compression flag that is invalid, or set without a `grpc-encoding`.
                || message.starts_with("protocol error: received message with") =>
        {
            tonic::Status::invalid_argument(format!("the request message is not valid: {message}"))
        }
        _ => status,
    }
}

/// The same, for a refusal tonic answered as a whole (trailers-only) response.
fn client_errors_as_such(response: Response<Body>, max: usize) -> Response<Body> {
    match tonic::Status::from_header_map(response.headers()) {
        Some(status) if status.code() != tonic::Code::Ok => {
            let mapped = as_client_error(status.clone(), max);
            if mapped.code() == status.code() {
                response
            } else {
                mapped.into_http()
            }
        }
        _ => response,
    }
}

/// tonic answers a method its service lacks with UNIMPLEMENTED and no message; say which.
fn named_if_unknown(response: Response<Body>, path: &str) -> Response<Body> {
    match tonic::Status::from_header_map(response.headers()) {
        Some(s) if s.code() == tonic::Code::Unimplemented && s.message().is_empty() => {
            let method = path.rsplit('/').next().unwrap_or_default();
            tonic::Status::unimplemented(format!(
                "inference.GRPCInferenceService has no method '{method}'"
            ))
            .into_http()
        }
        _ => response,
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
        let req = self.bounded(req);
        // Inference writes its own access line; every other RPC gets one here.
        let line = (req.uri().path() != super::infer::STREAM_PATH).then(|| {
            super::rpc_log::Line::new(
                req.uri().path(),
                req.headers(),
                crate::gateway::observe::PeerAddr::of(req.extensions()),
            )
        });
        let log = move |response: Response<Body>| match line {
            Some(line) => line.on(response),
            None => response,
        };
        if super::unary::handles(&req) {
            let (gw, max) = (self.gw.clone(), self.max_message);
            Box::pin(async move { Ok(super::unary::model_infer(gw, req, max).await) })
        } else if service == <GrpcInferenceServiceServer<GrpcFront> as NamedService>::NAME {
            let (svc, max) = (self.inference.clone(), self.max_message);
            let path = req.uri().path().to_string();
            let held = self.gw.bodies.reserve();
            // A unary call's whole body has its deadline (`bounded`); a stream's messages
            // each have one of the same length.
            let timeout = self.body_timeout;
            let req = req.map(|b| {
                WholeMessages::new(b, max)
                    .counted(held)
                    .message_deadline(timeout)
            });
            let gw = self.gw.clone();
            Box::pin(async move {
                let response = if path == super::infer::STREAM_PATH {
                    super::raw_stream::model_stream_infer(gw, req, max).await
                } else {
                    svc.oneshot(req).await?
                };
                Ok(log(named_if_unknown(
                    client_errors_as_such(response, max),
                    &path,
                )))
            })
        } else if service == <HealthServer as NamedService>::NAME {
            let svc = self.health.clone();
            let req = req.map(|b| WholeMessages::new(b, HEALTH_MESSAGE_LIMIT));
            Box::pin(async move { Ok(log(svc.oneshot(req).await?)) })
        } else {
            let status = tonic::Status::unimplemented(format!(
                "tensorgate serves inference.GRPCInferenceService and grpc.health.v1.Health, not '{service}'"
            ));
            Box::pin(async move { Ok(log(status.into_http())) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_method_is_named() {
        let answer = named_if_unknown(
            tonic::Status::unimplemented("").into_http(),
            "/inference.GRPCInferenceService/NoSuchMethod",
        );
        let status = tonic::Status::from_header_map(answer.headers()).unwrap();
        assert_eq!(status.code(), tonic::Code::Unimplemented);
        assert_eq!(
            status.message(),
            "inference.GRPCInferenceService has no method 'NoSuchMethod'"
        );
        // Other answers pass as they are.
        let kept = named_if_unknown(
            tonic::Status::unimplemented("shared memory is not supported").into_http(),
            "/inference.GRPCInferenceService/SystemSharedMemoryStatus",
        );
        let status = tonic::Status::from_header_map(kept.headers()).unwrap();
        assert_eq!(status.message(), "shared memory is not supported");
    }
}
