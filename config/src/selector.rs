//! Workload selectors: what the kernel says about a process calling the Workload API, written as
//! `TYPE:KIND:VALUE` text (`unix:uid:1001`, `systemd:unit:billing.service`).
//!
//! A registration lists selectors; a caller matches it when the caller's own selectors (worked out from
//! its peer credentials, binary and cgroup) include every one of them. Both sides are [`Selector`]s
//! in one canonical text form, so matching compares texts: [`Selector`]'s `Display` writes the only form
//! its `FromStr` accepts.

use std::fmt;
use std::str::FromStr;

use crate::names::{cut, ECHO_CHARS};

/// The longest user, group or unit name accepted, in bytes.
pub const MAX_SELECTOR_NAME_BYTES: usize = 256;

/// The longest `unix:path` accepted, in bytes (Linux's `PATH_MAX`).
pub const MAX_SELECTOR_PATH_BYTES: usize = 4096;

/// The suffix every `systemd:unit` name carries.
const UNIT_SUFFIX: &str = ".service";

/// The forms accepted, for error messages.
const ACCEPTED: &str = "unix:uid:N, unix:user:NAME, unix:gid:N, unix:group:NAME, unix:supplementary_gid:N, unix:supplementary_group:NAME, unix:path:/ABSOLUTE/PATH, unix:sha256:HEX (64 lowercase hex digits), systemd:unit:NAME.service";

/// What a selector says about a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum SelectorKind {
    /// `unix:uid:N`: its user id.
    Uid,
    /// `unix:user:NAME`: the name of its user id.
    User,
    /// `unix:gid:N`: its group id.
    Gid,
    /// `unix:group:NAME`: the name of its group id.
    Group,
    /// `unix:supplementary_gid:N`: one of its supplementary group ids.
    SupplementaryGid,
    /// `unix:supplementary_group:NAME`: the name of one of its supplementary groups.
    SupplementaryGroup,
    /// `unix:path:/ABS/PATH`: the path of its binary.
    Path,
    /// `unix:sha256:HEX`: the SHA-256 of its binary, in lowercase hex.
    Sha256,
    /// `systemd:unit:NAME.service`: the systemd service it runs in.
    SystemdUnit,
}

impl SelectorKind {
    /// Every kind, in the order of [`ACCEPTED`].
    pub const ALL: [SelectorKind; 9] = [
        SelectorKind::Uid,
        SelectorKind::User,
        SelectorKind::Gid,
        SelectorKind::Group,
        SelectorKind::SupplementaryGid,
        SelectorKind::SupplementaryGroup,
        SelectorKind::Path,
        SelectorKind::Sha256,
        SelectorKind::SystemdUnit,
    ];

    /// The `TYPE:KIND` prefix, without the colon that follows it: `unix:uid`.
    pub fn prefix(self) -> &'static str {
        match self {
            SelectorKind::Uid => "unix:uid",
            SelectorKind::User => "unix:user",
            SelectorKind::Gid => "unix:gid",
            SelectorKind::Group => "unix:group",
            SelectorKind::SupplementaryGid => "unix:supplementary_gid",
            SelectorKind::SupplementaryGroup => "unix:supplementary_group",
            SelectorKind::Path => "unix:path",
            SelectorKind::Sha256 => "unix:sha256",
            SelectorKind::SystemdUnit => "systemd:unit",
        }
    }

    /// Checks a value of this kind: `Ok` when it is in its canonical form.
    fn check(self, value: &str) -> Result<(), InvalidValue> {
        match self {
            SelectorKind::Uid | SelectorKind::Gid | SelectorKind::SupplementaryGid => {
                check_id(value)
            }
            SelectorKind::User | SelectorKind::Group | SelectorKind::SupplementaryGroup => {
                check_name(value)
            }
            SelectorKind::Path => check_path(value),
            SelectorKind::Sha256 => check_sha256(value),
            SelectorKind::SystemdUnit => {
                check_name(value)?;
                match value.strip_suffix(UNIT_SUFFIX) {
                    Some(stem) if !stem.is_empty() => Ok(()),
                    _ => Err(InvalidValue::NotAService),
                }
            }
        }
    }
}

impl fmt::Display for SelectorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.prefix())
    }
}

/// One selector in canonical form, such as `unix:uid:1001` or `unix:path:/usr/local/bin/billing`.
///
/// Built only through [`FromStr`] or [`Selector::new`] (and [`Selector::id`] for the numeric kinds),
/// which accept the canonical form and nothing else, so two selectors are equal exactly when their
/// texts are. Ordered by kind, then value.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Selector {
    kind: SelectorKind,
    value: String,
}

impl Selector {
    /// The selector of this kind and value, if the value is canonical for the kind.
    pub fn new(kind: SelectorKind, value: &str) -> Result<Selector, SelectorError> {
        kind.check(value)
            .map_err(|reason| SelectorError::InvalidValue {
                kind,
                quoted: cut(value, ECHO_CHARS).into_owned(),
                reason,
            })?;
        Ok(Selector {
            kind,
            value: value.to_owned(),
        })
    }

    /// A numeric selector (`unix:uid`, `unix:gid`, `unix:supplementary_gid`); `None` for any other kind.
    pub fn id(kind: SelectorKind, id: u32) -> Option<Selector> {
        matches!(
            kind,
            SelectorKind::Uid | SelectorKind::Gid | SelectorKind::SupplementaryGid
        )
        .then(|| Selector {
            kind,
            value: id.to_string(),
        })
    }

