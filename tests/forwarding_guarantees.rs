//! What the gateway promises about a forwarded request, seen from the backends' side of the
//! wire: a request that a backend may have acted on is never sent to another one (only a
//! stateless request whose connection closed before any answer is, once), and a
//! request's deadline (the `timeout` parameter or `[models.NAME] timeout_ms`) cuts a slow
//! backend short with a 504.

use crate::common_fleet;

use std::time::Duration;

use common_fleet::*;
use serde_json::json;
use tensorgate::run::Running;

/// A gateway in front of the scripted backends, named as given. Ejection is out of the
/// way, so that a failing backend keeps being picked.
async fn gateway_for(backends: &[(&str, &ScriptedBackend)], extra: &str) -> Running {
    let pairs: Vec<(&str, &str)> = backends.iter().map(|(n, b)| (*n, b.url.as_str())).collect();
    let mut text = gateway_toml(
        &pairs,
        "refresh_interval_ms = 200\neject_after_failures = 1000",
    );
    text.push_str(extra);
    let gw = start_gateway(parse_config(&text)).await;
    let client = http_client();
    let b = base(&gw);
    let want = backends.len();
    assert!(
        eventually(100, Duration::from_millis(100), || {
            let (client, b) = (client.clone(), b.clone());
            async move {
                let r = client.get(format!("{b}/v2/models/m/ready")).send().await;
                matches!(r, Ok(r) if r.status() == 200)
            }
        })
        .await,
        "model m never became ready"
    );
    let ready = gw
        .gateway
        .fleet
        .catalog()
        .get("m")
        .map(|e| e.ready.len())
        .unwrap_or(0);
    assert_eq!(ready, want, "every scripted backend serves m");
    gw
}

/// Sends 24 requests for `m` (outside any sequence unless `parameters` says otherwise).
/// Each must either be served by `good`, or fail on `bad` with `status` and `message`; the
/// backends' own counts must then show that each request reached exactly one of them.
async fn each_request_reaches_one_backend(
    gw: &Running,
    (bad, good): (&ScriptedBackend, &ScriptedBackend),
    parameters: impl Fn(usize) -> Option<serde_json::Value>,
    status: u16,
    message: &str,
) {
    let client = http_client();
    let b = base(gw);
    let (mut on_bad, mut on_good) = (0, 0);
    for i in 0..24 {
        let r = post_infer(&client, &b, "m", &m_body(parameters(i))).await;
        match r.backend.as_deref() {
            Some("bad") => {
                assert_eq!(r.status, status, "request {i}: {r:?}");
                assert_eq!(r.error(), Some(message), "request {i}: {r:?}");
                on_bad += 1;
            }
            Some("good") => {
                assert_eq!(r.status, 200, "request {i}: {r:?}");
                on_good += 1;
            }
            other => panic!("request {i} names backend {other:?}: {r:?}"),
        }
    }
    // Two backends picked at random 24 times: both are picked (but for 2^-23 odds).
    assert!(on_bad > 0, "no request went to the failing backend");
    assert_eq!(
        (bad.infers(), good.infers()),
        (on_bad, on_good),
        "a request that failed on one backend was sent to the other"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_error_after_the_request_arrived_is_not_retried() {
    let bad = ScriptedBackend::start(OnInfer::Fail(500, "model crashed")).await;
    let good = ScriptedBackend::start(OnInfer::Answer).await;
    let gw = gateway_for(&[("bad", &bad), ("good", &good)], "").await;
    each_request_reaches_one_backend(
        &gw,
        (&bad, &good),
        |_| None,
        500,
        "backend 'bad': model crashed",
    )
    .await;
    gw.shutdown().await;
}

fn closed_message(bad: &ScriptedBackend) -> String {
    format!(
        "backend 'bad': {} closed the connection before answering: connection closed before message completed",
        bad.url
    )
}

/// A stateless request is safe to run twice: when its connection closed before any answer
/// (a backend that died under it), it goes once more, to another backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateless_request_whose_connection_closed_is_retried_once_elsewhere() {
    let bad = ScriptedBackend::start(OnInfer::Close).await;
    let good = ScriptedBackend::start(OnInfer::Answer).await;
    let gw = gateway_for(&[("bad", &bad), ("good", &good)], "").await;
    let client = http_client();
    for i in 0..24 {
        let r = post_infer(&client, &base(&gw), "m", &m_body(None)).await;
        assert_eq!(
            (r.status, r.backend.as_deref()),
            (200, Some("good")),
            "request {i}: {r:?}"
        );
    }
    // Some went to the closing backend first; each was then served once by the other.
    assert!(bad.infers() > 0, "no request went to the closing backend");
    assert_eq!(good.infers(), 24);
    gw.shutdown().await;
}

/// A request of a sequence may have changed the sequence's state: never sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_request_whose_connection_closed_is_not_retried() {
    let bad = ScriptedBackend::start(OnInfer::Close).await;
    let good = ScriptedBackend::start(OnInfer::Answer).await;
    let gw = gateway_for(&[("bad", &bad), ("good", &good)], "").await;
    let start = |i: usize| Some(json!({ "sequence_id": 1000 + i, "sequence_start": true }));
    each_request_reaches_one_backend(&gw, (&bad, &good), start, 502, &closed_message(&bad)).await;
    gw.shutdown().await;
}

