//! Accepting grpc-core clients on the unix socket.
//!
//! grpc-core (Python grpcio, C++, Ruby...) sends a `unix:` target's socket path, percent
//! encoded, as the HTTP/2 `:authority` (e.g. `run%2Fmeshca%2Fsds.sock`; grpc/grpc#38142). The
//! HTTP/2 server (h2) rejects such a stream with `PROTOCOL_ERROR` before tonic sees it, and offers
//! no switch to relax that (hyperium/h2#487, still open, would let this module go). This reader
//! sits between the unix socket and the HTTP/2 server and overwrites, in place, an `:authority`
//! value that is not a valid URI authority with a valid one of the same length. Same length
//! matters: the value may enter the HPACK dynamic table, and keeping every size identical keeps
//! the client's and the server's tables in step without re-encoding anything. Only literal,
//! non-Huffman values whose name is `:authority` (static index 1 or a literal name) are
//! rewritten, which is what grpc-core sends; any other bytes pass through untouched, and anything
//! malformed is left for the HTTP/2 server to reject.
//!
//! What it holds back is bounded, because it runs before the HTTP/2 server's own limits, and
//! because what it holds the server cannot count: at most one frame of the advertised maximum
//! size while it is incomplete, and one header block (HEADERS plus CONTINUATIONs) of at most the
//! server's header list limit, frame headers included, in at most [`frames::MAX_BLOCK_FRAMES`]
//! frames. A larger block closes the connection, as the HTTP/2 server would once it saw it.
//!
//! The frames are handled by a sans-IO core, [`HeaderFixup`] in `frames.rs` with the HPACK side in
//! `hpack.rs` (fed byte chunks, it hands out bytes), which the tests and the fuzzer drive directly;
//! this file is its shell: [`UnixPathHeaderFix`] only moves bytes between the socket and the core.

mod frames;
mod hpack;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub(crate) use frames::{HeaderFixup, Overflow, MAX_FRAME_SIZE};

// The HTTP/2 wire format the rewriter reads (RFC 9113): the client preface's length, a frame header's
// length, the frame types and flags of a header block. Both the frame reader and the HPACK rewriter use
// them.
const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// The most bytes read from the socket at once.
const READ_CHUNK: usize = 16 * 1024;

/// Wraps the server side of a connection, fixing `:authority` values in client headers.
pub(crate) struct UnixPathHeaderFix<S> {
    inner: S,
    core: HeaderFixup,
    /// The client sent a header block over the limit: reported once the output before it is read.
    overflow: Option<Overflow>,
    eof: bool,
}

impl<S> UnixPathHeaderFix<S> {
    /// Wraps `inner`; header blocks larger than `max_block` bytes, frame headers included, close the
    /// connection.
    pub(crate) fn new(inner: S, max_block: usize) -> Self {
        Self {
            inner,
            core: HeaderFixup::new(max_block),
            overflow: None,
            eof: false,
        }
    }

