//! The rewriter's sans-IO core: HTTP/2 frames in, the same frames out, header blocks fixed.
//!
//! [`HeaderFixup`] is fed the client's bytes in chunks cut anywhere and hands out what the HTTP/2
//! server may read. It never reads a socket, so tests and the fuzzer drive it with any byte sequence
//! and any read boundaries; [`super::UnixPathHeaderFix`] is the thin `AsyncRead` around it.

use std::fmt;

use super::hpack::fix_header_frames;

use super::{CONTINUATION, END_HEADERS, FRAME_HEADER_LEN, HEADERS, PREFACE_LEN};

/// The largest frame payload a client may send: the HTTP/2 default, which the server keeps.
/// A larger frame is not held back; the rewriter passes everything through from there on and
/// the HTTP/2 server closes the connection with `FRAME_SIZE_ERROR`.
pub(crate) const MAX_FRAME_SIZE: usize = 16 * 1024;

/// The most frames one held header block may have (its HEADERS frame and CONTINUATIONs). The HTTP/2
/// server itself refuses a block of more than 5 CONTINUATIONs at meshca's settings (h2 allows the
/// frames the header list limit needs, plus a quarter, and at least 5), so below this count it stays
/// the one that refuses; this count only stops frames the server would never get to see.
pub(crate) const MAX_BLOCK_FRAMES: usize = 16;

/// The client sent a header block over the limit: the connection must be closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Overflow {
    max_block: usize,
}

impl fmt::Display for Overflow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "HTTP/2 header block larger than {} bytes or {MAX_BLOCK_FRAMES} frames: connection closed",
            self.max_block
        )
    }
}

/// The most room an idle connection's output buffer keeps: enough for the pings and small frames of
/// a quiet connection without a new allocation each time.
const IDLE_OUTPUT_CAPACITY: usize = 1024;

/// Rewrites invalid `:authority` values in the header blocks of a client's HTTP/2 byte stream.
///
/// Holds back an incomplete frame until it is whole, and a header block split over CONTINUATION
/// frames until its END_HEADERS (the value may straddle frames). What it holds, [`Self::held`], is
/// never more than [`Self::bound`]: every byte counts, frame headers included, and a block may have at
/// most [`MAX_BLOCK_FRAMES`] frames. A block that would pass either limit is refused as soon as the
/// header of the frame that passes it arrives, before its payload.
#[derive(Debug)]
pub(crate) struct HeaderFixup {
    /// The start of a frame that has not arrived whole (a frame header when shorter than one).
    partial: Vec<u8>,
    /// Bytes ready for the HTTP/2 server; `out[out_pos..]` is still to be taken.
    out: Vec<u8>,
    out_pos: usize,
    preface_left: usize,
    /// A HEADERS frame and its CONTINUATIONs, held until END_HEADERS; empty when no block is open.
    block: Vec<u8>,
    /// The frames in `block`.
    block_frames: usize,
    /// The largest header block held, frame headers included.
    max_block: usize,
    /// A frame over [`MAX_FRAME_SIZE`] arrived: everything passes untouched from there on.
    passthrough: bool,
    overflow: Option<Overflow>,
}

impl HeaderFixup {
    /// A rewriter that holds header blocks of at most `max_block` bytes (frame headers included).
    pub(crate) fn new(max_block: usize) -> Self {
        HeaderFixup {
            partial: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            preface_left: PREFACE_LEN,
            block: Vec::new(),
            block_frames: 0,
            max_block,
            passthrough: false,
            overflow: None,
        }
    }

    /// The most bytes [`Self::held`] can ever be: a header block of `max_block` bytes and the first
    /// 8 bytes of the next frame header, or one incomplete frame of the largest size.
    pub(crate) fn bound(&self) -> usize {
        self.max_block.max(FRAME_HEADER_LEN + MAX_FRAME_SIZE) + FRAME_HEADER_LEN - 1
    }

    /// Bytes fed but held back: an incomplete frame and an unfinished header block.
    pub(crate) fn held(&self) -> usize {
        self.partial.len() + self.block.len()
    }

