//! The inference core: one inference, whatever transport carried it. An edge (REST, gRPC)
//! decodes its request into an `InferRequest`, and the core runs it through named phases:
//!
//! 1. **lookup** (`lookup`): the model in the fleet's catalog, and the version the path names;
//! 2. **validate**: the request against the model's metadata;
//! 3. **route**: a backend from the router: the sequence's pin or owner, else balanced;
//! 4. **plan** (`plan`): which classifications the gateway applies for each backend, and the
//!    request adapted to what that backend handles;
//! 5. **attempt and retry** (`attempt`): what the backend is sent (the decoded request in
//!    process, the client's own bytes when the backend handles everything asked, else its
//!    best encoding), the call, and what may be retried elsewhere, decided by the backend
//!    error (`BackendError::retry`);
//! 6. **shape** (`shape`): exactly the requested outputs, in the requested order, classified,
//!    with the client's id.
//!
//! The answer is a decoded response, which the edge encodes as its client asked, or the
//! backend's own HTTP response when the client's bytes went through untouched.

mod attempt;
pub mod lookup;
pub mod plan;
mod shape;

use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use tokio::time::Instant;

use crate::body_budget::Reservation;

pub use super::observe::Protocol;
use super::observe::{traceparent, Observation};
use super::Gateway;
use crate::config::Config;
use crate::error::GatewayError;
/// The body of a backend's answer that goes back to the client unchanged.
pub use crate::fleet::pool::BackendBody;
use crate::fleet::CatalogEntry;
use crate::protocol::params::RequestOptions;
use crate::protocol::{
    check_max_batch_size, validate_request, InferRequest, InferResponse, ModelMetadata,
    ProtocolError,
};

pub use lookup::{lookup, lookup_for_readiness};

/// The client's encoded request body, which may go to a backend unchanged.
#[derive(Clone, Copy)]
pub struct Original<'a> {
    pub body: &'a Bytes,
    /// Its `Inference-Header-Content-Length`, parsed once by the REST edge.
    pub header_length: Option<usize>,
}

/// What an edge knows about one inference besides the request itself.
pub struct InferContext<'a> {
    pub model: &'a str,
    pub version: Option<&'a str>,
    /// The client's W3C trace context and request id, passed on to the backend.
    pub traceparent: Option<&'a HeaderValue>,
    pub request_id: Option<&'a HeaderValue>,
    /// A deadline the transport carries (gRPC's `grpc-timeout`), beside the config's and the
    /// v2 `timeout` parameter; the earliest wins.
    pub transport_deadline: Option<Instant>,
    /// The client's own bytes (REST only): a Triton-like backend may get them unchanged.
    pub original: Option<Original<'a>>,
    /// Input tensor bytes that arrived in binary form, for the transcoding counters.
    pub binary_in: u64,
    /// The request's part of the budget for bodies, kept by a model's run that outlives it.
    pub held: &'a Reservation,
}

/// The core's answer.
pub enum Outcome {
    /// The shaped response. `from_binary`: the backend's outputs came in binary form (or
    /// in-process), which decides what the edge's encoding counts as transcoded.
    Response {
        response: InferResponse,
        from_binary: bool,
    },
    /// The backend's answer to the client's original bytes, to go back as it is.
    PassThrough(http::Response<BackendBody>),
}

/// Phase 1: finds the model, and labels the observation with it. The guard keeps
/// `nv_inference_pending_request_count` raised for as long as the request lives.
pub fn begin(
    gw: &Gateway,
    model: &str,
    version: Option<&str>,
    obs: &mut Observation,
) -> Result<(CatalogEntry, super::Raised), GatewayError> {
    let looking = super::observe::Phase::start();
    let entry = lookup(gw, model, version)?;
    looking.end(&mut obs.queue);
    // `lookup` let through only a version the model lists, so label values stay bounded.
    let label_version = entry.metadata.version_label(version);
    let pending = gw
        .metrics
        .nv_pending
        .with_label_values(&[model, &label_version]);
    obs.model = Some(model.to_string());
    obs.version = Some(label_version);
    Ok((entry, super::Raised::new(pending)))
}

