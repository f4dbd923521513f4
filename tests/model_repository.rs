//! ONNX models from a Triton-style repository, served by `tensorgate worker
//! --model-repository` and in-process: outputs against onnxruntime's (tests/fixtures/onnx,
//! made by make_models.py and reference.py), real architectures from the onnx wheel's light
//! models, a corrupt model, load and unload on a worker, their fan-out through a gateway over
//! REST and gRPC, and health while a heavy model runs.

use crate::common_fleet;
use crate::common_grpc;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common_fleet::*;
use serde_json::{json, Value};
use tensorgate::protocol::grpc::pb;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/onnx")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A private copy of the fixture repository, which a test may change.
fn repository(tag: &str) -> TempDir {
    let dir = TempDir::new(tag);
    copy_dir(&fixtures().join("repo"), &dir.0);
    dir
}

/// Adds a policy to `repo`'s mlp that serves its latest two versions (Triton's default
/// serves the latest only).
fn serve_latest_two_versions_of_mlp(repo: &TempDir) {
    let config = repo.path("mlp/config.pbtxt");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!("{text}\nversion_policy: {{ latest {{ num_versions: 2 }} }}\n"),
    )
    .unwrap();
}

async fn worker(name: &str, repo: &Path) -> Worker {
    Worker::start_with(
        name,
        "127.0.0.1",
        0,
        &["simple"],
        &["--model-repository", repo.to_str().unwrap()],
        &[("RUST_LOG", "info")],
    )
    .await
}

/// A gateway over `workers` (name, URL), with gRPC on; its catalog is refreshed every minute
/// only, so what a test sees sooner came from a load's own refresh.
async fn gateway_over(workers: &[(&str, &str)]) -> tensorgate::run::Running {
    let text = gateway_toml(workers, "refresh_interval_ms = 60000")
        .replace("grpc_listen = \"\"", "grpc_listen = \"127.0.0.1:0\"");
    tensorgate::run::start(parse_config(&text), false)
        .await
        .unwrap()
}

async fn get_json(client: &reqwest::Client, url: &str) -> (u16, Value) {
    let r = client.get(url).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn post_json(client: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let r = client.post(url).json(body).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn index(client: &reqwest::Client, base: &str) -> Vec<Value> {
    let (status, body) =
        post_json(client, &format!("{base}/v2/repository/index"), &json!({})).await;
    assert_eq!(status, 200);
    body.as_array().unwrap().clone()
}

fn entry<'a>(index: &'a [Value], name: &str, version: &str) -> Option<&'a Value> {
    index
        .iter()
        .find(|e| e["name"] == name && e["version"] == version)
}

