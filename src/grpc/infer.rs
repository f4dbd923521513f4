//! ModelInfer and ModelStreamInfer: protobuf in, the inference core, protobuf out. Every
//! request, unary or on a stream, is routed on its own (its sequence's pin, or balanced),
//! holds one of the gateway's concurrency permits, and is observed and logged once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http::HeaderValue;
use prost::Message;
use tokio::sync::oneshot;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Response, Status};

use super::stream_end::StreamWatch;
use super::BoxStream;
use crate::body_budget::Reservation;
use crate::error::GatewayError;
use crate::gateway::core::{self, InferContext, Outcome, Protocol};
use crate::gateway::heavy;
use crate::gateway::observe::{
    access_log, record_infer, Abandoned, CutOff, Observation, PeerAddr, Phase, Trail, WENT_AWAY,
};
use crate::gateway::{Gateway, Raised, REQUEST_ID};
use crate::headers::names;
use crate::protocol::grpc::{
    check_fanout, decode_infer_request, decoded_extra, encode_infer_response, pb, peek_sequence_id,
    MessageHead, INFER_REQUEST_FIELDS,
};
use crate::protocol::params::{ENABLE_EMPTY_FINAL_RESPONSE, FINAL_RESPONSE};

/// Requests of one stream handled at once; further messages wait to be read, which
/// pushes back on the client through HTTP/2 flow control. Messages waiting for their
/// sequence's previous one hold no permit, so this also bounds what a stream keeps in
/// memory: this many messages.
const STREAM_CONCURRENCY: usize = 16;

pub(super) const INFER_PATH: &str = "/inference.GRPCInferenceService/ModelInfer";
pub(super) const STREAM_PATH: &str = "/inference.GRPCInferenceService/ModelStreamInfer";

/// What the request's metadata says about every inference it carries.
#[derive(Clone)]
struct RpcContext {
    traceparent: Option<HeaderValue>,
    request_id: Option<HeaderValue>,
    deadline: Option<tokio::time::Instant>,
}

impl RpcContext {
    /// `arrived`: when the call's headers did, from which its `grpc-timeout` counts (not from
    /// when its message was read).
    fn from_headers(
        m: &http::HeaderMap,
        arrived: tokio::time::Instant,
    ) -> Result<RpcContext, GatewayError> {
        let header = |name: &str| {
            m.get(name)
                .and_then(|v| HeaderValue::from_bytes(v.as_bytes()).ok())
        };
        let deadline = match m.get("grpc-timeout") {
            None => None,
            Some(v) => {
                let timeout = parse_grpc_timeout(v.as_bytes()).ok_or_else(|| {
                    GatewayError::BadRequest(format!(
                        "grpc-timeout '{}' is not a valid timeout",
                        String::from_utf8_lossy(v.as_bytes())
                    ))
                })?;
                Some(arrived + timeout)
            }
        };
        Ok(RpcContext {
            traceparent: header(names::TRACEPARENT),
            request_id: header(names::REQUEST_ID),
            deadline,
        })
    }
}