/// `retry_idempotent = false` keeps every request on the backend it was sent to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_of_stateless_requests_can_be_turned_off_per_model() {
    let bad = ScriptedBackend::start(OnInfer::Close).await;
    let good = ScriptedBackend::start(OnInfer::Answer).await;
    let extra = "[models.m]\nretry_idempotent = false\n";
    let gw = gateway_for(&[("bad", &bad), ("good", &good)], extra).await;
    each_request_reaches_one_backend(&gw, (&bad, &good), |_| None, 502, &closed_message(&bad))
        .await;
    gw.shutdown().await;
}

const TIMED_OUT_PARAMETER: &str =
    "the request to model 'm' timed out on backend 'slow' (the request's timeout parameter)";
const TIMED_OUT_MODEL: &str =
    "the request to model 'm' timed out on backend 'slow' (models.m.timeout_ms)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeout_parameter_cuts_a_slow_backend_short() {
    let slow = ScriptedBackend::start(OnInfer::Delay(Duration::from_secs(2))).await;
    let gw = gateway_for(&[("slow", &slow)], "").await;
    let client = http_client();

    // 200 ms, in microseconds: the request reaches the backend, which takes 2 s.
    let body = m_body(Some(json!({ "timeout": 200_000 })));
    let r = post_infer(&client, &base(&gw), "m", &body).await;
    assert_eq!(r.status, 504, "{r:?}");
    assert_eq!(r.error(), Some(TIMED_OUT_PARAMETER));
    assert_eq!(r.backend.as_deref(), Some("slow"));
    assert_eq!(slow.infers(), 1, "the request was sent, once");

    // Without the parameter the configured default (60 s) lets the backend finish.
    let r = post_infer(&client, &base(&gw), "m", &m_body(None)).await;
    assert_eq!(r.status, 200, "{r:?}");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_timeout_from_the_config_cuts_a_slow_backend_short() {
    let slow = ScriptedBackend::start(OnInfer::Delay(Duration::from_secs(2))).await;
    let gw = gateway_for(&[("slow", &slow)], "[models.m]\ntimeout_ms = 200\n").await;
    let client = http_client();

    let r = post_infer(&client, &base(&gw), "m", &m_body(None)).await;
    assert_eq!(r.status, 504, "{r:?}");
    assert_eq!(r.error(), Some(TIMED_OUT_MODEL));
    assert_eq!(r.backend.as_deref(), Some("slow"));

    // The `timeout` parameter can shorten the model's deadline, never lengthen it.
    let body = m_body(Some(json!({ "timeout": 10_000_000 })));
    let r = post_infer(&client, &base(&gw), "m", &body).await;
    assert_eq!(r.status, 504, "{r:?}");
    assert_eq!(r.error(), Some(TIMED_OUT_MODEL));
    assert_eq!(slow.infers(), 2);
    gw.shutdown().await;
}

