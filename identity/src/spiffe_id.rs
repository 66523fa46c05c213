//! SPIFFE IDs and trust domains, checked against every rule of the SPIFFE-ID standard.

use std::fmt;
use std::str::FromStr;

/// The scheme prefix every SPIFFE ID starts with.
const PREFIX: &str = "spiffe://";
/// The longest trust domain the standard allows, in bytes.
pub const MAX_TRUST_DOMAIN_LEN: usize = 255;
/// The longest SPIFFE ID the standard allows, in bytes.
pub const MAX_ID_LEN: usize = 2048;

/// Why a string is not a valid SPIFFE ID or trust domain. Each variant names the rule that failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpiffeIdError {
    /// The input was empty.
    #[error("a SPIFFE ID must not be empty")]
    Empty,
    /// The input does not start with `spiffe://` (the scheme must be lowercase).
    #[error("a SPIFFE ID must start with the scheme \"spiffe://\" (lowercase)")]
    WrongScheme,
    /// Nothing between `spiffe://` and the path.
    #[error("the trust domain is missing")]
    MissingTrustDomain,
    /// The trust domain is longer than 255 bytes.
    #[error("the trust domain is {len} bytes long; at most 255 are allowed")]
    TrustDomainTooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The trust domain holds an uppercase letter (trust domains are lowercase only).
    #[error("the trust domain contains the uppercase letter {ch:?} at byte {offset}; trust domains are lowercase")]
    UppercaseTrustDomain {
        /// The character.
        ch: char,
        /// Its byte offset in the input.
        offset: usize,
    },
    /// The trust domain carries a port (`:`).
    #[error("a SPIFFE ID must not carry a port (':' at byte {offset})")]
    Port {
        /// The byte offset of the colon.
        offset: usize,
    },
    /// The trust domain carries user info (`@`).
    #[error("a SPIFFE ID must not carry user info ('@' at byte {offset})")]
    Userinfo {
        /// The byte offset of the `@`.
        offset: usize,
    },
    /// A character outside `[a-z0-9.-_]` in the trust domain.
    #[error("the trust domain contains {ch:?} at byte {offset}; only a-z, 0-9, '.', '-' and '_' are allowed")]
    TrustDomainChar {
        /// The character.
        ch: char,
        /// Its byte offset in the input.
        offset: usize,
    },
    /// A query part (`?`).
    #[error("a SPIFFE ID must not have a query ('?' at byte {offset})")]
    Query {
        /// The byte offset of the `?`.
        offset: usize,
    },
    /// A fragment part (`#`).
    #[error("a SPIFFE ID must not have a fragment ('#' at byte {offset})")]
    Fragment {
        /// The byte offset of the `#`.
        offset: usize,
    },
    /// Percent-encoding (`%`).
    #[error("a SPIFFE ID must not use percent-encoding ('%' at byte {offset})")]
    PercentEncoding {
        /// The byte offset of the `%`.
        offset: usize,
    },
    /// A character outside `[a-zA-Z0-9.-_]` in a path segment.
    #[error("the path contains {ch:?} at byte {offset}; segments may only hold a-z, A-Z, 0-9, '.', '-' and '_'")]
    PathChar {
        /// The character.
        ch: char,
        /// Its byte offset in the input.
        offset: usize,
    },
    /// An empty path segment (`//`).
    #[error("the path has an empty segment (\"//\" at byte {offset})")]
    EmptySegment {
        /// The byte offset of the segment's slash.
        offset: usize,
    },
    /// A `.` or `..` path segment.
    #[error("the path has a {segment:?} segment at byte {offset}; '.' and '..' are not allowed")]
    DotSegment {
        /// The segment (`.` or `..`).
        segment: String,
        /// The byte offset of the segment's slash.
        offset: usize,
    },
    /// The path ends with `/`.
    #[error("the path must not end with '/'")]
    TrailingSlash,
    /// A path given on its own does not start with `/`.
    #[error("a non-empty path must start with '/'")]
    PathWithoutSlash,
    /// The whole ID is longer than 2048 bytes.
    #[error("the SPIFFE ID is {len} bytes long; at most 2048 are allowed")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
}

/// A SPIFFE trust domain name such as `default.zone-1.mesh.local`, valid by construction.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TrustDomain(String);

impl TrustDomain {
    /// Parses a bare trust domain name (no scheme).
    pub fn parse(name: &str) -> Result<Self, SpiffeIdError> {
        check_trust_domain(name, 0)?;
        Ok(TrustDomain(name.to_owned()))
    }

    /// The trust domain name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The trust domain's own SPIFFE ID, `spiffe://<name>`.
    pub fn id(&self) -> String {
        format!("{PREFIX}{}", self.0)
    }
}

impl fmt::Display for TrustDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for TrustDomain {
    type Err = SpiffeIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TrustDomain::parse(s)
    }
}

impl TryFrom<&str> for TrustDomain {
    type Error = SpiffeIdError;

    fn try_from(s: &str) -> Result<Self, Self::Error> {
        TrustDomain::parse(s)
    }
}

