//! The one name grammar shared by resource names, mesh references and the zone name.

/// The longest name accepted (a DNS subdomain).
pub(crate) const MAX_NAME_LEN: usize = 253;

/// How much of a value from a file is quoted back in an error.
pub(crate) const ECHO_CHARS: usize = 64;

/// `text`, or its first `max` characters and how many bytes were left out: a value quoted in an
/// error must not make the error (or the admin API showing it) as large as the value.
pub(crate) fn cut(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(max) {
        None => std::borrow::Cow::Borrowed(text),
        Some((at, _)) => {
            std::borrow::Cow::Owned(format!("{}… ({} more bytes)", &text[..at], text.len() - at))
        }
    }
}

/// Why a name was refused; the caller places it in its own error, which names the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum NameError {
    /// The name is empty.
    #[error("must not be empty")]
    Empty,
    /// The name is longer than [`MAX_NAME_LEN`] bytes.
    #[error("{quoted:?} is {len} bytes long; at most {MAX_NAME_LEN} are allowed")]
    TooLong {
        /// The name, cut to [`ECHO_CHARS`] characters.
        quoted: String,
        /// Its length in bytes.
        len: usize,
    },
    /// The name has a character, or starts or ends with one, the grammar does not allow.
    #[error("{quoted:?} is not a valid name: use lowercase letters, digits, '-' and '.', starting and ending with a letter or digit")]
    Invalid {
        /// The name, cut to [`ECHO_CHARS`] characters.
        quoted: String,
    },
}

/// Checks a DNS-1123-style name: `[a-z0-9]([-a-z0-9.]*[a-z0-9])?`, at most 253 bytes.
pub(crate) fn check_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong {
            quoted: cut(name, ECHO_CHARS).into_owned(),
            len: name.len(),
        });
    }
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let bytes = name.as_bytes();
    let ends_ok =
        bytes.first().copied().is_some_and(alnum) && bytes.last().copied().is_some_and(alnum);
    let all_ok = bytes.iter().all(|&c| alnum(c) || c == b'-' || c == b'.');
    if ends_ok && all_ok {
        Ok(())
    } else {
        Err(NameError::Invalid {
            quoted: cut(name, ECHO_CHARS).into_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_dns_style_names() {
        for ok in [
            "a",
            "default",
            "web-1",
            "a.b-c",
            "0",
            "x".repeat(253).as_str(),
        ] {
            assert_eq!(check_name(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn rejects_others() {
        for bad in [
            "",
            "-a",
            "a-",
            ".a",
            "A",
            "a_b",
            "a b",
            "é",
            &"x".repeat(254),
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn long_values_are_cut_in_errors() {
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("abcdef", 3), "abc… (3 more bytes)");
        let error = check_name(&"X".repeat(10_000))
            .expect_err("too long")
            .to_string();
        assert!(error.len() < 200, "{error}");
        assert!(error.contains("10000 bytes long"), "{error}");
    }
}
