//! The gRPC front with a tonic client: every RPC, raw and typed tensors, the status codes
//! and messages (the same text as REST), auth, deadlines, streams, sequences that change
//! transport, per-request balancing over one channel, and health.

use crate::common_fleet;
use crate::common_grpc;

use prost::Message as _;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use common_fleet::*;
use common_grpc::*;
use http_body_util::BodyExt;
use serde_json::json;
use tensorgate::config::Config;
use tensorgate::grpc::service::grpc_inference_service_client::GrpcInferenceServiceClient;
use tensorgate::protocol::grpc::pb;
use tensorgate::protocol::grpc::pb::infer_parameter::ParameterChoice;
use tensorgate::run::Running;
use tonic::transport::Channel;
use tonic::{Code, Request};

/// A gateway config (in-process built-in models unless `backends` are given) with REST and
/// gRPC on loopback.
fn config(backends: &[(&str, &str)], extra: &str) -> Config {
    let mut text = gateway_toml(backends, "refresh_interval_ms = 200")
        .replace("grpc_listen = \"\"", "grpc_listen = \"127.0.0.1:0\"");
    if backends.is_empty() {
        text.push_str("[[backends]]\nname = \"builtin\"\nurl = \"builtin\"\n\n");
    }
    text.push_str(extra);
    parse_config(&text)
}

async fn start(config: Config) -> (Running, Client) {
    let gw = tensorgate::run::start(config, true)
        .await
        .expect("the gateway starts");
    let client = connect(gw.grpc_addr.expect("the gRPC listener is on")).await;
    (gw, client)
}

/// `n` workers serving `models`, and a gateway in front of them once every model is ready on
/// all of them.
async fn start_in_front_of_workers(n: usize, models: &[&str]) -> (Vec<Worker>, Running, Client) {
    let workers = Worker::start_many(n, models).await;
    let backends: Vec<(&str, &str)> = workers
        .iter()
        .map(|w| (w.name.as_str(), w.url.as_str()))
        .collect();
    let (gw, c) = start(config(&backends, "")).await;
    let ready = eventually(50, Duration::from_millis(100), || {
        let gw = &gw;
        async move {
            let catalog = gw.gateway.fleet.catalog();
            models
                .iter()
                .all(|m| catalog.get(m).map(|e| e.ready.len()) == Some(n))
        }
    })
    .await;
    assert!(ready, "{models:?} not ready on {n} workers");
    (workers, gw, c)
}

/// `simple` with raw contents: INPUT0 = a, INPUT1 = b.
fn simple(a: &[i32], b: &[i32]) -> pb::ModelInferRequest {
    pb::ModelInferRequest {
        model_name: "simple".into(),
        inputs: vec![
            input("INPUT0", "INT32", &[1, a.len() as i64]),
            input("INPUT1", "INT32", &[1, b.len() as i64]),
        ],
        raw_input_contents: vec![le_i32(a), le_i32(b)],
        ..Default::default()
    }
}

