//! What one request did, gathered as it runs and recorded once at the end: Prometheus
//! series, the statistics extension, and the access log line.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dashmap::DashMap;
use http::StatusCode;
use prometheus::{Histogram, IntCounter};
use serde_json::{json, Value};

use crate::error::{cut_short, GatewayError, MESSAGE_MAX};
use crate::metrics::{FailureReason, Metrics};
use crate::protocol::ProtocolError;

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
    /// Shared with the fleet's handle and the trail, not copied per request.
    pub backend: Option<std::sync::Arc<str>>,
    pub sequence: Option<String>,
    /// Inferences in the request (the batch size when the first dimension is a batch, which
    /// may be 0); `None` until the request is decoded, then counted as one.
    pub batch: Option<u64>,
    pub bytes_in: u64,
    pub backend_calls: u64,
    pub classified: u64,
    pub json_to_binary: u64,
    pub binary_to_json: u64,
    pub retried_from: Option<String>,
    /// The W3C trace context sent to the backend, for the access log.
    pub traceparent: Option<std::sync::Arc<str>>,
    /// The client's `x-request-id`, for the access log.
    pub request_id: Option<http::HeaderValue>,
    /// The client's address (the connection's peer), for the access log.
    pub peer: Option<std::net::SocketAddr>,
    pub queue: Duration,
    pub compute_input: Duration,
    pub compute_infer: Duration,
    pub compute_output: Duration,
    /// Why the request failed, from its error; `None` for an answer a layer made (shedding,
    /// auth), whose status then decides (`reason`).
    pub failure: Option<FailureReason>,
    /// The failed request's error message, for the access log of an edge that writes it
    /// after the error has become a response (REST).
    pub error: Option<String>,
    /// Where `note` leaves what is known so far, for a request whose future is dropped.
    pub trail: Option<std::sync::Arc<Trail>>,
}

/// What a request had learned when it last noted it (`Observation::note`): its backend, the
/// bytes it read, the trace context it sent on, its sequence. A request whose future the
/// transport drops (its client went away, `Abandoned`) loses its `Observation` with it; its
/// access line and counts are made from the trail instead, so that a cancelled request can
/// still be found in its backend's log by its traceparent, and its bytes are counted.
#[derive(Default)]
pub struct Trail(Mutex<Noted>);

#[derive(Default)]
struct Noted {
    backend: Option<std::sync::Arc<str>>,
    sequence: Option<String>,
    traceparent: Option<std::sync::Arc<str>>,
    bytes_in: u64,
}

impl Trail {
    /// Fills in what `obs` does not know from the last note.
    pub fn fill(&self, obs: &mut Observation) {
        let noted = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if obs.backend.is_none() {
            obs.backend.clone_from(&noted.backend);
        }
        if obs.sequence.is_none() {
            obs.sequence.clone_from(&noted.sequence);
        }
        if obs.traceparent.is_none() {
            obs.traceparent.clone_from(&noted.traceparent);
        }
        obs.bytes_in = obs.bytes_in.max(noted.bytes_in);
    }
}

impl Observation {
    pub fn new(protocol: Protocol) -> Self {
        Observation {
            protocol,
            ..Observation::default()
        }
    }

    /// Leaves what is known so far in the request's trail, if it has one: called before an
    /// await whose end the client may not wait for (the body's decode, the backend's call).
    pub fn note(&self) {
        let Some(trail) = &self.trail else { return };
        let mut noted = trail.0.lock().unwrap_or_else(|e| e.into_inner());
        noted.backend.clone_from(&self.backend);
        noted.sequence.clone_from(&self.sequence);
        noted.traceparent.clone_from(&self.traceparent);
        noted.bytes_in = self.bytes_in;
    }

