//! What one request did, gathered as it runs and recorded once at the end: Prometheus
//! series, the statistics extension, and the access log line.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dashmap::DashMap;
use http::StatusCode;
use serde_json::{json, Value};

use crate::metrics::{FailureReason, Metrics};

/// Which edge a request came in on: a label of the gateway's own series.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Protocol {
    #[default]
    Rest,
    Grpc,
}

impl Protocol {
    pub fn label(self) -> &'static str {
        match self {
            Protocol::Rest => "rest",
            Protocol::Grpc => "grpc",
        }
    }
}

#[derive(Clone, Default)]
pub struct Observation {
    pub protocol: Protocol,
    /// Set once the model is known to the catalog (so labels stay bounded).
    pub model: Option<String>,
    pub version: Option<String>,
    pub backend: Option<String>,
    pub sequence: Option<String>,
    /// Inferences in the request (the batch size when the first dimension is a batch).
    pub batch: u64,
    pub bytes_in: u64,
    pub backend_calls: u64,
    pub classified: u64,
    pub json_to_binary: u64,
    pub binary_to_json: u64,
    pub retried_from: Option<String>,
    /// The W3C trace context sent to the backend, for the access log.
    pub traceparent: Option<String>,
    pub queue: Duration,
    pub compute_input: Duration,
    pub compute_infer: Duration,
    pub compute_output: Duration,
}

impl Observation {
    pub fn new(protocol: Protocol) -> Self {
        Observation {
            protocol,
            ..Observation::default()
        }
    }
}

/// Starts a phase; `Phase::end` adds its time to one of the observation's durations.
pub struct Phase(Instant);

impl Phase {
    pub fn start() -> Self {
        Phase(Instant::now())
    }

    pub fn end(self, into: &mut Duration) {
        *into += self.0.elapsed();
    }
}

#[derive(Default)]
struct Counter {
    count: AtomicU64,
    ns: AtomicU64,
}

impl Counter {
    /// Returns the whole microseconds this addition completes, for the matching `_us`
    /// counter: fed with them, it always equals `ns / 1000` of this counter, however short
    /// each request (rounding every request down on its own would lose up to 1 µs each).
    fn add(&self, n: u64, d: Duration) -> u64 {
        self.count.fetch_add(n, Ordering::Relaxed);
        let ns = d.as_nanos() as u64;
        let before = self.ns.fetch_add(ns, Ordering::Relaxed);
        let after = before.wrapping_add(ns);
        if after >= before {
            after / 1000 - before / 1000
        } else {
            ns / 1000 // the ns counter wrapped; the µs series keeps counting
        }
    }

    fn json(&self) -> Value {
        json!({ "count": self.count.load(Ordering::Relaxed), "ns": self.ns.load(Ordering::Relaxed) })
    }
}

#[derive(Default)]
struct ModelStats {
    last_inference_ms: AtomicU64,
    inference_count: AtomicU64,
    execution_count: AtomicU64,
    success: Counter,
    fail: Counter,
    queue: Counter,
    compute_input: Counter,
    compute_infer: Counter,
    compute_output: Counter,
}

/// The statistics extension's numbers, from the gateway's point of view (it has no queue):
/// `queue` is the model's lookup and the request's setup before a backend is chosen,
/// `compute_input` decoding, validating and encoding for the backend, `compute_infer` the
/// backend's round trips, `compute_output` shaping and encoding the response. The phases
/// are counted for successful requests only, as Triton does, and are disjoint parts of the
/// request's duration; reading the body, routing and shedding are in none of them. The
/// `nv_inference_*_us` series are fed from these same counters, so they agree with this
/// endpoint to the microsecond.
#[derive(Default)]
pub struct Stats {
    models: DashMap<(String, String), ModelStats>,
}

