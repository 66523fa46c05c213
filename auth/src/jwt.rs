//! The compact JWS encoding of a token: `base64url(header) . base64url(claims) . base64url(signature)`.
//!
//! There is exactly one header meshca writes and accepts, so header handling is a byte comparison, not a
//! negotiation: no `alg` choice, no `kid`/`jku`/`crit` lookups an attacker could steer.

use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::claims::{Claims, ProxyType, ISSUER};
use crate::error::{quote, AuthError};
use meshca_identity::LabelMap;

/// The only header: ES256, JWT.
pub(crate) const HEADER_JSON: &str = r#"{"alg":"ES256","typ":"JWT"}"#;

/// The JSON claim set as it travels.
#[derive(Serialize, Deserialize)]
pub(crate) struct WireClaims {
    iss: String,
    sub: String,
    /// Absent from an agent's token.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    mesh: String,
    name: String,
    #[serde(rename = "type")]
    proxy_type: ProxyType,
    #[serde(default)]
    labels: LabelMap,
    #[serde(default)]
    tags: LabelMap,
    iat: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nbf: Option<u64>,
    exp: u64,
    jti: String,
}

impl WireClaims {
    pub(crate) fn from_claims(claims: &Claims) -> WireClaims {
        WireClaims {
            iss: ISSUER.to_owned(),
            sub: claims.subject(),
            mesh: claims.mesh.clone(),
            name: claims.name.clone(),
            proxy_type: claims.proxy_type,
            labels: (*claims.labels).clone(),
            tags: (*claims.tags).clone(),
            iat: claims.issued_at,
            nbf: claims.not_before,
            exp: claims.expires_at,
            jti: claims.id.clone(),
        }
    }

    /// Checks issuer, subject and every field, and returns the claims.
    pub(crate) fn into_claims(self) -> Result<Claims, AuthError> {
        if self.iss != ISSUER {
            return Err(AuthError::WrongIssuer {
                issuer: quote(&self.iss),
            });
        }
        let claims = Claims {
            mesh: self.mesh,
            name: self.name,
            proxy_type: self.proxy_type,
            labels: Arc::new(self.labels),
            tags: Arc::new(self.tags),
            issued_at: self.iat,
            not_before: self.nbf,
            expires_at: self.exp,
            id: self.jti,
        };
        claims.validate()?;
        if self.sub != claims.subject() {
            return Err(AuthError::InvalidClaim {
                field: "sub",
                reason: "must be `<mesh>.<name>` (`agent:<name>` for an agent)".to_owned(),
            });
        }
        Ok(claims)
    }
}

/// The three segments of a compact JWS, split but not yet checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JwsParts<'a> {
    /// `header.payload`, the bytes the signature covers.
    pub signing_input: &'a str,
    /// The base64url header.
    pub header: &'a str,
    /// The base64url payload.
    pub payload: &'a str,
    /// The base64url signature; may be empty.
    pub signature: &'a str,
}

/// Splits a compact JWS into exactly three segments, header and payload non-empty; `None` for
/// anything else. An empty signature is let through so that an unsigned (`alg: none`) token can be
/// reported as an unsupported algorithm rather than as malformed. Proxy tokens and JWT-SVIDs are
/// both split here.
pub fn split_compact(token: &str) -> Option<JwsParts<'_>> {
    let (signing_input, signature) = token.rsplit_once('.')?;
    let (header, payload) = signing_input.split_once('.')?;
    if header.is_empty() || payload.is_empty() || payload.contains('.') {
        return None;
    }
    Some(JwsParts {
        signing_input,
        header,
        payload,
        signature,
    })
}

/// [`split_compact`], with the error a proxy token gets.
pub(crate) fn split(token: &str) -> Result<JwsParts<'_>, AuthError> {
    split_compact(token)
        .ok_or_else(|| malformed("expected three base64url segments separated by '.'"))
}

/// Checks that the header is exactly [`HEADER_JSON`]; a header naming another algorithm is reported as such.
pub(crate) fn check_header(segment: &str) -> Result<(), AuthError> {
    let bytes = decode(segment, "header")?;
    if bytes == HEADER_JSON.as_bytes() {
        return Ok(());
    }
    let alg = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|header| header.get("alg").cloned());
    let unsupported = |alg: &str| AuthError::UnsupportedAlgorithm { alg: quote(alg) };
    match alg {
        Some(serde_json::Value::String(alg)) if alg != "ES256" => Err(unsupported(&alg)),
        Some(
            alg @ (serde_json::Value::Null
            | serde_json::Value::Bool(_)
            | serde_json::Value::Number(_)
            | serde_json::Value::Array(_)
            | serde_json::Value::Object(_)),
        ) => Err(unsupported(&alg.to_string())),
        _ => Err(malformed(&format!(
            "the header must be exactly {HEADER_JSON}"
        ))),
    }
}

/// Decodes the claim set JSON (the signature has been checked before).
pub(crate) fn decode_claims(segment: &str) -> Result<WireClaims, AuthError> {
    let bytes = decode(segment, "claims")?;
    serde_json::from_slice(&bytes).map_err(|e| {
        // serde_json's message names the field and position, never more than a short excerpt of the input.
        malformed(&format!("the claims are not a meshca claim set: {e}"))
    })
}

/// Strict base64url without padding (non-canonical trailing bits are refused, so each token has one spelling).
pub(crate) fn decode(segment: &str, what: &str) -> Result<Vec<u8>, AuthError> {
    URL_SAFE_NO_PAD.decode(segment).map_err(|_| {
        malformed(&format!(
            "the {what} segment is not base64url without padding"
        ))
    })
}

pub(crate) fn encode(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

fn malformed(reason: &str) -> AuthError {
    AuthError::Malformed {
        reason: reason.to_owned(),
    }
}
