//! The listeners: the v2 REST server (a tower stack around the gateway) and the metrics
//! server, with HTTP/1.1 and h2 and graceful shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::compression::CompressionLayer;
use tower_http::decompression::RequestDecompressionLayer;

use crate::body::{error_response, full, Body, BoxError};
use crate::error::GatewayError;
use crate::gateway::Gateway;

/// The innermost service: hands each request to the gateway.
#[derive(Clone)]
pub struct GatewayService(pub Arc<Gateway>);

impl<B> tower::Service<Request<B>> for GatewayService
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let gw = self.0.clone();
        Box::pin(async move { Ok(gw.handle(req).await) })
    }
}

fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> Response<Body> {
    tracing::error!("a request handler panicked; answered 500");
    error_response(&GatewayError::Internal(
        "internal error while handling this request".into(),
    ))
}

/// Serves connections from `listener` with `make_service` until `shutdown` resolves, then
/// lets in-flight requests finish for up to `drain`.
pub async fn serve<S, ResBody>(
    listener: TcpListener,
    service: S,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) where
    S: tower::Service<Request<Incoming>, Response = Response<ResBody>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30))
        .keep_alive(true);
    builder.http2().timer(TokioTimer::new());
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), TowerToHyperService::new(service.clone()));
                let conn = graceful.watch(conn.into_owned());
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("drain deadline passed with connections still open");
    }
}

/// The v2 REST service: panics become 500s, bodies are (de)compressed, then the gateway.
pub fn gateway_service(
    gw: Arc<Gateway>,
) -> impl tower::Service<
    Request<Incoming>,
    Response = Response<
        impl http_body::Body<Data = Bytes, Error = impl Into<BoxError>> + Send + 'static,
    >,
    Error = Infallible,
    Future = impl Send + 'static,
> + Clone
       + Send
       + Sync
       + 'static {
    ServiceBuilder::new()
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(CompressionLayer::new())
        .layer(RequestDecompressionLayer::new().pass_through_unaccepted(true))
        .service(GatewayService(gw))
}

/// The metrics listener's service: `GET /metrics`.
pub fn metrics_service(
    gw: Arc<Gateway>,
) -> impl tower::Service<
    Request<Incoming>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Send + 'static,
> + Clone
       + Send
       + Sync
       + 'static {
    tower::service_fn(move |req: Request<Incoming>| {
        let gw = gw.clone();
        async move {
            let resp = if req.uri().path() == "/metrics" {
                gw.update_gauges();
                let metrics = &gw.metrics;
                Response::builder()
                    .header(
                        http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )
                    .body(full(metrics.render()))
                    .expect("valid response")
            } else {
                error_response(&GatewayError::NotFound(format!(
                    "no such endpoint: {}",
                    req.uri().path()
                )))
            };

            Ok::<_, Infallible>(resp)
        }
    })
}