/// `grpc-timeout`: at most 8 digits and a unit (H, M, S, m, u, n), per the gRPC spec.
pub(super) fn parse_grpc_timeout(v: &[u8]) -> Option<Duration> {
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b"H" => Duration::from_secs(n * 3600),
        b"M" => Duration::from_secs(n * 60),
        b"S" => Duration::from_secs(n),
        b"m" => Duration::from_millis(n),
        b"u" => Duration::from_micros(n),
        b"n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// ModelInfer as tonic hands it over: only a call whose `grpc-encoding` the gateway does
/// not read comes this way, for tonic to refuse (every other call takes
/// `unary::model_infer`, which reads and inflates its message itself).
pub async fn unary(
    gw: &Arc<Gateway>,
    req: Request<pb::ModelInferRequest>,
) -> Result<Response<pb::ModelInferResponse>, Status> {
    let (metadata, extensions, msg) = req.into_parts();
    let arrived = tokio::time::Instant::now();
    let peer = PeerAddr::of(&extensions);
    let read = async { Ok((msg, Reservation::default())) };
    let (result, answer_metadata) = call(gw, metadata.as_ref(), peer, arrived, read).await;
    match result {
        Ok(r) => {
            let mut response = Response::new(r);
            *response.metadata_mut() = answer_metadata;
            Ok(response)
        }
        Err(e) => Err(e.to_grpc_with(answer_metadata)),
    }
}

/// One ModelInfer call, whichever path read its message (`read`, whose time counts): the
/// context from the request's metadata (its deadline counted from `arrived`), the inference,
/// its observation. Returns the answer and the metadata to send with it (the backend that
/// served it).
pub(super) async fn call(
    gw: &Arc<Gateway>,
    headers: &http::HeaderMap,
    peer: Option<std::net::SocketAddr>,
    arrived: tokio::time::Instant,
    read: impl std::future::Future<Output = Result<(pb::ModelInferRequest, Reservation), GatewayError>>,
) -> (Result<pb::ModelInferResponse, GatewayError>, MetadataMap) {
    let start = Instant::now();
    let _in_flight = Raised::new(gw.metrics.in_flight.clone());
    let request_id = headers.get(&REQUEST_ID).cloned();
    // The model, once the message has named it: a call cancelled after that is a CANCELED
    // failure of that model's, as on a stream and over REST.
    let named = std::sync::OnceLock::new();
    let trail = Arc::new(Trail::default());
    let abandoned = Abandoned::new(|| {
        let what = Abandon {
            request_id: request_id.clone(),
            peer,
            model: named.get().cloned(),
            trail: &trail,
        };
        went_away(gw, INFER_PATH, start, WENT_AWAY, what)
    });
    let mut obs = Observation::new(Protocol::Grpc);
    obs.trail = Some(trail.clone());
    obs.request_id = request_id.clone();
    obs.peer = peer;
    // Auth and the concurrency permit are the shared layers' (`gateway::layers`).
    let result = async {
        let ctx = RpcContext::from_headers(headers, arrived)?;
        let (msg, mut held) = read.await?;
        let version = Some(msg.model_version.clone()).filter(|v| !v.is_empty());
        let _ = named.set((msg.model_name.clone(), version));
        // Admitted once the message is here (`GrpcPolicy`), held until the answer.
        let _permit = gw.admit()?;
        infer_one(gw, msg, &ctx, &mut held, &mut obs).await
    }
    .await;
    let bytes_out = result.as_ref().map_or(0, |r| r.encoded_len() as u64);
    finish(
        gw,
        INFER_PATH,
        (&mut obs, named.get().map(|(m, _)| m.as_str())),
        result.as_ref().err(),
        start,
        bytes_out,
    );
    abandoned.disarm();
    let backend = obs
        .backend
        .as_deref()
        .and_then(|b| MetadataValue::try_from(b).ok());
    let mut answer_metadata = MetadataMap::new();
    if let Some(b) = backend {
        answer_metadata.insert(names::BACKEND, b);
    }
    (result, answer_metadata)
}

/// One inference: lookup, decode, the core, encode.
async fn infer_one(
    gw: &Gateway,
    msg: pb::ModelInferRequest,
    ctx: &RpcContext,
    held: &mut Reservation,
    obs: &mut Observation,
) -> Result<pb::ModelInferResponse, GatewayError> {
    let config = gw.config();
    obs.bytes_in = msg.encoded_len() as u64;
    obs.note();
    super::required("model_name", &msg.model_name)?;
    let model = msg.model_name.clone();
    let version = Some(msg.model_version.clone()).filter(|v| !v.is_empty());
    let (entry, _pending) = core::begin(gw, &model, version.as_deref(), obs)?;
    let decoding = Phase::start();
    // Typed contents are converted element by element: many of them off the async threads.
    let limits = config.limits.protocol();
    let typed = decoded_extra(&msg);
    let req = heavy::run(typed, "decoding the request message", held, move |_| {
        decode_infer_request(msg, &limits)
    })
    .await??;
    decoding.end(&mut obs.compute_input);
    let binary_in = req.inputs.iter().map(|t| t.data.len() as u64).sum();
    let context = InferContext {
        model: &model,
        version: version.as_deref(),
        traceparent: ctx.traceparent.as_ref(),
        request_id: ctx.request_id.as_ref(),
        transport_deadline: ctx.deadline,
        original: None,
        binary_in,
        held,
    };
    match core::infer(gw, &config, &entry, &req, context, obs).await? {
        Outcome::Response {
            response,
            from_binary,
        } => {
            let encoding = Phase::start();
            if !from_binary {
                obs.json_to_binary += response
                    .outputs
                    .iter()
                    .map(|t| t.data.len() as u64)
                    .sum::<u64>();
            }
            let encoded = encode_infer_response(response);
            encoding.end(&mut obs.compute_output);
            Ok(encoded)
        }
        Outcome::PassThrough(_) => Err(GatewayError::Internal(
            "a gRPC request has no original body to pass through".into(),
        )),
    }
}

/// Records an inference RPC that a shared layer refused (a missing token, shedding). Other
/// RPCs, and unknown paths (whose names are the client's to choose), are not counted.
pub(super) fn observe_refusal(
    gw: &Gateway,
    path: &str,
    peer: Option<std::net::SocketAddr>,
    e: &GatewayError,
) {
    let mut obs = Observation::new(Protocol::Grpc);
    obs.peer = peer;
    if path == INFER_PATH || path == STREAM_PATH {
        finish(gw, path, (&mut obs, None), Some(e), Instant::now(), 0);
    } else {
        access_log(
            "gRPC",
            path,
            &obs,
            e.grpc_code() as u32,
            0,
            Duration::ZERO,
            Some(e.message()),
        );
    }
}

/// Records one RPC (or one message of a stream): metrics, statistics and the access log.
/// `named`: the model the message names, for the access line of a request that counts in
/// no model's series (a model or version the gateway does not serve).
fn finish(
    gw: &Gateway,
    path: &str,
    (obs, named): (&mut Observation, Option<&str>),
    error: Option<&GatewayError>,
    start: Instant,
    bytes_out: u64,
) {
    let elapsed = start.elapsed();
    let (status, code) = match error {
        None => (http::StatusCode::OK, tonic::Code::Ok),
        Some(e) => (e.status(), e.grpc_code()),
    };
    gw.metrics
        .grpc_requests
        .with_label_values(&[path, code_name(code)])
        .inc();
    obs.failure = error.map(crate::gateway::observe::failure_of);
    record_infer(&gw.metrics, &gw.stats, obs, status, elapsed, bytes_out);
    if obs.model.is_none() {
        obs.model = named.filter(|m| !m.is_empty()).map(str::to_string);
    }
    access_log(
        "gRPC",
        path,
        obs,
        code as u32,
        bytes_out,
        elapsed,
        error.map(GatewayError::message),
    );
}

/// The access-log message of a stream's request that was in flight when the stream ended.
const STREAM_ENDED: &str = "the stream ended before the answer (the client cancelled it or went away, or an earlier message could not be read)";

/// What a call that ended before its answer is known by: the client's request id, and the
/// model and version its message names once it has been read, and what it had got to.
struct Abandon<'a> {
    request_id: Option<HeaderValue>,
    peer: Option<std::net::SocketAddr>,
    model: Option<(String, Option<String>)>,
    trail: &'a Trail,
}

