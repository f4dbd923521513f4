//! Each limit hit once with its status and message, bearer auth, and graceful shutdown
//! (readiness goes first, in-flight requests finish, exit status 0).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use tensorgate::config::{AuthConfig, Config};
use tensorgate::run::Running;

async fn gateway(edit: impl FnOnce(&mut Config)) -> Running {
    let mut c = Config::embedded_default();
    c.server.grpc_listen = None;
    c.server.listen = "127.0.0.1:0".parse().unwrap();
    edit(&mut c);
    tensorgate::run::start(c, false).await.unwrap()
}

const SIMPLE: &str = r#"{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"INT32","data":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]},{"name":"INPUT1","shape":[1,16],"datatype":"INT32","data":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]}]}"#;

/// Reads whatever the server sends until it closes or `limit` passes.
fn read_all(s: &mut TcpStream, limit: Duration) -> String {
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let start = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while start.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if !out.is_empty()
                    && out.windows(4).any(|w| w == b"\r\n\r\n")
                    && out.ends_with(b"}")
                {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_headers_get_431() {
    let gw = gateway(|c| c.limits.max_header_bytes = 16 << 10).await;
    let addr = gw.addr;
    let reply = tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        let big = "x".repeat(100 << 10);
        let _ = write!(
            s,
            "GET /v2/health/live HTTP/1.1\r\nhost: a\r\nx-big: {big}\r\n\r\n"
        );
        read_all(&mut s, Duration::from_secs(5))
    })
    .await
    .unwrap();
    assert!(reply.starts_with("HTTP/1.1 431"), "{reply}");
    // hyper writes this answer itself, from its parser, with no hook for a body: it is the
    // one error without `{"error": ...}`.
    let (head, body) = reply.split_once("\r\n\r\n").expect("a complete head");
    assert!(
        head.to_ascii_lowercase().contains("\r\ncontent-length: 0"),
        "{head}"
    );
    assert_eq!(body, "");
    let ok = reqwest::get(format!("http://{addr}/v2/health/live"))
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_is_shed_beyond_the_concurrency_limit_and_slow_bodies_time_out() {
    let hung = hung_backend().await;
    let gw = gateway(|c| {
        c.limits.max_concurrent_requests = 1;
        c.limits.body_read_timeout_ms = 1500;
        c.limits.request_timeout_ms = 2500;
        c.set_backends(&["builtin".to_string(), format!("http://{hung}")])
            .unwrap();
    })
    .await;
    let addr = gw.addr;
    let client = reqwest::Client::new();
    // A request whose body never completes holds no permit: it is admitted once its body
    // has arrived, so that silent clients cannot shed everyone else.
    let slow = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(s, "POST /v2/models/simple/infer HTTP/1.1\r\nhost: a\r\ncontent-length: 1000\r\n\r\n{{\"inp").unwrap();
        read_all(&mut s, Duration::from_secs(10))
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let served = client
        .post(format!("http://{addr}/v2/models/simple/infer"))
        .body(SIMPLE)
        .send()
        .await
        .unwrap();
    assert_eq!(served.status(), 200, "the silent request took no permit");
    // The hung backend's model must be known before a request for it can hold the permit
    // (on a loaded machine its discovery can trail the gateway's start).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = client
            .get(format!("http://{addr}/v2/models/m/ready"))
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "model m never became ready: {}",
            r.status()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Hold the one permit with a request the hung backend never answers.
    let hold = || {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .post(format!("http://{addr}/v2/models/m/infer"))
                .body(
                    r#"{"inputs":[{"name":"INPUT0","shape":[2],"datatype":"FP32","data":[1,2]}]}"#,
                )
                .send()
                .await
                .map(|r| r.status().as_u16())
        })
    };
    let mut held = hold();
    // Wait (bounded: 10 s, for a loaded CI machine) until it holds the permit. A probe can
    // take the permit first, and the held request is then the one shed: it is sent again.
    let mut shed = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        let r = client
            .post(format!("http://{addr}/v2/models/simple/infer"))
            .body(SIMPLE)
            .send()
            .await
            .unwrap();
        if r.status() == 503 {
            shed = Some(r);
            break;
        }
        if held.is_finished() {
            let ended = held.await.unwrap().unwrap();
            assert_eq!(ended, 503, "the held request can only have been shed");
            held = hold();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = shed.expect("a second request is shed while the first holds the only permit");
    assert_eq!(r.headers()["retry-after"], "1");
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        v["error"],
        "tensorgate is handling its limit of 1 concurrent requests (limits.max_concurrent_requests); retry later"
    );
    // Counted against the model as Triton's REJECTED, under the version label a served
    // request has (the model's first); a made-up model name opens no series.
    let failures = |version: &str| {
        gw.gateway
            .metrics
            .nv_failure
            .with_label_values(&["simple", version, "REJECTED"])
            .get()
    };
    assert!(failures("1") >= 1);
    assert_eq!(failures(""), 0);
    let made_up = client
        .post(format!("http://{addr}/v2/models/no-such-model/infer"))
        .body(SIMPLE)
        .send()
        .await
        .unwrap();
    assert_eq!(made_up.status(), 503);
    let text = String::from_utf8(gw.gateway.metrics.render()).unwrap();
    assert!(!text.contains("no-such-model"), "{text}");
    // Health is exempt from shedding.
    assert_eq!(
        client
            .get(format!("http://{addr}/v2/health/ready"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // The slow body times out with 408.
    let reply = tokio::task::spawn_blocking(move || slow.join().unwrap())
        .await
        .unwrap();
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(
        reply.contains(r#"{"error":"the request body did not arrive within 1500 ms (limits.body_read_timeout_ms)"}"#),
        "{reply}"
    );
    // The held request times out (504), and with the permit back, requests are served.
    assert_eq!(held.await.unwrap().unwrap(), 504);
    let ok = client
        .post(format!("http://{addr}/v2/models/simple/infer"))
        .body(SIMPLE)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_are_cut_off() {
    let gw = gateway(|c| c.limits.header_read_timeout_ms = 300).await;
    let addr = gw.addr;
    let (closed, waited) = tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /v2/health/li").unwrap();
        let start = Instant::now();
        let reply = read_all(&mut s, Duration::from_secs(10));
        (reply, start.elapsed())
    })
    .await
    .unwrap();
    // hyper answers 408 or simply closes; either way the connection is not held.
    assert!(
        closed.is_empty() || closed.starts_with("HTTP/1.1 408"),
        "{closed}"
    );
    assert!(
        waited < Duration::from_secs(10),
        "the connection was held open"
    );
    gw.shutdown().await;
}

/// Waits (bounded) for the server to close `s`; returns what it sent meanwhile, or `None` if
/// the connection was still open after `limit`.
fn wait_for_close(s: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while start.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => return Some(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Some(got),
        }
    }
    None
}

/// RFC 9112 3.2: an HTTP/1.1 request without Host is a 400; HTTP/1.0 needs none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http11_request_without_host_is_refused() {
    let gw = gateway(|_| {}).await;
    let addr = gw.addr;
    tokio::task::spawn_blocking(move || {
        let answer = |request: &[u8]| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(request).unwrap();
            read_all(&mut s, Duration::from_secs(10))
        };
        let reply = answer(b"GET /v2/health/live HTTP/1.1\r\nconnection: close\r\n\r\n");
        let (head, body) = reply.split_once("\r\n\r\n").expect("a complete answer");
        assert!(head.starts_with("HTTP/1.1 400"), "{reply}");
        assert_eq!(
            body,
            r#"{"error":"an HTTP/1.1 request must have a Host header (RFC 9112 3.2)"}"#
        );
        let reply = answer(b"GET /v2/health/live HTTP/1.0\r\n\r\n");
        assert!(reply.starts_with("HTTP/1.0 200"), "{reply}");
        // An inference with a body it is not read: the answer closes the connection.
        let reply =
            answer(b"POST /v2/models/simple/infer HTTP/1.1\r\ncontent-length: 5\r\n\r\n{\"a\":");
        let (head, body) = reply.split_once("\r\n\r\n").expect("a complete answer");
        assert!(head.starts_with("HTTP/1.1 400"), "{reply}");
        assert!(
            head.to_ascii_lowercase().contains("connection: close"),
            "{head}"
        );
        assert_eq!(
            body,
            r#"{"error":"an HTTP/1.1 request must have a Host header (RFC 9112 3.2)"}"#
        );
    })
    .await
    .unwrap();
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_silent_connections_are_closed_after_the_header_read_timeout() {
    let gw = gateway(|c| c.limits.header_read_timeout_ms = 300).await;
    let addr = gw.addr;
    tokio::task::spawn_blocking(move || {
        // A keep-alive connection, idle after one answered request.
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /v2/health/live HTTP/1.1\r\nhost: a\r\n\r\n")
            .unwrap();
        let reply = read_all(&mut s, Duration::from_secs(10));
        let (head, body) = reply.split_once("\r\n\r\n").expect("a complete answer");
        assert!(head.starts_with("HTTP/1.1 200"), "{reply}");
        assert!(
            !head.to_ascii_lowercase().contains("connection: close"),
            "the server meant to keep the connection: {head}"
        );
        assert_eq!(body, r#"{"live":true}"#);
        let after = wait_for_close(&mut s, Duration::from_secs(10))
            .expect("an idle keep-alive connection outlived the header-read timeout");
        assert_eq!(after, b"", "nothing but the close");

        // A connection that never sends a byte.
        let mut silent = TcpStream::connect(addr).unwrap();
        let after = wait_for_close(&mut silent, Duration::from_secs(10))
            .expect("a silent connection outlived the header-read timeout");
        assert_eq!(after, b"");
    })
    .await
    .unwrap();
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_h2_connections_are_closed_after_the_header_read_timeout() {
    use http_body_util::{BodyExt, Empty};
    // Long enough for a loaded machine to send a request's HEADERS within it.
    let gw = gateway(|c| c.limits.header_read_timeout_ms = 1000).await;
    let h2 = |addr| async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (send, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tcp),
        )
        .await
        .unwrap();
        (send, tokio::spawn(conn))
    };
    // Idle after one answered request, and one that never sends a request: both closed.
    let (mut send, conn) = h2(gw.addr).await;
    let r = send
        .send_request(
            http::Request::get(format!("http://{}/v2/health/live", gw.addr))
                .body(Empty::<bytes::Bytes>::new().boxed())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body = r.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, r#"{"live":true}"#);
    let (_silent, silent_conn) = h2(gw.addr).await;
    for (what, conn) in [("idle", conn), ("silent", silent_conn)] {
        tokio::time::timeout(Duration::from_secs(10), conn)
            .await
            .unwrap_or_else(|_| panic!("an {what} h2 connection outlived the header-read timeout"))
            .unwrap()
            .unwrap();
    }
    assert!(send.is_closed());

    // A stream open longer than the timeout keeps its connection: a request whose body is
    // still coming.
    let (mut send, mut conn) = h2(gw.addr).await;
    type Frame = Result<http_body::Frame<bytes::Bytes>, std::convert::Infallible>;
    let (sender, frames) = tokio::sync::mpsc::channel::<Frame>(1);
    let request_body =
        http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(frames))
            .boxed();
    let pending = tokio::spawn(
        send.send_request(
            http::Request::post(format!("http://{}/v2/models/simple/infer", gw.addr))
                .body(request_body)
                .unwrap(),
        ),
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(2500), &mut conn)
            .await
            .is_err(),
        "a connection with an open stream was closed as idle"
    );
    drop(sender);
    let _ = pending.await;
    tokio::time::timeout(Duration::from_secs(10), conn)
        .await
        .expect("idle once its stream ended")
        .unwrap()
        .unwrap();
    gw.shutdown().await;
}

