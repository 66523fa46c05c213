//! Accepting grpc-core clients on the unix socket.
//!
//! grpc-core (Python grpcio, C++, Ruby...) sends a `unix:` target's socket path, percent
//! encoded, as the HTTP/2 `:authority` (e.g. `run%2Fmeshca%2Fsds.sock`). The HTTP/2 server
//! (h2) rejects such a stream with `PROTOCOL_ERROR` before tonic sees it, and offers no
//! switch to relax that. This reader sits between the unix socket and the HTTP/2 server and
//! overwrites, in place, an `:authority` value that is not a valid URI authority with a
//! valid one of the same length. Same length matters: the value may enter the HPACK dynamic
//! table, and keeping every size identical keeps the client's and the server's tables in
//! step without re-encoding anything. Only literal, non-Huffman values whose name is
//! `:authority` (static index 1 or a literal name) are rewritten, which is what grpc-core
//! sends; any other bytes pass through untouched, and anything malformed is left for the
//! HTTP/2 server to reject.
//!
//! What it holds back is bounded, because it runs before the HTTP/2 server's own limits:
//! at most one frame of the advertised maximum size while it is incomplete, and a header
//! block (HEADERS plus CONTINUATIONs) of at most the server's header list limit. A larger
//! block closes the connection, as the HTTP/2 server would once it saw it.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame payload a client may send: the HTTP/2 default, which the server keeps.
/// A larger frame is not held back; the reader passes everything through from there on and
/// the HTTP/2 server closes the connection with `FRAME_SIZE_ERROR`.
pub(crate) const MAX_FRAME_SIZE: usize = 16 * 1024;
const READ_CHUNK: usize = 16 * 1024;

/// Wraps the server side of a connection, fixing `:authority` values in client headers.
pub(crate) struct UnixPathHeaderFix<S> {
    inner: S,
    /// Bytes read but not yet processed (an incomplete frame).
    raw: Vec<u8>,
    /// Processed bytes ready for the HTTP/2 server.
    out: Vec<u8>,
    out_pos: usize,
    preface_left: usize,
    /// A HEADERS frame and its CONTINUATIONs, held until END_HEADERS.
    held: Vec<u8>,
    /// The header block payload in `held`, in bytes.
    held_block: usize,
    /// The largest header block accepted: the HTTP/2 server's header list limit.
    max_block: usize,
    passthrough: bool,
    /// A header block went past `max_block`: the connection is closed.
    overflow: bool,
    eof: bool,
}

impl<S> UnixPathHeaderFix<S> {
    /// Wraps `inner`; header blocks larger than `max_block` bytes close the connection.
    pub(crate) fn new(inner: S, max_block: usize) -> Self {
        Self {
            inner,
            raw: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            preface_left: PREFACE_LEN,
            held: Vec::new(),
            held_block: 0,
            max_block,
            passthrough: false,
            overflow: false,
            eof: false,
        }
    }

    fn process(&mut self) {
        if self.preface_left > 0 {
            let take = self.preface_left.min(self.raw.len());
            self.out.extend(self.raw.drain(..take));
            self.preface_left -= take;
            if self.preface_left > 0 {
                return;
            }
        }
        while !self.passthrough && self.raw.len() >= FRAME_HEADER_LEN {
            let len = usize::from(self.raw[0]) << 16
                | usize::from(self.raw[1]) << 8
                | usize::from(self.raw[2]);
            if len > MAX_FRAME_SIZE {
                self.passthrough = true;
                break;
            }
            if self.raw.len() < FRAME_HEADER_LEN + len {
                return;
            }
            let (kind, flags) = (self.raw[3], self.raw[4]);
            let frame: Vec<u8> = self.raw.drain(..FRAME_HEADER_LEN + len).collect();
            if !self.held.is_empty() {
                self.held.extend_from_slice(&frame);
                self.held_block += len;
                if self.held_block > self.max_block {
                    self.overflow = true;
                    self.held = Vec::new();
                    self.raw = Vec::new();
                    return;
                }
                if kind != CONTINUATION || flags & END_HEADERS != 0 {
                    self.held_block = 0;
                    let mut held = std::mem::take(&mut self.held);
                    if kind == CONTINUATION {
                        fix_header_frames(&mut held);
                    }
                    self.out.extend_from_slice(&held);
                }
            } else if kind == HEADERS && flags & END_HEADERS == 0 {
                self.held = frame;
                self.held_block = len;
                if len > self.max_block {
                    self.overflow = true;
                    self.held = Vec::new();
                    self.raw = Vec::new();
                    return;
                }
            } else if kind == HEADERS {
                let mut frame = frame;
                fix_header_frames(&mut frame);
                self.out.extend_from_slice(&frame);
            } else {
                self.out.extend_from_slice(&frame);
            }
        }
        if self.passthrough {
            self.out.append(&mut self.held);
            self.out.append(&mut self.raw);
        }
    }
}