    /// Moves `waited`, part of a backend call already counted in `compute_infer`, to
    /// `queue`: an in-process model's wait for an instance and for its thread.
    pub fn count_as_queue(&mut self, waited: Duration) {
        let waited = waited.min(self.compute_infer);
        self.compute_infer -= waited;
        self.queue += waited;
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

/// The Prometheus series of one model and version, resolved once: looking each up by its
/// labels on every request (a hash of every label value) was a few percent of the
/// gateway's instructions per small request.
struct Series {
    success: IntCounter,
    count: IntCounter,
    exec_count: IntCounter,
    duration_us: IntCounter,
    queue_us: IntCounter,
    compute_input_us: IntCounter,
    compute_infer_us: IntCounter,
    compute_output_us: IntCounter,
    bytes_received: IntCounter,
    bytes_sent: IntCounter,
    /// `tensorgate_request_duration_seconds` by backend and protocol: a few per model.
    durations: Mutex<Vec<(String, Protocol, Histogram)>>,
}

impl Series {
    fn new(metrics: &Metrics, model: &str, version: &str) -> Self {
        let mv = [model, version];
        Series {
            success: metrics.nv_success.with_label_values(&mv),
            count: metrics.nv_count.with_label_values(&mv),
            exec_count: metrics.nv_exec_count.with_label_values(&mv),
            duration_us: metrics.nv_duration_us.with_label_values(&mv),
            queue_us: metrics.nv_queue_us.with_label_values(&mv),
            compute_input_us: metrics.nv_compute_input_us.with_label_values(&mv),
            compute_infer_us: metrics.nv_compute_infer_us.with_label_values(&mv),
            compute_output_us: metrics.nv_compute_output_us.with_label_values(&mv),
            bytes_received: metrics.bytes_received.with_label_values(&[model]),
            bytes_sent: metrics.bytes_sent.with_label_values(&[model]),
            durations: Mutex::new(Vec::new()),
        }
    }

    fn observe_duration(
        &self,
        metrics: &Metrics,
        model: &str,
        backend: &str,
        protocol: Protocol,
        seconds: f64,
    ) {
        let mut durations = self.durations.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, _, h)) = durations
            .iter()
            .find(|(b, p, _)| *p == protocol && b == backend)
        {
            h.observe(seconds);
            return;
        }
        let h = metrics
            .duration
            .with_label_values(&[model, backend, protocol.label()]);
        h.observe(seconds);
        durations.push((backend.to_string(), protocol, h));
    }
}

#[derive(Default)]
struct ModelStats {
    series: OnceLock<Series>,
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

/// The statistics extension's numbers, from the gateway's point of view: `queue` is the
/// model's lookup and the request's setup before a backend is chosen, and for an in-process
/// model (built-in or from a repository) the wait for a free instance and the handoff to the
/// thread that runs it, there and back; `compute_input` decoding, validating and encoding
/// for the backend, `compute_infer` the backend's round trips (for an in-process model, its
/// run, the copies into and out of its runtime included), `compute_output` shaping and
/// encoding the response. The phases are counted for successful requests only, as Triton
/// does, and are disjoint parts of the request's duration; reading the body, routing and
/// shedding are in none of them. The `nv_inference_*_us` series are fed from these same
/// counters, so they agree with this endpoint to the microsecond.
#[derive(Default)]
pub struct Stats {
    /// By `stats_key(model, version)`: one string, so that a lookup borrows a reused buffer
    /// instead of allocating a key.
    models: DashMap<String, ModelStats>,
}

/// `{model length}:{model}{version}`: unambiguous whatever the names hold.
fn stats_key(out: &mut String, model: &str, version: &str) {
    out.clear();
    out.push_str(itoa::Buffer::new().format(model.len()));
    out.push(':');
    out.push_str(model);
    out.push_str(version);
}

thread_local! {
    static KEY: RefCell<String> = const { RefCell::new(String::new()) };
}

impl Stats {
    /// Runs `f` on the entry of a model and version, created if new.
    fn with_entry<R>(&self, model: &str, version: &str, f: impl FnOnce(&ModelStats) -> R) -> R {
        KEY.with(|key| {
            let mut key = key.borrow_mut();
            stats_key(&mut key, model, version);
            if let Some(entry) = self.models.get(key.as_str()) {
                return f(entry.value());
            }
            let entry = self.models.entry(key.clone()).or_default();
            f(entry.value())
        })
    }
}

impl Stats {
    /// Drops the cached latency handles of backends that `live` refuses, whose series
    /// `Metrics::forget_backends` removed: a handle kept would go on counting into a series
    /// no longer registered, so a backend that came back (a pod ready again, an address
    /// DNS gave back) would never have its latency shown again.
    pub fn forget_backends(&self, live: impl Fn(&str) -> bool) {
        for entry in self.models.iter() {
            if let Some(series) = entry.value().series.get() {
                series
                    .durations
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .retain(|(backend, _, _)| crate::metrics::backend_stays(backend, &live));
            }
        }
    }

