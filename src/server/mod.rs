//! The listeners: `serve` runs any tower service (the v2 REST stack, the gRPC service, the
//! metrics endpoint) over plain TCP or TLS, with HTTP/1.1 and h2, limits and graceful
//! shutdown; the REST stack's outer layers (`with_layers`) are built here too.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{timeout_at, Instant};
use tower::ServiceBuilder;
use tower_http::add_extension::AddExtension;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::compression::predicate::{And, DefaultPredicate, Predicate};
use tower_http::compression::CompressionLayer;
use tower_http::request_id::{PropagateRequestId, PropagateRequestIdLayer};

use crate::body::{error_response, full, Body, BoxError};
use crate::error::GatewayError;
use crate::gateway::observe::PeerAddr;
use crate::gateway::Gateway;
use crate::tls::ReloadableTls;

mod conn;
mod content_coding;
mod drain;
mod idle;
mod plain_on_tls;
mod send_timeout;

use content_coding::CanonicalCoding;

use drain::{Drain, Watch};

/// The innermost service: hands each request to the gateway. Made for each connection
/// (`gateway_service`), so that the peer's address reaches the access log without an
/// extension map allocated for every request.
#[derive(Clone)]
pub struct GatewayService {
    pub gw: Arc<Gateway>,
    pub peer: Option<SocketAddr>,
}

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
        let gw = self.gw.clone();
        let peer = self.peer;
        let http1 = req.version() < http::Version::HTTP_2;
        let head = req.method() == http::Method::HEAD;
        Box::pin(async move {
            let mut response = crate::rest::handle(gw.clone(), peer, req).await;
            if head && !http1 {
                head_over_h2(&mut response);
            }
            // While draining (before the listener closes, during limits.shutdown_delay_ms),
            // tell HTTP/1 clients to stop reusing the connection. Each then closes after its
            // response, so that by the time the listener closes no client is about to send
            // on an idle keep-alive connection that the shutdown would close under it.
            if http1 && gw.is_draining() {
                response
                    .headers_mut()
                    .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok(response)
        })
    }
}

/// hyper leaves a HEAD answer's body out over HTTP/1, but sends it over h2, where the client
/// then resets the stream (RFC 9110 9.3.2: HEAD's answer has no content). The length stays,
/// as a GET would have it.
fn head_over_h2(response: &mut Response<Body>) {
    let length = http_body::Body::size_hint(response.body()).exact();
    if let Some(n) = length {
        if !response
            .headers()
            .contains_key(http::header::CONTENT_LENGTH)
        {
            response
                .headers_mut()
                .insert(http::header::CONTENT_LENGTH, HeaderValue::from(n));
        }
    }
    *response.body_mut() = crate::body::empty();
}

fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response<Body> {
    tracing::error!(
        panic = crate::error::panic_message(&*panic),
        "a request handler panicked; answered 500"
    );
    error_response(&GatewayError::Internal(crate::error::PANICKED.into()))
}

/// How connections are served.
#[derive(Clone)]
pub struct ServeOptions {
    /// TLS for every connection, reloadable; `None` serves plain HTTP.
    pub tls: Option<Arc<ReloadableTls>>,
    /// Time for the TLS handshake and a connection's first bytes, then for each request
    /// head; so it also bounds idle HTTP/1 keep-alive and connections that never send.
    pub header_read_timeout: Duration,
    /// Largest request head, HTTP/1 and h2.
    pub max_header_bytes: usize,
    /// How long in-flight requests may take to finish after shutdown begins.
    pub drain: Duration,
    /// Connections open at once, shared by the listeners that hold a clone; beyond it new
    /// ones wait in the listen queue. `None`: no bound.
    pub connections: Option<Arc<tokio::sync::Semaphore>>,
    /// How long a write to the client may wait without progress (`send_timeout`).
    pub send_timeout: Duration,
}

impl ServeOptions {
    pub fn plain(drain: Duration) -> Self {
        ServeOptions {
            tls: None,
            header_read_timeout: Duration::from_secs(30),
            max_header_bytes: 64 << 10,
            drain,
            connections: None,
            send_timeout: Duration::from_secs(60),
        }
    }
}

/// A connection's place under `ServeOptions::connections`, given back when it closes.
type Slot = Option<tokio::sync::OwnedSemaphorePermit>;

/// Waits for a free connection slot; at most one warning per minute says the cap is reached.
async fn slot(
    connections: &Option<Arc<tokio::sync::Semaphore>>,
    warned: &mut Option<Instant>,
) -> Slot {
    let sem = connections.as_ref()?;
    if let Ok(permit) = sem.clone().try_acquire_owned() {
        return Some(permit);
    }
    if warned.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
        *warned = Some(Instant::now());
        tracing::warn!(
            "every connection slot is taken (limits.max_connections); new connections wait in the listen queue"
        );
    }
    sem.clone().acquire_owned().await.ok()
}

