//! [`StreamCodec`]: protobuf for gRPC streams that stay open, holding no buffer larger than their messages.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic::Status;
use tonic_prost::ProstDecoder;

/// Where a stream's encode and decode buffers start: small, growing to the message they hold.
///
/// tonic's default (8 KiB each way) is allocated for every stream and kept for the stream's life. A
/// Workload API or agent stream is open for as long as its workload or agent runs and sends a message
/// when something changes: 8 KiB was most of what each idle stream cost (measured at 10,000 streams).
/// Above zero: a compressing encoder grows its output by this step.
const START_BYTES: usize = 256;

/// tonic's default: a stream whose encoder holds this much sends it without waiting for more.
const YIELD_BYTES: usize = 32 * 1024;

fn buffers() -> BufferSettings {
    BufferSettings::new(START_BYTES, YIELD_BYTES)
}

/// Protobuf messages `T` out, `U` in, for long-lived gRPC streams (see [`START_BYTES`]). A unary call may
/// use it too.
#[derive(Debug)]
pub struct StreamCodec<T, U>(PhantomData<fn() -> (T, U)>);

impl<T, U> Default for StreamCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for StreamCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = StreamEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        StreamEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(buffers())
    }
}

/// Encodes a message into room made for exactly its length, so the buffer the stream keeps between
/// messages is the size of its largest message, not of a doubling's overshoot.
#[derive(Debug)]
pub struct StreamEncoder<T>(PhantomData<fn(T)>);

impl<T: Message> Encoder for StreamEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        item.encode(buf)
            .map_err(|e| Status::internal(format!("cannot encode a message: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffers()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use futures::StreamExt;
    use http_body_util::BodyExt;
    use tonic::codec::{EncodeBody, Streaming};

    use super::*;

    /// A message of bytes (the frames tests use it too).
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Blob {
        #[prost(bytes = "vec", tag = "1")]
        pub(crate) data: Vec<u8>,
    }

    /// Messages of every size around the starting buffer, and beyond tonic's yield threshold, come out
    /// of a gRPC body as they went in.
    #[tokio::test]
    async fn messages_round_trip_through_a_grpc_body() {
        let blobs: Vec<Blob> = [0usize, 1, 255, 256, 9000, 70_000]
            .iter()
            .map(|&n| Blob {
                data: vec![n as u8; n],
            })
            .collect();
        let source = futures::stream::iter(blobs.clone().into_iter().map(Ok::<_, Status>));
        let body = EncodeBody::new_server(
            StreamCodec::<Blob, Blob>::default().encoder(),
            source,
            None,
            Default::default(),
            None,
        );
        let collected = body.collect().await.expect("a body").to_bytes();
        let mut decoded = Streaming::new_request(
            StreamCodec::<Blob, Blob>::default().decoder(),
            http_body_util::Full::new(collected),
            None,
            None,
        );
        let mut read = Vec::new();
        while let Some(message) = decoded.next().await {
            read.push(message.expect("decodes"));
        }
        assert_eq!(read, blobs);
    }
}
