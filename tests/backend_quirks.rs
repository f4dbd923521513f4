//! The gateway in front of a scripted v2 server that behaves as the real servers do where
//! they depart from what tensorgate promises: Triton lists `classification` but rejects it
//! for FP16 and BF16 outputs, and writes non-finite floats as bare `NaN`/`Infinity`
//! literals; MLServer models without a signature describe no outputs.

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

/// The JSON bodies of the infer requests the backend received.
type Log = Arc<Mutex<Vec<Value>>>;

/// FP16 [2,4] the `half` model returns: exact in FP16, with a tie in the second row.
const HALF_ROWS: [[f32; 4]; 2] = [[0.5, -1.0, 2.25, 1.5], [3.0, 3.0, -0.25, 8.0]];

fn metadata(model: &str) -> Option<Value> {
    let io = |dt: &str| json!([{"name": "OUTPUT0", "datatype": dt, "shape": [-1, -1]}]);
    let inputs = json!([{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}]);
    Some(match model {
        "half" => json!({"name": model, "inputs": inputs, "outputs": io("FP16")}),
        "brain" => json!({"name": model, "inputs": inputs, "outputs": io("BF16")}),
        "full" | "empty" | "small" => {
            json!({"name": model, "inputs": inputs, "outputs": io("FP32")})
        }
        // MLServer without a signature: nothing described.
        "nosig" | "nonfinite" => {
            json!({"name": model, "platform": "", "inputs": [], "outputs": []})
        }
        _ => return None,
    })
}

