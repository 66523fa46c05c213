//! The one error type of the JWT-SVID code.

use meshca_identity::SpiffeIdError;

/// Why a JWT-SVID could not be minted or validated, a JWK Set not read, or a request's audiences not
/// accepted. The Workload API answers every one of them with `INVALID_ARGUMENT`.
///
/// Messages never contain a token (it is a bearer credential); they quote short, escaped values from
/// it so that the caller can see which field is wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JwtError {
    /// The token is longer than [`super::MAX_TOKEN_BYTES`].
    #[error("JWT-SVID is {len} bytes long; at most {max} are accepted")]
    TokenTooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The token is not a compact JWS with well-formed JSON header and claims.
    #[error("malformed JWT-SVID: {reason}")]
    Malformed {
        /// What is wrong with it.
        reason: String,
    },
    /// The header's `alg` is not ES256 (for example `none`, `HS256` or `RS256`).
    #[error("JWT-SVID header `alg` {alg} is not accepted: meshca validates ES256 only")]
    UnsupportedAlgorithm {
        /// The algorithm from the header, escaped and truncated (`null` when it is not a string).
        alg: String,
    },
    /// The header has no `alg`.
    #[error("JWT-SVID header has no `alg`")]
    MissingAlgorithm,
    /// The header has no `kid`, so no key of the trust domain can be chosen.
    #[error("JWT-SVID header has no `kid` (key id): the signing key cannot be chosen")]
    MissingKeyId,
    /// The header has a field other than `alg`, `kid` and `typ`, which a JWT-SVID must not have.
    #[error("JWT-SVID header field {field} is not allowed: a JWT-SVID header holds only `alg`, `kid` and `typ`")]
    UnsupportedHeaderField {
        /// The field name, escaped and truncated.
        field: String,
    },
    /// The header's `typ` is neither `JWT` nor `JOSE`.
    #[error("JWT-SVID header `typ` {typ} is not accepted: expected \"JWT\", \"JOSE\" or none")]
    UnsupportedType {
        /// The type from the header, escaped and truncated.
        typ: String,
    },
    /// A required claim is absent.
    #[error("JWT-SVID claim `{claim}` is missing")]
    MissingClaim {
        /// The claim name.
        claim: &'static str,
    },
    /// A claim holds a value of the wrong kind.
    #[error("JWT-SVID claim `{claim}` is invalid: {reason}")]
    InvalidClaim {
        /// The claim name.
        claim: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// `sub` (or the SPIFFE ID to mint for) is not a valid SPIFFE ID.
    #[error("JWT-SVID subject {subject} is not a SPIFFE ID: {source}")]
    InvalidSubject {
        /// The subject, escaped and truncated.
        subject: String,
        /// The rule it breaks.
        source: SpiffeIdError,
    },
    /// The subject is a trust domain's root ID, which no workload holds.
    #[error("JWT-SVID subject {subject} is a trust domain's root ID; a JWT-SVID names a workload (spiffe://<trust domain>/<path>)")]
    RootSubject {
        /// The subject, escaped.
        subject: String,
    },
    /// No key with the token's `kid` is in the bundle of the subject's trust domain.
    #[error("no JWT key {kid} in the bundle of trust domain {trust_domain}: the token was signed by a key this host does not trust for that trust domain")]
    UnknownKey {
        /// The subject's trust domain.
        trust_domain: String,
        /// The `kid`, escaped and truncated.
        kid: String,
    },
    /// The signature does not verify with the key the `kid` names (tampered token, or forged).
    #[error("JWT-SVID signature does not verify with key {kid} of trust domain {trust_domain}")]
    BadSignature {
        /// The subject's trust domain.
        trust_domain: String,
        /// The `kid`, escaped and truncated.
        kid: String,
    },
    /// The signature is in its high-`s` form under a key of meshca's, which signs only the low
    /// form: the token was rewritten (an ECDSA signature `(r, s)` is as valid as `(r, n - s)`).
    #[error(
        "JWT-SVID signature under key {kid} of trust domain {trust_domain} is not in its canonical \
         low-S form, the only one meshca signs: the token was rewritten"
    )]
    HighS {
        /// The subject's trust domain.
        trust_domain: String,
        /// The `kid`, escaped and truncated.
        kid: String,
    },
    /// `aud` does not contain the audience the validator asked for.
    #[error("JWT-SVID audience does not contain {audience}")]
    AudienceMismatch {
        /// The expected audience, escaped and truncated.
        audience: String,
    },
    /// `exp` is not after the current time.
    #[error("JWT-SVID expired at unix time {expires_at} (now {now}); fetch a new one")]
    Expired {
        /// The token's `exp`, unix seconds.
        expires_at: u64,
        /// The validator's clock, unix seconds.
        now: u64,
    },
    /// `iat` or `nbf` lies further in the future than [`super::CLOCK_SKEW_SECS`].
    #[error("JWT-SVID claim `{claim}` is unix time {at}, in the future (now {now}); check the clocks of the issuing and the validating host")]
    NotYetValid {
        /// `iat` or `nbf`.
        claim: &'static str,
        /// Its value, unix seconds.
        at: u64,
        /// The validator's clock, unix seconds.
        now: u64,
    },
    /// A JWT-SVID was to be minted with `exp` not after `iat`.
    #[error("a JWT-SVID cannot expire (unix time {expires_at}) before it is issued (unix time {issued_at})")]
    InvalidLifetime {
        /// The asked `iat`.
        issued_at: u64,
        /// The asked `exp`.
        expires_at: u64,
    },
    /// No audience was given (a request, or a validation).
    #[error("audience must be specified")]
    AudienceMissing,
    /// One of the audiences is the empty string.
    #[error("audience {index} is empty")]
    EmptyAudience {
        /// Its 0-based position in the request.
        index: usize,
    },
    /// More audiences than allowed (`limits.jwtAudiencesPerRequest`).
    #[error(
        "{count} audiences asked for; at most {max} are allowed (limits.jwtAudiencesPerRequest)"
    )]
    TooManyAudiences {
        /// How many were given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// An audience longer than allowed (`limits.jwtAudienceBytes`).
    #[error(
        "audience {index} is {len} bytes long; at most {max} are allowed (limits.jwtAudienceBytes)"
    )]
    AudienceTooLong {
        /// Its 0-based position in the request.
        index: usize,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A JWK Set could not be read.
    #[error("JWT bundle (JWK Set): {reason}")]
    Jwks {
        /// What is wrong with it.
        reason: String,
    },
    /// A JWT signing key could not be generated, loaded or used.
    #[error("JWT-SVID signing key: {reason}")]
    Key {
        /// What failed.
        reason: String,
    },
}
