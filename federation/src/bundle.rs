//! The SPIFFE bundle format: a trust domain's authorities as an RFC 7517 JWK Set.
//!
//! ```json
//! {"keys": [{"use": "x509-svid", "kty": "EC", "crv": "P-256", "x": "…", "y": "…", "x5c": ["…"]},
//!           {"use": "jwt-svid", "kty": "EC", "crv": "P-256", "x": "…", "y": "…", "kid": "…"}],
//!  "spiffe_sequence": 7, "spiffe_refresh_hint": 300}
//! ```
//!
//! Reading follows the standard and what its implementations accept: an element of an unknown `use`
//! or key type (or curve) is skipped, as the standard requires; anything else malformed refuses the
//! whole bundle, naming the element and the field, since a bundle is the trust of a whole domain and
//! half of one is a partial outage. Every input is bounded before it is parsed ([`BundleLimits`]).

use std::time::Duration;

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use meshca_files::shown;
use meshca_identity::TrustDomain;
use serde::Serialize;
use serde_json::{Map, Value};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
use x509_parser::public_key::PublicKey;

/// The `use` of an X.509 authority.
const X509_SVID: &str = "x509-svid";
/// The `use` of a JWT authority.
const JWT_SVID: &str = "jwt-svid";

/// The longest `kid` read.
const MAX_KID_LEN: usize = 256;

/// The RSA moduli read: 2048 to 8192 bits.
const RSA_MODULUS_BYTES: std::ops::RangeInclusive<usize> = 256..=1024;

/// How much of a bundle read from outside is accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BundleLimits {
    /// The largest document, in bytes.
    pub max_bytes: usize,
    /// The most elements of `keys`, skipped ones included.
    pub max_keys: usize,
}

impl Default for BundleLimits {
    /// 256 KiB and 256 keys: a trust domain keeps a handful of authorities, and a hostile document
    /// stays cheap to refuse.
    fn default() -> BundleLimits {
        BundleLimits {
            max_bytes: 256 * 1024,
            max_keys: 256,
        }
    }
}

/// Why a bundle was refused, whole.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BundleError {
    /// Larger than [`BundleLimits::max_bytes`].
    #[error("the bundle is {bytes} bytes, more than the {max} accepted")]
    TooLarge {
        /// Its size.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// Not a JSON object.
    #[error("the bundle is not a JSON object: {0}")]
    NotJson(String),
    /// More elements in `keys` than [`BundleLimits::max_keys`].
    #[error("keys: {count} elements, more than the {max} accepted")]
    TooManyKeys {
        /// How many.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A field is missing or malformed.
    #[error("{field}: {reason}")]
    Field {
        /// Where: `keys`, `keys[2].x5c`, `spiffe_sequence`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No element is an authority this bundle's reader can use.
    #[error("the bundle holds no X.509 or JWT authority meshca can use")]
    NoAuthority,
}

fn field(field: impl Into<String>, reason: impl Into<String>) -> BundleError {
    BundleError::Field {
        field: field.into(),
        reason: reason.into(),
    }
}

/// An elliptic curve of a JWK (RFC 7518 §6.2.1.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EcCurve {
    /// `P-256`.
    P256,
    /// `P-384`.
    P384,
}

impl EcCurve {
    fn name(self) -> &'static str {
        match self {
            EcCurve::P256 => "P-256",
            EcCurve::P384 => "P-384",
        }
    }

    fn from_name(name: &str) -> Option<EcCurve> {
        match name {
            "P-256" => Some(EcCurve::P256),
            "P-384" => Some(EcCurve::P384),
            _ => None,
        }
    }

    /// The length of a coordinate, in bytes.
    fn coordinate_len(self) -> usize {
        match self {
            EcCurve::P256 => 32,
            EcCurve::P384 => 48,
        }
    }
}

/// A public key as a JWK carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JwkKey {
    /// `kty: EC`: the curve and the point's coordinates.
    Ec {
        /// `crv`.
        curve: EcCurve,
        /// `x`, big-endian, the curve's length.
        x: Vec<u8>,
        /// `y`, big-endian, the curve's length.
        y: Vec<u8>,
    },
    /// `kty: RSA`: the modulus and the public exponent, big-endian without leading zeros.
    Rsa {
        /// `n`.
        n: Vec<u8>,
        /// `e`.
        e: Vec<u8>,
    },
}