/// The sum of `nv_inference_request_failure` for model `m` with this `reason`.
fn failures(metrics: &str, reason: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("nv_inference_request_failure{"))
        .filter(|l| l.contains("model=\"m\"") && l.contains(&format!("reason=\"{reason}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A gateway of this config, once model `m` is in its catalog.
async fn start_serving_m(text: &str) -> Running {
    let gw = tensorgate::run::start(parse_config(text), true)
        .await
        .expect("the gateway starts");
    assert!(
        eventually(100, Duration::from_millis(100), || {
            let gw = &gw;
            async move { gw.gateway.fleet.catalog().get("m").is_some() }
        })
        .await
    );
    gw
}

/// What a backend does wrong is counted as the backend's (BACKEND), whatever the status it
/// comes back as, and ejects it: a 503 of its own, and a 200 whose body is not a response
/// (a backend answering garbage must not keep its share of the traffic).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_faults_count_as_backend_failures_and_eject() {
    let garbage = ScriptedBackend::start(OnInfer::Garbage).await;
    let busy = ScriptedBackend::start(OnInfer::Fail(503, "overloaded")).await;
    for (name, backend, status, message) in [
        (
            "garbage",
            &garbage,
            502,
            "backend 'garbage' sent an invalid response: invalid JSON response: expected value at line 1 column 1",
        ),
        ("busy", &busy, 503, "backend 'busy': overloaded"),
    ] {
        let text = gateway_toml(
            &[(name, backend.url.as_str())],
            "refresh_interval_ms = 600000\neject_after_failures = 2\neject_base_ms = 600000\neject_max_ms = 600000",
        );
        let gw = start_serving_m(&text).await;
        let client = http_client();
        for i in 0..2 {
            let r = post_infer(&client, &base(&gw), "m", &m_body(None)).await;
            assert_eq!((r.status, r.error()), (status, Some(message)), "{name} {i}");
        }
        let metrics = scrape(&gw).await;
        assert_eq!(failures(&metrics, "BACKEND"), 2.0, "{name}:\n{metrics}");
        assert_eq!(failures(&metrics, "REJECTED"), 0.0, "{name}:\n{metrics}");
        let ejected = format!("tensorgate_backend_ejections_total{{backend=\"{name}\"}} 1");
        assert!(metrics.contains(&ejected), "{name}:\n{metrics}");
        gw.shutdown().await;
    }
}

/// A backend that takes requests and overruns the configured timeout has failed as surely
/// as one that refuses them: its timeouts count toward ejection, or a hung backend would
/// keep its share of the traffic. A client's own shorter `timeout` says nothing of the
/// backend (the model may just be slower than the client wished) and does not count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_overruns_the_configured_timeout_is_ejected() {
    let slow = ScriptedBackend::start(OnInfer::Delay(Duration::from_secs(2))).await;
    let mut text = gateway_toml(
        &[("slow", slow.url.as_str())],
        "refresh_interval_ms = 600000\neject_after_failures = 2\neject_base_ms = 600000\neject_max_ms = 600000",
    );
    text.push_str("[models.m]\ntimeout_ms = 300\n");
    let gw = start_serving_m(&text).await;
    let client = http_client();
    let ejected = "tensorgate_backend_ejections_total{backend=\"slow\"} 1";
    for _ in 0..3 {
        let body = m_body(Some(json!({ "timeout": 100_000 })));
        let r = post_infer(&client, &base(&gw), "m", &body).await;
        assert_eq!((r.status, r.error()), (504, Some(TIMED_OUT_PARAMETER)));
    }
    let metrics = scrape(&gw).await;
    assert!(!metrics.contains(ejected), "{metrics}");
    for _ in 0..2 {
        let r = post_infer(&client, &base(&gw), "m", &m_body(None)).await;
        assert_eq!((r.status, r.error()), (504, Some(TIMED_OUT_MODEL)));
    }
    let metrics = scrape(&gw).await;
    assert!(metrics.contains(ejected), "{metrics}");
    assert_eq!(slow.infers(), 5);
    gw.shutdown().await;
}
