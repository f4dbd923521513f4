//! Every documented error path of the gateway, with status and exact message; health,
//! metadata and the repository index.

use crate::common;

use common::*;
use serde_json::{json, Value};
use tensorgate::run;

fn ones() -> Vec<i32> {
    vec![1; 16]
}

#[tokio::test]
async fn unknown_model_path_method_and_version() {
    for topology in Topology::ALL {
        let env = start(topology).await;
        let body = json_body(&simple_request(&ones(), &ones()));

        let r = env.infer("nope", &body).await;
        r.assert_error(404, "unknown model 'nope'");
        let r = env.get("/v2/models/nope").await;
        r.assert_error(404, "unknown model 'nope'");
        let r = env.get("/v2/models/nope/ready").await;
        r.assert_error(404, "unknown model 'nope'");

        for path in ["/v3", "/v2/models", "/v2/models/simple/explain", "/"] {
            let r = env.get(path).await;
            r.assert_error(404, &format!("no such endpoint: {path}"));
        }

        let r = env.get("/v2/models/simple/infer").await;
        r.assert_error(
            405,
            "method GET is not allowed on /v2/models/simple/infer; use POST",
        );
        assert_eq!(r.header("allow"), Some("POST"));
        let r = env.post("/v2/health/ready", &json_body(&json!({}))).await;
        r.assert_error(
            405,
            "method POST is not allowed on /v2/health/ready; use GET",
        );
        assert_eq!(r.header("allow"), Some("GET, HEAD"));
        let r = env.get("/v2/repository/index").await;
        r.assert_error(
            405,
            "method GET is not allowed on /v2/repository/index; use POST",
        );
        assert_eq!(r.header("allow"), Some("POST"));

        // Triton's endpoints that a gateway does not offer: 501, saying so, as over gRPC.
        let memory = "is not supported by tensorgate: it forwards tensors in the request itself; \
                      send them in the request (binary tensor data over REST, raw_input_contents over gRPC)";
        let setting = "are not supported by tensorgate: set them on the backends themselves";
        let r = env.get("/v2/systemsharedmemory/status").await;
        r.assert_error(501, &format!("system shared memory {memory}"));
        let r = env
            .post(
                "/v2/cudasharedmemory/region/r0/register",
                &json_body(&json!({})),
            )
            .await;
        r.assert_error(501, &format!("CUDA shared memory {memory}"));
        let r = env.get("/v2/models/simple/trace/setting").await;
        r.assert_error(501, &format!("trace settings {setting}"));
        let r = env.post("/v2/logging", &json_body(&json!({}))).await;
        r.assert_error(501, &format!("log settings {setting}"));

        let unknown_version = "model 'simple' has no version '7' (its versions are 1)";
        let r = env.post("/v2/models/simple/versions/7/infer", &body).await;
        r.assert_error(404, unknown_version);
        let r = env.get("/v2/models/simple/versions/7").await;
        r.assert_error(404, unknown_version);
        let r = env.get("/v2/models/simple/versions/7/ready").await;
        r.assert_error(404, unknown_version);
        env.shutdown().await;
    }
}

/// A `simple` request with INPUT0 replaced by `input0`.
fn simple_with(input0: Value) -> Value {
    json!({
        "inputs": [input0, int32_tensor("INPUT1", &[1, 16], &ones()).json_input()]
    })
}

