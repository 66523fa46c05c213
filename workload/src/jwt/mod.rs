//! JWT-SVIDs: short-lived ES256 tokens that name a workload by its SPIFFE ID, for an audience.
//!
//! The pure core, with no I/O: [`JwtSigningKey`] signs ([`mint`]), [`JwksDocument`] is a trust domain's
//! JWT bundle as a JWK Set, [`validate`] checks a token against the bundles, [`JwtSvidCache`] keeps signed
//! tokens for reuse, and [`check_audiences`] bounds a request. Only ES256 is signed or accepted, every
//! key and token header carries a `kid` (the RFC 7638 thumbprint of the key, for keys meshca makes), and
//! every failure is a [`JwtError`] that names what is wrong.

mod audience;
mod cache;
mod error;
mod jwks;
mod key;
mod mint;
mod validate;

pub use audience::check_audiences;
pub use cache::{CacheLimits, JwtSvidCache, TokenShape};
pub use error::JwtError;
pub use jwks::{JwksDocument, MAX_JWKS_BYTES};
pub use key::{thumbprint, JwtPublicKey, JwtSigningKey};
pub use mint::mint;
pub use validate::{validate, ValidatedJwt};

/// The longest JWT-SVID accepted, in bytes; longer input is refused before any decoding. A meshca
/// token with the most audiences a request may ask for (`limits.jwtAudiencesPerRequest` of
/// `limits.jwtAudienceBytes` each, at their defaults) is larger than this: such requests fail to mint
/// rather than produce a token no validator takes. 16 KiB is what HTTP servers commonly accept in one
/// header line, where these tokens travel.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// How far in the future a token's `iat` or `nbf` may lie, for clocks that differ between the issuing
/// and the validating host. `exp` gets no leeway.
pub const CLOCK_SKEW_SECS: u64 = 30;

#[cfg(test)]
mod tests;
