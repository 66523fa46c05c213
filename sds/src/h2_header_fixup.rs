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
/// Frames larger than this are not held back; the reader falls back to passing through.
const MAX_HELD: usize = 1 << 20;
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
    passthrough: bool,
    eof: bool,
}

impl<S> UnixPathHeaderFix<S> {
    pub(crate) fn new(inner: S) -> Self {
        Self {
            inner,
            raw: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            preface_left: PREFACE_LEN,
            held: Vec::new(),
            passthrough: false,
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
            if len > MAX_HELD {
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
                if kind != CONTINUATION || flags & END_HEADERS != 0 {
                    let mut held = std::mem::take(&mut self.held);
                    if kind == CONTINUATION {
                        fix_header_frames(&mut held);
                    }
                    self.out.extend_from_slice(&held);
                }
            } else if kind == HEADERS && flags & END_HEADERS == 0 {
                self.held = frame;
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
}