#[tokio::test]
async fn requests_that_do_not_match_the_model() {
    for topology in Topology::ALL {
        let env = start(topology).await;
        let cases: Vec<(Value, &str)> = vec![
            (
                simple_with(json!({ "name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": vec![0.5; 16] })),
                "input 'INPUT0': datatype FP32 does not match the model's INT32",
            ),
            (
                simple_with(json!({ "name": "INPUT0", "datatype": "INT32", "shape": [16], "data": ones() })),
                "input 'INPUT0': shape [16] has rank 1 but the model expects rank 2 [-1,16]",
            ),
            (
                simple_with(json!({ "name": "INPUT0", "datatype": "INT32", "shape": [2, 8], "data": ones() })),
                "input 'INPUT0': shape [2,8] does not match the model's [-1,16] at dimension 1",
            ),
            (
                json!({ "inputs": [
                    int32_tensor("INPUT0", &[1, 16], &ones()).json_input(),
                    int32_tensor("INPUT1", &[1, 16], &ones()).json_input(),
                    int32_tensor("INPUT2", &[1, 16], &ones()).json_input(),
                ]}),
                "unknown input 'INPUT2' for model 'simple' (its inputs are INPUT0, INPUT1)",
            ),
            (
                json!({ "inputs": [int32_tensor("INPUT0", &[1, 16], &ones()).json_input()] }),
                "model 'simple' requires input 'INPUT1', which the request does not have",
            ),
            (
                {
                    let mut r = simple_request(&ones(), &ones());
                    r["outputs"] = json!([{ "name": "OUTPUT0" }, { "name": "OUTPUT9" }]);
                    r
                },
                "unknown output 'OUTPUT9' requested from model 'simple' (its outputs are OUTPUT0, OUTPUT1)",
            ),
            (
                simple_with(json!({ "name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": vec![1; 15] })),
                "input 'INPUT0': shape [1,16] needs 16 elements, data has 15",
            ),
            (
                simple_with(json!({ "name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": vec![1; 17] })),
                "input 'INPUT0': shape [1,16] needs 16 elements, data has 17",
            ),
            (
                simple_with(json!({ "name": "INPUT0", "datatype": "INT33", "shape": [1, 16], "data": ones() })),
                "input 'INPUT0': unknown datatype 'INT33'",
            ),
            (
                simple_with(json!({ "name": "INPUT0", "datatype": "INT32", "shape": [1, 16] })),
                "input 'INPUT0': has neither 'data' nor 'parameters.binary_data_size'",
            ),
            (
                simple_with(json!({ "name": "INPUT0", "datatype": "INT32", "shape": [1, -16], "data": ones() })),
                "input 'INPUT0': shape [1,-16] has a negative dimension -16",
            ),
            (
                {
                    let mut r = simple_request(&ones(), &ones());
                    r["parameters"] = json!({ "triton_x": 1 });
                    r
                },
                "parameter 'triton_x' is reserved: names starting with 'triton_' may not be used",
            ),
        ];
        for (req, message) in cases {
            let r = env.infer_json("simple", &req).await;
            r.assert_error(400, message);
        }
        // Binary parts: duplicate names, a short binary part, bytes left over.
        let x = int32_tensor("INPUT0", &[1, 16], &ones());
        let header = json!({ "inputs": [x.binary_input(), x.binary_input()] });
        let r = env.infer("simple", &binary_body(&header, &[&x.data])).await;
        r.assert_error(400, "duplicate input name 'INPUT0'");
        let header = json!({ "inputs": [
            x.binary_input(),
            { "name": "INPUT1", "datatype": "INT32", "shape": [1, 16],
              "parameters": { "binary_data_size": 64 } },
        ]});
        let r = env
            .infer("simple", &binary_body(&header, &[&x.data, &x.data[..40]]))
            .await;
        r.assert_error(
            400,
            "input 'INPUT1': binary_data_size is 64 but only 40 bytes of binary data remain (24 missing)",
        );
        let r = env
            .infer("simple", &binary_body(&header, &[&x.data, &x.data, b"xyz"]))
            .await;
        r.assert_error(400, "request body has 3 bytes after the last binary input");

        // BYTES that are not UTF-8 cannot be written as JSON.
        let framed = b"\x02\x00\x00\x00ok\x01\x00\x00\x00\xff";
        let header = json!({ "inputs": [{ "name": "INPUT0", "datatype": "BYTES", "shape": [1, 2],
                                          "parameters": { "binary_data_size": framed.len() } }] });
        let r = env
            .infer("identity_bytes", &binary_body(&header, &[framed]))
            .await;
        if topology == Topology::JsonWorker {
            // The backend takes JSON only: the input itself cannot reach it.
            r.assert_error(
                400,
                "input 'INPUT0': BYTES element 1 is not valid UTF-8, so it cannot be written as JSON; backend 'backend-0' takes JSON only (no binary tensor extension)",
            );
        } else {
            r.assert_error(
                400,
                "output 'OUTPUT0': BYTES element 1 is not valid UTF-8, so it cannot be written as JSON; request this output with \"binary_data\": true",
            );
        }
        env.shutdown().await;
    }
}

