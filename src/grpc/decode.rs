//! A ModelInferRequest's bytes, decoded: for unary calls and stream messages alike. Before
//! prost sees them, the wire is counted (`check_fanout`), the inputs scanned against their
//! shapes (`check_contents`), and what they will take once decoded held in the budget for
//! bodies beside the bytes: an empty `bytes_contents` entry is 2 bytes on the wire and 32
//! decoded, so a small message may decode to many times its size. A large message is scanned
//! and decoded on the blocking pool, so that the requests sharing its thread (health probes
//! among them) do not wait for it.

use bytes::Bytes;
use prost::Message;

use super::routes::message_too_large;
use crate::body_budget::Reservation;
use crate::error::GatewayError;
use crate::gateway::heavy;
use crate::gateway::inflate::{inflate, Coding, InflateError};
use crate::protocol::grpc::{check_contents, check_fanout, pb, INFER_REQUEST_FIELDS};

/// A call's `grpc-encoding` that is not inflated here: tonic refuses its compressed messages.
#[derive(Debug, PartialEq)]
pub(super) struct OtherCoding;

/// A call's message coding (`grpc-encoding`): none (identity), or gzip or deflate, which the
/// gateway inflates itself. gRPC's "deflate" is zlib's format, as HTTP's is.
pub(super) fn message_coding(headers: &http::HeaderMap) -> Result<Option<Coding>, OtherCoding> {
    match headers.get("grpc-encoding").map(|v| v.as_bytes()) {
        None | Some(b"identity") => Ok(None),
        Some(b"gzip") => Ok(Some(Coding::Gzip)),
        Some(b"deflate") => Ok(Some(Coding::Deflate)),
        Some(_) => Err(OtherCoding),
    }
}

/// A compressed message as it was before compression, at most `max` bytes of it, counted in
/// `held` as it inflates (`gateway::inflate` says where and how): for unary calls and
/// stream messages alike.
pub(super) async fn inflate_message(
    bytes: Bytes,
    coding: Coding,
    max: usize,
    held: &mut Reservation,
) -> Result<Bytes, GatewayError> {
    inflate(bytes, coding, max, held)
        .await
        .map_err(|e| match e {
            InflateError::Invalid(why) => GatewayError::BadRequest(format!(
            "the request message is not valid: Error decompressing: {why}, while sending request"
        )),
            InflateError::TooLarge => GatewayError::PayloadTooLarge(message_too_large(max, true)),
            InflateError::Refused(e) => e,
        })
}

/// `bytes`, decoded, with what the decoded message takes held in `held` (which already
/// holds the bytes).
pub(super) async fn decode_message(
    bytes: Bytes,
    held: &mut Reservation,
) -> Result<pb::ModelInferRequest, GatewayError> {
    let size = bytes.len();
    heavy::run(size, "decoding the request message", held, move |held| {
        decode(bytes, held)
    })
    .await?
}

fn decode(bytes: Bytes, held: &mut Reservation) -> Result<pb::ModelInferRequest, GatewayError> {
    check_fanout(&bytes, INFER_REQUEST_FIELDS)
        .map_err(|e| GatewayError::PayloadTooLarge(e.message().to_string()))?;
    let extra = check_contents(&bytes)?;
    let total = bytes.len().saturating_add(extra);
    held.hold_decoded(total, "request message")?;
    pb::ModelInferRequest::decode(bytes)
        .map_err(|e| GatewayError::BadRequest(format!("the request message is not valid: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body_budget::BodyBudget;

    fn strings(n: usize) -> Bytes {
        pb::ModelInferRequest {
            model_name: "m".into(),
            inputs: vec![pb::model_infer_request::InferInputTensor {
                name: "IN".into(),
                datatype: "BYTES".into(),
                shape: vec![n as i64],
                contents: Some(pb::InferTensorContents {
                    bytes_contents: vec![Default::default(); n],
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }
        .encode_to_vec()
        .into()
    }

    /// Small and large messages decode alike, holding their decoded size; one that would
    /// decode past the whole budget is refused by what it decodes to, and holds nothing.
    #[tokio::test(flavor = "current_thread")]
    async fn messages_hold_what_they_decode_to() {
        let gauge = prometheus::IntGauge::new("held", "held").unwrap();
        let budget = BodyBudget::new(8 << 20, gauge.clone());
        for n in [10, 100_000] {
            let bytes = strings(n);
            let len = bytes.len();
            let mut held = budget.reserve();
            let msg = decode_message(bytes, &mut held).await.unwrap();
            assert_eq!(
                msg.inputs[0]
                    .contents
                    .as_ref()
                    .unwrap()
                    .bytes_contents
                    .len(),
                n
            );
            assert!(gauge.get() as usize > len + 32 * n, "{n}: {}", gauge.get());
            drop(held);
            assert_eq!(gauge.get(), 0);
        }
        let bytes = strings(300_000);
        let len = bytes.len();
        let refused = decode_message(bytes, &mut budget.reserve())
            .await
            .unwrap_err();
        let decoded: usize = refused
            .message()
            .split(' ')
            .nth(5)
            .and_then(|n| n.parse().ok())
            .unwrap();
        assert!(decoded > len + 32 * 300_000, "{refused:?}");
        assert_eq!(
            refused.message(),
            format!("the request message decodes to {decoded} bytes, more than the 8388608 bytes all request bodies may hold at once (limits.max_buffered_body_bytes)")
        );
        assert_eq!(gauge.get(), 0);
    }
}