    /// Opens a model version's Prometheus series at 0, as Triton exports every loaded model
    /// before its first request: a series born at 1 makes no `increase()`, and a dashboard
    /// should list a model that has served nothing yet.
    pub fn expose(&self, metrics: &Metrics, model: &str, version: &str) {
        self.with_entry(model, version, |s| {
            s.series
                .get_or_init(|| Series::new(metrics, model, version));
        });
        for reason in FailureReason::ALL {
            metrics
                .nv_failure
                .with_label_values(&[model, version, reason.as_str()]);
        }
        metrics.timeouts.with_label_values(&[model]);
        metrics.nv_pending.with_label_values(&[model, version]);
    }

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
            list.push(self.with_entry(name, v, |s| {
                json!({
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
                })
            }));
        }
        json!({ "model_stats": list })
    }
}

/// Triton's failure reason for an error: the client's errors, shedding and the lack of a
/// backend are refusals (REJECTED); what a backend did, or a backend lost with a sequence's
/// state, is BACKEND; a deadline is CANCELED; our own bug is OTHER.
pub fn failure_of(e: &GatewayError) -> FailureReason {
    match e {
        GatewayError::Timeout(_) => FailureReason::Canceled,
        GatewayError::BadGateway(_)
        | GatewayError::Unreachable(_)
        | GatewayError::SequenceLost(_)
        | GatewayError::ModelFailed(_) => FailureReason::Backend,
        GatewayError::Backend { status, .. } if status.is_server_error() => FailureReason::Backend,
        GatewayError::Internal(_) | GatewayError::Protocol(ProtocolError::Inconsistent(_)) => {
            FailureReason::Other
        }
        _ => FailureReason::Rejected,
    }
}

/// The failure reason of an answer without an error behind it (a layer's).
fn reason(status: StatusCode) -> FailureReason {
    match status.as_u16() {
        504 => FailureReason::Canceled,
        502 => FailureReason::Backend,
        s if s >= 500 && s != 503 => FailureReason::Backend,
        400..=499 | 503 => FailureReason::Rejected,
        _ => FailureReason::Other,
    }
}

/// The status recorded for a request whose client went away before its answer (nginx's
/// 499): nothing was sent, so no status was; Triton's reason for it is CANCELED.
pub const CLIENT_CLOSED: StatusCode = match StatusCode::from_u16(499) {
    Ok(s) => s,
    Err(_) => panic!("499 is a valid status code"),
};

/// Runs `record` if it is dropped armed: a request whose future the transport dropped
/// (its client went away) is recorded from here, since nothing after the await it was
/// waiting on runs. Disarmed once the request has been recorded the usual way.
pub struct Abandoned<F: FnOnce()> {
    record: Option<F>,
}

impl<F: FnOnce()> Abandoned<F> {
    pub fn new(record: F) -> Self {
        Abandoned {
            record: Some(record),
        }
    }

    pub fn disarm(mut self) {
        self.record = None;
    }
}

impl<F: FnOnce()> Drop for Abandoned<F> {
    fn drop(&mut self) {
        if let Some(record) = self.record.take() {
            record();
        }
    }
}