#[track_caller]
fn assert_status<T: std::fmt::Debug>(r: Result<T, tonic::Status>, code: Code, message: &str) {
    let e = r.expect_err("the RPC fails");
    assert_eq!((e.code(), e.message()), (code, message), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simple_infers_with_raw_and_typed_contents() {
    let (gw, mut c) = start(config(&[], "")).await;
    let a: Vec<i32> = (0..16).collect();
    let b = vec![1; 16];
    let r = c.model_infer(simple(&a, &b)).await.unwrap();
    assert_eq!(backend_of(&r), "builtin");
    let r = r.into_inner();
    assert_eq!(r.model_name, "simple");
    assert_eq!(i32s(output(&r, "OUTPUT0")), (1..17).collect::<Vec<_>>());
    assert_eq!(i32s(output(&r, "OUTPUT1")), (-1..15).collect::<Vec<_>>());
    assert_eq!(r.outputs[0].shape, [1, 16]);

    // Typed contents, with one requested output and an id: answered raw, that output only.
    let mut req = simple(&a, &b);
    req.raw_input_contents.clear();
    for (t, values) in req.inputs.iter_mut().zip([&a, &b]) {
        t.contents = Some(pb::InferTensorContents {
            int_contents: values.clone(),
            ..Default::default()
        });
    }
    req.id = "req-1".into();
    req.outputs = vec![pb::model_infer_request::InferRequestedOutputTensor {
        name: "OUTPUT1".into(),
        parameters: HashMap::new(),
    }];
    let r = c.model_infer(req).await.unwrap().into_inner();
    assert_eq!(r.id, "req-1");
    assert_eq!(r.outputs.len(), 1);
    assert_eq!(i32s(output(&r, "OUTPUT1")), (-1..15).collect::<Vec<_>>());
    // Thousands of empty repeated entries: refused before they are decoded.
    let mut fanout = simple(&[1; 16], &[1; 16]);
    fanout.outputs = vec![Default::default(); 5000];
    assert_status(
        c.model_infer(fanout).await,
        Code::ResourceExhausted,
        "'outputs' (field 6) of the message repeats more than 4096 times",
    );

    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_datatype_round_trips_raw_and_typed_where_protobuf_has_a_field() {
    let (gw, mut c) = start(config(&[], "")).await;
    let bytes_elems: Vec<Bytes> = vec![
        Bytes::from_static(b"a"),
        Bytes::new(),
        Bytes::from_static(b"\xff\x00z"),
    ];
    let cases: Vec<(&str, Bytes, Option<pb::InferTensorContents>)> = vec![
        (
            "BOOL",
            Bytes::from_static(&[1, 0, 1]),
            Some(pb::InferTensorContents {
                bool_contents: vec![true, false, true],
                ..Default::default()
            }),
        ),
        (
            "INT8",
            Bytes::from_static(&[0x80, 0xff, 0x7f]),
            Some(pb::InferTensorContents {
                int_contents: vec![-128, -1, 127],
                ..Default::default()
            }),
        ),
        (
            "INT16",
            [-32768i16, 0, 32767]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            Some(pb::InferTensorContents {
                int_contents: vec![-32768, 0, 32767],
                ..Default::default()
            }),
        ),
        (
            "INT32",
            le_i32(&[i32::MIN, 0, i32::MAX]),
            Some(pb::InferTensorContents {
                int_contents: vec![i32::MIN, 0, i32::MAX],
                ..Default::default()
            }),
        ),
        (
            "INT64",
            [i64::MIN, 0, i64::MAX]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            Some(pb::InferTensorContents {
                int64_contents: vec![i64::MIN, 0, i64::MAX],
                ..Default::default()
            }),
        ),
        (
            "UINT8",
            Bytes::from_static(&[0, 1, 255]),
            Some(pb::InferTensorContents {
                uint_contents: vec![0, 1, 255],
                ..Default::default()
            }),
        ),
        (
            "UINT16",
            [0u16, 1, 65535]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            Some(pb::InferTensorContents {
                uint_contents: vec![0, 1, 65535],
                ..Default::default()
            }),
        ),
        (
            "UINT32",
            [0u32, 1, u32::MAX]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            Some(pb::InferTensorContents {
                uint_contents: vec![0, 1, u32::MAX],
                ..Default::default()
            }),
        ),
        (
            "UINT64",
            [0u64, 1, u64::MAX]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            Some(pb::InferTensorContents {
                uint64_contents: vec![0, 1, u64::MAX],
                ..Default::default()
            }),
        ),
        (
            "FP32",
            [1.5f32, f32::NAN, -0.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            Some(pb::InferTensorContents {
                fp32_contents: vec![1.5, f32::NAN, -0.0],
                ..Default::default()
            }),
        ),
        (
            "FP64",
            [1.5f64, f64::INFINITY, -0.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            Some(pb::InferTensorContents {
                fp64_contents: vec![1.5, f64::INFINITY, -0.0],
                ..Default::default()
            }),
        ),
        (
            "FP16",
            Bytes::from_static(&[0x00, 0x3c, 0x00, 0x7e, 0x00, 0x80]),
            None,
        ),
        (
            "BF16",
            Bytes::from_static(&[0x80, 0x3f, 0xc0, 0x7f, 0x00, 0x80]),
            None,
        ),
        (
            "BYTES",
            tensorgate::protocol::tensor::frame_bytes(bytes_elems.iter().map(|b| &b[..])),
            Some(pb::InferTensorContents {
                bytes_contents: bytes_elems.clone(),
                ..Default::default()
            }),
        ),
    ];
    for (dt, raw, typed) in cases {
        let model = format!("identity_{}", dt.to_ascii_lowercase());
        let raw_req = pb::ModelInferRequest {
            model_name: model.clone(),
            inputs: vec![input("INPUT0", dt, &[1, 3])],
            raw_input_contents: vec![raw.clone()],
            ..Default::default()
        };
        let r = c.model_infer(raw_req).await.unwrap().into_inner();
        assert_eq!(r.outputs[0].datatype, dt);
        assert_eq!(r.raw_output_contents[0], raw, "{dt} raw");
        match typed {
            Some(contents) => {
                let mut t = input("INPUT0", dt, &[1, 3]);
                t.contents = Some(contents);
                let typed_req = pb::ModelInferRequest {
                    model_name: model,
                    inputs: vec![t],
                    ..Default::default()
                };
                let r = c.model_infer(typed_req).await.unwrap().into_inner();
                assert_eq!(r.raw_output_contents[0], raw, "{dt} typed");
            }
            None => {
                let mut t = input("INPUT0", dt, &[1, 3]);
                t.contents = Some(pb::InferTensorContents {
                    fp32_contents: vec![1.0, 2.0, 3.0],
                    ..Default::default()
                });
                let typed_req = pb::ModelInferRequest {
                    model_name: model,
                    inputs: vec![t],
                    ..Default::default()
                };
                assert_status(
                    c.model_infer(typed_req).await,
                    Code::InvalidArgument,
                    &format!("input 'INPUT0': {dt} data must be sent in raw_input_contents: InferTensorContents has no field for it"),
                );
            }
        }
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_errors_carry_the_rest_message_and_their_own_code() {
    let (gw, mut c) = start(config(&[], "[limits]\nmax_body_bytes = 4096\n")).await;
    // The same wrong request over REST and over gRPC: 400 and INVALID_ARGUMENT, one text.
    let rest = post_infer(
        &http_client(),
        &base(&gw),
        "simple",
        &json!({"inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 15], "data": vec![0; 15]},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 15], "data": vec![0; 15]},
        ]}),
    )
    .await;
    assert_eq!(rest.status, 400);
    let message = rest.error().unwrap().to_string();
    assert_eq!(
        message,
        "input 'INPUT0': shape [1,15] does not match the model's [-1,16] at dimension 1"
    );
    assert_status(
        c.model_infer(simple(&[0; 15], &[0; 15])).await,
        Code::InvalidArgument,
        &message,
    );
    let mut unknown = simple(&[0; 16], &[0; 16]);
    unknown.model_name = "nope".into();
    assert_status(
        c.model_infer(unknown).await,
        Code::NotFound,
        "unknown model 'nope'",
    );
    let mut nameless = simple(&[0; 16], &[0; 16]);
    nameless.model_name = String::new();
    assert_status(
        c.model_infer(nameless).await,
        Code::InvalidArgument,
        "model_name is required",
    );
    assert_status(
        c.model_metadata(pb::ModelMetadataRequest::default()).await,
        Code::InvalidArgument,
        "name is required",
    );
    assert_status(
        c.model_config(pb::ModelConfigRequest::default()).await,
        Code::InvalidArgument,
        "name is required",
    );
    let mut short = simple(&[0; 16], &[0; 16]);
    short.raw_input_contents[1] = Bytes::from_static(&[0; 60]);
    assert_status(
        c.model_infer(short).await,
        Code::InvalidArgument,
        "input 'INPUT1': raw_input_contents has 60 bytes but shape [1,16] of INT32 needs 64",
    );
    let mut mixed = simple(&[0; 16], &[0; 16]);
    mixed.inputs[0].contents = Some(pb::InferTensorContents {
        int_contents: vec![0; 16],
        ..Default::default()
    });
    assert_status(
        c.model_infer(mixed).await,
        Code::InvalidArgument,
        "input 'INPUT0': has both typed contents and raw_input_contents",
    );
    let not_bool = pb::ModelInferRequest {
        model_name: "identity_bool".into(),
        inputs: vec![input("INPUT0", "BOOL", &[1, 2])],
        raw_input_contents: vec![Bytes::from_static(&[1, 2])],
        ..Default::default()
    };
    assert_status(
        c.model_infer(not_bool).await,
        Code::InvalidArgument,
        "input 'INPUT0': BOOL element 1 is the byte 2; it must be 0 or 1",
    );
    let mut negative = simple(&[0; 16], &[0; 16]);
    negative.inputs[0].shape = vec![-1, 16];
    assert_status(
        c.model_infer(negative).await,
        Code::InvalidArgument,
        "input 'INPUT0': shape [-1,16] has a negative dimension",
    );
    let mut reserved = simple(&[0; 16], &[0; 16]);
    reserved.parameters.insert("triton_x".into(), int64(1));
    assert_status(
        c.model_infer(reserved).await,
        Code::InvalidArgument,
        "parameter 'triton_x' is reserved: names starting with 'triton_' may not be used",
    );
    // Over the body limit: RESOURCE_EXHAUSTED, as REST's 413.
    assert_status(
        c.model_infer(simple(&[0; 1000], &[0; 1000])).await,
        Code::ResourceExhausted,
        "the request message is larger than the limit of 4096 bytes (limits.max_body_bytes)",
    );
    // The connection is still good.
    assert!(c.model_infer(simple(&[1; 16], &[1; 16])).await.is_ok());
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_guard_every_rpc_but_health() {
    std::env::set_var("TG_GRPC_TEST_TOKENS", "secret");
    let (gw, mut c) = start(config(
        &[],
        "[auth]\ntokens_env = \"TG_GRPC_TEST_TOKENS\"\n",
    ))
    .await;
    let message = "missing or invalid bearer token";
    assert_status(
        c.model_infer(simple(&[0; 16], &[0; 16])).await,
        Code::Unauthenticated,
        message,
    );
    let mut wrong = Request::new(pb::ServerMetadataRequest {});
    wrong
        .metadata_mut()
        .insert("authorization", "Bearer nope".parse().unwrap());
    assert_status(
        c.server_metadata(wrong).await,
        Code::Unauthenticated,
        message,
    );
    let mut right = Request::new(simple(&[0; 16], &[0; 16]));
    right
        .metadata_mut()
        .insert("authorization", "Bearer secret".parse().unwrap());
    assert!(c.model_infer(right).await.is_ok());
    // Health stays open.
    assert!(
        c.server_live(pb::ServerLiveRequest {})
            .await
            .unwrap()
            .into_inner()
            .live
    );
    assert!(
        c.server_ready(pb::ServerReadyRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    let ready = pb::ModelReadyRequest {
        name: "simple".into(),
        version: String::new(),
    };
    assert!(c.model_ready(ready).await.unwrap().into_inner().ready);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_config_statistics_and_index() {
    let (gw, mut c) = start(config(&[], "")).await;
    let m = c
        .server_metadata(pb::ServerMetadataRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(m.name, "tensorgate");
    for e in [
        "binary_tensor_data",
        "classification",
        "sequence",
        "statistics",
    ] {
        assert!(m.extensions.iter().any(|x| x == e), "{m:?}");
    }
    let meta = c
        .model_metadata(pb::ModelMetadataRequest {
            name: "simple".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (meta.versions.as_slice(), meta.platform.as_str()),
        (&["1".to_string()][..], "tensorgate_builtin")
    );
    assert_eq!(meta.inputs[0].shape, [-1, 16]);
    assert_status(
        c.model_metadata(pb::ModelMetadataRequest {
            name: "simple".into(),
            version: "9".into(),
        })
        .await,
        Code::NotFound,
        "model 'simple' has no version '9' (its versions are 1)",
    );
    let config = c
        .model_config(pb::ModelConfigRequest {
            name: "simple".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .config
        .unwrap();
    assert_eq!(config.max_batch_size, i32::MAX);
    assert_eq!(config.input[0].dims, [16]);
    assert_eq!(config.input[0].data_type, pb::DataType::TypeInt32 as i32);
    let accumulate = c
        .model_config(pb::ModelConfigRequest {
            name: "accumulate".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .config
        .unwrap();
    assert_eq!(
        (
            accumulate.max_batch_size,
            accumulate.input[0].dims.as_slice()
        ),
        (0, &[1i64][..])
    );

    // A gRPC inference counts in the statistics extension, as a REST one does.
    c.model_infer(simple(&[0; 16], &[0; 16])).await.unwrap();
    let stats = c
        .model_statistics(pb::ModelStatisticsRequest {
            name: "simple".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let s = &stats.model_stats[0];
    assert_eq!((s.name.as_str(), s.inference_count), ("simple", 1));
    assert_eq!(
        s.inference_stats
            .as_ref()
            .unwrap()
            .success
            .as_ref()
            .unwrap()
            .count,
        1
    );
    let index = c
        .repository_index(pb::RepositoryIndexRequest {
            repository_name: String::new(),
            ready: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(index
        .models
        .iter()
        .any(|m| m.name == "simple" && m.state == "READY"));
    // What a gateway does not do says so.
    let e = c
        .system_shared_memory_status(pb::SystemSharedMemoryStatusRequest {
            name: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
    assert!(
        e.message()
            .starts_with("system shared memory is not supported by tensorgate"),
        "{e:?}"
    );
    // The same series as REST, labelled by protocol.
    let metrics = http_client()
        .get(format!("http://{}/metrics", gw.metrics_addr.unwrap()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for series in [
        r#"tensorgate_grpc_requests_total{code="OK",method="/inference.GRPCInferenceService/ModelInfer"} 1"#,
        r#"nv_inference_request_success{model="simple",version="1"} 1"#,
        r#"tensorgate_request_duration_seconds_count{backend="builtin",model="simple",protocol="grpc"} 1"#,
    ] {
        assert!(metrics.contains(series), "{series} not in\n{metrics}");
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_continues_across_transports_on_its_backend() {
    let (_workers, gw, mut c) = start_in_front_of_workers(3, &["accumulate", "simple"]).await;
    let client = http_client();
    for id in 1..=12u64 {
        // Started over REST, continued over gRPC (int64 id), then REST again.
        let r = accumulate(&client, &base(&gw), id, true, false, 5).await;
        assert_eq!(r.status, 200, "{r:?}");
        let (sum, backend) = accumulate_grpc(&mut c, int64(id as i64), 3, false)
            .await
            .unwrap();
        assert_eq!(
            (sum, backend.as_str()),
            (8, r.backend.as_deref().unwrap()),
            "sequence {id}"
        );
        let r2 = accumulate(&client, &base(&gw), id, false, true, 2).await;
        assert_eq!(
            (r2.output_int("OUTPUT0"), r2.backend),
            (Some(10), r.backend),
            "sequence {id}"
        );
    }
    // A string id: started over gRPC, continued over REST.
    let string_id = |s: &str| pb::InferParameter {
        parameter_choice: Some(ParameterChoice::StringParam(s.into())),
    };
    let (sum, backend) = accumulate_grpc(&mut c, string_id("seq-a"), 4, true)
        .await
        .unwrap();
    assert_eq!(sum, 4);
    let body = json!({
        "parameters": {"sequence_id": "seq-a", "sequence_start": false},
        "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [6]}],
    });
    let r = post_infer(&client, &base(&gw), "accumulate", &body).await;
    assert_eq!(
        (r.output_int("OUTPUT0"), r.backend.as_deref()),
        (Some(10), Some(backend.as_str()))
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stateless_requests_on_one_channel_are_balanced() {
    let (_workers, gw, mut c) = start_in_front_of_workers(3, &["simple"]).await;
    let mut seen = HashSet::new();
    for i in 0..60 {
        let r = c.model_infer(simple(&[i; 16], &[1; 16])).await.unwrap();
        assert_eq!(i32s(output(r.get_ref(), "OUTPUT0"))[0], i + 1);
        seen.insert(backend_of(&r));
    }
    assert_eq!(
        seen,
        HashSet::from(["w0".to_string(), "w1".into(), "w2".into()])
    );
    gw.shutdown().await;
}

/// An input's `binary_data_size` parameter means nothing over gRPC (Triton ignores it), and
/// a REST backend gets the input with the encoder's own framing only: kept, it reached a
/// worker twice, which refused the duplicate key, and the client got INVALID_ARGUMENT for
/// JSON it never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inputs_binary_data_size_does_not_reach_a_rest_backend() {
    let (_workers, gw, mut c) = start_in_front_of_workers(1, &["simple"]).await;
    let mut req = simple(&[3; 16], &[1; 16]);
    for input in &mut req.inputs {
        input.parameters.insert(
            "binary_data_size".into(),
            pb::InferParameter {
                parameter_choice: Some(pb::infer_parameter::ParameterChoice::Int64Param(64)),
            },
        );
    }
    let r = c.model_infer(req).await.unwrap();
    assert_eq!(backend_of(&r), "w0");
    assert_eq!(i32s(output(r.get_ref(), "OUTPUT0")), [4; 16]);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_answers_in_order_and_an_error_ends_only_its_message() {
    let (gw, mut c) = start(config(&[], "")).await;
    let mut messages = Vec::new();
    for v in 1..=10 {
        let mut req = pb::ModelInferRequest {
            model_name: "accumulate".into(),
            inputs: vec![input("INPUT0", "INT32", &[1])],
            raw_input_contents: vec![le_i32(&[v])],
            ..Default::default()
        };
        req.parameters.insert("sequence_id".into(), int64(900));
        req.parameters
            .insert("sequence_start".into(), boolean(v == 1));
        messages.push(req);
        if v % 3 == 0 {
            let mut bad = simple(&[0; 16], &[0; 16]);
            bad.model_name = "nope".into();
            bad.id = format!("bad-{v}");
            messages.push(bad);
        }
        messages.push(simple(&[v; 16], &[v; 16]));
    }
    let count = messages.len();
    let got = stream_all(&mut c, messages).await;
    assert_eq!(got.len(), count);
    let mut sum = 0;
    let mut i = 0;
    for v in 1..=10 {
        sum += v;
        let r = got[i].infer_response.as_ref().expect("accumulate answers");
        assert_eq!(i32s(output(r, "OUTPUT0")), [sum], "accumulate step {v}");
        i += 1;
        if v % 3 == 0 {
            assert_eq!(got[i].error_message, "unknown model 'nope'");
            // The failed request's id alone, as Triton answers, so that the client can tell
            // which request failed.
            let failed = got[i]
                .infer_response
                .as_ref()
                .expect("the failed request's id");
            assert_eq!(
                (failed.id.as_str(), failed.outputs.len()),
                (format!("bad-{v}").as_str(), 0)
            );
            i += 1;
        }
        let r = got[i].infer_response.as_ref().expect("simple answers");
        assert_eq!(i32s(output(r, "OUTPUT0"))[0], 2 * v);
        i += 1;
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_timeout_is_a_deadline() {
    let slow = ScriptedBackend::start(OnInfer::Delay(Duration::from_secs(2))).await;
    let (gw, _) = start(config(&[("slow", slow.url.as_str())], "")).await;
    wait_for_m(&gw).await;
    // A plain HTTP/2 client, so that only the server acts on the deadline (tonic's channel
    // would also cancel the call itself when it passes).
    let http2 = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<tonic::body::Body>();
    let origin: http::Uri = format!("http://{}", gw.grpc_addr.unwrap()).parse().unwrap();
    let mut c = GrpcInferenceServiceClient::with_origin(http2, origin);
    let mut req = Request::new(m_request());
    req.set_timeout(Duration::from_millis(200));
    // The backend would answer after 2 s; the status says the 200 ms deadline ended it.
    assert_status(
        c.model_infer(req).await,
        Code::DeadlineExceeded,
        "the request to model 'm' timed out on backend 'slow' (the gRPC deadline)",
    );
    assert_eq!(slow.infers(), 1);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_follows_readiness() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let (gw, _) = start(config(&[], "")).await;
    let channel = channel(gw.grpc_addr.unwrap()).await;
    let mut health = HealthClient::new(channel);
    let check = |service: &str| HealthCheckRequest {
        service: service.into(),
    };
    for service in ["", "inference.GRPCInferenceService"] {
        let r = health.check(check(service)).await.unwrap().into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32, "{service:?}");
    }
    assert_status(
        health.check(check("other")).await,
        Code::NotFound,
        "unknown service 'other'; tensorgate reports '' and 'inference.GRPCInferenceService'",
    );
    let http2 = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<http_body_util::Full<Bytes>>();
    // Health calls take no token, so their messages are small: 100 KiB of an unknown field.
    let mut big = vec![0u8];
    let mut unknown = vec![0x7a_u8]; // field 15, length-delimited
    unknown.extend_from_slice(&[0x80, 0x80, 0x06]); // 102400
    unknown.extend(std::iter::repeat_n(0u8, 102_400));
    big.extend_from_slice(&(unknown.len() as u32).to_be_bytes());
    big.extend_from_slice(&unknown);
    let req = http::Request::post(format!(
        "http://{}/inference.GRPCInferenceService/ServerLive",
        gw.grpc_addr.unwrap()
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(http_body_util::Full::new(Bytes::from(big)))
    .unwrap();
    let response = http2.request(req).await.unwrap();
    let (parts, body) = response.into_parts();
    let trailers = body.collect().await.unwrap().trailers().cloned();
    let status = tonic::Status::from_header_map(&parts.headers)
        .or_else(|| trailers.as_ref().and_then(tonic::Status::from_header_map))
        .expect("a status");
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::ResourceExhausted,
            "a health check's request is limited to 64 KiB"
        )
    );

    gw.gateway.start_draining();
    let r = health.check(check("")).await.unwrap().into_inner();
    assert_eq!(r.status, ServingStatus::NotServing as i32);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_messages_are_the_clients_error_unary_and_on_a_stream() {
    use futures_util::StreamExt;
    let (gw, mut c) = start(config(&[], "[limits]\nmax_body_bytes = 4096\n")).await;
    // Not protobuf: one gRPC frame of garbage, sent by a plain HTTP/2 client.
    let http2 = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<http_body_util::Full<Bytes>>();
    let garbage = [0xff_u8; 7];
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(garbage.len() as u32).to_be_bytes());
    frame.extend_from_slice(&garbage);
    let send_to = |method: &str, body: Vec<u8>| {
        let req = http::Request::post(format!(
            "http://{}/inference.GRPCInferenceService/{method}",
            gw.grpc_addr.unwrap()
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(http_body_util::Full::new(Bytes::from(body)))
        .unwrap();
        let http2 = http2.clone();
        async move {
            let response = http2.request(req).await.unwrap();
            tonic::Status::from_header_map(response.headers()).expect("a trailers-only answer")
        }
    };
    let send = |body: Vec<u8>| send_to("ModelInfer", body);
    let status = send(frame.clone()).await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status
            .message()
            .starts_with("the request message is not valid: failed to decode Protobuf message"),
        "{status:?}"
    );
    // A unary call with two messages: the second is not silently dropped.
    let one = simple(&[1; 16], &[1; 16]).encode_to_vec();
    let mut two = Vec::new();
    for _ in 0..2 {
        two.push(0u8);
        two.extend_from_slice(&(one.len() as u32).to_be_bytes());
        two.extend_from_slice(&one);
    }
    let status = send(two).await;
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::InvalidArgument,
            "the request message is not valid: a unary call carries one message, and this one has more"
        )
    );
    // Framing that tonic reads for the other RPCs: a body cut off inside its message, and
    // a compressed message without a `grpc-encoding`, are the client's errors too.
    let mut cut = vec![0u8];
    cut.extend_from_slice(&10u32.to_be_bytes());
    cut.extend_from_slice(b"abc");
    let mut flagged = vec![1u8];
    flagged.extend_from_slice(&0u32.to_be_bytes());
    for (method, body, why) in [
        ("ServerMetadata", cut.clone(), "Unexpected EOF decoding stream."),
        ("ModelMetadata", cut, "Unexpected EOF decoding stream."),
        (
            "ServerMetadata",
            flagged,
            "protocol error: received message with compressed-flag but no grpc-encoding was specified",
        ),
    ] {
        let status = send_to(method, body).await;
        assert_eq!(
            (status.code(), status.message()),
            (
                Code::InvalidArgument,
                format!("the request message is not valid: {why}").as_str()
            ),
            "{method}"
        );
    }
    // Refusals of what could not be read are counted like any other answer.
    let metrics = scrape(&gw).await;
    assert!(
        metrics.contains(r#"tensorgate_grpc_requests_total{code="INVALID_ARGUMENT",method="/inference.GRPCInferenceService/ModelInfer"} 2"#),
        "{metrics}"
    );

    // On a stream: the messages before the oversized one are answered, then the stream ends
    // with RESOURCE_EXHAUSTED.
    let messages = vec![
        simple(&[1; 16], &[1; 16]),
        simple(&[0; 1000], &[0; 1000]),
        simple(&[2; 16], &[2; 16]),
    ];
    let answers: Vec<Result<pb::ModelStreamInferResponse, tonic::Status>> = tokio::time::timeout(
        Duration::from_secs(20),
        c.model_stream_infer(futures_util::stream::iter(messages))
            .await
            .unwrap()
            .into_inner()
            .collect(),
    )
    .await
    .expect("the stream ends");
    assert_eq!(answers.len(), 2, "{answers:?}");
    let first = answers[0]
        .as_ref()
        .unwrap()
        .infer_response
        .as_ref()
        .unwrap();
    assert_eq!(i32s(output(first, "OUTPUT0"))[0], 2);
    let e = answers[1].as_ref().unwrap_err();
    assert_eq!(
        (e.code(), e.message()),
        (
            Code::ResourceExhausted,
            "the request message is larger than the limit of 4096 bytes (limits.max_body_bytes)"
        )
    );
    gw.shutdown().await;
}

/// SIGTERM's path: readiness turns NOT_SERVING first (during `shutdown_delay_ms` new calls
/// are still taken), then GOAWAY; the RPC and the stream in flight finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_lets_in_flight_rpcs_and_streams_finish() {
    use futures_util::StreamExt;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    // Margins for a loaded machine: the RPCs are in flight well before the shutdown, and
    // the new connection has two seconds of shutdown_delay_ms to be taken in.
    let slow = ScriptedBackend::start(OnInfer::Delay(Duration::from_millis(3000))).await;
    let extra = "[limits]\nshutdown_delay_ms = 2000\n";
    let (gw, c) = start(config(&[("slow", slow.url.as_str())], extra)).await;
    wait_for_m(&gw).await;
    let grpc_addr = gw.grpc_addr.unwrap();
    let m = || m_request();
    let unary = tokio::spawn({
        let mut c = c.clone();
        let req = m();
        async move { c.model_infer(req).await }
    });
    let stream = tokio::spawn({
        let mut c = c.clone();
        let req = m();
        async move {
            let answers = c
                .model_stream_infer(futures_util::stream::iter(vec![req]))
                .await?
                .into_inner();
            Ok::<_, tonic::Status>(answers.collect::<Vec<_>>().await)
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let shutdown = tokio::spawn(gw.shutdown());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let channel = Channel::from_shared(format!("http://{grpc_addr}"))
        .unwrap()
        .connect()
        .await
        .expect("new connections are taken during shutdown_delay_ms");
    let status = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(status, ServingStatus::NotServing as i32);
    let r = unary.await.unwrap().expect("the RPC in flight finishes");
    assert_eq!(r.get_ref().outputs.len(), 1);
    let answers = stream
        .await
        .unwrap()
        .expect("the stream in flight finishes");
    assert_eq!(answers.len(), 1);
    assert!(
        answers[0].as_ref().unwrap().infer_response.is_some(),
        "{answers:?}"
    );
    tokio::time::timeout(Duration::from_secs(10), shutdown)
        .await
        .expect("the shutdown completes")
        .unwrap();
    assert_eq!(slow.infers(), 2);
}

/// Dropping a stream drops what it has in flight: the backend call ends with it, long before
/// the backend would have answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_stream_cancels_its_requests_in_flight() {
    let slow = ScriptedBackend::start(OnInfer::Delay(Duration::from_secs(5))).await;
    let (gw, mut c) = start(config(&[("slow", slow.url.as_str())], "")).await;
    wait_for_m(&gw).await;
    let m = m_request();
    // The request side stays open, as a client's live stream does.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(m.clone()).await.unwrap();
    tx.send(m).await.unwrap();
    let answers = c
        .model_stream_infer(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let backend = gw.gateway.fleet.backends()[0].clone();
    let in_flight = || {
        backend
            .outstanding
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    assert!(
        eventually(50, Duration::from_millis(20), || std::future::ready(
            in_flight() == 2
        ))
        .await,
        "both requests reach the backend"
    );
    drop(answers);
    drop(tx);
    // The backend holds each call for longer than this wait: only the stream's end can
    // have ended them.
    assert!(
        eventually(100, Duration::from_millis(20), || std::future::ready(
            in_flight() == 0
        ))
        .await,
        "the calls in flight end with the stream"
    );
    // Each is counted, as a call the client cancelled, and against its model.
    let metrics = &gw.gateway.metrics;
    let cancelled = metrics
        .grpc_requests
        .with_label_values(&[
            "/inference.GRPCInferenceService/ModelStreamInfer",
            "CANCELLED",
        ])
        .get();
    assert_eq!(cancelled, 2);
    let canceled = metrics
        .nv_failure
        .with_label_values(&["m", "", "CANCELED"])
        .get();
    assert_eq!(canceled, 2);
    gw.shutdown().await;
}

/// A backend that refuses the connection never ran the request: UNAVAILABLE, which gRPC
/// clients may retry (REST answers 502).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_refuses_the_connection_is_unavailable() {
    let mut worker = Worker::start("w0", "127.0.0.1", 0, &["simple"]).await;
    // Discovery will not notice the worker is gone before the request does.
    // No pooled connection either: a reused one would be reset, not refused.
    let fleet = "refresh_interval_ms = 600000\npool_idle_timeout_ms = 0";
    let text = gateway_toml(&[("w0", worker.url.as_str())], fleet)
        .replace("grpc_listen = \"\"", "grpc_listen = \"127.0.0.1:0\"");
    let (gw, mut c) = start(parse_config(&text)).await;
    assert!(c.model_infer(simple(&[1; 16], &[1; 16])).await.is_ok());
    worker.process.kill();
    let e = c
        .model_infer(simple(&[1; 16], &[1; 16]))
        .await
        .expect_err("the only backend is gone");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(
        e.message()
            .starts_with(&format!("backend 'w0': cannot connect to {}", worker.url)),
        "{e:?}"
    );
    let rest = post_infer(&http_client(), &base(&gw), "simple", &simple_body(1, None)).await;
    assert_eq!(rest.status, 502, "{rest:?}");
    gw.shutdown().await;
}

/// A health Watch says NOT_SERVING when a drain starts, then ends, so that it does not hold
/// the shutdown for the whole drain timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_health_watch_ends_once_a_drain_has_said_not_serving() {
    use futures_util::StreamExt;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let (gw, _) = start(config(&[], "")).await;
    let channel = channel(gw.grpc_addr.unwrap()).await;
    let mut watch = HealthClient::new(channel)
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = watch.next().await.unwrap().unwrap();
    assert_eq!(first.status, ServingStatus::Serving as i32);
    gw.gateway.start_draining();
    let rest: Vec<i32> = tokio::time::timeout(
        Duration::from_secs(5),
        watch.map(|r| r.unwrap().status).collect(),
    )
    .await
    .expect("the watch ends");
    assert_eq!(rest, [ServingStatus::NotServing as i32]);
    gw.shutdown().await;
}

/// A unary call whose message stops arriving holds a concurrency permit only until
/// `limits.body_read_timeout_ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unary_message_that_stops_arriving_is_cut_off() {
    let (gw, _) = start(config(&[], "[limits]\nbody_read_timeout_ms = 300\n")).await;
    let status = stalled_call(&gw, None).await;
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::DeadlineExceeded,
            "the request message did not arrive within 300 ms (limits.body_read_timeout_ms)"
        )
    );
    // The call's own deadline, when shorter, cuts the wait as well.
    let status = stalled_call(&gw, Some("100m")).await;
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::DeadlineExceeded,
            "the call's deadline (grpc-timeout, 100 ms) passed before its request message arrived"
        )
    );
    gw.shutdown().await;
}

/// grpc-timeout counts from the call's arrival, not from when its message has been read: a
/// message that takes 400 ms to arrive leaves 200 ms of a 600 ms deadline, less than the
/// backend's 500 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_timeout_counts_from_the_arrival_of_the_call() {
    let slow = ScriptedBackend::start(OnInfer::Delay(Duration::from_millis(500))).await;
    let (gw, _) = start(config(&[("slow", slow.url.as_str())], "")).await;
    wait_for_m(&gw).await;
    let message = m_request().encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    let (tx, rx) =
        tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, std::convert::Infallible>>(1);
    let late = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let _ = tx
            .send(Ok(http_body::Frame::data(Bytes::from(framed))))
            .await;
    });
    let status = raw_model_infer(&gw, "600m", rx).await;
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::DeadlineExceeded,
            "the request to model 'm' timed out on backend 'slow' (the gRPC deadline)"
        )
    );
    late.await.unwrap();
    gw.shutdown().await;
}

/// Waits (bounded) until the scripted backends' model `m` is in the gateway's catalog.
async fn wait_for_m(gw: &Running) {
    assert!(
        eventually(50, Duration::from_millis(100), || async move {
            gw.gateway.fleet.catalog().get("m").is_some()
        })
        .await
    );
}

/// A ModelInfer of the scripted backends' model `m`.
fn m_request() -> pb::ModelInferRequest {
    pb::ModelInferRequest {
        model_name: "m".into(),
        inputs: vec![input("INPUT0", "FP32", &[2])],
        raw_input_contents: vec![[1.0f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect()],
        ..Default::default()
    }
}

type RawFrames =
    tokio::sync::mpsc::Receiver<Result<http_body::Frame<Bytes>, std::convert::Infallible>>;

/// A ModelInfer over a plain HTTP/2 client (so that only the server acts on `grpc_timeout`),
/// its body the frames `rx` yields; its status, from the headers or the trailers.
async fn raw_model_infer(gw: &Running, grpc_timeout: &str, rx: RawFrames) -> tonic::Status {
    raw_call(gw, "ModelInfer", &[("grpc-timeout", grpc_timeout)], rx)
        .await
        .0
}

/// `rpc` of the inference service the same way; its status and how many bytes of messages
/// came before it.
async fn raw_call(
    gw: &Running,
    rpc: &str,
    headers: &[(&str, &str)],
    rx: RawFrames,
) -> (tonic::Status, usize) {
    let body = http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    let http2 = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let req = http::Request::post(format!(
        "http://{}/inference.GRPCInferenceService/{rpc}",
        gw.grpc_addr.unwrap()
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers");
    let req = headers
        .iter()
        .fold(req, |req, (name, value)| req.header(*name, *value))
        .body(body)
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), http2.request(req))
        .await
        .expect("an answer before the client gives up")
        .unwrap();
    let (parts, body) = response.into_parts();
    let collected = tokio::time::timeout(Duration::from_secs(10), body.collect())
        .await
        .expect("the call ends before the client gives up")
        .unwrap();
    let trailers = collected.trailers().cloned();
    let status = tonic::Status::from_header_map(&parts.headers)
        .or_else(|| trailers.as_ref().and_then(tonic::Status::from_header_map))
        .expect("a status");
    (status, collected.to_bytes().len())
}

/// A ModelInfer whose body announces 100 bytes and sends none of them; its status.
async fn stalled_call(gw: &Running, grpc_timeout: Option<&str>) -> tonic::Status {
    let (tx, rx) =
        tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, std::convert::Infallible>>(1);
    // A frame header that announces 100 bytes, and then nothing.
    tx.send(Ok(http_body::Frame::data(Bytes::from_static(&[
        0, 0, 0, 0, 100,
    ]))))
    .await
    .unwrap();
    let status = raw_model_infer(gw, grpc_timeout.unwrap_or("60S"), rx).await;
    drop(tx);
    status
}

/// A request whose client goes away before the answer is still counted and logged: over
/// REST as 499 and against its model as CANCELED (not as a timeout: no deadline passed),
/// over gRPC as CANCELLED. Before, the transport dropped it with no trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_whose_client_went_away_are_counted() {
    let slow = ScriptedBackend::start(OnInfer::Delay(Duration::from_secs(2))).await;
    let (gw, _) = start(config(&[("slow", slow.url.as_str())], "")).await;
    wait_for_m(&gw).await;
    let metrics = &gw.gateway.metrics;

    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let body = json!({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}]});
    let gave_up = impatient
        .post(format!("http://{}/v2/models/m/infer", gw.addr))
        .json(&body)
        .send()
        .await;
    assert!(gave_up.is_err(), "the client gives up first");

    let mut c = GrpcInferenceServiceClient::new(channel(gw.grpc_addr.unwrap()).await);
    let cancelled = tokio::time::timeout(Duration::from_millis(200), c.model_infer(m_request()));
    assert!(cancelled.await.is_err(), "the client gives up first");

    let counted = || {
        metrics.requests.with_label_values(&["499"]).get() == 1
            && metrics
                .grpc_requests
                .with_label_values(&["/inference.GRPCInferenceService/ModelInfer", "CANCELLED"])
                .get()
                == 1
            // Each against its model: the gRPC call had named it before it was cancelled.
            && metrics
                .nv_failure
                .with_label_values(&["m", "", "CANCELED"])
                .get()
                == 2
    };
    assert!(
        eventually(50, Duration::from_millis(100), || async { counted() }).await,
        "the abandoned requests are counted: {:?}",
        metrics
            .nv_failure
            .with_label_values(&["m", "", "CANCELED"])
            .get()
    );
    assert_eq!(metrics.timeouts.with_label_values(&["m"]).get(), 0);
    // What each had learned before it was cut off is kept: the bytes it read, and the
    // backend it was waiting for (the access line's backend, and the latency series').
    let rest_bytes = serde_json::to_vec(&body).unwrap().len() as u64;
    let grpc_bytes = m_request().encoded_len() as u64;
    assert_eq!(
        metrics.bytes_received.with_label_values(&["m"]).get(),
        rest_bytes + grpc_bytes
    );
    for protocol in ["rest", "grpc"] {
        let waited_for = metrics.duration.with_label_values(&["m", "slow", protocol]);
        assert_eq!(waited_for.get_sample_count(), 1, "{protocol}");
    }
    gw.shutdown().await;
}

/// At shutdown an open stream whose client sends nothing does not hold the drain to its
/// deadline: what it sent is answered, then it ends with UNAVAILABLE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_ends_when_the_gateway_shuts_down() {
    use futures_util::StreamExt;
    let (gw, mut c) = start(config(&[], "[limits]\ndrain_timeout_ms = 60000\n")).await;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(simple(&[1; 16], &[2; 16])).await.unwrap();
    let mut answers = c
        .model_stream_infer(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let first = answers.next().await.unwrap().unwrap();
    assert_eq!(first.error_message, "");
    // The client keeps its side open and sends nothing more.
    let shutdown = tokio::spawn(gw.shutdown());
    let end = tokio::time::timeout(Duration::from_secs(20), answers.next())
        .await
        .expect("the stream ends long before the drain deadline")
        .expect("a status");
    let status = end.expect_err("UNAVAILABLE");
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::Unavailable,
            "tensorgate is shutting down: this stream takes no more messages; every message answered on it was run, and any sent after the last answer was not: send those on a new stream"
        )
    );
    tokio::time::timeout(Duration::from_secs(20), shutdown)
        .await
        .expect("the drain ends with the stream")
        .unwrap();
    drop(tx);
}

/// A stream that sends nothing and awaits nothing for `limits.stream_idle_timeout_ms` ends
/// with UNAVAILABLE after its answers; one that keeps sending stays open past the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_ends_after_the_idle_limit() {
    use futures_util::StreamExt;
    let (gw, mut c) = start(config(&[], "[limits]\nstream_idle_timeout_ms = 400\n")).await;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut answers = c
        .model_stream_infer(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    // Busy for three times the limit: a message every 100 ms, each answered.
    let started = std::time::Instant::now();
    for n in 0..12 {
        tx.send(simple(&[n; 16], &[1; 16])).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(10), answers.next())
            .await
            .expect("an answer")
            .expect("a message")
            .expect("not the end");
        assert_eq!(answer.error_message, "", "message {n}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(started.elapsed() >= Duration::from_millis(1_200));
    // Then silent, with its side still open.
    let end = tokio::time::timeout(Duration::from_secs(10), answers.next())
        .await
        .expect("the idle stream ends")
        .expect("a status");
    let status = end.expect_err("UNAVAILABLE");
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::Unavailable,
            "the stream sent no message and awaited no answer for 400 ms (limits.stream_idle_timeout_ms); every message answered on it was run: send further requests on a new stream"
        )
    );
    drop(tx);
    // The connection serves a new stream.
    let again = c
        .model_stream_infer(futures_util::stream::iter([simple(&[1; 16], &[2; 16])]))
        .await
        .unwrap()
        .into_inner()
        .next()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.error_message, "");
    gw.shutdown().await;
}

/// An error message that echoes a 20,000-character name is cut short: whole, it would
/// overflow the client's 16 KiB limit on trailers, and the client would see
/// RESOURCE_EXHAUSTED instead of the real error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_error_messages_are_cut_short() {
    let (gw, mut c) = start(config(&[], "")).await;
    let mut long = simple(&[0; 16], &[0; 16]);
    long.model_name = "n".repeat(20_000);
    let head = format!("unknown model '{}", "n".repeat(4096 - 15));
    assert_status(
        c.model_infer(long).await,
        Code::NotFound,
        &format!("{head}... (15920 more bytes of this message left out)"),
    );
    gw.shutdown().await;
}

/// The gRPC port answers gRPC only: a plain HTTP request (a probe pointed at the wrong port)
/// gets 505 over HTTP/1 and 415 over HTTP/2 without the gRPC content-type, never a 200 that
/// a checker would take for health.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_on_the_grpc_port_is_refused() {
    let (gw, _) = start(config(&[], "")).await;
    let url = format!("http://{}/v2/health/ready", gw.grpc_addr.unwrap());
    let r = reqwest::get(&url).await.unwrap();
    assert_eq!(r.status(), 505);
    assert_eq!(
        r.text().await.unwrap(),
        "this is tensorgate's gRPC port, and gRPC needs HTTP/2; the v2 REST API is on the REST port (server.listen)\n"
    );
    let http2 = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<http_body_util::Full<Bytes>>();
    for content_type in [None, Some("application/json")] {
        let mut req = http::Request::post(&url);
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let r = http2
            .request(
                req.body(http_body_util::Full::new(Bytes::from("{}")))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(r.status(), 415, "{content_type:?}");
        let text = r.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            text,
            "this is tensorgate's gRPC port: requests need content-type application/grpc; the v2 REST API is on the REST port (server.listen)\n"
        );
    }
    gw.shutdown().await;
}

/// A stream message whose typed contents hold more elements than its shape is that
/// message's error alone: the stream goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contents_beyond_the_shape_fail_one_stream_message() {
    let (gw, mut c) = start(config(&[], "")).await;
    let mut excess = simple(&[0; 16], &[0; 16]);
    excess.raw_input_contents.clear();
    for t in excess.inputs.iter_mut() {
        t.contents = Some(pb::InferTensorContents {
            int_contents: vec![1; 32],
            ..Default::default()
        });
    }
    let messages = vec![excess, simple(&[2; 16], &[3; 16])];
    let got = stream_all(&mut c, messages).await;
    assert_eq!(got.len(), 2);
    assert_eq!(
        got[0].error_message,
        "input 'INPUT0': shape [1,16] needs 16 elements, int_contents has 32"
    );
    assert_eq!(got[1].error_message, "");
    gw.shutdown().await;
}

/// Sends `messages` on one ModelStreamInfer stream and collects every answer (bounded).
/// `triton_enable_empty_final_response`, the one `triton_` parameter Triton takes (the real
/// client's `enable_empty_final_response`): each stream answer then carries
/// `triton_final_response`, true, since each is its request's last; a non-bool is refused;
/// a unary call takes it and carries nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_marks_final_answers_when_asked() {
    let (gw, mut c) = start(config(&[], "")).await;
    let with = |v: pb::InferParameter| {
        let mut m = simple(&[1; 16], &[2; 16]);
        m.parameters
            .insert("triton_enable_empty_final_response".into(), v);
        m
    };
    let messages = vec![
        with(boolean(true)),
        simple(&[1; 16], &[2; 16]),
        with(int64(1)),
        with(boolean(false)),
    ];
    let got = stream_all(&mut c, messages).await;
    let flag = |r: &pb::ModelStreamInferResponse| {
        r.infer_response
            .as_ref()
            .and_then(|r| r.parameters.get("triton_final_response").cloned())
    };
    assert_eq!(got.len(), 4);
    assert_eq!(
        (got[0].error_message.as_str(), flag(&got[0])),
        ("", Some(boolean(true)))
    );
    assert_eq!((got[1].error_message.as_str(), flag(&got[1])), ("", None));
    assert_eq!(
        got[2].error_message,
        "parameter 'triton_enable_empty_final_response' must be a bool, not an integer"
    );
    assert_eq!((got[3].error_message.as_str(), flag(&got[3])), ("", None));
    let unary = c
        .model_infer(with(boolean(true)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(i32s(output(&unary, "OUTPUT0"))[0], 3);
    assert!(!unary.parameters.contains_key("triton_final_response"));
    gw.shutdown().await;
}

async fn stream_all(
    c: &mut GrpcInferenceServiceClient<tonic::transport::Channel>,
    messages: Vec<pb::ModelInferRequest>,
) -> Vec<pb::ModelStreamInferResponse> {
    use futures_util::StreamExt;
    let responses = c
        .model_stream_infer(futures_util::stream::iter(messages))
        .await
        .unwrap()
        .into_inner();
    tokio::time::timeout(
        Duration::from_secs(20),
        responses.map(|r| r.unwrap()).collect(),
    )
    .await
    .expect("the stream ends")
}

/// A unary call still waiting for its backend near the drain deadline is answered
/// UNAVAILABLE with the shutdown's message, not cut off without a status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_the_drain_deadline_cuts_is_unavailable() {
    let slow = ScriptedBackend::start(OnInfer::Delay(Duration::from_secs(10))).await;
    let (gw, mut c) = start(config(
        &[("slow", slow.url.as_str())],
        "[limits]\nshutdown_delay_ms = 0\ndrain_timeout_ms = 800\n",
    ))
    .await;
    wait_for_m(&gw).await;
    let call = tokio::spawn(async move { c.model_infer(m_request()).await });
    for _ in 0..100 {
        if slow.infers() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(slow.infers(), 1);
    gw.shutdown().await;
    assert_status(
        call.await.unwrap(),
        Code::Unavailable,
        "the gateway shut down before the answer (limits.drain_timeout_ms passed)",
    );
}

/// A shape past the rank limit is refused before its message is decoded, and empty
/// `bytes_contents` entries (2 bytes each on the wire, 32 once decoded) count decoded
/// against the budget for bodies before prost allocates them: INVALID_ARGUMENT and
/// RESOURCE_EXHAUSTED for a unary call; on a stream, each such message (and one with too
/// many entries of a field) is answered with its error and the stream goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shapes_and_contents_count_as_they_will_be_decoded() {
    let (gw, mut c) = start(config(
        &[],
        "[limits]\nmax_body_bytes = 1048576\nmax_buffered_body_bytes = 1048576\n",
    ))
    .await;
    let mut wide = simple(&[0; 16], &[0; 16]);
    wide.inputs[0].shape = vec![1; 100_000];
    wide.id = "wide".into();
    let too_wide = "input 'INPUT0': shape has 100000 dimensions; the limit is 64";
    assert_status(
        c.model_infer(wide.clone()).await,
        Code::InvalidArgument,
        too_wide,
    );

    // 40000 empty strings: 80 KB on the wire, past the 1 MiB budget once decoded.
    let n = 40_000;
    let strings = pb::ModelInferRequest {
        model_name: "simple".into(),
        id: "strings".into(),
        inputs: vec![pb::model_infer_request::InferInputTensor {
            name: "INPUT0".into(),
            datatype: "BYTES".into(),
            shape: vec![1, n],
            contents: Some(pb::InferTensorContents {
                bytes_contents: vec![Default::default(); n as usize],
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    let status = c.model_infer(strings.clone()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let decodes_to = |message: &str| -> usize {
        let tail = ", more than the 1048576 bytes all request bodies may hold at once (limits.max_buffered_body_bytes)";
        message
            .strip_prefix("the request message decodes to ")
            .and_then(|m| m.strip_suffix(tail))
            .and_then(|m| m.strip_suffix(" bytes"))
            .and_then(|m| m.parse().ok())
            .unwrap_or_else(|| panic!("{message}"))
    };
    assert!(decodes_to(status.message()) > 32 * n as usize);

    let mut outputs = simple(&[0; 16], &[0; 16]);
    outputs.id = "outputs".into();
    outputs.outputs = vec![Default::default(); 5000];
    let messages = vec![
        wide,
        simple(&[1; 16], &[2; 16]),
        strings,
        simple(&[3; 16], &[4; 16]),
        outputs,
        simple(&[5; 16], &[6; 16]),
    ];
    let got = stream_all(&mut c, messages).await;
    assert_eq!(got.len(), 6, "{got:?}");
    assert_eq!(
        got[4].error_message,
        "'outputs' (field 6) of the message repeats more than 4096 times"
    );
    assert_eq!(got[4].infer_response.as_ref().unwrap().id, "outputs");
    assert_eq!(got[5].error_message, "");
    assert_eq!(got[0].error_message, too_wide);
    assert_eq!(got[0].infer_response.as_ref().unwrap().id, "wide");
    assert_eq!(got[1].error_message, "");
    assert!(decodes_to(&got[2].error_message) > 32 * n as usize);
    assert_eq!(got[2].infer_response.as_ref().unwrap().id, "strings");
    assert_eq!(got[3].error_message, "");
    assert_eq!(gw.gateway.metrics.buffered_body_bytes.get(), 0);
    gw.shutdown().await;
}

/// A stream's message that stops arriving ends the stream after
/// `limits.body_read_timeout_ms`, not the stream's idle limit (300 s): what was whole before
/// it is answered first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_message_that_stops_arriving_is_cut_off() {
    let (gw, _) = start(config(&[], "[limits]\nbody_read_timeout_ms = 300\n")).await;
    let message = simple(&[1; 16], &[2; 16]).encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    // One whole message, then the first half of the next, then nothing.
    framed.extend_from_slice(&framed.clone()[..framed.len() / 2]);
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(Ok(http_body::Frame::data(Bytes::from(framed))))
        .await
        .unwrap();
    let (status, answered) = raw_call(&gw, "ModelStreamInfer", &[], rx).await;
    drop(tx);
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::DeadlineExceeded,
            "a stream's request message did not arrive whole within 300 ms of its first bytes (limits.body_read_timeout_ms)"
        )
    );
    assert!(
        answered > 100,
        "the whole message was answered first: {answered} bytes"
    );
    assert_eq!(gw.gateway.metrics.buffered_body_bytes.get(), 0);
    gw.shutdown().await;
}

/// A stream's compressed messages are inflated by the gateway, counted and bounded: gzip
/// and deflate are answered; one that inflates past `limits.max_body_bytes` ends the stream
/// with RESOURCE_EXHAUSTED, bytes after a message's gzip data with INVALID_ARGUMENT, and
/// nothing stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streams_compressed_messages_are_inflated_within_bounds() {
    use tonic::codec::CompressionEncoding;
    let (gw, c) = start(config(&[], "[limits]\nmax_body_bytes = 1048576\n")).await;
    for encoding in [CompressionEncoding::Gzip, CompressionEncoding::Deflate] {
        let mut c = c.clone().send_compressed(encoding);
        let got = stream_all(
            &mut c,
            vec![simple(&[1; 16], &[2; 16]), simple(&[3; 16], &[4; 16])],
        )
        .await;
        assert_eq!(got.len(), 2, "{encoding:?}");
        assert!(got.iter().all(|a| a.error_message.is_empty()), "{got:?}");
    }

    let gzip_frame = |message: &[u8]| {
        let compressed = crate::common::gzip(message);
        let mut framed = vec![1u8];
        framed.extend_from_slice(&(compressed.len() as u32).to_be_bytes());
        framed.extend_from_slice(&compressed);
        framed
    };
    let running = &gw;
    let call = |frames: Vec<u8>| async move {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(Ok(http_body::Frame::data(Bytes::from(frames))))
            .await
            .unwrap();
        drop(tx);
        raw_call(
            running,
            "ModelStreamInfer",
            &[("grpc-encoding", "gzip")],
            rx,
        )
        .await
    };
    // A bomb: 2 MiB of zeros in a few KiB, then a good message that is never read.
    let mut bomb = simple(&[0; 16], &[0; 16]);
    bomb.raw_input_contents[0] = vec![0u8; 2 << 20].into();
    let mut frames = gzip_frame(&bomb.encode_to_vec());
    frames.extend(gzip_frame(&simple(&[1; 16], &[2; 16]).encode_to_vec()));
    let (status, _) = call(frames).await;
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::ResourceExhausted,
            "the request message, decompressed, is larger than the limit of 1048576 bytes (limits.max_body_bytes)"
        )
    );
    // A good message, then one with bytes after its gzip data: the first is answered.
    let mut frames = gzip_frame(&simple(&[1; 16], &[2; 16]).encode_to_vec());
    let mut junk = crate::common::gzip(&simple(&[1; 16], &[2; 16]).encode_to_vec());
    junk.extend_from_slice(b"junk");
    frames.push(1);
    frames.extend_from_slice(&(junk.len() as u32).to_be_bytes());
    frames.extend_from_slice(&junk);
    let (status, answered) = call(frames).await;
    assert_eq!(
        (status.code(), status.message()),
        (
            Code::InvalidArgument,
            "the request message is not valid: Error decompressing: 4 bytes follow the end of the compressed data, while sending request"
        )
    );
    assert!(
        answered > 100,
        "the first message was answered: {answered} bytes"
    );
    assert_eq!(gw.gateway.metrics.buffered_body_bytes.get(), 0);
    gw.shutdown().await;
}
