//! How the gateway finds the models of each kind of v2 server, against scripted servers that
//! answer as the real ones do: KServe 0.21 (no repository index, `GET /v2/models`,
//! `"versions": null`, NaN written as `null`), a server that exposes nothing, and Triton
//! (from the fixtures in `tests/fixtures/triton/`).

use crate::common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{json, Value};

/// Every request line the scripted server received: `METHOD path`.
type Seen = Arc<Mutex<Vec<String>>>;

/// What one kind of server answers to one request: status and body.
type Script = fn(&str, &str, &Bytes) -> (u16, String);

/// KServe 0.21 with one custom model, `addsub`: the repository index is a 404, the models
/// are listed at `GET /v2/models`, metadata has `"versions": null` and no `platform`, and a
/// NaN output element is written as `null`.
fn kserve(method: &str, path: &str, _body: &Bytes) -> (u16, String) {
    let not_found = |what: &str| {
        (
            404,
            json!({ "error": format!("{what} not found") }).to_string(),
        )
    };
    match (method, path) {
        ("GET", "/v2") => (
            200,
            json!({"name": "kserve", "version": "0.21.0", "extensions": ["model_repository_extension"]})
                .to_string(),
        ),
        ("GET", "/v2/health/ready" | "/v2/health/live") => (200, r#"{"ready":true}"#.into()),
        ("POST", "/v2/repository/index") => not_found("Not Found"),
        ("GET", "/v2/models") => (200, r#"{"models":["addsub"]}"#.into()),
        ("GET", "/v2/models/addsub") => (
            200,
            json!({
                "name": "addsub", "versions": null,
                "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 2]}],
                "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 2]},
                            {"name": "COUNT", "datatype": "INT32", "shape": [1]}],
            })
            .to_string(),
        ),
        ("GET", "/v2/models/addsub/ready") => (200, r#"{"name":"addsub","ready":true}"#.into()),
        ("POST", "/v2/models/addsub/infer") => (
            200,
            r#"{"id":"1","model_name":"addsub","model_version":null,"outputs":[
                {"name":"OUTPUT0","datatype":"FP32","shape":[1,2],"data":[null,2.5]},
                {"name":"COUNT","datatype":"INT32","shape":[1],"data":[1]}]}"#
                .into(),
        ),
        (_, p) if p.contains("/versions/") => (501, r#"{"error":"not implemented"}"#.into()),
        _ => not_found("Model"),
    }
}

/// A v2 server that answers health and metadata but lists no models anywhere.
fn lists_nothing(method: &str, path: &str, body: &Bytes) -> (u16, String) {
    match (method, path) {
        ("GET", "/v2/models") => (404, r#"{"error":"Not Found"}"#.into()),
        _ => kserve(method, path, body),
    }
}

/// Triton 2.55, answering from its fixtures (see their README): two versions of
/// `densenet_onnx` ready, one model unloaded and one that failed to load (both UNAVAILABLE,
/// with reasons), and one in the repository that was never loaded (a name-only entry).
fn triton(method: &str, path: &str, _body: &Bytes) -> (u16, String) {
    let fixture = |name: &str| {
        std::fs::read_to_string(format!(
            "{}/tests/fixtures/triton/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .expect("the Triton fixture exists")
    };
    match (method, path) {
        ("GET", "/v2") => (200, fixture("server_metadata.json")),
        ("GET", "/v2/health/ready") => (200, String::new()),
        ("POST", "/v2/repository/index") => (200, fixture("repository_index.json")),
        ("GET", "/v2/models/densenet_onnx") => (200, fixture("model_metadata_onnx.json")),
        ("GET", "/v2/models/densenet_onnx/ready") => (200, String::new()),
        // Triton 2.55 to 2.70: any model that is not ready, known or not.
        ("GET", p) if p.ends_with("/ready") => {
            (400, r#"{"error":"Model version not ready"}"#.into())
        }
        ("GET", "/v2/models/unloaded_model" | "/v2/models/broken_model") => {
            let m = path.trim_start_matches("/v2/models/");
            (
                404,
                json!({ "error": format!("Request for unknown model: '{m}' has no available versions") })
                    .to_string(),
            )
        }
        ("GET", p) => {
            let m = p.trim_start_matches("/v2/models/");
            (
                404,
                json!({ "error": format!("Request for unknown model: '{m}' is not found") })
                    .to_string(),
            )
        }
        _ => (404, r#"{"error":"Not Found"}"#.into()),
    }
}

async fn answer(
    req: Request<Incoming>,
    script: Script,
    seen: Seen,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (method, path) = (req.method().to_string(), req.uri().path().to_string());
    let body = req.into_body().collect().await.unwrap().to_bytes();
    seen.lock().unwrap().push(format!("{method} {path}"));
    let (status, text) = script(&method, &path, &body);
    Ok(Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(text)))
        .unwrap())
}

async fn start_backend(script: Script) -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let shared = seen.clone();
    let addr = serve_fn(move |r| answer(r, script, shared.clone())).await;
    (addr, seen)
}

/// The gateway exactly as `tensorgate serve --backend URL` runs it: the embedded default
/// config (which has `[models.accumulate]` and `[models.classifier]` settings) and one
/// backend with no models list.
async fn gateway_in_front_of(backend: SocketAddr) -> Env {
    let gateway = tensorgate::run::start(front_config(&format!("http://{backend}")), true)
        .await
        .expect("the gateway starts");
    Env::new(Topology::Worker, gateway, None)
}

async fn metrics(env: &Env) -> String {
    let addr = env.gateway.metrics_addr.expect("metrics are on");
    env.client
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn nan_request() -> Value {
    json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kserve_is_found_by_its_model_list_with_no_other_setup() {
    let (backend, seen) = start_backend(kserve).await;
    let env = gateway_in_front_of(backend).await;
    assert_eq!(env.get("/v2/health/ready").await.status, 200);
    let meta = env.get("/v2/models/addsub").await;
    assert_eq!(meta.status, 200);
    // No versions listed: the gateway's metadata says none, as KServe's does.
    assert_eq!(meta.json().get("versions"), None);
    assert_eq!(meta.json()["inputs"][0]["shape"], json!([-1, 2]));
    assert_eq!(env.get("/v2/models/addsub/ready").await.status, 200);
    // Only what KServe announced was probed: never the embedded default's configured
    // models, which KServe answers with an error traceback in its log.
    let probed: Vec<String> = seen.lock().unwrap().clone();
    assert!(
        probed
            .iter()
            .all(|p| !p.contains("accumulate") && !p.contains("classifier")),
        "{probed:?}"
    );
    assert!(probed.contains(&"GET /v2/models".to_string()), "{probed:?}");
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_null_float_from_a_backend_reaches_the_client_as_nan() {
    let (backend, _) = start_backend(kserve).await;
    let env = gateway_in_front_of(backend).await;
    let r = env.infer_json("addsub", &nan_request()).await;
    r.assert_json_response();
    let v = r.json();
    assert_eq!(v["outputs"][0]["data"], json!(["NaN", 2.5]));
    assert_eq!(v["outputs"][1]["data"], json!([1]));
    // In binary, the IEEE NaN.
    let mut req = nan_request();
    req["parameters"] = json!({"binary_data_output": true});
    let resp = env.infer_json("addsub", &req).await.decode();
    let values = fp32s(output(&resp, "OUTPUT0"));
    assert!(values[0].is_nan(), "{values:?}");
    assert_eq!(values[1], 2.5);
    // Each forgiveness is counted, by backend and kind.
    let text = metrics(&env).await;
    let name = "backend-0";
    for (kind, at_least) in [("null_float_as_nan", 2), ("metadata_versions_absent", 1)] {
        let line = text
            .lines()
            .find(|l| {
                l.starts_with("tensorgate_backend_tolerated_total")
                    && l.contains(&format!("backend=\"{name}\""))
                    && l.contains(&format!("tolerance=\"{kind}\""))
            })
            .unwrap_or_else(|| panic!("no {kind} series in\n{text}"));
        let n: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(n >= at_least, "{line}");
    }
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_in_the_path_of_a_model_that_lists_none_is_refused_everywhere() {
    let (backend, seen) = start_backend(kserve).await;
    let env = gateway_in_front_of(backend).await;
    let message = "model 'addsub' lists no versions; address it without '/versions/1'";
    env.get("/v2/models/addsub/versions/1")
        .await
        .assert_error(404, message);
    env.get("/v2/models/addsub/versions/1/ready")
        .await
        .assert_error(404, message);
    let r = env
        .post(
            "/v2/models/addsub/versions/1/infer",
            &json_body(&nan_request()),
        )
        .await;
    r.assert_error(404, message);
    let probed = seen.lock().unwrap().clone();
    assert!(
        probed.iter().all(|p| !p.contains("/versions/")),
        "{probed:?}"
    );
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_explains_a_backend_that_exposes_no_models() {
    let (backend, _) = start_backend(lists_nothing).await;
    let env = gateway_in_front_of(backend).await;
    env.get("/v2/health/ready").await.assert_error(
        503,
        "no backend has a ready model; backend 'backend-0' exposes no models: \
         POST /v2/repository/index answered 404 Not Found; GET /v2/models answered 404 Not Found; \
         and the config names no models for it ([[backends]] models = [...])",
    );
    env.get("/v2/models/addsub")
        .await
        .assert_error(404, "unknown model 'addsub'");
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_the_config_names_for_a_backend_are_probed_when_it_lists_none() {
    let (backend, seen) = start_backend(lists_nothing).await;
    let mut config = front_config(&format!("http://{backend}"));
    config.backends[0].models = vec!["addsub".into()];
    let gateway = tensorgate::run::start(config, false)
        .await
        .expect("the gateway starts");
    let env = Env::new(Topology::Worker, gateway, None);
    assert_eq!(env.get("/v2/health/ready").await.status, 200);
    assert_eq!(env.get("/v2/models/addsub").await.status, 200);
    assert!(seen
        .lock()
        .unwrap()
        .contains(&"GET /v2/models/addsub".to_string()));
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triton_is_found_by_its_index_and_its_unavailable_models_are_not_served() {
    let (backend, seen) = start_backend(triton).await;
    let env = gateway_in_front_of(backend).await;
    assert_eq!(env.get("/v2/health/ready").await.status, 200);
    let meta = env.get("/v2/models/densenet_onnx").await.json();
    assert_eq!(meta["versions"], json!(["1", "2"]));
    assert_eq!(meta["platform"], "onnxruntime_onnx");
    // Listed versions are addressable; others are not.
    assert_eq!(
        env.get("/v2/models/densenet_onnx/versions/2/ready")
            .await
            .status,
        200
    );
    env.get("/v2/models/densenet_onnx/versions/3")
        .await
        .assert_error(
            404,
            "model 'densenet_onnx' has no version '3' (its versions are 1, 2)",
        );
    // The statistics extension knows each listed version.
    let stats = env
        .get("/v2/models/densenet_onnx/versions/2/stats")
        .await
        .json();
    assert_eq!(
        stats["model_stats"].as_array().map(Vec::len),
        Some(1),
        "{stats}"
    );
    assert_eq!(stats["model_stats"][0]["version"], "2");
    let all = env.get("/v2/models/densenet_onnx/stats").await.json();
    let versions: Vec<&str> = all["model_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["version"].as_str().unwrap())
        .collect();
    assert_eq!(versions, ["1", "2"]);
    // Unloaded and failed models are listed UNAVAILABLE, a never-loaded one by name only:
    // Triton refuses their metadata, and the gateway does not make them up. It says why
    // where Triton's index does.
    env.get("/v2/models/unloaded_model").await.assert_error(
        404,
        "model 'unloaded_model' is not available: UNAVAILABLE on backend 'backend-0' version 1: unloaded",
    );
    let broken = env.get("/v2/models/broken_model").await;
    assert_eq!(broken.status, 404);
    let error = broken.json()["error"].as_str().unwrap().to_string();
    assert!(
        error.starts_with(
            "model 'broken_model' is not available: UNAVAILABLE on backend 'backend-0' version 1: "
        ) && error.contains("Protobuf parsing failed"),
        "{error}"
    );
    env.get("/v2/models/never_loaded_model")
        .await
        .assert_error(404, "unknown model 'never_loaded_model'");
    // Only indexed models were asked about.
    let probed = seen.lock().unwrap().clone();
    assert!(
        probed
            .iter()
            .all(|p| !p.contains("accumulate") && !p.contains("/v2/models ")),
        "{probed:?}"
    );
    assert!(
        !probed.contains(&"GET /v2/models".to_string()),
        "{probed:?}"
    );
    env.shutdown().await;
}