/// The access-log message of a request whose client went away.
pub const WENT_AWAY: &str = "the client went away before the answer";

/// Why a request ended before its answer (its future was dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutOff {
    /// Its client closed the connection or cancelled the call.
    ClientWentAway,
    /// The shutdown's drain deadline passed while it was in flight.
    Shutdown,
}

/// The access-log message of a request cut off by the shutdown.
pub const SHUT_DOWN: &str =
    "the gateway shut down before the answer (limits.drain_timeout_ms passed)";

impl CutOff {
    /// The HTTP status its records carry: nginx's 499 for a client that went away, 503 for
    /// the shutdown.
    pub fn status(self) -> StatusCode {
        match self {
            CutOff::ClientWentAway => CLIENT_CLOSED,
            CutOff::Shutdown => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The access line's error.
    pub fn message(self) -> &'static str {
        match self {
            CutOff::ClientWentAway => WENT_AWAY,
            CutOff::Shutdown => SHUT_DOWN,
        }
    }

    /// The model's failure reason: the client's cancellation, or the gateway's own doing.
    pub fn reason(self) -> FailureReason {
        match self {
            CutOff::ClientWentAway => FailureReason::Canceled,
            CutOff::Shutdown => FailureReason::Other,
        }
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
    let version = obs.version.as_deref().unwrap_or_default();
    stats.with_entry(model, version, |s| {
        let series = s
            .series
            .get_or_init(|| Series::new(metrics, model, version));
        record_series(
            metrics,
            series,
            obs,
            (model, version),
            status,
            elapsed,
            bytes_out,
        );
        record_stats(s, series, obs, status.is_success(), elapsed);
    });
}

/// The Prometheus series of one request.
fn record_series(
    metrics: &Metrics,
    series: &Series,
    obs: &Observation,
    (model, version): (&str, &str),
    status: StatusCode,
    elapsed: Duration,
    bytes_out: u64,
) {
    if status.is_success() {
        series.success.inc();
        series.count.inc_by(obs.batch.unwrap_or(1));
    } else {
        let r = obs.failure.unwrap_or_else(|| reason(status));
        metrics
            .nv_failure
            .with_label_values(&[model, version, r.as_str()])
            .inc();
        // A deadline that passed; not a client that went away (it closed no deadline).
        if r == FailureReason::Canceled && status != CLIENT_CLOSED {
            metrics.timeouts.with_label_values(&[model]).inc();
        }
    }
    series.exec_count.inc_by(obs.backend_calls);
    series.observe_duration(
        metrics,
        model,
        obs.backend.as_deref().unwrap_or("none"),
        obs.protocol,
        elapsed.as_secs_f64(),
    );
    series.bytes_received.inc_by(obs.bytes_in);
    series.bytes_sent.inc_by(bytes_out);
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
}

/// The statistics extension's counters, and the Triton microsecond series fed from them.
fn record_stats(s: &ModelStats, series: &Series, obs: &Observation, ok: bool, elapsed: Duration) {
    if ok {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        s.last_inference_ms.store(now_ms, Ordering::Relaxed);
        s.inference_count
            .fetch_add(obs.batch.unwrap_or(1), Ordering::Relaxed);
        series.duration_us.inc_by(s.success.add(1, elapsed));
        series.queue_us.inc_by(s.queue.add(1, obs.queue));
        series
            .compute_input_us
            .inc_by(s.compute_input.add(1, obs.compute_input));
        series
            .compute_infer_us
            .inc_by(s.compute_infer.add(1, obs.compute_infer));
        series
            .compute_output_us
            .inc_by(s.compute_output.add(1, obs.compute_output));
    } else {
        // Unlike Triton, failed requests count in the request duration too: a gateway's
        // failures (timeouts above all) are part of what clients waited for.
        series.duration_us.inc_by(s.fail.add(1, elapsed));
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
    // Checked first: a level that is off costs nothing more (the bench runs at warn).
    let probe = is_probe(method, path, status);
    let (enabled, level) = if probe {
        let on = tracing::enabled!(target: "tensorgate::access", tracing::Level::DEBUG);
        (on, tracing::Level::DEBUG)
    } else {
        let on = tracing::enabled!(target: "tensorgate::access", tracing::Level::INFO);
        (on, tracing::Level::INFO)
    };
    if !enabled {
        return;
    }
    // What a client named is quoted, never more than a screenful of it.
    let model = obs
        .model
        .as_deref()
        .map_or(std::borrow::Cow::Borrowed("-"), |m| cut_short(m, 256));
    let error = error.map(|e| cut_short(e, MESSAGE_MAX));
    let path = cut_short(path, 1024);
    // Client-chosen too: a 60 KB x-request-id would make a 60 KB line, which the container
    // runtime splits (past 16 KiB) and a JSON log pipeline can then no longer parse.
    let request_id = obs
        .request_id
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .map_or(std::borrow::Cow::Borrowed("-"), |id| cut_short(id, 256));
    let sequence = obs
        .sequence
        .as_deref()
        .map_or(std::borrow::Cow::Borrowed("-"), |s| cut_short(s, 256));
    let line = crate::logformat::AccessLine {
        method,
        path: &path,
        protocol: obs.protocol.label(),
        model: &model,
        status,
        backend: obs.backend.as_deref().unwrap_or("-"),
        bytes_in: obs.bytes_in,
        bytes_out,
        duration_us: elapsed.as_micros() as u64,
        peer: &PeerOrDash(obs.peer),
        sequence_id: &sequence,
        traceparent: obs.traceparent.as_deref().unwrap_or("-"),
        request_id: &request_id,
        error: error.as_deref().unwrap_or("-"),
    };
    if !crate::logformat::write_access(level, &line) {
        crate::logformat::trace_access(level, &line);
    }
}

/// A successful probe: health, server and model metadata, readiness, configuration,
/// statistics and the repository index, which load balancers, Kubernetes and the gateways
/// in front poll. Their lines go at debug: every discovery round of every gateway asks
/// each model's metadata and readiness, and a worker behind a few gateways would log
/// dozens of such lines a second at info, drowning its inferences and errors.
fn is_probe(method: &str, path: &str, status: u32) -> bool {
    if method == "gRPC" {
        // gRPC's status 0 is OK.
        return status == 0
            && (path.starts_with("/grpc.health.v1.Health/")
                || path
                    .strip_prefix("/inference.GRPCInferenceService/")
                    .is_some_and(|m| {
                        matches!(
                            m,
                            "ServerLive"
                                | "ServerReady"
                                | "ModelReady"
                                | "ServerMetadata"
                                | "ModelMetadata"
                                | "ModelConfig"
                                | "ModelStatistics"
                                | "RepositoryIndex"
                        )
                    }));
    }
    if !(200..300).contains(&status) {
        return false;
    }
    match method {
        "GET" | "HEAD" => {
            path == "/v2"
                || path.starts_with("/v2/health/")
                || (path.starts_with("/v2/models/") && !path.ends_with("/infer"))
        }
        "POST" => path == "/v2/repository/index",
        _ => false,
    }
}

/// The address of the client a request came from: the server puts it in each request's
/// extensions, and the edges copy it into the observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub std::net::SocketAddr);

impl PeerAddr {
    pub fn of(extensions: &http::Extensions) -> Option<std::net::SocketAddr> {
        extensions.get::<PeerAddr>().map(|p| p.0)
    }
}

/// A peer address, or `-` without one, written without an allocation. An IPv4 address
/// (nearly every peer) is written digit by digit: std's `SocketAddr` formatting, octet by
/// octet through `core::fmt`, was 1.4% of the gateway's instructions per small request.
struct PeerOrDash(Option<std::net::SocketAddr>);

impl std::fmt::Display for PeerOrDash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(std::net::SocketAddr::V4(a)) => {
                // "255.255.255.255:65535" is 21 bytes.
                let mut text = [0u8; 21];
                let mut len = 0;
                let mut digits = itoa::Buffer::new();
                let mut put = |s: &[u8]| {
                    text[len..len + s.len()].copy_from_slice(s);
                    len += s.len();
                };
                for (i, octet) in a.ip().octets().into_iter().enumerate() {
                    if i > 0 {
                        put(b".");
                    }
                    put(digits.format(octet).as_bytes());
                }
                put(b":");
                put(digits.format(a.port()).as_bytes());
                f.write_str(std::str::from_utf8(&text[..len]).expect("ASCII digits"))
            }
            Some(a) => a.fmt(f),
            None => f.write_str("-"),
        }
    }
}

