//! The forward path of one inference: decode → validate → pick a backend → adapt the
//! encoding → forward (retrying a refused connection once) → adapt the response → reply.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use tokio::time::Instant;

use super::classification::{self, Classification};
use super::handlers::lookup;
use super::labels::Labels;
use super::observe::{traceparent, Observation, Phase};
use super::respond::{adapt_request, client_response};
use super::Gateway;
use crate::body::Body;
use crate::config::Config;
use crate::error::GatewayError;
use crate::fleet::backend::{error_message, BackendError, InferCall, Payload, Reply, WireBody};
use crate::fleet::BackendHandle;
use crate::protocol::encode::{CONTENT_TYPE_BINARY, CONTENT_TYPE_JSON};
use crate::protocol::{
    decode_backend_response, decode_request, encode_request, expand_raw, validate_request,
    InferRequest, Limits, ModelMetadata, RequestBody, HEADER_CONTENT_LENGTH,
};
use crate::routing::Route;

pub const BACKEND_HEADER: &str = "x-tensorgate-backend";

/// Backend error bodies are read up to this size.
const MAX_ERROR_BODY: usize = 64 << 10;

/// Counts a request as outstanding on its backend for as long as it lives.
struct Outstanding<'a>(&'a BackendHandle);

impl<'a> Outstanding<'a> {
    fn new(h: &'a BackendHandle) -> Self {
        h.outstanding.fetch_add(1, Ordering::Relaxed);
        Outstanding(h)
    }
}

impl Drop for Outstanding<'_> {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The request's deadline: the model's timeout or the default, shortened by the v2 `timeout`
/// parameter (microseconds; 0 means none, as in Triton).
fn deadline(config: &Config, model: &str, req: &InferRequest) -> Instant {
    let configured = config
        .model(model)
        .and_then(|m| m.timeout_ms)
        .map(Duration::from_millis)
        .unwrap_or_else(|| config.limits.request_timeout());
    let wanted = req
        .options
        .timeout_us
        .filter(|us| *us > 0)
        .map(Duration::from_micros);
    Instant::now() + wanted.map_or(configured, |w| w.min(configured))
}

/// What one attempt on one backend needs to know.
struct Attempt<'a> {
    gw: &'a Gateway,
    limits: &'a Limits,
    model: &'a str,
    version: Option<&'a str>,
    metadata: &'a ModelMetadata,
    req: &'a InferRequest,
    body: &'a Bytes,
    header_length: Option<&'a [u8]>,
    deadline: Instant,
    response_limit: usize,
    /// Trace context and request id for the backend.
    headers: http::HeaderMap,
    /// Input tensor bytes that arrived in JSON and in binary form, for transcoding counts.
    json_in: u64,
    binary_in: u64,
}

/// How an attempt failed: `retryable` when nothing reached the backend; `rejected` when the
/// backend answered 400, refusing the request without acting on it.
struct Failure {
    error: GatewayError,
    retryable: bool,
    rejected: bool,
}

impl<E: Into<GatewayError>> From<E> for Failure {
    fn from(error: E) -> Self {
        Failure {
            error: error.into(),
            retryable: false,
            rejected: false,
        }
    }
}