/// Serves connections from `listener` until `shutdown` resolves, then lets in-flight
/// requests finish for up to `options.drain`. Returns whether the deadline passed with
/// connections still open (their requests are cut off when the process ends).
/// `service_for` makes each connection's service from its peer's address.
pub async fn serve<M, S, ResBody>(
    listener: TcpListener,
    service_for: M,
    shutdown: impl Future<Output = ()>,
    options: ServeOptions,
) -> bool
where
    M: Fn(SocketAddr) -> S + Clone + Send + Sync + 'static,
    S: tower::Service<Request<Incoming>, Response = Response<ResBody>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let drain = Drain::new();
    let connections = Connections::new(service_for, &options);
    tokio::pin!(shutdown);
    let mut warned = None;
    loop {
        // A slot first: at the cap, connections wait in the kernel's queue rather than take
        // the file descriptors the gateway's own backend connections and probes need.
        let slot = tokio::select! {
            slot = slot(&options.connections, &mut warned) => slot,
            _ = &mut shutdown => break,
        };
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => connections.spawn(stream, peer, drain.watch(), slot),
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = &mut shutdown => break,
        }
    }
    connections.accept_backlog(listener, &drain);
    // Each connection now finishes the request it is reading or handling (HTTP/1 then
    // closes; h2 sends GOAWAY), and idle keep-alive connections close at once.
    let expired = tokio::time::timeout(options.drain, drain.shutdown())
        .await
        .is_err();
    if expired {
        tracing::warn!("drain deadline passed with connections still open");
    }
    expired
}

/// What every connection of one listener shares.
#[derive(Clone)]
struct Connections<M> {
    /// Makes a connection's service from its peer's address.
    service_for: M,
    /// The same settings, fixed to one protocol each: the protocol is sniffed here
    /// (`conn::sniff`), not by hyper-util's auto builder.
    http1: auto::Builder<TokioExecutor>,
    h2: auto::Builder<TokioExecutor>,
    tls: Option<Arc<ReloadableTls>>,
    header_read_timeout: Duration,
    /// How long a connection that has sent nothing may stay once a shutdown has begun.
    silent_grace: Duration,
    send_timeout: Duration,
}

impl<M: Clone> Connections<M> {
    fn new(service_for: M, options: &ServeOptions) -> Self {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            // Bounds the head of every request, and so also how long an idle keep-alive
            // connection stays open: hyper starts the timer when it waits for the next head.
            .header_read_timeout(options.header_read_timeout)
            // hyper's floor for its read buffer is 8 KiB.
            .max_buf_size(options.max_header_bytes.max(8192)) // check-config refuses less
            .keep_alive(true);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_header_list_size(options.max_header_bytes.min(u32::MAX as usize) as u32)
            .keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(20));
        Connections {
            service_for,
            http1: builder.clone().http1_only(),
            h2: builder.http2_only(),
            tls: options.tls.clone(),
            header_read_timeout: options.header_read_timeout,
            silent_grace: drain::SILENT_GRACE.min(options.header_read_timeout),
            send_timeout: options.send_timeout,
        }
    }
}