    /// The bytes ready for the HTTP/2 server.
    pub(crate) fn output(&self) -> &[u8] {
        &self.out[self.out_pos..]
    }

    /// Marks the first `n` bytes of [`Self::output`] as taken.
    pub(crate) fn consume(&mut self, n: usize) {
        self.out_pos = (self.out_pos + n).min(self.out.len());
        if self.out_pos == self.out.len() {
            self.out.clear();
            self.out_pos = 0;
        }
    }

    /// Frees the output buffer once it is taken and larger than [`IDLE_OUTPUT_CAPACITY`]: called when
    /// the connection has nothing more to read for now. A connection that once carried large
    /// requests would otherwise keep the largest read's room (16 KiB and more) while idle.
    pub(crate) fn release_idle_room(&mut self) {
        // `consume` empties the buffer (and rewinds `out_pos`) once every byte is taken.
        if self.out.is_empty() && self.out.capacity() > IDLE_OUTPUT_CAPACITY {
            self.out = Vec::new();
        }
    }

    /// Reads the next bytes of the client's stream, cut anywhere. After an overflow, everything is
    /// refused; the output produced before it can still be taken.
    pub(crate) fn feed(&mut self, mut input: &[u8]) -> Result<(), Overflow> {
        if let Some(overflow) = self.overflow {
            return Err(overflow);
        }
        if self.preface_left > 0 {
            let n = self.preface_left.min(input.len());
            self.out.extend_from_slice(&input[..n]);
            self.preface_left -= n;
            input = &input[n..];
        }
        // A frame begun in an earlier chunk: complete it from this one, taking only its own bytes.
        while !self.partial.is_empty() && !self.passthrough {
            if self.partial.len() < FRAME_HEADER_LEN {
                let n = (FRAME_HEADER_LEN - self.partial.len()).min(input.len());
                self.partial.extend_from_slice(&input[..n]);
                input = &input[n..];
                if self.partial.len() < FRAME_HEADER_LEN {
                    return Ok(());
                }
            }
            let Some(size) = self.frame_size(header(&self.partial))? else {
                break;
            };
            let n = (size - self.partial.len()).min(input.len());
            self.partial.extend_from_slice(&input[..n]);
            input = &input[n..];
            if self.partial.len() < size {
                return Ok(());
            }
            let frame = std::mem::take(&mut self.partial);
            self.take_frame(&frame);
        }
        // Whole frames are processed where they lie, from an offset: nothing is moved per frame.
        let mut at = 0;
        while !self.passthrough && input.len() - at >= FRAME_HEADER_LEN {
            let Some(size) = self.frame_size(header(&input[at..]))? else {
                break;
            };
            if input.len() - at < size {
                break;
            }
            self.take_frame(&input[at..at + size]);
            at += size;
        }
        let rest = &input[at..];
        if self.passthrough {
            self.release();
            self.out.extend_from_slice(rest);
        } else {
            self.partial.extend_from_slice(rest);
        }
        Ok(())
    }

    /// The end of the client's stream: whatever is held is handed over unchanged.
    pub(crate) fn finish(&mut self) {
        if self.overflow.is_none() {
            self.release();
        }
    }

    /// Moves everything held to the output, unchanged.
    fn release(&mut self) {
        self.out.append(&mut self.block);
        self.out.append(&mut self.partial);
        self.block = Vec::new();
        self.block_frames = 0;
    }