/// Phases 2 to 6 for a decoded request.
pub async fn infer(
    gw: &Gateway,
    config: &Config,
    entry: &CatalogEntry,
    req: &InferRequest,
    ctx: InferContext<'_>,
    obs: &mut Observation,
) -> Result<Outcome, GatewayError> {
    // Before validation: a refused request of a sequence is one its client will look for
    // by the sequence's id.
    obs.sequence = req
        .options
        .sequence_id
        .as_ref()
        .map(crate::routing::describe_sequence);
    let validating = super::observe::Phase::start();
    validate_request(req, &entry.metadata)?;
    if entry.needs_sequence_id && req.options.sequence_id.is_none() {
        // Triton's words, which its clients know.
        return Err(ProtocolError::invalid(format!(
            "inference request to model '{}' must specify a non-zero or non-empty correlation ID",
            ctx.model
        ))
        .into());
    }
    if entry.batches == Some(true) {
        if let Some(n) = entry.max_batch_size_for(ctx.model, ctx.version) {
            check_max_batch_size(req, n)?;
        }
    }
    obs.batch = Some(batch_size(req, &entry.metadata, entry.batches));
    let mut headers = http::HeaderMap::new();
    let trace = traceparent(ctx.traceparent);
    obs.traceparent = trace.to_str().ok().map(std::sync::Arc::from);
    headers.insert(crate::headers::TRACEPARENT, trace);
    if let Some(id) = ctx.request_id {
        headers.insert(super::REQUEST_ID, id.clone());
    }
    validating.end(&mut obs.compute_input);
    let total_in: u64 = req.inputs.iter().map(|t| t.data.len() as u64).sum();
    let limits = config.limits.protocol();
    let (deadline, deadline_set_by) = deadline(config, ctx.model, req, ctx.transport_deadline);
    // A model its backends say keeps no sequence state: a client's `sequence_id` (tritonclient
    // sets one for any model it is given) routes nothing, and no backend is pinned.
    let unpinned;
    let routing = match entry.stateless && req.options.sequence_id.is_some() {
        true => {
            unpinned = RequestOptions {
                sequence_id: None,
                sequence_start: false,
                sequence_end: false,
                ..req.options.clone()
            };
            &unpinned
        }
        false => &req.options,
    };
    let attempt = attempt::Attempt {
        gw,
        limits: &limits,
        routing,
        batches: entry.batches,
        model: ctx.model,
        version: ctx.version,
        metadata: &entry.metadata,
        req,
        original: ctx.original,
        deadline,
        deadline_set_by,
        response_limit: config.limits.max_body_bytes.saturating_mul(4),
        retry_idempotent: config
            .model(ctx.model)
            .and_then(|m| m.retry_idempotent)
            .unwrap_or(true),
        headers,
        json_in: total_in.saturating_sub(ctx.binary_in),
        binary_in: ctx.binary_in,
        held: ctx.held,
    };
    attempt.run(entry, obs).await
}

/// What set a request's deadline: its 504 says which, and only a backend that overran the
/// operator's own limit has failed (one that missed a client's shorter wish may just be a
/// slow model).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DeadlineSource {
    /// `[models.NAME] timeout_ms`.
    Model,
    /// `limits.request_timeout_ms`.
    Default,
    /// The v2 `timeout` parameter.
    Parameter,
    /// The transport's own (gRPC's `grpc-timeout`).
    Transport,
}

impl DeadlineSource {
    pub(super) fn is_configured(self) -> bool {
        matches!(self, DeadlineSource::Model | DeadlineSource::Default)
    }

    /// How a 504 names it.
    pub(super) fn describe(self, model: &str) -> String {
        match self {
            DeadlineSource::Model => format!("models.{model}.timeout_ms"),
            DeadlineSource::Default => "limits.request_timeout_ms".into(),
            DeadlineSource::Parameter => "the request's timeout parameter".into(),
            DeadlineSource::Transport => "the gRPC deadline".into(),
        }
    }
}

/// The request's deadline: the model's timeout or the default, shortened by the v2 `timeout`
/// parameter (microseconds; 0 means none, as in Triton) and by the transport's own.
fn deadline(
    config: &Config,
    model: &str,
    req: &InferRequest,
    transport: Option<Instant>,
) -> (Instant, DeadlineSource) {
    let (configured, source) = match config.model(model).and_then(|m| m.timeout_ms) {
        Some(ms) => (Duration::from_millis(ms), DeadlineSource::Model),
        None => (config.limits.request_timeout(), DeadlineSource::Default),
    };
    let wanted = req
        .options
        .timeout_us
        .filter(|us| *us > 0)
        .map(Duration::from_micros);
    let now = Instant::now();
    let mut at = (now + configured, source);
    if let Some(w) = wanted.filter(|w| now + *w < at.0) {
        at = (now + w, DeadlineSource::Parameter);
    }
    if let Some(t) = transport.filter(|t| *t < at.0) {
        at = (t, DeadlineSource::Transport);
    }
    at
}

/// Inferences in a request: the first input's first dimension when the model's shape starts
/// with a batch dimension (-1, rank two or more), else one. A model known not to batch
/// (`max_batch_size: 0`) counts one, as Triton counts it, whatever its leading dimension.
fn batch_size(req: &InferRequest, model: &ModelMetadata, batches: Option<bool>) -> u64 {
    if batches == Some(false) {
        return 1;
    }
    req.inputs
        .first()
        .and_then(|t| {
            let meta = model.input(&t.name)?;
            (meta.shape.len() >= 2 && meta.shape[0] == -1).then(|| t.shape.first().copied())?
        })
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A leading -1 reads as a batch dimension unless an in-process model says it does not
    /// batch: Triton counts one inference per request of a max_batch_size 0 model.
    #[test]
    fn a_model_that_does_not_batch_counts_one_inference() {
        let meta: ModelMetadata = serde_json::from_value(serde_json::json!({
            "name": "m",
            "inputs": [{"name": "A", "datatype": "INT32", "shape": [-1, 4]}],
        }))
        .unwrap();
        let body = Bytes::from_static(
            br#"{"inputs":[{"name":"A","datatype":"INT32","shape":[5,4],"data":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19]}]}"#,
        );
        let decoded = crate::protocol::rest::decode::decode_request(
            &body,
            None,
            &crate::protocol::limits::Limits::default(),
        );
        let Ok(crate::protocol::rest::decode::RequestBody::Message(req)) = decoded else {
            panic!("a JSON request");
        };
        assert_eq!(batch_size(&req, &meta, None), 5);
        assert_eq!(batch_size(&req, &meta, Some(true)), 5);
        assert_eq!(batch_size(&req, &meta, Some(false)), 1);
    }
}
