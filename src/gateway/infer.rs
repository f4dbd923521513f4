//! The forward path of one inference: validate → pick a backend → adapt the encoding →
//! forward → adapt the response → reply.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use tokio::time::Instant;

use super::classification;
use super::handlers::lookup;
use super::respond::{adapt_request, client_response};
use super::Gateway;
use crate::body::Body;
use crate::error::GatewayError;
use crate::fleet::backend::{error_message, BackendError, InferCall, Payload, Reply, WireBody};
use crate::fleet::BackendHandle;
use crate::protocol::encode::{CONTENT_TYPE_BINARY, CONTENT_TYPE_JSON};
use crate::protocol::{
    decode_request, decode_response, encode_request, expand_raw, validate_request, InferRequest,
    RequestBody, HEADER_CONTENT_LENGTH,
};
use crate::routing;

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
/// parameter (microseconds).
fn deadline(gw: &Gateway, model: &str, req: &InferRequest) -> Instant {
    let configured = gw
        .config
        .model(model)
        .and_then(|m| m.timeout_ms)
        .map(Duration::from_millis)
        .unwrap_or_else(|| gw.config.limits.request_timeout());
    let wanted = req.options.timeout_us.map(Duration::from_micros);
    Instant::now() + wanted.map_or(configured, |w| w.min(configured))
}

pub async fn infer(
    gw: &Gateway,
    model: &str,
    version: Option<&str>,
    parts: &Parts,
    body: Bytes,
) -> Result<Response<Body>, GatewayError> {
    let entry = lookup(gw, model, version)?;
    let header_length = parts
        .headers
        .get(HEADER_CONTENT_LENGTH)
        .map(HeaderValue::as_bytes);
    let req = match decode_request(&body, header_length, &gw.limits)? {
        RequestBody::Message(r) => r,
        RequestBody::Raw(data) => expand_raw(data, &entry.metadata, &gw.limits)?,
    };
    validate_request(&req, &entry.metadata)?;
    let deadline = deadline(gw, model, &req);

    let backend =
        routing::pick(&entry.ready, model, req.options.sequence_id.as_ref()).ok_or_else(|| {
            GatewayError::Unavailable(format!("no healthy backend serves model '{model}'"))
        })?;
    let caps = backend.capabilities();
    let in_process = backend.backend.in_process();
    let classifications = classification::plan(&req, &entry.metadata, &backend, &gw.labels)?;
    // The client's own bytes go on unchanged when the backend handles everything they ask.
    let passthrough =
        !in_process && caps.binary && caps.exact_outputs && classifications.is_empty();
    let payload = if in_process {
        Payload::Decoded(req.clone())
    } else if passthrough {
        Payload::Wire(original_body(body, header_length))
    } else {
        Payload::Wire(
            encode_request(&adapt_request(&req, caps, &classifications), caps.binary)?.into(),
        )
    };

    let _outstanding = Outstanding::new(&backend);
    let call = InferCall {
        model,
        version,
        payload,
        headers: http::HeaderMap::new(),
    };
    let reply = tokio::time::timeout_at(deadline, backend.backend.infer(call))
        .await
        .map_err(|_| timeout_error(model))?
        .map_err(|e| backend_error(&backend, e))?;

    let mut response = match reply {
        Reply::Decoded(resp) => client_response(&req, resp, &backend.name, &classifications)?,
        Reply::Http {
            status,
            headers,
            body,
        } => {
            if !status.is_success() {
                let bytes = tokio::time::timeout_at(deadline, read_limited(body, MAX_ERROR_BODY))
                    .await
                    .map_err(|_| timeout_error(model))?
                    .unwrap_or_default();
                return Err(backend_status_error(&backend, status, &bytes));
            }
            if passthrough {
                pass_through(status, &headers, body)
            } else {
                let limit = gw.config.limits.max_body_bytes.saturating_mul(4);
                let bytes = tokio::time::timeout_at(deadline, read_limited(body, limit))
                    .await
                    .map_err(|_| timeout_error(model))?
                    .map_err(|e| {
                        GatewayError::BadGateway(format!(
                            "backend '{}': reading its response failed: {e}",
                            backend.name
                        ))
                    })?;
                let hl = headers
                    .get(HEADER_CONTENT_LENGTH)
                    .map(HeaderValue::as_bytes);
                let resp = decode_response(&bytes, hl, &gw.limits).map_err(|e| {
                    GatewayError::BadGateway(format!(
                        "backend '{}' sent an invalid response: {e}",
                        backend.name
                    ))
                })?;
                client_response(&req, resp, &backend.name, &classifications)?
            }
        }
    };
    if let Ok(v) = HeaderValue::from_str(&backend.name) {
        response.headers_mut().insert(BACKEND_HEADER, v);
    }
    Ok(response)
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

async fn read_limited(body: hyper::body::Incoming, limit: usize) -> Result<Bytes, String> {
    Limited::new(body, limit)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| e.to_string())
}

fn timeout_error(model: &str) -> GatewayError {
    GatewayError::Timeout(format!("the request to model '{model}' timed out"))
}

fn backend_error(backend: &BackendHandle, e: BackendError) -> GatewayError {
    match e {
        BackendError::Connect(m) | BackendError::Failed(m) => {
            GatewayError::BadGateway(format!("backend '{}': {m}", backend.name))
        }
        BackendError::Rejected(m) => GatewayError::BadRequest(m),
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