/// A trust domain's X.509 authority: one CA certificate, DER, whose key the JWK repeats.
#[derive(Clone, PartialEq, Eq)]
pub struct X509Authority {
    der: Vec<u8>,
    key: JwkKey,
}

impl X509Authority {
    /// The authority of the CA certificate `der` in `trust_domain`: it must be a CA certificate, of a
    /// key type a JWK can carry, and name no other trust domain.
    pub fn from_der(der: Vec<u8>, trust_domain: &TrustDomain) -> Result<X509Authority, String> {
        let key = certificate_key(&der, trust_domain)?;
        Ok(X509Authority { der, key })
    }

    /// The certificate, DER.
    pub fn der(&self) -> &[u8] {
        &self.der
    }

    /// Its public key.
    pub fn key(&self) -> &JwkKey {
        &self.key
    }
}

impl std::fmt::Debug for X509Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("X509Authority")
            .field("der_bytes", &self.der.len())
            .field("key", &self.key)
            .finish()
    }
}

/// A trust domain's JWT authority: a key JWT-SVIDs are signed with, by its `kid`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JwtAuthority {
    /// `kid`.
    pub kid: String,
    /// The key.
    pub key: JwkKey,
}

/// A trust domain's bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpiffeBundle {
    trust_domain: TrustDomain,
    /// `spiffe_sequence`.
    pub sequence: Option<u64>,
    /// `spiffe_refresh_hint`, whole seconds.
    pub refresh_hint: Option<Duration>,
    x509_authorities: Vec<X509Authority>,
    jwt_authorities: Vec<JwtAuthority>,
}

impl SpiffeBundle {
    /// A bundle of `trust_domain` with these authorities (`kid`s once each: a later one of the same
    /// `kid` is dropped).
    pub fn new(
        trust_domain: TrustDomain,
        x509_authorities: Vec<X509Authority>,
        jwt_authorities: Vec<JwtAuthority>,
    ) -> SpiffeBundle {
        let mut seen = std::collections::HashSet::new();
        let jwt_authorities = jwt_authorities
            .into_iter()
            .filter(|a| seen.insert(a.kid.clone()))
            .collect();
        SpiffeBundle {
            trust_domain,
            sequence: None,
            refresh_hint: None,
            x509_authorities,
            jwt_authorities,
        }
    }

    /// The trust domain it is the bundle of (the reader's, never the document's: a bundle does not
    /// name its trust domain).
    pub fn trust_domain(&self) -> &TrustDomain {
        &self.trust_domain
    }

    /// The X.509 authorities, in the document's order.
    pub fn x509_authorities(&self) -> &[X509Authority] {
        &self.x509_authorities
    }

    /// The JWT authorities, in the document's order.
    pub fn jwt_authorities(&self) -> &[JwtAuthority] {
        &self.jwt_authorities
    }

    /// Reads the bundle of `trust_domain` from `bytes`, within `limits`.
    pub fn parse(
        trust_domain: &TrustDomain,
        bytes: &[u8],
        limits: BundleLimits,
    ) -> Result<SpiffeBundle, BundleError> {
        if bytes.len() > limits.max_bytes {
            return Err(BundleError::TooLarge {
                bytes: bytes.len(),
                max: limits.max_bytes,
            });
        }
        let document: Value =
            serde_json::from_slice(bytes).map_err(|e| BundleError::NotJson(e.to_string()))?;
        let Value::Object(document) = document else {
            return Err(BundleError::NotJson("not an object".into()));
        };
        let keys = match document.get("keys") {
            Some(Value::Array(keys)) => keys,
            Some(_) => return Err(field("keys", "not an array")),
            None => return Err(field("keys", "required")),
        };
        if keys.len() > limits.max_keys {
            return Err(BundleError::TooManyKeys {
                count: keys.len(),
                max: limits.max_keys,
            });
        }
        let sequence = optional_u64(&document, "spiffe_sequence")?;
        let refresh_hint = optional_u64(&document, "spiffe_refresh_hint")?.map(Duration::from_secs);
        let mut bundle = SpiffeBundle {
            trust_domain: trust_domain.clone(),
            sequence,
            refresh_hint,
            x509_authorities: Vec::new(),
            jwt_authorities: Vec::new(),
        };
        for (at, element) in keys.iter().enumerate() {
            let at = format!("keys[{at}]");
            let Value::Object(element) = element else {
                return Err(field(at, "not an object"));
            };
            match read_element(&at, element, trust_domain)? {
                Element::X509(authority) => bundle.x509_authorities.push(authority),
                Element::Jwt(authority) => {
                    if bundle
                        .jwt_authorities
                        .iter()
                        .any(|a| a.kid == authority.kid)
                    {
                        return Err(field(
                            format!("{at}.kid"),
                            format!("{} is the kid of another key", shown(&authority.kid)),
                        ));
                    }
                    bundle.jwt_authorities.push(authority);
                }
                Element::Skipped => {}
            }
        }
        if bundle.x509_authorities.is_empty() && bundle.jwt_authorities.is_empty() {
            return Err(BundleError::NoAuthority);
        }
        Ok(bundle)
    }