pub async fn infer(
    gw: &Gateway,
    config: &Config,
    model: &str,
    version: Option<&str>,
    parts: &Parts,
    body: Bytes,
    obs: &mut Observation,
) -> Result<Response<Body>, GatewayError> {
    let queued = Phase::start();
    let entry = lookup(gw, model, version)?;
    // `lookup` let through only a version the model lists.
    let versions = &entry.metadata.versions;
    let label_version = version
        .or(versions.first().map(String::as_str))
        .unwrap_or_default()
        .to_string();
    let pending = gw
        .metrics
        .nv_pending
        .with_label_values(&[model, &label_version]);
    let _pending = super::Raised::new(pending);
    obs.model = Some(model.to_string());
    obs.version = Some(label_version);
    let decoding = Phase::start();
    let limits = config.limits.protocol();
    let header_length = parts
        .headers
        .get(HEADER_CONTENT_LENGTH)
        .map(HeaderValue::as_bytes);
    let (req, binary_in) = match decode_request(&body, header_length, &limits)? {
        RequestBody::Message(r) => {
            let json_len =
                header_length.and_then(|h| std::str::from_utf8(h).ok()?.trim().parse::<u64>().ok());
            let binary = json_len.map_or(0, |n| body.len() as u64 - n);
            (r, binary)
        }
        RequestBody::Raw(data) => (
            expand_raw(data, &entry.metadata, &limits)?,
            body.len() as u64,
        ),
    };
    validate_request(&req, &entry.metadata)?;
    obs.sequence = req
        .options
        .sequence_id
        .as_ref()
        .map(crate::routing::describe_sequence);
    obs.batch = batch_size(&req, &entry.metadata);
    let total_in: u64 = req.inputs.iter().map(|t| t.data.len() as u64).sum();
    let mut headers = http::HeaderMap::new();
    let trace = traceparent(parts.headers.get("traceparent"));
    obs.traceparent = trace.to_str().ok().map(String::from);
    headers.insert("traceparent", trace);
    if let Some(id) = parts.headers.get(super::REQUEST_ID) {
        headers.insert(super::REQUEST_ID, id.clone());
    }
    decoding.end(&mut obs.compute_input);
    let attempt = Attempt {
        gw,
        limits: &limits,
        model,
        version,
        metadata: &entry.metadata,
        req: &req,
        body: &body,
        header_length,
        deadline: deadline(config, model, &req),
        response_limit: config.limits.max_body_bytes.saturating_mul(4),
        headers,
        json_in: total_in.saturating_sub(binary_in),
        binary_in,
    };
    queued.end(&mut obs.queue);
    obs.queue = obs.queue.saturating_sub(obs.compute_input);
    let labels = gw.labels.load();
    let mut refused: Option<String> = None;
    let mut refusal: Option<GatewayError> = None;
    loop {
        let route = match gw
            .router
            .route(&entry, model, &req.options, refused.as_deref())
        {
            Ok(r) => r,
            // The backend that refused was the only one: its error is the answer.
            Err(e) => {
                obs.retried_from = None;
                return Err(refusal.unwrap_or(e));
            }
        };
        let backend = route.backend.clone();
        let outcome = match attempt.on(&backend, &labels, obs).await {
            Err(f) if f.rejected && !route.fallbacks.is_empty() => {
                attempt.fall_back(route, f, &labels, obs).await
            }
            other => other,
        };
        match outcome {
            // The gateway adds the backend's name to the response, error or not.
            Ok(response) => return Ok(response),
            // Only a request whose connection was refused before any byte was sent is
            // retried, once, elsewhere: inference is not idempotent. Inside a sequence only
            // a start may move; any other request's state is on the refusing backend.
            Err(f)
                if f.retryable
                    && refused.is_none()
                    && (req.options.sequence_id.is_none() || req.options.sequence_start) =>
            {
                tracing::info!(backend = %backend.name, error = %f.error, "connection refused; retrying on another backend");
                refused = Some(backend.key.clone());
                obs.retried_from = Some(backend.name.clone());
                refusal = Some(f.error);
            }
            Err(f)
                if f.retryable
                    && req.options.sequence_id.is_some()
                    && !req.options.sequence_start =>
            {
                let id = req.options.sequence_id.as_ref().expect("checked above");
                gw.router.pins.remove(model, id);
                return Err(GatewayError::Unavailable(format!(
                    "the backend of sequence {} of model '{model}' ({}) is unavailable; the sequence's state is lost",
                    crate::routing::describe_sequence(id),
                    backend.key
                )));
            }
            Err(f) => return Err(f.error),
        }
    }
}

