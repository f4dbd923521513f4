//! The REST edge: v2 over HTTP/1.1 and h2. Matches each path to a small handler, reads and
//! decodes bodies, and encodes what the gateway answers as JSON or binary tensors.

mod compress;
pub use compress::Compressible;
mod handlers;
mod infer;
pub mod routes;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};

use crate::body::{error_response, Body, BoxError};
use crate::body_budget::Reservation;
use crate::error::GatewayError;
use crate::gateway::inflate::{inflate, Coding, InflateError};
use crate::gateway::layers::{AuthLayer, Policy, ShedLayer};
use crate::gateway::{observe, Gateway, Raised, BACKEND_HEADER};
use routes::{Route, RouteError};

/// REST's part in the shared layers: health needs no token and is never shed, so that
/// probes keep telling the truth; a refusal is the JSON error (with `Retry-After` for a 503,
/// `WWW-Authenticate` for a 401), which `handle` observes like any other answer. Health is
/// what Triton's "health" protocol group holds: server liveness and readiness, and a model's
/// readiness (gRPC's ServerLive, ServerReady and ModelReady, exempt alike).
/// Inference is admitted once its body has arrived (`infer_exempt`, for the shedding layer):
/// a permit held while a client may still be sending, or not, would let a thousand silent
/// requests shed everyone else for a whole body-read timeout.
#[derive(Clone, Copy)]
struct RestPolicy {
    infer_exempt: bool,
}

impl Policy for RestPolicy {
    type Body = Body;

    fn exempt(&self, path: &str) -> bool {
        let path = path.strip_suffix('/').unwrap_or(path);
        // The path's shape is enough: another path ending so is answered at once (404).
        if self.infer_exempt && path.starts_with("/v2/models/") && path.ends_with("/infer") {
            return true;
        }
        matches!(path, "/v2/health/live" | "/v2/health/ready")
            || (path.starts_with("/v2/models/")
                && path.ends_with("/ready")
                && matches!(
                    routes::route(&http::Method::GET, path),
                    Ok(routes::Route::ModelReady { .. })
                ))
    }

    fn deny(&self, _: &Gateway, _: &str, _: &http::Extensions, e: GatewayError) -> Response<Body> {
        observed_error(&e)
    }
}

/// An error's answer, carrying the observation that makes its access line say why, as for
/// a handler's refusal.
fn observed_error(e: &GatewayError) -> Response<Body> {
    let obs = observe::Observation {
        failure: Some(observe::failure_of(e)),
        error: Some(e.short_message().into_owned()),
        ..Default::default()
    };
    let mut r = error_response(e);
    r.extensions_mut().insert(obs);
    r
}

type DispatchFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Response<Body>, std::convert::Infallible>> + Send>,
>;

/// The innermost service of the REST stack: a route's handler. Its observation travels back
/// to `handle` in the response's extensions.
/// Made for each request: the trail reaches the handler here, not through the request's
/// extensions (a map allocated per request).
#[derive(Clone)]
struct Dispatch {
    gw: Arc<Gateway>,
    trail: Option<Arc<observe::Trail>>,
}

impl tower::Service<Request<Body>> for Dispatch {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = DispatchFuture;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> DispatchFuture {
        let gw = self.gw.clone();
        let trail = self.trail.clone();
        Box::pin(async move {
            let mut obs = observe::Observation {
                trail,
                ..Default::default()
            };
            let mut response = match dispatch(&gw, req, &mut obs).await {
                Ok(r) => r,
                Err(e) => {
                    obs.failure = Some(observe::failure_of(&e));
                    obs.error = Some(e.short_message().into_owned());
                    error_response(&e)
                }
            };
            response.extensions_mut().insert(obs);
            Ok(response)
        })
    }
}

