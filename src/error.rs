//! The one error type of the serving side, and where it maps to each transport: an HTTP
//! status and a gRPC status code with the same message, side by side (the REST body and its
//! extra headers are written by `body::error_response`). A few gRPC statuses are made at the
//! gRPC edge without a `GatewayError` behind them (framing errors tonic reports, tonic's own
//! refusals); docs/ARCHITECTURE.md lists them.

use http::StatusCode;

use crate::protocol::ProtocolError;

#[derive(Debug, Clone, PartialEq)]
pub enum GatewayError {
    /// The client's body or parameters are wrong (400) or too large (413).
    Protocol(ProtocolError),
    /// 400 for anything else the client got wrong (headers, paths).
    BadRequest(String),
    NotFound(String),
    /// The path exists, but not for this method: 405, with `Allow` saying which one it takes.
    MethodNotAllowed {
        message: String,
        allow: http::Method,
    },
    /// A missing or wrong bearer token: 401.
    Unauthorized(String),
    /// The client sent its body too slowly: 408.
    RequestTimeout(String),
    PayloadTooLarge(String),
    /// A request body in a content coding we cannot decode: 415 (RFC 9110 15.5.16). Triton
    /// answers 501 here; we do not, because the client chose the coding, and a client's error
    /// is never a 5xx.
    UnsupportedEncoding(String),
    /// No healthy backend, or the gateway is shedding load: 503.
    Unavailable(String),
    /// The budget for request bodies held at once (`limits.max_buffered_body_bytes`) is
    /// spent: 503 with Retry-After, UNAVAILABLE. Refused while the body arrives, so the
    /// rest of it is still on the connection, which closes after the answer.
    BodiesFull(String),
    /// The backend a live sequence is pinned to is gone, and the sequence's state with it:
    /// 503, UNAVAILABLE. A backend's failure, where `Unavailable` is the gateway's refusal.
    SequenceLost(String),
    /// The request's deadline passed: 504.
    Timeout(String),
    /// A backend sent something unusable, or dropped the connection after the request may
    /// have reached it: 502, INTERNAL.
    BadGateway(String),
    /// No connection to a backend could be made (nothing was sent): 502 as REST proxies
    /// answer, but UNAVAILABLE over gRPC, whose clients retry that code, and may: the
    /// request never ran.
    Unreachable(String),
    /// A backend answered with an error of its own; its status is passed on.
    Backend {
        status: StatusCode,
        message: String,
    },
    /// A Triton extension that a gateway does not offer (shared memory, trace and log
    /// settings): 501 as Triton answers for what it does not support, UNIMPLEMENTED.
    Unsupported(String),
    /// A model failed on this request (a runtime error inside it, a panic, an output its
    /// own shape contradicts): 500, INTERNAL, as Triton answers. The request's doing as
    /// much as the server's: the same request fails on every replica, so a gateway in front
    /// does not count it against the server's health (REST answers carry `MODEL_FAILURE`).
    ModelFailed(String),
    /// Our bug: 500.
    Internal(String),
}

/// What a client is told of a handler's panic (our bug); the log has the panic's own message.
pub const PANICKED: &str = "internal error while handling this request";

/// A caught panic's message, for the log.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(not a string)")
}

pub use crate::headers::MODEL_FAILURE;