/// W3C trace context: the client's `traceparent` if valid, else a new one.
pub fn traceparent(incoming: Option<&http::HeaderValue>) -> http::HeaderValue {
    if let Some(v) = incoming {
        if valid_traceparent(v.as_bytes()) {
            return v.clone();
        }
    }
    // `00-{trace id: 32 hex}-{span id: 16 hex}-01`, written in place: three `format!`s were
    // 2.5% of the gateway's instructions per small request.
    let mut text = *b"00-00000000000000000000000000000000-0000000000000000-01";
    write_hex(&mut text[3..19], fastrand::u64(1..));
    write_hex(&mut text[19..35], fastrand::u64(..));
    write_hex(&mut text[36..52], fastrand::u64(1..));
    http::HeaderValue::from_bytes(&text).expect("hex is a valid header")
}

/// `v` as 16 lowercase hex digits into `out`.
fn write_hex(out: &mut [u8], v: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, d) in out.iter_mut().enumerate() {
        *d = DIGITS[((v >> (60 - 4 * i)) & 0xf) as usize];
    }
}

/// W3C Trace Context 3.2: `version-traceid-parentid-flags`, lowercase hex, ids not all zero,
/// version ff invalid; version 00 is exactly that long, a later one may carry more after a
/// `-`. Anything else is replaced, not passed on for the backend to trip over.
fn valid_traceparent(v: &[u8]) -> bool {
    let hex = |p: &[u8]| p.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let nonzero = |p: &[u8]| p.iter().any(|b| *b != b'0');
    if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return false;
    }
    let (version, trace, span, flags, rest) =
        (&v[..2], &v[3..35], &v[36..52], &v[53..55], &v[55..]);
    hex(version)
        && version != b"ff"
        && hex(trace)
        && nonzero(trace)
        && hex(span)
        && nonzero(span)
        && hex(flags)
        && (rest.is_empty() || (version != b"00" && rest[0] == b'-'))
}

