//! A worker SIGKILLed under stateless load, over REST and gRPC at once: no request fails.
//! Those in flight on it are retried once on the other worker (their connection closed
//! before any answer), new ones find it refused and go elsewhere, and passive health ejects
//! it. A worker restarted under a live sequence loses it with a 503, not a 400.

use crate::common_fleet;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common_fleet::*;
use tensorgate::grpc::service::grpc_inference_service_client::GrpcInferenceServiceClient;
use tensorgate::protocol::grpc::pb;

/// Requests each load task sends at most, and how long the load lasts at most.
const MAX_PER_TASK: usize = 5_000;
const LOAD_FOR: Duration = Duration::from_millis(2_500);

fn grpc_simple(x: i32) -> pb::ModelInferRequest {
    let raw: bytes::Bytes = std::iter::repeat_n(x, 16)
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let input = |name: &str| pb::model_infer_request::InferInputTensor {
        name: name.into(),
        datatype: "INT32".into(),
        shape: vec![1, 16],
        ..Default::default()
    };
    pb::ModelInferRequest {
        model_name: "simple".into(),
        inputs: vec![input("INPUT0"), input("INPUT1")],
        raw_input_contents: vec![raw.clone(), raw],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_killed_under_stateless_load_fails_no_request() {
    let mut workers = Worker::start_many(2, &["simple"]).await;
    let text = gateway_toml(
        &[
            (workers[0].name.as_str(), workers[0].url.as_str()),
            (workers[1].name.as_str(), workers[1].url.as_str()),
        ],
        "refresh_interval_ms = 200",
    )
    .replace("grpc_listen = \"\"", "grpc_listen = \"127.0.0.1:0\"");
    let gw = start_gateway(parse_config(&text)).await;
    assert!(
        eventually(50, Duration::from_millis(100), || {
            let gw = &gw;
            async move {
                gw.gateway
                    .fleet
                    .catalog()
                    .get("simple")
                    .map(|e| e.ready.len())
                    == Some(2)
            }
        })
        .await,
        "both workers serve simple"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..4 {
        let (stop, served, b) = (stop.clone(), served.clone(), base(&gw));
        tasks.push(tokio::spawn(async move {
            let client = http_client();
            let mut failures = Vec::new();
            for i in 0..MAX_PER_TASK {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let x = (t * MAX_PER_TASK + i) as i32 % 1000;
                let r = infer_simple(&client, &b, x).await;
                if r.status == 200 {
                    served.fetch_add(1, Ordering::Relaxed);
                } else {
                    failures.push(format!("REST {}: {:?}", r.status, r.error()));
                }
            }
            failures
        }));
    }
    let grpc_addr = format!("http://{}", gw.grpc_addr.unwrap());
    for _ in 0..2 {
        let (stop, served, addr) = (stop.clone(), served.clone(), grpc_addr.clone());
        tasks.push(tokio::spawn(async move {
            let channel = tonic::transport::Channel::from_shared(addr)
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut c = GrpcInferenceServiceClient::new(channel);
            let mut failures = Vec::new();
            for i in 0..MAX_PER_TASK {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                match c.model_infer(grpc_simple(i as i32 % 1000)).await {
                    Ok(_) => {
                        served.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => failures.push(format!("gRPC {e:?}")),
                }
            }
            failures
        }));
    }
    tokio::time::sleep(LOAD_FOR / 5).await;
    let before = served.load(Ordering::Relaxed);
    workers[0].process.kill();
    tokio::time::sleep(LOAD_FOR * 4 / 5).await;
    stop.store(true, Ordering::Relaxed);
    let mut failures = Vec::new();
    for t in tasks {
        failures.extend(t.await.unwrap());
    }
    let after = served.load(Ordering::Relaxed);
    assert!(
        failures.is_empty(),
        "{} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(
        before > 0 && after > before,
        "load ran on both sides of the kill: {before} then {after}"
    );
    gw.shutdown().await;
}

/// A worker restarted faster than any health check can see it gone: its first answer to a
/// live sequence says it does not know it. The state is lost by the backend, not refused by
/// the client's fault: 503 as for a backend found gone (a 400 would tell the client to fix
/// its request, and count against it), and the pin goes, so a new start runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_restarted_under_a_live_sequence_loses_it_with_a_503() {
    let mut worker = Worker::start("w0", "127.0.0.1", 0, &["accumulate"]).await;
    let port = worker.port;
    let gw = tensorgate::run::start(
        gateway_config(&[&worker], "refresh_interval_ms = 60000"),
        true,
    )
    .await
    .expect("the gateway starts");
    let (client, b) = (http_client(), base(&gw));
    let r = accumulate(&client, &b, 7, true, false, 3).await;
    assert_eq!(r.status, 200, "{r:?}");

    worker.process.kill();
    let worker = Worker::start("w0", "127.0.0.1", port, &["accumulate"]).await;
    let r = accumulate(&client, &b, 7, false, false, 4).await;
    assert_eq!(
        (r.status, r.error()),
        (
            503,
            Some(
                format!(
                    "the backend of sequence 7 of model 'accumulate' ({}) no longer knows the sequence (it restarted, or the sequence was idle past its timeout); the sequence's state is lost",
                    worker.url
                )
                .as_str()
            )
        )
    );
    assert!(gw
        .gateway
        .router
        .pins
        .get("accumulate", &tensorgate::protocol::SequenceId::Uint(7))
        .is_none());
    // Counted as the backend's failure, not the client's (whose series is there, at 0).
    let m = scrape(&gw).await;
    let failures = |reason: &str| {
        let series = format!(
            "nv_inference_request_failure{{model=\"accumulate\",reason=\"{reason}\",version=\"1\"}}"
        );
        m.lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .map(|v| v.trim().to_string())
    };
    assert_eq!(
        (
            failures("BACKEND").as_deref(),
            failures("REJECTED").as_deref()
        ),
        (Some("1"), Some("0"))
    );
    // The client starts it again.
    let r = accumulate(&client, &b, 7, true, false, 5).await;
    assert_eq!((r.status, r.output_int("OUTPUT0")), (200, Some(5)));
    // A request of an id no replica pinned, an end included, is the client's: a 400.
    for end in [false, true] {
        let r = accumulate(&client, &b, 99, false, end, 1).await;
        assert_eq!(
            (r.status, r.error()),
            (400, Some("inference request for sequence 99 to model 'accumulate' must specify the START flag on the first request of the sequence")),
            "end {end}"
        );
    }
    gw.shutdown().await;
}
