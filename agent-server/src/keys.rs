//! Checking an agent's key request: the request proves the agent holds the key (its signature), the
//! key is of the algorithm the daemon issues leaves for, and it asks for no identity other than the one
//! the registration has. What the certificate says is still the CA's decision alone.

use std::fmt;

use meshca_ca::{read_csr, CsrError, PublicKey};
use meshca_control::{ProxyEntry, Registration, Snapshot};
use meshca_identity::KeyAlgorithm;

/// Why a key request was refused.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// Not a request, or its signature does not verify.
    Csr(CsrError),
    /// A key of another algorithm than the daemon's leaves have.
    Algorithm {
        got: KeyAlgorithm,
        want: KeyAlgorithm,
    },
    /// It asks for a SPIFFE ID the registration's identity does not have.
    SpiffeId { asked: String, has: Option<String> },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Csr(error) => error.fmt(f),
            Refusal::Algorithm { got, want } => write!(
                f,
                "the request's key is {}, but this server issues {} leaves (issuance.keyAlgorithm)",
                got.as_str(),
                want.as_str()
            ),
            Refusal::SpiffeId { asked, has: None } => write!(
                f,
                "the request names SPIFFE ID {} while the registration has no identity yet",
                meshca_serve::shown(asked)
            ),
            Refusal::SpiffeId {
                asked,
                has: Some(has),
            } => write!(
                f,
                "the request names SPIFFE ID {}, but the registration's identity is {has}",
                meshca_serve::shown(asked)
            ),
        }
    }
}

/// The key of `csr`, a request for `registration`'s next certificate, if it may be certified.
pub(crate) fn check(
    csr: &[u8],
    registration: &Registration,
    snapshot: &Snapshot,
    want: KeyAlgorithm,
) -> Result<PublicKey, Refusal> {
    let request = read_csr(csr).map_err(Refusal::Csr)?;
    let got = request.public_key.algorithm();
    if got != want {
        return Err(Refusal::Algorithm { got, want });
    }
    let has = match snapshot.proxies.get(&registration.proxy) {
        Some(ProxyEntry::Ready(identity)) => Some(identity.spiffe_id.as_str()),
        _ => None,
    };
    for uri in &request.uri_sans {
        let is_spiffe = uri
            .get(..9)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("spiffe://"));
        if is_spiffe && Some(uri.as_str()) != has {
            return Err(Refusal::SpiffeId {
                asked: uri.clone(),
                has: has.map(str::to_owned),
            });
        }
    }
    Ok(request.public_key)
}

#[cfg(test)]
pub(crate) mod tests;