impl Stats {
    /// `{"model_stats": [...]}` for one model (and version) or all.
    pub fn json(
        &self,
        model: Option<&str>,
        version: Option<&str>,
        known: &[(String, String)],
    ) -> Value {
        let mut list = Vec::new();
        for (name, v) in known {
            if model.is_some_and(|m| m != name) || version.is_some_and(|x| x != v) {
                continue;
            }
            let key = (name.clone(), v.clone());
            let entry = self.models.entry(key).or_default();
            let s = entry.value();
            list.push(json!({
                "name": name,
                "version": v,
                "last_inference": s.last_inference_ms.load(Ordering::Relaxed),
                "inference_count": s.inference_count.load(Ordering::Relaxed),
                "execution_count": s.execution_count.load(Ordering::Relaxed),
                "inference_stats": {
                    "success": s.success.json(),
                    "fail": s.fail.json(),
                    "queue": s.queue.json(),
                    "compute_input": s.compute_input.json(),
                    "compute_infer": s.compute_infer.json(),
                    "compute_output": s.compute_output.json(),
                },
                "batch_stats": [],
            }));
        }
        json!({ "model_stats": list })
    }
}

fn reason(status: StatusCode) -> FailureReason {
    match status.as_u16() {
        504 => FailureReason::Canceled,
        502 => FailureReason::Backend,
        s if s >= 500 && s != 503 => FailureReason::Backend,
        400..=499 | 503 => FailureReason::Rejected,
        _ => FailureReason::Other,
    }
}

/// Records a finished inference request in the metrics and statistics.
pub fn record_infer(
    metrics: &Metrics,
    stats: &Stats,
    obs: &Observation,
    status: StatusCode,
    elapsed: Duration,
    bytes_out: u64,
) {
    let Some(model) = &obs.model else {
        return;
    };
    let version = obs.version.clone().unwrap_or_default();
    let labels = [model.as_str(), version.as_str()];
    let ok = status.is_success();
    if ok {
        metrics.nv_success.with_label_values(&labels).inc();
        metrics
            .nv_count
            .with_label_values(&labels)
            .inc_by(obs.batch.max(1));
    } else {
        let r = reason(status);
        metrics
            .nv_failure
            .with_label_values(&[model, &version, r.as_str()])
            .inc();
        if r == FailureReason::Canceled {
            metrics.timeouts.with_label_values(&[model]).inc();
        }
    }
    metrics
        .nv_exec_count
        .with_label_values(&labels)
        .inc_by(obs.backend_calls);
    metrics
        .duration
        .with_label_values(&[
            model,
            obs.backend.as_deref().unwrap_or("none"),
            obs.protocol.label(),
        ])
        .observe(elapsed.as_secs_f64());
    metrics
        .bytes_received
        .with_label_values(&[model])
        .inc_by(obs.bytes_in);
    metrics
        .bytes_sent
        .with_label_values(&[model])
        .inc_by(bytes_out);
    if obs.json_to_binary > 0 {
        metrics
            .transcoded_bytes
            .with_label_values(&["json_to_binary"])
            .inc_by(obs.json_to_binary);
    }
    if obs.binary_to_json > 0 {
        metrics
            .transcoded_bytes
            .with_label_values(&["binary_to_json"])
            .inc_by(obs.binary_to_json);
    }
    if obs.classified > 0 {
        metrics
            .classifications
            .with_label_values(&[model])
            .inc_by(obs.classified);
    }
    if let Some(b) = &obs.retried_from {
        metrics.retries.with_label_values(&[b]).inc();
    }

    record_stats(metrics, stats, obs, (model, &version), ok, elapsed);
}

