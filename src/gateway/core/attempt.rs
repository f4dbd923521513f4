//! Phases 3 to 6 of one inference: route, plan, attempt and retry, shape. What may be
//! retried elsewhere is a property of the backend's error (`BackendError::retry`).

use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use http_body_util::{BodyExt, Limited};
use tokio::time::Instant;

use super::plan::{self, adapt_request, Classification};
use super::shape::shape_response;
use super::{Original, Outcome};
use crate::body_budget::Reservation;
use crate::error::{GatewayError, MODEL_FAILURE};
use crate::fleet::backend::{
    error_message, BackendError, InferCall, Payload, Reply, Retry, WireBody,
};
use crate::fleet::{BackendHandle, CatalogEntry};
use crate::gateway::labels::Labels;
use crate::gateway::observe::{Observation, Phase, SHUT_DOWN};
use crate::gateway::Gateway;
use crate::headers::INFERENCE_HEADER_CONTENT_LENGTH;
use crate::pinstore::Claimed;
use crate::protocol::params::RequestOptions;
use crate::protocol::rest::decode::decode_backend_response;
use crate::protocol::rest::encode::{encode_request, CONTENT_TYPE_BINARY, CONTENT_TYPE_JSON};
use crate::protocol::{InferRequest, Limits, ModelMetadata, SequenceId};
use crate::routing::Route;

type BackendRoute = Route<BackendHandle>;

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

/// What one attempt on one backend needs to know.
pub(super) struct Attempt<'a> {
    pub gw: &'a Gateway,
    pub limits: &'a Limits,
    pub model: &'a str,
    pub version: Option<&'a str>,
    pub metadata: &'a ModelMetadata,
    pub req: &'a InferRequest,
    /// The request's options as routing reads them: its own, or without its sequence for a
    /// model that keeps no sequence state.
    pub routing: &'a RequestOptions,
    /// Whether the model's tensors start with a batch dimension, where a backend says.
    pub batches: Option<bool>,
    pub original: Option<Original<'a>>,
    pub deadline: Instant,
    /// What set `deadline`: a backend that overruns a configured one has failed, and
    /// passive health counts it (a hanging backend is ejected like a refusing one).
    pub deadline_set_by: super::DeadlineSource,
    pub response_limit: usize,
    /// `[models.NAME] retry_idempotent`: a stateless request whose connection closed before
    /// any answer may go to another backend.
    pub retry_idempotent: bool,
    /// Trace context and request id for the backend.
    pub headers: http::HeaderMap,
    /// Input tensor bytes that arrived in JSON and in binary form, for transcoding counts.
    pub json_in: u64,
    pub binary_in: u64,
    pub held: &'a Reservation,
}

/// How an attempt failed: `retry` says where else it may go; `rejected` when the backend
/// answered 400, refusing the request without acting on it.
struct Failure {
    error: GatewayError,
    retry: Retry,
    rejected: bool,
}

impl<E: Into<GatewayError>> From<E> for Failure {
    fn from(error: E) -> Self {
        Failure {
            error: error.into(),
            retry: Retry::Never,
            rejected: false,
        }
    }
}

