//! Server-streaming gRPC responses whose messages are framed before they reach the body: nothing of a
//! message stays with its stream once sent.
//!
//! tonic encodes a stream's responses into one buffer per stream and keeps that allocation for the
//! stream's life, sized by its largest message. A stream that lives as long as its proxy or workload
//! and is idle nearly all of it held a whole message that way. Here each message is one data frame of
//! its own (a compression flag, a big-endian length, the message: gRPC's framing, uncompressed), which
//! the connection lets go once written; a stream's status goes into the trailers, as tonic sends it.
//!
//! [`Encoded`] frames a message once for any number of streams: its frame is shared, not copied, up to
//! the socket.

use std::fmt;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures::Stream;
use http::{HeaderMap, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use prost::bytes::Bytes;
use prost::Message;
use tonic::Status;
use zeroize::Zeroizing;

/// The length of gRPC's frame header: a compression flag and a big-endian `u32` length.
pub const FRAME_HEADER: usize = 5;

/// A message `M` framed for gRPC once, to be sent on any number of streams as it is: a clone shares
/// the frame, and the last one to go zeroizes it (a message may carry a private key). Its `Debug`
/// shows the length alone.
pub struct Encoded<M> {
    frame: Bytes,
    _message: PhantomData<fn() -> M>,
}

impl<M: Message> Encoded<M> {
    /// `message`, framed; an error for one over 4 GiB, which gRPC cannot frame.
    pub fn new(message: &M) -> Result<Encoded<M>, Status> {
        let len = message.encoded_len();
        let prefix = u32::try_from(len)
            .map_err(|_| Status::internal(format!("a message of {len} bytes cannot be framed")))?;
        // Room for exactly the frame: no reallocation leaves a copy of the message behind.
        let mut frame = Zeroizing::new(Vec::with_capacity(FRAME_HEADER + len));
        frame.push(0); // not compressed
        frame.extend_from_slice(&prefix.to_be_bytes());
        message
            .encode(&mut *frame)
            .map_err(|e| Status::internal(format!("cannot encode a message: {e}")))?;
        Ok(Encoded {
            frame: Bytes::from_owner(frame),
            _message: PhantomData,
        })
    }
}

impl<M> Encoded<M> {
    /// The frame: header and message.
    pub fn frame(&self) -> Bytes {
        self.frame.clone()
    }

    /// The length of the frame.
    pub fn len(&self) -> usize {
        self.frame.len()
    }

    /// Always false: a frame holds its header.
    pub fn is_empty(&self) -> bool {
        self.frame.is_empty()
    }
}

impl<M> Clone for Encoded<M> {
    fn clone(&self) -> Self {
        Encoded {
            frame: self.frame.clone(),
            _message: PhantomData,
        }
    }
}

impl<M> fmt::Debug for Encoded<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Encoded")
            .field("bytes", &self.frame.len())
            .finish()
    }
}

/// The body of a streaming response: every frame of `frames` as a data frame, then the trailers with
/// the status the stream ended with (OK when it simply ended).
struct ResponseBody<S> {
    /// `None` once the trailers were sent.
    frames: Option<S>,
}

/// A streaming response (`application/grpc`) whose data are `frames`, each a whole gRPC frame.
pub fn response<S>(frames: S) -> http::Response<tonic::body::Body>
where
    S: Stream<Item = Result<Bytes, Status>> + Unpin + Send + 'static,
{
    let mut response = http::Response::new(tonic::body::Body::new(ResponseBody {
        frames: Some(frames),
    }));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    response
}

