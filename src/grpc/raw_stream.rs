//! ModelStreamInfer with messages decoded by the gateway rather than by tonic's codec. tonic
//! frames, inflates and bounds each message as before; the codec only hands its bytes on,
//! and `infer::stream` decodes them (`super::decode`): with what they decode to held in the
//! budget for bodies before prost allocates it, on the blocking pool when they are large,
//! and with a message that is not a valid request answered alone while the stream goes on.
//! tonic's decoding ended the stream for such a message, decoded a message of empty entries
//! to many times the budget (2 GB from 117 KB of gzip), and did it on the async threads.
//! Compressed messages are inflated before tonic sees them, by `inflated_messages`, for the
//! same reasons.

use std::sync::Arc;

use bytes::{Buf, Bytes};
use futures_util::StreamExt;
use http::{Request, Response};
use tonic::body::Body;
use tonic::codec::{BufferSettings, Codec, CompressionEncoding, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::{ProstCodec, ProstEncoder};

use super::decode::message_coding;
use super::infer::Incoming;
use super::inflated_messages::InflatedMessages;
use super::BoxStream;
use crate::body::BoxError;
use crate::gateway::Gateway;
use crate::protocol::grpc::pb;

/// Answers as prost encodes them; requests as their bytes.
struct BytesIn;

impl Codec for BytesIn {
    type Encode = pb::ModelStreamInferResponse;
    type Decode = Bytes;
    type Encoder = ProstEncoder<pb::ModelStreamInferResponse>;
    type Decoder = MessageBytes;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<pb::ModelStreamInferResponse, ()>::raw_encoder(BufferSettings::default())
    }

    fn decoder(&mut self) -> MessageBytes {
        MessageBytes
    }
}

struct MessageBytes;

impl Decoder for MessageBytes {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(buf.copy_to_bytes(buf.remaining())))
    }
}

struct StreamService {
    gw: Arc<Gateway>,
    max_message: usize,
}

impl tonic::server::StreamingService<Bytes> for StreamService {
    type Response = pb::ModelStreamInferResponse;
    type ResponseStream = BoxStream<pb::ModelStreamInferResponse>;
    type Future = std::future::Ready<Result<tonic::Response<Self::ResponseStream>, Status>>;

    fn call(&mut self, req: tonic::Request<tonic::Streaming<Bytes>>) -> Self::Future {
        let req = req.map(|messages| messages.map(|m| m.map(Incoming::Raw)));
        let answers = super::infer::stream(
            self.gw.clone(),
            req,
            self.max_message,
            super::stream_idle(&self.gw),
        );
        std::future::ready(Ok(tonic::Response::new(answers)))
    }
}

/// The whole ModelStreamInfer call. `max_message`: `limits.max_body_bytes`, the most a
/// message may be, inflated or not; gzip and deflate are accepted, as on every other RPC.
pub(super) async fn model_stream_infer<B>(
    gw: Arc<Gateway>,
    req: Request<B>,
    max_message: usize,
) -> Response<Body>
where
    B: http_body::Body<Data = Bytes, Error = BoxError> + Send + 'static,
{
    // Compressed messages are inflated before tonic sees them (`inflated_messages`).
    let coding = message_coding(req.headers()).unwrap_or(None);
    let budget = gw.bodies.clone();
    let req = req.map(|b| InflatedMessages::new(b, coding, max_message, budget));
    let mut grpc = tonic::server::Grpc::new(BytesIn)
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Deflate)
        .max_decoding_message_size(max_message)
        .max_encoding_message_size(usize::MAX);
    grpc.streaming(StreamService { gw, max_message }, req).await
}
