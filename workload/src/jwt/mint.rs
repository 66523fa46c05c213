//! Minting JWT-SVIDs.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use meshca_auth::quote;
use meshca_identity::SpiffeId;
use serde::Serialize;

use super::{JwtError, JwtSigningKey, MAX_TOKEN_BYTES};

/// The header, field for field in this order: `{"alg":"ES256","kid":…,"typ":"JWT"}`.
#[derive(Serialize)]
struct Header<'a> {
    alg: &'static str,
    kid: &'a str,
    typ: &'static str,
}

/// The claims meshca writes: `aud` is always an array, as SPIRE writes it, even for one audience.
#[derive(Serialize)]
struct Claims<'a> {
    sub: &'a str,
    aud: &'a [String],
    exp: u64,
    iat: u64,
}

/// Signs a JWT-SVID for `spiffe_id` with `key`: a compact JWS with the header
/// `{"alg":"ES256","kid":<key's kid>,"typ":"JWT"}` and the claims `sub`, `aud` (a JSON array, in the
/// order given), `exp` and `iat` (unix seconds). The signature is in JOSE form (`r || s`, low-S).
///
/// Refuses an ID that is not a SPIFFE ID or is a trust domain's root ID, an empty audience list or an
/// empty audience (see [`super::check_audiences`] for the request limits), `expires_at <= issued_at`,
/// and a token that would be longer than [`MAX_TOKEN_BYTES`] (so that every minted token validates).
pub fn mint(
    key: &JwtSigningKey,
    spiffe_id: &str,
    audiences: &[String],
    issued_at: u64,
    expires_at: u64,
) -> Result<String, JwtError> {
    let id = SpiffeId::parse(spiffe_id).map_err(|source| JwtError::InvalidSubject {
        subject: quote(spiffe_id),
        source,
    })?;
    if id.is_root() {
        return Err(JwtError::RootSubject {
            subject: quote(spiffe_id),
        });
    }
    if audiences.is_empty() {
        return Err(JwtError::AudienceMissing);
    }
    if let Some(index) = audiences.iter().position(String::is_empty) {
        return Err(JwtError::EmptyAudience { index });
    }
    if expires_at <= issued_at {
        return Err(JwtError::InvalidLifetime {
            issued_at,
            expires_at,
        });
    }
    let header = serde_json::to_vec(&Header {
        alg: "ES256",
        kid: key.kid(),
        typ: "JWT",
    });
    let claims = serde_json::to_vec(&Claims {
        sub: id.as_str(),
        aud: audiences,
        exp: expires_at,
        iat: issued_at,
    });
    let (header, claims) = match (header, claims) {
        (Ok(header), Ok(claims)) => (header, claims),
        // Plain structs of strings and integers always serialize.
        (Err(e), _) | (_, Err(e)) => {
            return Err(JwtError::Malformed {
                reason: format!("the token could not be encoded: {e}"),
            })
        }
    };
    let signing_input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(claims)
    );
    let signature = key.sign(signing_input.as_bytes())?;
    let token = format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(signature));
    if token.len() > MAX_TOKEN_BYTES {
        return Err(JwtError::TokenTooLong {
            len: token.len(),
            max: MAX_TOKEN_BYTES,
        });
    }
    Ok(token)
}
