//! Validating JWT-SVIDs.
//!
//! Only what a JWT-SVID may be is accepted: a compact JWS whose header holds `alg`, `kid` and `typ` and
//! nothing else, signed with ES256 (the one algorithm meshca signs with; `none`, HMAC and RSA are
//! refused before any key is looked at), by a key of the subject's own trust domain.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use meshca_auth::{quote, split_compact, JwsParts};
use meshca_identity::SpiffeId;
use ring::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_FIXED};
use serde_json::{Map, Value};

use super::{JwtError, JwtPublicKey, CLOCK_SKEW_SECS, MAX_TOKEN_BYTES};

/// The length of an ES256 signature in JOSE form (`r || s`).
const SIGNATURE_LEN: usize = 64;

/// A JWT-SVID that passed [`validate`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ValidatedJwt {
    /// The workload the token names (`sub`).
    pub spiffe_id: SpiffeId,
    /// Every claim of the token, as it was signed.
    pub claims: Map<String, Value>,
}

/// Checks a JWT-SVID and returns its subject and claims.
///
/// `keys(trust_domain, kid)` returns the JWT key `kid` of the trust domain named `trust_domain` (the
/// bare name, e.g. `example.org`), if that trust domain's bundle has one. Accepted is a compact JWS of at
/// most [`MAX_TOKEN_BYTES`] whose header is `alg` = `ES256`, a `kid`, and `typ` absent, `JWT` or `JOSE`,
/// and nothing else; whose `sub` is a SPIFFE ID of a workload (not a root ID); whose signature verifies
/// with the key `kid` of the subject's trust domain (a token signed by another trust domain's key is
/// refused); whose `aud` (a string or an array of strings) contains `audience`; whose `exp` is after
/// `now` (no leeway: a token its issuer calls expired is expired); and whose `iat` and `nbf`, when
/// present, are at most [`CLOCK_SKEW_SECS`] after `now`. A signature with a high `s` is refused for
/// meshca's own keys, which sign only the low form (a high one is a token someone rewrote), and
/// accepted for another issuer's ([`JwtPublicKey::of_another_issuer`]), which may not normalize.
/// Never panics, whatever the input.
pub fn validate(
    token: &str,
    audience: &str,
    keys: &impl Fn(&str, &str) -> Option<JwtPublicKey>,
    now: u64,
) -> Result<ValidatedJwt, JwtError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(JwtError::TokenTooLong {
            len: token.len(),
            max: MAX_TOKEN_BYTES,
        });
    }
    if audience.is_empty() {
        return Err(JwtError::AudienceMissing);
    }
    let parts = split(token)?;
    let kid = check_header(&decode_object(parts.header, "header")?)?;
    let claims = decode_object(parts.payload, "claims")?;
    let spiffe_id = subject(&claims)?;
    let trust_domain = spiffe_id.trust_domain().as_str();
    let key = keys(trust_domain, &kid).ok_or_else(|| JwtError::UnknownKey {
        trust_domain: trust_domain.to_owned(),
        kid: quote(&kid),
    })?;
    let bad_signature = || JwtError::BadSignature {
        trust_domain: trust_domain.to_owned(),
        kid: quote(&kid),
    };
    let signature = decode(parts.signature, "signature")?;
    if signature.len() != SIGNATURE_LEN {
        return Err(bad_signature());
    }
    if !key.accepts_high_s() && !meshca_auth::low_s::is_low_s(&signature) {
        return Err(JwtError::HighS {
            trust_domain: trust_domain.to_owned(),
            kid: quote(&kid),
        });
    }
    UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, key.uncompressed())
        .verify(parts.signing_input.as_bytes(), &signature)
        .map_err(|_| bad_signature())?;
    check_audience(&claims, audience)?;
    let expires_at =
        numeric_date(&claims, "exp")?.ok_or(JwtError::MissingClaim { claim: "exp" })?;
    if expires_at <= now {
        return Err(JwtError::Expired { expires_at, now });
    }
    for claim in ["iat", "nbf"] {
        if let Some(at) = numeric_date(&claims, claim)? {
            if at > now.saturating_add(CLOCK_SKEW_SECS) {
                return Err(JwtError::NotYetValid { claim, at, now });
            }
        }
    }
    Ok(ValidatedJwt { spiffe_id, claims })
}

/// Splits a token into its three segments (see [`meshca_auth::split_compact`]).
fn split(token: &str) -> Result<JwsParts<'_>, JwtError> {
    split_compact(token).ok_or_else(|| JwtError::Malformed {
        reason: "expected a compact JWS: three base64url segments separated by '.'".to_owned(),
    })
}