impl GatewayError {
    pub fn status(&self) -> StatusCode {
        match self {
            GatewayError::Protocol(ProtocolError::Invalid(_)) => StatusCode::BAD_REQUEST,
            GatewayError::Protocol(ProtocolError::TooLarge(_)) => StatusCode::PAYLOAD_TOO_LARGE,
            GatewayError::Protocol(ProtocolError::Inconsistent(_)) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            GatewayError::BadRequest(_) => StatusCode::BAD_REQUEST,
            GatewayError::NotFound(_) => StatusCode::NOT_FOUND,
            GatewayError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            GatewayError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            GatewayError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            GatewayError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            GatewayError::UnsupportedEncoding(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            GatewayError::Unavailable(_)
            | GatewayError::BodiesFull(_)
            | GatewayError::SequenceLost(_) => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            GatewayError::BadGateway(_) | GatewayError::Unreachable(_) => StatusCode::BAD_GATEWAY,
            GatewayError::Backend { status, .. } => *status,
            GatewayError::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
            GatewayError::ModelFailed(_) | GatewayError::Internal(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// The gRPC code of the same failure: a client's error is INVALID_ARGUMENT (or the more
    /// precise NOT_FOUND, UNAUTHENTICATED, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED), the
    /// gateway's or a backend's fault INTERNAL, no backend or shedding UNAVAILABLE.
    pub fn grpc_code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            GatewayError::Protocol(ProtocolError::Invalid(_)) => Code::InvalidArgument,
            GatewayError::Protocol(ProtocolError::TooLarge(_)) => Code::ResourceExhausted,
            GatewayError::Protocol(ProtocolError::Inconsistent(_)) => Code::Internal,
            GatewayError::BadRequest(_) | GatewayError::UnsupportedEncoding(_) => {
                Code::InvalidArgument
            }
            GatewayError::NotFound(_) => Code::NotFound,
            GatewayError::MethodNotAllowed { .. } | GatewayError::Unsupported(_) => {
                Code::Unimplemented
            }
            GatewayError::Unauthorized(_) => Code::Unauthenticated,
            GatewayError::RequestTimeout(_) | GatewayError::Timeout(_) => Code::DeadlineExceeded,
            GatewayError::PayloadTooLarge(_) => Code::ResourceExhausted,
            GatewayError::Unavailable(_)
            | GatewayError::BodiesFull(_)
            | GatewayError::SequenceLost(_)
            | GatewayError::Unreachable(_) => Code::Unavailable,
            GatewayError::BadGateway(_)
            | GatewayError::ModelFailed(_)
            | GatewayError::Internal(_) => Code::Internal,
            GatewayError::Backend { status, .. } => match status.as_u16() {
                400 | 409 | 412 | 415 | 422 => Code::InvalidArgument,
                401 => Code::Unauthenticated,
                403 => Code::PermissionDenied,
                404 => Code::NotFound,
                408 | 504 => Code::DeadlineExceeded,
                413 | 429 => Code::ResourceExhausted,
                501 => Code::Unimplemented,
                503 => Code::Unavailable,
                s if (400..500).contains(&s) => Code::InvalidArgument,
                _ => Code::Internal,
            },
        }
    }

    /// The gRPC status. Its message travels in the `grpc-message` trailer, and common
    /// clients (grpcio, grpc-go) refuse metadata over 16 KiB with RESOURCE_EXHAUSTED, losing
    /// the real error: a message that echoes a long name or shape back is cut short.
    pub fn to_grpc(&self) -> tonic::Status {
        self.to_grpc_with(tonic::metadata::MetadataMap::new())
    }

    /// [`GatewayError::to_grpc`], with metadata (the backend that answered) beside it.
    pub fn to_grpc_with(&self, metadata: tonic::metadata::MetadataMap) -> tonic::Status {
        tonic::Status::with_metadata(
            self.grpc_code(),
            cut_short(self.message(), GRPC_MESSAGE_MAX),
            metadata,
        )
    }

    pub fn message(&self) -> &str {
        match self {
            GatewayError::Protocol(e) => e.message(),
            GatewayError::BadRequest(m)
            | GatewayError::NotFound(m)
            | GatewayError::Unauthorized(m)
            | GatewayError::RequestTimeout(m)
            | GatewayError::PayloadTooLarge(m)
            | GatewayError::UnsupportedEncoding(m)
            | GatewayError::Unavailable(m)
            | GatewayError::BodiesFull(m)
            | GatewayError::SequenceLost(m)
            | GatewayError::Timeout(m)
            | GatewayError::BadGateway(m)
            | GatewayError::Unreachable(m)
            | GatewayError::Unsupported(m)
            | GatewayError::ModelFailed(m)
            | GatewayError::Internal(m) => m,
            GatewayError::Backend { message, .. }
            | GatewayError::MethodNotAllowed { message, .. } => message,
        }
    }

    /// `method` on `path`, which takes only `allow`.
    pub fn method_not_allowed(
        method: &http::Method,
        path: &str,
        allow: http::Method,
    ) -> GatewayError {
        GatewayError::MethodNotAllowed {
            message: format!("method {method} is not allowed on {path}; use {allow}"),
            allow,
        }
    }

    /// The error body: `{"error": "<message>"}`.
    /// The REST body, `{"error": "..."}`, its message cut to `MESSAGE_MAX`.
    pub fn body(&self) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({ "error": cut_short(self.message(), MESSAGE_MAX) }))
            .expect("a JSON object serializes")
    }

    /// The message, cut to `MESSAGE_MAX`: what an answer or a log line carries.
    pub fn short_message(&self) -> std::borrow::Cow<'_, str> {
        cut_short(self.message(), MESSAGE_MAX)
    }
}

/// The longest `grpc-message` sent, in bytes. Percent-encoding may triple it (every byte
/// outside printable ASCII), which still fits 16 KiB with the other trailers.
pub const GRPC_MESSAGE_MAX: usize = 4096;

/// The longest error message in an answer or a log line, in bytes. Messages quote what the
/// client sent (a name, a shape), and a client that sends 60 MB of shape must not get 60 MB
/// back, nor write a 60 MB log line.
pub const MESSAGE_MAX: usize = 4096;

/// `message` if it fits in `max` bytes, else its head (cut at a character boundary) and a
/// note of how much was left out.
pub fn cut_short(message: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if message.len() <= max {
        return std::borrow::Cow::Borrowed(message);
    }
    let mut end = max;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!(
        "{}... ({} more bytes of this message left out)",
        &message[..end],
        message.len() - end
    ))
}

