//! Prometheus metrics: Triton-compatible per-model series, so existing dashboards work
//! against the gateway, and `tensorgate_*` series for what only a gateway sees. Label values
//! are bounded: models come from the catalog, backends from the config or DNS (and forgotten
//! when they leave the fleet); never ids.

use std::collections::HashMap;

use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
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
    pub nv_queue_us: IntCounterVec,
    pub nv_compute_input_us: IntCounterVec,
    pub nv_compute_infer_us: IntCounterVec,
    pub nv_compute_output_us: IntCounterVec,
    pub nv_pending: IntGaugeVec,
    // Gateway series.
    pub requests: IntCounterVec,
    pub grpc_requests: IntCounterVec,
    pub in_flight: IntGauge,
    pub buffered_body_bytes: IntGauge,
    pub buffered_body_limit: IntGauge,
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
    pub tls_reloads: IntCounterVec,
    pub token_reloads: IntCounterVec,
    /// Synced from `logwriter::dropped_lines` at every scrape.
    log_lines_dropped: IntCounter,
    pub tls_handshake_failures: IntCounterVec,
    pub backend_tolerated: IntCounterVec,
    pub pin_store_operations: IntCounterVec,
    pub pin_store_errors: IntCounterVec,
    pub pin_store_up: IntGauge,
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
    /// Exposes `tensorgate_pin_store_up`, once a shared pin store exists.
    pub fn expose_pin_store(&self) {
        match self.registry.register(Box::new(self.pin_store_up.clone())) {
            Ok(()) | Err(prometheus::Error::AlreadyReg) => {}
            Err(e) => tracing::error!(error = %e, "cannot expose tensorgate_pin_store_up"),
        }
    }

    /// `triton`: also expose Triton's `nv_inference_*` series.
    pub fn new(triton: bool) -> Self {
        let r = Registry::new();
        let t = triton.then_some(&r);
        let mv = &["model", "version"];
        let m = Metrics {
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
                "Number of model executions (calls that may have reached a backend: a refused connection is none)",
                mv,
            ),
            nv_duration_us: triton_counter(
                t,
                "nv_inference_request_duration_us",
                "Cumulative inference request duration in microseconds, as seen by the gateway",
                mv,
            ),
            nv_queue_us: triton_counter(
                t,
                "nv_inference_queue_duration_us",
                "Cumulative microseconds successful requests spent on model lookup and setup before a backend is chosen (the gateway has no queue)",
                mv,
            ),
            nv_compute_input_us: triton_counter(
                t,
                "nv_inference_compute_input_duration_us",
                "Cumulative microseconds successful requests spent decoding, validating and encoding inputs for the backend",
                mv,
            ),
            nv_compute_infer_us: triton_counter(
                t,
                "nv_inference_compute_infer_duration_us",
                "Cumulative microseconds successful requests spent in backend round trips",
                mv,
            ),
            nv_compute_output_us: triton_counter(
                t,
                "nv_inference_compute_output_duration_us",
                "Cumulative microseconds successful requests spent shaping and encoding responses",
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
            grpc_requests: counter(
                &r,
                "tensorgate_grpc_requests_total",
                "gRPC inference requests answered (each message of a stream counts), by method and status code",
                &["method", "code"],
            ),
            in_flight: reg(
                &r,
                IntGauge::new(
                    "tensorgate_http_requests_in_flight",
                    "HTTP requests and gRPC inference requests being handled",
                )
                .expect("valid metric"),
            ),
            buffered_body_bytes: reg(
                &r,
                IntGauge::new(
                    "tensorgate_buffered_body_bytes",
                    "Bytes of request bodies held in memory (received, or inflated, and not yet answered)",
                )
                .expect("valid metric"),
            ),
            buffered_body_limit: reg(
                &r,
                IntGauge::new(
                    "tensorgate_buffered_body_limit_bytes",
                    "limits.max_buffered_body_bytes as applied: beyond it request bodies are refused with 503",
                )
                .expect("valid metric"),
            ),
            duration: reg(
                &r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "tensorgate_request_duration_seconds",
                        "Inference request duration, by model, backend and protocol (rest or grpc)",
                    )
                    .buckets(DURATION_BUCKETS.to_vec()),
                    &["model", "backend", "protocol"],
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
                "Requests sent on to another backend after this one refused the connection, closed it before answering a request that may be repeated, or answered 404 (a model or sequence it does not have)",
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
                "Request body bytes received from clients, after content decoding (gzip, deflate)",
                &["model"],
            ),
            bytes_sent: counter(
                &r,
                "tensorgate_sent_bytes_total",
                "Response body bytes sent to clients, before content coding",
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
            tls_reloads: counter(
                &r,
                "tensorgate_tls_reloads_total",
                "Reloads of the listeners' certificate and key (on SIGHUP or a change of their files), by result: a failure keeps the old ones",
                &["result"],
            ),
            log_lines_dropped: reg(
                &r,
                IntCounter::new(
                    "tensorgate_log_lines_dropped_total",
                    "Log lines dropped because stderr did not keep up (a stalled log collector): logging never makes requests, probes or scrapes wait",
                )
                .expect("valid metric"),
            ),
            token_reloads: counter(
                &r,
                "tensorgate_auth_token_reloads_total",
                "Reloads of the bearer tokens on a change of auth.tokens_file, by result: a failure (a file without tokens, one that is gone) keeps the old tokens",
                &["result"],
            ),
            tls_handshake_failures: counter(
                &r,
                "tensorgate_tls_handshake_failures_total",
                "TLS handshakes the listeners did not complete, by reason: error (a client that does not trust the certificate, sent none where one is required, or no TLS at all) or timeout (none within limits.header_read_timeout_ms); the reason of each is logged at debug",
                &["reason"],
            ),
            backend_tolerated: counter(
                &r,
                "tensorgate_backend_tolerated_total",
                "Backend answers the gateway read past a deviation from the protocol, by kind (see protocol::tolerance): model metadata per discovery round, inference responses per response",
                &["backend", "tolerance"],
            ),
            pin_store_operations: counter(
                &r,
                "tensorgate_pin_store_operations_total",
                "Round trips to the shared pin store (fleet.pins.store = \"redis\"), by operation: claim (one script call per batch of the get-or-claims of requests and TTL renewals), put, remove",
                &["op"],
            ),
            pin_store_errors: counter(
                &r,
                "tensorgate_pin_store_errors_total",
                "Pin store operations that failed, timed out, or were skipped while the store backs off after a failure (1 s): one per request or renewal that went without the store (claim, refresh, put, remove); each such request was routed by the hash table instead",
                &["op"],
            ),
            // Registered by `expose_pin_store` only when there is a shared store: a 0 on
            // every replica that keeps its pins in memory would fire any alert on it.
            pin_store_up: IntGauge::new(
                "tensorgate_pin_store_up",
                "1 while the shared pin store answers, 0 after a failure until it answers again",
            )
            .expect("valid metric"),
            registry: r,
        };
        // Series an operator alerts on exist from the start at 0, so that the first event
        // is an increase (a series born at 1 makes no `increase()`).
        for result in ["success", "failure"] {
            m.config_reloads.with_label_values(&[result]);
            m.token_reloads.with_label_values(&[result]);
        }
        m
    }

    /// The TLS series at 0, once the listeners have TLS.
    pub fn expect_tls(&self) {
        for result in ["success", "failure"] {
            self.tls_reloads.with_label_values(&[result]);
        }
        for reason in ["error", "timeout"] {
            self.tls_handshake_failures.with_label_values(&[reason]);
        }
    }

    /// Drops every series of a backend that `live` does not accept, so that backends removed
    /// by a reload or by DNS (named `name/IP:port`, so unbounded over time) do not keep
    /// their label values forever (`backend_stays`).
    pub fn forget_backends(&self, live: impl Fn(&str) -> bool) {
        let keep = |b: &str| backend_stays(b, &live);
        forget(&self.duration, &keep);
        forget(&self.ejections, &keep);
        forget(&self.retries, &keep);
        forget(&self.backend_healthy, &keep);
        forget(&self.backend_ejected, &keep);
        forget(&self.backend_tolerated, &keep);
    }

    /// The text exposition format.
    pub fn render(&self) -> Vec<u8> {
        let dropped = crate::logwriter::dropped_lines();
        self.log_lines_dropped
            .inc_by(dropped.saturating_sub(self.log_lines_dropped.get()));
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("encoding metrics to a Vec cannot fail");
        out
    }
}