/// What the scripted server answers to an infer request for `model`, like Triton would: a
/// 400 for classification of FP16/BF16, its own classes for FP32, raw tensors otherwise.
fn infer(model: &str, req: &Value) -> (u16, String) {
    let classes = req["outputs"][0]["parameters"]["classification"].as_u64();
    let out = |dt: &str, shape: Value, data: &str| {
        format!(
            r#"{{"model_name":"{model}","model_version":"1","outputs":[{{"name":"OUTPUT0","datatype":"{dt}","shape":{shape},"data":{data}}}]}}"#
        )
    };
    match (model, classes) {
        ("half" | "brain", Some(_)) => (
            400,
            json!({"error": "classification not supported for FP16/BF16"}).to_string(),
        ),
        ("half" | "brain", None) => {
            let dt = if model == "half" { "FP16" } else { "BF16" };
            (200, out(dt, json!([2, 4]), &json!(HALF_ROWS).to_string()))
        }
        ("full", Some(_)) => (
            200,
            out("BYTES", json!([1, 1]), r#"["9.000000:0:backend"]"#),
        ),
        ("nosig", _) => {
            let data: Vec<f32> = (0..36).map(|i| ((i * 7) % 12) as f32).collect();
            (200, out("FP32", json!([3, 12]), &json!(data).to_string()))
        }
        // Triton's JSON writer: non-finite floats as bare literals.
        ("nonfinite", _) => {
            let fp32 = r#"{"name":"F32","datatype":"FP32","shape":[4],"data":[NaN,Infinity,-Infinity,1.5]}"#;
            let fp64 = r#"{"name":"F64","datatype":"FP64","shape":[2,2],"data":[[-Infinity,NaN],[2.5,Infinity]]}"#;
            let fp16 =
                r#"{"name":"F16","datatype":"FP16","shape":[3],"data":[Infinity, NaN, -Infinity]}"#;
            (
                200,
                format!(r#"{{"model_name":"nonfinite","outputs":[{fp32},{fp64},{fp16}]}}"#),
            )
        }
        // A server that answers without any output.
        ("empty", _) => (200, r#"{"model_name":"empty","outputs":[]}"#.to_string()),
        // A server whose body limit is below the gateway's.
        ("small", _) => (413, json!({"error": "request body too large"}).to_string()),
        _ => (500, json!({"error": "unscripted"}).to_string()),
    }
}

async fn answer(
    req: Request<Incoming>,
    extensions: Value,
    log: Log,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let parts: Vec<&str> = path.trim_start_matches("/v2").split('/').collect();
    let (status, text) = match parts.as_slice() {
        [""] => (
            200,
            json!({"name": "scripted", "version": "1", "extensions": extensions}).to_string(),
        ),
        ["", "health", _] => (200, "{}".to_string()),
        ["", "repository", "index"] => {
            let models: Vec<Value> = [
                "half",
                "brain",
                "full",
                "nosig",
                "nonfinite",
                "empty",
                "small",
            ]
            .iter()
            .map(|m| json!({"name": m, "state": "READY"}))
            .collect();
            (200, Value::from(models).to_string())
        }
        // Configurations that vouch for nothing: an ensemble's (Triton's has no room for
        // sequence batching beside its ensemble scheduling, whatever its models keep), and
        // the "unknown" limit another tensorgate answers.
        ["", "models", "brain", "config"] => (
            200,
            json!({"name": "brain", "platform": "ensemble", "max_batch_size": 4,
                   "ensemble_scheduling": {"step": []}})
            .to_string(),
        ),
        ["", "models", "nonfinite", "config"] => (
            200,
            json!({"name": "nonfinite", "max_batch_size": 2147483647}).to_string(),
        ),
        ["", "models", m] => match metadata(m) {
            Some(v) => (200, v.to_string()),
            None => (404, r#"{"error":"unknown model"}"#.to_string()),
        },
        ["", "models", _, .., "ready"] => (200, "{}".to_string()),
        // The repository endpoints, as MLServer has them without listing an extension.
        ["", "repository", "models", m, action] => {
            log.lock()
                .unwrap()
                .push(json!({"repository": action, "model": m}));
            if *m == "missing" {
                (400, r#"{"error":"Model missing not found"}"#.to_string())
            } else {
                (200, String::new())
            }
        }
        ["", "models", m, .., "infer"] => {
            let v: Value = serde_json::from_slice(&body).expect("the gateway sends JSON");
            log.lock().unwrap().push(v.clone());
            infer(m, &v)
        }
        _ => (404, r#"{"error":"not found"}"#.to_string()),
    };
    Ok(Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(text)))
        .unwrap())
}

/// Starts the scripted server on 127.0.0.1, listing `extensions`.
async fn start_backend(extensions: &[&str]) -> (SocketAddr, Log) {
    let log: Log = Arc::default();
    let (shared, extensions) = (log.clone(), json!(extensions));
    let addr = serve_fn(move |r| answer(r, extensions.clone(), shared.clone())).await;
    (addr, log)
}

async fn start_env(backend: SocketAddr) -> Env {
    let config = front_config(&format!("http://{backend}"));
    let gateway = tensorgate::run::start(config, false)
        .await
        .expect("the gateway starts");
    Env::new(Topology::Worker, gateway, None)
}

fn request(k: u64, binary: bool) -> Value {
    json!({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [0]}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": k, "binary_data": binary}}],
    })
}

fn strings(t: &tensorgate::protocol::Tensor) -> Vec<String> {
    t.bytes_elements()
        .map(|e| String::from_utf8(e.to_vec()).unwrap())
        .collect()
}

/// Triton lists `classification` but rejects it for FP16 and BF16, which tensorgate promises
/// to classify: in auto mode the gateway classifies those outputs itself, and passes the
/// others on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_precision_is_classified_by_the_gateway_for_a_classifying_backend() {
    let (backend, log) = start_backend(&["classification"]).await;
    let env = start_env(backend).await;
    for model in ["half", "brain"] {
        for binary in [false, true] {
            let r = env.infer_json(model, &request(2, binary)).await;
            let resp = r.decode();
            let o = output(&resp, "OUTPUT0");
            assert_eq!(
                (o.datatype, o.shape.clone()),
                (tensorgate::protocol::DataType::Bytes, vec![2, 2]),
                "{model}"
            );
            assert_eq!(
                strings(o),
                ["2.250000:2", "1.500000:3", "8.000000:3", "3.000000:0"],
                "{model}"
            );
        }
    }
    // The backend was asked for the raw tensor.
    for seen in log.lock().unwrap().iter() {
        assert!(
            seen["outputs"][0]["parameters"]
                .get("classification")
                .is_none(),
            "{seen}"
        );
    }
    // FP32 goes to the backend, which classifies it.
    log.lock().unwrap().clear();
    let r = env.infer_json("full", &request(1, false)).await;
    assert_eq!(
        r.json()["outputs"][0]["data"],
        json!(["9.000000:0:backend"])
    );
    let seen = log.lock().unwrap().clone();
    assert_eq!(seen[0]["outputs"][0]["parameters"]["classification"], 1);
    env.shutdown().await;
}

/// A model without a signature (MLServer) describes no outputs: an output of rank 2 or more
/// is [batch, classes], and each row is classified on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_without_metadata_are_batched_by_rank() {
    let (backend, _log) = start_backend(&[]).await;
    let env = start_env(backend).await;
    let r = env.infer_json("nosig", &request(2, false)).await;
    r.assert_json_response();
    let o = &r.json()["outputs"][0];
    assert_eq!(o["shape"], json!([3, 2]));
    assert_eq!(o["datatype"], "BYTES");
    // Each row of (i * 7) % 12 has 11 at column 5 and 10 at column 10.
    assert_eq!(
        o["data"],
        json!([
            "11.000000:5",
            "10.000000:10",
            "11.000000:5",
            "10.000000:10",
            "11.000000:5",
            "10.000000:10"
        ])
    );
    env.shutdown().await;
}

/// Triton writes non-finite floats as bare literals, which are not JSON; the gateway reads
/// them and answers with its own encoding (strings in JSON, IEEE bits in binary).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_non_finite_literals_from_a_backend_are_read() {
    let (backend, _log) = start_backend(&[]).await;
    let env = start_env(backend).await;
    let req = json!({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [0]}]});
    let r = env.infer_json("nonfinite", &req).await;
    r.assert_json_response();
    let v = r.json();
    assert_eq!(
        v["outputs"][0]["data"],
        json!(["NaN", "Infinity", "-Infinity", 1.5])
    );
    assert_eq!(
        v["outputs"][1]["data"],
        json!(["-Infinity", "NaN", 2.5, "Infinity"])
    );
    assert_eq!(
        v["outputs"][2]["data"],
        json!(["Infinity", "NaN", "-Infinity"])
    );
    let mut req = req;
    req["parameters"] = json!({"binary_data_output": true});
    let resp = env.infer_json("nonfinite", &req).await.decode();
    let f32s = fp32s(output(&resp, "F32"));
    assert!(f32s[0].is_nan());
    assert_eq!(&f32s[1..], &[f32::INFINITY, f32::NEG_INFINITY, 1.5]);
    env.shutdown().await;
}

