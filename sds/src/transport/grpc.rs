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
//!
//! The bytes are handled by a sans-IO core, [`framing`] (a request framer fed byte slices, and the
//! framing of one response), which the tests and the fuzzer drive directly; this file is its shell:
//! [`Requests`] reads the HTTP/2 request body into the framer, [`response`] hands each framed response
//! to the body of [`meshca_serve::frames`] (which the Workload API's streams use too), and a refusal
//! becomes a gRPC status here.
//!
//! What would let it go: no upstream issue asks for it (none found in tonic's or prost's trackers).
//! tonic's `Streaming` decoder would have to read each message into a buffer of that message's size
//! and release it once decoded, and its encoder to frame each response into a buffer of its own,
//! instead of keeping one growing buffer per stream for the stream's life; the node's extension list
//! would still be read whole, which the trimmer ([`super::wire`]) avoids.

use std::pin::Pin;

use bytes::{Buf, Bytes};
use futures::{Stream, StreamExt};
use http_body_util::BodyExt;
use tonic::codegen::http;
use tonic::Status;
use zeroize::Zeroizing;

use crate::transport::wire;

pub(crate) mod framing;

pub(crate) use framing::Encode;
#[cfg(test)]
use framing::HEADER;
use framing::{EncodeError, FramingError, RequestFramer};

/// The messages of a streaming request, read from its HTTP/2 body as it arrives by a
/// [`RequestFramer`]: nothing is kept between messages but the rest of the last data frame.
pub(crate) struct Requests<T> {
    body: tonic::body::Body,
    /// The rest of the last data frame, not read yet (empty between frames).
    pending: Bytes,
    framer: RequestFramer<T>,
}

impl<T: wire::Request> Requests<T> {
    pub(crate) fn new(body: tonic::body::Body, max_bytes: usize) -> Self {
        Requests {
            body,
            pending: Bytes::new(),
            framer: RequestFramer::new(max_bytes),
        }
    }

    /// The next message; `None` when the proxy ended its side of the stream between messages.
    /// Cancel-safe: what was read stays for the next call.
    pub(crate) async fn message(&mut self) -> Result<Option<T>, Status> {
        loop {
            if let Some(message) = self.read_pending()? {
                return Ok(Some(message));
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    // Trailers carry nothing a request stream needs.
                    if let Ok(data) = frame.into_data() {
                        self.pending = data;
                    }
                }
                Some(Err(status)) => return Err(status),
                None if self.framer.between_messages() => return Ok(None),
                None => return Err(refused(FramingError::EndedInsideMessage)),
            }
        }
    }

    /// Reads the pending bytes up to the end of the next message, and decodes it.
    fn read_pending(&mut self) -> Result<Option<T>, Status> {
        let (read, message) = self.framer.read(&self.pending).map_err(refused)?;
        self.pending.advance(read);
        if self.pending.is_empty() {
            // An empty slice would still hold on to the frame it came from.
            self.pending = Bytes::new();
        }
        Ok(message)
    }
}

/// The status a refused request stream ends with.
fn refused(error: FramingError) -> Status {
    let message = error.to_string();
    match error {
        FramingError::Compressed => Status::unimplemented(message),
        FramingError::TooLarge { .. } => Status::resource_exhausted(message),
        FramingError::Malformed(_) | FramingError::Decode(_) | FramingError::EndedInsideMessage => {
            Status::invalid_argument(message)
        }
    }
}

type Messages<M> = Pin<Box<dyn Stream<Item = Result<M, Status>> + Send>>;

/// A streaming response carrying `messages`, each framed into a buffer of its own as it goes out
/// ([`meshca_serve::frames`]), then the status the stream ended with.
pub(crate) fn response<M>(messages: Messages<M>) -> http::Response<tonic::body::Body>
where
    M: Encode + 'static,
{
    meshca_serve::frames::response(messages.map(|message| frame(&message?)))
}