/// Compares one output with onnxruntime's: FP32 within |a-b| <= atol + rtol*|b|, the rest
/// exactly.
fn assert_output_matches(case: &str, got: &Value, expected: &Value, rtol: f64, atol: f64) {
    assert_eq!(got["datatype"], expected["datatype"], "{case}");
    assert_eq!(got["shape"], expected["shape"], "{case}");
    let (g, e) = (
        got["data"].as_array().unwrap(),
        expected["data"].as_array().unwrap(),
    );
    assert_eq!(g.len(), e.len(), "{case}");
    if expected["datatype"] == "FP32" {
        for (i, (a, b)) in g.iter().zip(e).enumerate() {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            assert!(
                (a - b).abs() <= atol + rtol * b.abs(),
                "{case}[{i}]: tract {a}, onnxruntime {b}"
            );
        }
    } else {
        assert_eq!(g, e, "{case}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_computes_what_onnxruntime_computes() {
    let repo = repository("onnx-ref");
    // Both versions of mlp, where Triton's default policy would serve the latest only.
    serve_latest_two_versions_of_mlp(&repo);
    let w = worker("w", &repo.0).await;
    let client = http_client();
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(repo.path("reference.json")).unwrap())
            .unwrap();
    let rtol = reference["tolerance"]["FP32"]["rtol"].as_f64().unwrap();
    let atol = reference["tolerance"]["FP32"]["atol"].as_f64().unwrap();
    let cases = reference["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 5);
    for case in cases {
        let (model, version) = (
            case["model"].as_str().unwrap(),
            case["version"].as_str().unwrap(),
        );
        let name = format!("{model}/{version}");
        let (status, body) = post_json(
            &client,
            &format!("{}/v2/models/{model}/versions/{version}/infer", w.url),
            &json!({ "inputs": case["inputs"] }),
        )
        .await;
        assert_eq!(status, 200, "{name}: {body}");
        for expected in case["outputs"].as_array().unwrap() {
            let got = body["outputs"]
                .as_array()
                .unwrap()
                .iter()
                .find(|o| o["name"] == expected["name"])
                .unwrap_or_else(|| panic!("{name}: no output {}", expected["name"]));
            assert_output_matches(
                &format!("{name} {}", expected["name"]),
                got,
                expected,
                rtol,
                atol,
            );
        }
    }

    // Metadata: config.pbtxt's with batching ([-1] + dims), the graph's without a config.
    let (_, mlp) = get_json(&client, &format!("{}/v2/models/mlp", w.url)).await;
    assert_eq!(
        mlp,
        json!({"name": "mlp", "versions": ["1", "2"], "platform": "onnxruntime_onnx",
               "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [-1, 16]}],
               "outputs": [{"name": "PROBS", "datatype": "FP32", "shape": [-1, 10]}]})
    );
    let (_, cnn) = get_json(&client, &format!("{}/v2/models/cnn", w.url)).await;
    assert_eq!(
        cnn["inputs"],
        json!([{"name": "IMAGE", "datatype": "FP32", "shape": [-1, 1, 28, 28]}])
    );
    assert_eq!(cnn["versions"], json!(["1"]));

    // Validated before tract sees it.
    let (status, body) = post_json(
        &client,
        &format!("{}/v2/models/mlp/infer", w.url),
        &json!({"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 15], "data": vec![0.5; 15]}]}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(
        body["error"],
        "input 'INPUT': shape [1,15] does not match the model's [-1,16] at dimension 1"
    );

    // max_batch_size is a bound, as in Triton; and an answer names the version that ran.
    let (status, body) = post_json(
        &client,
        &format!("{}/v2/models/mlp/infer", w.url),
        &json!({"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [9, 16], "data": vec![0.5; 144]}]}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(
        body["error"],
        "input 'INPUT': batch size 9 exceeds the model's max_batch_size 8"
    );
    let (status, body) = post_json(
        &client,
        &format!("{}/v2/models/intbool/infer", w.url),
        &json!({"inputs": [
            {"name": "A", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4]},
            {"name": "B", "datatype": "INT32", "shape": [1, 4], "data": [4, 3, 2, 1]}]}),
    )
    .await;
    assert_eq!(
        (status, &body["model_version"]),
        (200, &json!("2")),
        "{body}"
    );

    // Classification by the labels config.pbtxt names.
    let labels: Vec<String> = std::fs::read_to_string(repo.path("mlp/labels.txt"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let mlp_case = cases
        .iter()
        .find(|c| c["model"] == "mlp" && c["version"] == "2")
        .unwrap();
    let (status, body) = post_json(
        &client,
        &format!("{}/v2/models/mlp/infer", w.url),
        &json!({"inputs": mlp_case["inputs"],
                "outputs": [{"name": "PROBS", "parameters": {"classification": 3}}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let top = &body["outputs"][0];
    assert_eq!(
        (top["datatype"].as_str(), &top["shape"]),
        (Some("BYTES"), &json!([3, 3]))
    );
    for class in top["data"].as_array().unwrap() {
        let parts: Vec<&str> = class.as_str().unwrap().split(':').collect();
        let index: usize = parts[1].parse().unwrap();
        assert_eq!(parts[2], labels[index], "{class}");
    }
}

/// Triton's configs for scalars and reshaped tensors serve the shapes config.pbtxt gives,
/// with onnxruntime's values (Y = X + X): an ONNX scalar given as `dims: [ 1 ]`, a batch of
/// scalars (`dims: [ 1 ] reshape: { shape: [ ] }`, as Triton's auto-complete writes it) and
/// a [N, 2, 2] tensor served flat (`dims: [ 4 ] reshape: { shape: [ 2, 2 ] }`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reshaped_tensors_serve_the_shapes_config_pbtxt_gives() {
    let w = worker("w", &fixtures().join("scalar")).await;
    let client = http_client();
    let square: Vec<f64> = (0..8).map(f64::from).collect();
    let doubled: Vec<f64> = square.iter().map(|v| v * 2.0).collect();
    let cases = [
        ("scalar", json!([1]), json!([1]), json!([1.5]), json!([3.0])),
        (
            "batched_scalar",
            json!([-1, 1]),
            json!([3, 1]),
            json!([1.0, 2.0, 3.0]),
            json!([2.0, 4.0, 6.0]),
        ),
        (
            "flat_square",
            json!([-1, 4]),
            json!([2, 4]),
            json!(square),
            json!(doubled),
        ),
    ];
    for (model, served, shape, data, want) in cases {
        let (status, meta) = get_json(&client, &format!("{}/v2/models/{model}", w.url)).await;
        assert_eq!(status, 200, "{model}: {meta}");
        assert_eq!(meta["inputs"][0]["shape"], served, "{model}");
        assert_eq!(meta["outputs"][0]["shape"], served, "{model}");
        let body =
            json!({"inputs": [{"name": "X", "datatype": "FP32", "shape": shape, "data": data}]});
        let url = format!("{}/v2/models/{model}/infer", w.url);
        let (status, answer) = post_json(&client, &url, &body).await;
        assert_eq!(status, 200, "{model}: {answer}");
        assert_eq!(answer["outputs"][0]["shape"], shape, "{model}");
        assert_eq!(answer["outputs"][0]["data"], want, "{model}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_model_is_unavailable_and_the_others_serve() {
    let repo = repository("onnx-broken");
    // mlp's version 3 is corrupt; versions 2 and 3 are the latest two.
    serve_latest_two_versions_of_mlp(&repo);
    std::fs::create_dir_all(repo.path("mlp/3")).unwrap();
    std::fs::write(repo.path("mlp/3/model.onnx"), b"not a model").unwrap();
    let w = worker("w", &repo.0).await;
    let client = http_client();
    let index = index(&client, &w.url).await;
    let broken = entry(&index, "broken", "1").expect("broken is listed");
    assert_eq!(broken["state"], "UNAVAILABLE");
    let reason = broken["reason"].as_str().unwrap();
    assert!(
        reason.starts_with(&format!(
            "{}: not a model tract can load: ",
            repo.path("broken/1/model.onnx").display()
        )),
        "{reason}"
    );
    assert_eq!(entry(&index, "mlp", "2").unwrap()["state"], "READY");
    assert!(entry(&index, "mlp", "1").is_none());
    let mlp3 = entry(&index, "mlp", "3").expect("mlp 3 is listed");
    assert_eq!(mlp3["state"], "UNAVAILABLE");
    // A version that failed to load is named with why: 404 as Triton answers for a version
    // it cannot serve, 503 to a readiness probe.
    let (status, body) = get_json(&client, &format!("{}/v2/models/mlp/versions/3", w.url)).await;
    assert_eq!(
        (status, &body["error"]),
        (
            404,
            &json!(format!(
                "model 'mlp' version 3 is not available: UNAVAILABLE on backend 'builtin': {} (its versions are 2)",
                mlp3["reason"].as_str().unwrap()
            ))
        )
    );
    let ready = client
        .get(format!("{}/v2/models/mlp/versions/3/ready", w.url))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    let (status, body) = get_json(&client, &format!("{}/v2/models/mlp/versions/1", w.url)).await;
    assert_eq!(
        (status, &body["error"]),
        (
            404,
            &json!("model 'mlp' has no version '1' (its versions are 2)")
        )
    );
    // A load that leaves a version behind says so, as Triton's does (a deploy script must
    // not take it as done); the versions that loaded serve.
    let (status, body) = post_json(
        &client,
        &format!("{}/v2/repository/models/mlp/load", w.url),
        &json!({}),
    )
    .await;
    assert_eq!(
        (status, &body["error"]),
        (
            400,
            &json!(format!(
                "load of model 'mlp' failed: version 3: {} (version 2 serves)",
                mlp3["reason"].as_str().unwrap()
            ))
        ),
        "{body}"
    );
    let (status, _) = get_json(
        &client,
        &format!("{}/v2/models/mlp/versions/2/ready", w.url),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(entry(&index, "intbool", "1").unwrap()["state"], "READY");
    assert_eq!(entry(&index, "simple", "1").unwrap()["state"], "READY");
    // Not served, and the error says why rather than that the name is unknown.
    let (status, body) = get_json(&client, &format!("{}/v2/models/broken", w.url)).await;
    assert_eq!(
        (status, &body["error"]),
        (
            404,
            &json!(format!(
                "model 'broken' is not available: UNAVAILABLE on backend 'builtin' version 1: {reason}"
            ))
        )
    );
    let (status, body) = get_json(&client, &format!("{}/v2/models/nosuch", w.url)).await;
    assert_eq!(
        (status, &body["error"]),
        (404, &json!("unknown model 'nosuch'"))
    );
    let (status, _) = get_json(&client, &format!("{}/v2/health/ready", w.url)).await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_reads_the_repository_again_and_unload_unloads() {
    let repo = repository("onnx-load");
    let w = worker("w", &repo.0).await;
    let client = http_client();
    let load = |model: &str| format!("{}/v2/repository/models/{model}/load", w.url);
    let unload = |model: &str| format!("{}/v2/repository/models/{model}/unload", w.url);
    let image = json!({"inputs": [{"name": "IMAGE", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": vec![0.25; 784]}]});

    // A new model directory, and a new version of an old model.
    copy_dir(&repo.path("cnn"), &repo.path("cnn2"));
    copy_dir(&repo.path("mlp/2"), &repo.path("mlp/3"));
    let (status, body) = post_json(&client, &load("cnn2"), &json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"model": "cnn2", "action": "load", "results": [{"backend": "builtin", "status": "ok"}]})
    );
    let r = post_infer(&client, &w.url, "cnn2", &image).await;
    assert_eq!(
        r.status, 200,
        "the catalog knows the model once load answers: {r:?}"
    );
    let (status, _) = post_json(&client, &load("mlp"), &json!({})).await;
    assert_eq!(status, 200);
    let (_, mlp) = get_json(&client, &format!("{}/v2/models/mlp", w.url)).await;
    assert_eq!(mlp["versions"], json!(["3"]));

    // Unload: gone from the catalog, UNAVAILABLE in the index.
    let (status, _) = post_json(&client, &unload("cnn2"), &json!({})).await;
    assert_eq!(status, 200);
    let r = post_infer(&client, &w.url, "cnn2", &image).await;
    assert_eq!(
        (r.status, r.error()),
        (
            404,
            Some("model 'cnn2' is not available: UNAVAILABLE on backend 'builtin': unloaded")
        )
    );
    let idx = index(&client, &w.url).await;
    let e = idx.iter().find(|e| e["name"] == "cnn2").unwrap();
    assert_eq!(
        (&e["state"], &e["reason"]),
        (&json!("UNAVAILABLE"), &json!("unloaded"))
    );
    // Readiness: a model the repository knows is not ready (503), where an unknown one is
    // not found.
    for (model, status, error) in [
        (
            "cnn2",
            503,
            "model 'cnn2' is not available: UNAVAILABLE on backend 'builtin': unloaded",
        ),
        ("nosuch", 404, "unknown model 'nosuch'"),
    ] {
        let url = format!("{}/v2/models/{model}/ready", w.url);
        let (got, body) = get_json(&client, &url).await;
        assert_eq!((got, &body["error"]), (status, &json!(error)), "{model}");
    }

    // A corrupt new version fails to load; the loaded model keeps serving.
    std::fs::write(repo.path("cnn/1/model.onnx"), b"\0\0not onnx at all").unwrap();
    let (status, body) = post_json(&client, &load("cnn"), &json!({})).await;
    assert_eq!(status, 400, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.starts_with("load of model 'cnn' failed: version 1: "),
        "{error}"
    );
    assert_eq!(body["results"][0]["status"], "failed");
    let r = post_infer(&client, &w.url, "cnn", &image).await;
    assert_eq!(r.status, 200, "{r:?}");

    // Names that are not model directories.
    let (status, body) = post_json(&client, &load("nothing-here"), &json!({})).await;
    assert_eq!(status, 400);
    assert_eq!(
        body["error"],
        format!(
            "load of model 'nothing-here' failed: no model 'nothing-here' in the model repository {}",
            repo.0.display()
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_and_unload_fan_out_through_a_gateway() {
    let (repo_a, repo_b) = (repository("onnx-fan-a"), repository("onnx-fan-b"));
    // The same model, with a smaller batch limit on one of the two workers.
    let config = repo_b.path("mlp").join("config.pbtxt");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("max_batch_size: 8", "max_batch_size: 4"),
    )
    .unwrap();
    let a = worker("wa", &repo_a.0).await;
    let mut b = worker("wb", &repo_b.0).await;
    let gw = gateway_over(&[("wa", &a.url), ("wb", &b.url)]).await;
    let base = base(&gw);
    let client = http_client();
    let control = |model: &str, action: &str| {
        let url = format!("{base}/v2/repository/models/{model}/{action}");
        let client = &client;
        async move { post_json(client, &url, &json!({})).await }
    };
    // A request may go to either: the batch both take is the smaller limit, which the
    // gateway enforces whichever would get the request.
    let (_, mlp_config) = get_json(&client, &format!("{base}/v2/models/mlp/config")).await;
    assert_eq!(mlp_config["max_batch_size"], 4, "{mlp_config}");
    let six = json!({"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [6, 16], "data": vec![0.5; 96]}]});
    for _ in 0..6 {
        let r = post_infer(&client, &base, "mlp", &six).await;
        assert_eq!(
            (r.status, r.error(), r.backend.as_deref()),
            (
                400,
                Some("input 'INPUT': batch size 6 exceeds the model's max_batch_size 4"),
                None
            ),
            "{r:?}"
        );
    }

    // A model both repositories gain: loaded everywhere, served at once (the refresh
    // interval is a minute: the load itself refreshed the catalog).
    copy_dir(&repo_a.path("cnn"), &repo_a.path("digits"));
    copy_dir(&repo_b.path("cnn"), &repo_b.path("digits"));
    let (status, body) = control("digits", "load").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["results"],
        json!([{"backend": "wa", "status": "ok"}, {"backend": "wb", "status": "ok"}])
    );
    let image = json!({"inputs": [{"name": "IMAGE", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": vec![0.5; 784]}]});
    let r = post_infer(&client, &base, "digits", &image).await;
    assert_eq!(r.status, 200, "{r:?}");
    let idx = index(&client, &base).await;
    let digits = entry(&idx, "digits", "1").unwrap();
    assert_eq!(
        (&digits["state"], &digits["backends"]),
        (&json!("READY"), &json!(["wa", "wb"]))
    );
    let broken = entry(&idx, "broken", "1").unwrap();
    assert_eq!(broken["state"], "UNAVAILABLE");

    // A model only one repository has: 502 naming the other, with both results.
    copy_dir(&repo_a.path("cnn"), &repo_a.path("only-a"));
    let (status, body) = control("only-a", "load").await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["results"][0], json!({"backend": "wa", "status": "ok"}));
    assert_eq!(body["results"][1]["status"], "failed");
    assert_eq!(
        body["error"],
        format!(
            "load of model 'only-a' failed on 1 of 2 backends: wb: 400: load of model 'only-a' failed: no model 'only-a' in the model repository {}",
            repo_b.0.display()
        )
    );
    let r = post_infer(&client, &base, "only-a", &image).await;
    assert_eq!((r.status, r.backend.as_deref()), (200, Some("wa")));

    // The same over gRPC: unload everywhere, then the model is gone.
    let mut grpc = common_grpc::connect(gw.grpc_addr.unwrap()).await;
    grpc.repository_model_unload(pb::RepositoryModelUnloadRequest {
        model_name: "digits".into(),
        ..Default::default()
    })
    .await
    .expect("unload over gRPC");
    let r = post_infer(&client, &base, "digits", &image).await;
    assert_eq!(r.status, 404, "{r:?}");
    let e = grpc
        .repository_model_load(pb::RepositoryModelLoadRequest {
            model_name: "only-a".into(),
            ..Default::default()
        })
        .await
        .expect_err("wb has no such model");
    assert_eq!(e.code(), tonic::Code::Internal);
    assert!(
        e.message()
            .starts_with("load of model 'only-a' failed on 1 of 2 backends: wb: 400: "),
        "{e:?}"
    );
    let listed = grpc
        .repository_index(pb::RepositoryIndexRequest::default())
        .await
        .unwrap()
        .into_inner()
        .models;
    let broken = listed.iter().find(|m| m.name == "broken").unwrap();
    assert_eq!(broken.state, "UNAVAILABLE");
    assert!(
        broken.reason.contains("not a model tract can load"),
        "{broken:?}"
    );

    // A backend the health checks found unreachable is skipped, not failed (it reads its
    // repository when it returns): a load that every reachable backend did is a 200.
    b.process.kill();
    let wb_reachable = || {
        gw.gateway
            .fleet
            .backends()
            .iter()
            .find(|h| &*h.name == "wb")
            .unwrap()
            .state
            .load()
            .reachable
    };
    for _ in 0..10 {
        if !wb_reachable() {
            break;
        }
        gw.gateway.fleet.refresh().await;
    }
    assert!(!wb_reachable(), "the health checks never found wb down");
    let (status, body) = control("only-a", "load").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["results"],
        json!([
            {"backend": "wa", "status": "ok"},
            {"backend": "wb", "status": "skipped", "reason": "unreachable at the last health checks; it reads its repository when it returns"}
        ])
    );
    // With every one unreachable, nothing was done: 503.
    let mut a = a;
    a.process.kill();
    for _ in 0..10 {
        gw.gateway.fleet.refresh().await;
    }
    let (status, body) = control("only-a", "unload").await;
    assert_eq!(
        (status, &body["error"]),
        (
            503,
            &json!("cannot unload model 'only-a': every backend with a model repository is unreachable")
        )
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_architectures_from_the_onnx_wheel_run() {
    let repo = TempDir::new("onnx-light");
    let expected: Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("light/expected.json")).unwrap(),
    )
    .unwrap();
    for model in ["squeezenet", "resnet50"] {
        std::fs::create_dir_all(repo.path(&format!("{model}/1"))).unwrap();
        std::fs::copy(
            fixtures().join(format!("light/{model}.onnx")),
            repo.path(&format!("{model}/1/model.onnx")),
        )
        .unwrap();
    }
    let w = worker("w", &repo.0).await;
    let client = http_client();
    for model in ["squeezenet", "resnet50"] {
        let e = &expected[model];
        let shape: Vec<usize> = serde_json::from_value(e["input_shape"].clone()).unwrap();
        let n: usize = shape.iter().product();
        // The onnx test runner's input: 0, 1/n, 2/n, ...
        let data: Vec<f32> = (0..n).map(|i| i as f32 / n as f32).collect();
        let body = json!({"inputs": [{"name": e["input"], "datatype": "FP32", "shape": shape, "data": data}]});
        let (status, reply) = post_json(
            &client,
            &format!("{}/v2/models/{model}/infer", w.url),
            &body,
        )
        .await;
        assert_eq!(status, 200, "{model}: {reply}");
        let out = &reply["outputs"][0];
        assert_eq!(
            (&out["name"], &out["shape"]),
            (&e["output"], &e["output_shape"]),
            "{model}"
        );
        let want = e["output_values"][0].as_f64().unwrap();
        for v in out["data"].as_array().unwrap() {
            let v = v.as_f64().unwrap();
            assert!(
                (v - want).abs() <= 1e-7 + 1e-3 * want,
                "{model}: {v} against {want}"
            );
        }
    }
}

/// VGG-19 on a 224x224 image takes seconds: meanwhile liveness, readiness and other models
/// answer, since the model runs on the blocking pool (one instance: the others queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heavy_model_does_not_hold_up_health_or_other_models() {
    let repo = TempDir::new("onnx-heavy");
    std::fs::create_dir_all(repo.path("vgg19/1")).unwrap();
    std::fs::copy(
        fixtures().join("light/vgg19.onnx"),
        repo.path("vgg19/1/model.onnx"),
    )
    .unwrap();
    let w = worker("w", &repo.0).await;
    let n = 3 * 224 * 224;
    let body = json!({"inputs": [{"name": "data_0", "datatype": "FP32", "shape": [1, 3, 224, 224], "data": vec![0.5f32; n]}]});
    let mut running = Vec::new();
    for _ in 0..3 {
        let (url, body) = (format!("{}/v2/models/vgg19/infer", w.url), body.clone());
        running.push(tokio::spawn(async move {
            let client = reqwest::Client::builder()
                .timeout(Duration::from_secs(600))
                .build()
                .unwrap();
            client
                .post(url)
                .json(&body)
                .send()
                .await
                .map(|r| r.status().as_u16())
        }));
    }
    let client = http_client();
    let mut answered_while_running = 0;
    for x in 0..20 {
        let (live, _) = get_json(&client, &format!("{}/v2/health/live", w.url)).await;
        assert_eq!(live, 200);
        let r = infer_simple(&client, &w.url, x).await;
        assert_eq!(r.status, 200);
        if running.iter().all(|t| !t.is_finished()) {
            answered_while_running += 1;
        }
    }
    assert!(
        answered_while_running > 0,
        "VGG-19 finished before any health check answered"
    );
    for t in running {
        assert_eq!(t.await.unwrap().unwrap(), 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_repository_models_in_process() {
    let repo = repository("onnx-serve");
    // Without batching, every tensor's dims start with -1: v2 metadata ([-1, 5]) reads the
    // same as a batching model's.
    copy_dir(&fixtures().join("half/half"), &repo.path("halfnb"));
    std::fs::write(
        repo.path("halfnb/config.pbtxt"),
        "name: \"halfnb\"\nplatform: \"onnxruntime_onnx\"\nmax_batch_size: 0\n\
         input [ { name: \"X\" data_type: TYPE_FP16 dims: [ -1, 5 ] } ]\n\
         output [ { name: \"SCORES\" data_type: TYPE_FP16 dims: [ -1, 5 ] } ]\n",
    )
    .unwrap();
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:0\"\ngrpc_listen = \"\"\n\n\
         [[backends]]\nname = \"local\"\nurl = \"builtin\"\nmodel_repository = {:?}\n",
        repo.0.display().to_string()
    );
    let gw = tensorgate::run::start(parse_config(&text), false)
        .await
        .unwrap();
    let client = http_client();
    let body = json!({"inputs": [
        {"name": "A", "datatype": "INT32", "shape": [1, 4], "data": [1, 5, 3, 0]},
        {"name": "B", "datatype": "INT32", "shape": [1, 4], "data": [2, 2, 3, 9]}]});
    let (status, reply) = post_json(
        &client,
        &format!("{}/v2/models/intbool/versions/1/infer", base(&gw)),
        &body,
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    let out = |name: &str| {
        reply["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["name"] == name)
            .unwrap()["data"]
            .clone()
    };
    assert_eq!(out("SUM"), json!([3, 7, 6, 9]));
    assert_eq!(out("GREATER"), json!([false, true, false, false]));
    assert_eq!(out("ARGMAX"), json!([1]));
    // Both inputs share the graph's batch dimension: the metadata ([-1,4] each) cannot say so.
    let disagree = json!({"inputs": [
        {"name": "A", "datatype": "INT32", "shape": [1, 4], "data": [1, 5, 3, 0]},
        {"name": "B", "datatype": "INT32", "shape": [2, 4], "data": [2, 2, 3, 9, 2, 2, 3, 9]}]});
    let (status, reply) = post_json(
        &client,
        &format!("{}/v2/models/intbool/infer", base(&gw)),
        &disagree,
    )
    .await;
    assert_eq!(status, 400, "{reply}");
    let error = reply["error"].as_str().unwrap();
    assert!(
        error.starts_with("inputs disagree on dimension ")
            && error.ends_with(": 1 and 2 (input 'B')"),
        "{error}"
    );
    // The configuration endpoint states config.pbtxt's batch limit, which the gateway
    // enforces; a model without batching states 0.
    let (status, config) = get_json(&client, &format!("{}/v2/models/mlp/config", base(&gw))).await;
    assert_eq!(status, 200);
    assert_eq!(
        config,
        json!({
            "name": "mlp",
            "platform": "onnxruntime_onnx",
            "max_batch_size": 8,
            "input": [{"name": "INPUT", "data_type": "TYPE_FP32", "dims": [16]}],
            "output": [{"name": "PROBS", "data_type": "TYPE_FP32", "dims": [10], "label_filename": "labels.txt"}],
        })
    );
    let (_, config) = get_json(
        &client,
        &format!("{}/v2/models/intbool/versions/1/config", base(&gw)),
    )
    .await;
    assert_eq!(config["max_batch_size"], 0, "{config}");
    let (_, config) = get_json(&client, &format!("{}/v2/models/halfnb/config", base(&gw))).await;
    assert_eq!(
        (
            &config["max_batch_size"],
            &config["input"][0]["dims"],
            &config["output"][0]["dims"]
        ),
        (&json!(0), &json!([-1, 5]), &json!([-1, 5])),
        "{config}"
    );
    // Classes are taken over the whole tensor of a model without batching (version 2 of
    // intbool adds 1 to the sum), as Triton
    // does: [k], not k per row of its leading dimension.
    let body = json!({
        "inputs": [
            {"name": "A", "datatype": "INT32", "shape": [2, 4], "data": [1, 2, 3, 4, 5, 6, 7, 8]},
            {"name": "B", "datatype": "INT32", "shape": [2, 4], "data": [0, 0, 0, 0, 0, 0, 0, 0]}],
        "outputs": [{"name": "SUM", "parameters": {"classification": 3}}]});
    let (status, reply) = post_json(
        &client,
        &format!("{}/v2/models/intbool/infer", base(&gw)),
        &body,
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        (&reply["outputs"][0]["shape"], &reply["outputs"][0]["data"]),
        (&json!([3]), &json!(["9:7", "8:6", "7:5"])),
        "{reply}"
    );
    gw.shutdown().await;

    // The command line: --model-repository needs the built-in backend.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_tensorgate"))
        .args([
            "serve",
            "--backend",
            "http://127.0.0.1:9",
            "--model-repository",
        ])
        .arg(&repo.0)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert_eq!(
        String::from_utf8_lossy(&o.stderr).trim(),
        "--model-repository needs the built-in backend, which runs the models in-process: add --backend builtin, or a [[backends]] entry with url = \"builtin\""
    );
}

/// A built-in backend's `models` may name repository models: a list that names no built-in
/// model serves none (the demo models, `accumulate` with its state among them, stay off a
/// production gateway), and a name that is neither is refused by check-config and serve alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_may_name_repository_models_and_turn_the_built_in_ones_off() {
    let repo = repository("onnx-only");
    let config_with = |models: &str| {
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nmetrics_listen = \"\"\ngrpc_listen = \"\"\n\n\
             [[backends]]\nname = \"local\"\nurl = \"builtin\"\nmodel_repository = {:?}\nmodels = {models}\n",
            repo.0.display().to_string()
        )
    };
    let gw = tensorgate::run::start(parse_config(&config_with(r#"["mlp", "intbool"]"#)), false)
        .await
        .unwrap();
    let client = http_client();
    let (status, _) = get_json(&client, &format!("{}/v2/models/mlp", base(&gw))).await;
    assert_eq!(status, 200);
    let (status, reply) = get_json(&client, &format!("{}/v2/models/simple", base(&gw))).await;
    assert_eq!(
        (status, reply),
        (404, json!({"error": "unknown model 'simple'"}))
    );
    let (status, reply) = get_json(&client, &format!("{}/v2/models/cnn", base(&gw))).await;
    assert_eq!(
        (status, reply),
        (404, json!({"error": "unknown model 'cnn'"}))
    );
    // The models it does not name are not loaded at all (nor listed), and a load of one is
    // refused rather than answered "ok" for a model that then is not served.
    let names: BTreeSet<String> = index(&client, &base(&gw))
        .await
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, BTreeSet::from(["intbool".into(), "mlp".into()]));
    let (status, reply) = post_json(
        &client,
        &format!("{}/v2/repository/models/cnn/load", base(&gw)),
        &json!({}),
    )
    .await;
    assert_eq!(status, 400, "{reply}");
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .ends_with("model 'cnn' is not among the models this server serves (--models, or [[backends]] models)"),
        "{reply}"
    );
    gw.shutdown().await;

    let dir = TempDir::new("onnx-only-config");
    let file = dir.0.join("gateway.toml");
    std::fs::write(&file, config_with(r#"["mlp", "nope"]"#)).unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_tensorgate"))
            .args(args)
            .output()
            .unwrap()
    };
    let refusal = format!(
        "model 'nope' is neither a built-in model nor a model directory of {} (the built-in models are {})",
        repo.0.display(),
        tensorgate::models::builtin_names().join(", ")
    );
    let o = run(&["check-config", file.to_str().unwrap()]);
    assert!(!o.status.success());
    assert_eq!(
        String::from_utf8_lossy(&o.stderr).trim(),
        format!("{}:10: backend 'local': {refusal}", file.display())
    );
    let o = run(&[
        "worker",
        "--models",
        "mlp,nope",
        "--model-repository",
        repo.0.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert_eq!(
        String::from_utf8_lossy(&o.stderr).trim(),
        format!("--models: {refusal}")
    );
    let err = tensorgate::run::start(parse_config(&config_with(r#"["nope"]"#)), false)
        .await
        .err()
        .unwrap();
    assert!(
        err.contains("model 'nope' is neither a built-in model"),
        "{err}"
    );
}

/// An error only running can find (tract panics on a Gather index out of range): a 500 for
/// that request, and the worker goes on serving it and others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_failure_is_that_requests_500() {
    let w = worker("w", &fixtures().join("runtime_error")).await;
    let client = http_client();
    let gather = |i: i64| {
        json!({"inputs": [
            {"name": "X", "datatype": "FP32", "shape": [4], "data": [1.0, 2.0, 3.0, 4.0]},
            {"name": "I", "datatype": "INT64", "shape": [1], "data": [i]}]})
    };
    let url = format!("{}/v2/models/gather/infer", w.url);
    let (status, body) = post_json(&client, &url, &gather(10)).await;
    assert_eq!(status, 500, "{body}");
    assert_eq!(
        body["error"],
        "model 'gather' failed: the runtime panicked: index out of bounds: the len is 4 but the index is 10"
    );
    for (i, want) in [(2, 3.0), (-1, 4.0)] {
        let (status, body) = post_json(&client, &url, &gather(i)).await;
        assert_eq!(
            (status, &body["outputs"][0]["data"]),
            (200, &json!([want])),
            "{body}"
        );
    }
    let r = infer_simple(&client, &w.url, 1).await;
    assert_eq!(r.status, 200);
    // The panic is a log line of its own, not the default hook's text on stderr.
    let logged = eventually(50, Duration::from_millis(100), || async {
        std::fs::read_to_string(&w.log)
            .unwrap_or_default()
            .lines()
            .any(|l| l.contains(" ERROR ") && l.contains("panicked panic=\"index out of bounds"))
    })
    .await;
    let log = std::fs::read_to_string(&w.log).unwrap();
    assert!(logged, "{log}");
    assert!(!log.contains("thread '"), "{log}");
}

/// A repository model named like one of the worker's built-in models is in the worker's
/// index as UNAVAILABLE, with why, beside the built-in model that keeps the name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repository_model_named_like_a_built_in_one_is_listed_unavailable() {
    let repo = repository("onnx-collide");
    copy_dir(&repo.path("mlp"), &repo.path("simple"));
    let w = worker("w", &repo.0).await;
    let client = http_client();
    let index = index(&client, &w.url).await;
    let simple: Vec<&Value> = index.iter().filter(|e| e["name"] == "simple").collect();
    assert_eq!(simple.len(), 2, "{index:?}");
    assert!(simple.iter().any(|e| e["state"] == "READY"), "{index:?}");
    assert!(
        simple.iter().any(|e| e["state"] == "UNAVAILABLE"
            && e["reason"]
                == "'simple' is the name of a built-in model; rename the repository's directory"),
        "{index:?}"
    );
    assert_eq!(infer_simple(&client, &w.url, 1).await.status, 200);
    // The built-in model cannot be unloaded, the directory of its name notwithstanding; a
    // load of the name is refused as the clash it is; the built-in model serves throughout.
    let control = |action: &str| format!("{}/v2/repository/models/simple/{action}", w.url);
    let (status, body) = post_json(&client, &control("unload"), &json!({})).await;
    assert_eq!(
        (status, &body["error"]),
        (
            400,
            &json!("unload of model 'simple' failed: model 'simple' is built into tensorgate, not loaded from the model repository: it cannot be unloaded")
        )
    );
    let (status, body) = post_json(&client, &control("load"), &json!({})).await;
    assert_eq!(
        (status, &body["error"]),
        (
            400,
            &json!("load of model 'simple' failed: 'simple' is the name of a built-in model; rename the repository's directory")
        )
    );
    assert_eq!(infer_simple(&client, &w.url, 1).await.status, 200);
}

/// A model's failure on one request is marked as such by the worker, and a gateway in front
/// does not count it against the worker's health: one client's input cannot eject a fleet.
/// The gateway answers it as a 500 that carries the mark on, and it is the only attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_models_failure_does_not_eject_its_worker() {
    let w = worker("w", &fixtures().join("runtime_error")).await;
    let text = gateway_toml(&[("w", &w.url)], "eject_after_failures = 2");
    let gw = tensorgate::run::start(parse_config(&text), true)
        .await
        .unwrap();
    let client = http_client();
    let out_of_range = json!({"inputs": [
        {"name": "X", "datatype": "FP32", "shape": [4], "data": [1.0, 2.0, 3.0, 4.0]},
        {"name": "I", "datatype": "INT64", "shape": [1], "data": [10]}]});
    // Once on the worker, then four times through the gateway (twice its ejection bar).
    let gateway = base(&gw);
    for (i, at) in std::iter::once(&w.url).chain([&gateway; 4]).enumerate() {
        let r = client
            .post(format!("{at}/v2/models/gather/infer"))
            .json(&out_of_range)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 500);
        assert_eq!(r.headers()["tensorgate-model-failure"], "1");
        if i > 0 {
            let body: Value = r.json().await.unwrap();
            assert_eq!(
                body["error"],
                "backend 'w': model 'gather' failed: the runtime panicked: index out of bounds: the len is 4 but the index is 10"
            );
        }
    }
    let metrics = scrape(&gw).await;
    assert!(
        metrics.contains("tensorgate_backend_ejected{backend=\"w\"} 0"),
        "{metrics}"
    );
    gw.shutdown().await;
}

/// ONNX STRING tensors are BYTES at the v2 API: the metadata says so, UTF-8 elements go in
/// and come back out (compared with onnxruntime's answer for the same input, computed by
/// tests/fixtures/onnx/make_strings.py's model: SAME = TEXT, FLAT = TEXT as one row), in JSON
/// and in binary; an element that is not UTF-8 is the client's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn string_tensors_are_bytes() {
    let w = worker("w", &fixtures().join("strings")).await;
    let client = http_client();
    let (status, meta) = get_json(&client, &format!("{}/v2/models/strings", w.url)).await;
    assert_eq!(status, 200, "{meta}");
    assert_eq!(
        (&meta["inputs"], &meta["outputs"]),
        (
            &json!([{"name": "TEXT", "datatype": "BYTES", "shape": [-1, 2]}]),
            &json!([
                {"name": "SAME", "datatype": "BYTES", "shape": [-1, 2]},
                {"name": "FLAT", "datatype": "BYTES", "shape": [1, -1]}
            ])
        )
    );

    let url = format!("{}/v2/models/strings/infer", w.url);
    let text = json!(["héllo", "", "a", "b c"]);
    let (status, body) = post_json(
        &client,
        &url,
        &json!({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [2, 2], "data": text}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["outputs"],
        json!([
            {"name": "SAME", "datatype": "BYTES", "shape": [2, 2], "data": text},
            {"name": "FLAT", "datatype": "BYTES", "shape": [1, 4], "data": text}
        ])
    );

    // The same elements as binary (4-byte length, bytes), then one that is not UTF-8.
    let binary = |elements: &[&[u8]]| {
        let mut data = Vec::new();
        for e in elements {
            data.extend_from_slice(&(e.len() as u32).to_le_bytes());
            data.extend_from_slice(e);
        }
        let header = json!({
            "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 2],
                        "parameters": {"binary_data_size": data.len()}}],
            "outputs": [{"name": "SAME"}]
        })
        .to_string();
        let length = header.len();
        let mut body = header.into_bytes();
        body.extend_from_slice(&data);
        (body, length)
    };
    let send = |(body, length): (Vec<u8>, usize)| {
        client
            .post(&url)
            .header("Inference-Header-Content-Length", length.to_string())
            .body(body)
            .send()
    };
    let r = send(binary(&["é".as_bytes(), b"x"])).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["outputs"][0]["data"], json!(["é", "x"]), "{body}");

    let r = send(binary(&[b"\xff\xfe", b"x"])).await.unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "input 'TEXT': the model takes UTF-8 strings");
}

/// A load of `model` sent to `base` in the background; its status when it answers.
fn spawn_load(base: &str, model: &str) -> tokio::task::JoinHandle<u16> {
    let url = format!("{base}/v2/repository/models/{model}/load");
    tokio::spawn(async move {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(600))
            .build()
            .unwrap();
        let r = client.post(url).json(&json!({})).send().await.unwrap();
        r.status().as_u16()
    })
}

/// While a load runs (VGG-19 takes a while to optimise), the index says LOADING for the
/// model, and READY once the load has answered; while it is loaded again, READY.
/// A worker answers liveness (and says it is not ready) while it reads its repository,
/// rather than leaving probes unanswered until every model has loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_is_live_while_it_reads_its_repository() {
    // ResNet-50 takes tract seconds to optimise in a debug build; liveness answers within
    // a few milliseconds of the listener.
    let repo = TempDir::new("onnx-startup");
    std::fs::create_dir_all(repo.path("resnet50/1")).unwrap();
    std::fs::copy(
        fixtures().join("light/resnet50.onnx"),
        repo.path("resnet50/1/model.onnx"),
    )
    .unwrap();
    let dir = repo.0.to_str().unwrap();
    let mut w = Worker::spawn(
        "w",
        "127.0.0.1",
        0,
        &["simple"],
        &["--model-repository", dir],
        &[],
    );
    let client = http_client();
    let mut live = None;
    for _ in 0..200 {
        if let Ok(r) = client.get(format!("{}/v2/health/live", w.url)).send().await {
            live = Some(r.status().as_u16());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(live, Some(200), "liveness never answered");
    let r = client
        .get(format!("{}/v2/health/ready", w.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503, "ready before resnet50 was read");
    // A worker discovers nothing: it loads.
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body["error"],
        "tensorgate has not finished loading its models"
    );
    common_fleet::wait_ready(&client, &w.url, &mut w.process, &w.log).await;
    let idx = index(&client, &w.url).await;
    assert_eq!(entry(&idx, "resnet50", "1").unwrap()["state"], "READY");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_is_loading_while_its_load_runs() {
    let repo = TempDir::new("onnx-loading");
    std::fs::create_dir_all(&repo.0).unwrap();
    let w = worker("w", &repo.0).await;
    std::fs::create_dir_all(repo.path("vgg19/1")).unwrap();
    std::fs::copy(
        fixtures().join("light/vgg19.onnx"),
        repo.path("vgg19/1/model.onnx"),
    )
    .unwrap();
    let load = spawn_load(&w.url, "vgg19");
    let client = http_client();
    let mut states = Vec::new();
    for _ in 0..500 {
        let idx = index(&client, &w.url).await;
        if let Some(e) = idx.iter().find(|e| e["name"] == "vgg19") {
            states.push(e["state"].clone());
            if e["state"] == "LOADING" {
                assert_eq!(
                    (&e["reason"], &e["backends"]),
                    (&json!("a load is in progress"), &json!(["builtin"]))
                );
                // Not missing but not ready yet: 503, which clients retry, not 404.
                // (A 200: the load finished in between.)
                let (status, body) = get_json(&client, &format!("{}/v2/models/vgg19", w.url)).await;
                if status == 200 {
                    break;
                }
                assert_eq!(
                    (status, &body["error"]),
                    (
                        503,
                        &json!("model 'vgg19' is not available: LOADING on backend 'builtin': a load is in progress")
                    )
                );
                break;
            }
        }
        if load.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        states.last(),
        Some(&json!("LOADING")),
        "the index never said LOADING during the load: {states:?}"
    );
    assert_eq!(load.await.unwrap(), 200);
    let idx = index(&client, &w.url).await;
    let e = idx.iter().find(|e| e["name"] == "vgg19").unwrap();
    assert_eq!(e["state"], "READY", "{idx:?}");

    // A load of a model that serves already (a reload) keeps it serving: the index stays
    // READY and the model ready while the new copy is made.
    let reload = spawn_load(&w.url, "vgg19");
    let mut during = 0;
    for _ in 0..2000 {
        if reload.is_finished() {
            break;
        }
        let idx = index(&client, &w.url).await;
        let e = idx.iter().find(|e| e["name"] == "vgg19").unwrap();
        let ready = client
            .get(format!("{}/v2/models/vgg19/ready", w.url))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        if reload.is_finished() {
            break;
        }
        assert_eq!((&e["state"], ready), (&json!("READY"), 200), "{idx:?}");
        during += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(during > 0, "the reload answered before the index was read");
    assert_eq!(reload.await.unwrap(), 200);
}

/// What a fleet of mixed workers meets: a name that must be percent-encoded in a path, a
/// worker without a repository (it does not claim the extension, and loads skip it), a load
/// no backend can do (the client's error: 400), and built-in models, which stay loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_refusals_and_built_in_models_across_a_fleet() {
    let repo = repository("onnx-edges");
    let odd = "a+b x";
    copy_dir(&repo.path("intbool"), &repo.path(odd));
    let config = std::fs::read_to_string(repo.path(odd).join("config.pbtxt")).unwrap();
    std::fs::write(
        repo.path(odd).join("config.pbtxt"),
        config.replace("name: \"intbool\"", &format!("name: \"{odd}\"")),
    )
    .unwrap();
    let w = worker("w", &repo.0).await;
    let bare = Worker::start("bare", "127.0.0.1", 0, &["simple", "accumulate"]).await;
    let client = http_client();
    let extensions = |base: String| {
        let client = client.clone();
        async move { get_json(&client, &format!("{base}/v2")).await.1["extensions"].clone() }
    };
    assert!(extensions(w.url.clone())
        .await
        .as_array()
        .unwrap()
        .contains(&json!("model_repository")));
    assert_eq!(
        extensions(bare.url.clone()).await,
        json!([
            "binary_tensor_data",
            "classification",
            "sequence",
            "statistics"
        ])
    );

    let gw = gateway_over(&[("w", &w.url), ("bare", &bare.url)]).await;
    let base = base(&gw);

    // The gateway found the odd name on the worker (asking for it encoded), and serves it
    // to a client that encodes it as tritonclient does.
    let (status, meta) = get_json(&client, &format!("{base}/v2/models/a%2Bb%20x")).await;
    assert_eq!((status, &meta["name"]), (200, &json!(odd)), "{meta}");
    let body = json!({"inputs": [
        {"name": "A", "datatype": "INT32", "shape": [1, 4], "data": [1, 2, 3, 4]},
        {"name": "B", "datatype": "INT32", "shape": [1, 4], "data": [1, 1, 1, 1]},
    ]});
    let (status, answer) = post_json(
        &client,
        &format!("{base}/v2/models/a%2Bb%20x/versions/2/infer"),
        &body,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = post_json(
        &client,
        &format!("{base}/v2/repository/models/a%2Bb%20x/load"),
        &json!({}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    // Only the worker with a repository was asked.
    assert_eq!(answer["results"], json!([{"backend": "w", "status": "ok"}]));

    // A model no backend has: the client's error, over REST and gRPC.
    let (status, answer) = post_json(
        &client,
        &format!("{base}/v2/repository/models/nosuch/load"),
        &json!({}),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        answer["error"],
        format!(
            "load of model 'nosuch' failed on 1 of 1 backends: w: 400: load of model 'nosuch' failed: no model 'nosuch' in the model repository {}",
            repo.0.display()
        )
    );
    let mut grpc = common_grpc::connect(gw.grpc_addr.unwrap()).await;
    let e = grpc
        .repository_model_load(pb::RepositoryModelLoadRequest {
            model_name: "nosuch".into(),
            ..Default::default()
        })
        .await
        .expect_err("no backend has it");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");

    // The batch limit of a worker's model reaches a gateway's clients over REST and gRPC
    // (the worker states it at its configuration endpoint).
    let (status, config) = get_json(&client, &format!("{base}/v2/models/mlp/config")).await;
    assert_eq!(
        (status, &config["max_batch_size"]),
        (200, &json!(8)),
        "{config}"
    );
    let grpc_config = |name: &'static str| {
        let mut grpc = grpc.clone();
        async move {
            let request = pb::ModelConfigRequest {
                name: name.into(),
                ..Default::default()
            };
            let answer = grpc.model_config(request).await.unwrap();
            answer.into_inner().config.unwrap()
        }
    };
    assert_eq!(grpc_config("mlp").await.max_batch_size, 8);
    // A demo model states no limit: the largest value, as before.
    let (_, config) = get_json(&client, &format!("{base}/v2/models/simple/config")).await;
    assert_eq!(config["max_batch_size"], i32::MAX, "{config}");
    assert_eq!(config.get("sequence_batching"), None, "{config}");
    // A sequence model says so, as Triton's configuration does (perf_analyzer and
    // model_analyzer then send sequences), from the workers' configuration endpoint.
    let (_, config) = get_json(&client, &format!("{base}/v2/models/accumulate/config")).await;
    assert_eq!(config["sequence_batching"], json!({}), "{config}");
    let accumulate = grpc_config("accumulate").await;
    assert!(
        matches!(
            accumulate.scheduling_choice,
            Some(pb::model_config::SchedulingChoice::SequenceBatching(_))
        ),
        "{accumulate:?}"
    );

    // What a load may carry: Triton's overrides are refused, not silently ignored; a body
    // that is not a JSON object is the client's error.
    let load = format!("{base}/v2/repository/models/a%2Bb%20x/load");
    for (parameters, name) in [
        (json!({"config": "{\"max_batch_size\": 1}"}), "config"),
        (json!({"file:1/model.onnx": "AAAA"}), "file:1/model.onnx"),
    ] {
        let (status, answer) =
            post_json(&client, &load, &json!({ "parameters": parameters })).await;
        assert_eq!(
            (status, answer["error"].as_str().unwrap()),
            (400, format!("parameter '{name}' is not supported: tensorgate loads a model as its repository holds it (no configuration overrides or model files in the request)").as_str())
        );
    }
    let r = client
        .post(&load)
        .body(vec![b' '; 65 << 10])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    // The rest of the body is still on the connection: the client must not reuse it.
    assert_eq!(r.headers()["connection"], "close");
    let answer: Value = r.json().await.unwrap();
    assert_eq!(
        answer["error"],
        "a repository request's body is limited to 64 KiB"
    );
    let r = client.post(&load).body("{bad").send().await.unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let answer: Value = r.json().await.unwrap();
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .starts_with("the request body is not valid JSON: "),
        "{answer}"
    );
    let e = grpc
        .repository_model_load(pb::RepositoryModelLoadRequest {
            model_name: odd.into(),
            parameters: [("config".to_string(), Default::default())].into(),
            ..Default::default()
        })
        .await
        .expect_err("an override is refused");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    // The index lists what cannot serve too, unless asked for the ready ones only.
    let (_, all) = post_json(&client, &format!("{base}/v2/repository/index"), &json!({})).await;
    let (status, ready) = post_json(
        &client,
        &format!("{base}/v2/repository/index"),
        &json!({"ready": true}),
    )
    .await;
    assert_eq!(status, 200);
    let states = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|e| format!("{}:{}", e["name"], e["state"]))
            .collect()
    };
    assert!(
        states(&all).contains(&"\"broken\":\"UNAVAILABLE\"".to_string()),
        "{all}"
    );
    assert!(
        states(&ready).iter().all(|s| s.ends_with(":\"READY\"")),
        "{ready}"
    );
    assert_eq!(
        post_json(
            &client,
            &format!("{base}/v2/repository/index"),
            &json!({"ready": "x"})
        )
        .await,
        (400, json!({"error": "'ready' must be a bool, not \"x\""}))
    );

    // A built-in model cannot be unloaded (a load could not bring it back); loading it
    // does nothing. It serves throughout.
    let (status, answer) = post_json(
        &client,
        &format!("{}/v2/repository/models/simple/unload", w.url),
        &json!({}),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        answer["error"],
        "unload of model 'simple' failed: model 'simple' is built into tensorgate, not loaded from the model repository: it cannot be unloaded"
    );
    let (status, answer) = post_json(
        &client,
        &format!("{}/v2/repository/models/simple/load", w.url),
        &json!({}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let (status, _) = get_json(&client, &format!("{}/v2/models/simple/ready", w.url)).await;
    assert_eq!(status, 200);
    gw.shutdown().await;
}

/// Posts an infer to `url` and checks that `backend` answered it with `version`.
async fn served_by(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
    version: &str,
    backend: &str,
    what: &str,
) {
    let r = client.post(url).json(body).send().await.unwrap();
    let served = r.headers()["x-tensorgate-backend"]
        .to_str()
        .unwrap()
        .to_string();
    let status = r.status().as_u16();
    let answer: Value = r.json().await.unwrap();
    assert_eq!(
        (status, served.as_str()),
        (200, backend),
        "{what}: {answer}"
    );
    assert_eq!(answer["model_version"], version, "{what}: {answer}");
}

/// A rolling update: one worker serves version 1 of `mlp`, the other already version 2.
/// The model lists both; a request for a version goes only to a worker that lists it,
/// whichever the gateway took the metadata from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_goes_to_the_backends_that_have_it() {
    let (old, new) = (repository("rolling-old"), repository("rolling-new"));
    std::fs::remove_dir_all(old.path("mlp").join("2")).unwrap();
    let (a, b) = (worker("a", &old.0).await, worker("b", &new.0).await);
    let gw = gateway_over(&[("a", &a.url), ("b", &b.url)]).await;
    let client = http_client();
    // The model lists the versions of both.
    let (_, metadata) = get_json(&client, &format!("{}/v2/models/mlp", base(&gw))).await;
    assert_eq!(metadata["versions"], json!(["1", "2"]), "{metadata}");
    let body = json!({"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 16], "data": vec![0.5; 16]}]});
    for (version, backend) in [("1", "a"), ("2", "b")] {
        for i in 0..12 {
            let url = format!("{}/v2/models/mlp/versions/{version}/infer", base(&gw));
            let what = format!("version {version}, request {i}");
            served_by(&client, &url, &body, version, backend, &what).await;
        }
    }
    // `a` goes down: version 1 is no longer listed, and a request for it is a 503 that names
    // its backend, never sent to `b`, which does not have it.
    let mut a = a;
    a.process.kill();
    for _ in 0..3 {
        // Each refresh counts one failed check; the default threshold is three.
        gw.gateway.fleet.refresh().await;
    }
    let (_, metadata) = get_json(&client, &format!("{}/v2/models/mlp", base(&gw))).await;
    assert_eq!(metadata["versions"], json!(["2"]), "{metadata}");
    let r = client
        .post(format!("{}/v2/models/mlp/versions/1/infer", base(&gw)))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().get("x-tensorgate-backend").is_none());
    let error = r.json::<Value>().await.unwrap()["error"].clone();
    assert!(
        error.as_str().unwrap().starts_with(
            "model 'mlp' version 1 is served only by backends that are not ready: backend 'a' ("
        ),
        "{error}"
    );
    let (status, _) = get_json(
        &client,
        &format!("{}/v2/models/mlp/versions/1/ready", base(&gw)),
    )
    .await;
    assert_eq!(status, 503);
    served_by(
        &client,
        &format!("{}/v2/models/mlp/infer", base(&gw)),
        &body,
        "2",
        "b",
        "no version",
    )
    .await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_with_other_tensors_are_checked_against_their_own_metadata() {
    // A rolling update whose new version takes other inputs: `a` has only version 1 (the
    // MLP's INPUT [-1,16]), `b` only version 2 (the CNN's IMAGE).
    let (old, new) = (repository("tensors-old"), repository("tensors-new"));
    copy_dir(&old.path("mlp/1"), &old.path("rolling/1"));
    copy_dir(&new.path("cnn/1"), &new.path("rolling/2"));
    let (a, b) = (worker("a", &old.0).await, worker("b", &new.0).await);
    let gw = gateway_over(&[("a", &a.url), ("b", &b.url)]).await;
    let client = http_client();
    let base = base(&gw);
    let inputs = |metadata: &Value| -> Vec<String> {
        metadata["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["name"].as_str().unwrap().to_string())
            .collect()
    };
    for (version, input, backend, body) in [
        (
            "1",
            "INPUT",
            "a",
            json!({"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 16], "data": vec![0.5; 16]}]}),
        ),
        (
            "2",
            "IMAGE",
            "b",
            json!({"inputs": [{"name": "IMAGE", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": vec![0.5; 784]}]}),
        ),
    ] {
        let url = format!("{base}/v2/models/rolling/versions/{version}");
        let (status, metadata) = get_json(&client, &url).await;
        assert_eq!((status, inputs(&metadata)), (200, vec![input.to_string()]));
        let what = format!("version {version}");
        served_by(
            &client,
            &format!("{url}/infer"),
            &body,
            version,
            backend,
            &what,
        )
        .await;
    }
    // Without a version: checked against the tensors the gateway shows (the first ready
    // backend's, a's), and sent only to the backends with those tensors.
    let (_, shown) = get_json(&client, &format!("{base}/v2/models/rolling")).await;
    assert_eq!(inputs(&shown), ["INPUT"]);
    let body = json!({"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 16], "data": vec![0.5; 16]}]});
    for i in 0..8 {
        let url = format!("{base}/v2/models/rolling/infer");
        served_by(&client, &url, &body, "1", "a", &format!("unversioned {i}")).await;
    }
    // The index says which backend serves which version.
    let idx = index(&client, &base).await;
    for (version, backend) in [("1", "a"), ("2", "b")] {
        let e = entry(&idx, "rolling", version).unwrap_or_else(|| panic!("{idx:?}"));
        assert_eq!(
            (&e["state"], &e["backends"]),
            (&json!("READY"), &json!([backend])),
            "{e}"
        );
    }
    gw.shutdown().await;
}

/// A model unloaded on a backend behind the gateway's back (before the next refresh): the
/// backend's 404 is not the client's error. The request goes to a backend that still has it,
/// and with none left the answer is a 503 naming the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_lost_a_model_is_not_the_clients_fault() {
    let (ra, rb) = (repository("lost-a"), repository("lost-b"));
    let (a, b) = (worker("a", &ra.0).await, worker("b", &rb.0).await);
    let gw = gateway_over(&[("a", &a.url), ("b", &b.url)]).await;
    let client = http_client();
    let base = base(&gw);
    let unload = |url: &str| format!("{url}/v2/repository/models/mlp/unload");
    let body = json!({"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 16], "data": vec![0.5; 16]}]});
    let (status, _) = post_json(&client, &unload(&a.url), &json!({})).await;
    assert_eq!(status, 200);
    for i in 0..8 {
        let r = post_infer(&client, &base, "mlp", &body).await;
        assert_eq!(
            (r.status, r.backend.as_deref()),
            (200, Some("b")),
            "request {i}: {r:?}"
        );
    }
    let (status, _) = post_json(&client, &unload(&b.url), &json!({})).await;
    assert_eq!(status, 200);
    let r = post_infer(&client, &base, "mlp", &body).await;
    assert_eq!(r.status, 503, "{r:?}");
    let error = r.error().unwrap();
    assert!(
        error.starts_with("backend '")
            && error.contains("' no longer serves model 'mlp' (it answered 404: model 'mlp' is not available: UNAVAILABLE on backend 'builtin'"),
        "{error}"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_never_answered_is_listed_skipped() {
    let repo = repository("never-answered");
    let a = worker("wa", &repo.0).await;
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    // `wk` answers the first discovery round, then dies; the next round is a minute away,
    // so the load finds its connection refused: nothing was sent, and it is skipped too.
    let mut k = worker("wk", &repo.0).await;
    let gw = gateway_over(&[("wa", &a.url), ("wz", &closed), ("wk", &k.url)]).await;
    k.process.kill();
    let client = http_client();
    let url = format!("{}/v2/repository/models/mlp/load", base(&gw));
    let (status, body) = post_json(&client, &url, &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let skipped = json!({"status": "skipped", "reason": "unreachable at the last health checks; it reads its repository when it returns"});
    let with_name = |name: &str| {
        let mut v = skipped.clone();
        v["backend"] = json!(name);
        v
    };
    assert_eq!(
        body["results"],
        json!([{"backend": "wa", "status": "ok"}, with_name("wz"), with_name("wk")])
    );
    gw.shutdown().await;
}

/// A gateway in front of a tensorgate worker leaves the classification of an FP16 output to
/// the worker, which holds the model's labels (Triton refuses FP16 classification, so in
/// front of Triton the gateway classifies, without them); the gateway's configuration says
/// the output has labels, as the worker's does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_precision_classification_through_a_gateway_keeps_the_workers_labels() {
    let w = worker("w", &fixtures().join("half")).await;
    let gw = tensorgate::run::start(parse_config(&gateway_toml(&[("w", &w.url)], "")), false)
        .await
        .unwrap();
    let client = http_client();
    let body = json!({
        "inputs": [{"name": "X", "datatype": "FP16", "shape": [1, 5], "data": [0.5, 4, 1, 3, 2]}],
        "outputs": [{"name": "SCORES", "parameters": {"classification": 3}}]});
    let want = json!(["4.000000:1:beta", "3.000000:3:delta", "2.000000:4:epsilon"]);
    for at in [w.url.clone(), base(&gw)] {
        let (status, reply) =
            post_json(&client, &format!("{at}/v2/models/half/infer"), &body).await;
        assert_eq!(status, 200, "{at}: {reply}");
        assert_eq!(reply["outputs"][0]["data"], want, "{at}");
    }
    let (_, direct) = get_json(&client, &format!("{}/v2/models/half/config", w.url)).await;
    let (_, through) = get_json(&client, &format!("{}/v2/models/half/config", base(&gw))).await;
    let labels = &direct["output"][0]["label_filename"];
    assert!(labels.as_str().is_some_and(|f| !f.is_empty()), "{direct}");
    assert_eq!(&through["output"][0]["label_filename"], labels, "{through}");
    gw.shutdown().await;
}

/// A gateway learns at discovery what a worker's configuration states of each model, which
/// v2 metadata cannot say: `intbool` (`max_batch_size: 0`, dims `[-1, 4]`) is classified by
/// the gateway over its whole tensor, not per row, and a request of shape [2, 4] counts one
/// inference, as the worker counts it; `mlp`'s labels are shown with their file's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_knows_what_a_workers_configuration_states() {
    let repo = repository("onnx-stated");
    let w = worker("w", &repo.0).await;
    let text = gateway_toml(&[("w", &w.url)], "").replace(
        &format!("url = {:?}\n", w.url),
        &format!("url = {:?}\nclassification = \"gateway\"\n", w.url),
    );
    let gw = tensorgate::run::start(parse_config(&text), false)
        .await
        .unwrap();
    let client = http_client();
    let body = json!({
        "inputs": [
            {"name": "A", "datatype": "INT32", "shape": [2, 4], "data": [1, 2, 3, 4, 5, 6, 7, 8]},
            {"name": "B", "datatype": "INT32", "shape": [2, 4], "data": [0, 0, 0, 0, 0, 0, 0, 0]}],
        "outputs": [{"name": "SUM", "parameters": {"classification": 3}}]});
    for at in [w.url.clone(), base(&gw)] {
        let (status, reply) =
            post_json(&client, &format!("{at}/v2/models/intbool/infer"), &body).await;
        assert_eq!(status, 200, "{at}: {reply}");
        assert_eq!(
            (&reply["outputs"][0]["shape"], &reply["outputs"][0]["data"]),
            (&json!([3]), &json!(["9:7", "8:6", "7:5"])),
            "{at}: {reply}"
        );
        // Counted under version 2, which ran (the latest), not the first listed.
        let (_, stats) = get_json(&client, &format!("{at}/v2/models/intbool/stats")).await;
        let counts: Vec<(&Value, &Value, &Value)> = stats["model_stats"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (&s["version"], &s["inference_count"], &s["execution_count"]))
            .collect();
        assert_eq!(
            counts,
            [
                (&json!("1"), &json!(0), &json!(0)),
                (&json!("2"), &json!(1), &json!(1))
            ],
            "{at}: {stats}"
        );
    }
    let (_, config) = get_json(&client, &format!("{}/v2/models/mlp/config", base(&gw))).await;
    assert_eq!(
        (
            &config["max_batch_size"],
            &config["output"][0]["label_filename"]
        ),
        (&json!(8), &json!("labels.txt")),
        "{config}"
    );
    gw.shutdown().await;
}