    /// A bundle as an operator hands one over (a relationship's initial bundle, `meshca bundle fetch
    /// --bundle-file`): a SPIFFE bundle, or PEM certificates, each an X.509 authority.
    pub fn parse_initial(
        trust_domain: &TrustDomain,
        bytes: &[u8],
        limits: BundleLimits,
    ) -> Result<SpiffeBundle, BundleError> {
        if bytes.trim_ascii_start().starts_with(b"{") {
            return SpiffeBundle::parse(trust_domain, bytes, limits);
        }
        if bytes.len() > limits.max_bytes {
            return Err(BundleError::TooLarge {
                bytes: bytes.len(),
                max: limits.max_bytes,
            });
        }
        let blocks = pem::parse_many(bytes)
            .map_err(|e| field("PEM", format!("neither a SPIFFE bundle nor PEM: {e}")))?;
        if blocks.len() > limits.max_keys {
            return Err(BundleError::TooManyKeys {
                count: blocks.len(),
                max: limits.max_keys,
            });
        }
        let mut authorities = Vec::new();
        for (at, block) in blocks.into_iter().enumerate() {
            if block.tag() != "CERTIFICATE" {
                return Err(field(
                    format!("PEM block {at}"),
                    format!(
                        "a {} block; only CERTIFICATE blocks are authorities",
                        shown(block.tag())
                    ),
                ));
            }
            let authority = X509Authority::from_der(block.into_contents(), trust_domain)
                .map_err(|reason| field(format!("PEM block {at}"), reason))?;
            authorities.push(authority);
        }
        if authorities.is_empty() {
            return Err(BundleError::NoAuthority);
        }
        Ok(SpiffeBundle::new(
            trust_domain.clone(),
            authorities,
            Vec::new(),
        ))
    }

    /// The X.509 authorities as PEM certificates.
    pub fn x509_pem(&self) -> String {
        self.x509_authorities
            .iter()
            .map(|a| pem::encode(&pem::Pem::new("CERTIFICATE", a.der.clone())))
            .collect()
    }

    /// The bundle as JSON: the same bundle always gives the same bytes.
    pub fn to_json(&self) -> Vec<u8> {
        let keys = self
            .x509_authorities
            .iter()
            .map(|a| WireKey {
                use_: X509_SVID,
                kid: None,
                key: WireParams::of(&a.key),
                x5c: Some([STANDARD.encode(&a.der)]),
            })
            .chain(self.jwt_authorities.iter().map(|a| WireKey {
                use_: JWT_SVID,
                kid: Some(&a.kid),
                key: WireParams::of(&a.key),
                x5c: None,
            }))
            .collect();
        let document = WireBundle {
            keys,
            spiffe_sequence: self.sequence,
            spiffe_refresh_hint: self.refresh_hint.map(|d| d.as_secs()),
        };
        // Strings and integers only: serializing cannot fail.
        serde_json::to_vec(&document).unwrap_or_default()
    }
}

#[derive(Serialize)]
struct WireBundle<'a> {
    keys: Vec<WireKey<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    spiffe_sequence: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    spiffe_refresh_hint: Option<u64>,
}

