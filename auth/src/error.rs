//! The one error type of this crate.

/// Why one claim value or label part is refused: the sentence an [`AuthError`] then carries as its
/// `reason`, with the field or label it belongs to.
#[derive(Debug)]
pub(crate) struct Refusal(pub(crate) String);

/// Why a token could not be minted, parsed or accepted.
///
/// Messages never contain the token itself (it is a bearer credential); they may quote short, escaped claim
/// values so an operator can see which field to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// The token is not a well-formed compact JWT of this daemon (wrong shape, bad base64, bad JSON, bad header).
    #[error("malformed token: {reason}")]
    Malformed {
        /// What is wrong with it.
        reason: String,
    },
    /// The token's header names an algorithm other than ES256 (for example `none` or `HS256`).
    #[error("token algorithm {alg} is not accepted: meshca tokens are signed with ES256 only")]
    UnsupportedAlgorithm {
        /// The algorithm from the token header, escaped and truncated.
        alg: String,
    },
    /// The signature does not match this daemon's token key (tampered token, or minted with another key).
    #[error("token signature does not verify with this daemon's token key; mint a new token with `meshca token`")]
    BadSignature,
    /// The token's `exp` (plus the clock-skew leeway) is not after the current time.
    #[error(
        "token expired at unix time {expires_at} (now {now}); mint a new token with `meshca token`"
    )]
    Expired {
        /// The token's `exp`, unix seconds.
        expires_at: u64,
        /// The verifier's clock, unix seconds.
        now: u64,
    },
    /// The token's `iat` lies further in the future than the clock-skew leeway allows.
    #[error("token issued at unix time {issued_at}, which is in the future (now {now}); check the clocks of the minting and the verifying host")]
    NotYetValid {
        /// The token's `iat`, unix seconds.
        issued_at: u64,
        /// The verifier's clock, unix seconds.
        now: u64,
    },
    /// The token's `nbf` lies further in the future than the clock-skew leeway allows.
    #[error("token is not valid before unix time {not_before} (now {now}); wait until then, or check the clocks of the minting and the verifying host")]
    NotBefore {
        /// The token's `nbf`, unix seconds.
        not_before: u64,
        /// The verifier's clock, unix seconds.
        now: u64,
    },
    /// The signature's `s` is in the upper half of the group order: a valid signature, but not the one
    /// meshca mints (ECDSA signatures are malleable: `(r, n - s)` verifies as well as `(r, s)`).
    #[error("token signature is not in canonical low-S form (s > n/2); meshca never mints such a signature, so the token was altered")]
    HighS,
    /// The token's id is on the revocation list.
    #[error("token {id} has been revoked")]
    Revoked {
        /// The revoked token id (`jti`).
        id: String,
    },
    /// The token's `iss` is not `meshca`.
    #[error("token issuer {issuer} is not accepted: expected \"meshca\"")]
    WrongIssuer {
        /// The issuer from the token, escaped and truncated.
        issuer: String,
    },
    /// A claim is missing a required value or holds one that is not allowed.
    #[error("token claim `{field}` is invalid: {reason}")]
    InvalidClaim {
        /// The JSON claim name (`mesh`, `name`, `labels`, ...).
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A proxy type string is neither `dataplane` nor `zone-egress`.
    #[error("unknown proxy type {value}: expected \"dataplane\" or \"zone-egress\"")]
    UnknownProxyType {
        /// The rejected value, escaped and truncated.
        value: String,
    },
    /// A `--label`/`--tag` argument is not a valid `KEY=VALUE` pair.
    #[error("invalid label {input}: {reason}")]
    InvalidLabel {
        /// The rejected argument, escaped and truncated.
        input: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A line of the revocation list is not a token id.
    #[error("revocation list line {line}: {reason}")]
    InvalidRevocationList {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The token signing key could not be generated, loaded or used.
    #[error("token signing key: {reason}")]
    Key {
        /// What failed.
        reason: String,
    },
}

/// Quotes untrusted text for an error message: escaped (no control characters reach a log line) and at most
/// 64 characters long. Public so that other token code in meshca quotes the same way.
pub fn quote(text: &str) -> String {
    const MAX: usize = 64;
    if text.chars().count() > MAX {
        let head: String = text.chars().take(MAX).collect();
        format!("{head:?}...")
    } else {
        format!("{text:?}")
    }
}
