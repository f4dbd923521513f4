//! The HTTP body type used throughout serving, and bodies made of several `Bytes` parts so
//! that binary tensors are written without being copied into one buffer.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;

use crate::error::GatewayError;
use crate::protocol::rest::encode::EncodedBody;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How much of a body's declared length (Content-Length, a gRPC frame's length) is reserved
/// before the bytes arrive; past it, the buffer grows with what does arrive. The declared
/// length is the client's word: reserving all of it at once let streams that declared
/// 256 MiB and sent a byte each claim gigabytes, and where the host limits memory the
/// failed allocation aborts the process.
const RESERVE_UP_TO: usize = 8 << 20;

/// The first capacity of a buffer for a body that declares `declared` bytes.
pub fn initial_capacity(declared: usize) -> usize {
    declared.min(RESERVE_UP_TO)
}
pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// A body of known length made of several buffers, sent one frame per buffer.
pub struct PartsBody {
    parts: VecDeque<Bytes>,
    remaining: u64,
}

impl PartsBody {
    pub fn new(parts: Vec<Bytes>) -> Self {
        let remaining = parts.iter().map(|p| p.len() as u64).sum();
        PartsBody {
            parts: parts.into_iter().filter(|p| !p.is_empty()).collect(),
            remaining,
        }
    }
}

impl http_body::Body for PartsBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.parts.pop_front() {
            Some(b) => {
                self.remaining -= b.len() as u64;
                Poll::Ready(Some(Ok(Frame::data(b))))
            }
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.parts.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

pub fn full(b: impl Into<Bytes>) -> Body {
    PartsBody::new(vec![b.into()]).boxed_unsync()
}

pub fn empty() -> Body {
    PartsBody::new(Vec::new()).boxed_unsync()
}

pub fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    let bytes = serde_json::to_vec(value).expect("a JSON value serializes");
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(bytes))
        .expect("valid response parts")
}

pub fn error_response(e: &GatewayError) -> Response<Body> {
    let mut r = Response::builder()
        .status(e.status())
        .header(header::CONTENT_TYPE, "application/json");
    if e.status() == StatusCode::SERVICE_UNAVAILABLE {
        r = r.header(header::RETRY_AFTER, "1");
    }
    if e.status() == StatusCode::UNAUTHORIZED {
        r = r.header(header::WWW_AUTHENTICATE, "Bearer");
    }
    if let GatewayError::ModelFailed(_) = e {
        r = r.header(crate::error::MODEL_FAILURE, "1");
    }
    if let GatewayError::MethodNotAllowed { allow, .. } = e {
        // Every GET path answers HEAD too (RFC 9110 9.3.2).
        r = r.header(
            header::ALLOW,
            match *allow {
                http::Method::GET => "GET, HEAD",
                ref m => m.as_str(),
            },
        );
    }
    // Refused before its body was read (too large, too slow, or no room left): the rest of it is still on
    // the connection, which is closed after this answer; saying so keeps an HTTP/1.1 client
    // from sending its next request on it. (HTTP/2 drops the header: its streams end alone.)
    // By the error, not the status: a backend's own 408 or 413, or a message too large only
    // once decoded, leaves nothing unread.
    if matches!(
        e,
        GatewayError::PayloadTooLarge(_)
            | GatewayError::RequestTimeout(_)
            | GatewayError::BodiesFull(_)
    ) {
        r = r.header(header::CONNECTION, "close");
    }
    r.body(full(e.body())).expect("valid response parts")
}

/// A response carrying an encoded inference body with the binary extension's headers.
pub fn encoded_response(body: EncodedBody) -> Response<Body> {
    answer_head(&body)
        .body(PartsBody::new(body.parts).boxed_unsync())
        .expect("valid response parts")
}

/// An encoded inference answer's status and headers (its content type, and the binary
/// extension's `Inference-Header-Content-Length`), for a body sent as it is or compressed.
pub fn answer_head(body: &EncodedBody) -> http::response::Builder {
    let r = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, body.content_type());
    match body.header_length() {
        Some(n) => r.header(
            crate::headers::INFERENCE_HEADER_CONTENT_LENGTH,
            HeaderValue::from(n as u64),
        ),
        None => r,
    }
}

#[cfg(test)]
mod reserve_tests {
    use super::*;

    #[test]
    fn a_declared_length_is_reserved_up_to_a_bound() {
        assert_eq!(initial_capacity(10), 10);
        assert_eq!(initial_capacity(RESERVE_UP_TO), RESERVE_UP_TO);
        assert_eq!(initial_capacity(256 << 20), 8 << 20);
    }
}
