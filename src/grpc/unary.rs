//! ModelInfer without tonic's message buffers. The request message is read into one buffer of
//! the size its frame declares (or sliced, when one DATA frame holds it whole), and the
//! answer's raw outputs go out as they are: a small encoded head, then each output's bytes as
//! a DATA chunk of its own. prost, through tonic, copies every output into one contiguous
//! message first: for a 4 MiB tensor a 4 MiB copy into a fresh buffer per answer, which made
//! a gRPC answer cost more CPU than the same answer over REST (BENCHMARKS.md, section 7).
//!
//! The wire is the same either way: `raw_output_contents` is the last field of
//! `ModelInferResponse`, so the head followed by its entries is the encoding prost would
//! write. gzip and deflate messages are inflated here too, into a buffer that grows with
//! what they inflate to, bounded by `limits.max_body_bytes` (tonic reserved the declared
//! length at once); other encodings go to tonic, which refuses them.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};
use prost::Message;
use tonic::body::Body;

use super::decode::{inflate_message, message_coding};
use super::infer::{call, parse_grpc_timeout, INFER_PATH};
use super::routes::message_too_large;
use crate::body::BoxError;
use crate::body_budget::Reservation;
use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::protocol::grpc::pb;

/// The length-prefixed message's header: a compression flag and a big-endian length.
const HEADER: usize = 5;
/// `raw_output_contents`, field 6 of `ModelInferResponse`.
const RAW_OUTPUT_FIELD: u32 = 6;

/// Whether this path serves the request: ModelInfer, in an encoding it reads (tonic's
/// service answers the others, UNIMPLEMENTED naming what it accepts).
pub(super) fn handles<B>(req: &Request<B>) -> bool {
    req.uri().path() == INFER_PATH && message_coding(req.headers()).is_ok()
}

/// The whole call: read, infer, answer. `max`: `limits.max_body_bytes`.
pub(super) async fn model_infer<B>(gw: Arc<Gateway>, req: Request<B>, max: usize) -> Response<Body>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let arrived = tokio::time::Instant::now();
    let coding = message_coding(req.headers()).unwrap_or(None);
    let (parts, body) = req.into_parts();
    // The call's own deadline bounds the wait for its message too (an invalid grpc-timeout
    // is answered once the message is read, with the rest of the metadata).
    let deadline = parts
        .headers
        .get("grpc-timeout")
        .and_then(|v| parse_grpc_timeout(v.as_bytes()));
    // The message counts against the budget for bodies until its answer is ready.
    let mut held = gw.bodies.reserve();
    let read = read_message(body, max, coding.is_some(), &mut held);
    let read = match deadline {
        None => read.await,
        Some(wait) => tokio::time::timeout(wait, read).await.unwrap_or_else(|_| {
            Err(ReadFailure::Refused(GatewayError::Timeout(format!(
                "the call's deadline (grpc-timeout, {} ms) passed before its request message arrived",
                wait.as_millis()
            ))))
        }),
    };
    let bytes = match read {
        Ok(bytes) => Ok(bytes),
        Err(ReadFailure::Refused(e)) => Err(e),
        // No one is left to answer, and nothing to count: tonic's path did not see these
        // either (an ended benchmark's calls in flight, a client's cancel).
        Err(ReadFailure::Gone(why)) => return tonic::Status::cancelled(why).into_http(),
    };
    let read = async {
        let (compressed, bytes) = bytes?;
        let bytes = match coding.filter(|_| compressed) {
            Some(coding) => inflate_message(bytes, coding, max, &mut held).await?,
            None => bytes,
        };
        let msg = super::decode::decode_message(bytes, &mut held).await?;
        Ok((msg, held))
    };
    let peer = crate::gateway::observe::PeerAddr::of(&parts.extensions);
    let (result, metadata) = call(&gw, &parts.headers, peer, arrived, read).await;
    let answer = result.and_then(|r| {
        answer_chunks(r).map_err(|size| {
            GatewayError::Internal(format!(
                "the answer is {size} bytes, more than a gRPC message can hold (4 GiB)"
            ))
        })
    });
    match answer {
        Ok(chunks) => {
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            let frames = chunks
                .into_iter()
                .map(Frame::data)
                .chain(std::iter::once(Frame::trailers(trailers)))
                .map(Ok::<_, std::convert::Infallible>);
            let mut response = Response::new(Body::new(StreamBody::new(
                futures_util::stream::iter(frames),
            )));
            let headers = response.headers_mut();
            *headers = metadata.into_headers();
            headers.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            response
        }
        Err(e) => e.to_grpc_with(metadata).into_http(),
    }
}