impl Attempt<'_> {
    /// One attempt on `backend`, with the classifications it needs from the gateway.
    async fn on(
        &self,
        backend: &BackendHandle,
        labels: &Labels,
        obs: &mut Observation,
    ) -> Result<Response<Body>, Failure> {
        obs.backend = Some(backend.name.clone());
        let classifications = classification::plan(self.req, self.metadata, backend, labels)?;
        self.run(backend, &classifications, obs).await
    }

    /// After the hash's backend rejected a sequence request this replica had no pin for,
    /// tries the sequence's owners under the model's past tables, in order, while they
    /// reject it too. A rejection (400) changed no state, so nothing runs twice. The one
    /// that serves the request becomes the sequence's pin; if none does, the first
    /// rejection is the answer.
    async fn fall_back(
        &self,
        route: Route,
        first: Failure,
        labels: &Labels,
        obs: &mut Observation,
    ) -> Result<Response<Body>, Failure> {
        let router = &self.gw.router;
        for past_owner in &route.fallbacks {
            tracing::info!(
                model = self.model,
                backend = %route.backend.name,
                past_owner = %past_owner.name,
                "sequence unknown to its hash owner; trying its owner before the last fleet change"
            );
            obs.retried_from = Some(route.backend.name.clone());
            match self.on(past_owner, labels, obs).await {
                Ok(response) => {
                    router.pin(self.model, &self.req.options, past_owner);
                    return Ok(response);
                }
                Err(f) if f.rejected => continue,
                Err(f) => return Err(f),
            }
        }
        router.unpin(self.model, &self.req.options);
        obs.backend = Some(route.backend.name.clone());
        Err(first)
    }

    async fn run(
        &self,
        backend: &BackendHandle,
        classifications: &[Classification],
        obs: &mut Observation,
    ) -> Result<Response<Body>, Failure> {
        // A deadline already past (a `timeout` of a few microseconds) is not worth a trip to
        // the backend. Nor is it left to the timer: tokio rounds deadlines up to the next
        // millisecond and polls the request first, so a fast backend would beat it.
        if Instant::now() >= self.deadline {
            return Err(self.timeout().into());
        }
        let caps = backend.capabilities();
        let in_process = backend.backend.in_process();
        // The client's own bytes go on unchanged when the backend handles all it asks.
        let passthrough =
            !in_process && caps.binary && caps.exact_outputs && classifications.is_empty();
        let encoding = Phase::start();
        let payload = if in_process {
            obs.json_to_binary += self.json_in;
            Payload::Decoded(self.req.clone())
        } else if passthrough {
            Payload::Wire(original_body(self.body.clone(), self.header_length))
        } else {
            if caps.binary {
                obs.json_to_binary += self.json_in;
            } else {
                obs.binary_to_json += self.binary_in;
            }
            let encoded =
                encode_request(&adapt_request(self.req, caps, classifications), caps.binary)
                    .map_err(|e| {
                        // Only JSON can fail here, and only for data JSON cannot carry.
                        e.with_hint(&format!(
                            "backend '{}' takes JSON only (no binary tensor extension)",
                            backend.name
                        ))
                    })?;
            Payload::Wire(encoded.into())
        };
        encoding.end(&mut obs.compute_input);
        let _outstanding = Outstanding::new(backend);
        let call = InferCall {
            model: self.model,
            version: self.version,
            payload,
            headers: self.headers.clone(),
        };
        let inferring = Phase::start();
        let reply = tokio::time::timeout_at(self.deadline, backend.backend.infer(call)).await;
        inferring.end(&mut obs.compute_infer);
        // An execution is a call that may have reached the backend: a refused connection
        // did not, a timed-out call may have.
        if !matches!(reply, Ok(Err(BackendError::Connect(_)))) {
            obs.backend_calls += 1;
        }
        let reply = reply.map_err(|_| self.timeout())?;
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                let retryable = matches!(e, BackendError::Connect(_));
                let rejected = match &e {
                    BackendError::Rejected(_) => true,
                    BackendError::Status { status, .. } => *status == StatusCode::BAD_REQUEST,
                    _ => false,
                };
                if matches!(e, BackendError::Connect(_) | BackendError::Failed(_)) {
                    self.record_failure(backend);
                }
                return Err(Failure {
                    error: backend_error(backend, e),
                    retryable,
                    rejected,
                });
            }
        };
        match reply {
            Reply::Decoded(resp) => {
                backend.health.record_success();
                let output = Phase::start();
                let r = client_response(self.req, resp, &backend.name, classifications, true, obs)?;
                output.end(&mut obs.compute_output);
                Ok(r)
            }
            Reply::Http {
                status,
                headers,
                body,
            } => {
                if status.is_server_error() {
                    self.record_failure(backend);
                } else {
                    backend.health.record_success();
                }
                if !status.is_success() {
                    let bytes = self.read(body, MAX_ERROR_BODY).await?.unwrap_or_default();
                    return Err(Failure {
                        error: backend_status_error(backend, status, &bytes),
                        retryable: false,
                        rejected: status == StatusCode::BAD_REQUEST,
                    });
                }
                if passthrough {
                    return Ok(pass_through(status, &headers, body));
                }
                let inferring = Phase::start();
                let bytes = self.read(body, self.response_limit).await;
                inferring.end(&mut obs.compute_infer);
                let bytes = bytes?.map_err(|e| {
                    GatewayError::BadGateway(format!(
                        "backend '{}': reading its response failed: {e}",
                        backend.name
                    ))
                })?;
                let output = Phase::start();
                let hl = headers
                    .get(HEADER_CONTENT_LENGTH)
                    .map(HeaderValue::as_bytes);
                let (resp, tolerated) =
                    decode_backend_response(&bytes, hl, self.limits).map_err(|e| {
                        GatewayError::BadGateway(format!(
                            "backend '{}' sent an invalid response: {e}",
                            backend.name
                        ))
                    })?;
                for t in tolerated.iter() {
                    self.gw
                        .metrics
                        .backend_tolerated
                        .with_label_values(&[&backend.name, t.label()])
                        .inc();
                }
                let r = client_response(
                    self.req,
                    resp,
                    &backend.name,
                    classifications,
                    hl.is_some(),
                    obs,
                )?;
                output.end(&mut obs.compute_output);
                Ok(r)
            }
        }
    }

    fn record_failure(&self, backend: &BackendHandle) {
        if backend.health.record_failure(&self.gw.fleet.ejection) {
            tracing::warn!(backend = %backend.name, "backend ejected after consecutive failures");
        }
    }

    fn timeout(&self) -> GatewayError {
        GatewayError::Timeout(format!("the request to model '{}' timed out", self.model))
    }

    /// Reads a body within the deadline.
    async fn read(
        &self,
        body: hyper::body::Incoming,
        limit: usize,
    ) -> Result<Result<Bytes, String>, GatewayError> {
        let read = Limited::new(body, limit).collect();
        match tokio::time::timeout_at(self.deadline, read).await {
            Ok(r) => Ok(r.map(|c| c.to_bytes()).map_err(|e| e.to_string())),
            Err(_) => Err(self.timeout()),
        }
    }
}