/// Fixes the header block carried by one HEADERS frame and its CONTINUATION frames.
fn fix_header_frames(frames: &mut [u8]) {
    let mut ranges = Vec::new();
    let mut at = 0;
    while at + FRAME_HEADER_LEN <= frames.len() {
        let len = usize::from(frames[at]) << 16
            | usize::from(frames[at + 1]) << 8
            | usize::from(frames[at + 2]);
        let (kind, flags) = (frames[at + 3], frames[at + 4]);
        let payload = at + FRAME_HEADER_LEN;
        let end = payload + len;
        if end > frames.len() {
            return;
        }
        let (mut start, mut stop) = (payload, end);
        if kind == HEADERS {
            if flags & PADDED != 0 {
                let Some(&pad) = frames.get(start) else {
                    return;
                };
                start += 1;
                match stop.checked_sub(usize::from(pad)) {
                    Some(value) if value >= start => stop = value,
                    _ => return,
                }
            }
            if flags & PRIORITY != 0 {
                start += 5;
            }
        }
        if start > stop {
            return;
        }
        ranges.push(start..stop);
        at = end;
    }
    let mut block: Vec<u8> = ranges
        .iter()
        .flat_map(|range| frames[range.clone()].to_vec())
        .collect();
    if fix_block(&mut block) {
        let mut from = 0;
        for range in ranges {
            let len = range.len();
            frames[range].copy_from_slice(&block[from..from + len]);
            from += len;
        }
    }
}

/// Walks an HPACK header block (RFC 7541 §6) and overwrites invalid raw `:authority`
/// values. Returns whether anything changed; stops at the first malformed byte.
fn fix_block(block: &mut [u8]) -> bool {
    let mut changed = false;
    let mut at = 0;
    while at < block.len() {
        let first = block[at];
        let prefix = if first & 0x80 != 0 {
            // Indexed header field.
            match integer(block, at, 7) {
                Some((_, next)) => {
                    at = next;
                    continue;
                }
                None => return changed,
            }
        } else if first & 0xc0 == 0x40 {
            6
        } else if first & 0xe0 == 0x20 {
            // Dynamic table size update.
            match integer(block, at, 5) {
                Some((_, next)) => {
                    at = next;
                    continue;
                }
                None => return changed,
            }
        } else {
            4
        };
        let Some((index, next)) = integer(block, at, prefix) else {
            return changed;
        };
        at = next;
        let is_authority = if index == 0 {
            let Some((huffman, range)) = string(block, at) else {
                return changed;
            };
            at = range.end;
            !huffman && &block[range] == b":authority"
        } else {
            index == 1
        };
        let Some((huffman, range)) = string(block, at) else {
            return changed;
        };
        at = range.end;
        if is_authority && !huffman && !range.is_empty() {
            let value = &mut block[range];
            if http::uri::Authority::try_from(&*value).is_err() {
                overwrite_with_valid_authority(value);
                changed = true;
            }
        }
    }
    changed
}

/// `localhost`, cut or padded with `-` to the slot's length: always a valid reg-name.
fn overwrite_with_valid_authority(slot: &mut [u8]) {
    for (i, byte) in slot.iter_mut().enumerate() {
        *byte = *b"localhost".get(i).unwrap_or(&b'-');
    }
    if let Some(last) = slot.last_mut() {
        if *last == b'-' {
            *last = b'x';
        }
    }
}

/// An HPACK integer with an `n`-bit prefix starting at `at`: (value, next position).
fn integer(block: &[u8], at: usize, n: u32) -> Option<(usize, usize)> {
    let max = (1usize << n) - 1;
    let mut value = usize::from(*block.get(at)?) & max;
    let mut next = at + 1;
    if value < max {
        return Some((value, next));
    }
    let mut shift = 0;
    loop {
        let byte = *block.get(next)?;
        next += 1;
        value = value.checked_add((usize::from(byte) & 0x7f).checked_shl(shift)?)?;
        if byte & 0x80 == 0 {
            return Some((value, next));
        }
        shift += 7;
        if shift > 28 {
            return None;
        }
    }
}

/// An HPACK string literal at `at`: (Huffman-coded?, range of its bytes).
fn string(block: &[u8], at: usize) -> Option<(bool, std::ops::Range<usize>)> {
    let huffman = block.get(at)? & 0x80 != 0;
    let (len, start) = integer(block, at, 7)?;
    let end = start.checked_add(len)?;
    (end <= block.len()).then_some((huffman, start..end))
}