/// Why a request message was not read.
enum ReadFailure {
    /// The client's error, answered and counted like any other.
    Refused(GatewayError),
    /// The stream broke under the read (the client cancelled the call, or its connection
    /// ended): there is no one to answer.
    Gone(String),
}

impl From<GatewayError> for ReadFailure {
    fn from(e: GatewayError) -> Self {
        ReadFailure::Refused(e)
    }
}

/// The one message of a unary call. A message larger than `max` is refused from its header,
/// before its bytes are read; a body that ends inside the message, or carries a second one,
/// is the client's error.
async fn read_message<B>(
    body: B,
    max: usize,
    may_be_compressed: bool,
    held: &mut Reservation,
) -> Result<(bool, Bytes), ReadFailure>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut header = [0u8; HEADER];
    let mut header_len = 0;
    // The declared length, and the message as far as it has arrived.
    let mut message: Option<(usize, BytesMut)> = None;
    let mut whole: Option<Bytes> = None;
    let mut compressed = false;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| read_failure(e.into()))?;
        let Ok(mut data) = frame.into_data() else {
            continue; // trailers carry nothing a unary request needs
        };
        while !data.is_empty() {
            if whole.is_some() {
                return Err(
                    not_valid("a unary call carries one message, and this one has more").into(),
                );
            }
            if let Some((len, buf)) = &mut message {
                let take = (*len - buf.len()).min(data.len());
                held.hold(buf.len() + take)?;
                buf.extend_from_slice(&data.split_to(take));
                if buf.len() == *len {
                    whole = message.take().map(|(_, buf)| buf.freeze());
                }
                continue;
            }
            let take = (HEADER - header_len).min(data.len());
            header[header_len..header_len + take].copy_from_slice(&data.split_to(take));
            header_len += take;
            if header_len < HEADER {
                continue;
            }
            let len = u32::from_be_bytes(header[1..].try_into().expect("four bytes")) as usize;
            match header[0] {
                0 => {}
                1 if may_be_compressed => compressed = true,
                1 => {
                    return Err(not_valid(
                        "protocol error: received message with compressed-flag but grpc-encoding names no compression",
                    ).into())
                }
                f => {
                    return Err(not_valid(&format!(
                        "protocol error: received message with invalid compression flag: {f} (valid flags are 0 and 1), while sending request"
                    )).into())
                }
            }
            if len > max {
                return Err(GatewayError::PayloadTooLarge(message_too_large(max, false)).into());
            }
            if data.len() >= len {
                // The usual small message: all of it in this frame, kept without a copy.
                held.hold(len)?;
                whole = Some(data.split_to(len));
            } else {
                held.hold(data.len())?;
                let mut buf = BytesMut::with_capacity(crate::body::initial_capacity(len));
                buf.extend_from_slice(&data.split_to(data.len()));
                message = Some((len, buf));
            }
        }
    }
    let refused = match (whole, message) {
        (Some(bytes), _) => return Ok((compressed, bytes)),
        (None, Some((len, buf))) => not_valid(&format!(
            "the body ended after {} of the message's {len} bytes",
            buf.len()
        )),
        (None, None) if header_len == 0 => not_valid("Missing request message."),
        (None, None) => not_valid(&format!(
            "the body ended inside the message's header ({header_len} of {HEADER} bytes)"
        )),
    };
    Err(refused.into())
}

fn not_valid(why: &str) -> GatewayError {
    GatewayError::BadRequest(format!("the request message is not valid: {why}"))
}

