//! gRPC framing's sans-IO core: a request stream's bytes in, whole messages out, and a response
//! message framed into a buffer of its own size.
//!
//! [`RequestFramer`] is handed the request body's bytes in slices cut anywhere, reads each message's
//! frame header, and feeds the message itself through a [`Trimmer`]; it never reads a body, so tests
//! and the fuzzer drive it with any byte sequence and any cuts. [`super::Requests`] is the thin reader
//! of the HTTP/2 body around it, and [`super::response`] sends each [`frame`] as the response body.
//!
//! The framing is gRPC's (a compression flag, a big-endian length, the message), without compression.

use std::marker::PhantomData;

use crate::transport::wire::{self, Malformed, Trimmer};

/// A gRPC message's frame header: the compression flag and the length.
pub(crate) const HEADER: usize = 5;

/// Why a request stream is refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FramingError {
    /// The compression flag is set.
    #[error("compressed requests are not accepted; send them uncompressed")]
    Compressed,
    /// A message's header announced more than the limit.
    #[error("a request of {len} bytes is over the limit of {max} bytes (limits.requestBytes)")]
    TooLarge { len: usize, max: usize },
    /// The trimmer refused the message's bytes.
    #[error("a request does not decode: {}", .0.0)]
    Malformed(Malformed),
    /// What the trimmer kept does not decode.
    #[error("a request does not decode: {0}")]
    Decode(#[from] prost::DecodeError),
    /// The body ended after part of a message.
    #[error("the request stream ended inside a message")]
    EndedInsideMessage,
}

impl From<Malformed> for FramingError {
    fn from(malformed: Malformed) -> Self {
        FramingError::Malformed(malformed)
    }
}

/// Reads the messages of a streaming request from its bytes: a message's bytes go through a
/// [`Trimmer`], which keeps what meshca decodes, and nothing else is kept between messages.
pub(crate) struct RequestFramer<T> {
    /// The next message's header, as far as it arrived.
    header: [u8; HEADER],
    header_len: usize,
    /// The message being read, boxed: every idle stream keeps its framer, and a trimmer (112 bytes)
    /// is only needed while a message arrives.
    current: Option<Box<Trimmer>>,
    /// The largest message accepted, in bytes.
    max_bytes: usize,
    _messages: PhantomData<fn() -> T>,
}

impl<T: wire::Request> RequestFramer<T> {
    /// A framer that refuses messages over `max_bytes`.
    pub(crate) fn new(max_bytes: usize) -> Self {
        RequestFramer {
            header: [0; HEADER],
            header_len: 0,
            current: None,
            max_bytes,
            _messages: PhantomData,
        }
    }

    /// Reads `data` up to the end of the next message: how many of its bytes were read, and the
    /// message, decoded, if one ended there (else all of `data` was read).
    pub(crate) fn read(&mut self, data: &[u8]) -> Result<(usize, Option<T>), FramingError> {
        let mut used = 0;
        loop {
            if let Some(trimmer) = self.current.as_mut().filter(|t| t.left() > 0) {
                let n = trimmer.left().min(data.len() - used);
                trimmer.feed(&data[used..used + n])?;
                used += n;
                debug_assert!(self.held() <= HEADER + self.max_bytes);
            }
            if self.current.as_ref().is_some_and(|t| t.left() == 0) {
                let trimmer = self.current.take().expect("checked above");
                let kept = (*trimmer).finish()?;
                return Ok((used, Some(T::decode(kept.as_slice())?)));
            }
            if used == data.len() {
                return Ok((used, None));
            }
            used += self.read_header(&data[used..])?;
        }
    }

    /// Whether the body may end here: no message is partly read.
    pub(crate) fn between_messages(&self) -> bool {
        self.header_len == 0 && self.current.is_none()
    }

    /// The bytes it holds of the request: a message header as far as it arrived and what the trimmer
    /// keeps of the message, so never more than a header and `max_bytes`.
    pub(crate) fn held(&self) -> usize {
        self.header_len + self.current.as_ref().map_or(0, |t| t.held())
    }