/// `peer`: the connection's, for the access log.
pub async fn handle<B>(
    gw: Arc<Gateway>,
    peer: Option<std::net::SocketAddr>,
    req: Request<B>,
) -> Response<Body>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    use tower::ServiceExt;
    let start = Instant::now();
    let _in_flight = Raised::new(gw.metrics.in_flight.clone());
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let is_infer = path.ends_with("/infer");
    let request_id = req.headers().get(&crate::gateway::REQUEST_ID).cloned();
    // Only an inference awaits long enough to be worth a trail.
    let trail = is_infer.then(|| Arc::new(observe::Trail::default()));
    let abandoned = observe::Abandoned::new(|| {
        went_away(
            &gw,
            &method,
            &path,
            (is_infer, trail.as_deref()),
            start,
            (request_id.clone(), peer),
        )
    });
    // One body type inside the stack, whatever the listener's.
    // RFC 9112 3.2: a server must refuse an HTTP/1.1 request without a Host (h2 has
    // :authority, HTTP/1.0 predates Host), before auth or shedding could answer otherwise.
    let missing_host =
        req.version() == http::Version::HTTP_11 && !req.headers().contains_key(header::HOST);
    let req = req.map(|b| b.map_err(Into::into).boxed_unsync());
    let handler = Dispatch {
        gw: gw.clone(),
        trail: trail.clone(),
    };
    let stack = tower::ServiceBuilder::new()
        .layer(AuthLayer::auth(
            gw.clone(),
            RestPolicy {
                infer_exempt: false,
            },
        ))
        .layer(ShedLayer::shed(
            gw.clone(),
            RestPolicy { infer_exempt: true },
        ))
        .service(handler);
    // Boxed here, where every type is concrete: rustc cannot prove an unboxed stack future
    // `Send` inside the listener's future (a higher-ranked lifetime limitation).
    let mut response = if missing_host {
        let mut r = observed_error(&GatewayError::BadRequest(
            "an HTTP/1.1 request must have a Host header (RFC 9112 3.2)".into(),
        ));
        // Its body, if it has one, is not read: the connection carries no other request.
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        r
    } else {
        let answer: DispatchFuture = Box::pin(stack.oneshot(req));
        match catch_panic(answer).await {
            Ok(r) => r,
            Err(never) => match never {},
        }
    };
    // None: a layer answered before the handler ran.
    let mut obs = response
        .extensions_mut()
        .remove::<observe::Observation>()
        .unwrap_or_default();
    // A refusal before the model was looked up (auth, shedding, an unreadable body) still
    // counts against the model its path names.
    if is_infer && obs.model.is_none() {
        model_of_path(&gw, &method, &path, &mut obs);
    } else if obs.model.is_none() {
        obs.model = model_named_by(&method, &path);
    }
    obs.request_id = request_id.clone();
    obs.peer = peer;
    // Errors too: a backend's 4xx or 5xx, a timeout or a lost sequence is exactly when
    // one needs to know which backend was involved.
    if let Some(v) = obs
        .backend
        .as_deref()
        .and_then(|b| HeaderValue::from_str(b).ok())
    {
        response.headers_mut().insert(BACKEND_HEADER, v);
    }
    let status = response.status();
    let elapsed = start.elapsed();
    let bytes_out = http_body::Body::size_hint(response.body())
        .exact()
        .unwrap_or(0);
    gw.metrics
        .requests
        .with_label_values(&[status.as_str()])
        .inc();
    if is_infer {
        observe::record_infer(&gw.metrics, &gw.stats, &obs, status, elapsed, bytes_out);
        // A model or version the gateway does not serve counts in no series, but its
        // access line still names what the path asked for.
        if obs.model.is_none() {
            if let Ok(Route::Infer { model, .. }) = routes::route(&method, &path) {
                obs.model = Some(model);
            }
        }
    }
    observe::access_log(
        method.as_str(),
        &path,
        &obs,
        u32::from(status.as_u16()),
        bytes_out,
        elapsed,
        obs.error.as_deref(),
    );
    abandoned.disarm();
    response
}

/// Runs the handler, a panic in it (our bug) turned into a 500 whose observation says so.
/// Caught here, inside `handle`, not only by the listener's outer layer: the unwind would
/// otherwise fire `Abandoned`, and the request be logged and counted as a client that went
/// away while its client got a 500.
async fn catch_panic(answer: DispatchFuture) -> Result<Response<Body>, std::convert::Infallible> {
    use futures_util::FutureExt;
    match std::panic::AssertUnwindSafe(answer).catch_unwind().await {
        Ok(answer) => answer,
        Err(panic) => {
            tracing::error!(
                panic = crate::error::panic_message(&*panic),
                "a request handler panicked; answered 500"
            );
            Ok(observed_error(&GatewayError::Internal(
                crate::error::PANICKED.into(),
            )))
        }
    }
}