/// Whether the series of backend label `b` stay when the fleet is `live`: a live backend's,
/// and `none`'s (requests that found no backend).
pub fn backend_stays(b: &str, live: &dyn Fn(&str) -> bool) -> bool {
    b == "none" || live(b)
}

/// Removes the series of `vec` whose `backend` label `keep` refuses. The vector is read
/// through its own collector, so no second list of label values has to be kept in step.
fn forget<T: MetricVecBuilder>(vec: &MetricVec<T>, keep: &dyn Fn(&str) -> bool) {
    for family in vec.collect() {
        for metric in family.get_metric() {
            let labels: HashMap<&str, &str> = metric
                .get_label()
                .iter()
                .map(|l| (l.name(), l.value()))
                .collect();
            if labels.get("backend").is_some_and(|b| !keep(b)) {
                // Only fails when the labels do not match the vector's, which they do.
                let _ = vec.remove(&labels);
            }
        }
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
    /// The backend failed: a 5xx of its own, an unusable answer, no connection, or gone
    /// with a sequence's state.
    Backend,
    /// The gateway's own fault.
    Other,
}

impl FailureReason {
    pub const ALL: [FailureReason; 4] = [
        FailureReason::Rejected,
        FailureReason::Canceled,
        FailureReason::Backend,
        FailureReason::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::Rejected => "REJECTED",
            FailureReason::Canceled => "CANCELED",
            FailureReason::Backend => "BACKEND",
            FailureReason::Other => "OTHER",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reload counters exist at 0 before any reload, so that an alert on `increase()` sees
    /// the first failure.
    #[test]
    fn reload_counters_start_at_zero() {
        let m = Metrics::new(false);
        let text = String::from_utf8(m.render()).unwrap();
        assert!(text.contains("tensorgate_config_reloads_total{result=\"failure\"} 0\n"));
        assert!(text.contains("tensorgate_config_reloads_total{result=\"success\"} 0\n"));
        assert!(text.contains("tensorgate_auth_token_reloads_total{result=\"failure\"} 0\n"));
        assert!(!text.contains("tensorgate_tls_reloads_total"), "{text}");
        m.expect_tls();
        let text = String::from_utf8(m.render()).unwrap();
        assert!(text.contains("tensorgate_tls_reloads_total{result=\"failure\"} 0\n"));
    }

    #[test]
    fn removed_backends_are_forgotten_everywhere() {
        let m = Metrics::new(true);
        for b in ["api/10.0.0.1:8000", "kept", "none"] {
            m.duration
                .with_label_values(&["simple", b, "rest"])
                .observe(0.1);
        }
        for b in ["api/10.0.0.1:8000", "kept"] {
            m.ejections.with_label_values(&[b]).inc();
            m.retries.with_label_values(&[b]).inc();
            m.backend_healthy.with_label_values(&[b]).set(1);
            m.backend_ejected.with_label_values(&[b]).set(1);
        }
        m.forget_backends(|b| b == "kept");
        let text = String::from_utf8(m.render()).unwrap();
        assert!(!text.contains("10.0.0.1"), "{text}");
        for series in [
            r#"tensorgate_request_duration_seconds_count{backend="kept",model="simple",protocol="rest"} 1"#,
            r#"tensorgate_request_duration_seconds_count{backend="none",model="simple",protocol="rest"} 1"#,
            r#"tensorgate_backend_ejections_total{backend="kept"} 1"#,
            r#"tensorgate_backend_retries_total{backend="kept"} 1"#,
            r#"tensorgate_backend_healthy{backend="kept"} 1"#,
            r#"tensorgate_backend_ejected{backend="kept"} 1"#,
        ] {
            assert!(text.contains(series), "{series} in\n{text}");
        }
    }
}
