//! gRPC framing for streams that live as long as their proxy.
//!
//! tonic decodes a request stream into one buffer per stream, and encodes its responses into another,
//! and keeps both allocations for the stream's life, each sized by the largest message so far. For SDS
//! that is the proxy's first request (Envoy sends its whole node, extension list included: about
//! 60 KiB) and a certificate response (about 2.5 KiB), held by every idle stream. Here a request is
//! read into a buffer of its own size and a response encoded into one, and both go once used: an idle
//! stream holds no message bytes.
//!
//! The framing is gRPC's (a compression flag, a big-endian length, the message), without compression;
//! a response stream's status goes into the trailers, as tonic sends it.

use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use futures::Stream;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tonic::codegen::http::{self, HeaderMap, HeaderValue};
use tonic::Status;

/// A gRPC message's frame header: the compression flag and the length.
const HEADER: usize = 5;

/// The messages of a streaming request, read from its HTTP/2 body.
pub(crate) struct Requests<T> {
    body: tonic::body::Body,
    /// Bytes received and not yet decoded: at most one message and the data frame that completed it.
    buf: BytesMut,
    /// The largest message accepted, in bytes.
    max_bytes: usize,
    _messages: PhantomData<fn() -> T>,
}

impl<T: prost::Message + Default> Requests<T> {
    pub(crate) fn new(body: tonic::body::Body, max_bytes: usize) -> Self {
        Requests {
            body,
            buf: BytesMut::new(),
            max_bytes,
            _messages: PhantomData,
        }
    }

    /// The next message; `None` when the proxy ended its side of the stream between messages.
    /// Cancel-safe: bytes read stay buffered for the next call.
    pub(crate) async fn message(&mut self) -> Result<Option<T>, Status> {
        loop {
            if let Some(message) = decode_one(&mut self.buf, self.max_bytes)? {
                return Ok(Some(message));
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    // Trailers carry nothing a request stream needs.
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                Some(Err(status)) => return Err(status),
                None if self.buf.is_empty() => return Ok(None),
                None => {
                    return Err(Status::invalid_argument(format!(
                        "the request stream ended inside a message ({} bytes of it received)",
                        self.buf.len()
                    )))
                }
            }
        }
    }
}

