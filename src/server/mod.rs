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
use crate::tls::ReloadableTls;

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

/// How connections are served.
#[derive(Clone)]
pub struct ServeOptions {
    /// TLS for every connection, reloadable; `None` serves plain HTTP.
    pub tls: Option<Arc<ReloadableTls>>,
    /// Time for a request head (and the TLS handshake); also bounds idle HTTP/1 keep-alive.
    pub header_read_timeout: Duration,
    /// Largest request head, HTTP/1 and h2.
    pub max_header_bytes: usize,
    /// How long in-flight requests may take to finish after shutdown begins.
    pub drain: Duration,
}

impl ServeOptions {
    pub fn plain(drain: Duration) -> Self {
        ServeOptions {
            tls: None,
            header_read_timeout: Duration::from_secs(30),
            max_header_bytes: 64 << 10,
            drain,
        }
    }
}

/// Serves connections from `listener` with `service` until `shutdown` resolves, then lets
/// in-flight requests finish for up to `options.drain`.
pub async fn serve<S, ResBody>(
    listener: TcpListener,
    service: S,
    shutdown: impl Future<Output = ()>,
    options: ServeOptions,
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
        .header_read_timeout(options.header_read_timeout)
        // hyper's floor for its read buffer is 8 KiB.
        .max_buf_size(options.max_header_bytes.max(8192))
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(options.max_header_bytes.min(u32::MAX as usize) as u32)
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let watcher = graceful.watcher();
                let builder = builder.clone();
                let service = TowerToHyperService::new(service.clone());
                let tls = options.tls.as_ref().map(|t| t.acceptor());
                let handshake_timeout = options.header_read_timeout;
                // The handshake runs in the connection's task, so a slow client cannot
                // stall the accept loop.
                tokio::spawn(async move {
                    let result = match tls {
                        None => {
                            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                            watcher.watch(conn.into_owned()).await
                        }
                        Some(acceptor) => {
                            let stream = match tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await {
                                Ok(Ok(s)) => s,
                                Ok(Err(e)) => {
                                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                                    return;
                                }
                                Err(_) => {
                                    tracing::debug!(%peer, "TLS handshake timed out");
                                    return;
                                }
                            };
                            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                            watcher.watch(conn.into_owned()).await
                        }
                    };
                    if let Err(e) = result {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                });
            }
            _ = &mut shutdown => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(options.drain, graceful.shutdown())
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
    with_layers(GatewayService(gw))
}

/// Turns a caught panic into a response.
type PanicHandler = fn(Box<dyn std::any::Any + Send + 'static>) -> Response<Body>;

/// The service `with_layers` builds around `S`.
pub type Layered<S> = tower_http::catch_panic::CatchPanic<
    tower_http::compression::Compression<tower_http::decompression::RequestDecompression<S>>,
    PanicHandler,
>;

/// The layers around the gateway, applied to any inner service (tests use a failing one).
pub fn with_layers<S>(inner: S) -> Layered<S> {
    ServiceBuilder::new()
        .layer(CatchPanicLayer::custom(panic_response as PanicHandler))
        .layer(CompressionLayer::new())
        .layer(RequestDecompressionLayer::new().pass_through_unaccepted(true))
        .service(inner)
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

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;
    use http_body_util::BodyExt;
    use tower::{Service, ServiceExt};

    #[tokio::test]
    async fn a_panic_becomes_a_500_for_that_request_only() {
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let inner = {
            let calls = calls.clone();
            tower::service_fn(
                move |req: Request<
                    tower_http::decompression::DecompressionBody<http_body_util::Empty<Bytes>>,
                >| {
                    let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    async move {
                        if req.uri().path() == "/boom" {
                            panic!("a bug in one request's handling (call {n})");
                        }
                        Ok::<_, Infallible>(crate::body::json_response(
                            StatusCode::OK,
                            &serde_json::json!({"ok": true}),
                        ))
                    }
                },
            )
        };
        let mut svc = with_layers(inner);
        let req = |p: &str| {
            Request::get(p)
                .body(http_body_util::Empty::<Bytes>::new())
                .unwrap()
        };
        let r = svc.ready().await.unwrap().call(req("/boom")).await.unwrap();
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(r.headers()[http::header::CONTENT_TYPE], "application/json");
        let body = r.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            &body[..],
            br#"{"error":"internal error while handling this request"}"#
        );
        // The same service keeps serving.
        let r = svc.ready().await.unwrap().call(req("/fine")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    }
}