    /// What it says about a process.
    pub fn kind(&self) -> SelectorKind {
        self.kind
    }

    /// The text after `TYPE:KIND:`.
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind.prefix(), self.value)
    }
}

impl FromStr for Selector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let quoted = || cut(s, ECHO_CHARS).into_owned();
        let mut parts = s.splitn(3, ':');
        let (Some(scheme), Some(kind), Some(value)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(SelectorError::Malformed { quoted: quoted() });
        };
        let prefix = &s[..scheme.len() + 1 + kind.len()];
        let Some(kind) = SelectorKind::ALL.into_iter().find(|k| k.prefix() == prefix) else {
            return Err(SelectorError::UnknownKind {
                quoted: quoted(),
                prefix: cut(prefix, ECHO_CHARS).into_owned(),
            });
        };
        Selector::new(kind, value)
    }
}

impl serde::Serialize for Selector {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Selector {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Why a selector's text was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SelectorError {
    /// Not `TYPE:KIND:VALUE` at all.
    #[error("{quoted:?} is not a selector: expected TYPE:KIND:VALUE, one of {ACCEPTED}")]
    Malformed {
        /// The text, cut to a few dozen characters.
        quoted: String,
    },
    /// `TYPE:KIND` is none of the kinds meshca knows.
    #[error("{quoted:?}: unknown selector kind {prefix:?}; accepted: {ACCEPTED}")]
    UnknownKind {
        /// The text, cut to a few dozen characters.
        quoted: String,
        /// Its `TYPE:KIND` part.
        prefix: String,
    },
    /// The value is not one of its kind.
    #[error("invalid {kind} selector value {quoted:?}: {reason}")]
    InvalidValue {
        /// The kind.
        kind: SelectorKind,
        /// The value, cut to a few dozen characters.
        quoted: String,
        /// What is wrong with it.
        reason: InvalidValue,
    },
}

/// What is wrong with a selector's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidValue {
    /// The value is empty.
    #[error("must not be empty")]
    Empty,
    /// Not a decimal number in 0..=4294967295 written without sign or leading zeros.
    #[error("expected a decimal number from 0 to 4294967295, without sign or leading zeros")]
    NotAnId,
    /// A name longer than [`MAX_SELECTOR_NAME_BYTES`].
    #[error("longer than {MAX_SELECTOR_NAME_BYTES} bytes")]
    NameTooLong,
    /// A name with whitespace or a control character.
    #[error("must not contain whitespace or control characters")]
    BadNameCharacter,
    /// A path that does not start with `/`.
    #[error("must be an absolute path, starting with /")]
    NotAbsolute,
    /// A path longer than [`MAX_SELECTOR_PATH_BYTES`].
    #[error("longer than {MAX_SELECTOR_PATH_BYTES} bytes")]
    PathTooLong,
    /// A path with a NUL byte.
    #[error("must not contain a NUL byte")]
    Nul,
    /// A path the kernel would never report for a binary: `/` alone, a trailing `/`, or an empty, `.`
    /// or `..` component.
    #[error("must be the binary's resolved path: no '//', '.' or '..' components and no trailing '/' (the kernel reports /proc/<pid>/exe resolved)")]
    NotCanonical,
    /// A digest with uppercase hex digits.
    #[error("hex digits must be lowercase")]
    UppercaseHex,
    /// A digest that is not 64 hex digits.
    #[error("expected exactly 64 lowercase hex digits (a SHA-256 digest)")]
    NotSha256,
    /// A unit name that does not name a service.
    #[error("expected a service unit: NAME.service")]
    NotAService,
}

fn check_id(value: &str) -> Result<(), InvalidValue> {
    if value.is_empty() {
        return Err(InvalidValue::Empty);
    }
    match value.parse::<u32>() {
        Ok(n) if n.to_string() == value => Ok(()),
        _ => Err(InvalidValue::NotAnId),
    }
}

fn check_name(value: &str) -> Result<(), InvalidValue> {
    if value.is_empty() {
        return Err(InvalidValue::Empty);
    }
    if value.len() > MAX_SELECTOR_NAME_BYTES {
        return Err(InvalidValue::NameTooLong);
    }
    if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(InvalidValue::BadNameCharacter);
    }
    Ok(())
}

fn check_path(value: &str) -> Result<(), InvalidValue> {
    if value.is_empty() {
        return Err(InvalidValue::Empty);
    }
    if !value.starts_with('/') {
        return Err(InvalidValue::NotAbsolute);
    }
    if value.len() > MAX_SELECTOR_PATH_BYTES {
        return Err(InvalidValue::PathTooLong);
    }
    if value.contains('\0') {
        return Err(InvalidValue::Nul);
    }
    if value
        .split('/')
        .skip(1)
        .any(|c| matches!(c, "" | "." | ".."))
    {
        return Err(InvalidValue::NotCanonical);
    }
    Ok(())
}

fn check_sha256(value: &str) -> Result<(), InvalidValue> {
    if value.is_empty() {
        return Err(InvalidValue::Empty);
    }
    let bytes = value.as_bytes();
    if bytes.len() == 64 && bytes.iter().all(u8::is_ascii_hexdigit) {
        if bytes.iter().any(u8::is_ascii_uppercase) {
            return Err(InvalidValue::UppercaseHex);
        }
        return Ok(());
    }
    Err(InvalidValue::NotSha256)
}

#[cfg(test)]
mod tests;