/// A ModelInfer, or one message of a stream, whose call ended before the answer (the
/// transport dropped its future): its access line and count, CANCELLED, and, once its
/// message named a model the gateway serves, that model's CANCELED failure (as REST counts
/// a client that went away).
fn went_away(gw: &Gateway, path: &'static str, start: Instant, why: &str, what: Abandon) {
    let elapsed = start.elapsed();
    let cut_off = gw.cut_off();
    let (code, why) = match cut_off {
        CutOff::ClientWentAway => (tonic::Code::Cancelled, why),
        CutOff::Shutdown => (tonic::Code::Unavailable, cut_off.message()),
    };
    gw.metrics
        .grpc_requests
        .with_label_values(&[path, code_name(code)])
        .inc();
    let mut obs = Observation::new(Protocol::Grpc);
    obs.request_id = what.request_id;
    obs.peer = what.peer;
    what.trail.fill(&mut obs);
    if let Some((model, version)) = what.model {
        gw.observe_model(model, version, &mut obs);
        obs.failure = Some(cut_off.reason());
        record_infer(&gw.metrics, &gw.stats, &obs, cut_off.status(), elapsed, 0);
    }
    access_log("gRPC", path, &obs, code as u32, 0, elapsed, Some(why));
}

/// The code's name as gRPC writes it, for a label value.
fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The sequence a stream message belongs to, as a key for ordering (not for routing): a hash
/// of the model and the id, so that a client's long ids cost nothing to keep.
fn sequence_key(head: &MessageHead) -> Option<u64> {
    use std::hash::BuildHasher;
    let id = peek_sequence_id(&head.parameters)?;
    Some(
        std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default()
            .hash_one((&head.model_name, id)),
    )
}