#[tokio::test]
async fn invalid_inference_header_content_length() {
    for topology in Topology::ALL {
        let env = start(topology).await;
        let json = serde_json::to_vec(&simple_request(&ones(), &ones())).unwrap();
        for (value, message) in [
            (
                "abc".to_string(),
                "Inference-Header-Content-Length must be a non-negative integer, got 'abc'"
                    .to_string(),
            ),
            (
                "-1".to_string(),
                "Inference-Header-Content-Length must be a non-negative integer, got '-1'"
                    .to_string(),
            ),
            (
                (json.len() + 1).to_string(),
                format!(
                    "Inference-Header-Content-Length is {} but the body has only {} bytes",
                    json.len() + 1,
                    json.len()
                ),
            ),
        ] {
            let req = env
                .client
                .post(env.url("/v2/models/simple/infer"))
                .header("Inference-Header-Content-Length", value)
                .body(json.clone());
            env.send(req).await.assert_error(400, &message);
        }
        // Sent twice with different values: no right one to pick. The same value twice is
        // one value.
        let n = json.len().to_string();
        let twice = |second: &str| {
            env.client
                .post(env.url("/v2/models/simple/infer"))
                .header("Inference-Header-Content-Length", n.as_str())
                .header("Inference-Header-Content-Length", second)
                .body(json.clone())
        };
        env.send(twice("7")).await.assert_error(
            400,
            "Inference-Header-Content-Length is sent 2 times with different values; send it once",
        );
        assert_eq!(env.send(twice(&n)).await.status, 200);
        // A value equal to the body length is allowed.
        let r = env
            .infer(
                "simple",
                &Body {
                    bytes: json.clone(),
                    header_length: Some(json.len()),
                },
            )
            .await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        env.shutdown().await;
    }
}

#[tokio::test]
async fn size_limits() {
    for topology in Topology::ALL {
        let env = start_with(topology, |c| {
            c.limits.max_body_bytes = 4096;
            c.limits.max_json_bytes = 2048;
            c.limits.max_tensor_elements = 100;
        })
        .await;
        // Body over max_body_bytes (binary data makes it large without a large JSON part).
        let x = int32_tensor("INPUT0", &[1, 16], &ones());
        let header = json!({ "inputs": [x.binary_input()] });
        let mut body = binary_body(&header, &[&[0u8; 5000]]);
        body.header_length = Some(serde_json::to_vec(&header).unwrap().len());
        let r = env.infer("simple", &body).await;
        r.assert_error(
            413,
            "request body is larger than the limit of 4096 bytes (limits.max_body_bytes)",
        );
        // A JSON header over max_json_bytes, within max_body_bytes.
        let mut req = simple_request(&ones(), &ones());
        req["id"] = json!("x".repeat(2500));
        let n = serde_json::to_vec(&req).unwrap().len();
        assert!(n > 2048 && n < 4096);
        let r = env.infer_json("simple", &req).await;
        r.assert_error(
            413,
            &format!("the JSON request is {n} bytes; the limit is 2048 (limits.max_json_bytes)"),
        );
        // A header length over max_json_bytes is refused before the body is read.
        let req = env
            .client
            .post(env.url("/v2/models/simple/infer"))
            .header("Inference-Header-Content-Length", "3000")
            .body(vec![b' '; 3500]);
        env.send(req).await.assert_error(
            413,
            "the JSON request is 3000 bytes (Inference-Header-Content-Length); the limit is 2048 (limits.max_json_bytes)",
        );
        // Too many elements.
        let big = simple_with(
            json!({ "name": "INPUT0", "datatype": "INT32", "shape": [7, 16], "data": [0] }),
        );
        let r = env.infer_json("simple", &big).await;
        r.assert_error(
            413,
            "input 'INPUT0': shape [7,16] has 112 elements; the limit is 100 per tensor",
        );
        // Just under every limit passes.
        let r = env
            .infer_json("simple", &simple_request(&ones(), &ones()))
            .await;
        assert_eq!(r.status, 200);
        env.shutdown().await;
    }
}