/// A backend that answers 200 without any output, for a model that declares one: a 502 that
/// says so, whether the client listed the output or not (a 200 with no outputs would tell
/// it the request had worked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_without_outputs_is_the_backends_fault() {
    let (backend, _log) = start_backend(&[]).await;
    let env = start_env(backend).await;
    // front_config names its one backend so.
    let backend_name = "backend-0";
    let all =
        json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [0]}]});
    env.infer_json("empty", &all).await.assert_error(
        502,
        &format!("backend '{backend_name}' returned no outputs; model 'empty' declares 'OUTPUT0'"),
    );
    let mut listed = all.clone();
    listed["outputs"] = json!([{"name": "OUTPUT0"}]);
    env.infer_json("empty", &listed).await.assert_error(
        502,
        &format!("backend '{backend_name}' did not return the requested output 'OUTPUT0'"),
    );
    env.shutdown().await;
}

/// A backend's 413 is about what the gateway sent, which the gateway's own limits admitted
/// (transcoded, perhaps, to JSON that the client never sent): the deployment's fault, a
/// 502 naming the backend, not the client's 413.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backends_413_is_not_the_clients() {
    let (backend, _log) = start_backend(&[]).await;
    let env = start_env(backend).await;
    let body =
        json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [0]}]});
    env.infer_json("small", &body).await.assert_error(
        502,
        "backend 'backend-0' refused the request as the gateway sent it as too large (413: request body too large); its limit is below the gateway's",
    );
    env.shutdown().await;
}

/// MLServer 1.7 answers the repository index and has load and unload, but lists no
/// extensions: the gateway's load and unload reach it all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_and_unload_reach_a_server_that_answers_the_index_without_listing_it() {
    let (backend, log) = start_backend(&[]).await;
    let env = start_env(backend).await;
    let r = env
        .post("/v2/repository/models/full/load", &json_body(&json!({})))
        .await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    let name = r.json()["results"][0]["backend"].clone();
    assert_eq!(
        r.json(),
        json!({"model": "full", "action": "load", "results": [{"backend": name, "status": "ok"}]})
    );
    let r = env
        .post(
            "/v2/repository/models/missing/unload",
            &json_body(&json!({})),
        )
        .await;
    // The only backend refused it (it has no such model): the client's error, as it would
    // be from MLServer itself.
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["error"],
        format!(
            "unload of model 'missing' failed on 1 of 1 backends: {}: 400: Model missing not found",
            name.as_str().unwrap()
        )
    );
    assert_eq!(
        log.lock().unwrap().clone(),
        [
            json!({"repository": "load", "model": "full"}),
            json!({"repository": "unload", "model": "missing"})
        ]
    );
    env.shutdown().await;
}

/// An ensemble's configuration states nothing, so a sequence sent to it stays pinned (one of
/// its models may keep state); another tensorgate's "unknown" batch limit is no limit, and
/// states that the model keeps no sequence state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configurations_that_cannot_vouch_state_nothing() {
    let (addr, _) = start_backend(&[]).await;
    let env = start_env(addr).await;
    let catalog = env.gateway.gateway.fleet.catalog();
    let stated = |m: &str| {
        let e = catalog.get(m).unwrap();
        (e.stateless, e.batches, e.max_batch_size)
    };
    assert_eq!(stated("brain"), (false, None, None));
    assert_eq!(stated("nonfinite"), (true, None, None));
}
