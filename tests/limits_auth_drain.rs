//! Each limit hit once with its status and message, bearer auth, and graceful shutdown
//! (readiness goes first, in-flight requests finish, exit status 0).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use tensorgate::config::{AuthConfig, Config};
use tensorgate::run::Running;

async fn gateway(edit: impl FnOnce(&mut Config)) -> Running {
    let mut c = Config::embedded_default();
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
    let ok = reqwest::get(format!("http://{addr}/v2/health/live"))
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_is_shed_beyond_the_concurrency_limit_and_slow_bodies_time_out() {
    let gw = gateway(|c| {
        c.limits.max_concurrent_requests = 1;
        c.limits.body_read_timeout_ms = 1500;
    })
    .await;
    let addr = gw.addr;
    // Hold the one permit with a request whose body never completes.
    let slow = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(s, "POST /v2/models/simple/infer HTTP/1.1\r\nhost: a\r\ncontent-length: 1000\r\n\r\n{{\"inp").unwrap();
        read_all(&mut s, Duration::from_secs(10))
    });
    // Wait (bounded) until the slow request holds the permit.
    let client = reqwest::Client::new();
    let mut shed = None;
    for _ in 0..100 {
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
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = shed.expect("a second request is shed while the first holds the only permit");
    assert_eq!(r.headers()["retry-after"], "1");
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        v["error"],
        "tensorgate is handling its limit of 1 concurrent requests (limits.max_concurrent_requests); retry later"
    );
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
    // With the permit back, requests are served.
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
    for path in ["/v2/health/live", "/v2/health/ready"] {
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
            "[server]\nlisten = \"127.0.0.1:{gp}\"\nmetrics_listen = \"127.0.0.1:{}\"\n\
             [limits]\nshutdown_delay_ms = 1500\n\
             [[backends]]\nname = \"w\"\nurl = \"http://127.0.0.1:{wp}\"\n",
            free_port()
        ),
    )
    .unwrap();
    let mut gw = Child(
        std::process::Command::new(bin)
            .args(["serve", "--config", config.to_str().unwrap()])
            .env("RUST_LOG", "warn")
            .spawn()
            .unwrap(),
    );
    wait_ready(&format!("http://127.0.0.1:{gp}/v2/health/ready")).await;

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
            let client = reqwest::Client::new();
            let (mut ok, mut refused) = (0u32, 0u32);
            for _ in 0..200 {
                match client.post(&url).body(body.clone()).send().await {
                    Ok(r) => {
                        // Any response the server gave must be a complete success.
                        assert_eq!(r.status(), 200, "a request accepted during shutdown failed");
                        let v: serde_json::Value = r.json().await.expect("a complete body");
                        assert_eq!(v["outputs"][0]["data"][3], 1.5);
                        ok += 1;
                    }
                    Err(e) => {
                        // After the listener closed: refused or reset before a response.
                        assert!(e.is_connect() || e.is_request(), "{e}");
                        refused += 1;
                        if refused > 3 {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            (ok, refused)
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
    let mut served = 0;
    for c in clients {
        served += c.await.unwrap().0;
    }
    assert!(served > 0);
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