impl<S> Body for ResponseBody<S>
where
    S: Stream<Item = Result<Bytes, Status>> + Unpin,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        let Some(frames) = this.frames.as_mut() else {
            return Poll::Ready(None);
        };
        let ended = match ready!(Pin::new(frames).poll_next(cx)) {
            Some(Ok(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
            Some(Err(status)) => status,
            None => Status::ok(""),
        };
        // Nothing follows the trailers: the stream (and whatever it holds) goes now.
        this.frames = None;
        Poll::Ready(Some(Ok(Frame::trailers(trailers(&ended)))))
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// The trailers that carry `status` (`grpc-status`, `grpc-message`, details).
fn trailers(status: &Status) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if status.add_header(&mut headers).is_err() {
        // Only a message that cannot be a header value gets here; the code alone still tells the peer.
        headers.clear();
        let _ = Status::new(status.code(), "").add_header(&mut headers);
    }
    headers
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;
    use crate::codec::tests::Blob;

    fn blob(n: usize) -> Blob {
        Blob {
            data: vec![n as u8; n],
        }
    }

    /// The messages in `data`, checking every frame header.
    fn messages(mut data: &[u8]) -> Vec<Blob> {
        let mut out = Vec::new();
        while !data.is_empty() {
            assert_eq!(data[0], 0, "never compressed");
            let len = u32::from_be_bytes(data[1..FRAME_HEADER].try_into().unwrap()) as usize;
            out.push(Blob::decode(&data[FRAME_HEADER..FRAME_HEADER + len]).expect("a message"));
            data = &data[FRAME_HEADER + len..];
        }
        out
    }

    /// The data frames of a response's body, and its trailers.
    async fn collect(response: http::Response<tonic::body::Body>) -> (Vec<Bytes>, HeaderMap) {
        assert_eq!(response.headers()["content-type"], "application/grpc");
        let mut body = response.into_body();
        let (mut data, mut trailers) = (Vec::new(), None);
        while let Some(frame) = body.frame().await {
            let frame = frame.expect("the body itself never fails");
            assert!(trailers.is_none(), "nothing after the trailers");
            match frame.into_data() {
                Ok(bytes) => data.push(bytes),
                Err(frame) => trailers = Some(frame.into_trailers().expect("trailers")),
            }
        }
        assert!(body.is_end_stream());
        (data, trailers.expect("trailers end the body"))
    }

    fn frames_of(
        items: Vec<Result<Encoded<Blob>, Status>>,
    ) -> impl Stream<Item = Result<Bytes, Status>> + Unpin + Send + 'static {
        futures::StreamExt::map(futures::stream::iter(items), |item| {
            item.map(|encoded| encoded.frame())
        })
    }

    #[tokio::test]
    async fn every_message_is_one_frame_shared_not_copied_and_an_ended_stream_sends_ok() {
        let sizes = [0usize, 1, 255, 256, 9000, 70_000];
        let encoded: Vec<Encoded<Blob>> = sizes
            .iter()
            .map(|&n| Encoded::new(&blob(n)).expect("frames"))
            .collect();
        let (data, trailers) = collect(response(frames_of(
            encoded.iter().cloned().map(Ok).collect(),
        )))
        .await;
        assert_eq!(data.len(), sizes.len(), "one data frame per message");
        for ((bytes, sent), &n) in data.iter().zip(&encoded).zip(&sizes) {
            assert_eq!(bytes.len(), FRAME_HEADER + blob(n).encoded_len());
            assert_eq!(bytes.as_ptr(), sent.frame().as_ptr(), "the frame itself");
        }
        let all: Vec<u8> = data.iter().flat_map(|b| b.iter().copied()).collect();
        assert_eq!(messages(&all), sizes.map(blob).to_vec());
        assert_eq!(trailers["grpc-status"], "0");
    }

    #[tokio::test]
    async fn an_error_ends_the_body_with_its_status_in_the_trailers() {
        let (data, trailers) = collect(response(frames_of(vec![
            Ok(Encoded::new(&blob(3)).expect("frames")),
            Err(Status::permission_denied("caller 42 is refused")),
            Ok(Encoded::new(&blob(4)).expect("frames")),
        ])))
        .await;
        assert_eq!(data.len(), 1);
        assert_eq!(trailers["grpc-status"], "7");
        assert_eq!(trailers["grpc-message"], "caller%2042%20is%20refused");
    }

    #[test]
    fn an_encoded_message_shows_its_length_only() {
        let encoded = Encoded::new(&Blob {
            data: b"secret".to_vec(),
        })
        .expect("frames");
        assert_eq!(format!("{encoded:?}"), "Encoded { bytes: 13 }");
    }
}