    /// The size of the frame whose header is `(len, kind, flags)`, header included, once it is known
    /// to fit; `None` (and pass-through from here on) for a frame over [`MAX_FRAME_SIZE`].
    fn frame_size(
        &mut self,
        (len, kind, flags): (usize, u8, u8),
    ) -> Result<Option<usize>, Overflow> {
        if len > MAX_FRAME_SIZE {
            self.passthrough = true;
            return Ok(None);
        }
        let size = FRAME_HEADER_LEN + len;
        let opens_block = kind == HEADERS && flags & END_HEADERS == 0;
        if !self.block.is_empty() || opens_block {
            // Any frame after an open block's last one belongs to it (the server refuses one that
            // is not a CONTINUATION), so it counts as the block's.
            if self.block.len() + size > self.max_block || self.block_frames >= MAX_BLOCK_FRAMES {
                let overflow = Overflow {
                    max_block: self.max_block,
                };
                self.overflow = Some(overflow);
                self.block = Vec::new();
                self.partial = Vec::new();
                return Err(overflow);
            }
        }
        Ok(Some(size))
    }

    /// Processes one whole frame whose size [`Self::frame_size`] accepted.
    fn take_frame(&mut self, frame: &[u8]) {
        let (kind, flags) = (frame[3], frame[4]);
        if !self.block.is_empty() {
            self.block.extend_from_slice(frame);
            self.block_frames += 1;
            if kind != CONTINUATION || flags & END_HEADERS != 0 {
                if kind == CONTINUATION {
                    fix_header_frames(&mut self.block);
                }
                self.out.append(&mut self.block);
                self.block = Vec::new();
                self.block_frames = 0;
            }
        } else if kind == HEADERS && flags & END_HEADERS == 0 {
            self.block.extend_from_slice(frame);
            self.block_frames = 1;
        } else {
            let start = self.out.len();
            self.out.extend_from_slice(frame);
            if kind == HEADERS {
                fix_header_frames(&mut self.out[start..]);
            }
        }
    }
}

