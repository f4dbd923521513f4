//! A corpus of malformed requests: each gets a 4xx with `{"error": ...}` (415 for an unknown
//! Content-Encoding, where Triton answers 501), and the gateway keeps serving valid requests,
//! checked between every case and by a concurrent client throughout.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::json;
use tensorgate::config::Config;

struct Case {
    name: &'static str,
    path: &'static str,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
    status: u16,
    /// A fragment the error message must contain.
    says: &'static str,
}

fn case(name: &'static str, body: impl Into<Vec<u8>>, status: u16, says: &'static str) -> Case {
    Case {
        name,
        path: "/v2/models/simple/infer",
        headers: vec![],
        body: body.into(),
        status,
        says,
    }
}

fn with_ihcl(mut c: Case, h: impl ToString) -> Case {
    c.headers
        .push(("inference-header-content-length", h.to_string()));
    c
}

fn at(mut c: Case, path: &'static str) -> Case {
    c.path = path;
    c
}

fn tensor(
    name: &str,
    dt: &str,
    shape: serde_json::Value,
    data: serde_json::Value,
) -> serde_json::Value {
    json!({"name": name, "datatype": dt, "shape": shape, "data": data})
}

fn req(inputs: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&json!({ "inputs": inputs })).unwrap()
}

fn sixteen() -> serde_json::Value {
    json!([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15])
}

fn valid_simple() -> Vec<u8> {
    req(json!([
        tensor("INPUT0", "INT32", json!([1, 16]), sixteen()),
        tensor("INPUT1", "INT32", json!([1, 16]), sixteen())
    ]))
}

fn binary(header: serde_json::Value, tail: &[u8]) -> (Vec<u8>, usize) {
    let h = serde_json::to_vec(&header).unwrap();
    let n = h.len();
    let mut b = h;
    b.extend_from_slice(tail);
    (b, n)
}

