//! The `Backend` trait: what the gateway needs from anything that serves models, whether the
//! in-process built-in models or a v2 server over HTTP.

use std::future::Future;
use std::pin::Pin;

use super::pool::BackendBody;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};

use crate::body_budget::Reservation;
use crate::protocol::rest::encode::EncodedBody;
use crate::protocol::{InferRequest, InferResponse, ModelMetadata, ServerMetadata, Tolerance};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A model as a backend reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscoveredModel {
    pub metadata: ModelMetadata,
    pub ready: bool,
    /// What the backend's own configuration says of the model, read with its metadata:
    /// whether it batches and whether it keeps sequence state are not in v2 metadata, and
    /// routing, classification and the statistics depend on them. `None`: not stated (a
    /// server without a configuration endpoint, or one that did not answer).
    pub stated: Option<StatedConfig>,
}

/// The models a backend exposes, and how they were found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelList {
    pub models: Vec<DiscoveredModel>,
    /// When `models` is empty: everything that was tried, for the log and for readiness.
    pub tried: String,
    /// One entry per metadata answer that needed a tolerance, for the metrics.
    pub tolerated: Vec<Tolerance>,
    /// Models (or versions) the server has but cannot serve, with why: for the index.
    pub unavailable: Vec<crate::models::repository::IndexEntry>,
    /// It answered `POST /v2/repository/index`: it has the repository endpoints, listed as an
    /// extension or not (MLServer 1.7 lists no extensions at all).
    pub answers_index: bool,
    /// Models it lists whose metadata got no answer this round (the connection refused or
    /// cut): most often the backend going down mid-round. The fleet keeps what it knew of
    /// them, not ready, so that they stay known (503) rather than turn unknown (404).
    pub unanswered: Vec<String>,
}

/// The repository extension's two actions on one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepositoryAction {
    Load,
    Unload,
}

impl RepositoryAction {
    pub fn as_str(self) -> &'static str {
        match self {
            RepositoryAction::Load => "load",
            RepositoryAction::Unload => "unload",
        }
    }
}

/// What a backend is sent for one inference.
pub enum Payload {
    /// For in-process models: the decoded request itself.
    Decoded(InferRequest),
    /// For HTTP backends: an encoded body, either re-encoded or the client's own bytes.
    Wire(WireBody),
}

/// A body ready to send, with the headers the binary extension needs.
pub struct WireBody {
    pub parts: Vec<Bytes>,
    pub header_length: Option<usize>,
    pub content_type: &'static str,
}

impl From<EncodedBody> for WireBody {
    fn from(e: EncodedBody) -> Self {
        WireBody {
            header_length: e.header_length(),
            content_type: e.content_type(),
            parts: e.parts,
        }
    }
}

/// What a backend answered.
pub enum Reply {
    /// An in-process model's answer. `queued`: how long the call waited for an instance of
    /// the model and for the thread that runs it, there and back, which the statistics count
    /// as queue time, as Triton does, and not as the model's compute time.
    Decoded {
        response: InferResponse,
        queued: std::time::Duration,
    },
    Http {
        status: StatusCode,
        headers: HeaderMap,
        body: BackendBody,
    },
}

/// Where a request may go after its backend failed: a property of the failure, decided
/// where the failure is understood (pingora's retry type), applied by the inference core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Nothing reached the backend: any request may go to another one.
    Anywhere,
    /// The request may have reached the backend, but the connection closed before a byte
    /// of an answer: only a request that is safe to run twice (not part of a sequence) may
    /// go to another one.
    Idempotent,
    /// The backend may have acted on it and answered, or refused it: never.
    Never,
}

impl Retry {
    /// After a backend answered `status`: a 404 for a model the catalog says it serves means
    /// it lost the model since the last discovery round (unloaded, or restarted with another
    /// repository), and nothing ran; any other answer may have acted.
    pub fn after_status(status: StatusCode) -> Retry {
        if status == StatusCode::NOT_FOUND {
            Retry::Anywhere
        } else {
            Retry::Never
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendError {
    /// No connection could be made; nothing was sent, so another backend may be tried.
    Connect(String),
    /// The connection was reset or closed before any byte of a response arrived (a backend
    /// that died or closed a pooled connection under the request).
    Reset(String),
    /// The exchange failed after the request may have reached the backend.
    Failed(String),
    /// The backend answered with an error status and message.
    Status { status: StatusCode, message: String },
    /// The backend refused the request itself (in-process models): a client error.
    Rejected(String),
    /// An in-process model answered with an output its own shape contradicts: the server's
    /// bug, a 500, and no reason to eject the backend.
    Broken(String),
}

/// The message alone, for logs and for readiness's explanation.
impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendError::Connect(m)
            | BackendError::Reset(m)
            | BackendError::Failed(m)
            | BackendError::Rejected(m)
            | BackendError::Broken(m)
            | BackendError::Status { message: m, .. } => f.write_str(m),
        }
    }
}

