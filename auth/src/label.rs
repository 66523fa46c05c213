//! Kubernetes-style label keys and values, as carried in token `labels` and `tags`.

use crate::error::{quote, AuthError, Refusal};

/// Parses a `KEY=VALUE` command line argument (`--label`, `--tag`) into a key and a value.
///
/// The key is a Kubernetes label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// characters of `[A-Za-z0-9_.-]` that starts and ends with a letter or digit (`kuma.io/service`, `app`).
/// The value may be empty, or follows the same rule as the name. The split is at the first `=`.
pub fn parse_label(kv: &str) -> Result<(String, String), AuthError> {
    let invalid = |reason: String| AuthError::InvalidLabel {
        input: quote(kv),
        reason,
    };
    let (key, value) = kv
        .split_once('=')
        .ok_or_else(|| invalid("expected KEY=VALUE".to_owned()))?;
    validate_key(key).map_err(|r| invalid(r.0))?;
    validate_value(value).map_err(|r| invalid(r.0))?;
    Ok((key.to_owned(), value.to_owned()))
}

/// Checks a label key; the error is a reason that names the offending part.
pub(crate) fn validate_key(key: &str) -> Result<(), Refusal> {
    if key.is_empty() {
        return Err(Refusal("the key is empty".to_owned()));
    }
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            validate_prefix(prefix)
                .map_err(|why| Refusal(format!("key prefix {} {why}", quote(prefix))))?;
            name
        }
        None => key,
    };
    if name.is_empty() {
        return Err(Refusal(format!(
            "key {} has an empty name after the prefix",
            quote(key)
        )));
    }
    validate_name_part(name).map_err(|why| Refusal(format!("key name {} {why}", quote(name))))
}

/// Checks a label value (empty is allowed).
pub(crate) fn validate_value(value: &str) -> Result<(), Refusal> {
    if value.is_empty() {
        return Ok(());
    }
    validate_name_part(value).map_err(|why| Refusal(format!("value {} {why}", quote(value))))
}

/// A label name or non-empty value: at most 63 characters of `[A-Za-z0-9_.-]`, alphanumeric at both ends.
fn validate_name_part(part: &str) -> Result<(), &'static str> {
    const RULE: &str = "must be at most 63 characters of A-Z, a-z, 0-9, '_', '.' and '-', \
                        starting and ending with a letter or digit";
    let bytes = part.as_bytes();
    let ends_ok = matches!(
        (bytes.first(), bytes.last()),
        (Some(first), Some(last)) if first.is_ascii_alphanumeric() && last.is_ascii_alphanumeric()
    );
    let chars_ok = bytes
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if bytes.len() <= 63 && ends_ok && chars_ok {
        Ok(())
    } else {
        Err(RULE)
    }
}

/// A key prefix: a DNS subdomain (lowercase, at most 253 characters, dot-separated labels of `[a-z0-9-]` that
/// start and end with a letter or digit).
fn validate_prefix(prefix: &str) -> Result<(), &'static str> {
    const RULE: &str = "must be a lowercase DNS subdomain (like kuma.io) of at most 253 characters";
    if prefix.is_empty() || prefix.len() > 253 {
        return Err(RULE);
    }
    let label_ok = |label: &str| {
        let b = label.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b.first() != Some(&b'-')
            && b.last() != Some(&b'-')
    };
    if prefix.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(RULE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_kubernetes_and_kuma_labels() {
        for (input, key, value) in [
            ("app=web", "app", "web"),
            (
                "kuma.io/service=web_default_svc_80",
                "kuma.io/service",
                "web_default_svc_80",
            ),
            (
                "k8s.kuma.io/namespace=kuma-demo",
                "k8s.kuma.io/namespace",
                "kuma-demo",
            ),
            ("version=", "version", ""),
        ] {
            assert_eq!(
                parse_label(input).expect("valid label"),
                (key.to_owned(), value.to_owned()),
                "{input}"
            );
        }
    }

    #[test]
    fn refuses_bad_labels() {
        for input in [
            "",
            "noequals",
            "=value",
            "-app=web",
            "app-=web",
            "app=-web",
            "app=web!",
            // The split is at the first '=', and '=' is not a value character.
            "a=b=c",
            "Kuma.io/service=web",
            "/service=web",
            "kuma.io/=web",
            "a/b/c=web",
            "app=has space",
            "app=line\nbreak",
            &format!("{}=x", "a".repeat(64)),
            &format!("x={}", "a".repeat(64)),
            &format!("{}/x=y", "a".repeat(254)),
        ] {
            let err = parse_label(input).expect_err(input);
            assert!(
                matches!(err, AuthError::InvalidLabel { .. }),
                "{input}: {err}"
            );
        }
    }

    #[test]
    fn error_escapes_control_characters() {
        let err = parse_label("app=line\nbreak").expect_err("newline refused");
        assert!(!err.to_string().contains('\n'), "{err}");
    }
}
