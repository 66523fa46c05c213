//! The HPACK side of the rewriter: finds literal `:authority` values in a header block and overwrites
//! invalid ones in place, with a valid value of the same length.

use super::{FRAME_HEADER_LEN, HEADERS, PADDED, PRIORITY};

/// Fixes the header block carried by one HEADERS frame and its CONTINUATION frames.
pub(super) fn fix_header_frames(frames: &mut [u8]) {
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
    if let [range] = ranges.as_slice() {
        // One frame (the usual case): its block is fixed where it lies.
        fix_block(&mut frames[range.clone()]);
        return;
    }
    let mut block: Vec<u8> = ranges
        .iter()
        .flat_map(|range| frames[range.clone()].iter().copied())
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

#[cfg(test)]
mod tests {
    use super::super::{CONTINUATION, END_HEADERS};
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
