//! The HTTP header names more than one module reads or writes, as `HeaderName`s parsed once.
//! A lookup by `&str` parses (and lowercases) the name on every call: with the eight lookups
//! of one proxied request that was some 3% of the gateway's instructions per small request.

use http::HeaderName;

/// The spellings, for gRPC metadata (tonic's keys are strings).
pub mod names {
    /// Echoed to the client and passed to backends, for correlating logs.
    pub const REQUEST_ID: &str = "x-request-id";
    /// The backend that served (or failed) a request, on REST answers and gRPC metadata alike.
    pub const BACKEND: &str = "x-tensorgate-backend";
    /// W3C trace context, read from the client and passed to the backend.
    pub const TRACEPARENT: &str = "traceparent";
}

/// Echoed to the client and passed to backends, for correlating logs.
pub const REQUEST_ID: HeaderName = HeaderName::from_static(names::REQUEST_ID);

/// The backend that served (or failed) a request, on REST answers and gRPC metadata alike.
pub const BACKEND: HeaderName = HeaderName::from_static(names::BACKEND);

/// W3C trace context, read from the client and passed to the backend.
pub const TRACEPARENT: HeaderName = HeaderName::from_static(names::TRACEPARENT);

/// The header with which a tensorgate worker marks a 500 that is a model's failure on one
/// request, not the server's ill health; a gateway in front passes it on.
pub const MODEL_FAILURE: HeaderName = HeaderName::from_static("tensorgate-model-failure");

/// The binary tensor extension's length of the JSON part of a body.
pub const INFERENCE_HEADER_CONTENT_LENGTH: HeaderName =
    HeaderName::from_static(crate::protocol::rest::decode::HEADER_CONTENT_LENGTH);

#[cfg(test)]
mod tests {
    #[test]
    fn names_are_their_lowercase_spelling() {
        // `from_static` would panic at compile time on an invalid name; this pins the
        // spellings clients and backends see.
        assert_eq!(super::REQUEST_ID.as_str(), "x-request-id");
        assert_eq!(super::BACKEND.as_str(), "x-tensorgate-backend");
        assert_eq!(super::TRACEPARENT.as_str(), "traceparent");
        assert_eq!(super::MODEL_FAILURE.as_str(), "tensorgate-model-failure");
        assert_eq!(
            super::INFERENCE_HEADER_CONTENT_LENGTH.as_str(),
            "inference-header-content-length"
        );
    }
}
