//! Every built-in model through the gateway, in both topologies: the models in-process, and
//! the gateway in front of a worker over HTTP. Every encoding: JSON, binary, mixed, raw.

use crate::common;

use common::*;
use serde_json::{json, Value};
use tensorgate::models::Classifier;
use tensorgate::protocol::DataType;

/// Shapes used for the identity models: rows of the [-1,-1] signature.
const SHAPES: &[&[u64]] = &[&[2, 3], &[1, 1], &[3, 5]];

/// Checks what every successful inference carries: 200, the backend header, the model name.
#[track_caller]
fn check_common(env: &Env, r: &Reply, model: &str) {
    assert_eq!(
        r.status,
        200,
        "{:?}: {}",
        env.topology,
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(
        r.header("x-tensorgate-backend"),
        Some(env.topology.backend_name()),
        "{:?}",
        env.topology
    );
    let h = r.json_header();
    assert_eq!(h["model_name"], model);
    assert_eq!(h["model_version"], "1");
}

#[tokio::test]
async fn simple_sums_and_differences_with_int32_wrapping() {
    let mut rng = fastrand::Rng::with_seed(1);
    for topology in Topology::ALL {
        let env = start(topology).await;
        // Row 0 wraps both ways; row 1 is random.
        let mut a: Vec<i32> = vec![i32::MAX, i32::MIN, i32::MAX, i32::MIN, -1, 0, 1, 2];
        let mut b: Vec<i32> = vec![1, -1, -1, 1, i32::MIN, i32::MIN, i32::MAX, i32::MAX];
        a.extend((0..8).map(|_| rng.i32(..)));
        b.extend((0..8).map(|_| rng.i32(..)));
        a.extend((0..16).map(|_| rng.i32(..)));
        b.extend((0..16).map(|_| rng.i32(..)));
        let sum: Vec<i32> = a.iter().zip(&b).map(|(x, y)| x.wrapping_add(*y)).collect();
        let diff: Vec<i32> = a.iter().zip(&b).map(|(x, y)| x.wrapping_sub(*y)).collect();
        assert_eq!(sum[0], i32::MIN, "the test data wraps");
        assert_eq!(sum[1], i32::MAX, "the test data wraps");
        assert_eq!(diff[2], i32::MIN, "the test data wraps");
        assert_eq!(diff[3], i32::MAX, "the test data wraps");
        let x = int32_tensor("INPUT0", &[2, 16], &a);
        let y = int32_tensor("INPUT1", &[2, 16], &b);

        // JSON in, JSON out.
        let r = env
            .infer_json(
                "simple",
                &json!({ "inputs": [x.json_input(), y.json_input()] }),
            )
            .await;
        check_common(&env, &r, "simple");
        r.assert_json_response();
        let resp = r.decode();
        assert_eq!(resp.outputs.len(), 2);
        assert_eq!(resp.outputs[0].name, "OUTPUT0");
        assert_eq!(resp.outputs[1].name, "OUTPUT1");
        for o in &resp.outputs {
            assert_eq!(o.shape, vec![2, 16]);
        }
        assert_eq!(int32s(output(&resp, "OUTPUT0")), sum);
        assert_eq!(int32s(output(&resp, "OUTPUT1")), diff);

        // Binary in, binary out.
        let header = json!({
            "inputs": [x.binary_input(), y.binary_input()],
            "parameters": { "binary_data_output": true },
        });
        let r = env
            .infer("simple", &binary_body(&header, &[&x.data, &y.data]))
            .await;
        check_common(&env, &r, "simple");
        r.assert_binary_response();
        let resp = r.decode();
        assert_eq!(int32s(output(&resp, "OUTPUT0")), sum);
        assert_eq!(int32s(output(&resp, "OUTPUT1")), diff);
        env.shutdown().await;
    }
}

#[tokio::test]
async fn simple_mixes_encodings_tensor_by_tensor() {
    for topology in Topology::ALL {
        let env = start(topology).await;
        let a: Vec<i32> = (0..16).collect();
        let b: Vec<i32> = (0..16).map(|i| 100 - i * 3).collect();
        let x = int32_tensor("INPUT0", &[1, 16], &a);
        let y = int32_tensor("INPUT1", &[1, 16], &b);
        // INPUT0 binary, INPUT1 JSON; OUTPUT1 JSON then OUTPUT0 binary (order as asked).
        let header = json!({
            "inputs": [x.binary_input(), y.json_input()],
            "outputs": [
                { "name": "OUTPUT1" },
                { "name": "OUTPUT0", "parameters": { "binary_data": true } },
            ],
        });
        let r = env.infer("simple", &binary_body(&header, &[&x.data])).await;
        check_common(&env, &r, "simple");
        r.assert_binary_response();
        let h = r.json_header();
        let outs = h["outputs"].as_array().unwrap();
        assert_eq!(outs.len(), 2);
        assert_eq!(outs[0]["name"], "OUTPUT1");
        let diff: Vec<i32> = a.iter().zip(&b).map(|(p, q)| p - q).collect();
        assert_eq!(outs[0]["data"], json!(diff));
        assert!(outs[0].get("parameters").is_none(), "{h}");
        assert_eq!(outs[1]["name"], "OUTPUT0");
        assert_eq!(outs[1]["parameters"]["binary_data_size"], 64);
        assert!(outs[1].get("data").is_none(), "{h}");
        assert_eq!(r.body.len(), r.header_length().unwrap() + 64);
        let resp = r.decode();
        let sum: Vec<i32> = a.iter().zip(&b).map(|(p, q)| p + q).collect();
        assert_eq!(int32s(output(&resp, "OUTPUT0")), sum);
        env.shutdown().await;
    }
}

/// Runs one identity inference and checks that the output is the input.
async fn identity_round_trip(
    env: &Env,
    t: &TestTensor,
    binary_in: bool,
    binary_out: bool,
    list_outputs: bool,
) {
    let model = format!("identity_{}", t.datatype.as_str().to_ascii_lowercase());
    let input = if binary_in {
        t.binary_input()
    } else {
        t.json_input()
    };
    let mut header = json!({ "inputs": [input] });
    if list_outputs {
        header["outputs"] =
            json!([{ "name": "OUTPUT0", "parameters": { "binary_data": binary_out } }]);
    } else if binary_out {
        header["parameters"] = json!({ "binary_data_output": true });
    }
    let body = if binary_in {
        binary_body(&header, &[&t.data])
    } else {
        json_body(&header)
    };
    let r = env.infer(&model, &body).await;
    eprintln!(
        "{:?} {model} shape {:?} binary_in={binary_in} binary_out={binary_out} listed={list_outputs}",
        env.topology, t.shape
    );
    check_common(env, &r, &model);
    if binary_out && !t.data.is_empty() {
        r.assert_binary_response();
        let h = r.json_header();
        assert_eq!(
            h["outputs"][0]["parameters"]["binary_data_size"],
            t.data.len()
        );
        assert_eq!(r.body.len() - r.header_length().unwrap(), t.data.len());
    } else if !binary_out {
        r.assert_json_response();
        let h = r.json_header();
        let data = h["outputs"][0]["data"].as_array().expect("JSON data");
        assert_eq!(data.len(), t.json.len());
        if t.datatype == DataType::Bytes || t.datatype == DataType::Bool {
            assert_eq!(data, &t.json);
        }
    }
    let resp = r.decode();
    assert_eq!(resp.outputs.len(), 1);
    t.assert_same(&resp.outputs[0], "OUTPUT0");
}

#[tokio::test]
async fn identity_every_type_json() {
    let mut rng = fastrand::Rng::with_seed(2);
    for topology in Topology::ALL {
        let env = start(topology).await;
        for dt in DataType::ALL {
            for shape in SHAPES {
                let t = random_tensor(&mut rng, "INPUT0", dt, shape);
                identity_round_trip(&env, &t, false, false, false).await;
                identity_round_trip(&env, &t, false, false, true).await;
            }
        }
        env.shutdown().await;
    }
}

#[tokio::test]
async fn identity_every_type_binary() {
    let mut rng = fastrand::Rng::with_seed(3);
    for topology in Topology::ALL {
        let env = start(topology).await;
        for dt in DataType::ALL {
            for shape in SHAPES {
                let t = random_tensor(&mut rng, "INPUT0", dt, shape);
                identity_round_trip(&env, &t, true, true, true).await;
            }
        }
        env.shutdown().await;
    }
}

#[tokio::test]
async fn identity_every_type_binary_in_json_out() {
    let mut rng = fastrand::Rng::with_seed(4);
    for topology in Topology::ALL {
        let env = start(topology).await;
        for dt in DataType::ALL {
            for shape in SHAPES {
                let t = random_tensor(&mut rng, "INPUT0", dt, shape);
                // Unlisted output without binary_data_output, and a listed one without
                // binary_data: both JSON.
                identity_round_trip(&env, &t, true, false, false).await;
                identity_round_trip(&env, &t, true, false, true).await;
            }
        }
        env.shutdown().await;
    }
}

#[tokio::test]
async fn identity_every_type_json_in_binary_out() {
    let mut rng = fastrand::Rng::with_seed(5);
    for topology in Topology::ALL {
        let env = start(topology).await;
        for dt in DataType::ALL {
            for shape in SHAPES {
                let t = random_tensor(&mut rng, "INPUT0", dt, shape);
                identity_round_trip(&env, &t, false, true, true).await;
            }
        }
        env.shutdown().await;
    }
}

#[tokio::test]
async fn binary_data_output_applies_when_no_outputs_are_listed() {
    let mut rng = fastrand::Rng::with_seed(6);
    for topology in Topology::ALL {
        let env = start(topology).await;
        for dt in DataType::ALL {
            let t = random_tensor(&mut rng, "INPUT0", dt, &[2, 4]);
            identity_round_trip(&env, &t, false, true, false).await;
            identity_round_trip(&env, &t, true, true, false).await;
        }
        // Both outputs of `simple` become binary.
        let a: Vec<i32> = (0..16).collect();
        let mut req = simple_request(&a, &a);
        req["parameters"] = json!({ "binary_data_output": true });
        let r = env.infer_json("simple", &req).await;
        check_common(&env, &r, "simple");
        r.assert_binary_response();
        let h = r.json_header();
        for o in h["outputs"].as_array().unwrap() {
            assert_eq!(o["parameters"]["binary_data_size"], 64, "{h}");
            assert!(o.get("data").is_none());
        }
        assert_eq!(r.body.len(), r.header_length().unwrap() + 128);
        let resp = r.decode();
        assert_eq!(
            int32s(output(&resp, "OUTPUT0")),
            a.iter().map(|v| v * 2).collect::<Vec<_>>()
        );
        assert_eq!(int32s(output(&resp, "OUTPUT1")), vec![0; 16]);
        env.shutdown().await;
    }
}

#[tokio::test]
async fn zero_element_tensors_round_trip() {
    let mut rng = fastrand::Rng::with_seed(7);
    for topology in Topology::ALL {
        let env = start(topology).await;
        for dt in [DataType::Fp32, DataType::Bytes, DataType::Bool] {
            let t = random_tensor(&mut rng, "INPUT0", dt, &[0, 4]);
            assert!(t.data.is_empty());
            identity_round_trip(&env, &t, false, false, true).await;
            identity_round_trip(&env, &t, true, true, true).await;
            // A zero-byte binary output adds no bytes after the JSON.
            let r = env
                .infer(
                    &format!("identity_{}", dt.as_str().to_ascii_lowercase()),
                    &binary_body(
                        &json!({
                            "inputs": [t.binary_input()],
                            "parameters": { "binary_data_output": true },
                        }),
                        &[],
                    ),
                )
                .await;
            check_common(
                &env,
                &r,
                &format!("identity_{}", dt.as_str().to_ascii_lowercase()),
            );
            let n = r.header_length().unwrap_or(r.body.len());
            assert_eq!(n, r.body.len());
            assert_eq!(
                r.json_header()["outputs"][0]["parameters"]["binary_data_size"],
                0
            );
            t.assert_same(&r.decode().outputs[0], "OUTPUT0");
        }
        env.shutdown().await;
    }
}

#[tokio::test]
async fn non_finite_floats_travel_as_strings_in_json() {
    for topology in Topology::ALL {
        let env = start(topology).await;
        for dt in [
            DataType::Fp16,
            DataType::Bf16,
            DataType::Fp32,
            DataType::Fp64,
        ] {
            let model = format!("identity_{}", dt.as_str().to_ascii_lowercase());
            let r = env
                .infer_json(
                    &model,
                    &json!({ "inputs": [{
                        "name": "INPUT0", "datatype": dt.as_str(), "shape": [1, 4],
                        "data": ["NaN", "Infinity", "-Infinity", 1.5],
                    }]}),
                )
                .await;
            check_common(&env, &r, &model);
            r.assert_json_response();
            assert_eq!(
                r.json()["outputs"][0]["data"],
                json!(["NaN", "Infinity", "-Infinity", 1.5]),
                "{dt}"
            );
        }
        env.shutdown().await;
    }
}

#[tokio::test]
async fn raw_binary_requests() {
    for topology in Topology::ALL {
        let env = start(topology).await;

        // identity_fp32 [-1,-1]: the leading -1 is the batch (1); the other is computed.
        let values = [1.5f32, -2.25, 1e-3];
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let r = env.infer("identity_fp32", &raw_body(&data)).await;
        check_common(&env, &r, "identity_fp32");
        r.assert_binary_response();
        let resp = r.decode();
        let o = output(&resp, "OUTPUT0");
        assert_eq!(o.shape, vec![1, 3]);
        assert_eq!(&o.data[..], &data[..]);

        // classifier [-1,8]: a batch of one row of 8 features.
        let features: Vec<f32> = (0..8).map(|i| i as f32 * 0.5 - 1.0).collect();
        let data: Vec<u8> = features.iter().flat_map(|v| v.to_le_bytes()).collect();
        let r = env.infer("classifier", &raw_body(&data)).await;
        check_common(&env, &r, "classifier");
        r.assert_binary_response();
        let resp = r.decode();
        let o = output(&resp, "OUTPUT0");
        assert_eq!(o.shape, vec![1, 10]);
        assert_eq!(fp32s(o), Classifier::logits(&features).to_vec());

        // identity_bytes [-1,-1]: BYTES is allowed only with shape [1] (the extension's rule,
        // and Triton's "the model must have input shape [1]"); a variable dimension is not.
        env.infer("identity_bytes", &raw_body(b"hello"))
            .await
            .assert_error(400, "raw binary request for input 'INPUT0': BYTES needs the model shape [1] (or [-1,1] with a batch dimension), not [-1,-1]");

        // simple has two inputs: a raw body cannot say which is which.
        let r = env.infer("simple", &raw_body(&[0u8; 64])).await;
        r.assert_error(
            400,
            "a raw binary request (Inference-Header-Content-Length: 0) needs a model with exactly one input; model 'simple' has 2",
        );

        // A body that is not a whole row of the classifier.
        let r = env.infer("classifier", &raw_body(&[0u8; 10])).await;
        r.assert_error(
            400,
            "raw binary request for input 'INPUT0': a body of 10 bytes does not match shape [-1,8] of FP32, which needs 32 bytes",
        );
        // Not a whole number of FP32 elements.
        let r = env.infer("identity_fp32", &raw_body(&[0u8; 6])).await;
        r.assert_error(
            400,
            "raw binary request for input 'INPUT0': a body of 6 bytes is not a whole number of FP32 elements of shape [-1,-1]",
        );
        env.shutdown().await;
    }
}

fn accumulate_request(value: i32, parameters: Value) -> Value {
    json!({
        "parameters": parameters,
        "inputs": [{ "name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [value] }],
    })
}

async fn accumulate(env: &Env, value: i32, parameters: Value) -> Reply {
    env.infer_json("accumulate", &accumulate_request(value, parameters))
        .await
}

fn sum_of(env: &Env, r: &Reply) -> i32 {
    check_common(env, r, "accumulate");
    let resp = r.decode();
    let o = output(&resp, "OUTPUT0");
    assert_eq!(o.shape, vec![1]);
    int32s(o)[0]
}

#[tokio::test]
async fn accumulate_sums_over_a_sequence() {
    for topology in Topology::ALL {
        let env = start(topology).await;
        for id in [json!(42), json!("session-a")] {
            let described = match &id {
                Value::String(s) => format!("'{s}'"),
                other => other.to_string(),
            };
            let r = accumulate(
                &env,
                3,
                json!({ "sequence_id": id, "sequence_start": true }),
            )
            .await;
            assert_eq!(sum_of(&env, &r), 3);
            let r = accumulate(&env, 4, json!({ "sequence_id": id })).await;
            assert_eq!(sum_of(&env, &r), 7);
            // tritonclient sends both flags explicitly.
            let r = accumulate(
                &env,
                -10,
                json!({ "sequence_id": id, "sequence_start": false, "sequence_end": false }),
            )
            .await;
            assert_eq!(sum_of(&env, &r), -3);
            let r = accumulate(&env, 5, json!({ "sequence_id": id, "sequence_end": true })).await;
            assert_eq!(sum_of(&env, &r), 2);
            // The sequence has ended: a non-start request is refused.
            let r = accumulate(&env, 1, json!({ "sequence_id": id })).await;
            r.assert_error(
                400,
                &format!("inference request for sequence {described} to model 'accumulate' must specify the START flag on the first request of the sequence"),
            );
        }
        // Two interleaved sequences keep separate sums, and a START restarts a sequence.
        let r = accumulate(
            &env,
            10,
            json!({ "sequence_id": 7, "sequence_start": true }),
        )
        .await;
        assert_eq!(sum_of(&env, &r), 10);
        let r = accumulate(&env, 1, json!({ "sequence_id": 8, "sequence_start": true })).await;
        assert_eq!(sum_of(&env, &r), 1);
        let r = accumulate(&env, 10, json!({ "sequence_id": 7 })).await;
        assert_eq!(sum_of(&env, &r), 20);
        let r = accumulate(
            &env,
            100,
            json!({ "sequence_id": 7, "sequence_start": true }),
        )
        .await;
        assert_eq!(sum_of(&env, &r), 100);
        let r = accumulate(&env, 1, json!({ "sequence_id": 8, "sequence_end": true })).await;
        assert_eq!(sum_of(&env, &r), 2);
        // Wrapping like int32.
        let r = accumulate(
            &env,
            i32::MAX,
            json!({ "sequence_id": 9, "sequence_start": true }),
        )
        .await;
        assert_eq!(sum_of(&env, &r), i32::MAX);
        let r = accumulate(&env, 1, json!({ "sequence_id": 9, "sequence_end": true })).await;
        assert_eq!(sum_of(&env, &r), i32::MIN);

        // No sequence id (absent, 0 or ""): Triton's message.
        let missing = "inference request to model 'accumulate' must specify a non-zero or non-empty correlation ID";
        for params in [
            json!({}),
            json!({ "sequence_id": 0 }),
            json!({ "sequence_id": "" }),
        ] {
            let r = accumulate(&env, 1, params).await;
            r.assert_error(400, missing);
        }
        // A non-start request for a sequence never seen.
        let r = accumulate(&env, 1, json!({ "sequence_id": 123456 })).await;
        r.assert_error(
            400,
            "inference request for sequence 123456 to model 'accumulate' must specify the START flag on the first request of the sequence",
        );
        env.shutdown().await;
    }
}

#[tokio::test]
async fn classifier_logits() {
    let mut rng = fastrand::Rng::with_seed(8);
    for topology in Topology::ALL {
        let env = start(topology).await;
        // Quarters, so every logit is exact.
        let rows: Vec<Vec<f32>> = (0..3)
            .map(|_| (0..8).map(|_| rng.i32(-40..40) as f32 / 4.0).collect())
            .collect();
        let flat: Vec<f32> = rows.concat();
        let expected: Vec<f32> = rows.iter().flat_map(|r| Classifier::logits(r)).collect();
        // JSON, nested rows.
        let r = env
            .infer_json(
                "classifier",
                &json!({ "inputs": [{
                    "name": "INPUT0", "datatype": "FP32", "shape": [3, 8], "data": rows,
                }]}),
            )
            .await;
        check_common(&env, &r, "classifier");
        r.assert_json_response();
        let resp = r.decode();
        let o = output(&resp, "OUTPUT0");
        assert_eq!(o.shape, vec![3, 10]);
        assert_eq!(fp32s(o), expected);
        // Binary.
        let data: Vec<u8> = flat.iter().flat_map(|v| v.to_le_bytes()).collect();
        let header = json!({
            "inputs": [{ "name": "INPUT0", "datatype": "FP32", "shape": [3, 8],
                         "parameters": { "binary_data_size": data.len() } }],
            "outputs": [{ "name": "OUTPUT0", "parameters": { "binary_data": true } }],
        });
        let r = env
            .infer("classifier", &binary_body(&header, &[&data]))
            .await;
        check_common(&env, &r, "classifier");
        r.assert_binary_response();
        assert_eq!(fp32s(output(&r.decode(), "OUTPUT0")), expected);
        env.shutdown().await;
    }
}

#[tokio::test]
async fn only_the_requested_outputs_come_back() {
    for topology in Topology::ALL {
        let env = start(topology).await;
        let a: Vec<i32> = (0..16).map(|i| i * 7).collect();
        let b: Vec<i32> = (0..16).map(|i| 3 - i).collect();
        let diff: Vec<i32> = a.iter().zip(&b).map(|(x, y)| x - y).collect();
        for binary in [false, true] {
            let mut req = simple_request(&a, &b);
            req["outputs"] =
                json!([{ "name": "OUTPUT1", "parameters": { "binary_data": binary } }]);
            let r = env.infer_json("simple", &req).await;
            check_common(&env, &r, "simple");
            if binary {
                r.assert_binary_response();
                assert_eq!(r.body.len(), r.header_length().unwrap() + 64);
            } else {
                r.assert_json_response();
            }
            let h = r.json_header();
            assert_eq!(h["outputs"].as_array().unwrap().len(), 1, "{h}");
            let resp = r.decode();
            assert_eq!(resp.outputs.len(), 1);
            assert_eq!(resp.outputs[0].name, "OUTPUT1");
            assert_eq!(int32s(&resp.outputs[0]), diff);
        }
        env.shutdown().await;
    }
}

#[tokio::test]
async fn request_id_is_echoed_only_when_sent() {
    for topology in Topology::ALL {
        let env = start(topology).await;
        let a: Vec<i32> = vec![1; 16];
        let mut req = simple_request(&a, &a);
        req["id"] = json!("req-\"42\"");
        let r = env.infer_json("simple", &req).await;
        check_common(&env, &r, "simple");
        assert_eq!(r.json()["id"], "req-\"42\"");
        // Also in a binary response.
        req["parameters"] = json!({ "binary_data_output": true });
        let r = env.infer_json("simple", &req).await;
        check_common(&env, &r, "simple");
        r.assert_binary_response();
        assert_eq!(r.json_header()["id"], "req-\"42\"");
        assert_eq!(r.decode().id.as_deref(), Some("req-\"42\""));
        // Absent when not sent, and when empty.
        let r = env.infer_json("simple", &simple_request(&a, &a)).await;
        check_common(&env, &r, "simple");
        assert!(r.json().get("id").is_none(), "{}", r.json());
        let mut req = simple_request(&a, &a);
        req["id"] = json!("");
        let r = env.infer_json("simple", &req).await;
        check_common(&env, &r, "simple");
        assert!(r.json().get("id").is_none(), "{}", r.json());
        env.shutdown().await;
    }
}

#[tokio::test]
async fn versioned_infer_path_works() {
    for topology in Topology::ALL {
        let env = start(topology).await;
        let a: Vec<i32> = (0..16).collect();
        let r = env
            .post(
                "/v2/models/simple/versions/1/infer",
                &json_body(&simple_request(&a, &a)),
            )
            .await;
        check_common(&env, &r, "simple");
        assert_eq!(
            int32s(output(&r.decode(), "OUTPUT0")),
            a.iter().map(|v| v * 2).collect::<Vec<_>>()
        );
        env.shutdown().await;
    }
}

#[tokio::test]
async fn many_requests_on_concurrent_connections() {
    for topology in Topology::ALL {
        let env = start(topology).await;
        let mut tasks = Vec::new();
        for i in 0..16i32 {
            let client = env.client.clone();
            let url = env.url("/v2/models/simple/infer");
            tasks.push(tokio::spawn(async move {
                let a: Vec<i32> = (0..16).map(|j| i * 100 + j).collect();
                let b: Vec<i32> = vec![i; 16];
                let resp = client
                    .post(url)
                    .json(&simple_request(&a, &b))
                    .send()
                    .await
                    .expect("answered");
                let r = Reply::read(resp).await;
                let out = int32s(output(&r.decode(), "OUTPUT1"));
                assert_eq!(out, a.iter().map(|x| x - i).collect::<Vec<_>>());
            }));
        }
        for t in tasks {
            t.await.expect("the task does not panic");
        }
        env.shutdown().await;
    }
}

/// The worker lists the classification extension, so the gateway passes `classification` on
/// to it, unless the config names labels for that output: then the gateway classifies, with
/// them. `backend` mode passes it on regardless.
#[tokio::test]
async fn configured_labels_make_the_gateway_classify_for_a_classifying_backend() {
    let dir = std::env::temp_dir().join(format!("tg-labels-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("labels.txt");
    std::fs::write(&path, "zero\none\ntwo\n").unwrap();
    let body = json_body(&json!({
        "inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [0.5, 2.0, 1.0]}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}]
    }));
    let classes = |r: &Reply| r.json()["outputs"][0]["data"].clone();
    let with_labels = |c: &mut tensorgate::config::Config| {
        c.models
            .entry("identity_fp32".into())
            .or_default()
            .labels
            .insert("OUTPUT0".into(), path.clone());
    };

    let env = start(Topology::Worker).await;
    let r = env.infer("identity_fp32", &body).await;
    assert_eq!(classes(&r), json!(["2.000000:1", "1.000000:2"]));
    env.shutdown().await;

    let env = start_with(Topology::Worker, with_labels).await;
    let r = env.infer("identity_fp32", &body).await;
    assert_eq!(classes(&r), json!(["2.000000:1:one", "1.000000:2:two"]));
    env.shutdown().await;

    let env = start_with(Topology::Worker, |c| {
        with_labels(c);
        for b in &mut c.backends {
            b.classification = tensorgate::config::ClassificationMode::Backend;
        }
    })
    .await;
    let r = env.infer("identity_fp32", &body).await;
    assert_eq!(classes(&r), json!(["2.000000:1", "1.000000:2"]));
    env.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