/// A request that ended before its answer (hyper dropped its future): its access line and
/// counts, against its model if the gateway serves the one its path names. A client that
/// went away gets nginx's 499 and Triton's CANCELED; a request the shutdown cut off (the
/// drain deadline passed) a 503 and OTHER, the gateway's own doing.
fn went_away(
    gw: &Gateway,
    method: &http::Method,
    path: &str,
    (is_infer, trail): (bool, Option<&observe::Trail>),
    start: Instant,
    (request_id, peer): (Option<HeaderValue>, Option<std::net::SocketAddr>),
) {
    let mut obs = observe::Observation::new(observe::Protocol::Rest);
    obs.request_id = request_id;
    obs.peer = peer;
    if let Some(trail) = trail {
        trail.fill(&mut obs);
    }
    let elapsed = start.elapsed();
    let cut_off = gw.cut_off();
    let status = cut_off.status();
    gw.metrics
        .requests
        .with_label_values(&[status.as_str()])
        .inc();
    if is_infer {
        model_of_path(gw, method, path, &mut obs);
        obs.failure = Some(cut_off.reason());
        observe::record_infer(&gw.metrics, &gw.stats, &obs, status, elapsed, 0);
    }
    observe::access_log(
        method.as_str(),
        path,
        &obs,
        u32::from(status.as_u16()),
        0,
        elapsed,
        Some(cut_off.message()),
    );
}

/// The model a path other than inference names (metadata, readiness, configuration,
/// repository control, statistics), for its access line, which then says what it was about
/// as an inference's does. The name alone: such requests count in no model's series.
fn model_named_by(method: &http::Method, path: &str) -> Option<String> {
    match routes::route(method, path).ok()? {
        Route::ModelMetadata { model, .. }
        | Route::ModelReady { model, .. }
        | Route::ModelConfig { model, .. }
        | Route::RepositoryControl { model, .. } => Some(model),
        Route::Stats { model, .. } => model,
        _ => None,
    }
}

/// The model (and version) an inference's path names, for one the handler did not observe
/// (see `Gateway::observe_model`).
fn model_of_path(gw: &Gateway, method: &http::Method, path: &str, obs: &mut observe::Observation) {
    if let Ok(routes::Route::Infer { model, version }) = routes::route(method, path) {
        gw.observe_model(model, version, obs);
    }
}

async fn dispatch<B>(
    gw: &Gateway,
    req: Request<B>,
    obs: &mut observe::Observation,
) -> Result<Response<Body>, GatewayError>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let route = routes::route(req.method(), req.uri().path()).map_err(|e| match e {
        RouteError::NotFound => {
            GatewayError::NotFound(format!("no such endpoint: {}", req.uri().path()))
        }
        RouteError::MethodNotAllowed(allow) => {
            GatewayError::method_not_allowed(req.method(), req.uri().path(), allow)
        }
        RouteError::SharedMemory(what) => GatewayError::shared_memory(what),
        RouteError::BackendSetting(what) => GatewayError::backend_setting(what),
    })?;
    match route {
        Route::ServerMetadata => Ok(handlers::server_metadata(gw)),
        Route::Live => Ok(handlers::live()),
        Route::Ready => handlers::ready(gw),
        Route::RepositoryIndex => {
            let body = control_body(gw, req).await?;
            handlers::repository_index(gw, body.as_ref())
        }
        Route::RepositoryControl { model, action } => {
            let body = control_body(gw, req).await?;
            handlers::repository_control(gw, &model, action, body.as_ref(), obs).await
        }
        Route::Stats { model, version } => {
            handlers::stats(gw, model.as_deref(), version.as_deref())
        }
        Route::ModelMetadata { model, version } => {
            handlers::model_metadata(gw, &model, version.as_deref())
        }
        Route::ModelReady { model, version } => {
            handlers::model_ready(gw, &model, version.as_deref())
        }
        Route::ModelConfig { model, version } => {
            handlers::model_config(gw, &model, version.as_deref()).await
        }
        Route::Infer { model, version } => {
            let config = gw.config();
            // Refused here, before the core's lookup: `handle` still counts it against the
            // model the path names.
            // The body counts against the budget for bodies until its answer is ready.
            let mut held = gw.bodies.reserve();
            let (parts, body, header_length) = read_infer_body(&config, req, &mut held).await?;
            obs.bytes_in = body.len() as u64;
            obs.note();
            // Admitted once the body is here (`RestPolicy`), held until the answer.
            let _permit = gw.admit()?;
            infer::infer(
                gw,
                &config,
                &model,
                version.as_deref(),
                &parts,
                (body, header_length, &mut held),
                obs,
            )
            .await
        }
    }
}