impl<M, S, ResBody> Connections<M>
where
    M: Fn(SocketAddr) -> S + Clone + Send + Sync + 'static,
    S: tower::Service<Request<Incoming>, Response = Response<ResBody>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    /// Serves one connection in its own task; the TLS handshake runs there too, so a slow
    /// client cannot stall the accept loop.
    fn spawn(&self, stream: TcpStream, peer: SocketAddr, watch: Watch, slot: Slot) {
        let _ = stream.set_nodelay(true);
        let this = self.clone();
        tokio::spawn(async move {
            let _slot = slot;
            // One deadline for the handshake and the first bytes of a request.
            let deadline = Instant::now() + this.header_read_timeout;
            let result = match this.tls.clone() {
                None => this.serve(stream, peer, deadline, watch).await,
                Some(tls) => {
                    let acceptor = tls.acceptor();
                    let grace = this.silent_grace;
                    let attempt = async move {
                        if plain_on_tls::starts_plain_http(&stream).await {
                            return Err(stream);
                        }
                        Ok(acceptor.accept(stream).await)
                    };
                    let handshake = tokio::select! {
                        r = timeout_at(deadline, attempt) => r,
                        () = watch.silent_for(grace) => {
                            tracing::debug!(%peer, "no TLS handshake before the shutdown; closed");
                            return;
                        }
                    };
                    match handshake {
                        Ok(Err(plain)) => {
                            tls.handshake_failed(false);
                            plain_on_tls::refuse(plain).await;
                            Err("a plain HTTP request on the TLS listener (answered 400)"
                                .to_string())
                        }
                        Ok(Ok(Ok(stream))) => this.serve(stream, peer, deadline, watch).await,
                        Ok(Ok(Err(e))) => {
                            tls.handshake_failed(false);
                            Err(format!("TLS handshake failed: {e}"))
                        }
                        Err(_) => {
                            tls.handshake_failed(true);
                            Err("TLS handshake timed out".to_string())
                        }
                    }
                }
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }

    /// `watch` is taken when the connection is accepted, so that a shutdown waits for a
    /// connection still in its handshake or first bytes; once hyper has it, a shutdown lets
    /// the request in progress, or the first one, finish.
    async fn serve<I>(
        self,
        io: I,
        peer: SocketAddr,
        deadline: Instant,
        watch: Watch,
    ) -> Result<(), String>
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let sniffed = tokio::select! {
            r = timeout_at(deadline, conn::sniff(io)) => r,
            // It holds no request: closing it loses nothing, and waiting for the header-read
            // timeout would hold up the shutdown.
            () = watch.silent_for(self.silent_grace) => {
                return Err("no request before the shutdown".to_string());
            }
        };
        let (proto, io) = match sniffed {
            Ok(Ok(sniffed)) => sniffed,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("no request within the header-read timeout".to_string()),
        };
        let io = TokioIo::new(send_timeout::SendTimeout::new(io, self.send_timeout));
        let service = (self.service_for)(peer);
        match proto {
            conn::Proto::Http1 => {
                let service = TowerToHyperService::new(service);
                let connection = self.http1.serve_connection(io, service);
                watch.drive(connection).await
            }
            // hyper bounds how long an idle HTTP/1 connection stays (the header-read
            // timeout); h2 gets the same bound here.
            conn::Proto::H2 => {
                let activity = idle::Activity::new();
                let service = idle::Tracked::new(service, Arc::clone(&activity));
                let connection = self
                    .h2
                    .serve_connection(io, TowerToHyperService::new(service));
                let bound = Some((&*activity, self.header_read_timeout));
                watch.drive_idle(connection, bound).await
            }
        }
        .map_err(|e| e.to_string())
    }

    /// Closes the listener, first serving the connections the kernel has already completed:
    /// their clients believe they are connected and have sent a request, which closing the
    /// listener would reset instead of refusing.
    fn accept_backlog(&self, listener: TcpListener, drain: &Drain) {
        // The std listener accepts with a plain syscall, so it finds every queued connection,
        // including those the reactor has not reported yet.
        let listener = match listener.into_std() {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cannot take the listener's queued connections");
                return;
            }
        };
        loop {
            match listener.accept() {
                Ok((stream, peer)) => {
                    let stream = stream
                        .set_nonblocking(true)
                        .and_then(|()| TcpStream::from_std(stream));
                    match stream {
                        Ok(s) => self.spawn(s, peer, drain.watch(), None),
                        Err(e) => {
                            tracing::debug!(%peer, error = %e, "cannot serve a queued connection")
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                // WouldBlock: the queue is empty. The listener closes when dropped here.
                Err(_) => break,
            }
        }
    }
}

/// The v2 REST service of each connection: panics become 500s, answers are compressed,
/// then the gateway.
pub fn gateway_service(
    gw: Arc<Gateway>,
) -> impl Fn(SocketAddr) -> Layered<GatewayService> + Clone + Send + Sync + 'static {
    move |peer| {
        with_layers(GatewayService {
            gw: gw.clone(),
            peer: Some(peer),
        })
    }
}

/// A service whose handlers read the peer's address from the request's extensions
/// (`PeerAddr::of`), made for each connection: gRPC's, whose handlers tonic calls.
pub fn with_peer_extension<S>(
    service: S,
) -> impl Fn(SocketAddr) -> AddExtension<S, PeerAddr> + Clone + Send + Sync + 'static
where
    S: Clone + Send + Sync + 'static,
{
    move |peer| AddExtension::new(service.clone(), PeerAddr(peer))
}

/// Turns a caught panic into a response.
type PanicHandler = fn(Box<dyn std::any::Any + Send + 'static>) -> Response<Body>;

/// The service `with_layers` builds around `S`.
pub type Layered<S> = tower_http::catch_panic::CatchPanic<
    PropagateRequestId<
        tower_http::compression::Compression<
            CanonicalCoding<S>,
            And<DefaultPredicate, InferAnswers>,
        >,
    >,
    PanicHandler,
>;

/// Compresses only what the REST edge marked `Compressible` (successful inferences small
/// enough to compress in place: `rest::compress`), and of
/// those what tower-http's default predicate allows (not tiny, not already compressed).
#[derive(Debug, Clone, Copy)]
pub struct InferAnswers;

impl Predicate for InferAnswers {
    fn should_compress<B: http_body::Body>(&self, response: &http::Response<B>) -> bool {
        response
            .extensions()
            .get::<crate::rest::Compressible>()
            .is_some()
    }
}

/// The layers around the gateway, applied to any inner service (tests use a failing one).
/// The edge's own stack (auth, shedding, observation) is inside `S`.
pub fn with_layers<S>(inner: S) -> Layered<S> {
    ServiceBuilder::new()
        .layer(CatchPanicLayer::custom(panic_response as PanicHandler))
        .layer(PropagateRequestIdLayer::new(crate::headers::REQUEST_ID))
        .layer(CompressionLayer::new().compress_when(DefaultPredicate::new().and(InferAnswers)))
        .layer(tower::layer::layer_fn(CanonicalCoding))
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
            let get = matches!(*req.method(), http::Method::GET | http::Method::HEAD);
            let head_h2 =
                req.method() == http::Method::HEAD && req.version() >= http::Version::HTTP_2;
            let mut resp = if req.uri().path() == "/metrics" && !get {
                error_response(&GatewayError::method_not_allowed(
                    req.method(),
                    "/metrics",
                    http::Method::GET,
                ))
            } else if req.uri().path() == "/metrics" {
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

            if head_h2 {
                head_over_h2(&mut resp);
            }
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
            tower::service_fn(move |req: Request<http_body_util::Empty<Bytes>>| {
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
            })
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

    /// Reads until the peer closes (bounded), returning what arrived.
    async fn read_to_close(s: &mut TcpStream) -> String {
        use tokio::io::AsyncReadExt;
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
            .await
            .expect("the server closed the connection")
            .unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn a_shutdown_serves_a_new_connection_and_closes_idle_ones() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const REQUEST: &[u8] = b"GET / HTTP/1.1\r\nhost: a\r\n\r\n";
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service = tower::service_fn(|_: Request<Incoming>| async {
            Ok::<_, Infallible>(Response::new(full("ok")))
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            listener,
            move |_| service,
            async {
                let _ = stopped.await;
            },
            ServeOptions::plain(Duration::from_secs(10)),
        ));
        // A keep-alive connection, idle after one request; and one that has sent nothing yet.
        let mut idle = TcpStream::connect(addr).await.unwrap();
        idle.write_all(REQUEST).await.unwrap();
        let mut buf = vec![0u8; 1024];
        let mut got = String::new();
        while !got.ends_with("ok") {
            let n = tokio::time::timeout(Duration::from_secs(10), idle.read(&mut buf))
                .await
                .unwrap()
                .unwrap();
            assert!(n > 0, "closed early: {got}");
            got.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        let mut fresh = TcpStream::connect(addr).await.unwrap();

        stop.send(()).unwrap();
        // Wait (bounded) until the listener is closed.
        let mut refused = false;
        for _ in 0..500 {
            match TcpStream::connect(addr).await {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    refused = true;
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        assert!(refused, "the listener stayed open");
        assert_eq!(
            read_to_close(&mut idle).await,
            "",
            "the idle one just closes"
        );
        // The new connection's first request was on its way: it is served, then closed.
        fresh.write_all(REQUEST).await.unwrap();
        let reply = read_to_close(&mut fresh).await;
        assert!(reply.starts_with("HTTP/1.1 200 OK\r\n"), "{reply}");
        assert!(reply.ends_with("\r\n\r\nok"), "{reply}");
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("the drain ended")
            .unwrap();
    }

    #[tokio::test]
    async fn a_silent_connection_does_not_hold_up_a_shutdown() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service = tower::service_fn(|_: Request<Incoming>| async {
            Ok::<_, Infallible>(Response::new(full("ok")))
        });
        // Timeouts far beyond the test's bound: only the shutdown's grace can end it.
        let mut options = ServeOptions::plain(Duration::from_secs(600));
        options.header_read_timeout = Duration::from_secs(600);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            listener,
            move |_| service,
            async {
                let _ = stopped.await;
            },
            options,
        ));
        // A health checker's connection, or a client's spare pooled one: it never sends.
        let mut silent = TcpStream::connect(addr).await.unwrap();
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(60), server)
            .await
            .expect("the drain ended without waiting for the header-read timeout")
            .unwrap();
        assert_eq!(
            read_to_close(&mut silent).await,
            "",
            "closed without a word"
        );
    }
}
