//! The inference connections to one HTTP backend: a stack of idle HTTP/1 connections
//! (hyper's `client::conn`), one taken per request and put back when the answer's body has
//! been read to its end. hyper-util's legacy client does the same for any host, at the price
//! of a pool keyed by a hashed authority, a dispatch through a channel, and several boxed
//! futures per request: 12% of the gateway's instructions for a small proxied request. The
//! control-plane calls (metadata, readiness, the repository) still use that client.

use std::collections::VecDeque;
use std::error::Error as StdError;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{header, HeaderValue, Request, Response, Uri};
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use tower::ServiceExt;

use crate::body::Body;

pub type Connector = HttpsConnector<HttpConnector>;

/// The connector of every HTTP backend: http:// and https:// (rustls with `tls`), HTTP/1,
/// Nagle off, each connection attempt bounded by `connect_timeout`.
pub fn connector(connect_timeout: Duration, tls: rustls::ClientConfig) -> Connector {
    let mut tcp = HttpConnector::new();
    tcp.set_connect_timeout(Some(connect_timeout));
    tcp.set_nodelay(true);
    tcp.enforce_http(false);
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(tcp)
}

/// Why a request got no answer.
#[derive(Debug)]
pub enum SendError {
    /// No connection could be made: nothing reached the backend.
    Connect(Box<dyn StdError + Send + Sync>),
    /// The request was sent (or may have been), and the connection failed before an answer.
    Failed(Box<dyn StdError + Send + Sync>),
}

struct Idle {
    sender: SendRequest<Body>,
    since: Instant,
}

pub struct ConnPool {
    connector: Connector,
    /// The backend's base URI, given to the connector.
    base: Uri,
    /// The `Host` header of every request.
    host: HeaderValue,
    /// Most recently used at the back.
    idle: Mutex<VecDeque<Idle>>,
    idle_timeout: Duration,
    max_idle: usize,
    reaper: AtomicBool,
}

impl ConnPool {
    /// `base`: `http://host:port` or `https://host:port`. With `max_idle` 0 nothing is kept.
    pub fn new(
        connector: Connector,
        base: &str,
        idle_timeout: Duration,
        max_idle: usize,
    ) -> Result<Arc<Self>, String> {
        let base: Uri = base
            .parse()
            .map_err(|e| format!("backend url '{base}': {e}"))?;
        let authority = base
            .authority()
            .ok_or_else(|| format!("backend url '{base}' has no host"))?;
        let host = HeaderValue::from_str(&host_header(base.scheme(), authority))
            .map_err(|e| format!("backend url '{base}': {e}"))?;
        Ok(Arc::new(ConnPool {
            connector,
            base,
            host,
            idle: Mutex::new(VecDeque::new()),
            idle_timeout,
            max_idle,
            reaper: AtomicBool::new(false),
        }))
    }

    /// Sends `req` (its URI absolute or a path) on an idle connection, or a new one. A
    /// request that a pooled connection could not take because the backend had closed it
    /// goes on the next one: it never left the gateway.
    pub async fn send(
        self: &Arc<Self>,
        mut req: Request<Body>,
    ) -> Result<Response<BackendBody>, SendError> {
        let path = req
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        *req.uri_mut() = Uri::from(path);
        req.headers_mut()
            .entry(header::HOST)
            .or_insert_with(|| self.host.clone());
        loop {
            let (mut sender, reused) = match self.take().await {
                Some(s) => (s, true),
                None => (self.connect().await?, false),
            };
            match sender.try_send_request(req).await {
                Ok(resp) => {
                    let pool = Arc::downgrade(self);
                    return Ok(resp.map(|inner| BackendBody {
                        inner,
                        give_back: Some((sender, pool)),
                    }));
                }
                Err(mut e) => match e.take_message() {
                    Some(unsent) if reused => req = unsent,
                    _ => return Err(SendError::Failed(Box::new(e.into_error()))),
                },
            }
        }
    }

    /// The most recently used idle connection that is still open and ready.
    async fn take(&self) -> Option<SendRequest<Body>> {
        loop {
            let idle = {
                let mut list = self.idle.lock().unwrap_or_else(|e| e.into_inner());
                list.pop_back()?
            };
            if idle.since.elapsed() >= self.idle_timeout || idle.sender.is_closed() {
                continue;
            }
            let mut sender = idle.sender;
            // Ready at once, or as soon as the connection's task has finished the previous
            // exchange; an error means the backend closed it.
            if sender.ready().await.is_ok() {
                return Some(sender);
            }
        }
    }