/// An inference's head and whole body, with its `Inference-Header-Content-Length`, or why
/// they cannot be read (a content coding, a header, a body too large or too slow).
async fn read_infer_body<B>(
    config: &crate::config::Config,
    req: Request<B>,
    held: &mut Reservation,
) -> Result<(http::request::Parts, Bytes, Option<usize>), GatewayError>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let coding = content_coding(&req)?;
    let header_length = infer::check_header_length(
        req.headers(),
        config.limits.max_json_bytes,
        coding.is_some(),
    )?;
    let (parts, body) = req.into_parts();
    // A body without the binary extension is all JSON: it may be no larger than the JSON
    // limit, checked as it arrives (and inflates), not once it is all here.
    let (max_body, max_json) = (config.limits.max_body_bytes, config.limits.max_json_bytes);
    let limit = match header_length {
        None if max_json < max_body => Limit::Json(max_json),
        _ => Limit::Body(max_body),
    };
    let body = read_in_time(config, body, limit, held).await?;
    let Some(coding) = coding else {
        return Ok((parts, body, header_length));
    };
    let body = inflated(body, coding, limit, held).await?;
    Ok((parts, body, header_length))
}

/// The most bytes a request body may have, and the setting that says so.
#[derive(Clone, Copy, Debug)]
enum Limit {
    /// `limits.max_body_bytes` (or a repository request's own).
    Body(usize),
    /// `limits.max_json_bytes`, for a body that is all JSON.
    Json(usize),
}

impl Limit {
    fn max(self) -> usize {
        match self {
            Limit::Body(n) | Limit::Json(n) => n,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Limit::Body(_) => "limits.max_body_bytes",
            Limit::Json(_) => "limits.max_json_bytes",
        }
    }

    /// The 413 of a body past the limit: its declared length, where it said one.
    fn refusal(self, declared: Option<u64>) -> GatewayError {
        GatewayError::PayloadTooLarge(match (self, declared) {
            (Limit::Json(max), Some(n)) => {
                format!("the JSON request is {n} bytes; the limit is {max} (limits.max_json_bytes)")
            }
            (Limit::Json(max), None) => format!(
                "the JSON request is larger than the limit of {max} bytes (limits.max_json_bytes)"
            ),
            (Limit::Body(max), _) => {
                format!(
                    "request body is larger than the limit of {max} bytes (limits.max_body_bytes)"
                )
            }
        })
    }
}

/// A compressed body, inflated within `limit`, with the words of each refusal.
async fn inflated(
    compressed: Bytes,
    coding: Coding,
    limit: Limit,
    held: &mut Reservation,
) -> Result<Bytes, GatewayError> {
    inflate(compressed, coding, limit.max(), held)
        .await
        .map_err(|e| match e {
            InflateError::Invalid(why) => {
                // Raw deflate data (no zlib header) is the common mistake: say what is meant.
                let hint = match coding {
                    Coding::Deflate => "; HTTP's deflate is zlib's format (RFC 1950)",
                    Coding::Gzip => "",
                };
                GatewayError::BadRequest(format!(
                    "cannot read the request body: it is not valid {} (Content-Encoding): {why}{hint}",
                    coding.name()
                ))
            }
            InflateError::TooLarge => GatewayError::PayloadTooLarge(format!(
                "the request body inflates to more than {} bytes ({})",
                limit.max(),
                limit.name()
            )),
            InflateError::Refused(e) => e,
        })
}

/// Reads a whole body within `limits.body_read_timeout_ms`, refusing more than `limit`.
async fn read_in_time<B>(
    config: &crate::config::Config,
    body: B,
    limit: Limit,
    held: &mut Reservation,
) -> Result<Bytes, GatewayError>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let timeout = config.limits.body_read_timeout_ms;
    tokio::time::timeout(Duration::from_millis(timeout), read_body(body, limit, held))
        .await
        .map_err(|_| {
            GatewayError::RequestTimeout(format!(
                "the request body did not arrive within {timeout} ms (limits.body_read_timeout_ms)"
            ))
        })?
}

/// The largest body of a repository request: a small JSON object.
const CONTROL_BODY_LIMIT: usize = 64 << 10;

