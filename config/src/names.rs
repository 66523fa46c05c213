//! The one name grammar shared by resource names, mesh references and the zone name.

/// The longest name accepted (a DNS subdomain).
pub(crate) const MAX_NAME_LEN: usize = 253;

/// Checks a DNS-1123-style name: `[a-z0-9]([-a-z0-9.]*[a-z0-9])?`, at most 253 bytes.
/// Returns a message saying what is wrong, for the caller to place in its own error.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "{name:?} is {} bytes long; at most {MAX_NAME_LEN} are allowed",
            name.len()
        ));
    }
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let bytes = name.as_bytes();
    let ends_ok =
        bytes.first().copied().is_some_and(alnum) && bytes.last().copied().is_some_and(alnum);
    let all_ok = bytes.iter().all(|&c| alnum(c) || c == b'-' || c == b'.');
    if ends_ok && all_ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid name: use lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
        ))
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
}