    async fn connect(&self) -> Result<SendRequest<Body>, SendError> {
        let io = self
            .connector
            .clone()
            .oneshot(self.base.clone())
            .await
            .map_err(SendError::Connect)?;
        let (sender, conn) = hyper::client::conn::http1::Builder::new()
            .handshake(io)
            .await
            .map_err(|e| SendError::Connect(Box::new(e)))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "backend connection ended");
            }
        });
        Ok(sender)
    }

    fn put(self: &Arc<Self>, sender: SendRequest<Body>) {
        if self.max_idle == 0 || sender.is_closed() {
            return;
        }
        {
            let mut list = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            if list.len() >= self.max_idle {
                list.pop_front();
            }
            list.push_back(Idle {
                sender,
                since: Instant::now(),
            });
        }
        if !self.reaper.swap(true, Ordering::Relaxed) {
            spawn_reaper(Arc::downgrade(self), self.idle_timeout);
        }
    }

    /// Closes the connections idle for the whole timeout.
    fn reap(&self) {
        let mut list = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while list
            .front()
            .is_some_and(|i| i.since.elapsed() >= self.idle_timeout)
        {
            list.pop_front();
        }
    }

    #[cfg(test)]
    fn idle_len(&self) -> usize {
        self.idle.lock().unwrap().len()
    }
}

/// Closes idle connections after the timeout even when no request comes to find them; it
/// ends with the pool.
fn spawn_reaper(pool: Weak<ConnPool>, every: Duration) {
    let every = every.max(Duration::from_millis(100));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            match pool.upgrade() {
                Some(p) => p.reap(),
                None => return,
            }
        }
    });
}

/// `host[:port]`, the port left out where it is the scheme's own, as browsers and
/// hyper-util's client write it.
fn host_header(scheme: Option<&Scheme>, authority: &Authority) -> String {
    let default_port = match scheme.map(Scheme::as_str) {
        Some("https") => 443,
        _ => 80,
    };
    match authority.port_u16() {
        Some(p) if p != default_port => authority.as_str().to_string(),
        _ => authority.host().to_string(),
    }
}

/// A backend's answer body; its connection goes back to the pool when the body has been
/// read to its end (or dropped at its end), and is closed otherwise.
pub struct BackendBody {
    inner: Incoming,
    give_back: Option<(SendRequest<Body>, Weak<ConnPool>)>,
}

impl BackendBody {
    fn give_back(&mut self) {
        if let Some((sender, pool)) = self.give_back.take() {
            if let Some(pool) = pool.upgrade() {
                pool.put(sender);
            }
        }
    }
}