/// The JSON object a repository request may carry (`{"ready": true}` for the index,
/// `{"parameters": {...}}` for a load), or `None` for an empty body. Such bodies are small:
/// 64 KiB at most.
async fn control_body<B>(
    gw: &Gateway,
    req: Request<B>,
) -> Result<Option<serde_json::Value>, GatewayError>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let coding = content_coding(&req)?;
    let mut held = gw.bodies.reserve();
    let too_large = || {
        GatewayError::PayloadTooLarge(format!(
            "a repository request's body is limited to {} KiB",
            CONTROL_BODY_LIMIT >> 10
        ))
    };
    let limit = Limit::Body(CONTROL_BODY_LIMIT);
    let read = async {
        let bytes = read_in_time(&gw.config(), req.into_body(), limit, &mut held).await?;
        match coding {
            None => Ok(bytes),
            Some(coding) => inflated(bytes, coding, limit, &mut held).await,
        }
    };
    // Sent or inflated, past the limit: one refusal, in this request's words.
    let bytes = read.await.map_err(|e| match e {
        GatewayError::PayloadTooLarge(_) => too_large(),
        other => other,
    })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(v @ serde_json::Value::Object(_)) => Ok(Some(v)),
        Ok(_) => Err(GatewayError::BadRequest(
            "the request body must be a JSON object".into(),
        )),
        Err(e) => Err(GatewayError::BadRequest(format!(
            "the request body is not valid JSON: {e}"
        ))),
    }
}

/// The coding a body came in: gzip or deflate, inflated once it is all here
/// (`crate::gateway::inflate`), or none. `CanonicalCoding` has written those in the form
/// matched here; anything else is a coding we cannot decode. Triton answers 501 here; we
/// answer 415 (RFC 9110 15.5.16 allows it for an unsupported content coding), because the
/// client chose the coding and a client's error is never a 5xx.
fn content_coding<B>(req: &Request<B>) -> Result<Option<Coding>, GatewayError> {
    let mut values = req.headers().get_all(header::CONTENT_ENCODING).iter();
    match (values.next().map(|v| v.as_bytes()), values.next()) {
        (None, _) => Ok(None),
        (Some(b"gzip"), None) => Ok(Some(Coding::Gzip)),
        (Some(b"deflate"), None) => Ok(Some(Coding::Deflate)),
        _ => {
            let sent: Vec<_> = req
                .headers()
                .get_all(header::CONTENT_ENCODING)
                .iter()
                .map(|v| String::from_utf8_lossy(v.as_bytes()))
                .collect();
            let sent = sent.join(", ");
            // Stacked: two codings that are not identity (`br, identity` is one coding).
            let real = sent
                .split(',')
                .map(str::trim)
                .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("identity"))
                .count();
            Err(GatewayError::UnsupportedEncoding(if real > 1 {
                format!(
                    "unsupported Content-Encoding '{sent}': a body in more than one coding is \
                     not supported; send it in one of gzip, deflate or identity"
                )
            } else {
                format!("unsupported Content-Encoding '{sent}'; supported: gzip, deflate, identity")
            }))
        }
    }
}

/// Reads a whole request body as it came, refusing more than `limit`, and more than `held`
/// can hold of the gateway's budget for bodies.
async fn read_body<B>(body: B, limit: Limit, held: &mut Reservation) -> Result<Bytes, GatewayError>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let max = limit.max();
    // A Content-Length over the limit is refused before a byte of the body is read.
    let hint = http_body::Body::size_hint(&body);
    let expected = hint.lower();
    if expected > max as u64 {
        return Err(limit.refusal(hint.exact()));
    }
    let too_large = || limit.refusal(None);
    // One chunk is kept as it came (no copy). Several are copied, as they arrive, into one
    // buffer sized from Content-Length, so that each chunk, and the read buffer it pins, is
    // released at once: collecting them all and then joining them would hold every body
    // twice at its peak.
    let mut body = std::pin::pin!(Limited::new(body, max));
    let mut first: Option<Bytes> = None;
    let mut joined: Option<bytes::BytesMut> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                too_large()
            } else {
                // hyper's own message is vague ("error reading a body from connection");
                // its causes say what was wrong (a bad chunk size, a closed connection).
                let mut why = e.to_string();
                let mut source = e.source();
                while let Some(cause) = source {
                    why.push_str(&format!(": {cause}"));
                    source = cause.source();
                }
                GatewayError::BadRequest(format!("cannot read the request body: {why}"))
            }
        })?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers carry nothing for v2
        };
        if let Some(buf) = joined.as_mut() {
            held.hold(buf.len() + data.len())?;
            buf.extend_from_slice(&data);
        } else if let Some(head) = first.take() {
            held.hold(head.len() + data.len())?;
            let capacity =
                crate::body::initial_capacity(expected as usize).max(head.len() + data.len());
            let mut buf = bytes::BytesMut::with_capacity(capacity);
            buf.extend_from_slice(&head);
            buf.extend_from_slice(&data);
            joined = Some(buf);
        } else {
            held.hold(data.len())?;
            first = Some(data);
        }
    }
    Ok(joined
        .map(bytes::BytesMut::freeze)
        .or(first)
        .unwrap_or_default())
}

