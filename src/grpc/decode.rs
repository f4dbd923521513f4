//! A ModelInferRequest's bytes, decoded: for unary calls and stream messages alike. Before
//! prost sees them, the wire is counted (`check_fanout`), the inputs scanned against their
//! shapes (`check_contents`), and what they will take once decoded held in the budget for
//! bodies beside the bytes: an empty `bytes_contents` entry is 2 bytes on the wire and 32
//! decoded, so a small message may decode to many times its size. A large message is scanned
//! and decoded on the blocking pool, so that the requests sharing its thread (health probes
//! among them) do not wait for it.

use bytes::Bytes;
use prost::Message;

use crate::error::GatewayError;
use crate::gateway::body_budget::Reservation;
use crate::gateway::heavy;
use crate::protocol::grpc::{check_contents, check_fanout, pb, INFER_REQUEST_FIELDS};

/// `bytes`, decoded, with what the decoded message takes held in `held` (which already
/// holds the bytes).
pub(super) async fn decode_message(
    bytes: Bytes,
    held: &mut Reservation,
) -> Result<pb::ModelInferRequest, GatewayError> {
    let mut moved = std::mem::take(held);
    let size = bytes.len();
    let (decoded, back) = heavy::run(size, "decoding the request message", move || {
        (decode(bytes, &mut moved), moved)
    })
    .await?;
    *held = back;
    decoded
}

fn decode(bytes: Bytes, held: &mut Reservation) -> Result<pb::ModelInferRequest, GatewayError> {
    check_fanout(&bytes, INFER_REQUEST_FIELDS)
        .map_err(|e| GatewayError::PayloadTooLarge(e.message().to_string()))?;
    let extra = check_contents(&bytes)?;
    let total = bytes.len().saturating_add(extra);
    if let Some(limit) = held.limit().filter(|&limit| total > limit) {
        return Err(GatewayError::PayloadTooLarge(format!(
            "the request message decodes to {total} bytes, more than the {limit} bytes all request bodies may hold at once (limits.max_buffered_body_bytes)"
        )));
    }
    held.hold(total)?;
    pb::ModelInferRequest::decode(bytes)
        .map_err(|e| GatewayError::BadRequest(format!("the request message is not valid: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::body_budget::BodyBudget;

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