#[tokio::test]
async fn content_encodings() {
    for topology in Topology::ALL {
        let env = start(topology).await;
        let a: Vec<i32> = (0..16).collect();
        let json = serde_json::to_vec(&simple_request(&a, &a)).unwrap();

        // An unsupported encoding is the client's error: 415, where Triton answers 501. One
        // beside identity is still one coding; stacked codings (RFC 9110 8.4 allows them)
        // are refused saying that is why.
        let refused = [
            (
                "br",
                json.clone(),
                "unsupported Content-Encoding 'br'; supported: gzip, deflate, identity",
            ),
            (
                "br, identity",
                json.clone(),
                "unsupported Content-Encoding 'br, identity'; supported: gzip, deflate, identity",
            ),
            (
                "gzip, gzip",
                gzip(&gzip(&json)),
                "unsupported Content-Encoding 'gzip, gzip': a body in more than one coding is \
                 not supported; send it in one of gzip, deflate or identity",
            ),
        ];
        for (coding, body, says) in refused {
            let req = env
                .client
                .post(env.url("/v2/models/simple/infer"))
                .header("Content-Encoding", coding)
                .header("Content-Type", "application/json")
                .body(body);
            env.send(req).await.assert_error(415, says);
        }

        let codings: [(&str, Codec, &str); 2] = [
            (
                "gzip",
                (gzip, gunzip),
                "it is not valid gzip (Content-Encoding): invalid gzip header",
            ),
            (
                "deflate",
                (deflate, inflate),
                "it is not valid deflate (Content-Encoding): corrupt deflate stream; HTTP's deflate is zlib's format (RFC 1950)",
            ),
        ];
        for (coding, codec, corrupt) in codings {
            check_coding(&env, topology, coding, codec, corrupt).await;
        }
        // Codings are case-insensitive, and x-gzip is gzip (RFC 9110 8.4.1).
        for (spelling, compress) in [
            ("GZIP", gzip as fn(&[u8]) -> Vec<u8>),
            ("x-gzip", gzip),
            ("Deflate", deflate),
        ] {
            let req = env
                .client
                .post(env.url("/v2/models/simple/infer"))
                .header("Content-Encoding", spelling)
                .header("Content-Type", "application/json")
                .body(compress(&json));
            let r = env.send(req).await;
            assert_eq!(r.status, 200, "{topology:?} {spelling}");
            assert_eq!(
                int32s(output(&r.decode(), "OUTPUT0")),
                a.iter().map(|v| v * 2).collect::<Vec<_>>()
            );
        }
        env.shutdown().await;
    }
}

/// Compresses and decompresses in one HTTP content coding.
type Codec = (fn(&[u8]) -> Vec<u8>, fn(&[u8]) -> Vec<u8>);