#[cfg(test)]
mod tests {

    /// The fast IPv4 path writes what std writes; the others are std's.
    #[test]
    fn peers_are_written_as_std_writes_them() {
        for peer in [
            "127.0.0.1:1",
            "0.0.0.0:0",
            "255.255.255.255:65535",
            "10.20.3.40:8000",
            "[::1]:443",
            "[fe80::1%2]:80",
        ] {
            let addr: std::net::SocketAddr = match peer.parse() {
                Ok(a) => a,
                // A scope id is not parsed by every std; build it.
                Err(_) => std::net::SocketAddr::V6(std::net::SocketAddrV6::new(
                    "fe80::1".parse().unwrap(),
                    80,
                    0,
                    2,
                )),
            };
            assert_eq!(PeerOrDash(Some(addr)).to_string(), addr.to_string());
        }
        assert_eq!(PeerOrDash(None).to_string(), "-");
    }
    use super::*;

    /// Successful polls of health, metadata, readiness and the index log at debug; every
    /// inference, every failure and everything that changes state at info.
    #[test]
    fn successful_probes_are_told_apart() {
        for (method, path) in [
            ("GET", "/v2"),
            ("GET", "/v2/health/ready"),
            ("GET", "/v2/models/simple"),
            ("GET", "/v2/models/simple/versions/1/ready"),
            ("GET", "/v2/models/stats"),
            ("POST", "/v2/repository/index"),
        ] {
            assert!(is_probe(method, path, 200), "{method} {path}");
            assert!(!is_probe(method, path, 503), "{method} {path} failing");
        }
        assert!(is_probe("gRPC", "/grpc.health.v1.Health/Check", 0));
        assert!(is_probe(
            "gRPC",
            "/inference.GRPCInferenceService/ModelMetadata",
            0
        ));
        assert!(!is_probe(
            "gRPC",
            "/inference.GRPCInferenceService/ModelMetadata",
            5
        ));
        for (method, path) in [
            ("POST", "/v2/models/simple/infer"),
            ("POST", "/v2/repository/models/simple/load"),
            ("gRPC", "/inference.GRPCInferenceService/ModelInfer"),
            ("GET", "/metrics"),
        ] {
            assert!(!is_probe(method, path, 200), "{method} {path}");
        }
    }