/// A stream's message as `stream` takes it: its bytes, decoded here with the budget for
/// bodies in view (`super::raw_stream`, the path every ModelStreamInfer takes), or as tonic's
/// generated service decoded it.
pub enum Incoming {
    Raw(Bytes),
    Decoded(pb::ModelInferRequest),
}

impl Incoming {
    /// What the message says of itself before its inputs are decoded; an error is that
    /// message's alone, answered with what could be read of its head.
    fn head(&self) -> (MessageHead, Option<GatewayError>) {
        let bytes = match self {
            Incoming::Decoded(msg) => return (MessageHead::of(msg), None),
            Incoming::Raw(bytes) => bytes,
        };
        // First: a map of millions of parameters would be decoded into one.
        if let Err(e) = check_fanout(bytes, INFER_REQUEST_FIELDS) {
            let refused = GatewayError::PayloadTooLarge(e.message().to_string());
            return (MessageHead::names_only(bytes), Some(refused));
        }
        match MessageHead::read(bytes) {
            Ok(head) => (head, None),
            Err(e) => {
                let refused =
                    GatewayError::BadRequest(format!("the request message is not valid: {e}"));
                (MessageHead::default(), Some(refused))
            }
        }
    }

    /// The message, decoded, with what it takes held in `held` from now until its answer.
    async fn decode(self, held: &mut Reservation) -> Result<pb::ModelInferRequest, GatewayError> {
        match self {
            Incoming::Decoded(msg) => {
                held.hold(msg.encoded_len().saturating_add(decoded_extra(&msg)))?;
                Ok(msg)
            }
            Incoming::Raw(bytes) => {
                held.hold(bytes.len())?;
                super::decode::decode_message(bytes, held).await
            }
        }
    }
}

/// Keeps the requests of each sequence on one stream in the order they were sent, while
/// requests of different sequences, and stateless ones, run concurrently: each sequence
/// request waits for the one before it on the same stream.
#[derive(Default)]
struct SequenceOrder(Mutex<HashMap<u64, oneshot::Receiver<()>>>);

impl SequenceOrder {
    /// Returns what to wait for before running, and what to drop when done.
    fn enter(&self, key: u64) -> (Option<oneshot::Receiver<()>>, oneshot::Sender<()>) {
        let (done, next) = oneshot::channel();
        let mut map = self.0.lock().expect("the order map is never poisoned");
        if map.len() >= 1024 {
            // Sequences whose last request finished need no more ordering.
            map.retain(|_, rx| matches!(rx.try_recv(), Err(oneshot::error::TryRecvError::Empty)));
        }
        (map.insert(key, next), done)
    }
}