/// A frame header's payload length, type and flags; `bytes` holds at least [`FRAME_HEADER_LEN`] bytes.
fn header(bytes: &[u8]) -> (usize, u8, u8) {
    let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
    (len, bytes[3], bytes[4])
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use proptest::prelude::*;

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    /// A frame header announcing `len` bytes, and `payload` (which may be shorter or longer).
    pub(in crate::h2_header_fixup) fn frame(
        len: usize,
        kind: u8,
        flags: u8,
        payload: &[u8],
    ) -> Vec<u8> {
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

    /// What feeding `data` cut at `cuts` gives: the output, whether it overflowed, and (checked
    /// after every chunk) that what is held stays within the bound and no byte is lost or made up.
    fn feed_all(data: &[u8], cuts: &[usize], max_block: usize) -> (Vec<u8>, bool) {
        let mut at: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
        at.extend([0, data.len()]);
        at.sort_unstable();
        at.dedup();
        let mut core = HeaderFixup::new(max_block);
        let mut out = Vec::new();
        for piece in at.windows(2) {
            let result = core.feed(&data[piece[0]..piece[1]]);
            assert!(
                core.held() <= core.bound(),
                "{} > {}",
                core.held(),
                core.bound()
            );
            out.extend_from_slice(core.output());
            core.consume(core.output().len());
            // As the connection does whenever it has nothing more to read.
            core.release_idle_room();
            if result.is_err() {
                assert_eq!(core.held(), 0, "nothing is kept after an overflow");
                return (out, true);
            }
            assert_eq!(
                out.len() + core.held(),
                piece[1],
                "every byte is out or held"
            );
        }
        core.finish();
        out.extend_from_slice(core.output());
        (out, false)
    }

    #[test]
    fn an_idle_connection_keeps_no_room_for_its_largest_read() {
        let mut core = HeaderFixup::new(16 * 1024);
        let mut input = PREFACE.to_vec();
        input.extend(frame(12_000, 0, 0, &[7; 12_000]));
        core.feed(&input).expect("a data frame");
        let all = core.output().len();
        assert_eq!(all, input.len());
        // Output not yet taken is kept whole.
        core.consume(100);
        core.release_idle_room();
        assert_eq!(core.output(), &input[100..]);
        core.consume(all - 100);
        assert!(core.out.capacity() >= 12_000);
        core.release_idle_room();
        assert_eq!(core.out.capacity(), 0);
        // A quiet connection's small frames keep their small room.
        core.feed(&frame(8, 6, 0, &[0; 8])).expect("a ping");
        core.consume(core.output().len());
        let room = core.out.capacity();
        core.release_idle_room();
        assert_eq!(core.out.capacity(), room);
        assert!(room <= IDLE_OUTPUT_CAPACITY);
    }

    /// Any frame: mostly header frames, zero-length ones often, lengths that lie now and then.
    fn any_frame() -> impl Strategy<Value = Vec<u8>> {
        let kind = prop_oneof![
            3 => Just(CONTINUATION),
            2 => Just(HEADERS),
            1 => Just(0u8),
            1 => any::<u8>(),
        ];
        let flags = prop_oneof![3 => Just(0u8), 1 => Just(END_HEADERS), 1 => any::<u8>()];
        let payload = prop_oneof![
            3 => Just(Vec::new()),
            3 => proptest::collection::vec(any::<u8>(), 0..300),
        ];
        let lies = prop_oneof![8 => Just(None), 1 => (0usize..1 << 24).prop_map(Some)];
        (kind, flags, payload, lies).prop_map(|(kind, flags, payload, lies)| {
            frame(lies.unwrap_or(payload.len()), kind, flags, &payload)
        })
    }

    proptest! {
        /// Held bytes never exceed the documented bound, whatever the frames and wherever the reads
        /// cut them; no byte is lost or invented; and the output does not depend on the cuts.
        #[test]
        fn held_bytes_never_exceed_the_bound(
            frames in proptest::collection::vec(any_frame(), 0..80),
            cuts in proptest::collection::vec(any::<usize>(), 0..40),
            max_block in prop_oneof![1usize..2000, Just(16 * 1024)],
        ) {
            let mut data = PREFACE.to_vec();
            data.extend(frames.concat());
            let whole = feed_all(&data, &[], max_block);
            let cut = feed_all(&data, &cuts, max_block);
            prop_assert_eq!(&whole, &cut);
            if !whole.1 {
                prop_assert_eq!(whole.0.len(), data.len());
            }
        }
    }

    #[test]
    fn a_flood_of_empty_continuations_is_refused_within_the_frame_limit() {
        let mut core = HeaderFixup::new(16 * 1024);
        let mut data = PREFACE.to_vec();
        data.extend(frame(1, HEADERS, 0, &[0x82]));
        core.feed(&data).expect("a block opens");
        let empty = frame(0, CONTINUATION, 0, &[]);
        let mut held_frames = 1;
        while core.feed(&empty).is_ok() {
            held_frames += 1;
            assert!(held_frames <= 100_000, "{} bytes held", core.held());
        }
        assert_eq!(
            held_frames, MAX_BLOCK_FRAMES,
            "the frame past the limit is refused"
        );
    }

    #[test]
    fn a_block_is_refused_from_the_header_of_the_frame_that_passes_the_limit() {
        let mut core = HeaderFixup::new(100);
        let mut data = PREFACE.to_vec();
        data.extend(frame(50, HEADERS, 0, &[0x82; 50]));
        core.feed(&data).expect("59 bytes held");
        // 59 + 9 + 33 > 100: refused before any of the 33 bytes arrives.
        assert!(core
            .feed(&frame(33, CONTINUATION, END_HEADERS, &[]))
            .is_err());
    }

    #[test]
    fn valid_traffic_passes_unchanged_in_one_pass() {
        // A block over three frames with a valid authority, then a DATA frame.
        let block = [&[0x41, 7][..], b"host:50", &[0x82]].concat();
        let mut data = PREFACE.to_vec();
        data.extend(frame(4, HEADERS, 0, &block[..4]));
        data.extend(frame(3, CONTINUATION, 0, &block[4..7]));
        data.extend(frame(3, CONTINUATION, END_HEADERS, &block[7..]));
        data.extend(frame(5, 0, 1, b"hello"));
        let (out, overflow) = feed_all(&data, &[30, 31, 50], 16 * 1024);
        assert!(!overflow);
        assert_eq!(out, data);
    }
}