fn original_body(body: Bytes, header_length: Option<&[u8]>) -> WireBody {
    let header_length = header_length
        .and_then(|h| std::str::from_utf8(h).ok())
        .and_then(|s| s.trim().parse().ok());
    WireBody {
        parts: vec![body],
        content_type: if header_length.is_some() {
            CONTENT_TYPE_BINARY
        } else {
            CONTENT_TYPE_JSON
        },
        header_length,
    }
}

fn pass_through(
    status: StatusCode,
    headers: &http::HeaderMap,
    body: hyper::body::Incoming,
) -> Response<Body> {
    let mut r = Response::builder().status(status);
    for name in [header::CONTENT_TYPE, header::CONTENT_LENGTH] {
        if let Some(v) = headers.get(&name) {
            r = r.header(name, v);
        }
    }
    if let Some(v) = headers.get(HEADER_CONTENT_LENGTH) {
        r = r.header(HEADER_CONTENT_LENGTH, v);
    }
    r.body(body.map_err(Into::into).boxed_unsync())
        .expect("valid response parts")
}

fn backend_error(backend: &BackendHandle, e: BackendError) -> GatewayError {
    match e {
        BackendError::Connect(m) | BackendError::Failed(m) => {
            GatewayError::BadGateway(format!("backend '{}': {m}", backend.name))
        }
        BackendError::Rejected(m) => GatewayError::BadRequest(m),
        BackendError::Broken(m) => GatewayError::Internal(m),
        BackendError::Status { status, message } => GatewayError::Backend { status, message },
    }
}

/// A backend's 4xx is the client's error and goes back as it came; a 5xx is the backend's
/// fault and says which backend.
fn backend_status_error(backend: &BackendHandle, status: StatusCode, body: &Bytes) -> GatewayError {
    let message = error_message(body);
    if status.is_client_error() {
        GatewayError::Backend { status, message }
    } else {
        GatewayError::Backend {
            status,
            message: format!("backend '{}': {message}", backend.name),
        }
    }
}

/// Inferences in a request: the first input's first dimension when the model's shape starts
/// with a batch dimension (-1, rank two or more), else one.
fn batch_size(req: &InferRequest, model: &crate::protocol::ModelMetadata) -> u64 {
    req.inputs
        .first()
        .and_then(|t| {
            let meta = model.input(&t.name)?;
            (meta.shape.len() >= 2 && meta.shape[0] == -1).then(|| t.shape.first().copied())?
        })
        .unwrap_or(1)
}