impl HttpBody for BackendBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => this.give_back(),
            Poll::Ready(Some(Err(_))) => this.give_back = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for BackendBody {
    fn drop(&mut self) {
        // A reader that stops at the last byte (one that trusts the length) never polls
        // for the end; the connection is as reusable as if it had.
        if self.inner.is_end_stream() {
            self.give_back();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::atomic::AtomicUsize;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn connector() -> Connector {
        let tls = crate::tls::client_config(&Default::default()).unwrap();
        super::connector(Duration::from_secs(5), tls)
    }

    #[test]
    fn a_base_url_without_a_host_is_refused_with_its_reason() {
        let err = |base: &str| {
            ConnPool::new(connector(), base, Duration::from_secs(1), 4)
                .err()
                .expect("refused")
        };
        assert_eq!(err("/v2"), "backend url '/v2' has no host");
        assert_eq!(
            err("http://exa mple"),
            "backend url 'http://exa mple': invalid uri character"
        );
        assert!(
            ConnPool::new(connector(), "http://127.0.0.1:9", Duration::from_secs(1), 4).is_ok()
        );
    }

    /// A keep-alive HTTP/1 server that answers `answers_per_connection` requests on each
    /// connection and then closes it; counts connections. Requests must be small.
    async fn server(answers_per_connection: usize) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    for _ in 0..answers_per_connection {
                        let mut buf = vec![0u8; 4096];
                        let mut got = 0;
                        loop {
                            let n = s.read(&mut buf[got..]).await.unwrap_or(0);
                            if n == 0 {
                                return;
                            }
                            got += n;
                            if buf[..got].windows(4).any(|w| w == b"\r\n\r\n") {
                                break;
                            }
                        }
                        let head = String::from_utf8_lossy(&buf[..got]).to_string();
                        let body = head.lines().next().unwrap_or("").to_string();
                        let host = head
                            .lines()
                            .find_map(|l| l.strip_prefix("host: "))
                            .unwrap_or("-")
                            .to_string();
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\nx-host: {host}\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if s.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (format!("http://{addr}"), accepted)
    }

    fn get(path: &str) -> Request<Body> {
        Request::get(path).body(crate::body::full("")).unwrap()
    }

    #[tokio::test]
    async fn connections_are_reused_once_the_body_is_read() {
        let (url, accepted) = server(usize::MAX).await;
        let pool = ConnPool::new(connector(), &url, Duration::from_secs(60), 8).unwrap();
        for i in 0..5 {
            let resp = pool.send(get(&format!("{url}/n/{i}"))).await.unwrap();
            let host = resp.headers()["x-host"].to_str().unwrap().to_string();
            assert_eq!(format!("http://{host}"), url);
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], format!("GET /n/{i} HTTP/1.1").as_bytes());
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.idle_len(), 1);
    }

    #[tokio::test]
    async fn an_unread_body_closes_its_connection() {
        let (url, accepted) = server(usize::MAX).await;
        let pool = ConnPool::new(connector(), &url, Duration::from_secs(60), 8).unwrap();
        let resp = pool.send(get("/a")).await.unwrap();
        drop(resp);
        assert_eq!(pool.idle_len(), 0);
        let resp = pool.send(get("/b")).await.unwrap();
        resp.into_body().collect().await.unwrap();
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_connection_the_backend_closed_is_replaced_without_losing_the_request() {
        // One answer per connection: every pooled connection is closed when reused.
        let (url, accepted) = server(1).await;
        let pool = ConnPool::new(connector(), &url, Duration::from_secs(60), 8).unwrap();
        for i in 0..4 {
            let resp = pool.send(get(&format!("/r/{i}"))).await.unwrap();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], format!("GET /r/{i} HTTP/1.1").as_bytes());
            // Let the server's close reach the pooled connection, or not: both must work.
            if i % 2 == 1 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn idle_connections_are_closed_after_the_timeout() {
        let (url, accepted) = server(usize::MAX).await;
        let pool = ConnPool::new(connector(), &url, Duration::from_millis(100), 8).unwrap();
        let resp = pool.send(get("/a")).await.unwrap();
        resp.into_body().collect().await.unwrap();
        assert_eq!(pool.idle_len(), 1);
        for _ in 0..50 {
            if pool.idle_len() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(pool.idle_len(), 0, "the reaper closes idle connections");
        let resp = pool.send(get("/b")).await.unwrap();
        resp.into_body().collect().await.unwrap();
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn with_no_idle_connections_allowed_none_is_kept() {
        // fleet.pool_idle_timeout_ms = 0 gives max_idle 0.
        let (url, accepted) = server(usize::MAX).await;
        let pool = ConnPool::new(connector(), &url, Duration::ZERO, 0).unwrap();
        for path in ["/a", "/b"] {
            let resp = pool.send(get(path)).await.unwrap();
            resp.into_body().collect().await.unwrap();
            assert_eq!(pool.idle_len(), 0);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn no_backend_is_a_connect_error() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let pool = ConnPool::new(
            connector(),
            &format!("http://127.0.0.1:{port}"),
            Duration::from_secs(60),
            8,
        )
        .unwrap();
        match pool.send(get("/a")).await {
            Err(SendError::Connect(e)) => {
                let e: &(dyn StdError + 'static) = e.as_ref();
                let mut io = None;
                let mut cur = Some(e);
                while let Some(c) = cur {
                    io = io.or(c.downcast_ref::<std::io::Error>());
                    cur = c.source();
                }
                assert_eq!(
                    io.map(std::io::Error::kind),
                    Some(std::io::ErrorKind::ConnectionRefused),
                    "{e:?}"
                );
            }
            Err(other) => panic!("{other:?}"),
            Ok(resp) => panic!("answered {}", resp.status()),
        }
    }

    #[test]
    fn host_headers_leave_out_default_ports() {
        let host = |u: &str| {
            let u: Uri = u.parse().unwrap();
            host_header(u.scheme(), u.authority().unwrap())
        };
        assert_eq!(host("http://a:80"), "a");
        assert_eq!(host("http://a:8000"), "a:8000");
        assert_eq!(host("https://a:443"), "a");
        assert_eq!(host("https://a:80"), "a:80");
        assert_eq!(host("http://[::1]:9000"), "[::1]:9000");
    }
}