/// Strict base64url without padding.
fn decode(segment: &str, what: &str) -> Result<Vec<u8>, JwtError> {
    URL_SAFE_NO_PAD
        .decode(segment)
        .map_err(|_| JwtError::Malformed {
            reason: format!("the {what} segment is not base64url without padding"),
        })
}

/// A segment that must hold a JSON object.
fn decode_object(segment: &str, what: &str) -> Result<Map<String, Value>, JwtError> {
    let bytes = decode(segment, what)?;
    // serde_json's message names the position, never more than a short excerpt of the input.
    serde_json::from_slice(&bytes).map_err(|e| JwtError::Malformed {
        reason: format!("the {what} segment is not a JSON object: {e}"),
    })
}

/// Checks the header and returns its `kid`.
fn check_header(header: &Map<String, Value>) -> Result<String, JwtError> {
    match header.get("alg") {
        None => return Err(JwtError::MissingAlgorithm),
        Some(Value::String(alg)) if alg == "ES256" => {}
        Some(Value::String(alg)) => return Err(JwtError::UnsupportedAlgorithm { alg: quote(alg) }),
        Some(other) => {
            return Err(JwtError::UnsupportedAlgorithm {
                alg: quote(&other.to_string()),
            })
        }
    }
    if let Some(field) = header
        .keys()
        .find(|field| !matches!(field.as_str(), "alg" | "kid" | "typ"))
    {
        return Err(JwtError::UnsupportedHeaderField {
            field: quote(field),
        });
    }
    match header.get("typ") {
        None => {}
        Some(Value::String(typ)) if typ == "JWT" || typ == "JOSE" => {}
        Some(Value::String(typ)) => return Err(JwtError::UnsupportedType { typ: quote(typ) }),
        Some(other) => {
            return Err(JwtError::UnsupportedType {
                typ: quote(&other.to_string()),
            })
        }
    }
    match header.get("kid") {
        Some(Value::String(kid)) if !kid.is_empty() => Ok(kid.clone()),
        Some(Value::String(_)) | None => Err(JwtError::MissingKeyId),
        Some(_) => Err(JwtError::Malformed {
            reason: "the header's `kid` is not a string".to_owned(),
        }),
    }
}

/// `sub`: the SPIFFE ID of a workload.
fn subject(claims: &Map<String, Value>) -> Result<SpiffeId, JwtError> {
    let sub = match claims.get("sub") {
        None => return Err(JwtError::MissingClaim { claim: "sub" }),
        Some(Value::String(sub)) => sub,
        Some(_) => {
            return Err(JwtError::InvalidClaim {
                claim: "sub",
                reason: "not a string".to_owned(),
            })
        }
    };
    let id = SpiffeId::parse(sub).map_err(|source| JwtError::InvalidSubject {
        subject: quote(sub),
        source,
    })?;
    if id.is_root() {
        return Err(JwtError::RootSubject {
            subject: quote(sub),
        });
    }
    Ok(id)
}

/// `aud`, a string or a non-empty array of strings, must contain `audience`.
fn check_audience(claims: &Map<String, Value>, audience: &str) -> Result<(), JwtError> {
    let invalid = |reason: &str| JwtError::InvalidClaim {
        claim: "aud",
        reason: reason.to_owned(),
    };
    let found = match claims.get("aud") {
        None => return Err(JwtError::MissingClaim { claim: "aud" }),
        Some(Value::String(aud)) => aud == audience,
        Some(Value::Array(auds)) if auds.is_empty() => return Err(invalid("an empty array")),
        Some(Value::Array(auds)) => {
            let mut found = false;
            for aud in auds {
                match aud {
                    Value::String(aud) => found |= aud == audience,
                    _ => return Err(invalid("an array holding something other than strings")),
                }
            }
            found
        }
        Some(_) => return Err(invalid("neither a string nor an array of strings")),
    };
    if found {
        Ok(())
    } else {
        Err(JwtError::AudienceMismatch {
            audience: quote(audience),
        })
    }
}

/// A NumericDate claim (unix seconds; a fraction is dropped), if present.
fn numeric_date(claims: &Map<String, Value>, claim: &'static str) -> Result<Option<u64>, JwtError> {
    let Some(value) = claims.get(claim) else {
        return Ok(None);
    };
    let invalid = || JwtError::InvalidClaim {
        claim,
        reason: "not a non-negative number of seconds since the Unix epoch".to_owned(),
    };
    let Value::Number(number) = value else {
        return Err(invalid());
    };
    if let Some(seconds) = number.as_u64() {
        return Ok(Some(seconds));
    }
    match number.as_f64() {
        // `as` saturates: a date beyond u64 seconds is the end of time, which compares correctly.
        Some(seconds) if seconds.is_finite() && seconds >= 0.0 => Ok(Some(seconds as u64)),
        _ => Err(invalid()),
    }
}