/// A request body in HTTP content coding `coding` is accepted (a plain answer without
/// Accept-Encoding); with Accept-Encoding the response, JSON or binary, comes back in that
/// coding, a binary one with its IHCL counting bytes of the decompressed body; and a body
/// that is not in that coding is the client's error.
async fn check_coding(
    env: &Env,
    topology: Topology,
    coding: &str,
    (compress, decompress): Codec,
    corrupt: &str,
) {
    let a: Vec<i32> = (0..16).collect();
    let sum: Vec<i32> = a.iter().map(|v| v * 2).collect();
    let json = serde_json::to_vec(&simple_request(&a, &a)).unwrap();
    let infer = || {
        env.client
            .post(env.url("/v2/models/simple/infer"))
            .header("Content-Encoding", coding)
            .header("Content-Type", "application/json")
    };
    let r = env.send(infer().body(compress(&json))).await;
    assert_eq!(
        r.status,
        200,
        "{topology:?} {coding}: {}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.header("content-encoding"), None);
    assert_eq!(int32s(output(&r.decode(), "OUTPUT0")), sum);

    for binary in [false, true] {
        let mut req_json = simple_request(&a, &a);
        if binary {
            req_json["parameters"] = json!({ "binary_data_output": true });
        }
        let req = infer()
            .header("Accept-Encoding", coding)
            .body(compress(&serde_json::to_vec(&req_json).unwrap()));
        let mut r = env.send(req).await;
        assert_eq!(r.status, 200, "{topology:?} {coding} binary={binary}");
        assert_eq!(r.header("content-encoding"), Some(coding));
        assert_eq!(
            r.header("x-tensorgate-backend"),
            Some(topology.backend_name())
        );
        r.body = decompress(&r.body).into();
        if binary {
            r.assert_binary_response();
        } else {
            r.assert_json_response();
        }
        let resp = r.decode();
        assert_eq!(int32s(output(&resp, "OUTPUT0")), sum);
        assert_eq!(int32s(output(&resp, "OUTPUT1")), vec![0; 16]);
    }

    // Only a successful inference is compressed, as Triton does: tritonclient.http.aio asks
    // for gzip on every call but inflates only inference answers itself.
    let metadata = env.client.get(env.url("/v2/models/simple"));
    let r = env.send(metadata.header("Accept-Encoding", coding)).await;
    assert_eq!((r.status, r.header("content-encoding")), (200, None));
    let metadata: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(metadata["name"], "simple", "{topology:?} {coding}");
    let unknown = env
        .client
        .post(env.url("/v2/models/nosuch/infer"))
        .header("Accept-Encoding", coding)
        .body(json.clone());
    let r = env.send(unknown).await;
    assert_eq!(r.header("content-encoding"), None);
    r.assert_error(404, "unknown model 'nosuch'");

    env.send(infer().body(json.clone()))
        .await
        .assert_error(400, &format!("cannot read the request body: {corrupt}"));
}

#[tokio::test]
async fn health_and_draining() {
    for topology in Topology::ALL {
        let env = start(topology).await;
        let r = env.get("/v2/health/live").await;
        assert_eq!(r.status, 200);
        assert_eq!(r.json(), json!({ "live": true }));
        let r = env.get("/v2/health/ready").await;
        assert_eq!(r.status, 200);
        assert_eq!(r.json(), json!({ "ready": true }));

        env.gateway.gateway.start_draining();
        let r = env.get("/v2/health/ready").await;
        r.assert_error(503, "tensorgate is shutting down");
        assert_eq!(r.header("retry-after"), Some("1"));
        // Still live, and requests in flight or arriving late are still served.
        assert_eq!(env.get("/v2/health/live").await.status, 200);
        let r = env
            .infer_json("simple", &simple_request(&ones(), &ones()))
            .await;
        assert_eq!(r.status, 200);
        env.shutdown().await;
    }
}

#[tokio::test]
async fn server_and_model_metadata() {
    for topology in Topology::ALL {
        let env = start(topology).await;
        let r = env.get("/v2").await;
        assert_eq!(r.status, 200);
        r.assert_json_response();
        assert_eq!(
            r.json(),
            json!({
                "name": "tensorgate",
                "version": env!("CARGO_PKG_VERSION"),
                // No backend has a model repository, so model_repository is not listed.
                "extensions": ["binary_tensor_data", "classification", "sequence", "statistics"],
            })
        );

        let simple = json!({
            "name": "simple",
            "versions": ["1"],
            "platform": "tensorgate_builtin",
            "inputs": [
                { "name": "INPUT0", "datatype": "INT32", "shape": [-1, 16] },
                { "name": "INPUT1", "datatype": "INT32", "shape": [-1, 16] },
            ],
            "outputs": [
                { "name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 16] },
                { "name": "OUTPUT1", "datatype": "INT32", "shape": [-1, 16] },
            ],
        });
        for path in ["/v2/models/simple", "/v2/models/simple/versions/1"] {
            let r = env.get(path).await;
            assert_eq!(r.status, 200);
            assert_eq!(r.json(), simple);
        }
        let r = env.get("/v2/models/identity_bf16").await;
        assert_eq!(r.json()["inputs"][0]["datatype"], "BF16");
        assert_eq!(r.json()["inputs"][0]["shape"], json!([-1, -1]));
        let r = env.get("/v2/models/accumulate").await;
        assert_eq!(r.json()["inputs"][0]["shape"], json!([1]));
        let r = env.get("/v2/models/classifier").await;
        assert_eq!(r.json()["outputs"][0]["shape"], json!([-1, 10]));

        for path in [
            "/v2/models/simple/ready",
            "/v2/models/simple/versions/1/ready",
        ] {
            let r = env.get(path).await;
            assert_eq!(r.status, 200);
            assert_eq!(r.json(), json!({ "name": "simple", "ready": true }));
        }
        env.shutdown().await;
    }
}

#[tokio::test]
async fn repository_index_lists_every_model_ready() {
    for topology in Topology::ALL {
        let env = start(topology).await;
        let r = env
            .post("/v2/repository/index", &json_body(&json!({})))
            .await;
        assert_eq!(r.status, 200);
        let list = r.json();
        let list = list.as_array().unwrap();
        let mut names: Vec<&str> = list.iter().map(|e| e["name"].as_str().unwrap()).collect();
        names.sort();
        let mut expected = tensorgate::models::builtin_names();
        expected.sort();
        assert_eq!(names, expected);
        assert_eq!(list.len(), 17);
        for e in list {
            assert_eq!(e["state"], "READY", "{e}");
            assert_eq!(e["version"], "1", "{e}");
        }
        env.shutdown().await;
    }
}

/// A port on 127.0.0.1 that nothing listens on (bound, read, released).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test]
async fn no_reachable_backend() {
    let port = closed_port();
    let config = front_config(&format!("http://127.0.0.1:{port}"));
    let gateway = run::start(config, false)
        .await
        .expect("the gateway starts even when its backend is down");
    let env = Env::new(Topology::Worker, gateway, None);
    // Alive, but not ready: discovery found no model.
    assert_eq!(env.get("/v2/health/live").await.status, 200);
    let r = env.get("/v2/health/ready").await;
    r.assert_error(
        503,
        &format!("no backend has a ready model; backend 'backend-0' failed its health checks: cannot connect to http://127.0.0.1:{port}: client error (Connect): tcp connect error: Connection refused (os error 111)"),
    );
    assert_eq!(r.header("retry-after"), Some("1"));
    // No backend ever said what it serves: the model may be the unreached backend's, so
    // the answer is "not now" (503), not "no such model" (404), which clients take as final.
    let unreached = format!("unknown model 'simple', but backend 'backend-0' (cannot connect to http://127.0.0.1:{port}: client error (Connect): tcp connect error: Connection refused (os error 111)) has not been reached to say which models it serves; retry later");
    let r = env
        .infer_json("simple", &simple_request(&ones(), &ones()))
        .await;
    r.assert_error(503, &unreached);
    assert_eq!(r.header("retry-after"), Some("1"));
    env.get("/v2/models/simple")
        .await
        .assert_error(503, &unreached);
    env.get("/v2/models/simple/ready")
        .await
        .assert_error(503, &unreached);
    let r = env
        .post("/v2/repository/index", &json_body(&json!({})))
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!([]));
    // Server metadata does not depend on backends.
    assert_eq!(env.get("/v2").await.status, 200);
    env.shutdown().await;
}

#[tokio::test]
async fn backend_that_dies_after_discovery() {
    let worker = start_worker().await;
    let worker_url = format!("http://{}", worker.addr);
    let gateway = run::start(front_config(&worker_url), false).await.unwrap();
    let env = Env::new(Topology::Worker, gateway, None);
    let body = simple_request(&ones(), &ones());
    assert_eq!(env.infer_json("simple", &body).await.status, 200);
    worker.shutdown().await;

    // The catalog still lists the model; the forward fails and names the backend.
    let r = env.infer_json("simple", &body).await;
    assert_eq!(r.status, 502, "{}", String::from_utf8_lossy(&r.body));
    let message = r.error();
    assert!(message.starts_with("backend 'backend-0': "), "{message}");
    assert!(message.contains(&worker_url), "{message}");
    assert_eq!(r.header("x-tensorgate-backend"), Some("backend-0"));

    // One health check without an answer is not yet an outage (unhealthy_after_checks = 2
    // by default): the gateway still reports ready.
    env.gateway.gateway.fleet.refresh().await;
    assert_eq!(env.get("/v2/health/ready").await.status, 200);
    // After the second, the backend is unreachable: not ready. Its models stay known with
    // no ready backend, so clients get a retryable 503, not a 404 "unknown model".
    env.gateway.gateway.fleet.refresh().await;
    env.get("/v2/health/ready").await.assert_error(
        503,
        &format!("no backend has a ready model; backend 'backend-0' failed its health checks: cannot connect to {worker_url}: client error (Connect): tcp connect error: Connection refused (os error 111)"),
    );
    env.infer_json("simple", &body)
        .await
        .assert_error(503, "no healthy backend serves model 'simple'");
    env.get("/v2/models/simple/ready").await.assert_error(
        503,
        "model 'simple' is not ready: no backend reports it ready",
    );
    env.shutdown().await;
}

#[tokio::test]
async fn plaintext_h2_with_prior_knowledge() {
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    // An h2c client that starts with the HTTP/2 preface: no upgrade, no TLS.
    let h2c: Client<_, Full<bytes::Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    for topology in Topology::ALL {
        let env = start(topology).await;
        let a: Vec<i32> = (0..16).collect();
        let json = serde_json::to_vec(&simple_request(&a, &a)).unwrap();
        let send = |method: &str, path: &str, body: Vec<u8>| {
            let req = http::Request::builder()
                .method(method)
                .uri(env.url(path))
                .header("content-type", "application/json")
                .body(Full::new(bytes::Bytes::from(body)))
                .unwrap();
            let h2c = h2c.clone();
            async move {
                let resp = h2c.request(req).await.expect("an h2c answer");
                let (parts, body) = resp.into_parts();
                let bytes = body.collect().await.expect("the body").to_bytes();
                (parts, bytes)
            }
        };

        let (parts, body) = send("GET", "/v2/health/ready", Vec::new()).await;
        assert_eq!(parts.version, http::Version::HTTP_2);
        assert_eq!(parts.status, 200);
        assert_eq!(
            serde_json::from_slice::<Value>(&body).unwrap(),
            json!({ "ready": true })
        );
        // HEAD: the GET's length and no content (RFC 9110 9.3.2); h2 clients reset a
        // stream whose HEAD answer carries DATA.
        let (parts, body) = send("HEAD", "/v2/health/ready", Vec::new()).await;
        assert_eq!(parts.status, 200);
        assert_eq!(parts.headers["content-length"], "14");
        assert_eq!(&body[..], b"");

        let (parts, body) = send("POST", "/v2/models/simple/infer", json.clone()).await;
        assert_eq!(parts.version, http::Version::HTTP_2);
        assert_eq!(
            parts.status,
            200,
            "{topology:?}: {}",
            String::from_utf8_lossy(&body)
        );
        assert_eq!(
            parts.headers["x-tensorgate-backend"],
            topology.backend_name()
        );
        let resp: Value = serde_json::from_slice(&body).unwrap();
        let sum: Vec<i32> = a.iter().map(|v| v * 2).collect();
        assert_eq!(resp["outputs"][0]["name"], "OUTPUT0");
        assert_eq!(resp["outputs"][0]["data"], json!(sum));

        // Errors keep their status and body over h2.
        let (parts, body) = send("POST", "/v2/models/nope/infer", json.clone()).await;
        assert_eq!(parts.status, 404);
        assert_eq!(
            serde_json::from_slice::<Value>(&body).unwrap(),
            json!({ "error": "unknown model 'nope'" })
        );
        env.shutdown().await;
    }
}

/// A gateway started with no backends (valid: a reload may add them) says why it is not
/// ready, rather than that no backend has a ready model.
#[tokio::test]
async fn a_gateway_without_backends_says_so() {
    let mut config = front_config("http://127.0.0.1:1");
    config.backends.clear();
    let gateway = run::start(config, false).await.unwrap();
    let env = Env::new(Topology::Worker, gateway, None);
    env.get("/v2/health/ready")
        .await
        .assert_error(503, "no [[backends]] are configured");
    env.shutdown().await;
}
