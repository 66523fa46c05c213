//! Text that came from a peer, made safe to echo: in a gRPC status, a log line or the admin API it
//! is escaped (no newline or terminal escape can forge output) and truncated.

use std::fmt::Write;

/// How many characters of a peer's text are echoed before the rest is cut.
pub const ECHO_CHARS: usize = 200;

/// `text` quoted: what [`bounded`] makes of it, between double quotes.
pub fn shown(text: &str) -> String {
    format!("\"{}\"", bounded(text))
}

/// `text` escaped (no raw control character: `\n`, `\u{1b}`...), at most [`ECHO_CHARS`] characters
/// of it, followed by how many bytes were left out.
pub fn bounded(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(ECHO_CHARS) + 24);
    let mut taken = 0;
    for (n, c) in text.chars().enumerate() {
        if n == ECHO_CHARS {
            break;
        }
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
        taken += c.len_utf8();
    }
    if taken < text.len() {
        let _ = write!(out, "… ({} more bytes)", text.len() - taken);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn short_text_is_quoted_and_escaped() {
        assert_eq!(shown("default"), "\"default\"");
        assert_eq!(shown("a\nb\u{1b}[31m"), "\"a\\nb\\u{1b}[31m\"");
        assert_eq!(bounded("the key is bad"), "the key is bad");
    }

    #[test]
    fn long_text_is_cut_and_says_how_much() {
        let text = "x".repeat(3_000_000);
        let s = shown(&text);
        assert!(s.len() < ECHO_CHARS + 40, "{}", s.len());
        assert!(
            s.contains(&format!("({} more bytes)", 3_000_000 - ECHO_CHARS)),
            "{s}"
        );
    }

    proptest! {
        #[test]
        fn never_long_never_a_raw_control_character(text in ".{0,600}") {
            let s = shown(&text);
            prop_assert!(s.chars().count() <= ECHO_CHARS * 12 + 40);
            prop_assert!(!s.chars().any(|c| c.is_control()));
        }
    }
}