fn corpus() -> Vec<Case> {
    let mut v = Vec::new();
    let good = valid_simple();
    // Truncated bodies and lying lengths.
    for cut in [1, 10, 40, good.len() / 2, good.len() - 1] {
        v.push(case(
            "truncated json",
            good[..cut].to_vec(),
            400,
            "EOF while parsing",
        ));
    }
    v.push(with_ihcl(
        case(
            "ihcl beyond body",
            good.clone(),
            400,
            "but the body has only",
        ),
        good.len() + 1,
    ));
    v.push(with_ihcl(
        case(
            "ihcl not a number",
            good.clone(),
            400,
            "must be a non-negative integer",
        ),
        "abc",
    ));
    v.push(with_ihcl(
        case(
            "ihcl negative",
            good.clone(),
            400,
            "must be a non-negative integer",
        ),
        "-5",
    ));
    v.push(with_ihcl(
        case(
            // Past the body's own length: malformed (400), however large, not too large.
            "ihcl huge",
            good.clone(),
            400,
            "Inference-Header-Content-Length is 99999999999999999999999 but the body has only",
        ),
        "99999999999999999999999",
    ));
    let (b, n) = binary(
        json!({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}}]}),
        &[0; 10],
    );
    v.push(with_ihcl(
        case("binary shorter than announced", b, 400, "(54 missing)"),
        n,
    ));
    let (b, n) = binary(
        json!({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 60}}]}),
        &[0; 60],
    );
    v.push(with_ihcl(
        case(
            "binary size against shape",
            b,
            400,
            "binary_data_size is 60 but shape [1,16] of INT32 needs 64 bytes",
        ),
        n,
    ));
    let (b, n) = binary(
        json!({"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}}]}),
        &[0; 70],
    );
    v.push(with_ihcl(
        case(
            "bytes left over",
            b,
            400,
            "request body has 6 bytes after the last binary input",
        ),
        n,
    ));
    let (b, n) = binary(
        json!({"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 1], "parameters": {"binary_data_size": 8}}]}),
        &[200, 0, 0, 0, 1, 2, 3, 4],
    );
    v.push(at(
        with_ihcl(
            case(
                "bytes prefix past chunk",
                b,
                400,
                "BYTES element 0 declares 200 bytes",
            ),
            n,
        ),
        "/v2/models/identity_bytes/infer",
    ));
    let (b, n) = binary(
        json!({"inputs": [{"name": "INPUT0", "datatype": "BOOL", "shape": [1, 2], "parameters": {"binary_data_size": 2}}]}),
        &[1, 7],
    );
    v.push(at(
        with_ihcl(
            case("bool byte 7", b, 400, "BOOL element 1 is the byte 7"),
            n,
        ),
        "/v2/models/identity_bool/infer",
    ));
    v.push(at(
        with_ihcl(
            case(
                "raw to a two-input model",
                vec![0u8; 64],
                400,
                "needs a model with exactly one input",
            ),
            0,
        ),
        "/v2/models/simple/infer",
    ));
    v.push(at(
        with_ihcl(
            case(
                "raw not whole elements",
                vec![0u8; 10],
                400,
                "is not a whole number of FP32 elements",
            ),
            0,
        ),
        "/v2/models/identity_fp32/infer",
    ));
    // Invalid UTF-8 and wrong JSON types.
    v.push(case(
        "invalid utf-8",
        b"{\"inputs\":[{\"name\":\"\xff\xfe\",\"datatype\":\"INT32\",\"shape\":[1],\"data\":[1]}]}"
            .to_vec(),
        400,
        "invalid",
    ));
    v.push(case(
        "not json",
        b"hello".to_vec(),
        400,
        "invalid JSON request",
    ));
    v.push(case("empty body", Vec::new(), 400, "invalid JSON request"));
    v.push(case(
        "array top level",
        b"[]".to_vec(),
        400,
        "the request must be a JSON object, not an array",
    ));
    v.push(case(
        "inputs not an array",
        br#"{"inputs":{}}"#.to_vec(),
        400,
        "field 'inputs'",
    ));
    v.push(case(
        "inputs missing",
        br#"{"outputs":[]}"#.to_vec(),
        400,
        "missing field `inputs`",
    ));
    v.push(case(
        "name a number",
        req(json!([{"name": 5, "datatype": "INT32", "shape": [1], "data": [1]}])),
        400,
        "field 'name'",
    ));
    v.push(case(
        "name missing",
        req(json!([{"datatype": "INT32", "shape": [1], "data": [1]}])),
        400,
        "missing field `name`",
    ));
    v.push(case(
        "shape a string",
        req(json!([tensor("INPUT0", "INT32", json!("1,16"), sixteen())])),
        400,
        "input 'INPUT0': field 'shape'",
    ));
    v.push(case(
        "shape of strings",
        req(json!([tensor("INPUT0", "INT32", json!(["1"]), sixteen())])),
        400,
        "input 'INPUT0': field 'shape[0]'",
    ));
    v.push(case(
        "datatype a number",
        req(json!([tensor(
            "INPUT0",
            "INT32",
            json!([1, 16]),
            sixteen()
        )
        .as_object()
        .unwrap()
        .clone()
        .into_iter()
        .map(|(k, v)| if k == "datatype" {
            (k, json!(7))
        } else {
            (k, v)
        })
        .collect::<serde_json::Map<_, _>>()])),
        400,
        "field 'datatype'",
    ));
    v.push(case(
        "data an object",
        req(json!([tensor(
            "INPUT0",
            "INT32",
            json!([1, 16]),
            json!({"a": 1})
        )])),
        400,
        "'data' must be a JSON array",
    ));
    v.push(case(
        "data a string",
        req(json!([tensor(
            "INPUT0",
            "INT32",
            json!([1, 16]),
            json!("1,2")
        )])),
        400,
        "'data' must be a JSON array",
    ));
    v.push(case(
        "data strings for ints",
        req(json!([tensor(
            "INPUT0",
            "INT32",
            json!([1, 1]),
            json!(["1"])
        )])),
        400,
        "data element 0 is a string; INT32 needs a number",
    ));
    v.push(case(
        "data float for ints",
        req(json!([tensor(
            "INPUT0",
            "INT32",
            json!([1, 1]),
            json!([1.5])
        )])),
        400,
        "is not an integer, as INT32 requires",
    ));
    v.push(case(
        "data int out of range",
        req(json!([tensor(
            "INPUT0",
            "INT32",
            json!([1, 1]),
            json!([4294967296u64])
        )])),
        400,
        "is out of range for INT32",
    ));
    v.push(case(
        "parameters an array",
        br#"{"parameters":[1],"inputs":[]}"#.to_vec(),
        400,
        "field 'parameters'",
    ));
    v.push(case(
        "outputs not an array",
        br#"{"inputs":[],"outputs":"OUTPUT0"}"#.to_vec(),
        400,
        "field 'outputs'",
    ));
    v.push(case(
        "id a number",
        br#"{"id":5,"inputs":[]}"#.to_vec(),
        400,
        "field 'id'",
    ));
    // Huge or negative shapes and deep nesting.
    v.push(case(
        "negative dimension",
        req(json!([tensor(
            "INPUT0",
            "INT32",
            json!([-1, 16]),
            sixteen()
        )])),
        400,
        "has a negative dimension -1",
    ));
    v.push(case(
        "dimension 1e30",
        br#"{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1e30,16],"data":[]}]}"#
            .to_vec(),
        400,
        "is not an unsigned 64-bit integer",
    ));
    v.push(case("dimension 2^64", br#"{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[18446744073709551616],"data":[]}]}"#.to_vec(), 400, "is not an unsigned 64-bit integer"));
    v.push(case(
        "count overflow",
        req(json!([tensor(
            "INPUT0",
            "INT32",
            json!([4294967296u64, 4294967296u64, 2]),
            json!([])
        )])),
        400,
        "more elements than fit in 64 bits",
    ));
    v.push(case(
        "too many elements",
        req(json!([tensor(
            "INPUT0",
            "INT32",
            json!([1, 1u64 << 40]),
            json!([])
        )])),
        413,
        "the limit is",
    ));
    let deep = format!(
        r#"{{"inputs":[{{"name":"INPUT0","datatype":"INT32","shape":[1,1],"data":{}1{}}}]}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    v.push(case(
        "nesting 10000 deep",
        deep.into_bytes(),
        400,
        "nested deeper than",
    ));
    let deep_params = format!(
        r#"{{"parameters":{{"p":{}1{}}},"inputs":[]}}"#,
        "[".repeat(5_000),
        "]".repeat(5_000)
    );
    v.push(case(
        "deep parameters",
        deep_params.into_bytes(),
        400,
        "invalid JSON request",
    ));
    v.push(case(
        "count mismatch",
        req(json!([
            tensor("INPUT0", "INT32", json!([1, 16]), json!([1, 2, 3])),
            tensor("INPUT1", "INT32", json!([1, 16]), sixteen())
        ])),
        400,
        "shape [1,16] needs 16 elements, data has 3",
    ));
    // Binary garbage and duplicate names.
    let garbage: Vec<u8> = (0..2048u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    v.push(case(
        "binary garbage",
        garbage.clone(),
        400,
        "invalid JSON request",
    ));
    v.push(with_ihcl(
        case(
            "binary garbage with header",
            garbage.clone(),
            400,
            "invalid JSON request",
        ),
        100,
    ));
    v.push(with_ihcl(
        case(
            "garbage after zero-length header",
            b"\x00\x01\x02".to_vec(),
            400,
            "raw binary request",
        ),
        0,
    ));
    v.push(case(
        "duplicate input",
        req(json!([
            tensor("INPUT0", "INT32", json!([1, 16]), sixteen()),
            tensor("INPUT0", "INT32", json!([1, 16]), sixteen())
        ])),
        400,
        "duplicate input name 'INPUT0'",
    ));
    let mut dup_out = serde_json::from_slice::<serde_json::Value>(&good).unwrap();
    dup_out["outputs"] = json!([{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]);
    v.push(case(
        "duplicate output",
        serde_json::to_vec(&dup_out).unwrap(),
        400,
        "duplicate output name 'OUTPUT0'",
    ));
    v.push(case(
        "duplicate key",
        br#"{"inputs":[],"inputs":[]}"#.to_vec(),
        400,
        "duplicate field `inputs`",
    ));
    v.push(case(
        "duplicate parameter",
        br#"{"parameters":{"a":1,"a":2},"inputs":[]}"#.to_vec(),
        400,
        "duplicate parameter 'a'",
    ));
    // Datatypes, metadata, parameters.
    v.push(case(
        "unknown datatype",
        req(json!([tensor("INPUT0", "FP8", json!([1]), json!([1]))])),
        400,
        "unknown datatype 'FP8'",
    ));
    v.push(case(
        "wrong datatype",
        req(json!([
            tensor("INPUT0", "FP32", json!([1, 16]), sixteen()),
            tensor("INPUT1", "INT32", json!([1, 16]), sixteen())
        ])),
        400,
        "datatype FP32 does not match the model's INT32",
    ));
    v.push(case(
        "unknown input",
        req(json!([tensor("NOPE", "INT32", json!([1]), json!([1]))])),
        400,
        "unknown input 'NOPE'",
    ));
    v.push(case(
        "missing input",
        req(json!([tensor(
            "INPUT0",
            "INT32",
            json!([1, 16]),
            sixteen()
        )])),
        400,
        "requires input 'INPUT1'",
    ));
    let mut p = serde_json::from_slice::<serde_json::Value>(&good).unwrap();
    for (params, says) in [
        (
            json!({"sequence_id": -3}),
            "parameter 'sequence_id' must be an unsigned integer or a string",
        ),
        (
            json!({"sequence_id": 1.5}),
            "parameter 'sequence_id' must be an unsigned integer or a string",
        ),
        (json!({"sequence_id": "x".repeat(200)}), "the limit is 128"),
        (
            json!({"sequence_start": true}),
            "needs a non-zero, non-empty 'sequence_id'",
        ),
        (
            json!({"binary_data_output": "yes"}),
            "parameter 'binary_data_output' must be a bool",
        ),
        (json!({"triton_secret": 1}), "is reserved"),
        (
            json!({"timeout": "soon"}),
            "parameter 'timeout' must be an unsigned integer",
        ),
    ] {
        p["parameters"] = params;
        v.push(case(
            "bad request parameter",
            serde_json::to_vec(&p).unwrap(),
            400,
            says,
        ));
    }
    p["parameters"] = json!({});
    for (params, says) in [
        (
            json!({"binary_data": 1}),
            "output 'OUTPUT0': parameter 'binary_data' must be a bool",
        ),
        (
            json!({"classification": -1}),
            "parameter 'classification' must be an unsigned integer",
        ),
        (
            json!({"classification": "3"}),
            "parameter 'classification' must be an unsigned integer",
        ),
    ] {
        p["outputs"] = json!([{"name": "OUTPUT0", "parameters": params}]);
        v.push(case(
            "bad output parameter",
            serde_json::to_vec(&p).unwrap(),
            400,
            says,
        ));
    }
    p["outputs"] = json!([{"name": "OUTPUT9"}]);
    v.push(case(
        "unknown output",
        serde_json::to_vec(&p).unwrap(),
        400,
        "unknown output 'OUTPUT9'",
    ));
    v.push(at(
        case(
            "bare NaN in integer data",
            br#"{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,1],"data":[NaN]}]}"#
                .to_vec(),
            400,
            "input 'INPUT0': data element 0 is NaN, a float; INT32 needs a number",
        ),
        "/v2/models/identity_int32/infer",
    ));
    v.push(at(case("classification of BOOL", br#"{"inputs":[{"name":"INPUT0","datatype":"BOOL","shape":[1,1],"data":[true]}],"outputs":[{"name":"OUTPUT0","parameters":{"classification":2}}]}"#.to_vec(), 400, "classification is not supported for datatype BOOL"), "/v2/models/identity_bool/infer"));
    // A shape of thousands of dimensions is refused as it is read, not built first.
    for (name, rank) in [
        ("a shape of 65 dimensions", 65),
        ("a shape of 10000 dimensions", 10_000),
    ] {
        let ones = vec!["1"; rank].join(",");
        v.push(case(
            name,
            format!(r#"{{"inputs":[{{"name":"INPUT0","datatype":"INT32","shape":[{ones}],"data":[1]}}]}}"#),
            400,
            "input 'INPUT0': field 'shape': more than 64 dimensions (the most a tensor may have)",
        ));
    }
    let mut br = case(
        "brotli body",
        good.clone(),
        415,
        "unsupported Content-Encoding 'br'; supported: gzip, deflate, identity",
    );
    br.headers.push(("content-encoding", "br".into()));
    v.push(br);
    let mut gz = case(
        "gzip header, not gzip",
        good.clone(),
        400,
        "cannot read the request body",
    );
    gz.headers.push(("content-encoding", "gzip".into()));
    v.push(gz);
    v.push(at(
        case("unknown model", good.clone(), 404, "unknown model 'nope'"),
        "/v2/models/nope/infer",
    ));
    v.push(at(
        case("unknown version", good.clone(), 404, "has no version '9'"),
        "/v2/models/simple/versions/9/infer",
    ));
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_4xx_and_harm_no_one() {
    let mut config = Config::embedded_default();
    config.server.grpc_listen = None;
    config.server.listen = "127.0.0.1:0".parse().unwrap();
    let gw = tensorgate::run::start(config, false).await.unwrap();
    let base = format!("http://{}", gw.addr);
    let client = reqwest::Client::new();
    let valid = valid_simple();

    // A client sending valid requests the whole time.
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let background = {
        let (stop, served, client, url, body) = (
            stop.clone(),
            served.clone(),
            client.clone(),
            format!("{base}/v2/models/simple/infer"),
            valid.clone(),
        );
        tokio::spawn(async move {
            for _ in 0..100_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let r = client.post(&url).body(body.clone()).send().await.unwrap();
                assert_eq!(r.status(), 200);
                let v: serde_json::Value = r.json().await.unwrap();
                assert_eq!(v["outputs"][0]["data"][15], 30);
                served.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    let cases = corpus();
    let mut wrong: Vec<String> = Vec::new();
    assert!(cases.len() >= 60, "the corpus has {} cases", cases.len());
    for c in &cases {
        // Every case is the client's fault, so every expected status is a 4xx.
        assert!((400..500).contains(&c.status), "{}: {}", c.name, c.status);
        let mut r = client
            .post(format!("{base}{}", c.path))
            .body(c.body.clone());
        for (k, v) in &c.headers {
            r = r.header(*k, v);
        }
        let resp = r.send().await.unwrap_or_else(|e| panic!("{}: {e}", c.name));
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        let msg = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["error"].as_str().map(String::from));
        match msg {
            Some(m) if status == c.status && m.contains(c.says) => {}
            _ => wrong.push(format!(
                "{}: got {status} {text}; want {} containing {:?}",
                c.name, c.status, c.says
            )),
        }
        // A valid request right after each bad one is served correctly.
        let ok = client
            .post(format!("{base}/v2/models/simple/infer"))
            .body(valid.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(ok.status(), 200, "after {}", c.name);
        let v: serde_json::Value = ok.json().await.unwrap();
        assert_eq!(v["outputs"][1]["data"][3], 0, "after {}", c.name);
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases wrong:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
    stop.store(true, Ordering::Relaxed);
    background.await.unwrap();
    assert!(served.load(Ordering::Relaxed) > 0);
    let ready = client
        .get(format!("{base}/v2/health/ready"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    gw.shutdown().await;
}