#[derive(Serialize)]
struct WireKey<'a> {
    #[serde(rename = "use")]
    use_: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    kid: Option<&'a str>,
    #[serde(flatten)]
    key: WireParams,
    #[serde(skip_serializing_if = "Option::is_none")]
    x5c: Option<[String; 1]>,
}

#[derive(Serialize)]
#[serde(tag = "kty")]
enum WireParams {
    #[serde(rename = "EC")]
    Ec {
        crv: &'static str,
        x: String,
        y: String,
    },
    #[serde(rename = "RSA")]
    Rsa { n: String, e: String },
}

impl WireParams {
    fn of(key: &JwkKey) -> WireParams {
        match key {
            JwkKey::Ec { curve, x, y } => WireParams::Ec {
                crv: curve.name(),
                x: URL_SAFE_NO_PAD.encode(x),
                y: URL_SAFE_NO_PAD.encode(y),
            },
            JwkKey::Rsa { n, e } => WireParams::Rsa {
                n: URL_SAFE_NO_PAD.encode(n),
                e: URL_SAFE_NO_PAD.encode(e),
            },
        }
    }
}

/// One element of `keys`, read.
enum Element {
    X509(X509Authority),
    Jwt(JwtAuthority),
    /// Of an unknown `use`, key type or curve: skipped, as the standard requires.
    Skipped,
}

fn read_element(
    at: &str,
    element: &Map<String, Value>,
    trust_domain: &TrustDomain,
) -> Result<Element, BundleError> {
    let use_ = match element.get("use") {
        Some(Value::String(use_)) if use_ == X509_SVID || use_ == JWT_SVID => use_.as_str(),
        // A missing `use` is no known one either.
        Some(Value::String(_)) | None => return Ok(Element::Skipped),
        Some(_) => return Err(field(format!("{at}.use"), "not a string")),
    };
    let Some(key) = read_key(at, element)? else {
        return Ok(Element::Skipped);
    };
    if use_ == X509_SVID {
        let x5c = match element.get("x5c") {
            Some(Value::Array(x5c)) => x5c,
            Some(_) => return Err(field(format!("{at}.x5c"), "not an array")),
            None => return Err(field(format!("{at}.x5c"), "required for an x509-svid key")),
        };
        let [Value::String(certificate)] = x5c.as_slice() else {
            return Err(field(
                format!("{at}.x5c"),
                format!(
                    "holds {} elements; an x509-svid key holds exactly one certificate",
                    x5c.len()
                ),
            ));
        };
        let der = STANDARD
            .decode(certificate)
            .map_err(|e| field(format!("{at}.x5c[0]"), format!("not base64: {e}")))?;
        let authority = X509Authority::from_der(der, trust_domain)
            .map_err(|reason| field(format!("{at}.x5c[0]"), reason))?;
        if authority.key != key {
            return Err(field(
                at,
                "the key parameters are not the certificate's public key",
            ));
        }
        return Ok(Element::X509(authority));
    }
    let kid = match element.get("kid") {
        Some(Value::String(kid)) if !kid.is_empty() && kid.len() <= MAX_KID_LEN => kid.clone(),
        Some(Value::String(_)) => {
            return Err(field(
                format!("{at}.kid"),
                format!("empty or longer than {MAX_KID_LEN} bytes"),
            ))
        }
        Some(_) => return Err(field(format!("{at}.kid"), "not a string")),
        None => return Err(field(format!("{at}.kid"), "required for a jwt-svid key")),
    };
    Ok(Element::Jwt(JwtAuthority { kid, key }))
}