/// A SPIFFE ID (`spiffe://<trust domain><path>`), valid by construction.
///
/// The root form `spiffe://<trust domain>` (empty path) parses too; see [`SpiffeId::is_root`].
/// Certificates for workloads need a non-root ID.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SpiffeId {
    full: String,
    trust_domain: TrustDomain,
}

impl SpiffeId {
    /// Parses a full SPIFFE ID, e.g. `spiffe://example.org/ns/default/sa/web`.
    pub fn parse(id: &str) -> Result<Self, SpiffeIdError> {
        if id.is_empty() {
            return Err(SpiffeIdError::Empty);
        }
        let rest = id.strip_prefix(PREFIX).ok_or(SpiffeIdError::WrongScheme)?;
        let td_end = rest.find('/').unwrap_or(rest.len());
        let (td, path) = rest.split_at(td_end);
        check_trust_domain(td, PREFIX.len())?;
        check_path(path, PREFIX.len() + td_end)?;
        if id.len() > MAX_ID_LEN {
            return Err(SpiffeIdError::TooLong { len: id.len() });
        }
        Ok(SpiffeId {
            full: id.to_owned(),
            trust_domain: TrustDomain(td.to_owned()),
        })
    }

    /// Builds an ID from a trust domain and a path (`""` for the root ID, else starting with `/`).
    pub fn new(trust_domain: &TrustDomain, path: &str) -> Result<Self, SpiffeIdError> {
        if !path.is_empty() && !path.starts_with('/') {
            return Err(SpiffeIdError::PathWithoutSlash);
        }
        let offset = PREFIX.len() + trust_domain.0.len();
        check_path(path, offset)?;
        let full = format!("{PREFIX}{}{path}", trust_domain.0);
        if full.len() > MAX_ID_LEN {
            return Err(SpiffeIdError::TooLong { len: full.len() });
        }
        Ok(SpiffeId {
            full,
            trust_domain: trust_domain.clone(),
        })
    }

    /// The whole ID as a string.
    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// The trust domain the ID belongs to.
    pub fn trust_domain(&self) -> &TrustDomain {
        &self.trust_domain
    }

    /// The path, `""` for the root ID, else starting with `/`.
    pub fn path(&self) -> &str {
        &self.full[PREFIX.len() + self.trust_domain.0.len()..]
    }

    /// Whether this is the trust domain's root ID (no path), which no workload may hold.
    pub fn is_root(&self) -> bool {
        self.path().is_empty()
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

impl FromStr for SpiffeId {
    type Err = SpiffeIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SpiffeId::parse(s)
    }
}

impl TryFrom<&str> for SpiffeId {
    type Error = SpiffeIdError;

    fn try_from(s: &str) -> Result<Self, Self::Error> {
        SpiffeId::parse(s)
    }
}

impl serde::Serialize for SpiffeId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.full)
    }
}

impl serde::Serialize for TrustDomain {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

/// Checks a trust domain name; `base` is its byte offset in the input, for error messages.
fn check_trust_domain(td: &str, base: usize) -> Result<(), SpiffeIdError> {
    if td.is_empty() {
        return Err(SpiffeIdError::MissingTrustDomain);
    }
    for (i, ch) in td.char_indices() {
        let offset = base + i;
        match ch {
            'a'..='z' | '0'..='9' | '.' | '-' | '_' => {}
            'A'..='Z' => return Err(SpiffeIdError::UppercaseTrustDomain { ch, offset }),
            ':' => return Err(SpiffeIdError::Port { offset }),
            '@' => return Err(SpiffeIdError::Userinfo { offset }),
            '?' => return Err(SpiffeIdError::Query { offset }),
            '#' => return Err(SpiffeIdError::Fragment { offset }),
            '%' => return Err(SpiffeIdError::PercentEncoding { offset }),
            _ => return Err(SpiffeIdError::TrustDomainChar { ch, offset }),
        }
    }
    if td.len() > MAX_TRUST_DOMAIN_LEN {
        return Err(SpiffeIdError::TrustDomainTooLong { len: td.len() });
    }
    Ok(())
}

/// Checks a path (`""` or `/seg/seg`); `base` is its byte offset in the input.
fn check_path(path: &str, base: usize) -> Result<(), SpiffeIdError> {
    for (i, ch) in path.char_indices() {
        let offset = base + i;
        match ch {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '-' | '_' | '/' => {}
            '?' => return Err(SpiffeIdError::Query { offset }),
            '#' => return Err(SpiffeIdError::Fragment { offset }),
            '%' => return Err(SpiffeIdError::PercentEncoding { offset }),
            _ => return Err(SpiffeIdError::PathChar { ch, offset }),
        }
    }
    if path.is_empty() {
        return Ok(());
    }
    if path.ends_with('/') {
        return Err(SpiffeIdError::TrailingSlash);
    }
    // The path starts with '/', so the first split item is empty and skipped.
    let mut offset = base;
    for segment in path.split('/').skip(1) {
        match segment {
            "" => return Err(SpiffeIdError::EmptySegment { offset }),
            "." | ".." => {
                return Err(SpiffeIdError::DotSegment {
                    segment: segment.to_owned(),
                    offset,
                })
            }
            _ => {}
        }
        offset += segment.len() + 1;
    }
    Ok(())
}

#[cfg(test)]
#[path = "spiffe_id_tests.rs"]
mod tests;
