//! Prometheus metrics: Triton-compatible per-model series, so existing dashboards work
//! against the gateway, and `tensorgate_*` series for what only a gateway sees. Label values
//! are bounded: models come from the catalog, backends from the config; never ids.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// Seconds; from 100 µs (in-process models) to a minute (large models).
pub const DURATION_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
];

pub struct Metrics {
    pub registry: Registry,
    // Triton-compatible, labels model and version.
    pub nv_success: IntCounterVec,
    pub nv_failure: IntCounterVec,
    pub nv_count: IntCounterVec,
    pub nv_exec_count: IntCounterVec,
    pub nv_duration_us: IntCounterVec,
    pub nv_pending: IntGaugeVec,
    // Gateway series.
    pub requests: IntCounterVec,
    pub in_flight: IntGauge,
    pub duration: HistogramVec,
    pub backend_healthy: IntGaugeVec,
    pub backend_ejected: IntGaugeVec,
    pub ejections: IntCounterVec,
    pub retries: IntCounterVec,
    pub timeouts: IntCounterVec,
    pub sequence_pins: IntGauge,
    pub bytes_received: IntCounterVec,
    pub bytes_sent: IntCounterVec,
    pub transcoded_bytes: IntCounterVec,
    pub classifications: IntCounterVec,
    pub config_reloads: IntCounterVec,
}

fn reg<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: T) -> T {
    r.register(Box::new(c.clone()))
        .expect("metric names are unique");
    c
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    reg(
        r,
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

fn triton_gauge(r: Option<&Registry>, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    match r {
        Some(r) => reg(r, g),
        None => g,
    }
}

/// Triton's series go to `r` only when wanted; otherwise they are counted but not exposed.
fn triton_counter(r: Option<&Registry>, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    match r {
        Some(r) => reg(r, c),
        None => c,
    }
}

fn gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    reg(
        r,
        IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

impl Metrics {
    /// `triton`: also expose Triton's `nv_inference_*` series.
    pub fn new(triton: bool) -> Self {
        let r = Registry::new();
        let t = triton.then_some(&r);
        let mv = &["model", "version"];
        Metrics {
            nv_success: triton_counter(
                t,
                "nv_inference_request_success",
                "Number of successful inference requests, all batch sizes",
                mv,
            ),
            nv_failure: triton_counter(
                t,
                "nv_inference_request_failure",
                "Number of failed inference requests, all batch sizes",
                &["model", "version", "reason"],
            ),
            nv_count: triton_counter(
                t,
                "nv_inference_count",
                "Number of inferences performed (a batch of n counts n)",
                mv,
            ),
            nv_exec_count: triton_counter(
                t,
                "nv_inference_exec_count",
                "Number of model executions (requests sent to a backend)",
                mv,
            ),
            nv_duration_us: triton_counter(
                t,
                "nv_inference_request_duration_us",
                "Cumulative inference request duration in microseconds, as seen by the gateway",
                mv,
            ),
            nv_pending: triton_gauge(
                t,
                "nv_inference_pending_request_count",
                "Inference requests in the gateway, not yet answered",
                mv,
            ),
            requests: counter(
                &r,
                "tensorgate_http_requests_total",
                "HTTP requests answered, by status code",
                &["code"],
            ),
            in_flight: reg(
                &r,
                IntGauge::new(
                    "tensorgate_http_requests_in_flight",
                    "HTTP requests being handled",
                )
                .expect("valid metric"),
            ),
            duration: reg(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "tensorgate_request_duration_seconds",
                        "Inference request duration, by model and backend",
                    )
                    .buckets(DURATION_BUCKETS.to_vec()),
                    &["model", "backend"],
                )
                .expect("valid metric"),
            ),
            backend_healthy: gauge(
                &r,
                "tensorgate_backend_healthy",
                "1 when the backend passed its last health check",
                &["backend"],
            ),
            backend_ejected: gauge(
                &r,
                "tensorgate_backend_ejected",
                "1 while the backend is ejected by passive health checks",
                &["backend"],
            ),
            ejections: counter(
                &r,
                "tensorgate_backend_ejections_total",
                "Passive ejections of a backend",
                &["backend"],
            ),
            retries: counter(
                &r,
                "tensorgate_backend_retries_total",
                "Requests retried elsewhere after this backend refused a connection",
                &["backend"],
            ),
            timeouts: counter(
                &r,
                "tensorgate_request_timeouts_total",
                "Inference requests answered 504",
                &["model"],
            ),
            sequence_pins: reg(
                &r,
                IntGauge::new(
                    "tensorgate_sequence_pins",
                    "Live sequences pinned to a backend",
                )
                .expect("valid metric"),
            ),
            bytes_received: counter(
                &r,
                "tensorgate_received_bytes_total",
                "Request body bytes received from clients",
                &["model"],
            ),
            bytes_sent: counter(
                &r,
                "tensorgate_sent_bytes_total",
                "Response body bytes sent to clients",
                &["model"],
            ),
            transcoded_bytes: counter(
                &r,
                "tensorgate_transcoded_bytes_total",
                "Tensor bytes converted between encodings (binary size), by direction",
                &["direction"],
            ),
            classifications: counter(
                &r,
                "tensorgate_gateway_classifications_total",
                "Outputs classified by the gateway itself",
                &["model"],
            ),
            config_reloads: counter(
                &r,
                "tensorgate_config_reloads_total",
                "Config reloads, by result",
                &["result"],
            ),
            registry: r,
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("encoding metrics to a Vec cannot fail");
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(true)
    }
}

/// Triton's failure reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureReason {
    /// Refused before reaching a model: invalid request, no backend, shed.
    Rejected,
    /// The deadline passed.
    Canceled,
    /// The backend failed or rejected the request.
    Backend,
    Other,
}

impl FailureReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::Rejected => "REJECTED",
            FailureReason::Canceled => "CANCELED",
            FailureReason::Backend => "BACKEND",
            FailureReason::Other => "OTHER",
        }
    }
}