/// A failed read of the body: its own bounds (`BoundedBody`) say why in a gRPC status, and
/// are the client's to answer for; anything else is the stream breaking.
fn read_failure(e: BoxError) -> ReadFailure {
    match e.downcast::<tonic::Status>() {
        Ok(status) => ReadFailure::Refused(match status.code() {
            tonic::Code::DeadlineExceeded => GatewayError::RequestTimeout(status.message().into()),
            tonic::Code::ResourceExhausted => {
                GatewayError::PayloadTooLarge(status.message().into())
            }
            _ => GatewayError::BadRequest(status.message().into()),
        }),
        Err(e) => ReadFailure::Gone(format!("the request message did not arrive: {e}")),
    }
}

/// The answer as DATA chunks: the gRPC header, the message without its raw outputs and the
/// first entry's key and length; then each output's bytes, each followed by the next
/// entry's key and length. `Err`: the message's size, when it is over gRPC's 4 GiB.
fn answer_chunks(mut msg: pb::ModelInferResponse) -> Result<Vec<Bytes>, usize> {
    let raw = std::mem::take(&mut msg.raw_output_contents);
    let entry_head = |len: usize| 1 + encoded_len_varint(len as u64);
    let head_len = msg.encoded_len();
    let size = head_len
        + raw
            .iter()
            .map(|r| entry_head(r.len()) + r.len())
            .sum::<usize>();
    let declared = u32::try_from(size).map_err(|_| size)?;
    let mut first =
        BytesMut::with_capacity(HEADER + head_len + raw.first().map_or(0, |r| entry_head(r.len())));
    first.put_u8(0);
    first.put_u32(declared);
    msg.encode(&mut first)
        .expect("the buffer was sized for the message");
    let mut chunks = Vec::with_capacity(2 * raw.len() + 1);
    let mut pending = first;
    for output in raw {
        encode_key(RAW_OUTPUT_FIELD, WireType::LengthDelimited, &mut pending);
        encode_varint(output.len() as u64, &mut pending);
        chunks.push(pending.split().freeze());
        if !output.is_empty() {
            chunks.push(output);
        }
    }
    if !pending.is_empty() {
        chunks.push(pending.freeze());
    }
    Ok(chunks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::inflate::Coding;
    use crate::protocol::grpc::pb::model_infer_response::InferOutputTensor;
    use futures_util::FutureExt;

    fn response(raw: Vec<Bytes>) -> pb::ModelInferResponse {
        pb::ModelInferResponse {
            model_name: "m".into(),
            model_version: "1".into(),
            id: "x".into(),
            parameters: Default::default(),
            outputs: raw
                .iter()
                .enumerate()
                .map(|(i, _)| InferOutputTensor {
                    name: format!("OUTPUT{i}"),
                    datatype: "UINT8".into(),
                    shape: vec![1],
                    ..Default::default()
                })
                .collect(),
            raw_output_contents: raw,
        }
    }

    /// The chunks make one gRPC frame whose message is the answer, as prost writes it.
    #[test]
    fn the_chunks_are_the_message_prost_would_write() {
        for raw in [
            vec![],
            vec![Bytes::from_static(b"abc")],
            vec![
                Bytes::new(),
                Bytes::from(vec![7u8; 300]),
                Bytes::from_static(b"z"),
            ],
        ] {
            let msg = response(raw.clone());
            let chunks = answer_chunks(msg.clone()).unwrap();
            // The outputs' own buffers are sent, not copies.
            for r in raw.iter().filter(|r| !r.is_empty()) {
                assert!(chunks.iter().any(|c| c.as_ptr() == r.as_ptr()));
            }
            let wire: Vec<u8> = chunks.concat();
            assert_eq!(wire[0], 0);
            let len = u32::from_be_bytes(wire[1..5].try_into().unwrap()) as usize;
            assert_eq!(len, wire.len() - 5);
            assert_eq!(wire[5..], msg.encode_to_vec()[..]);
        }
    }

    fn body(chunks: &[&[u8]]) -> impl http_body::Body<Data = Bytes, Error = BoxError> {
        let frames: Vec<Result<Frame<Bytes>, BoxError>> = chunks
            .iter()
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    fn read(chunks: &[&[u8]], max: usize) -> Result<Bytes, String> {
        read_message(body(chunks), max, false, &mut Reservation::default())
            .now_or_never()
            .expect("a ready body")
            .map(|(_, bytes)| bytes)
            .map_err(|e| match e {
                ReadFailure::Refused(e) => format!("{:?} {}", e.grpc_code(), e.message()),
                ReadFailure::Gone(why) => format!("gone: {why}"),
            })
    }

    fn framed(flag: u8, message: &[u8]) -> Vec<u8> {
        let mut v = vec![flag];
        v.extend_from_slice(&(message.len() as u32).to_be_bytes());
        v.extend_from_slice(message);
        v
    }

    #[test]
    fn a_message_is_read_however_the_frames_split_it() {
        let wire = framed(0, b"hello, world");
        assert_eq!(read(&[&wire], 100).unwrap(), &b"hello, world"[..]);
        for cut in 1..wire.len() {
            let (a, b) = wire.split_at(cut);
            assert_eq!(
                read(&[a, b], 100).unwrap(),
                &b"hello, world"[..],
                "cut at {cut}"
            );
        }
        let bytes: Vec<&[u8]> = wire.chunks(1).collect();
        assert_eq!(read(&bytes, 100).unwrap(), &b"hello, world"[..]);
        assert_eq!(read(&[&framed(0, b"")], 100).unwrap(), &b""[..]);
    }

    fn failing(error: BoxError) -> String {
        let frames: Vec<Result<Frame<Bytes>, BoxError>> =
            vec![Ok(Frame::data(Bytes::from_static(&[0, 0, 0]))), Err(error)];
        match read_message(
            StreamBody::new(futures_util::stream::iter(frames)),
            100,
            false,
            &mut Reservation::default(),
        )
        .now_or_never()
        .expect("a ready body")
        {
            Ok(_) => "read".into(),
            Err(ReadFailure::Refused(e)) => format!("{:?} {}", e.grpc_code(), e.message()),
            Err(ReadFailure::Gone(why)) => format!("gone: {why}"),
        }
    }

    fn compress(coding: Coding, data: &[u8]) -> Bytes {
        use std::io::Write;
        let mut out = Vec::new();
        match coding {
            Coding::Gzip => {
                let mut e = flate2::write::GzEncoder::new(&mut out, flate2::Compression::best());
                e.write_all(data).unwrap();
                e.finish().unwrap();
            }
            Coding::Deflate => {
                let mut e = flate2::write::ZlibEncoder::new(&mut out, flate2::Compression::best());
                e.write_all(data).unwrap();
                e.finish().unwrap();
            }
        }
        Bytes::from(out)
    }

    fn inflated(coding: Coding, data: Bytes, max: usize) -> Result<Bytes, String> {
        inflate_message(data, coding, max, &mut Reservation::default())
            .now_or_never()
            .expect("inline for small messages")
            .map_err(|e| format!("{:?} {}", e.grpc_code(), e.message()))
    }

    /// gzip and deflate inflate to the message; one that inflates past the limit is refused
    /// (a bomb of zeros, a few hundred bytes on the wire), and one that is not compressed
    /// data says so.
    #[test]
    fn compressed_messages_inflate_within_the_limit() {
        let message = b"a request message".repeat(10);
        for encoding in [Coding::Gzip, Coding::Deflate] {
            let wire = compress(encoding, &message);
            assert_eq!(inflated(encoding, wire, 1000).unwrap(), &message[..]);
            let bomb = compress(encoding, &vec![0u8; 1 << 20]);
            assert!(bomb.len() < 8192, "{}", bomb.len());
            assert_eq!(
                inflated(encoding, bomb, 1000).unwrap_err(),
                "ResourceExhausted the request message, decompressed, is larger than the limit of 1000 bytes (limits.max_body_bytes)"
            );
            let garbage =
                inflated(encoding, Bytes::from_static(b"not compressed"), 1000).unwrap_err();
            assert!(
                garbage.starts_with(
                    "InvalidArgument the request message is not valid: Error decompressing: "
                ),
                "{garbage}"
            );
        }
    }

    /// A message that inflates past what is inflated inline finishes on the blocking pool,
    /// to the same bytes.
    #[tokio::test(flavor = "current_thread")]
    async fn a_large_compressed_message_inflates_off_the_runtime_thread() {
        let mut rng = fastrand::Rng::with_seed(7);
        let message: Vec<u8> = (0..1_000_000).map(|_| rng.u8(..)).collect();
        let wire = compress(Coding::Gzip, &message);
        let inflated = inflate_message(wire, Coding::Gzip, 1 << 20, &mut Reservation::default())
            .await
            .unwrap();
        assert_eq!(inflated, &message[..]);
    }

    /// What a message inflates to counts against the gateway's budget for bodies as it
    /// inflates, beside its compressed bytes, on the blocking pool too: past what other
    /// bodies left it is UNAVAILABLE (the gateway's state, not the client's error), and what
    /// it held is given back; once inflated it holds its inflated length.
    #[tokio::test(flavor = "current_thread")]
    async fn inflating_counts_against_the_budget_for_bodies() {
        use crate::body_budget::BodyBudget;
        let gauge = prometheus::IntGauge::new("held", "held").unwrap();
        let budget = BodyBudget::new(1 << 20, gauge.clone());
        let mut rng = fastrand::Rng::with_seed(7);
        let message: Vec<u8> = (0..200_000).map(|_| rng.u8(..)).collect();
        let wire = compress(Coding::Gzip, &message);
        // Another body holds 700 KB: 200 KB compressed and 200 KB inflated do not fit.
        let mut other = budget.reserve();
        other.hold(700_000).unwrap();
        let mut held = budget.reserve();
        let refused = inflate_message(wire.clone(), Coding::Gzip, 1 << 20, &mut held)
            .await
            .unwrap_err();
        assert_eq!(
            (refused.grpc_code(), refused.message()),
            (
                tonic::Code::Unavailable,
                "tensorgate holds its limit of 1048576 bytes of request bodies (limits.max_buffered_body_bytes); retry later"
            )
        );
        drop(held);
        assert_eq!(gauge.get(), 700_000);

        drop(other);
        let mut held = budget.reserve();
        let inflated = inflate_message(wire, Coding::Gzip, 1 << 20, &mut held)
            .await
            .unwrap();
        assert_eq!(inflated.len(), 200_000);
        assert_eq!(gauge.get(), 200_000);
        drop(held);
        assert_eq!(gauge.get(), 0);
    }

    /// The body's own bounds are the client's error; a broken stream is no one's to answer.
    #[test]
    fn a_read_that_fails_says_whose_it_is() {
        assert_eq!(
            failing(Box::new(tonic::Status::deadline_exceeded("too slow"))),
            "DeadlineExceeded too slow"
        );
        assert_eq!(
            failing(Box::new(tonic::Status::resource_exhausted("too big"))),
            "ResourceExhausted too big"
        );
        assert_eq!(
            failing(Box::new(std::io::Error::other("stream reset"))),
            "gone: the request message did not arrive: stream reset"
        );
    }

    #[test]
    fn a_bad_body_is_the_clients_error_and_says_why() {
        let not_valid =
            |why: &str| format!("InvalidArgument the request message is not valid: {why}");
        assert_eq!(
            read(&[], 100).unwrap_err(),
            not_valid("Missing request message.")
        );
        assert_eq!(
            read(&[&[0, 0]], 100).unwrap_err(),
            not_valid("the body ended inside the message's header (2 of 5 bytes)")
        );
        let wire = framed(0, b"hello");
        assert_eq!(
            read(&[&wire[..7]], 100).unwrap_err(),
            not_valid("the body ended after 2 of the message's 5 bytes")
        );
        let two = [framed(0, b"a"), framed(0, b"b")].concat();
        assert_eq!(
            read(&[&two], 100).unwrap_err(),
            not_valid("a unary call carries one message, and this one has more")
        );
        assert_eq!(
            read(&[&framed(1, b"x")], 100).unwrap_err(),
            not_valid("protocol error: received message with compressed-flag but grpc-encoding names no compression")
        );
        assert_eq!(
            read(&[&framed(2, b"x")], 100).unwrap_err(),
            not_valid("protocol error: received message with invalid compression flag: 2 (valid flags are 0 and 1), while sending request")
        );
        // Refused from the header alone: the 101 bytes are never waited for.
        assert_eq!(
            read(&[&framed(0, &[0; 101])[..HEADER]], 100).unwrap_err(),
            "ResourceExhausted the request message is larger than the limit of 100 bytes (limits.max_body_bytes)"
        );
    }
}