    /// Reads header bytes from `data` (how many it read); once the header is whole, refuses a
    /// compressed message or one over `max_bytes` (before any of it is read), else starts reading the
    /// message.
    fn read_header(&mut self, data: &[u8]) -> Result<usize, FramingError> {
        let n = (HEADER - self.header_len).min(data.len());
        self.header[self.header_len..self.header_len + n].copy_from_slice(&data[..n]);
        self.header_len += n;
        if self.header_len < HEADER {
            return Ok(n);
        }
        self.header_len = 0;
        let header = self.header;
        if header[0] != 0 {
            return Err(FramingError::Compressed);
        }
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if len > self.max_bytes {
            return Err(FramingError::TooLarge {
                len,
                max: self.max_bytes,
            });
        }
        self.current = Some(Box::new(Trimmer::new::<T>(len)));
        Ok(n)
    }
}

/// A message a response body writes: a prost message, or one encoded in part ahead of time and shared
/// by many streams (see `sotw::SotwResponse`).
pub(crate) trait Encode {
    /// Its length, encoded.
    fn message_len(&self) -> usize;
    /// Appends its encoding to `buf`.
    fn write_message(&self, buf: &mut Vec<u8>);
}

impl<M: prost::Message> Encode for M {
    fn message_len(&self) -> usize {
        self.encoded_len()
    }

    fn write_message(&self, buf: &mut Vec<u8>) {
        self.encode_raw(buf);
    }
}

/// Why a response could not be framed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EncodeError {
    #[error("a response of {0} bytes is too large for gRPC")]
    TooLarge(usize),
    #[error("encoding a response gave {written} bytes, not the {announced} it announced")]
    Mismatch { written: usize, announced: usize },
}

/// `message` framed for gRPC, in a buffer of exactly its size.
pub(crate) fn frame(message: &impl Encode) -> Result<Vec<u8>, EncodeError> {
    let len = message.message_len();
    let prefix = u32::try_from(len).map_err(|_| EncodeError::TooLarge(len))?;
    let mut buf = Vec::with_capacity(HEADER + len);
    buf.push(0); // not compressed
    buf.extend_from_slice(&prefix.to_be_bytes());
    message.write_message(&mut buf);
    if buf.len() != HEADER + len {
        return Err(EncodeError::Mismatch {
            written: buf.len() - HEADER,
            announced: len,
        });
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::wire::DiscoveryRequest;

    #[test]
    fn a_message_is_read_across_any_cut_and_nothing_is_held_after_it() {
        let request = DiscoveryRequest {
            version_info: "v1".to_owned(),
            resource_names: vec!["default".to_owned()],
            ..Default::default()
        };
        let framed = frame(&request).expect("encodes");
        for cut in 0..framed.len() {
            let mut framer = RequestFramer::<DiscoveryRequest>::new(1024);
            let (read, none) = framer.read(&framed[..cut]).expect("a prefix is fine");
            assert_eq!((read, none), (cut, None), "cut at {cut}");
            assert_eq!(framer.between_messages(), cut == 0);
            let (read, message) = framer.read(&framed[cut..]).expect("the rest");
            assert_eq!(read, framed.len() - cut);
            assert_eq!(message, Some(request.clone()));
            assert!(framer.between_messages() && framer.held() == 0);
        }
    }

    #[test]
    fn a_read_stops_at_the_end_of_a_message() {
        let empty = frame(&DiscoveryRequest::default()).expect("encodes");
        let both = [empty.clone(), empty].concat();
        let mut framer = RequestFramer::<DiscoveryRequest>::new(0);
        let (read, message) = framer.read(&both).expect("reads");
        assert_eq!((read, message), (HEADER, Some(DiscoveryRequest::default())));
    }

    #[test]
    fn refusals_name_their_reason() {
        let mut framer = RequestFramer::<DiscoveryRequest>::new(3);
        let error = framer.read(&[0, 0, 0, 0, 4]).expect_err("over the limit");
        assert!(matches!(error, FramingError::TooLarge { len: 4, max: 3 }));
        let mut framer = RequestFramer::<DiscoveryRequest>::new(3);
        let error = framer.read(&[1, 0, 0, 0, 0]).expect_err("compressed");
        assert!(matches!(error, FramingError::Compressed));
    }
}