impl BackendError {
    pub fn retry(&self) -> Retry {
        match self {
            BackendError::Connect(_) => Retry::Anywhere,
            BackendError::Reset(_) => Retry::Idempotent,
            BackendError::Status { status, .. } => Retry::after_status(*status),
            _ => Retry::Never,
        }
    }

    /// The backend refused the request without acting on it (a 400, or an in-process
    /// model's own check).
    pub fn is_rejection(&self) -> bool {
        match self {
            BackendError::Rejected(_) => true,
            BackendError::Status { status, .. } => *status == StatusCode::BAD_REQUEST,
            _ => false,
        }
    }

    /// A failure of the backend or of the way to it, which passive health counts.
    pub fn counts_against_health(&self) -> bool {
        matches!(
            self,
            BackendError::Connect(_) | BackendError::Reset(_) | BackendError::Failed(_)
        )
    }
}

pub struct InferCall<'a> {
    pub model: &'a str,
    pub version: Option<&'a str>,
    pub payload: Payload,
    /// Extra headers to send (trace context).
    pub headers: &'a HeaderMap,
    /// The request's part of the budget for bodies: work that goes on after the request is
    /// cancelled or times out (a built-in model's run) holds it until it ends.
    pub held: Reservation,
}

/// A batch dimension is what Triton shows as a leading -1 in v2 metadata when its
/// `max_batch_size > 0`; the real limit is the backend's and v2 metadata does not carry it,
/// so where no backend states one, a tensorgate server's configuration reports
/// `max_batch_size` as the largest value (and the dims without the batch dimension, as
/// Triton's config does). Read from another tensorgate, it states nothing.
pub const UNKNOWN_MAX_BATCH: i32 = i32::MAX;

/// The parts of a backend's model configuration the gateway's own repeats.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatedConfig {
    /// The largest batch the model takes (0: no batch dimension); `None`: not stated.
    pub max_batch_size: Option<u32>,
    /// The model keeps state across a sequence's requests (`sequence_batching`).
    pub sequence_batching: bool,
    /// Outputs with labels (`label_filename`), with the file's name.
    pub labeled_outputs: Vec<(String, String)>,
}

pub trait Backend: Send + Sync {
    /// True for the built-in models, which take `Payload::Decoded`.
    fn in_process(&self) -> bool;
    fn server_metadata(&self) -> BoxFuture<'_, Result<ServerMetadata, BackendError>>;
    /// The models this backend serves, with metadata and readiness. `configured` names the
    /// models the config lists for this backend, probed only when the backend cannot list
    /// its models itself.
    fn models<'a>(
        &'a self,
        configured: &'a [String],
    ) -> BoxFuture<'a, Result<ModelList, BackendError>>;
    /// Whether the server answers `GET /v2/health/ready` with 2xx; if not, why.
    fn ready(&self) -> BoxFuture<'_, Result<(), BackendError>>;
    fn infer<'a>(&'a self, call: InferCall<'a>) -> BoxFuture<'a, Result<Reply, BackendError>>;
    /// Labels an in-process model carries for `output` (the built-in classifier's, a
    /// repository model's `label_filename`). Labels of a remote model are its server's
    /// business: an external model of the same name is a different model.
    fn labels(&self, _model: &str, _output: &str) -> Option<std::sync::Arc<Vec<String>>> {
        None
    }
    /// Loads (reading it again from the repository) or unloads one model, for a server that
    /// lists the `model_repository` extension.
    fn control<'a>(
        &'a self,
        _model: &'a str,
        _action: RepositoryAction,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async {
            Err(BackendError::Rejected(
                "this server has no model repository".into(),
            ))
        })
    }
}

/// Reads an error message out of a backend's error body: its `error` field if it is JSON,
/// else the text itself.
pub fn error_message(body: &Bytes) -> String {
    #[derive(serde::Deserialize)]
    struct E {
        error: String,
    }
    match serde_json::from_slice::<E>(body) {
        Ok(e) => e.error,
        Err(_) => String::from_utf8_lossy(&body[..body.len().min(1024)])
            .trim()
            .to_string(),
    }
}
