//! Entry names: relative slash paths that cannot leave the keystore.

use crate::error::KeystoreError;

/// The longest entry name, in bytes.
const MAX_NAME_LEN: usize = 1024;
/// The longest segment, in bytes (a file name on common filesystems).
const MAX_SEGMENT_LEN: usize = 255;

/// Checks an entry name: a relative slash path (`ca/default/ca-1/key.pem`) of at most 1024 bytes whose
/// segments are non-empty, at most 255 bytes of `[A-Za-z0-9._-]`, and not `.` or `..`.
///
/// Such a name cannot escape the keystore directory, and can never collide with the keystore's own
/// bookkeeping files, which contain `#`.
pub fn validate_name(name: &str) -> Result<(), KeystoreError> {
    let invalid = |reason| KeystoreError::InvalidName {
        name: quote(name),
        reason,
    };
    if name.is_empty() {
        return Err(invalid("it is empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(invalid("it is longer than 1024 bytes"));
    }
    if name.starts_with('/') {
        return Err(invalid("it must be relative (no leading '/')"));
    }
    name.split('/')
        .try_for_each(|segment| check_segment(segment).map_err(invalid))
}

/// Checks a `list` prefix: like a name, except that it may be empty, end with `/`, or end inside a segment.
pub fn validate_prefix(prefix: &str) -> Result<(), KeystoreError> {
    let invalid = |reason| KeystoreError::InvalidName {
        name: quote(prefix),
        reason,
    };
    if prefix.len() > MAX_NAME_LEN {
        return Err(invalid("it is longer than 1024 bytes"));
    }
    if prefix.starts_with('/') {
        return Err(invalid("it must be relative (no leading '/')"));
    }
    let (complete, partial) = split_prefix(prefix);
    if !partial.bytes().all(is_name_byte) {
        return Err(invalid(SEGMENT_RULE));
    }
    complete.map_or(Ok(()), |dir| {
        dir.split('/')
            .try_for_each(|segment| check_segment(segment).map_err(invalid))
    })
}

/// Splits a prefix into its complete directory segments (if any) and the trailing partial segment.
pub(crate) fn split_prefix(prefix: &str) -> (Option<&str>, &str) {
    match prefix.rsplit_once('/') {
        Some((dir, partial)) => (Some(dir), partial),
        None => (None, prefix),
    }
}

const SEGMENT_RULE: &str =
    "each '/'-separated segment must be 1-255 characters of A-Z, a-z, 0-9, '.', '_' and '-', and not '.' or '..'";

fn check_segment(segment: &str) -> Result<(), &'static str> {
    if segment.is_empty()
        || segment.len() > MAX_SEGMENT_LEN
        || segment == "."
        || segment == ".."
        || !segment.bytes().all(is_name_byte)
    {
        Err(SEGMENT_RULE)
    } else {
        Ok(())
    }
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')
}

/// Escapes a name for an error message and keeps it short.
fn quote(name: &str) -> String {
    const MAX: usize = 100;
    if name.chars().count() > MAX {
        let head: String = name.chars().take(MAX).collect();
        format!("{head:?}...")
    } else {
        format!("{name:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_relative_slash_paths() {
        for name in [
            "key.pem",
            "ca/default/ca-1/key.pem",
            "tokens/signing_key.pk8",
            ".hidden",
            "a..b",
            &"a".repeat(255),
        ] {
            assert!(validate_name(name).is_ok(), "{name}");
        }
    }

    #[test]
    fn refuses_paths_that_could_escape_or_confuse() {
        for name in [
            "",
            "/etc/passwd",
            "..",
            ".",
            "../x",
            "a/../b",
            "a/./b",
            "a//b",
            "a/",
            "a b",
            "a\\b",
            "a#b",
            "ключ",
            "a\0b",
            "a\nb",
            &"a".repeat(256),
            &vec!["a"; 600].join("/"),
        ] {
            let err = validate_name(name).expect_err(name);
            assert!(
                matches!(err, KeystoreError::InvalidName { .. }),
                "{name}: {err}"
            );
            assert!(!err.to_string().contains('\n'), "{err}");
        }
    }

    #[test]
    fn prefixes() {
        for prefix in ["", "ca", "ca/", "ca/default/ca-", "ca/default/"] {
            assert!(validate_prefix(prefix).is_ok(), "{prefix}");
        }
        for prefix in ["/", "/ca", "../", "ca//", "ca/../x", "c a", "ca/x#"] {
            assert!(validate_prefix(prefix).is_err(), "{prefix}");
        }
        assert_eq!(split_prefix("ca/default/ca-"), (Some("ca/default"), "ca-"));
        assert_eq!(split_prefix("ca/"), (Some("ca"), ""));
        assert_eq!(split_prefix("ca"), (None, "ca"));
    }
}