/// Takes the first whole message off `buf`, if there is one. Refuses a compressed message, and a
/// message over `max_bytes` as soon as its header says so (before its bytes are kept). When `buf`
/// holds nothing more, its allocation is released.
fn decode_one<T: prost::Message + Default>(
    buf: &mut BytesMut,
    max_bytes: usize,
) -> Result<Option<T>, Status> {
    let Some(header) = buf.get(..HEADER) else {
        return Ok(None);
    };
    if header[0] != 0 {
        return Err(Status::unimplemented(
            "compressed requests are not accepted; send them uncompressed",
        ));
    }
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if len > max_bytes {
        return Err(Status::resource_exhausted(format!(
            "a request of {len} bytes is over the limit of {max_bytes} bytes (limits.requestBytes)"
        )));
    }
    let Some(body) = buf.get(HEADER..HEADER + len) else {
        // The buffer grows with what arrives, not with what the header announces: thousands of
        // streams may each be part-way through their first request at once, and a client that
        // announces a large message and sends it slowly holds only what it sent.
        return Ok(None);
    };
    let message = T::decode(body)
        .map_err(|e| Status::invalid_argument(format!("a request does not decode: {e}")))?;
    buf.advance(HEADER + len);
    if buf.is_empty() {
        *buf = BytesMut::new();
    }
    Ok(Some(message))
}

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
    use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
    use proptest::prelude::*;
    use prost::Message;

    use super::*;

    /// A request body that delivers `chunks` as its data frames, then ends (or fails with `fail`).
    fn body_of(chunks: Vec<Vec<u8>>, fail: Option<Status>) -> tonic::body::Body {
        let frames = chunks
            .into_iter()
            .map(|chunk| Ok(Frame::data(Bytes::from(chunk))))
            .chain(fail.map(Err));
        tonic::body::Body::new(http_body_util::StreamBody::new(futures::stream::iter(
            frames.collect::<Vec<Result<Frame<Bytes>, Status>>>(),
        )))
    }

    fn request(n: usize) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: format!("v{n}"),
            resource_names: (0..n % 5).map(|i| format!("name-{i}")).collect(),
            response_nonce: "x".repeat(n % 300),
            ..Default::default()
        }
    }

    fn framed(message: &impl Message) -> Vec<u8> {
        frame(message).expect("encodes").to_vec()
    }

    /// Cuts `bytes` at the given offsets (taken modulo its length).
    fn cut(bytes: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
        let mut at: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        at.extend([0, bytes.len()]);
        at.sort_unstable();
        at.dedup();
        at.windows(2).map(|w| bytes[w[0]..w[1]].to_vec()).collect()
    }

    /// Reads every message of `body`: the messages before the end or the first error, and that error.
    fn read_all(
        body: tonic::body::Body,
        max_bytes: usize,
    ) -> (Vec<DiscoveryRequest>, Option<Status>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let mut requests = Requests::<DiscoveryRequest>::new(body, max_bytes);
            let mut got = Vec::new();
            loop {
                match requests.message().await {
                    Ok(Some(message)) => {
                        got.push(message);
                        assert!(
                            requests.buf.len() <= max_bytes + HEADER + 64 * 1024,
                            "the buffer holds at most one message and the frame that completed it"
                        );
                    }
                    Ok(None) => return (got, None),
                    Err(status) => return (got, Some(status)),
                }
            }
        })
    }

    proptest! {
        /// However the proxy's bytes are cut into frames, the messages come out whole and in order,
        /// and the buffer is released once it holds nothing.
        #[test]
        fn messages_come_out_whole_however_the_stream_is_cut(
            sizes in proptest::collection::vec(0usize..400, 0..6),
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
        ) {
            let sent: Vec<DiscoveryRequest> = sizes.iter().map(|&n| request(n)).collect();
            let bytes: Vec<u8> = sent.iter().flat_map(framed).collect();
            let (got, error) = read_all(body_of(cut(&bytes, &cuts), None), 1024 * 1024);
            prop_assert!(error.is_none(), "{error:?}");
            prop_assert_eq!(got, sent);
        }

        /// Whatever bytes arrive, reading ends (with messages, an end or an error) without a panic, and a
        /// message over the limit is never decoded.
        #[test]
        fn arbitrary_bytes_end_in_messages_or_an_error(
            bytes in proptest::collection::vec(any::<u8>(), 0..600),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
            max_bytes in 0usize..300,
        ) {
            let (got, _) = read_all(body_of(cut(&bytes, &cuts), None), max_bytes);
            for message in got {
                prop_assert!(message.encoded_len() <= max_bytes);
            }
        }
    }

    #[test]
    fn a_message_over_the_limit_is_refused_from_its_header_alone() {
        let big = framed(&request(299));
        let limit = big.len() - HEADER - 1;
        // Only the header arrives: the length is enough to refuse.
        let (got, error) = read_all(body_of(vec![big[..HEADER].to_vec()], None), limit);
        assert!(got.is_empty());
        let error = error.expect("refused");
        assert_eq!(error.code(), tonic::Code::ResourceExhausted);
        assert!(error.message().contains("limits.requestBytes"), "{error:?}");
    }

    #[test]
    fn compressed_messages_and_cut_off_messages_are_refused() {
        let mut compressed = framed(&request(3));
        compressed[0] = 1;
        let (_, error) = read_all(body_of(vec![compressed], None), 1024);
        assert_eq!(error.expect("refused").code(), tonic::Code::Unimplemented);

        let whole = framed(&request(3));
        let (_, error) = read_all(body_of(vec![whole[..whole.len() - 1].to_vec()], None), 1024);
        assert_eq!(error.expect("refused").code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn a_failing_body_fails_the_stream_after_the_messages_before_it() {
        let (got, error) = read_all(
            body_of(vec![framed(&request(1))], Some(Status::cancelled("reset"))),
            1024,
        );
        assert_eq!(got, vec![request(1)]);
        assert_eq!(error.expect("the failure").code(), tonic::Code::Cancelled);
    }

    #[test]
    fn the_buffer_of_a_large_request_is_released_once_it_is_read() {
        let large = framed(&request(299));
        let small = framed(&request(1));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let mut requests =
                Requests::<DiscoveryRequest>::new(body_of(vec![large, small], None), 1024);
            requests
                .message()
                .await
                .expect("reads")
                .expect("the large one");
            assert_eq!(
                requests.buf.capacity(),
                0,
                "nothing kept after the large request"
            );
            requests
                .message()
                .await
                .expect("reads")
                .expect("the small one");
            assert_eq!(requests.buf.capacity(), 0);
        });
    }

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