    /// The wait moves from the backend call to the queue, and never more than the call took:
    /// the phases stay disjoint parts of the request.
    #[test]
    fn a_models_wait_moves_to_the_queue() {
        let mut obs = Observation::new(Protocol::Rest);
        obs.queue = Duration::from_micros(5);
        obs.compute_infer = Duration::from_micros(30);
        obs.count_as_queue(Duration::from_micros(12));
        assert_eq!(
            (obs.queue, obs.compute_infer),
            (Duration::from_micros(17), Duration::from_micros(18))
        );
        obs.count_as_queue(Duration::from_micros(50));
        assert_eq!(
            (obs.queue, obs.compute_infer),
            (Duration::from_micros(35), Duration::ZERO)
        );
    }

    #[test]
    fn traceparent_is_kept_or_created() {
        let good = http::HeaderValue::from_static(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        );
        assert_eq!(traceparent(Some(&good)), good);
        let made = traceparent(Some(&http::HeaderValue::from_static("garbage")));
        assert!(valid_traceparent(made.as_bytes()), "{made:?}");
        assert!(valid_traceparent(traceparent(None).as_bytes()));
        // Fresh ids differ from one another.
        assert_ne!(traceparent(None), traceparent(None));
        for (sent, valid) in [
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                true,
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
                false,
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                false,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                false,
            ),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                false,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
                false,
            ),
            (
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
                true,
            ),
            (
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
                false,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
                false,
            ),
        ] {
            assert_eq!(valid_traceparent(sent.as_bytes()), valid, "{sent}");
        }
    }

    #[test]
    fn hex_digits_are_written_most_significant_first() {
        let mut out = [0u8; 16];
        write_hex(&mut out, 0x0123_4567_89ab_cdef);
        assert_eq!(&out, b"0123456789abcdef");
        write_hex(&mut out, 1);
        assert_eq!(&out, b"0000000000000001");
    }

    #[test]
    fn failure_reasons_of_errors() {
        let backend = |status| GatewayError::Backend {
            status,
            message: String::new(),
        };
        let m = String::new;
        let cases = [
            (GatewayError::BadRequest(m()), FailureReason::Rejected),
            (GatewayError::NotFound(m()), FailureReason::Rejected),
            (GatewayError::Unavailable(m()), FailureReason::Rejected),
            (backend(StatusCode::BAD_REQUEST), FailureReason::Rejected),
            (
                backend(StatusCode::SERVICE_UNAVAILABLE),
                FailureReason::Backend,
            ),
            (
                backend(StatusCode::INTERNAL_SERVER_ERROR),
                FailureReason::Backend,
            ),
            (GatewayError::SequenceLost(m()), FailureReason::Backend),
            (GatewayError::BadGateway(m()), FailureReason::Backend),
            (GatewayError::Unreachable(m()), FailureReason::Backend),
            (GatewayError::Timeout(m()), FailureReason::Canceled),
            (GatewayError::Internal(m()), FailureReason::Other),
        ];
        for (e, want) in cases {
            assert_eq!(failure_of(&e), want, "{e:?}");
        }
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
