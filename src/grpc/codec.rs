//! prost's codec with checks before each decode: `protocol::grpc::check_fanout` (and, for
//! ModelInfer, `check_ranks`), so that a message of many empty repeated entries or of a
//! shape with millions of dimensions cannot make the decoder allocate many times its size. The generated service and client use it (`codec_path` in build.rs).

use std::any::TypeId;
use std::marker::PhantomData;

use prost::bytes::Buf;
use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

use crate::protocol::grpc::{check_fanout, check_ranks, pb, INFER_REQUEST_FIELDS};

pub struct GuardedCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for GuardedCodec<T, U> {
    fn default() -> Self {
        GuardedCodec(PhantomData)
    }
}

impl<T, U> Codec for GuardedCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = GuardedDecoder<U>;

    fn encoder(&mut self) -> ProstEncoder<T> {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::default())
    }

    fn decoder(&mut self) -> GuardedDecoder<U> {
        GuardedDecoder(ProstCodec::<T, U>::raw_decoder(BufferSettings::default()))
    }
}

pub struct GuardedDecoder<U>(ProstDecoder<U>);

impl<U: Message + Default + 'static> Decoder for GuardedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        // The whole message is in one contiguous buffer by the time it is decoded.
        // Named fields for the one message with many: ModelInfer's (streams included).
        let infer = TypeId::of::<U>() == TypeId::of::<pb::ModelInferRequest>();
        let names = if infer { INFER_REQUEST_FIELDS } else { &[] };
        // Not all of `check_contents` here: a decoder's error ends a whole stream, where a
        // message whose contents contradict its shape is that message's error alone (the
        // stream handler's decode says so). A shape of thousands of dimensions is not
        // decoded at all.
        check_fanout(buf.chunk(), names).map_err(|e| Status::resource_exhausted(e.message()))?;
        if infer {
            check_ranks(buf.chunk()).map_err(|e| Status::invalid_argument(e.message()))?;
        }
        self.0.decode(buf)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
