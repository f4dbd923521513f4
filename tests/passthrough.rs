//! In front of a Triton-like backend (it lists `binary_tensor_data`, so it returns exactly
//! the outputs asked for, in the encodings asked for), a request that needs no change goes
//! on as the client's own bytes, and the backend's response comes back as it was sent.

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

/// The infer bodies the backend received, with their Inference-Header-Content-Length.
type Log = Arc<Mutex<Vec<(Option<String>, Bytes)>>>;

const IHCL: &str = "inference-header-content-length";

/// The backend's infer response: a JSON header, then OUTPUT0's 8 bytes in binary. Its
/// spacing and key order are its own, so a re-encoded response would differ.
fn backend_response() -> (String, Bytes) {
    let header = r#"{ "model_name" : "m", "model_version": "1", "outputs" : [ { "name": "OUTPUT0", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8} } ] }"#;
    let mut body = header.as_bytes().to_vec();
    body.extend_from_slice(&1.5f32.to_le_bytes());
    body.extend_from_slice(&2.5f32.to_le_bytes());
    (header.len().to_string(), Bytes::from(body))
}

async fn answer(req: Request<Incoming>, log: Log) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let ihcl = req
        .headers()
        .get(IHCL)
        .map(|v| v.to_str().unwrap().to_string());
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let json_reply = |v: serde_json::Value| Response::new(Full::new(Bytes::from(v.to_string())));
    Ok(match path.as_str() {
        "/v2/health/ready" | "/v2/health/live" | "/v2/models/m/ready" => json_reply(json!({})),
        "/v2" => json_reply(
            json!({"name": "triton-like", "version": "1", "extensions": ["binary_tensor_data"]}),
        ),
        "/v2/models/m" => json_reply(json!({
            "name": "m",
            "versions": ["1"],
            "platform": "test",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}],
        })),
        "/v2/repository/index" => json_reply(json!([{"name": "m", "state": "READY"}])),
        "/v2/models/m/infer" => {
            log.lock().unwrap().push((ihcl, body));
            let (header_len, body) = backend_response();
            Response::builder()
                .header("content-type", "application/octet-stream")
                .header(IHCL, header_len)
                .body(Full::new(body))
                .unwrap()
        }
        _ => Response::builder()
            .status(404)
            .body(Full::new(Bytes::from_static(br#"{"error":"not found"}"#)))
            .unwrap(),
    })
}

async fn start_backend() -> (SocketAddr, Log) {
    let log: Log = Arc::default();
    let shared = log.clone();
    let addr = common::serve_fn(move |r| answer(r, shared.clone())).await;
    (addr, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_request_and_response_cross_as_their_own_bytes() {
    let (backend, log) = start_backend().await;
    let mut config = Config::embedded_default();
    config.server.listen = "127.0.0.1:0".parse().unwrap();
    config.server.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    config.server.grpc_listen = None;
    config.set_backends(&[format!("http://{backend}")]).unwrap();
    let gw = tensorgate::run::start(config, false).await.unwrap();
    let client = reqwest::Client::new();
    let url = format!("http://{}/v2/models/m/infer", gw.addr);

    // A binary request with the client's own spacing, and a JSON one with a data array
    // written the long way: both valid, both what the backend handles as they are.
    let header = r#"{ "inputs":[ {"name":"INPUT0","shape":[2],"datatype":"FP32","parameters":{"binary_data_size":8}} ], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": true}}]}"#;
    let mut binary = header.as_bytes().to_vec();
    binary.extend_from_slice(&3.0f32.to_le_bytes());
    binary.extend_from_slice(&4.0f32.to_le_bytes());
    let json_body = r#"{"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [3.000, 4e0]}], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": true}}]}"#;
    let cases = [
        (Some(header.len().to_string()), Bytes::from(binary)),
        (None, Bytes::from_static(json_body.as_bytes())),
    ];
    for (ihcl, body) in cases {
        let mut req = client.post(&url).body(body.clone());
        if let Some(h) = &ihcl {
            req = req.header(IHCL, h);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 200);
        let (want_len, want_body) = backend_response();
        assert_eq!(r.headers()[IHCL], want_len.as_str());
        assert_eq!(r.headers()["content-type"], "application/octet-stream");
        assert_eq!(r.bytes().await.unwrap(), want_body, "the response as sent");
        let received = log
            .lock()
            .unwrap()
            .pop()
            .expect("the backend got the request");
        assert_eq!(received, (ihcl, body), "the request as the client sent it");
    }
    gw.shutdown().await;
}