    /// The wrapped connection.
    pub(crate) fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for UnixPathHeaderFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            let ready = this.core.output();
            if !ready.is_empty() {
                let n = buf.remaining().min(ready.len());
                buf.put_slice(&ready[..n]);
                this.core.consume(n);
                return Poll::Ready(Ok(()));
            }
            if let Some(overflow) = this.overflow {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    overflow.to_string(),
                )));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; READ_CHUNK];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => {
                    this.core.release_idle_room();
                    return Poll::Pending;
                }
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Ready(Ok(())) if read.filled().is_empty() => {
                    // End of stream: hand over whatever is left, unchanged.
                    this.eof = true;
                    this.core.finish();
                }
                Poll::Ready(Ok(())) => {
                    if let Err(overflow) = this.core.feed(read.filled()) {
                        this.overflow = Some(overflow);
                    }
                    debug_assert!(this.core.held() <= this.core.bound());
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for UnixPathHeaderFix<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::frames::MAX_BLOCK_FRAMES;
    use super::*;
    use proptest::prelude::*;

    /// A reader that hands out `data` in chunks of the given sizes (cycling), as a socket may.
    struct Chunked {
        data: Vec<u8>,
        sizes: Vec<usize>,
        at: usize,
        turn: usize,
    }

    impl AsyncRead for Chunked {
        fn poll_read(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            let size = this.sizes[this.turn % this.sizes.len()].max(1);
            this.turn += 1;
            let end = (this.at + size)
                .min(this.data.len())
                .min(this.at + buf.remaining());
            buf.put_slice(&this.data[this.at..end]);
            this.at = end;
            Poll::Ready(Ok(()))
        }
    }

    /// Everything the fixer yields for `data` read in `sizes` chunks, or the error that closed it;
    /// checks its buffers stay bounded after every read.
    fn run(data: &[u8], sizes: Vec<usize>, max_block: usize) -> Result<Vec<u8>, io::Error> {
        use tokio::io::AsyncReadExt;
        let chunked = Chunked {
            data: data.to_vec(),
            sizes,
            at: 0,
            turn: 0,
        };
        let mut fixer = UnixPathHeaderFix::new(chunked, max_block);
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = futures::executor::block_on(fixer.read(&mut buf))?;
            assert!(fixer.core.held() <= fixer.core.bound());
            if n == 0 {
                return Ok(out);
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    /// A frame of `kind` carrying `payload` (on stream 1).
    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        super::frames::tests::frame(payload.len(), kind, flags, payload)
    }

    /// A frame: mostly header frames carrying an `:authority` literal with arbitrary bytes.
    fn any_frame() -> impl Strategy<Value = Vec<u8>> {
        let authority = proptest::collection::vec(any::<u8>(), 0..40).prop_map(|value| {
            let mut block = vec![0x41, value.len() as u8 & 0x7f];
            block.extend_from_slice(&value[..value.len().min(0x7f)]);
            block.push(0x82);
            block
        });
        let payload = prop_oneof![authority, proptest::collection::vec(any::<u8>(), 0..64)];
        let kind = prop_oneof![
            Just(HEADERS),
            Just(CONTINUATION),
            Just(0u8),
            Just(4u8),
            any::<u8>()
        ];
        (kind, any::<u8>(), payload).prop_map(|(kind, flags, payload)| frame(kind, flags, &payload))
    }

    fn stream() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(any_frame(), 0..24).prop_map(|frames| {
            let mut data = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
            for frame in frames {
                data.extend(frame);
            }
            data
        })
    }

    proptest! {
        #[test]
        fn output_keeps_every_frame_and_does_not_depend_on_read_sizes(
            data in stream(),
            sizes in proptest::collection::vec(1usize..200, 1..8),
        ) {
            let whole = run(&data, vec![data.len()], 1 << 20).expect("under the limit");
            let chunked = run(&data, sizes, 1 << 20).expect("under the limit");
            prop_assert_eq!(&whole, &chunked);
            prop_assert_eq!(whole.len(), data.len());
            // Frame by frame: the same headers, and only header-block payloads may differ.
            let mut at = PREFACE_LEN;
            prop_assert_eq!(&whole[..at], &data[..at]);
            while at + FRAME_HEADER_LEN <= data.len() {
                let len = usize::from(data[at]) << 16 | usize::from(data[at + 1]) << 8 | usize::from(data[at + 2]);
                let end = (at + FRAME_HEADER_LEN + len).min(data.len());
                prop_assert_eq!(&whole[at..at + FRAME_HEADER_LEN], &data[at..at + FRAME_HEADER_LEN]);
                if data[at + 3] != HEADERS && data[at + 3] != CONTINUATION {
                    prop_assert_eq!(&whole[at..end], &data[at..end]);
                }
                at = end;
            }
        }

        #[test]
        fn a_header_block_over_the_limit_closes_and_nothing_else_does(
            data in stream(),
            max_block in 1usize..300,
        ) {
            let result = run(&data, vec![7], max_block);
            // The largest header block the fixer must hold back, frame headers included, and the
            // most frames in one, computed independently.
            let (mut at, mut largest, mut most, mut open) = (PREFACE_LEN, 0usize, 0usize, None);
            while at + FRAME_HEADER_LEN <= data.len() {
                let len = usize::from(data[at]) << 16 | usize::from(data[at + 1]) << 8 | usize::from(data[at + 2]);
                if at + FRAME_HEADER_LEN + len > data.len() {
                    break;
                }
                let (kind, flags) = (data[at + 3], data[at + 4]);
                let size = FRAME_HEADER_LEN + len;
                open = match open {
                    Some((held, frames)) => {
                        let (held, frames) = (held + size, frames + 1);
                        largest = largest.max(held);
                        most = most.max(frames);
                        (kind == CONTINUATION && flags & END_HEADERS == 0).then_some((held, frames))
                    }
                    // A block in one frame is not held back: the HTTP/2 server's own limit applies.
                    None if kind == HEADERS && flags & END_HEADERS == 0 => {
                        largest = largest.max(size);
                        most = most.max(1);
                        Some((size, 1))
                    }
                    None => None,
                };
                at += size;
            }
            if largest > max_block || most > MAX_BLOCK_FRAMES {
                prop_assert!(result.is_err(), "a {largest}-byte block of {most} frames passed a {max_block}-byte limit");
            } else {
                prop_assert!(result.is_ok(), "{:?}", result.err());
            }
        }
    }
}