/// The key of a JWK; `None` for a key type or curve this reader does not know (the element is
/// skipped).
fn read_key(at: &str, element: &Map<String, Value>) -> Result<Option<JwkKey>, BundleError> {
    let text = |name: &str| match element.get(name) {
        Some(Value::String(value)) => Ok(value.as_str()),
        Some(_) => Err(field(format!("{at}.{name}"), "not a string")),
        None => Err(field(format!("{at}.{name}"), "required")),
    };
    let bytes = |name: &str| {
        URL_SAFE_NO_PAD
            .decode(text(name)?)
            .map_err(|e| field(format!("{at}.{name}"), format!("not base64url: {e}")))
    };
    match text("kty")? {
        "EC" => {
            let Some(curve) = EcCurve::from_name(text("crv")?) else {
                return Ok(None);
            };
            let (x, y) = (bytes("x")?, bytes("y")?);
            for (name, coordinate) in [("x", &x), ("y", &y)] {
                if coordinate.len() != curve.coordinate_len() {
                    return Err(field(
                        format!("{at}.{name}"),
                        format!(
                            "{} bytes; a {} coordinate has {}",
                            coordinate.len(),
                            curve.name(),
                            curve.coordinate_len()
                        ),
                    ));
                }
            }
            Ok(Some(JwkKey::Ec { curve, x, y }))
        }
        "RSA" => {
            let (n, e) = (bytes("n")?, bytes("e")?);
            if !RSA_MODULUS_BYTES.contains(&n.len()) || n.first() == Some(&0) {
                return Err(field(
                    format!("{at}.n"),
                    "not a 2048- to 8192-bit modulus without leading zeros",
                ));
            }
            if e.is_empty() || e.len() > 8 || e.first() == Some(&0) {
                return Err(field(
                    format!("{at}.e"),
                    "not an exponent of 1 to 8 bytes without leading zeros",
                ));
            }
            Ok(Some(JwkKey::Rsa { n, e }))
        }
        _ => Ok(None),
    }
}

/// The public key of the CA certificate `der`, checked to be a CA certificate of `trust_domain`.
fn certificate_key(der: &[u8], trust_domain: &TrustDomain) -> Result<JwkKey, String> {
    let (rest, certificate) =
        X509Certificate::from_der(der).map_err(|e| format!("not an X.509 certificate: {e}"))?;
    if !rest.is_empty() {
        return Err("bytes after the certificate".into());
    }
    if !certificate.is_ca() {
        return Err("not a CA certificate (basicConstraints cA is not true)".into());
    }
    if let Ok(Some(names)) = certificate.subject_alternative_name() {
        for name in &names.value.general_names {
            if let GeneralName::URI(uri) = name {
                let Some(rest) = uri.strip_prefix("spiffe://") else {
                    continue;
                };
                let domain = rest.split('/').next().unwrap_or_default();
                if domain != trust_domain.as_str() {
                    return Err(format!(
                        "the certificate names trust domain {}, not {:?}",
                        shown(domain),
                        trust_domain.as_str()
                    ));
                }
            }
        }
    }
    let spki = certificate.public_key();
    match spki
        .parsed()
        .map_err(|e| format!("unreadable public key: {e}"))?
    {
        PublicKey::EC(point) => {
            let curve = match spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok())
                .map(|oid| oid.to_id_string())
                .as_deref()
            {
                Some("1.2.840.10045.3.1.7") => EcCurve::P256,
                Some("1.3.132.0.34") => EcCurve::P384,
                other => {
                    return Err(format!(
                        "an EC key on a curve a JWK here cannot carry ({other:?})"
                    ))
                }
            };
            let len = curve.coordinate_len();
            match point.data() {
                [0x04, xy @ ..] if xy.len() == 2 * len => Ok(JwkKey::Ec {
                    curve,
                    x: xy[..len].to_vec(),
                    y: xy[len..].to_vec(),
                }),
                _ => Err("the EC public key is not an uncompressed point of its curve".into()),
            }
        }
        PublicKey::RSA(rsa) => {
            let strip = |bytes: &[u8]| {
                let start = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
                bytes[start..].to_vec()
            };
            let (n, e) = (strip(rsa.modulus), strip(rsa.exponent));
            if !RSA_MODULUS_BYTES.contains(&n.len()) || e.is_empty() || e.len() > 8 {
                return Err("an RSA key of a size a bundle here does not carry".into());
            }
            Ok(JwkKey::Rsa { n, e })
        }
        _ => Err("a public key type a JWK here cannot carry".into()),
    }
}

fn optional_u64(document: &Map<String, Value>, name: &str) -> Result<Option<u64>, BundleError> {
    match document.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| field(name, "not an integer from 0 to 2^64-1")),
        Some(_) => Err(field(name, "not a number")),
    }
}

#[cfg(test)]
mod tests;
