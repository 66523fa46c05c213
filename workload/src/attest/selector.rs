//! Selectors: what attestation says about a caller, in the text forms SPIRE's unix and systemd
//! attestors use, so that an operator's registration reads the same in both.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

/// The longest binary path a `unix:path` selector holds, in bytes (Linux's `PATH_MAX`).
pub const MAX_PATH_LEN: usize = 4096;
/// The longest user or group name a selector holds, in bytes.
pub const MAX_NAME_LEN: usize = 256;
/// The longest systemd unit name a selector holds, in bytes (systemd's own limit).
pub const MAX_UNIT_LEN: usize = 255;

/// One fact about a caller, such as `unix:uid:1001` or `systemd:unit:billing.service`.
///
/// Built only by [`parse_selector`] (or [`str::parse`]) and by attestation, so a `Selector` always
/// holds a valid value; [`Display`](fmt::Display) writes its canonical text, which parses back to
/// the same selector, and `Debug` writes that text quoted.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Selector(Kind);

impl fmt::Debug for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_string(), f)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Kind {
    Uid(u32),
    User(String),
    Gid(u32),
    Group(String),
    SupplementaryGid(u32),
    SupplementaryGroup(String),
    Path(String),
    Sha256([u8; 32]),
    SystemdUnit(String),
}

/// Every selector type, with the prefix its text form starts with.
const TYPES: [(&str, KindOf); 9] = [
    ("unix:uid:", KindOf::Uid),
    ("unix:user:", KindOf::User),
    ("unix:gid:", KindOf::Gid),
    ("unix:group:", KindOf::Group),
    ("unix:supplementary_gid:", KindOf::SupplementaryGid),
    ("unix:supplementary_group:", KindOf::SupplementaryGroup),
    ("unix:path:", KindOf::Path),
    ("unix:sha256:", KindOf::Sha256),
    ("systemd:unit:", KindOf::SystemdUnit),
];

#[derive(Debug, Clone, Copy)]
enum KindOf {
    Uid,
    User,
    Gid,
    Group,
    SupplementaryGid,
    SupplementaryGroup,
    Path,
    Sha256,
    SystemdUnit,
}

/// Why a selector's text was refused; every message quotes the selector and says what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SelectorError {
    /// The text starts with no known selector type.
    #[error(
        "selector {selector:?} has an unknown type: expected unix:uid:, unix:user:, unix:gid:, \
         unix:group:, unix:supplementary_gid:, unix:supplementary_group:, unix:path:, unix:sha256: \
         or systemd:unit: followed by a value"
    )]
    UnknownType {
        /// The selector as written.
        selector: String,
    },
    /// A uid or gid that is not a plain decimal number.
    #[error(
        "selector {selector:?}: the id must be a decimal number from 0 to 4294967295, without \
         sign, spaces or leading zeros"
    )]
    Id {
        /// The selector as written.
        selector: String,
    },
    /// A user or group name that no system name can equal.
    #[error(
        "selector {selector:?}: a user or group name must be 1 to {MAX_NAME_LEN} bytes, without \
         ':', control characters or surrounding spaces"
    )]
    Name {
        /// The selector as written.
        selector: String,
    },
    /// A binary path that the kernel never reports.
    #[error("selector {selector:?}: the binary path {problem}")]
    Path {
        /// The selector as written.
        selector: String,
        /// What is wrong with the path.
        problem: &'static str,
    },
    /// A SHA-256 digest that is not 64 hexadecimal digits.
    #[error("selector {selector:?}: a SHA-256 digest must be exactly 64 hexadecimal digits")]
    Sha256 {
        /// The selector as written.
        selector: String,
    },
    /// A systemd unit that is not a service name.
    #[error(
        "selector {selector:?}: the unit must be a service, NAME.service, at most {MAX_UNIT_LEN} \
         bytes of letters, digits and ':-_.\\@'"
    )]
    Unit {
        /// The selector as written.
        selector: String,
    },
}

/// Parses an operator's selector and returns it in canonical form: one of `unix:uid:N`,
/// `unix:user:NAME`, `unix:gid:N`, `unix:group:NAME`, `unix:supplementary_gid:N`,
/// `unix:supplementary_group:NAME`, `unix:path:/abs/binary`, `unix:sha256:HEX` and
/// `systemd:unit:NAME.service`.
///
/// Names and paths are kept exactly as written. A SHA-256 digest may be written in either case
/// and is canonically lowercase. A path must be absolute and canonical (no empty, `.` or `..`
/// component, no trailing `/`), because the kernel reports a binary by such a path and any other
/// spelling would never match.
pub fn parse_selector(text: &str) -> Result<Selector, SelectorError> {
    let Some((value, kind)) = TYPES
        .iter()
        .find_map(|(prefix, kind)| Some((text.strip_prefix(prefix)?, *kind)))
    else {
        return Err(SelectorError::UnknownType {
            selector: text.to_owned(),
        });
    };
    let selector = || text.to_owned();
    let id = |value| {
        parse_id(value).ok_or_else(|| SelectorError::Id {
            selector: selector(),
        })
    };
    let name = |value: &str| match name_is_valid(value) {
        true => Ok(value.to_owned()),
        false => Err(SelectorError::Name {
            selector: selector(),
        }),
    };
    let kind = match kind {
        KindOf::Uid => Kind::Uid(id(value)?),
        KindOf::Gid => Kind::Gid(id(value)?),
        KindOf::SupplementaryGid => Kind::SupplementaryGid(id(value)?),
        KindOf::User => Kind::User(name(value)?),
        KindOf::Group => Kind::Group(name(value)?),
        KindOf::SupplementaryGroup => Kind::SupplementaryGroup(name(value)?),
        KindOf::Path => match path_problem(value) {
            None => Kind::Path(value.to_owned()),
            Some(problem) => {
                return Err(SelectorError::Path {
                    selector: selector(),
                    problem,
                })
            }
        },
        KindOf::Sha256 => Kind::Sha256(parse_hex(value).ok_or_else(|| SelectorError::Sha256 {
            selector: selector(),
        })?),
        KindOf::SystemdUnit => match unit_is_valid(value) {
            true => Kind::SystemdUnit(value.to_owned()),
            false => {
                return Err(SelectorError::Unit {
                    selector: selector(),
                })
            }
        },
    };
    Ok(Selector(kind))
}