/// A v2 backend serving model `m` (FP32 INPUT0 [-1]) that never answers an infer request:
/// what a hung model server looks like to the gateway.
async fn hung_backend() -> std::net::SocketAddr {
    use http_body_util::{BodyExt, Full};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let answer = |req: hyper::Request<hyper::body::Incoming>| async move {
        let path = req.uri().path().to_string();
        let _ = req.into_body().collect().await;
        let body = match path.as_str() {
            "/v2" => serde_json::json!({"name": "hung", "version": "1", "extensions": []}),
            "/v2/models/m" => serde_json::json!({
                "name": "m",
                "versions": ["1"],
                "platform": "test",
                "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
                "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}],
            }),
            "/v2/repository/index" => serde_json::json!([{"name": "m", "state": "READY"}]),
            p if p.ends_with("/infer") => {
                std::future::pending::<()>().await;
                unreachable!()
            }
            _ => serde_json::json!({}),
        };
        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(bytes::Bytes::from(
            body.to_string(),
        ))))
    };
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(
                    hyper_util::rt::TokioIo::new(stream),
                    hyper::service::service_fn(answer),
                )
                .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_backend_hits_the_request_timeout() {
    let backend = hung_backend().await;
    let gw = gateway(|c| {
        c.limits.request_timeout_ms = 300;
        c.set_backends(&[format!("http://{backend}")]).unwrap();
    })
    .await;
    let r = reqwest::Client::new()
        .post(format!("http://{}/v2/models/m/infer", gw.addr))
        .body(r#"{"inputs":[{"name":"INPUT0","shape":[2],"datatype":"FP32","data":[1,2]}]}"#)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 504);
    assert_eq!(
        r.text().await.unwrap(),
        r#"{"error":"the request to model 'm' timed out on backend 'backend-0' (limits.request_timeout_ms)"}"#
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_tokens_guard_the_data_plane_but_not_health() {
    std::env::set_var("TG_TEST_AUTH_TOKENS", "s3cret,other");
    let gw = gateway(|c| {
        c.auth = AuthConfig {
            tokens_file: None,
            tokens_env: Some("TG_TEST_AUTH_TOKENS".into()),
        };
    })
    .await;
    let base = format!("http://{}", gw.addr);
    let client = reqwest::Client::new();
    let infer = |token: Option<&'static str>| {
        let mut r = client
            .post(format!("{base}/v2/models/simple/infer"))
            .body(SIMPLE);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    for token in [None, Some("wrong")] {
        let r = infer(token).await.unwrap();
        assert_eq!(r.status(), 401);
        assert_eq!(r.headers()["www-authenticate"], "Bearer");
        assert_eq!(
            r.text().await.unwrap(),
            r#"{"error":"missing or invalid bearer token"}"#
        );
    }
    assert_eq!(infer(Some("s3cret")).await.unwrap().status(), 200);
    assert_eq!(
        client
            .get(format!("{base}/v2"))
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    // Health as Triton groups it: a model's readiness too (as gRPC's ModelReady).
    for path in [
        "/v2/health/live",
        "/v2/health/ready",
        "/v2/models/simple/ready",
        "/v2/models/simple/versions/1/ready",
    ] {
        assert_eq!(
            client
                .get(format!("{base}{path}"))
                .send()
                .await
                .unwrap()
                .status(),
            200,
            "{path}"
        );
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_reports_not_ready_and_finishes_in_flight_requests() {
    let gw = gateway(|_| {}).await;
    let base = format!("http://{}", gw.addr);
    let client = reqwest::Client::new();
    gw.gateway.start_draining();
    let r = client
        .get(format!("{base}/v2/health/ready"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(
        r.text().await.unwrap(),
        r#"{"error":"tensorgate is shutting down"}"#
    );
    // Still serving while draining, until the listener closes.
    let r = client
        .post(format!("{base}/v2/models/simple/infer"))
        .body(SIMPLE)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    gw.shutdown().await;
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Child(std::process::Child);
impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What one load client saw during the SIGTERM test.
#[derive(Debug, Default)]
struct Tally {
    sent: u32,
    answered: u32,
    refused: u32,
    /// Anything else: a dropped request, a status other than 200, a cut-off body.
    other: Vec<String>,
}

/// A connect that the closed listener refused, and nothing else: a connection reset or closed
/// after connecting means a request was lost.
fn refused(e: &reqwest::Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return e.is_connect() && io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        source = s.source();
    }
    false
}

/// A 200 with the whole body of identity_fp32's answer.
async fn complete_identity_response(r: reqwest::Response) -> Result<(), String> {
    if r.status() != 200 {
        return Err(format!("status {}", r.status()));
    }
    let v: serde_json::Value = r
        .json()
        .await
        .map_err(|e| format!("the body was cut off: {e:?}"))?;
    if v["outputs"][0]["data"][3] != 1.5 {
        return Err(format!("wrong outputs: {}", v["outputs"][0]["data"][3]));
    }
    Ok(())
}

/// `tensorgate serve --config config`, once ready on `port`.
async fn serve_ready(config: &std::path::Path, port: u16) -> Child {
    let gw = Child(
        std::process::Command::new(env!("CARGO_BIN_EXE_tensorgate"))
            .args(["serve", "--config", config.to_str().unwrap()])
            .env("RUST_LOG", "warn")
            .spawn()
            .unwrap(),
    );
    wait_ready(&format!("http://127.0.0.1:{port}/v2/health/ready")).await;
    gw
}

async fn wait_ready(url: &str) {
    for _ in 0..200 {
        if let Ok(r) = reqwest::get(url).await {
            if r.status() == 200 {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{url} never became ready");
}

/// A child process whose stdout and stderr are collected as it runs (trace logging would
/// fill a pipe and block it otherwise).
struct Logged {
    child: Child,
    out: std::thread::JoinHandle<String>,
    err: std::thread::JoinHandle<String>,
}

impl Logged {
    fn spawn(cmd: &mut std::process::Command) -> Logged {
        use std::process::Stdio;
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let collect = |mut pipe: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut text = Vec::new();
                let _ = pipe.read_to_end(&mut text);
                String::from_utf8_lossy(&text).into_owned()
            })
        };
        let out = collect(Box::new(child.stdout.take().unwrap()));
        let err = collect(Box::new(child.stderr.take().unwrap()));
        Logged {
            child: Child(child),
            out,
            err,
        }
    }

    /// Sends SIGTERM, waits (bounded) for the exit, and returns everything it printed.
    async fn stop(mut self) -> String {
        assert!(std::process::Command::new("kill")
            .args(["-TERM", &self.child.0.id().to_string()])
            .status()
            .unwrap()
            .success());
        let start = Instant::now();
        while self.child.0.try_wait().unwrap().is_none() {
            assert!(start.elapsed() < Duration::from_secs(30), "did not exit");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let out = self.out.join().unwrap();
        let err = self.err.join().unwrap();
        format!("{out}{err}")
    }
}

/// Sends `body` to `url` over h2 with prior knowledge, with `token` as the bearer token.
async fn h2_infer(url: &str, token: &str, body: &'static str) -> u16 {
    use http_body_util::{BodyExt, Full};
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<bytes::Bytes>>();
    let req = http::Request::post(url)
        .header("authorization", format!("Bearer {token}"))
        .body(Full::new(bytes::Bytes::from_static(body.as_bytes())))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await;
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_tokens_never_reach_the_logs() {
    const GOOD: &str = "tg-good-token-5c1e9a7f";
    const WRONG: &str = "tg-wrong-token-0b83d26e";
    let bin = env!("CARGO_BIN_EXE_tensorgate");
    let (wp, gp) = (free_port(), free_port());
    // The data plane forwards to an HTTP worker, so the client side logs at trace level too.
    let worker = Logged::spawn(
        std::process::Command::new(bin)
            .args(["worker", "--listen", &format!("127.0.0.1:{wp}")])
            .env("RUST_LOG", "trace"),
    );
    wait_ready(&format!("http://127.0.0.1:{wp}/v2/health/ready")).await;
    let config = std::env::temp_dir().join(format!("tg-token-logs-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:{gp}\"\nmetrics_listen = \"127.0.0.1:{}\"\ngrpc_listen = \"\"\n\
             [auth]\ntokens_env = \"TG_LOG_TEST_TOKENS\"\n\
             [[backends]]\nname = \"w\"\nurl = \"http://127.0.0.1:{wp}\"\n",
            free_port()
        ),
    )
    .unwrap();
    let gw = Logged::spawn(
        std::process::Command::new(bin)
            .args(["serve", "--config", config.to_str().unwrap()])
            .env("RUST_LOG", "trace")
            .env("TG_LOG_TEST_TOKENS", GOOD),
    );
    wait_ready(&format!("http://127.0.0.1:{gp}/v2/health/ready")).await;

    let url = format!("http://127.0.0.1:{gp}/v2/models/simple/infer");
    let client = reqwest::Client::new();
    for (token, status) in [(GOOD, 200), (WRONG, 401)] {
        let r = client
            .post(&url)
            .bearer_auth(token)
            .body(SIMPLE)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "HTTP/1.1 with {token}");
        let _ = r.bytes().await;
        assert_eq!(
            h2_infer(&url, token, SIMPLE).await,
            status,
            "h2 with {token}"
        );
    }

    let logs = gw.stop().await + &worker.stop().await;
    let _ = std::fs::remove_file(&config);
    // The logs did see these requests, in detail.
    assert!(logs.contains("TRACE"), "trace logging was on");
    assert!(
        logs.matches("/v2/models/simple/infer").count() >= 4,
        "the requests were logged"
    );
    for token in [GOOD, WRONG] {
        assert!(!logs.contains(token), "{token} was logged");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_drops_no_request() {
    let bin = env!("CARGO_BIN_EXE_tensorgate");
    let (wp, gp) = (free_port(), free_port());
    let _worker = Child(
        std::process::Command::new(bin)
            .args(["worker", "--listen", &format!("127.0.0.1:{wp}")])
            .env("RUST_LOG", "warn")
            .spawn()
            .unwrap(),
    );
    wait_ready(&format!("http://127.0.0.1:{wp}/v2/health/ready")).await;
    let config = std::env::temp_dir().join(format!("tg-sigterm-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        format!(
            // One thread: the drain must work on the single-threaded runtime too.
            "[server]\nlisten = \"127.0.0.1:{gp}\"\nmetrics_listen = \"127.0.0.1:{}\"\ngrpc_listen = \"\"\n\
             worker_threads = 1\n\
             [limits]\nshutdown_delay_ms = 3000\n\
             [[backends]]\nname = \"w\"\nurl = \"http://127.0.0.1:{wp}\"\n",
            free_port()
        ),
    )
    .unwrap();
    let mut gw = serve_ready(&config, gp).await;

    // Large enough requests that some are in flight when the signal arrives.
    let data: Vec<f32> = (0..200_000).map(|i| i as f32 * 0.5).collect();
    let body = serde_json::to_vec(&serde_json::json!({"inputs": [
        {"name": "INPUT0", "shape": [1, data.len()], "datatype": "FP32", "data": data}]}))
    .unwrap();
    let url = format!("http://127.0.0.1:{gp}/v2/models/identity_fp32/infer");
    let mut clients = Vec::new();
    for _ in 0..6 {
        let (url, body) = (url.clone(), body.clone());
        clients.push(tokio::spawn(async move {
            // Keep-alive clients: the drain must not close a connection under a request.
            let client = reqwest::Client::new();
            let mut tally = Tally::default();
            for _ in 0..200 {
                tally.sent += 1;
                match client.post(&url).body(body.clone()).send().await {
                    Ok(r) => match complete_identity_response(r).await {
                        Ok(()) => tally.answered += 1,
                        Err(e) => tally.other.push(e),
                    },
                    Err(e) if refused(&e) => {
                        // The listener is closed: the request never reached the gateway.
                        tally.refused += 1;
                        if tally.refused > 3 {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Err(e) => tally.other.push(format!("{e:?}")),
                }
            }
            tally
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    let pid = gw.0.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    // Readiness goes first: within the shutdown delay it reports 503 while requests on new
    // connections are still served.
    let fresh = || {
        reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap()
    };
    let ready_url = format!("http://127.0.0.1:{gp}/v2/health/ready");
    let mut not_ready = false;
    for _ in 0..50 {
        if fresh().get(&ready_url).send().await.unwrap().status() == 503 {
            not_ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(not_ready, "readiness never reported 503 after SIGTERM");
    let r = fresh().post(&url).body(body.clone()).send().await.unwrap();
    assert_eq!(r.status(), 200, "not ready, but still serving");
    // ... and telling HTTP/1 clients not to reuse the connection.
    assert_eq!(r.headers()["connection"], "close");
    let mut all = Tally::default();
    for c in clients {
        let t = c.await.unwrap();
        all.sent += t.sent;
        all.answered += t.answered;
        all.refused += t.refused;
        all.other.extend(t.other);
    }
    // Every request sent was answered in full, or refused at connect once the listener had
    // closed: none was dropped on the way.
    assert!(
        all.other.is_empty(),
        "{} of {} requests failed otherwise: {:#?}",
        all.other.len(),
        all.sent,
        all.other
    );
    assert_eq!(all.sent, all.answered + all.refused, "{all:?}");
    assert!(all.answered > 0, "{all:?}");
    assert!(all.refused > 0, "the listener closed: {all:?}");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = gw.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "the gateway did not exit"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "exit status {status:?}");
    let _ = std::fs::remove_file(&config);
}

/// The tokens file is watched as certificates are: a rotated Secret takes effect without a
/// signal, so a revoked token stops working; comment lines are not tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_tokens_file_takes_effect_without_a_signal() {
    let gp = free_port();
    let mp = free_port();
    let dir = std::env::temp_dir().join(format!("tg-tokens-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, "# the first token\nold-token\n").unwrap();
    let config = dir.join("tensorgate.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:{gp}\"\nmetrics_listen = \"127.0.0.1:{mp}\"\ngrpc_listen = \"\"\n\
             [auth]\ntokens_file = {:?}\n[[backends]]\nname = \"builtin\"\nurl = \"builtin\"\n",
            tokens.display().to_string()
        ),
    )
    .unwrap();
    let _gw = serve_ready(&config, gp).await;
    let client = reqwest::Client::new();
    let status = |token: &'static str| {
        let req = client
            .get(format!("http://127.0.0.1:{gp}/v2"))
            .bearer_auth(token);
        async move { req.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(status("old-token").await, 200);
    assert_eq!(status("# the first token").await, 401);

    std::fs::write(&tokens, "new-token\n").unwrap();
    // The file is polled every 2 s; the wait is bounded.
    let mut rotated = false;
    for _ in 0..50 {
        if status("old-token").await == 401 {
            rotated = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(rotated, "the revoked token still works");
    assert_eq!(status("new-token").await, 200);
    // A file left with no token (a half-written Secret) is refused, and the tokens in force
    // stay: auth is not turned off, nor every client locked out. One poll and a margin.
    std::fs::write(&tokens, "# nothing yet\n").unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(status("new-token").await, 200);
    assert_eq!(status("# nothing yet").await, 401);
    // A file that is gone (a Secret unmounted) keeps the tokens too, and is counted.
    std::fs::remove_file(&tokens).unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(status("new-token").await, 200);
    let metrics = client
        .get(format!("http://127.0.0.1:{mp}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "tensorgate_auth_token_reloads_total{result=\"success\"} 1",
        "tensorgate_auth_token_reloads_total{result=\"failure\"} 2",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in:\n{metrics}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// At `limits.max_connections`, a new connection waits in the listen queue until one
/// closes: idle clients cannot take the descriptors the gateway's own backend connections
/// and health checks need.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_wait_for_a_free_slot() {
    let gw = gateway(|c| c.limits.max_connections = 2).await;
    let idle: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(gw.addr).unwrap())
        .collect();
    // Both slots are taken once the gateway has accepted them.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut third = TcpStream::connect(gw.addr).unwrap();
    third
        .write_all(b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    assert_eq!(read_all(&mut third, Duration::from_millis(700)), "");
    drop(idle);
    let answer = read_all(&mut third, Duration::from_secs(10));
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    gw.shutdown().await;
}

/// A body whose chunked framing is broken gets a 400 that says how, not only hyper's
/// "error reading a body from connection".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_chunked_body_is_described() {
    let gw = gateway(|_| {}).await;
    let mut s = TcpStream::connect(gw.addr).unwrap();
    s.write_all(
        b"POST /v2/models/simple/infer HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    )
    .unwrap();
    let answer = read_all(&mut s, Duration::from_secs(10));
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    assert_eq!(
        body,
        r#"{"error":"cannot read the request body: error reading a body from connection: Invalid chunk size line: missing size digit"}"#
    );
    gw.shutdown().await;
}

/// A client that stops reading its answer is cut off once a write has waited
/// `limits.send_timeout_ms` without progress, so that it does not hold the answer's memory
/// for as long as it keeps the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cut_off() {
    let gw = gateway(|c| c.limits.send_timeout_ms = 500).await;
    const N: usize = 48 << 20;
    let header = format!(
        r#"{{"inputs":[{{"name":"INPUT0","shape":[1,{N}],"datatype":"UINT8","parameters":{{"binary_data_size":{N}}}}}],"outputs":[{{"name":"OUTPUT0","parameters":{{"binary_data":true}}}}]}}"#
    );
    let mut s = TcpStream::connect(gw.addr).unwrap();
    let head = format!(
        "POST /v2/models/identity_uint8/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/octet-stream\r\ninference-header-content-length: {}\r\ncontent-length: {}\r\n\r\n",
        header.len(),
        header.len() + N
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(header.as_bytes()).unwrap();
    s.write_all(&vec![7u8; N]).unwrap();
    // Not reading: the answer fills the sockets' buffers and the gateway's write waits.
    tokio::time::sleep(Duration::from_secs(3)).await;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 20];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
    };
    assert!(closed, "the gateway closed the connection");
    assert!(got < N, "only what the buffers held arrived: {got} bytes");
    gw.shutdown().await;
}

/// A gateway whose body limit and budget for bodies are both `budget`: it holds one
/// largest body at a time.
async fn budgeted(budget: usize) -> Running {
    gateway(|c| {
        c.limits.max_body_bytes = budget;
        c.limits.max_buffered_body_bytes = budget;
    })
    .await
}

/// `limits.max_buffered_body_bytes` bounds the request bodies held at once across all
/// requests: while one client's large body is arriving, another body that would exceed the
/// budget gets 503 with Retry-After and Connection: close (its rest is unread), and so does a
/// gRPC message, unary or on a stream (UNAVAILABLE, which ends that stream); once the first is gone, the same
/// requests are served, and everything held is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_share_one_memory_budget() {
    use crate::common_grpc;
    use futures_util::StreamExt;
    use tensorgate::protocol::grpc::pb;
    const BUDGET: usize = 1 << 20;
    let gw = gateway(|c| {
        c.limits.max_body_bytes = BUDGET;
        c.limits.max_buffered_body_bytes = BUDGET;
        c.server.grpc_listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let addr = gw.addr;
    let gauge = gw.gateway.metrics.buffered_body_bytes.clone();
    assert_eq!(gw.gateway.metrics.buffered_body_limit.get(), BUDGET as i64);

    // 800 KB of a 900 KB body, then nothing until told to go away.
    let (go, gone) = std::sync::mpsc::channel::<()>();
    let large = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(
            s,
            "POST /v2/models/identity_fp32/infer HTTP/1.1\r\nhost: a\r\ncontent-length: 900000\r\n\r\n"
        )
        .unwrap();
        s.write_all(&vec![b' '; 800_000]).unwrap();
        let _ = gone.recv_timeout(Duration::from_secs(30));
    });
    // Bytes are counted as they arrive, by length.
    let mut waited = 0;
    while gauge.get() != 800_000 && waited < 100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += 1;
    }
    assert_eq!(gauge.get(), 800_000);

    let n = 150_000;
    let zeros = vec!["0"; n].join(",");
    let body = format!(
        r#"{{"inputs":[{{"name":"INPUT0","shape":[1,{n}],"datatype":"FP32","data":[{zeros}]}}]}}"#
    );
    assert!(body.len() > BUDGET - 800_000 && body.len() < BUDGET);
    let client = reqwest::Client::new();
    let send = || {
        client
            .post(format!("http://{addr}/v2/models/identity_fp32/infer"))
            .body(body.clone())
            .send()
    };
    let full = format!("tensorgate holds its limit of {BUDGET} bytes of request bodies (limits.max_buffered_body_bytes); retry later");
    let refused = send().await.unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(refused.headers()["connection"], "close");
    assert_eq!(
        refused.json::<serde_json::Value>().await.unwrap(),
        serde_json::json!({ "error": full })
    );

    // The same over gRPC: a unary call, and a message on a stream (whose stream goes on).
    let message = pb::ModelInferRequest {
        model_name: "identity_fp32".into(),
        inputs: vec![common_grpc::input("INPUT0", "FP32", &[1, n as i64])],
        raw_input_contents: vec![vec![0u8; n * 4].into()],
        ..Default::default()
    };
    let mut grpc = common_grpc::connect(gw.grpc_addr.unwrap()).await;
    let status = grpc.model_infer(message.clone()).await.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (tonic::Code::Unavailable, full.as_str())
    );
    // A stream's message is refused while it is assembled, which ends that stream.
    let status = match grpc
        .model_stream_infer(futures_util::stream::iter([message.clone()]))
        .await
    {
        Err(status) => status,
        Ok(answers) => answers.into_inner().next().await.unwrap().unwrap_err(),
    };
    assert_eq!(
        (status.code(), status.message()),
        (tonic::Code::Unavailable, full.as_str())
    );

    go.send(()).unwrap();
    large.join().unwrap();
    let mut served = None;
    for _ in 0..50 {
        let r = send().await.unwrap();
        if r.status() == 200 {
            served = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let served = served.expect("served once the large body is gone");
    let answer: serde_json::Value = served.json().await.unwrap();
    assert_eq!(answer["outputs"][0]["shape"], serde_json::json!([1, n]));
    let answer = grpc
        .model_infer(message.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.raw_output_contents[0].len(), n * 4);
    let answer = grpc
        .model_stream_infer(futures_util::stream::iter([message]))
        .await
        .unwrap()
        .into_inner()
        .next()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer.error_message, "");
    // Every body answered, or gone, has given its share back.
    assert_eq!(gauge.get(), 0);
    gw.shutdown().await;
}

/// Tensors written out in JSON are decoded into new buffers (up to about four times their
/// text), and those count against the budget for bodies too, beside the body: a body that
/// fits but decodes to more than the whole budget is the client's 413, named as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tensors_decoded_from_json_count_against_the_budget() {
    const BUDGET: usize = 1 << 20;
    let gw = budgeted(BUDGET).await;
    let n = 300_000;
    let zeros = vec!["0"; n].join(",");
    let body = format!(
        r#"{{"inputs":[{{"name":"INPUT0","shape":[1,{n}],"datatype":"FP32","data":[{zeros}]}}]}}"#
    );
    assert!(body.len() < BUDGET);
    let r = reqwest::Client::new()
        .post(format!("http://{}/v2/models/identity_fp32/infer", gw.addr))
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap(),
        serde_json::json!({ "error": format!(
            "the request decodes to {} bytes, more than the {BUDGET} bytes all request bodies may hold at once (limits.max_buffered_body_bytes)",
            body.len() + 4 * n
        ) })
    );
    assert_eq!(gw.gateway.metrics.buffered_body_bytes.get(), 0);
    gw.shutdown().await;
}

/// A large answer is not compressed on the connection's thread (70 MB of JSON took 5.6 s
/// of it, and liveness probes sharing it waited as long): it is gzipped by the gateway for
/// a client that accepts gzip, and sent as it is to one that accepts only other codings.
/// (That the gzip runs on the blocking pool is `gateway::heavy`'s own test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_answer_is_gzipped_only_for_a_client_that_takes_gzip() {
    let gw = gateway(|_| {}).await;
    let n = 100_000;
    let head = format!(
        r#"{{"inputs":[{{"name":"INPUT0","shape":[1,{n}],"datatype":"FP32","parameters":{{"binary_data_size":{}}}}}],"outputs":[{{"name":"OUTPUT0","parameters":{{"binary_data":false}}}}]}}"#,
        4 * n
    );
    let mut body = head.clone().into_bytes();
    body.extend((0..n).flat_map(|i| (i as f32).to_le_bytes()));
    let client = reqwest::Client::new();
    let send = |accept: &'static str| {
        client
            .post(format!("http://{}/v2/models/identity_fp32/infer", gw.addr))
            .header("inference-header-content-length", head.len())
            .header("accept-encoding", accept)
            .body(body.clone())
            .send()
    };
    let r = send("deflate, gzip;q=0.5").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-encoding"], "gzip");
    assert_eq!(r.headers()["vary"], "accept-encoding");
    let gz = r.bytes().await.unwrap();
    let mut json = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut json).unwrap();
    assert!(
        json.len() > 256 << 10 && gz.len() < json.len() / 2,
        "{} {}",
        json.len(),
        gz.len()
    );
    let answer: serde_json::Value = serde_json::from_slice(&json).unwrap();
    let data = answer["outputs"][0]["data"].as_array().unwrap();
    assert_eq!(data.len(), n);
    assert_eq!(data[n - 1], serde_json::json!((n - 1) as f64));

    // Large, and the client takes no gzip: as it is, not deflated in place.
    for accept in ["deflate", "gzip;q=0, deflate"] {
        let r = send(accept).await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.headers().get("content-encoding").is_none(), "{accept}");
        assert_eq!(r.bytes().await.unwrap().len(), json.len());
    }
    gw.shutdown().await;
}

/// A compressed body is inflated once it has all arrived: a slow client's wait holds only
/// its compressed bytes in the budget for bodies, not what they will inflate to (a few KiB
/// of gzip'd JSON held close to the whole budget, and other clients got 503s meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_compressed_body_holds_only_its_compressed_bytes() {
    const BUDGET: usize = 1 << 20;
    let gw = budgeted(BUDGET).await;
    let addr = gw.addr;
    let gauge = gw.gateway.metrics.buffered_body_bytes.clone();
    // Long numbers, so that the body and the tensor it decodes to (4 bytes an element,
    // counted too) fit the budget together: 720 KB and 240 KB.
    let n = 60_000;
    let zeros = vec!["0.0000000000"; n].join(",");
    let slow_json = format!(
        r#"{{"inputs":[{{"name":"INPUT0","shape":[1,{n}],"datatype":"FP32","data":[{zeros}]}}]}}"#
    );
    assert!(slow_json.len() > 700_000 && slow_json.len() + 4 * n < BUDGET);
    let gz = crate::common::gzip(slow_json.as_bytes());
    assert!(gz.len() < 8 << 10, "{}", gz.len());

    // All but its last 8 bytes, then nothing until told to go on.
    let (go, gone) = std::sync::mpsc::channel::<()>();
    let slow = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(
            s,
            "POST /v2/models/identity_fp32/infer HTTP/1.1\r\nhost: a\r\ncontent-encoding: gzip\r\ncontent-length: {}\r\n\r\n",
            gz.len()
        )
        .unwrap();
        s.write_all(&gz[..gz.len() - 8]).unwrap();
        let _ = gone.recv_timeout(Duration::from_secs(30));
        s.write_all(&gz[gz.len() - 8..]).unwrap();
        read_all(&mut s, Duration::from_secs(20))
    });
    let mut waited = 0;
    while gauge.get() == 0 && waited < 100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += 1;
    }
    let held = gauge.get();
    assert!(held > 0 && held < 8 << 10, "{held}");

    // An honest body larger than what is left once the slow one inflated is served (binary:
    // it decodes to nothing more).
    let m = 150_000;
    let head = format!(
        r#"{{"inputs":[{{"name":"INPUT0","shape":[1,{m}],"datatype":"FP32","parameters":{{"binary_data_size":{}}}}}]}}"#,
        4 * m
    );
    let mut honest = head.clone().into_bytes();
    honest.extend(vec![0u8; 4 * m]);
    assert!(honest.len() + slow_json.len() > BUDGET);
    let client = reqwest::Client::new();
    let r = client
        .post(format!("http://{addr}/v2/models/identity_fp32/infer"))
        .header("inference-header-content-length", head.len())
        .body(honest)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    go.send(()).unwrap();
    let reply = tokio::task::spawn_blocking(move || slow.join().unwrap())
        .await
        .unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply:.300}");
    assert!(reply.contains(r#""shape":[1,60000]"#), "{reply:.300}");
    assert_eq!(gauge.get(), 0);
    gw.shutdown().await;
}

/// A compressed JSON body stops inflating at the JSON limit (not the larger body limit),
/// gzip's members all count, and bytes after the compressed data are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_bodies_inflate_within_their_limits_and_whole() {
    let gw = gateway(|c| {
        c.limits.max_body_bytes = 4 << 20;
        c.limits.max_json_bytes = 100_000;
    })
    .await;
    let client = reqwest::Client::new();
    let send = |coding: &'static str, body: Vec<u8>, ihcl: Option<usize>| {
        let mut req = client
            .post(format!("http://{}/v2/models/simple/infer", gw.addr))
            .header("content-encoding", coding)
            .body(body);
        if let Some(n) = ihcl {
            req = req.header("inference-header-content-length", n);
        }
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<serde_json::Value>().await.unwrap())
        }
    };
    let error = |v: serde_json::Value| v["error"].as_str().unwrap().to_string();

    // 2 MiB of spaces: a few KiB on the wire, past the JSON limit once inflated.
    let bomb = crate::common::gzip(&vec![b' '; 2 << 20]);
    let (status, v) = send("gzip", bomb, None).await;
    assert_eq!(
        (status, error(v)),
        (
            413,
            "the request body inflates to more than 100000 bytes (limits.max_json_bytes)".into()
        )
    );

    // Two gzip members (`cat a.gz b.gz`) are one body.
    let (head, tail) = SIMPLE.split_at(40);
    let mut two = crate::common::gzip(head.as_bytes());
    two.extend(crate::common::gzip(tail.as_bytes()));
    let (status, v) = send("gzip", two, None).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["outputs"][0]["data"][15], 30);

    let mut junk = crate::common::gzip(SIMPLE.as_bytes());
    junk.extend_from_slice(b"junk");
    let (status, v) = send("gzip", junk, None).await;
    assert_eq!(
        (status, error(v)),
        (
            400,
            "cannot read the request body: it is not valid gzip (Content-Encoding): 4 bytes follow the end of the compressed data".into()
        )
    );
    let mut junk = crate::common::deflate(SIMPLE.as_bytes());
    junk.extend_from_slice(b"junk");
    let (status, v) = send("deflate", junk, None).await;
    assert_eq!(
        (status, error(v)),
        (
            400,
            "cannot read the request body: it is not valid deflate (Content-Encoding): 4 bytes follow the end of the compressed data; HTTP's deflate is zlib's format (RFC 1950)".into()
        )
    );
    gw.shutdown().await;
}