/// The Triton extensions that tensorgate does not offer, the same over REST and gRPC.
impl GatewayError {
    /// Shared-memory regions hold tensors on the client's host; a gateway forwards tensors
    /// in the request itself.
    pub fn shared_memory(what: &str) -> GatewayError {
        GatewayError::Unsupported(format!(
            "{what} is not supported by tensorgate: it forwards tensors in the request itself; \
             send them in the request (binary tensor data over REST, raw_input_contents over gRPC)"
        ))
    }

    /// Trace and log settings belong to each backend, not to the gateway.
    pub fn backend_setting(what: &str) -> GatewayError {
        GatewayError::Unsupported(format!(
            "{what} are not supported by tensorgate: set them on the backends themselves"
        ))
    }
}

impl From<ProtocolError> for GatewayError {
    fn from(e: ProtocolError) -> Self {
        GatewayError::Protocol(e)
    }
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status().as_u16(), self.message())
    }
}

impl std::error::Error for GatewayError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_bodies() {
        let e = GatewayError::from(ProtocolError::invalid("input 'x': bad"));
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert_eq!(e.body(), br#"{"error":"input 'x': bad"}"#);
        assert_eq!(
            GatewayError::from(ProtocolError::too_large("big")).status(),
            StatusCode::PAYLOAD_TOO_LARGE
        );
        // A tensor the server built wrongly is the server's fault.
        assert_eq!(
            GatewayError::from(ProtocolError::Inconsistent("output 'y': bad".into())).status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        let b = GatewayError::Backend {
            status: StatusCode::CONFLICT,
            message: "m".into(),
        };
        assert_eq!(b.status(), StatusCode::CONFLICT);
        assert_eq!(
            GatewayError::Timeout("t".into()).status(),
            StatusCode::GATEWAY_TIMEOUT
        );
        assert_eq!(
            GatewayError::UnsupportedEncoding("br".into()).status(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );
    }

    /// A message quoting a client's 60 MB shape is cut in the REST body too.
    #[test]
    fn long_rest_messages_are_cut_short() {
        let long = format!("shape [{}] is wrong", "1,".repeat(100_000));
        let e = GatewayError::BadRequest(long.clone());
        let body: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        let head = &long[..MESSAGE_MAX];
        assert_eq!(
            body["error"],
            format!(
                "{head}... ({} more bytes of this message left out)",
                long.len() - MESSAGE_MAX
            )
        );
        assert_eq!(e.short_message(), body["error"].as_str().unwrap());
    }

    #[test]
    fn long_grpc_messages_are_cut_short() {
        let long = format!("unknown model '{}'", "é".repeat(10_000));
        let status = GatewayError::NotFound(long.clone()).to_grpc();
        let head = &long[..GRPC_MESSAGE_MAX - 1];
        assert_eq!(
            status.message(),
            format!(
                "{head}... ({} more bytes of this message left out)",
                long.len() - head.len()
            )
        );
        assert_eq!(status.code(), tonic::Code::NotFound);
        // The error itself keeps the whole message.
        assert_eq!(GatewayError::NotFound(long.clone()).message(), long);
        let short = GatewayError::NotFound("unknown model 'm'".into()).to_grpc();
        assert_eq!(short.message(), "unknown model 'm'");
    }

    #[test]
    fn grpc_codes_match_the_http_statuses() {
        use tonic::Code;
        let cases = [
            (
                GatewayError::from(ProtocolError::invalid("x")),
                Code::InvalidArgument,
            ),
            (
                GatewayError::from(ProtocolError::too_large("x")),
                Code::ResourceExhausted,
            ),
            (GatewayError::NotFound("m".into()), Code::NotFound),
            (
                GatewayError::Unauthorized("t".into()),
                Code::Unauthenticated,
            ),
            (GatewayError::Unavailable("u".into()), Code::Unavailable),
            (GatewayError::Timeout("t".into()), Code::DeadlineExceeded),
            (GatewayError::BadGateway("b".into()), Code::Internal),
            (GatewayError::Unreachable("b".into()), Code::Unavailable),
            (GatewayError::Internal("i".into()), Code::Internal),
        ];
        for (e, code) in cases {
            assert_eq!(e.grpc_code(), code, "{e}");
            assert_eq!(e.to_grpc().message(), e.message());
        }
        // A backend's own answer keeps its meaning: a client's error stays one.
        let backend = |s: u16| GatewayError::Backend {
            status: StatusCode::from_u16(s).unwrap(),
            message: "m".into(),
        };
        assert_eq!(backend(400).grpc_code(), Code::InvalidArgument);
        assert_eq!(backend(404).grpc_code(), Code::NotFound);
        assert_eq!(backend(503).grpc_code(), Code::Unavailable);
        assert_eq!(backend(500).grpc_code(), Code::Internal);
        assert_eq!(backend(502).grpc_code(), Code::Internal);
    }
}
