//! The gateway in front of a minimal v2 server that records every request it gets, for
//! what only the backend's side of the wire shows: the trace context the gateway sends, and
//! how it treats a model that lists no versions (as MLServer and KServe models often do).

use crate::common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::json;
use tensorgate::config::Config;

/// Method, path and headers of one request the backend received.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: http::HeaderMap,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// Answers like a v2 server without the binary extension, with the repository index,
/// serving model `m` (no versions): FP32 INPUT0 [-1] in, OUTPUT0 = [1.5, 2.5] out.
async fn answer(req: Request<Incoming>, log: Log) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    log.lock().unwrap().push(Seen {
        path: path.clone(),
        headers: req.headers().clone(),
    });
    let _ = req.into_body().collect().await;
    let body = match path.as_str() {
        "/v2/health/ready" | "/v2/health/live" => json!({}),
        "/v2" => json!({"name": "recording", "version": "1", "extensions": []}),
        "/v2/models/m" => json!({
            "name": "m",
            "platform": "test",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}],
        }),
        "/v2/models/m/ready" => json!({}),
        "/v2/repository/index" => json!([{"name": "m", "state": "READY"}]),
        p if p.starts_with("/v2/models/m/") && p.ends_with("/infer") => json!({
            "model_name": "m",
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [2], "data": [1.5, 2.5]}],
        }),
        _ => {
            return Ok(Response::builder()
                .status(404)
                .body(Full::new(Bytes::from_static(br#"{"error":"not found"}"#)))
                .unwrap())
        }
    };
    Ok(Response::new(Full::new(Bytes::from(body.to_string()))))
}

async fn start_backend() -> (SocketAddr, Log) {
    let log: Log = Arc::default();
    let shared = log.clone();
    let addr = common::serve_fn(move |r| answer(r, shared.clone())).await;
    (addr, log)
}

async fn start_gateway(backend: SocketAddr) -> tensorgate::run::Running {
    let mut config = Config::embedded_default();
    config.server.listen = "127.0.0.1:0".parse().unwrap();
    config.server.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    config.server.grpc_listen = None;
    config.set_backends(&[format!("http://{backend}")]).unwrap();
    tensorgate::run::start(config, true).await.unwrap()
}

fn infers(log: &Log) -> Vec<Seen> {
    let log = log.lock().unwrap();
    log.iter()
        .filter(|s| s.path.ends_with("/infer"))
        .cloned()
        .collect()
}

const BODY: &str = r#"{"inputs":[{"name":"INPUT0","shape":[2],"datatype":"FP32","data":[1,2]}]}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traceparent_is_passed_on_or_created() {
    let (backend, log) = start_backend().await;
    let gw = start_gateway(backend).await;
    let url = format!("http://{}/v2/models/m/infer", gw.addr);
    let client = reqwest::Client::new();
    let given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let r = client
        .post(&url)
        .header("traceparent", given)
        .header("x-request-id", "req-7")
        .body(BODY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-request-id"], "req-7");
    let r = client.post(&url).body(BODY).send().await.unwrap();
    assert_eq!(r.status(), 200);
    gw.shutdown().await;

    let seen = infers(&log);
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].headers["traceparent"], given);
    assert_eq!(seen[0].headers["x-request-id"], "req-7");
    // None came from the client: the gateway made one, a valid W3C version-00 header.
    let created = seen[1].headers["traceparent"].to_str().unwrap();
    let parts: Vec<&str> = created.split('-').collect();
    assert_eq!(parts.len(), 4, "{created}");
    assert_eq!(
        (parts[0], parts[1].len(), parts[2].len(), parts[3]),
        ("00", 32, 16, "01"),
        "{created}"
    );
    assert!(
        parts[1..3].iter().all(|p| p
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            && p.bytes().any(|b| b != b'0')),
        "{created}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_a_model_does_not_list_are_refused_not_forwarded_nor_labelled() {
    let (backend, log) = start_backend().await;
    let gw = start_gateway(backend).await;
    let client = reqwest::Client::new();
    for v in ["7", "x1", "x2"] {
        let url = format!("http://{}/v2/models/m/versions/{v}/infer", gw.addr);
        let r = client.post(&url).body(BODY).send().await.unwrap();
        assert_eq!(r.status(), 404);
        let error: serde_json::Value = r.json().await.unwrap();
        assert_eq!(
            error["error"],
            format!("model 'm' lists no versions; address it without '/versions/{v}'")
        );
    }
    // The unversioned path still works, and only it reached the backend.
    let url = format!("http://{}/v2/models/m/infer", gw.addr);
    assert_eq!(
        client.post(&url).body(BODY).send().await.unwrap().status(),
        200
    );
    let paths: Vec<String> = infers(&log).into_iter().map(|s| s.path).collect();
    assert_eq!(paths, ["/v2/models/m/infer"]);
    // A client cannot mint label values.
    let metrics = reqwest::get(format!("http://{}/metrics", gw.metrics_addr.unwrap()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("nv_inference_request_success{model=\"m\",version=\"\"} 1"),
        "{metrics}"
    );
    for v in ["7", "x1", "x2"] {
        assert!(
            !metrics.contains(&format!("version=\"{v}\"")),
            "{v} became a label value"
        );
    }
    gw.shutdown().await;
}
