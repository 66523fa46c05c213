//! A trust domain's JWT bundle as a JWK Set (RFC 7517): the keys its JWT-SVIDs are signed with.

use std::collections::BTreeSet;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use meshca_auth::quote;
use serde::Serialize;
use serde_json::{Map, Value};

use super::key::COORDINATE_LEN;
use super::{JwtError, JwtPublicKey};

/// The largest JWK Set [`JwksDocument::parse`] reads, in bytes: room for about a thousand P-256 keys,
/// far more than a trust domain rotates through, while a hostile document stays cheap to refuse.
pub const MAX_JWKS_BYTES: usize = 256 * 1024;

/// The JWT keys of one trust domain, ordered by `kid`, each `kid` once.
///
/// Rendered as a standard JWK Set, `{"keys":[{"kty":"EC","crv":"P-256","x":…,"y":…,"kid":…}]}`: every
/// key with a `kid` (some clients refuse the whole set when one key lacks it), no `use`, no SPIFFE
/// bundle extensions, as the Workload API's `FetchJWTBundles` sends it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JwksDocument {
    keys: Vec<JwtPublicKey>,
}

#[derive(Serialize)]
struct WireSet<'a> {
    keys: Vec<WireKey<'a>>,
}

#[derive(Serialize)]
struct WireKey<'a> {
    kty: &'static str,
    crv: &'static str,
    x: String,
    y: String,
    kid: &'a str,
}

impl JwksDocument {
    /// A set of `keys`, ordered by `kid`; of two keys with the same `kid`, the first given is kept.
    pub fn new(keys: impl IntoIterator<Item = JwtPublicKey>) -> JwksDocument {
        let mut keys: Vec<JwtPublicKey> = keys.into_iter().collect();
        // Stable: the first of equal kids stays first, and dedup keeps it.
        keys.sort_by(|a, b| a.kid().cmp(b.kid()));
        keys.dedup_by(|later, earlier| later.kid() == earlier.kid());
        JwksDocument { keys }
    }

    /// The keys, ordered by `kid`.
    pub fn keys(&self) -> &[JwtPublicKey] {
        &self.keys
    }

    /// The key with this `kid`.
    pub fn get(&self, kid: &str) -> Option<&JwtPublicKey> {
        self.keys
            .binary_search_by(|key| key.kid().cmp(kid))
            .ok()
            .and_then(|at| self.keys.get(at))
    }

    /// The JWK Set as JSON bytes; the same keys always give the same bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let set = WireSet {
            keys: self
                .keys
                .iter()
                .map(|key| WireKey {
                    kty: "EC",
                    crv: "P-256",
                    x: URL_SAFE_NO_PAD.encode(key.x()),
                    y: URL_SAFE_NO_PAD.encode(key.y()),
                    kid: key.kid(),
                })
                .collect(),
        };
        // A struct of strings always serializes; an empty set is the fallback that cannot happen.
        serde_json::to_vec(&set).unwrap_or_else(|_| br#"{"keys":[]}"#.to_vec())
    }

    /// Reads a JWK Set of at most [`MAX_JWKS_BYTES`].
    ///
    /// P-256 EC keys (`kty` `EC`, `crv` `P-256`, `use` absent or `jwt-svid`) are kept; each must have
    /// a `kid`, unique among them, and 32-byte `x` and `y`. Keys of another type or curve, or for
    /// another use (a full SPIFFE bundle's X.509 authorities, which carry no `kid`), are skipped, since
    /// no JWT-SVID this code accepts can be signed by them. Other members (`alg`, `spiffe_sequence`, ...)
    /// are ignored.
    pub fn parse(bytes: &[u8]) -> Result<JwksDocument, JwtError> {
        if bytes.len() > MAX_JWKS_BYTES {
            return Err(jwks(format!(
                "{} bytes long; at most {MAX_JWKS_BYTES} are read",
                bytes.len()
            )));
        }
        let set: Map<String, Value> =
            serde_json::from_slice(bytes).map_err(|e| jwks(format!("not a JSON object: {e}")))?;
        let entries = match set.get("keys") {
            Some(Value::Array(entries)) => entries,
            Some(_) => return Err(jwks("`keys` is not an array".to_owned())),
            None => return Err(jwks("no `keys` member".to_owned())),
        };
        let mut keys = Vec::with_capacity(entries.len());
        let mut kids = BTreeSet::new();
        for (index, entry) in entries.iter().enumerate() {
            let Value::Object(entry) = entry else {
                return Err(jwks(format!("key {index} is not a JSON object")));
            };
            if !is_kept(entry) {
                continue;
            }
            let key = parse_key(index, entry)?;
            if !kids.insert(key.kid().to_owned()) {
                return Err(jwks(format!(
                    "key {index}: `kid` {} is used by an earlier key too",
                    quote(key.kid())
                )));
            }
            keys.push(key);
        }
        Ok(JwksDocument::new(keys))
    }
}

/// Whether a key is one a JWT-SVID here can be signed with: EC P-256, for JWT-SVIDs.
fn is_kept(entry: &Map<String, Value>) -> bool {
    entry.get("kty").and_then(Value::as_str) == Some("EC")
        && entry.get("crv").and_then(Value::as_str) == Some("P-256")
        && entry
            .get("use")
            .is_none_or(|usage| usage.as_str() == Some("jwt-svid"))
}

/// One kept key of the set (see [`is_kept`]).
fn parse_key(index: usize, entry: &Map<String, Value>) -> Result<JwtPublicKey, JwtError> {
    let kid = match entry.get("kid") {
        Some(Value::String(kid)) if !kid.is_empty() => kid,
        Some(_) => {
            return Err(jwks(format!(
                "key {index}: `kid` is not a non-empty string"
            )))
        }
        None => return Err(jwks(format!("key {index} has no `kid`"))),
    };
    let coordinate = |name: &str| -> Result<[u8; COORDINATE_LEN], JwtError> {
        let text = entry
            .get(name)
            .and_then(Value::as_str)
            .ok_or_else(|| jwks(format!("key {}: no string `{name}`", quote(kid))))?;
        URL_SAFE_NO_PAD
            .decode(text)
            .ok()
            .and_then(|bytes| <[u8; COORDINATE_LEN]>::try_from(bytes).ok())
            .ok_or_else(|| {
                jwks(format!(
                    "key {}: `{name}` is not 32 bytes of base64url without padding",
                    quote(kid)
                ))
            })
    };
    Ok(JwtPublicKey::new(
        kid.clone(),
        coordinate("x")?,
        coordinate("y")?,
    ))
}

fn jwks(reason: String) -> JwtError {
    JwtError::Jwks { reason }
}