pub fn stream<S>(
    gw: Arc<Gateway>,
    req: Request<S>,
    max_message: usize,
    idle: Option<Duration>,
) -> BoxStream<pb::ModelStreamInferResponse>
where
    S: Stream<Item = Result<Incoming, Status>> + Send + 'static,
{
    let ctx = RpcContext::from_headers(req.metadata().as_ref(), tokio::time::Instant::now());
    let peer = PeerAddr::of(req.extensions());
    // At shutdown, or once idle, a stream takes no more messages: one whose client sends
    // nothing would hold the drain to its deadline, or its connection's resources for ever.
    let watch = Arc::new(StreamWatch::new(idle));
    let ended = {
        let (closed, watch) = (gw.closed(), watch.clone());
        async move { watch.end(closed).await }
    };
    // (A stream its client had already ended is not cut: `take_until` stops polling.)
    let incoming = req.into_inner().take_until(ended);
    let order = Arc::new(SequenceOrder::default());
    let watch_end = watch.clone();
    let answers = incoming
        .map(move |m| {
            let gw = gw.clone();
            let ctx = ctx.clone();
            let watch = watch.clone();
            watch.arrived();
            // Read here, as messages arrive, so that each sequence's turns follow the wire.
            let head = m.as_ref().ok().map(Incoming::head);
            let turn = head
                .as_ref()
                .filter(|(_, refused)| refused.is_none())
                .and_then(|(h, _)| sequence_key(h))
                .map(|k| order.enter(k));
            async move {
                // A message that could not be read as a message (too large, a broken frame)
                // ends the stream with its status: what follows it on the wire cannot be
                // trusted either. One that is a message but not a valid request is answered
                // alone.
                let msg = m.map_err(|status| {
                    watch.answered();
                    super::routes::as_client_error(status, max_message)
                })?;
                let head = head.expect("a message read has a head, or why not");
                let (wait, done) = match turn {
                    Some((wait, done)) => (wait, Some(done)),
                    None => (None, None),
                };
                let answer = stream_message(&gw, (msg, head), (ctx, peer), wait).await;
                drop(done);
                watch.answered();
                Ok(answer)
            }
        })
        .buffered(STREAM_CONCURRENCY)
        .chain(futures_util::stream::iter(
            std::iter::from_fn(move || watch_end.status().map(Err)).take(1),
        ))
        // Nothing after the first error: the stream ends with it.
        .scan(
            false,
            |ended, item: Result<pb::ModelStreamInferResponse, Status>| {
                let out = (!*ended).then(|| {
                    *ended = item.is_err();
                    item
                });
                std::future::ready(out)
            },
        );
    Box::pin(answers)
}