impl<S: AsyncRead + Unpin> AsyncRead for UnixPathHeaderFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.out_pos < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.out_pos);
                buf.put_slice(&this.out[this.out_pos..this.out_pos + n]);
                this.out_pos += n;
                if this.out_pos == this.out.len() {
                    this.out.clear();
                    this.out_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.overflow {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "HTTP/2 header block larger than {} bytes: connection closed",
                        this.max_block
                    ),
                )));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; READ_CHUNK];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Ready(Ok(())) if read.filled().is_empty() => {
                    // End of stream: hand over whatever is left, unchanged.
                    this.eof = true;
                    this.out.append(&mut this.held);
                    this.out.append(&mut this.raw);
                }
                Poll::Ready(Ok(())) => {
                    this.raw.extend_from_slice(read.filled());
                    this.process();
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
    use super::*;
    use proptest::prelude::*;

    /// The header block grpcio 1.85 sent on a unix socket (captured).
    const GRPCIO_BLOCK: &str = "40053a70617468042f612f62400a3a617574686f7269747918746d70253246636170736f636b2532467364732e736f636b8386";

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
            .collect()
    }

    #[test]
    fn rewrites_grpcio_socket_path_authority_in_place() {
        let mut block = hex(GRPCIO_BLOCK);
        let before = block.clone();
        assert!(fix_block(&mut block));
        assert_eq!(block.len(), before.len());
        let text = String::from_utf8_lossy(&block);
        assert!(
            text.contains(":authority\x18localhost--------------x"),
            "{text:?}"
        );
        assert!(text.contains("/a/b"), "the path is untouched");
        let mut again = block.clone();
        assert!(!fix_block(&mut again), "a valid authority is left alone");
    }

    #[test]
    fn valid_and_indexed_authorities_are_untouched() {
        // Literal with incremental indexing, static name index 1 (:authority), "host:50".
        let mut block = vec![0x41, 7];
        block.extend_from_slice(b"host:50");
        block.push(0x82); // indexed: :method GET
        let before = block.clone();
        assert!(!fix_block(&mut block));
        assert_eq!(block, before);
    }

    #[test]
    fn fixes_blocks_split_over_continuation_frames() {
        let block = hex(GRPCIO_BLOCK);
        let (a, b) = block.split_at(20);
        let mut frames = vec![0, 0, a.len() as u8, HEADERS, 0, 0, 0, 0, 1];
        frames.extend_from_slice(a);
        frames.extend_from_slice(&[0, 0, b.len() as u8, CONTINUATION, END_HEADERS, 0, 0, 0, 1]);
        frames.extend_from_slice(b);
        let mut fixed = frames.clone();
        fix_header_frames(&mut fixed);
        assert_ne!(fixed, frames);
        assert_eq!(fixed.len(), frames.len());
        assert!(String::from_utf8_lossy(&fixed).contains("localhost"));
    }

    #[test]
    fn malformed_blocks_do_not_panic() {
        for block in [
            vec![0x40],
            vec![0x40, 0x85, 1],
            vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
            vec![0x00, 0x7f],
        ] {
            let mut copy = block.clone();
            fix_block(&mut copy);
        }
    }

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
            assert!(fixer.raw.len() <= FRAME_HEADER_LEN + MAX_FRAME_SIZE + READ_CHUNK);
            assert!(fixer.held.len() <= max_block + 2 * (FRAME_HEADER_LEN + MAX_FRAME_SIZE));
            if n == 0 {
                return Ok(out);
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut out = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            flags,
            0,
            0,
            0,
            1,
        ];
        out.extend_from_slice(payload);
        out
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
            // The largest header block the fixer must hold back, computed independently.
            let (mut at, mut largest, mut open) = (PREFACE_LEN, 0usize, None::<usize>);
            while at + FRAME_HEADER_LEN <= data.len() {
                let len = usize::from(data[at]) << 16 | usize::from(data[at + 1]) << 8 | usize::from(data[at + 2]);
                if at + FRAME_HEADER_LEN + len > data.len() {
                    break;
                }
                let (kind, flags) = (data[at + 3], data[at + 4]);
                open = match open {
                    Some(size) => {
                        let size = size + len;
                        largest = largest.max(size);
                        (kind == CONTINUATION && flags & END_HEADERS == 0).then_some(size)
                    }
                    // A block in one frame is not held back: the HTTP/2 server's own limit applies.
                    None if kind == HEADERS && flags & END_HEADERS == 0 => {
                        largest = largest.max(len);
                        Some(len)
                    }
                    None => None,
                };
                at += FRAME_HEADER_LEN + len;
            }
            if largest > max_block {
                prop_assert!(result.is_err(), "a {largest}-byte block passed a {max_block}-byte limit");
            } else {
                prop_assert!(result.is_ok(), "{:?}", result.err());
            }
        }
    }
}