pub(crate) fn status_json(status: StatusCode, v: serde_json::Value) -> Response<Body> {
    crate::body::json_response(status, &v)
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body::Frame;
    use http_body_util::StreamBody;

    use super::*;

    fn chunked(
        parts: &[&'static [u8]],
    ) -> StreamBody<impl futures_util::Stream<Item = Result<Frame<Bytes>, Infallible>>> {
        let frames: Vec<Result<Frame<Bytes>, Infallible>> = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    /// A handler's panic is this request's 500, observed as the gateway's own failure, not
    /// as a client that went away (which the unwind would otherwise make of it).
    #[tokio::test]
    async fn a_handlers_panic_is_an_observed_500() {
        let bug = std::hint::black_box(true);
        let answer: DispatchFuture = Box::pin(async move {
            if bug {
                panic!("a bug in a handler");
            }
            Ok(error_response(&GatewayError::NotFound(String::new())))
        });
        let mut r = catch_panic(answer).await.unwrap();
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let obs = r.extensions_mut().remove::<observe::Observation>().unwrap();
        assert_eq!(obs.error.as_deref(), Some(crate::error::PANICKED));
        assert_eq!(
            obs.failure,
            Some(observe::failure_of(&GatewayError::Internal(String::new())))
        );
        let body = r.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            &body[..],
            br#"{"error":"internal error while handling this request"}"#
        );
    }

    #[tokio::test]
    async fn bodies_are_read_whole_and_within_the_limit() {
        let one = read_body(
            http_body_util::Full::new(Bytes::from_static(b"abc")),
            Limit::Body(10),
            &mut Reservation::default(),
        )
        .await
        .unwrap();
        assert_eq!(one, "abc");
        let joined = read_body(
            chunked(&[b"ab", b"", b"cde", b"f"]),
            Limit::Body(10),
            &mut Reservation::default(),
        )
        .await
        .unwrap();
        assert_eq!(joined, "abcdef");
        assert_eq!(
            read_body(chunked(&[]), Limit::Body(10), &mut Reservation::default())
                .await
                .unwrap(),
            ""
        );
        let over = read_body(
            chunked(&[b"abcdef", b"ghijk"]),
            Limit::Body(10),
            &mut Reservation::default(),
        )
        .await
        .unwrap_err();
        assert_eq!(
            over.message(),
            "request body is larger than the limit of 10 bytes (limits.max_body_bytes)"
        );
        // A declared length over the limit is refused before reading.
        let declared = read_body(
            http_body_util::Full::new(Bytes::from_static(&[0; 11])),
            Limit::Body(10),
            &mut Reservation::default(),
        )
        .await
        .unwrap_err();
        assert_eq!(declared.message(), over.message());
        // A body that is all JSON is held to the JSON limit, named with its length if it
        // declared one.
        let mut held = Reservation::default();
        let chunks = read_body(chunked(&[b"abcdef", b"ghijk"]), Limit::Json(10), &mut held);
        assert_eq!(
            chunks.await.unwrap_err().message(),
            "the JSON request is larger than the limit of 10 bytes (limits.max_json_bytes)"
        );
        let declared = read_body(
            http_body_util::Full::new(Bytes::from_static(&[0; 11])),
            Limit::Json(10),
            &mut held,
        );
        assert_eq!(
            declared.await.unwrap_err().message(),
            "the JSON request is 11 bytes; the limit is 10 (limits.max_json_bytes)"
        );
    }
}