/// One message of a stream, after `turn` (the end of the message before it in its
/// sequence): an error answers that message alone, and the stream goes on.
async fn stream_message(
    gw: &Gateway,
    (msg, (h, refused)): (Incoming, (MessageHead, Option<GatewayError>)),
    (ctx, peer): (
        Result<RpcContext, GatewayError>,
        Option<std::net::SocketAddr>,
    ),
    turn: Option<oneshot::Receiver<()>>,
) -> pb::ModelStreamInferResponse {
    let start = Instant::now();
    // Counted from when it is whole (waiting for its turn too) until its answer: up to
    // `STREAM_CONCURRENCY` of a stream's messages, inflated if they came compressed, with
    // what their decoded inputs take beyond their bytes.
    let mut held = gw.bodies.reserve();
    let model = (
        h.model_name.clone(),
        Some(h.model_version.clone()).filter(|v| !v.is_empty()),
    );
    let (id, says_final) = (h.id.clone(), asks_final_flag(&h.parameters));
    let decoded = match refused {
        None => msg.decode(&mut held).await,
        Some(e) => Err(e),
    };
    let request_id = ctx.as_ref().ok().and_then(|c| c.request_id.clone());
    // Armed before the wait for its turn: a message cut off while it waits is counted too.
    let trail = Arc::new(Trail::default());
    let abandoned = Abandoned::new(|| {
        let what = Abandon {
            request_id: request_id.clone(),
            peer,
            model: Some(model.clone()),
            trail: &trail,
        };
        went_away(gw, STREAM_PATH, start, STREAM_ENDED, what)
    });
    if let Some(previous) = turn {
        let _ = previous.await;
    }
    let _in_flight = Raised::new(gw.metrics.in_flight.clone());
    let mut obs = Observation::new(Protocol::Grpc);
    obs.request_id = request_id.clone();
    obs.peer = peer;
    obs.trail = Some(trail.clone());
    let result = async {
        let msg = decoded?;
        let ctx = ctx?;
        let _permit = gw.admit()?;
        infer_one(gw, msg, &ctx, &mut held, &mut obs).await
    }
    .await;
    drop(held);
    let bytes_out = result.as_ref().map_or(0, |r| r.encoded_len() as u64);
    finish(
        gw,
        STREAM_PATH,
        (&mut obs, Some(&model.0)),
        result.as_ref().err(),
        start,
        bytes_out,
    );
    abandoned.disarm();
    let mut answer = match result {
        Ok(r) => pb::ModelStreamInferResponse {
            error_message: String::new(),
            infer_response: Some(r),
        },
        // The request's id, as Triton sends it, tells the client which request failed.
        Err(e) => pb::ModelStreamInferResponse {
            error_message: e.short_message().into_owned(),
            infer_response: Some(pb::ModelInferResponse {
                id,
                ..Default::default()
            }),
        },
    };
    if says_final {
        // One answer per request (no decoupled models here): each is its request's last, as
        // Triton marks the answer of a model that is not decoupled.
        if let Some(r) = answer.infer_response.as_mut() {
            r.parameters.insert(
                FINAL_RESPONSE.to_string(),
                pb::InferParameter {
                    parameter_choice: Some(pb::infer_parameter::ParameterChoice::BoolParam(true)),
                },
            );
        }
    }
    answer
}

/// Whether a stream's request set `triton_enable_empty_final_response` (a non-bool value is
/// refused with the request's other parameters).
fn asks_final_flag(parameters: &HashMap<String, pb::InferParameter>) -> bool {
    matches!(
        parameters
            .get(ENABLE_EMPTY_FINAL_RESPONSE)
            .and_then(|p| p.parameter_choice.as_ref()),
        Some(pb::infer_parameter::ParameterChoice::BoolParam(true))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts() {
        assert_eq!(parse_grpc_timeout(b"5S"), Some(Duration::from_secs(5)));
        assert_eq!(
            parse_grpc_timeout(b"250m"),
            Some(Duration::from_millis(250))
        );
        assert_eq!(parse_grpc_timeout(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(
            parse_grpc_timeout(b"99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in [&b""[..], b"S", b"5", b"5s", b"123456789S", b"-1S", b"1.5S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    /// A call whose grpc-timeout cannot be read is refused, naming the header and its value,
    /// rather than run without the deadline its client asked for.
    #[tokio::test]
    async fn an_unreadable_grpc_timeout_is_invalid_argument() {
        let arrived = tokio::time::Instant::now();
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-timeout", HeaderValue::from_static("5s"));
        let e = RpcContext::from_headers(&headers, arrived)
            .err()
            .expect("refused");
        assert_eq!(
            (e.grpc_code(), e.message()),
            (
                tonic::Code::InvalidArgument,
                "grpc-timeout '5s' is not a valid timeout"
            )
        );
        headers.insert("grpc-timeout", HeaderValue::from_static("250m"));
        let context = RpcContext::from_headers(&headers, arrived).unwrap();
        assert_eq!(context.deadline, Some(arrived + Duration::from_millis(250)));
    }

    #[tokio::test]
    async fn a_sequence_waits_for_its_previous_request_only() {
        let order = SequenceOrder::default();
        let (first_wait, first_done) = order.enter(1);
        assert!(first_wait.is_none());
        let (second_wait, _second_done) = order.enter(1);
        let (other_wait, _) = order.enter(2);
        assert!(other_wait.is_none());
        let mut second_wait = second_wait.expect("the second request of 'a' waits");
        assert!(second_wait.try_recv().is_err());
        drop(first_done);
        assert!(matches!(
            second_wait.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        ));
    }
}