impl Attempt<'_> {
    /// Routes, attempts, and retries what may be retried, once, on another backend.
    pub async fn run(
        &self,
        entry: &CatalogEntry,
        obs: &mut Observation,
    ) -> Result<Outcome, GatewayError> {
        let (gw, model, options) = (self.gw, self.model, self.routing);
        let labels = gw.labels.load();
        let in_sequence = options.sequence_id.is_some();
        let mut refused: Option<String> = None;
        let mut refusal: Option<GatewayError> = None;
        let store = gw.pin_store.as_ref().filter(|_| in_sequence);
        let mut must_claim = store.is_some_and(|s| s.before_route(&gw.router.pins, model, options));
        // The store's answer to this request's claim, if it made one and got one.
        let mut claimed: Option<Claimed> = None;
        // The catalog as this request sees it; newer after a catch-up.
        let mut entry = std::borrow::Cow::Borrowed(entry);
        loop {
            let mut route = match self.route(&entry, refused.as_deref()) {
                Ok(r) => r,
                // The backend that failed was the only one: its error is the answer.
                Err(e) => {
                    obs.retried_from = None;
                    return Err(refusal.unwrap_or(e));
                }
            };
            if let (Some(store), true) = (store, std::mem::take(&mut must_claim)) {
                let (pins, id) = (&gw.router.pins, self.sequence());
                let mark = pins.change_mark(model, id);
                claimed = store.claim(pins, model, id, &route.backend.key).await;
                if let Some(holder) = claimed
                    .as_ref()
                    .map(|c| c.holder.as_str())
                    .filter(|h| *h != route.backend.key)
                {
                    route = self
                        .follow_store(holder, &mut entry, route, refused.as_deref())
                        .await?;
                }
                pins.unconfirm_if_changed(model, id, mark);
            }
            let backend = route.backend.clone();
            // Routed by a pin: one this replica held, or one another replica stored for
            // this backend (the claim found it there).
            let followed_pin = route.followed_pin
                || claimed
                    .as_ref()
                    .is_some_and(|c| !c.created && c.holder == backend.key);
            let pinned_now = route.pinned_now;
            let pin_when_served = route.pin_when_served();
            let outcome = match self.on(&backend, &labels, obs).await {
                Err(f) if f.rejected && !route.fallbacks.is_empty() => {
                    self.fall_back(route, f, &labels, obs).await
                }
                other => other.map(|o| (o, None)),
            };
            let failure = match outcome {
                Ok((outcome, moved_to)) => {
                    if pin_when_served && moved_to.is_none() {
                        gw.router.pin(model, options, backend.as_ref());
                    }
                    gw.router.ended(model, options);
                    if let Some(store) = store {
                        let moved = moved_to.is_some();
                        let served = moved_to.unwrap_or(backend);
                        // Served somewhere the store does not hold: a past owner, a start
                        // whose stored backend this replica could not use, or a start the
                        // store did not answer for.
                        let elsewhere = match claimed.as_ref() {
                            Some(c) => c.holder != served.key,
                            // The store did not answer the start's claim: it is tried again.
                            None => options.sequence_start,
                        };
                        store
                            .served(
                                &gw.router.pins,
                                model,
                                options,
                                &served.key,
                                moved || elsewhere,
                            )
                            .await;
                    }
                    return Ok(outcome);
                }
                Err(f) => f,
            };
            // Inside a sequence only a start may move: any other request's state is on the
            // backend that failed.
            let may_move = !in_sequence || options.sequence_start;
            let retry = match failure.retry {
                Retry::Anywhere => may_move,
                // Running a stateless model twice has no effect a client can see.
                Retry::Idempotent => !in_sequence && self.retry_idempotent,
                Retry::Never => false,
            };
            if retry && refused.is_none() {
                tracing::info!(backend = %backend.name, error = %failure.error, "no answer from the backend; retrying on another");
                refused = Some(backend.key.clone());
                obs.retried_from = Some(backend.name.to_string());
                refusal = Some(failure.error);
                continue;
            }
            if failure.retry == Retry::Anywhere && !may_move {
                return Err(self
                    .lose_sequence(&backend, "is unavailable; the sequence's state is lost")
                    .await);
            }
            // Not for the in-process models: they are the server here (a worker's), and
            // answer an expired sequence as Triton does, with its 400.
            if failure.rejected
                && followed_pin
                && !options.sequence_start
                && !backend.backend.in_process()
                && forgot_the_sequence(failure.error.message())
            {
                // The backend that holds this live sequence answers that it does not know
                // it: it restarted (too fast for a health check to see it gone), or the
                // sequence sat idle past the backend's own timeout. Either way the state is
                // gone through no fault of the client's request: the same answer as for a
                // backend found gone.
                return Err(self
                    .lose_sequence(
                        &backend,
                        "no longer knows the sequence (it restarted, or the sequence was idle past its timeout); the sequence's state is lost",
                    )
                    .await);
            }
            if failure.rejected {
                // Refused (a continuation no backend knows, a bad start): the pins this
                // request made hold nothing. A client sending ids nothing accepts must not
                // fill the pin table, nor Redis for an idle timeout.
                if pinned_now {
                    gw.router.unpin(model, options);
                }
                if let (
                    Some(store),
                    Some(Claimed {
                        created: true,
                        holder,
                    }),
                ) = (store, &claimed)
                {
                    store.forget(model, self.sequence(), holder).await;
                }
            }
            return Err(failure.error);
        }
    }

    /// A live sequence whose state `backend` no longer holds (`why`): its pin goes, here and
    /// in the store, so that no replica sends it there again, and the answer says so.
    async fn lose_sequence(&self, backend: &BackendHandle, why: &str) -> GatewayError {
        let (gw, model, id) = (self.gw, self.model, self.sequence());
        gw.router.pins.remove(model, id);
        if let Some(store) = &gw.pin_store {
            store.forget(model, id, &backend.key).await;
        }
        crate::routing::sequence_lost(model, id, &backend.key, why)
    }

    /// The request's sequence id; called only inside a sequence.
    fn sequence(&self) -> &SequenceId {
        self.routing.sequence_id.as_ref().expect("in a sequence")
    }

    /// The route once the store answered that `holder`, not the route's backend, holds the
    /// sequence (another replica pinned it first, or an earlier sequence of a start's id).
    async fn follow_store(
        &self,
        holder: &str,
        entry: &mut std::borrow::Cow<'_, CatalogEntry>,
        route: BackendRoute,
        refused: Option<&str>,
    ) -> Result<BackendRoute, GatewayError> {
        let (gw, model, options) = (self.gw, self.model, self.routing);
        let (pins, id) = (&gw.router.pins, self.sequence());
        if !entry.ready.iter().any(|h| h.key == holder) {
            // It may know a backend that this replica has yet to discover.
            gw.catch_up(holder).await;
            if let Some(newer) = gw.fleet.catalog().get(model) {
                *entry = std::borrow::Cow::Owned(newer.clone());
            }
        }
        if !options.sequence_start {
            // Another replica pinned the sequence first: its choice is the pin.
            pins.insert(model, id, holder);
            return self.route(entry, refused);
        }
        match entry
            .ready
            .iter()
            .find(|h| h.key == holder && !h.health.is_ejected())
        {
            // A start of an id the store pins (an earlier sequence of that id, or another
            // replica's start): it resets the sequence wherever it runs, so it runs where
            // every replica's cached pin already sends the id. Moving it would leave replicas
            // that cached the old pin sending its next requests to the old state.
            Some(h) => {
                pins.insert(model, id, holder);
                Ok(Route {
                    backend: h.clone(),
                    fallbacks: Vec::new(),
                    pinned_now: true,
                    followed_pin: false,
                })
            }
            // Not usable here: the start runs on the route's backend, stored once served.
            None => Ok(route),
        }
    }

    fn route(
        &self,
        entry: &CatalogEntry,
        refused: Option<&str>,
    ) -> Result<BackendRoute, GatewayError> {
        let (router, options) = (&self.gw.router, self.routing);
        // During a rolling update some backends have a version and some not yet: a request
        // for a version goes to those that list it; and where backends serve the model with
        // other tensors, a request goes to those whose tensors it was checked against. Not
        // inside a sequence, whose backend is its pin or its hash owner over every backend of
        // the model; and when none fits, every backend may answer for itself.
        let checks =
            (self.version.is_some() || entry.mixed_tensors) && options.sequence_id.is_none();
        if checks {
            let unfit = |h: &BackendHandle| {
                self.version
                    .is_some_and(|v| h.lists_version(self.model, v) == Some(false))
                    || (entry.mixed_tensors && h.has_other_tensors(self.model, self.metadata))
            };
            // The usual case, every backend fitting, allocates nothing.
            if !entry.ready.iter().any(|h| unfit(h)) {
                return router.route(entry.choices(), self.model, options, refused);
            }
            let serving: Vec<_> = entry.ready.iter().filter(|h| !unfit(h)).cloned().collect();
            if !serving.is_empty() {
                let choices = crate::routing::Choices {
                    ready: &serving,
                    ..entry.choices()
                };
                return router.route(choices, self.model, options, refused);
            }
        }
        router.route(entry.choices(), self.model, options, refused)
    }

    /// One attempt on `backend`, with the classifications it needs from the gateway.
    async fn on(
        &self,
        backend: &BackendHandle,
        labels: &Labels,
        obs: &mut Observation,
    ) -> Result<Outcome, Failure> {
        obs.backend = Some(backend.name.clone());
        let classifications =
            plan::classifications(self.req, self.metadata, self.batches, backend, labels)?;
        self.call(backend, &classifications, obs).await
    }

    /// After the hash's backend rejected a sequence request this replica had no pin for,
    /// tries the sequence's owners under the model's past tables, in order, while they
    /// reject it too. A rejection (400) changed no state, so nothing runs twice. The one
    /// that serves the request becomes the sequence's pin (and is returned beside the
    /// answer); if none does, the first rejection is the answer.
    async fn fall_back(
        &self,
        route: BackendRoute,
        first: Failure,
        labels: &Labels,
        obs: &mut Observation,
    ) -> Result<(Outcome, Option<std::sync::Arc<BackendHandle>>), Failure> {
        let router = &self.gw.router;
        for past_owner in &route.fallbacks {
            tracing::info!(
                model = self.model,
                backend = %route.backend.name,
                past_owner = %past_owner.name,
                "sequence unknown to its hash owner; trying its owner before the last fleet change"
            );
            obs.retried_from = Some(route.backend.name.to_string());
            match self.on(past_owner, labels, obs).await {
                Ok(response) => {
                    router.pin(self.model, self.routing, past_owner.as_ref());
                    return Ok((response, Some(past_owner.clone())));
                }
                Err(f) if f.rejected => continue,
                Err(f) => return Err(f),
            }
        }
        // The caller forgets the pins this request made.
        obs.backend = Some(route.backend.name.clone());
        Err(first)
    }

    /// One call to one backend, and the shaping of its answer.
    async fn call(
        &self,
        backend: &BackendHandle,
        classifications: &[Classification],
        obs: &mut Observation,
    ) -> Result<Outcome, Failure> {
        // A deadline already past (a `timeout` of a few microseconds) is not worth a trip to
        // the backend. Nor is it left to the timer: tokio rounds deadlines up to the next
        // millisecond and polls the request first, so a fast backend would beat it.
        if Instant::now() >= self.deadline {
            return Err(GatewayError::Timeout(format!(
                "the request to model '{}' timed out ({})",
                self.model,
                self.deadline_set_by.describe(self.model)
            ))
            .into());
        }
        let caps = backend.capabilities();
        let in_process = backend.backend.in_process();
        // The client's own bytes go on unchanged when the backend handles all it asks.
        let passthrough = self.original.filter(|_| {
            !in_process && caps.binary && caps.exact_outputs && classifications.is_empty()
        });
        let encoding = Phase::start();
        let payload = if in_process {
            obs.json_to_binary += self.json_in;
            Payload::Decoded(self.req.clone())
        } else if let Some(original) = passthrough {
            Payload::Wire(original_body(original))
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
            headers: &self.headers,
            held: self.held.keep(),
        };
        let inferring = Phase::start();
        obs.note();
        let reply = self.bounded(backend, backend.backend.infer(call)).await;
        inferring.end(&mut obs.compute_infer);
        // An execution is a call that may have reached the backend: a refused connection
        // did not, a timed-out call may have.
        if !matches!(reply, Ok(Err(BackendError::Connect(_)))) {
            obs.backend_calls += 1;
        }
        let reply = reply?;
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                if e.counts_against_health() {
                    self.record_failure(backend);
                }
                return Err(Failure {
                    retry: e.retry(),
                    rejected: e.is_rejection(),
                    error: backend_error(backend, e),
                });
            }
        };
        match reply {
            Reply::Decoded {
                response: resp,
                queued,
            } => {
                backend.health.record_success();
                obs.count_as_queue(queued);
                let output = Phase::start();
                let response = self.shape(resp, backend, classifications, obs)?;
                output.end(&mut obs.compute_output);
                Ok(Outcome::Response {
                    response,
                    from_binary: true,
                })
            }
            Reply::Http {
                status,
                headers,
                body,
            } => {
                // A model's failure on this request (a tensorgate worker marks it) would
                // fail on any replica: it says nothing of the backend's health, and counting
                // it would let one client's input eject a whole fleet.
                let model_failed = headers.contains_key(&MODEL_FAILURE);
                if status.is_server_error() && !model_failed {
                    self.record_failure(backend);
                }
                if !status.is_success() {
                    if !status.is_server_error() {
                        backend.health.record_success();
                    }
                    let bytes = self
                        .read(backend, body, MAX_ERROR_BODY)
                        .await?
                        .unwrap_or_default();
                    return Err(Failure {
                        error: backend_status_error(
                            backend,
                            self.model,
                            status,
                            &bytes,
                            model_failed,
                        ),
                        retry: Retry::after_status(status),
                        rejected: status == StatusCode::BAD_REQUEST,
                    });
                }
                if passthrough.is_some() {
                    backend.health.record_success();
                    let mut response = http::Response::new(body);
                    *response.status_mut() = status;
                    *response.headers_mut() = headers;
                    return Ok(Outcome::PassThrough(response));
                }
                // A 200 whose body cannot be read or used is the backend failing as surely
                // as a 500: it counts toward ejection, or a backend that answers garbage
                // would keep its share of the traffic.
                let answer = self
                    .use_answer(backend, &headers, body, classifications, obs)
                    .await;
                match &answer {
                    Err(GatewayError::BadGateway(_)) => self.record_failure(backend),
                    Err(_) => {}
                    Ok(_) => backend.health.record_success(),
                }
                Ok(answer?)
            }
        }
    }

    /// Reads, decodes and shapes a backend's successful answer.
    async fn use_answer(
        &self,
        backend: &BackendHandle,
        headers: &http::HeaderMap,
        body: super::BackendBody,
        classifications: &[Classification],
        obs: &mut Observation,
    ) -> Result<Outcome, GatewayError> {
        let inferring = Phase::start();
        let bytes = self.read(backend, body, self.response_limit).await;
        inferring.end(&mut obs.compute_infer);
        let bytes = bytes?.map_err(|e| {
            GatewayError::BadGateway(format!(
                "backend '{}': reading its response failed: {e}",
                backend.name
            ))
        })?;
        let output = Phase::start();
        let hl = headers
            .get(&INFERENCE_HEADER_CONTENT_LENGTH)
            .map(HeaderValue::as_bytes);
        let (resp, tolerated) = decode_backend_response(&bytes, hl, self.limits).map_err(|e| {
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
        let from_binary = hl.is_some();
        let response = self.shape(resp, backend, classifications, obs)?;
        output.end(&mut obs.compute_output);
        Ok(Outcome::Response {
            response,
            from_binary,
        })
    }

    /// Phase 6 for an answer `backend` gave.
    fn shape(
        &self,
        resp: crate::protocol::InferResponse,
        backend: &BackendHandle,
        classifications: &[Classification],
        obs: &mut Observation,
    ) -> Result<crate::protocol::InferResponse, GatewayError> {
        shape_response(
            self.req,
            resp,
            (&backend.name, self.metadata),
            classifications,
            obs,
        )
    }

    fn record_failure(&self, backend: &BackendHandle) {
        if backend.health.record_failure(&self.gw.fleet.ejection) {
            tracing::warn!(backend = %backend.name, "backend ejected after consecutive failures");
        }
    }

    /// The deadline passed while `backend` had the request.
    fn timed_out(&self, backend: &BackendHandle) -> GatewayError {
        if self.deadline_set_by.is_configured() {
            self.record_failure(backend);
        }
        GatewayError::Timeout(format!(
            "the request to model '{}' timed out on backend '{}' ({})",
            self.model,
            backend.name,
            self.deadline_set_by.describe(self.model)
        ))
    }

    /// Reads a body within the deadline.
    async fn read(
        &self,
        backend: &BackendHandle,
        body: super::BackendBody,
        limit: usize,
    ) -> Result<Result<Bytes, String>, GatewayError> {
        let read = Limited::new(body, limit).collect();
        let r = self.bounded(backend, read).await?;
        Ok(r.map(|c| c.to_bytes()).map_err(|e| e.to_string()))
    }

    /// Waits for `work` on `backend` until the deadline passes or the shutdown cuts the
    /// requests still in flight.
    async fn bounded<T>(
        &self,
        backend: &BackendHandle,
        work: impl std::future::Future<Output = T>,
    ) -> Result<T, GatewayError> {
        tokio::select! {
            r = tokio::time::timeout_at(self.deadline, work) => r.map_err(|_| self.timed_out(backend)),
            () = self.gw.cut() => Err(GatewayError::Unavailable(SHUT_DOWN.to_string())),
        }
    }
}

fn original_body(original: Original<'_>) -> WireBody {
    WireBody {
        parts: vec![original.body.clone()],
        content_type: if original.header_length.is_some() {
            CONTENT_TYPE_BINARY
        } else {
            CONTENT_TYPE_JSON
        },
        header_length: original.header_length,
    }
}

fn backend_error(backend: &BackendHandle, e: BackendError) -> GatewayError {
    match e {
        BackendError::Connect(m) => {
            GatewayError::Unreachable(format!("backend '{}': {m}", backend.name))
        }
        BackendError::Reset(m) | BackendError::Failed(m) => {
            GatewayError::BadGateway(format!("backend '{}': {m}", backend.name))
        }
        BackendError::Rejected(m) => GatewayError::BadRequest(m),
        BackendError::Broken(m) => GatewayError::ModelFailed(m),
        BackendError::Status { status, message } => GatewayError::Backend { status, message },
    }
}

/// A backend's 4xx is the client's error and goes back as it came, but for a 404 (503) and
/// a 413 (502), which name the backend. A 5xx is the backend's fault and says which backend.
/// `model_failed`: a tensorgate worker marked the 5xx as a model's failure on the request.
fn backend_status_error(
    backend: &BackendHandle,
    model: &str,
    status: StatusCode,
    body: &Bytes,
    model_failed: bool,
) -> GatewayError {
    let message = error_message(body);
    // Not the client's error though a 4xx: the gateway found the model, so a backend that
    // lacks it is out of date; and the request passed the gateway's own size limits, so a
    // backend that refuses what the gateway sent (transcoded to JSON for a backend that takes
    // nothing else, say) as too large has a lower limit than the deployment needs.
    let not_the_clients = match status {
        StatusCode::NOT_FOUND => Some((
            StatusCode::SERVICE_UNAVAILABLE,
            format!("no longer serves model '{model}' (it answered 404: {message}); the gateway learns it at the next refresh"),
        )),
        StatusCode::PAYLOAD_TOO_LARGE => Some((
            StatusCode::BAD_GATEWAY,
            format!("refused the request as the gateway sent it as too large (413: {message}); its limit is below the gateway's"),
        )),
        _ => None,
    };
    if let Some((status, why)) = not_the_clients {
        return GatewayError::Backend {
            status,
            message: format!("backend '{}' {why}", backend.name),
        };
    }
    if status.is_client_error() {
        return GatewayError::Backend { status, message };
    }
    let message = format!("backend '{}': {message}", backend.name);
    if model_failed {
        GatewayError::ModelFailed(message)
    } else {
        GatewayError::Backend { status, message }
    }
}

/// Whether a backend's refusal says it does not know the request's sequence: Triton's words
/// for a continuation of a sequence it holds no state for, which tensorgate's workers use too.
fn forgot_the_sequence(message: &str) -> bool {
    message.contains("must specify the START flag")
}
