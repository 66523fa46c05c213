//! Proxy tokens for meshca: ES256-signed JWTs that name a proxy's mesh, name, type, labels and inbound tags.
//!
//! `meshca token` mints them with a [`SigningKey`]; the SDS server checks the `authorization: Bearer` header
//! of every stream with a [`Verifier`] and an optional [`RevocationList`]. The JWT encoding is written here by
//! hand (one header, one algorithm) so that nothing but ES256 can ever be accepted.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod claims;
mod error;
mod es256;
mod jwt;
mod label;
pub mod low_s;
mod revocation;
mod signing;
mod verify;

pub use claims::{Claims, Labels, ProxyType, ISSUER};
pub use error::{quote, AuthError};
pub use es256::Es256Key;
pub use jwt::{split_compact, JwsParts};
pub use label::parse_label;
pub use meshca_identity::LabelMap;
pub use revocation::RevocationList;
pub use signing::SigningKey;
pub use verify::{Verifier, CLOCK_SKEW_LEEWAY_SECS, MAX_TOKEN_LEN};