impl FromStr for Selector {
    type Err = SelectorError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        parse_selector(text)
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::Uid(id) => write!(f, "unix:uid:{id}"),
            Kind::User(name) => write!(f, "unix:user:{name}"),
            Kind::Gid(id) => write!(f, "unix:gid:{id}"),
            Kind::Group(name) => write!(f, "unix:group:{name}"),
            Kind::SupplementaryGid(id) => write!(f, "unix:supplementary_gid:{id}"),
            Kind::SupplementaryGroup(name) => write!(f, "unix:supplementary_group:{name}"),
            Kind::Path(path) => write!(f, "unix:path:{path}"),
            Kind::Sha256(digest) => {
                f.write_str("unix:sha256:")?;
                digest.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
            }
            Kind::SystemdUnit(unit) => write!(f, "systemd:unit:{unit}"),
        }
    }
}

/// Constructors for attestation, which reads the values from `/proc` and the user database:
/// each checks its value as [`parse_selector`] would and answers `None` for one it would refuse.
impl Selector {
    pub(crate) fn uid(id: u32) -> Self {
        Self(Kind::Uid(id))
    }

    pub(crate) fn gid(id: u32) -> Self {
        Self(Kind::Gid(id))
    }

    pub(crate) fn supplementary_gid(id: u32) -> Self {
        Self(Kind::SupplementaryGid(id))
    }

    pub(crate) fn user(name: &str) -> Option<Self> {
        name_is_valid(name).then(|| Self(Kind::User(name.to_owned())))
    }

    pub(crate) fn group(name: &str) -> Option<Self> {
        name_is_valid(name).then(|| Self(Kind::Group(name.to_owned())))
    }

    pub(crate) fn supplementary_group(name: &str) -> Option<Self> {
        name_is_valid(name).then(|| Self(Kind::SupplementaryGroup(name.to_owned())))
    }

    pub(crate) fn path(path: &str) -> Option<Self> {
        path_problem(path)
            .is_none()
            .then(|| Self(Kind::Path(path.to_owned())))
    }

    pub(crate) fn sha256(digest: [u8; 32]) -> Self {
        Self(Kind::Sha256(digest))
    }

    pub(crate) fn systemd_unit(unit: &str) -> Option<Self> {
        unit_is_valid(unit).then(|| Self(Kind::SystemdUnit(unit.to_owned())))
    }
}

/// A caller's selectors, as a sorted set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selectors(BTreeSet<Selector>);

impl Selectors {
    /// Whether every selector of `wanted` is in the set: a registration matches a caller when
    /// all of its selectors are the caller's. An empty `wanted` matches every caller, so a
    /// registration must be refused without selectors where it is read.
    pub fn contains_all(&self, wanted: &[Selector]) -> bool {
        wanted.iter().all(|selector| self.0.contains(selector))
    }

    /// Whether the set holds `selector`.
    pub fn contains(&self, selector: &Selector) -> bool {
        self.0.contains(selector)
    }

    /// The selectors, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Selector> {
        self.0.iter()
    }

    /// How many selectors the set holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn insert(&mut self, selector: Selector) {
        self.0.insert(selector);
    }
}

impl FromIterator<Selector> for Selectors {
    fn from_iter<I: IntoIterator<Item = Selector>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl<'a> IntoIterator for &'a Selectors {
    type Item = &'a Selector;
    type IntoIter = std::collections::btree_set::Iter<'a, Selector>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

fn parse_id(text: &str) -> Option<u32> {
    if text.len() > 1 && text.starts_with('0') {
        return None;
    }
    super::parse::decimal_u32(text)
}

fn name_is_valid(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.trim() == name
        && !name.chars().any(|c| c == ':' || c.is_control())
}

fn path_problem(path: &str) -> Option<&'static str> {
    if !path.starts_with('/') {
        return Some("must be absolute");
    }
    if path == "/" {
        return Some("names the root directory");
    }
    if path.len() > MAX_PATH_LEN {
        return Some("is longer than 4096 bytes");
    }
    if path.chars().any(char::is_control) {
        return Some("must not hold control characters");
    }
    if path.len() > 1 && path.ends_with('/') {
        return Some("names a directory (ends with '/')");
    }
    let components = path.split('/').skip(1);
    if components.clone().any(|c| matches!(c, "" | "." | "..")) {
        return Some(
            "must be canonical: no '//', '.' or '..' (the kernel reports the resolved path)",
        );
    }
    None
}

fn parse_hex(text: &str) -> Option<[u8; 32]> {
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut digest = [0u8; 32];
    for (byte, pair) in digest.iter_mut().zip(bytes.chunks_exact(2)) {
        let high = char::from(pair[0]).to_digit(16)?;
        let low = char::from(pair[1]).to_digit(16)?;
        *byte = u8::try_from(high * 16 + low).ok()?;
    }
    Some(digest)
}

fn unit_is_valid(unit: &str) -> bool {
    let Some(stem) = unit.strip_suffix(".service") else {
        return false;
    };
    !stem.is_empty()
        && unit.len() <= MAX_UNIT_LEN
        && unit
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b":-_.\\@".contains(&b))
}

#[cfg(test)]
#[path = "selector_tests.rs"]
mod tests;
