//! After a scripted set of requests, each metric has moved by exactly the expected amount,
//! histogram counts match, and the statistics extension agrees.

use std::collections::HashMap;

use serde_json::{json, Value};
use tensorgate::config::Config;

/// Parses the text exposition into `name{labels}` → value, labels sorted as exposed.
fn parse(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn simple_body(batch: usize) -> Value {
    let data: Vec<i32> = (0..batch as i32 * 16).collect();
    json!({"inputs": [
        {"name": "INPUT0", "shape": [batch, 16], "datatype": "INT32", "data": data},
        {"name": "INPUT1", "shape": [batch, 16], "datatype": "INT32", "data": data},
    ]})
}

/// The embedded config on loopback ports: REST, metrics (when `metrics`), no gRPC.
fn loopback_config(metrics: bool) -> Config {
    let mut config = Config::embedded_default();
    config.server.listen = "127.0.0.1:0".parse().unwrap();
    config.server.metrics_listen = metrics.then(|| "127.0.0.1:0".parse().unwrap());
    config.server.grpc_listen = None;
    config
}

/// What the gateway's metrics listener answers.
async fn metrics_text(gw: &tensorgate::run::Running) -> String {
    let addr = gw.metrics_addr.expect("the metrics listener is on");
    reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn infer_simple(client: &reqwest::Client, addr: std::net::SocketAddr) -> reqwest::Response {
    client
        .post(format!("http://{addr}/v2/models/simple/infer"))
        .json(&simple_body(1))
        .send()
        .await
        .unwrap()
}

/// Every model the gateway serves has its series at 0 before its first request, as Triton
/// exports every loaded model: an alert on `increase()` then sees the first failure, and a
/// dashboard lists a model that has served nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_models_have_their_series_at_zero_before_any_request() {
    let gw = tensorgate::run::start(loopback_config(true), true)
        .await
        .unwrap();
    let m = parse(&metrics_text(&gw).await);
    for (name, want) in [
        (
            r#"nv_inference_request_success{model="simple",version="1"}"#,
            0.0,
        ),
        (r#"nv_inference_count{model="accumulate",version="1"}"#, 0.0),
        (
            r#"nv_inference_request_duration_us{model="classifier",version="1"}"#,
            0.0,
        ),
        (r#"tensorgate_request_timeouts_total{model="simple"}"#, 0.0),
        (
            r#"nv_inference_pending_request_count{model="accumulate",version="1"}"#,
            0.0,
        ),
    ] {
        assert_eq!(m.get(name), Some(&want), "{name}");
    }
    for reason in ["REJECTED", "CANCELED", "BACKEND", "OTHER"] {
        let name = format!(
            r#"nv_inference_request_failure{{model="simple",reason="{reason}",version="1"}}"#
        );
        assert_eq!(m.get(&name), Some(&0.0), "{name}");
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_move_exactly() {
    let config = loopback_config(true);
    let gw = tensorgate::run::start(config, true).await.unwrap();
    let base = format!("http://{}", gw.addr);
    let client = reqwest::Client::new();
    let mut simple_bytes = 0u64;
    let post = |path: &str, body: Vec<u8>| {
        client
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };

    for _ in 0..3 {
        let body = serde_json::to_vec(&simple_body(2)).unwrap();
        simple_bytes += body.len() as u64;
        assert_eq!(
            post("/v2/models/simple/infer", body)
                .await
                .unwrap()
                .status(),
            200
        );
    }
    let bad = serde_json::to_vec(&json!({"inputs": []})).unwrap();
    simple_bytes += bad.len() as u64;
    assert_eq!(
        post("/v2/models/simple/infer", bad).await.unwrap().status(),
        400
    );
    let classify = json!({
        "inputs": [{"name": "INPUT0", "shape": [1, 8], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6, 7, 8]}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}]
    });
    let r = post(
        "/v2/models/classifier/infer",
        serde_json::to_vec(&classify).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let unknown = serde_json::to_vec(&simple_body(1)).unwrap();
    assert_eq!(
        post("/v2/models/nope/infer", unknown)
            .await
            .unwrap()
            .status(),
        404
    );
    let seq = json!({
        "parameters": {"sequence_id": 99, "sequence_start": true},
        "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [4]}]
    });
    assert_eq!(
        post(
            "/v2/models/accumulate/infer",
            serde_json::to_vec(&seq).unwrap()
        )
        .await
        .unwrap()
        .status(),
        200
    );

    let text = metrics_text(&gw).await;
    let m = parse(&text);
    // Pins kept in memory: no shared store whose state a gauge could report.
    assert!(!text.contains("tensorgate_pin_store_up"), "{text}");
    let get = |k: &str| *m.get(k).unwrap_or_else(|| panic!("missing {k} in\n{text}"));
    assert_eq!(
        get(r#"nv_inference_request_success{model="simple",version="1"}"#),
        3.0
    );
    assert_eq!(
        get(r#"nv_inference_request_failure{model="simple",reason="REJECTED",version="1"}"#),
        1.0
    );
    assert_eq!(
        get(r#"nv_inference_count{model="simple",version="1"}"#),
        6.0
    );
    assert_eq!(
        get(r#"nv_inference_exec_count{model="simple",version="1"}"#),
        3.0
    );
    assert_eq!(
        get(r#"nv_inference_pending_request_count{model="simple",version="1"}"#),
        0.0
    );
    assert_eq!(
        get(r#"nv_inference_request_success{model="classifier",version="1"}"#),
        1.0
    );
    // One execution per request that reached a backend; the 400 never did.
    assert_eq!(
        get(r#"nv_inference_exec_count{model="classifier",version="1"}"#),
        1.0
    );
    assert_eq!(
        get(r#"nv_inference_exec_count{model="accumulate",version="1"}"#),
        1.0
    );
    assert_eq!(
        get(
            r#"tensorgate_request_duration_seconds_count{backend="builtin",model="simple",protocol="rest"}"#
        ),
        3.0
    );
    assert_eq!(
        get(
            r#"tensorgate_request_duration_seconds_count{backend="none",model="simple",protocol="rest"}"#
        ),
        1.0
    );
    assert_eq!(
        get(
            r#"tensorgate_request_duration_seconds_bucket{backend="builtin",model="simple",protocol="rest",le="+Inf"}"#
        ),
        3.0
    );
    assert_eq!(get(r#"tensorgate_http_requests_total{code="200"}"#), 5.0);
    assert_eq!(get(r#"tensorgate_http_requests_total{code="400"}"#), 1.0);
    assert_eq!(get(r#"tensorgate_http_requests_total{code="404"}"#), 1.0);
    assert_eq!(get("tensorgate_http_requests_in_flight"), 0.0);
    assert_eq!(
        get(r#"tensorgate_gateway_classifications_total{model="classifier"}"#),
        1.0
    );
    assert_eq!(
        get(r#"tensorgate_received_bytes_total{model="simple"}"#),
        simple_bytes as f64
    );
    assert_eq!(get("tensorgate_sequence_pins"), 1.0);
    assert_eq!(get(r#"tensorgate_backend_healthy{backend="builtin"}"#), 1.0);
    // JSON inputs decoded for the in-process models: 3 × 2 × 128 bytes for simple, 32 for
    // the classifier, 4 for accumulate.
    assert_eq!(
        get(r#"tensorgate_transcoded_bytes_total{direction="json_to_binary"}"#),
        804.0
    );
    assert!(
        !text.contains("model=\"nope\""),
        "unknown models never become label values"
    );

    let stats: Value = reqwest::get(format!("{base}/v2/models/simple/stats"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let s = &stats["model_stats"][0];
    assert_eq!(s["name"], "simple");
    assert_eq!(s["version"], "1");
    assert_eq!(s["inference_count"], 6);
    assert_eq!(s["execution_count"], 3);
    assert_eq!(s["inference_stats"]["success"]["count"], 3);
    assert_eq!(s["inference_stats"]["fail"]["count"], 1);
    for phase in ["queue", "compute_input", "compute_infer", "compute_output"] {
        assert_eq!(s["inference_stats"][phase]["count"], 3, "{phase}");
        assert!(
            s["inference_stats"][phase]["ns"].as_u64().is_some(),
            "{phase}"
        );
    }
    assert!(s["last_inference"].as_u64().unwrap() > 0);
    // Triton's phase series are fed from these same nanoseconds, so they agree to the
    // microsecond; the phases (successful requests only) are disjoint parts of the
    // request durations, which count failures too.
    let us = |name: &str| get(&format!("{name}{{model=\"simple\",version=\"1\"}}"));
    let ns = |phase: &str| s["inference_stats"][phase]["ns"].as_u64().unwrap();
    let mut phases = 0.0;
    for (series, phase) in [
        ("nv_inference_queue_duration_us", "queue"),
        ("nv_inference_compute_input_duration_us", "compute_input"),
        ("nv_inference_compute_infer_duration_us", "compute_infer"),
        ("nv_inference_compute_output_duration_us", "compute_output"),
    ] {
        let v = us(series);
        assert!(v > 0.0, "{series}");
        assert_eq!(v, (ns(phase) / 1000) as f64, "{series}");
        phases += v;
    }
    let duration = us("nv_inference_request_duration_us");
    assert_eq!(duration, (ns("success") / 1000 + ns("fail") / 1000) as f64);
    assert!(
        phases <= (ns("success") / 1000) as f64 && phases <= duration,
        "{phases} of {duration}"
    );
    let all: Value = reqwest::get(format!("{base}/v2/models/stats"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(all["model_stats"].as_array().unwrap().len() >= 17);
    let r = reqwest::get(format!("{base}/v2/models/nope/stats"))
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_context_and_request_id() {
    let config = loopback_config(false);
    let gw = tensorgate::run::start(config, false).await.unwrap();
    let r = reqwest::Client::new()
        .post(format!("http://{}/v2/models/simple/infer", gw.addr))
        .header("x-request-id", "req-123")
        .json(&simple_body(1))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-request-id"], "req-123");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_gauges_follow_the_fleet_through_a_reload() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut config = loopback_config(true);
    config
        .set_backends(&["builtin".into(), format!("http://{closed}")])
        .unwrap();
    let gw = tensorgate::run::start(config.clone(), true).await.unwrap();
    let scrape = || async { parse(&metrics_text(&gw).await) };
    let before = scrape().await;
    assert_eq!(
        before.get("tensorgate_backend_healthy{backend=\"builtin\"}"),
        Some(&1.0)
    );
    assert_eq!(
        before.get("tensorgate_backend_healthy{backend=\"backend-1\"}"),
        Some(&0.0)
    );

    config.set_backends(&["builtin".into()]).unwrap();
    gw.gateway.reload(config).await.unwrap();
    let after = scrape().await;
    assert_eq!(
        after.get("tensorgate_backend_healthy{backend=\"builtin\"}"),
        Some(&1.0)
    );
    let stale: Vec<&String> = after
        .keys()
        .filter(|k| k.contains("backend=\"backend-1\""))
        .collect();
    assert!(stale.is_empty(), "{stale:?}");
    gw.shutdown().await;
}

/// The fleet's counters: a backend that dies after discovery refuses one request, which is
/// retried on the other (a JSON-only one, so tensors are transcoded both ways) and ejects
/// it; a request past its deadline counts as a timeout; a reload counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_ejections_timeouts_transcoding_and_reloads_count_exactly() {
    let worker =
        || tensorgate::run::start(Config::worker("127.0.0.1:0".parse().unwrap(), &[]), false);
    let (dying, living) = (worker().await.unwrap(), worker().await.unwrap());
    let mut config = loopback_config(true);
    config
        .set_backends(&[
            format!("http://{}", dying.addr),
            format!("http://{}", living.addr),
        ])
        .unwrap();
    config.backends[1].encoding = tensorgate::config::Encoding::Json;
    config.fleet.refresh_interval_ms = 600_000;
    config.fleet.eject_after_failures = 1;
    config.fleet.eject_base_ms = 600_000;
    let gw = tensorgate::run::start(config.clone(), true).await.unwrap();
    dying.shutdown().await;
    let client = reqwest::Client::new();
    let metrics_url = format!("http://{}/metrics", gw.metrics_addr.unwrap());
    let scrape = || async {
        parse(
            &reqwest::get(&metrics_url)
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
        )
    };
    let value = |m: &HashMap<String, f64>, k: &str| m.get(k).copied().unwrap_or(0.0);

    let header = br#"{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","parameters":{"binary_data_size":16}}],"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]}"#;
    let mut body = header.to_vec();
    body.extend(
        [1.5f32, -2.0, 3.25, 0.0]
            .iter()
            .flat_map(|v| v.to_le_bytes()),
    );
    let (mut sent, mut received, mut served) = (0u64, 0u64, 0u64);
    let started = std::time::Instant::now();
    // Balancing picks either backend; keep sending until the dead one has been tried.
    for _ in 0..200 {
        let r = client
            .post(format!("http://{}/v2/models/identity_fp32/infer", gw.addr))
            .header("inference-header-content-length", header.len().to_string())
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-tensorgate-backend"], "backend-1");
        sent += body.len() as u64;
        received += r.bytes().await.unwrap().len() as u64;
        served += 1;
        if value(
            &scrape().await,
            "tensorgate_backend_ejections_total{backend=\"backend-0\"}",
        ) > 0.0
        {
            break;
        }
    }
    let timeout = serde_json::to_vec(&json!({
        "parameters": {"timeout": 1},
        "inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]
    }))
    .unwrap();
    let r = client
        .post(format!("http://{}/v2/models/identity_fp32/infer", gw.addr))
        .body(timeout.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 504);
    sent += timeout.len() as u64;
    received += r.bytes().await.unwrap().len() as u64;
    let elapsed_us = started.elapsed().as_micros() as f64;
    gw.gateway.reload(config).await.unwrap();

    let m = scrape().await;
    let ejections = "tensorgate_backend_ejections_total{backend=\"backend-0\"}";
    assert_eq!(
        value(&m, ejections),
        1.0,
        "the dead backend was never tried"
    );
    assert_eq!(
        value(&m, "tensorgate_backend_ejected{backend=\"backend-0\"}"),
        1.0
    );
    assert_eq!(
        value(&m, "tensorgate_backend_ejected{backend=\"backend-1\"}"),
        0.0
    );
    assert_eq!(
        value(
            &m,
            "tensorgate_backend_retries_total{backend=\"backend-0\"}"
        ),
        1.0
    );
    assert_eq!(
        value(
            &m,
            "tensorgate_backend_retries_total{backend=\"backend-1\"}"
        ),
        0.0
    );
    assert_eq!(
        value(
            &m,
            "tensorgate_request_timeouts_total{model=\"identity_fp32\"}"
        ),
        1.0
    );
    assert_eq!(
        value(&m, "nv_inference_request_failure{model=\"identity_fp32\",reason=\"CANCELED\",version=\"1\"}"),
        1.0
    );
    assert_eq!(
        value(
            &m,
            "nv_inference_request_success{model=\"identity_fp32\",version=\"1\"}"
        ),
        served as f64
    );
    // FP32 [1,4]: 16 bytes in each direction per request served.
    assert_eq!(
        value(
            &m,
            "tensorgate_transcoded_bytes_total{direction=\"binary_to_json\"}"
        ),
        16.0 * served as f64
    );
    assert_eq!(
        value(
            &m,
            "tensorgate_transcoded_bytes_total{direction=\"json_to_binary\"}"
        ),
        16.0 * served as f64
    );
    assert_eq!(
        value(
            &m,
            "tensorgate_received_bytes_total{model=\"identity_fp32\"}"
        ),
        sent as f64
    );
    assert_eq!(
        value(&m, "tensorgate_sent_bytes_total{model=\"identity_fp32\"}"),
        received as f64
    );
    let duration_us = value(
        &m,
        "nv_inference_request_duration_us{model=\"identity_fp32\",version=\"1\"}",
    );
    assert!(
        duration_us > 0.0 && duration_us <= elapsed_us,
        "{duration_us} of {elapsed_us}"
    );
    // Over HTTP too, the phases of the successful requests fit in the request durations.
    let phases: f64 = ["queue", "compute_input", "compute_infer", "compute_output"]
        .iter()
        .map(|p| {
            let v = value(
                &m,
                &format!("nv_inference_{p}_duration_us{{model=\"identity_fp32\",version=\"1\"}}"),
            );
            assert!(v > 0.0, "{p}");
            v
        })
        .sum();
    assert!(phases <= duration_us, "{phases} of {duration_us}");
    assert_eq!(
        value(
            &m,
            "nv_inference_exec_count{model=\"identity_fp32\",version=\"1\"}"
        ),
        // Every call that may have reached a backend counts: not the refused connection,
        // nor the timed-out request, which never left the gateway (its deadline had passed).
        served as f64
    );
    assert_eq!(
        value(&m, "tensorgate_config_reloads_total{result=\"success\"}"),
        1.0
    );
    gw.shutdown().await;
    living.shutdown().await;
}

/// Backends leave no label values behind: after a reload removes a backend that served,
/// refused (a retry) and was ejected, none of its series is exposed any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_backend_leaves_no_series() {
    let worker =
        || tensorgate::run::start(Config::worker("127.0.0.1:0".parse().unwrap(), &[]), false);
    let (kept, removed) = (worker().await.unwrap(), worker().await.unwrap());
    let kept_url = format!("http://{}", kept.addr);
    let mut config = loopback_config(true);
    config
        .set_backends(&[kept_url.clone(), format!("http://{}", removed.addr)])
        .unwrap();
    config.fleet.refresh_interval_ms = 600_000;
    config.fleet.eject_after_failures = 1;
    config.fleet.eject_base_ms = 600_000;
    let gw = tensorgate::run::start(config.clone(), true).await.unwrap();
    let client = reqwest::Client::new();
    let metrics_url = format!("http://{}/metrics", gw.metrics_addr.unwrap());
    let scrape = || async {
        reqwest::get(&metrics_url)
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let infer = || async {
        let r = infer_simple(&client, gw.addr).await;
        assert_eq!(r.status(), 200);
        r.headers()["x-tensorgate-backend"]
            .to_str()
            .unwrap()
            .to_string()
    };
    // Balancing picks either backend: send until backend-1 has served once (bounded).
    let served_by_backend_1 = || async {
        for _ in 0..200 {
            if infer().await == "backend-1" {
                return true;
            }
        }
        false
    };
    // Then, once it is down, until it has refused a request and been ejected.
    assert!(served_by_backend_1().await, "backend-1 never served");
    removed.shutdown().await;
    let ejected = r#"tensorgate_backend_ejections_total{backend="backend-1"} 1"#;
    for _ in 0..200 {
        assert_eq!(infer().await, "backend-0");
        if scrape().await.contains(ejected) {
            break;
        }
    }
    let before = scrape().await;
    for series in [
        r#"tensorgate_request_duration_seconds_count{backend="backend-1",model="simple",protocol="rest"} 1"#,
        r#"tensorgate_backend_retries_total{backend="backend-1"} 1"#,
        ejected,
        r#"tensorgate_backend_ejected{backend="backend-1"} 1"#,
    ] {
        assert!(before.contains(series), "{series} in\n{before}");
    }

    config
        .set_backends(std::slice::from_ref(&kept_url))
        .unwrap();
    gw.gateway.reload(config.clone()).await.unwrap();
    let after = scrape().await;
    assert!(
        !after.contains(r#"backend="backend-1""#),
        "series of a removed backend:\n{after}"
    );
    // The backend that stayed keeps its series.
    assert!(
        after.contains(
            r#"tensorgate_request_duration_seconds_count{backend="backend-0",model="simple",protocol="rest"}"#
        ),
        "{after}"
    );
    assert!(after.contains(r#"tensorgate_backend_healthy{backend="backend-0"} 1"#));

    // A backend of that name that joins again (a pod ready again, an address DNS gives
    // back) has its latency series again, counted from zero.
    let returned = worker().await.unwrap();
    config
        .set_backends(&[kept_url, format!("http://{}", returned.addr)])
        .unwrap();
    gw.gateway.reload(config).await.unwrap();
    assert!(served_by_backend_1().await, "backend-1 never served again");
    let again = scrape().await;
    assert!(
        again.contains(
            r#"tensorgate_request_duration_seconds_count{backend="backend-1",model="simple",protocol="rest"} 1"#
        ),
        "{again}"
    );
    gw.shutdown().await;
    kept.shutdown().await;
    returned.shutdown().await;
}

/// `GET /v2/models/{m}/versions/{v}/stats` through the gateway: Triton's shape, key for
/// key, with counts equal to the requests sent, failures included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_stats_have_tritons_shape_and_count_the_requests() {
    let config = loopback_config(false);
    let gw = tensorgate::run::start(config, false).await.unwrap();
    let base = format!("http://{}", gw.addr);
    let client = reqwest::Client::new();
    let stats_url = format!("{base}/v2/models/simple/versions/1/stats");
    let get_stats = || async {
        let r = client.get(&stats_url).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.json::<Value>().await.unwrap()
    };
    let keys = |v: &Value| -> Vec<String> {
        let mut k: Vec<String> = v
            .as_object()
            .unwrap_or_else(|| panic!("not an object: {v}"))
            .keys()
            .cloned()
            .collect();
        k.sort();
        k
    };
    let zero = get_stats().await;
    assert_eq!(
        zero["model_stats"][0]["inference_stats"]["success"]["count"],
        0
    );
    assert_eq!(zero["model_stats"][0]["last_inference"], 0);

    let ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    let started_ms = ms();
    // Batches 1, 2 and 3, by the versioned and the unversioned path; then two failures.
    for (batch, path) in [
        (1, "/v2/models/simple/versions/1/infer"),
        (2, "/v2/models/simple/infer"),
        (3, "/v2/models/simple/versions/1/infer"),
    ] {
        let r = client
            .post(format!("{base}{path}"))
            .json(&simple_body(batch))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let finished_ms = ms();
    for body in [json!({"inputs": []}), json!({"inputs": "none"})] {
        let r = client
            .post(format!("{base}/v2/models/simple/versions/1/infer"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
    }

    let stats = get_stats().await;
    assert_eq!(keys(&stats), ["model_stats"]);
    let list = stats["model_stats"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{stats}");
    let s = &list[0];
    assert_eq!(
        keys(s),
        [
            "batch_stats",
            "execution_count",
            "inference_count",
            "inference_stats",
            "last_inference",
            "name",
            "version"
        ]
    );
    assert_eq!(s["name"], "simple");
    assert_eq!(s["version"], "1");
    assert!(s["batch_stats"].is_array(), "{s}");
    assert_eq!(s["inference_count"], 6, "batches 1 + 2 + 3");
    assert_eq!(
        s["execution_count"], 3,
        "the failures never reached the model"
    );
    let last = s["last_inference"].as_u64().unwrap();
    assert!(
        (started_ms..=finished_ms).contains(&last),
        "{last} outside {started_ms}..={finished_ms}"
    );
    let phases = &s["inference_stats"];
    assert_eq!(
        keys(phases),
        [
            "compute_infer",
            "compute_input",
            "compute_output",
            "fail",
            "queue",
            "success"
        ]
    );
    let mut phase_ns = 0;
    for (name, count) in [
        ("success", 3),
        ("fail", 2),
        ("queue", 3),
        ("compute_input", 3),
        ("compute_infer", 3),
        ("compute_output", 3),
    ] {
        let p = &phases[name];
        assert_eq!(keys(p), ["count", "ns"], "{name}");
        assert_eq!(p["count"], count, "{name}");
        let ns = p["ns"].as_u64().unwrap_or_else(|| panic!("{name}: {p}"));
        assert!(ns > 0, "{name}");
        if !matches!(name, "success" | "fail") {
            phase_ns += ns;
        }
    }
    assert!(
        phase_ns <= phases["success"]["ns"].as_u64().unwrap(),
        "the phases are parts of the successful requests' durations"
    );

    // The same entry is in the model's and in the whole list; other versions are 404.
    let model: Value = client
        .get(format!("{base}/v2/models/simple/stats"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(model, stats);
    let r = client
        .get(format!("{base}/v2/models/simple/versions/2/stats"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"error": "model 'simple' has no version '2' (its versions are 1)"})
    );
    gw.shutdown().await;
}

/// The metrics listener serves GET and HEAD; another method gets 405 naming them, as the
/// REST listener's GET paths answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_listener_takes_only_get() {
    let gw = tensorgate::run::start(loopback_config(true), true)
        .await
        .unwrap();
    let url = format!("http://{}/metrics", gw.metrics_addr.unwrap());
    let client = reqwest::Client::new();
    let r = client.post(&url).send().await.unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "GET, HEAD");
    assert_eq!(
        r.json::<Value>().await.unwrap(),
        json!({"error": "method POST is not allowed on /metrics; use GET"})
    );
    assert_eq!(client.head(&url).send().await.unwrap().status(), 200);
    // HEAD over h2 (prior knowledge): no DATA, or the client resets the stream.
    use http_body_util::BodyExt;
    let h2c: hyper_util::client::legacy::Client<_, http_body_util::Empty<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .http2_only(true)
            .build_http();
    let head = http::Request::head(&url)
        .body(http_body_util::Empty::new())
        .unwrap();
    let r = h2c.request(head).await.expect("an h2 answer to HEAD");
    assert_eq!(
        (r.version(), r.status().as_u16()),
        (http::Version::HTTP_2, 200)
    );
    assert!(r.headers().contains_key("content-length"));
    let body = r.into_body().collect().await.expect("the body").to_bytes();
    assert!(body.is_empty(), "{} bytes", body.len());
    gw.shutdown().await;
}

/// `metrics_listen = ""` opens no metrics listener, and the v2 API serves as before (its
/// statistics extension included).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_metrics_listen_turns_the_listener_off() {
    let text = "[server]\nlisten = \"127.0.0.1:0\"\nmetrics_listen = \"\"\ngrpc_listen = \"\"\n\
                [[backends]]\nname = \"builtin\"\nurl = \"builtin\"\n";
    let config: Config = toml::from_str(text).unwrap();
    assert_eq!(config.server.metrics_listen, None);
    let gw = tensorgate::run::start(config, true).await.unwrap();
    assert_eq!(gw.metrics_addr, None);
    let client = reqwest::Client::new();
    assert_eq!(infer_simple(&client, gw.addr).await.status(), 200);
    let stats = client
        .get(format!("http://{}/v2/models/simple/stats", gw.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(stats.status(), 200);
    gw.shutdown().await;
}

/// A sequence request that no backend accepts (a continuation of a sequence its backend
/// does not know) leaves no pin: requests nothing accepts cannot fill the pin table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_sequence_request_leaves_no_pin() {
    let config = loopback_config(false);
    let gw = tensorgate::run::start(config, true).await.unwrap();
    let client = reqwest::Client::new();
    let url = format!("http://{}/v2/models/accumulate/infer", gw.addr);
    let body = |start: bool| {
        json!({"parameters": {"sequence_id": 77, "sequence_start": start},
               "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [1]}]})
    };
    let pins = || gw.gateway.router.pins.len();
    for _ in 0..3 {
        let r = client.post(&url).json(&body(false)).send().await.unwrap();
        assert_eq!(r.status(), 400);
        assert_eq!(pins(), 0);
    }
    let r = client.post(&url).json(&body(true)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(pins(), 1);
    // A refused request of a live sequence keeps its pin.
    let bad = json!({"parameters": {"sequence_id": 77},
                     "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]});
    let r = client.post(&url).json(&bad).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(pins(), 1);
    gw.shutdown().await;
}

/// A batch counts its inferences, an empty batch none: `nv_inference_count` and the
/// statistics' inference_count add its size, 0 for shape [0, 16], while the request itself
/// counts as a success and an execution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_batch_counts_no_inference() {
    let config = loopback_config(true);
    let gw = tensorgate::run::start(config, true).await.unwrap();
    let client = reqwest::Client::new();
    for batch in [0, 3] {
        let r = client
            .post(format!("http://{}/v2/models/simple/infer", gw.addr))
            .json(&simple_body(batch))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "batch {batch}");
    }
    let text = metrics_text(&gw).await;
    let m = parse(&text);
    let get = |k: &str| *m.get(k).unwrap_or_else(|| panic!("missing {k} in\n{text}"));
    assert_eq!(
        get(r#"nv_inference_count{model="simple",version="1"}"#),
        3.0
    );
    assert_eq!(
        get(r#"nv_inference_request_success{model="simple",version="1"}"#),
        2.0
    );
    let stats: Value = reqwest::get(format!("http://{}/v2/models/simple/stats", gw.addr))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let s = &stats["model_stats"][0];
    assert_eq!(
        (&s["inference_count"], &s["execution_count"]),
        (&json!(3), &json!(2))
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_before_the_body_is_decoded_count_against_the_model() {
    let mut config = loopback_config(true);
    config.limits.body_read_timeout_ms = 300;
    let gw = tensorgate::run::start(config, true).await.unwrap();
    let url = format!("http://{}/v2/models/simple/infer", gw.addr);
    let client = reqwest::Client::new();
    let body = serde_json::to_vec(&simple_body(1)).unwrap();
    let cases: [(&str, &str, Vec<u8>, u16); 3] = [
        ("content-encoding", "br", body.clone(), 415),
        ("content-encoding", "gzip", b"not gzip at all".to_vec(), 400),
        ("inference-header-content-length", "abc", body.clone(), 400),
    ];
    for (name, value, body, status) in cases {
        let r = client
            .post(&url)
            .header(name, value)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "{name}: {value}");
    }
    // A body that stops coming: 408 at the body-read timeout.
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let head = "POST /v2/models/simple/infer HTTP/1.1\r\nhost: a\r\ncontent-length: 100\r\n\r\n{";
    tokio::io::AsyncWriteExt::write_all(&mut s, head.as_bytes())
        .await
        .unwrap();
    let mut answer = vec![0u8; 64];
    let n = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tokio::io::AsyncReadExt::read(&mut s, &mut answer),
    )
    .await
    .expect("an answer at the body-read timeout")
    .unwrap();
    assert!(
        answer[..n].starts_with(b"HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&answer[..n])
    );
    let text = metrics_text(&gw).await;
    let m = parse(&text);
    assert_eq!(
        m.get(r#"nv_inference_request_failure{model="simple",reason="REJECTED",version="1"}"#),
        Some(&4.0),
        "{text}"
    );
    gw.shutdown().await;
}