/// `message` framed for gRPC, in a buffer of exactly its size ([`framing::frame`]), zeroized once the
/// connection has written it and let it go (a certificate response carries the proxy's private key).
fn frame(message: &impl Encode) -> Result<Bytes, Status> {
    framing::frame(message)
        .map(|frame| Bytes::from_owner(Zeroizing::new(frame)))
        .map_err(|error: EncodeError| Status::internal(error.to_string()))
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::{Extension, Node};
    use envoy_types::pb::envoy::service::discovery::v3::{self as envoy, DiscoveryResponse};
    use proptest::prelude::*;
    use prost::Message;

    use http_body::{Body, Frame};

    use super::*;
    use crate::transport::wire::DiscoveryRequest;

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

    /// A request as Envoy sends it; every third one carries a node with `n` extensions.
    fn request(n: usize) -> envoy::DiscoveryRequest {
        envoy::DiscoveryRequest {
            version_info: format!("v{n}"),
            node: n.is_multiple_of(3).then(|| Node {
                id: format!("default.web-{n}"),
                extensions: (0..n)
                    .map(|i| Extension {
                        name: format!("envoy.filters.http.ext_{i}"),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            resource_names: (0..n % 5).map(|i| format!("name-{i}")).collect(),
            response_nonce: "x".repeat(n % 300),
            ..Default::default()
        }
    }

    /// What meshca reads of `sent`.
    fn read(sent: &envoy::DiscoveryRequest) -> DiscoveryRequest {
        DiscoveryRequest::decode(sent.encode_to_vec().as_slice()).expect("decodes")
    }

    fn framed(message: &impl Encode) -> Vec<u8> {
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
    /// After each message, nothing of it is held, and at most the rest of one frame is.
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
                        assert!(requests.framer.between_messages());
                    }
                    Ok(None) => return (got, None),
                    Err(status) => return (got, Some(status)),
                }
            }
        })
    }

    proptest! {
        /// However the proxy's bytes are cut into frames, the messages come out whole and in order.
        #[test]
        fn messages_come_out_whole_however_the_stream_is_cut(
            sizes in proptest::collection::vec(0usize..400, 0..6),
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
        ) {
            let sent: Vec<envoy::DiscoveryRequest> = sizes.iter().map(|&n| request(n)).collect();
            let bytes: Vec<u8> = sent.iter().flat_map(framed).collect();
            let (got, error) = read_all(body_of(cut(&bytes, &cuts), None), 1024 * 1024);
            prop_assert!(error.is_none(), "{error:?}");
            prop_assert_eq!(got, sent.iter().map(read).collect::<Vec<_>>());
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
        assert_eq!(got, vec![read(&request(1))]);
        assert_eq!(error.expect("the failure").code(), tonic::Code::Cancelled);
    }

    #[test]
    fn between_messages_nothing_of_a_frame_is_held() {
        // A large first request (its node lists 900 extensions) and an ACK, in one frame.
        let first = framed(&request(900));
        assert!(first.len() > 20_000, "{}", first.len());
        let ack = framed(&request(1));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let both = [first, ack].concat();
            let mut requests =
                Requests::<DiscoveryRequest>::new(body_of(vec![both], None), 1 << 20);
            let read_first = requests.message().await.expect("reads").expect("the first");
            assert_eq!(read_first, read(&request(900)));
            assert!(
                !requests.pending.is_empty(),
                "the ACK is still in the frame"
            );
            requests.message().await.expect("reads").expect("the ACK");
            assert!(requests.pending.is_empty());
            assert_eq!(
                requests.pending.as_ptr(),
                Bytes::new().as_ptr(),
                "the frame is let go"
            );
        });
    }

    fn response_of(
        items: Vec<Result<DiscoveryResponse, Status>>,
    ) -> http::Response<tonic::body::Body> {
        response(Box::pin(futures::stream::iter(items)))
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
        response: http::Response<tonic::body::Body>,
    ) -> (Vec<DiscoveryResponse>, http::HeaderMap, usize) {
        let mut body = response.into_body();
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
