//! The body of a streaming gRPC response, for streams that live as long as their proxy.
//!
//! tonic encodes a response stream into one buffer per stream and keeps that buffer's allocation for
//! the stream's life, sized by the largest response so far: for SDS, a certificate, its key and its
//! CA, about 2.5 KiB held by every idle stream. Here each response is encoded into a buffer of its own
//! size, which HTTP/2 frees once it is written: an idle stream holds no response bytes.
//!
//! The framing is gRPC's (a compression flag, a big-endian length, the message), without compression;
//! the stream's status goes into the trailers, as tonic sends it.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use futures::Stream;
use http_body::{Body, Frame, SizeHint};
use tonic::codegen::http::{self, HeaderMap, HeaderValue};
use tonic::Status;

/// A gRPC message's frame header: the compression flag and the length.
const HEADER: usize = 5;

type Messages<M> = Pin<Box<dyn Stream<Item = Result<M, Status>> + Send>>;

/// The body of a streaming response: every message of `messages`, then the trailers with the status the
/// stream ended with (OK when it simply ended).
pub(crate) struct ResponseBody<M> {
    /// `None` once the trailers were sent.
    messages: Option<Messages<M>>,
}

/// A streaming response carrying `messages`.
pub(crate) fn response<M>(messages: Messages<M>) -> http::Response<tonic::body::Body>
where
    M: prost::Message + 'static,
{
    let mut response = http::Response::new(tonic::body::Body::new(ResponseBody {
        messages: Some(messages),
    }));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    response
}

impl<M: prost::Message> Body for ResponseBody<M> {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        let Some(messages) = this.messages.as_mut() else {
            return Poll::Ready(None);
        };
        let ended = match ready!(messages.as_mut().poll_next(cx)) {
            Some(Ok(message)) => match frame(&message) {
                Ok(data) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Err(status) => status,
            },
            Some(Err(status)) => status,
            None => Status::ok(""),
        };
        // Nothing follows the trailers: the stream (and whatever its messages hold) goes now.
        this.messages = None;
        Poll::Ready(Some(Ok(Frame::trailers(trailers(&ended)))))
    }

    fn is_end_stream(&self) -> bool {
        self.messages.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// `message` framed for gRPC, in a buffer of exactly its size.
fn frame(message: &impl prost::Message) -> Result<Bytes, Status> {
    let len = message.encoded_len();
    let prefix = u32::try_from(len).map_err(|_| {
        Status::internal(format!("a response of {len} bytes is too large for gRPC"))
    })?;
    let mut buf = Vec::with_capacity(HEADER + len);
    buf.push(0); // not compressed
    buf.extend_from_slice(&prefix.to_be_bytes());
    message
        .encode(&mut buf)
        .map_err(|e| Status::internal(format!("encoding a response: {e}")))?;
    Ok(Bytes::from(buf))
}

/// The trailers that carry `status` (`grpc-status`, `grpc-message`, details).
fn trailers(status: &Status) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if status.add_header(&mut headers).is_err() {
        // Only a message that cannot be a header value gets here; the code alone still tells the proxy.
        headers.clear();
        let _ = Status::new(status.code(), "").add_header(&mut headers);
    }
    headers
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
    use http_body_util::BodyExt;
    use prost::Message;

    use super::*;

    fn response_of(
        items: Vec<Result<DiscoveryResponse, Status>>,
    ) -> ResponseBody<DiscoveryResponse> {
        ResponseBody {
            messages: Some(Box::pin(futures::stream::iter(items))),
        }
    }

    fn message(version: &str) -> DiscoveryResponse {
        DiscoveryResponse {
            version_info: version.to_owned(),
            nonce: format!("n-{version}"),
            ..Default::default()
        }
    }

    /// Splits a body's data into gRPC messages, checking every frame header.
    fn messages(mut data: &[u8]) -> Vec<DiscoveryResponse> {
        let mut out = Vec::new();
        while !data.is_empty() {
            assert_eq!(data[0], 0, "never compressed");
            let len = u32::from_be_bytes(data[1..5].try_into().unwrap()) as usize;
            out.push(DiscoveryResponse::decode(&data[5..5 + len]).expect("a message"));
            data = &data[5 + len..];
        }
        out
    }

    async fn collect(
        body: ResponseBody<DiscoveryResponse>,
    ) -> (Vec<DiscoveryResponse>, HeaderMap, usize) {
        let mut body = std::pin::pin!(body);
        let (mut data, mut trailers, mut frames) = (Vec::new(), None, 0);
        while let Some(frame) = body.frame().await {
            let frame = frame.expect("the body itself never fails");
            assert!(trailers.is_none(), "nothing after the trailers");
            match frame.into_data() {
                Ok(bytes) => {
                    frames += 1;
                    data.extend_from_slice(&bytes);
                }
                Err(frame) => trailers = Some(frame.into_trailers().expect("trailers")),
            }
        }
        assert!(body.is_end_stream());
        (
            messages(&data),
            trailers.expect("trailers end the body"),
            frames,
        )
    }

    #[tokio::test]
    async fn every_message_is_one_frame_and_a_stream_that_ends_sends_ok() {
        let (got, trailers, frames) =
            collect(response_of(vec![Ok(message("1")), Ok(message("2"))])).await;
        assert_eq!(got, vec![message("1"), message("2")]);
        assert_eq!(frames, 2);
        assert_eq!(trailers["grpc-status"], "0");
    }

    #[tokio::test]
    async fn an_error_ends_the_body_with_its_status_in_the_trailers() {
        let (got, trailers, _) = collect(response_of(vec![
            Ok(message("1")),
            Err(Status::permission_denied("proxy web-1 is refused")),
            Ok(message("never sent")),
        ]))
        .await;
        assert_eq!(got, vec![message("1")]);
        assert_eq!(trailers["grpc-status"], "7");
        assert_eq!(trailers["grpc-message"], "proxy%20web-1%20is%20refused");
    }

    #[tokio::test]
    async fn a_frame_is_the_header_and_the_message_exactly() {
        // tonic's own client decodes these frames in every SDS test; here, the sizes.
        let empty = frame(&DiscoveryResponse::default()).expect("encodes");
        assert_eq!(&empty[..], &[0, 0, 0, 0, 0]);
        let one = frame(&message("7")).expect("encodes");
        assert_eq!(one.len(), HEADER + message("7").encoded_len());
    }
}