/// The statistics extension's counters, and the Triton microsecond series fed from them.
fn record_stats(
    metrics: &Metrics,
    stats: &Stats,
    obs: &Observation,
    (model, version): (&str, &str),
    ok: bool,
    elapsed: Duration,
) {
    let labels = [model, version];
    let entry = stats
        .models
        .entry((model.to_string(), version.to_string()))
        .or_default();
    let s = entry.value();
    let micros = |c: &prometheus::IntCounterVec, us: u64| c.with_label_values(&labels).inc_by(us);
    if ok {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        s.last_inference_ms.store(now_ms, Ordering::Relaxed);
        s.inference_count
            .fetch_add(obs.batch.max(1), Ordering::Relaxed);
        micros(&metrics.nv_duration_us, s.success.add(1, elapsed));
        micros(&metrics.nv_queue_us, s.queue.add(1, obs.queue));
        micros(
            &metrics.nv_compute_input_us,
            s.compute_input.add(1, obs.compute_input),
        );
        micros(
            &metrics.nv_compute_infer_us,
            s.compute_infer.add(1, obs.compute_infer),
        );
        micros(
            &metrics.nv_compute_output_us,
            s.compute_output.add(1, obs.compute_output),
        );
    } else {
        // Unlike Triton, failed requests count in the request duration too: a gateway's
        // failures (timeouts above all) are part of what clients waited for.
        micros(&metrics.nv_duration_us, s.fail.add(1, elapsed));
    }
    s.execution_count
        .fetch_add(obs.backend_calls, Ordering::Relaxed);
}

/// The access-log line of one request (or stream message), the same fields on every edge:
/// `status` is the HTTP status for REST and the gRPC code for gRPC; `error` the message of a
/// failed one.
pub fn access_log(
    method: &str,
    path: &str,
    obs: &Observation,
    status: u32,
    bytes_out: u64,
    elapsed: Duration,
    error: Option<&str>,
) {
    tracing::info!(
        target: "tensorgate::access",
        method,
        path,
        protocol = obs.protocol.label(),
        model = obs.model.as_deref().unwrap_or("-"),
        status,
        backend = obs.backend.as_deref().unwrap_or("-"),
        bytes_in = obs.bytes_in,
        bytes_out,
        duration_us = elapsed.as_micros() as u64,
        sequence_id = obs.sequence.as_deref().unwrap_or("-"),
        traceparent = obs.traceparent.as_deref().unwrap_or("-"),
        error = error.unwrap_or("-"),
    );
}

/// W3C trace context: the client's `traceparent` if valid, else a new one.
pub fn traceparent(incoming: Option<&http::HeaderValue>) -> http::HeaderValue {
    if let Some(v) = incoming {
        if valid_traceparent(v.as_bytes()) {
            return v.clone();
        }
    }
    let trace = format!("{:016x}{:016x}", fastrand::u64(1..), fastrand::u64(..));
    let span = format!("{:016x}", fastrand::u64(1..));
    http::HeaderValue::from_str(&format!("00-{trace}-{span}-01")).expect("hex is a valid header")
}

fn valid_traceparent(v: &[u8]) -> bool {
    let parts: Vec<&[u8]> = v.split(|b| *b == b'-').collect();
    let hex = |p: &[u8], n: usize| p.len() == n && p.iter().all(|b| b.is_ascii_hexdigit());
    parts.len() >= 4
        && hex(parts[0], 2)
        && parts[0] != b"ff"
        && hex(parts[1], 32)
        && parts[1].iter().any(|b| *b != b'0')
        && hex(parts[2], 16)
        && parts[2].iter().any(|b| *b != b'0')
        && hex(parts[3], 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_is_kept_or_created() {
        let good = http::HeaderValue::from_static(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        );
        assert_eq!(traceparent(Some(&good)), good);
        let made = traceparent(Some(&http::HeaderValue::from_static("garbage")));
        assert!(valid_traceparent(made.as_bytes()), "{made:?}");
        assert!(valid_traceparent(traceparent(None).as_bytes()));
    }

    #[test]
    fn failure_reasons() {
        assert_eq!(reason(StatusCode::BAD_REQUEST), FailureReason::Rejected);
        assert_eq!(
            reason(StatusCode::SERVICE_UNAVAILABLE),
            FailureReason::Rejected
        );
        assert_eq!(reason(StatusCode::GATEWAY_TIMEOUT), FailureReason::Canceled);
        assert_eq!(reason(StatusCode::BAD_GATEWAY), FailureReason::Backend);
        assert_eq!(
            reason(StatusCode::INTERNAL_SERVER_ERROR),
            FailureReason::Backend
        );
    }
}
