//! RFC 7512 `pkcs11:` URIs: how a key in a token is named in the keystore and in resources.
//!
//! [`Pkcs11Uri::parse`] reads the path attributes (`token`, `object`, `id`, `type`, and the token,
//! slot and library attributes, which are kept but not used to pick a key), then the query
//! (`module-name`, `module-path`). A PIN in the URI (`pin-value`, `pin-source`) is refused: the PIN
//! comes from the settings, where it is kept out of logs and errors, and a URI is shown in both.
//! [`Pkcs11Uri`]'s `Display` writes one canonical spelling that parses back to the same value.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

mod error;
#[cfg(test)]
mod tests;

pub use error::UriError;

/// The longest `pkcs11:` URI accepted, in bytes.
const MAX_URI_BYTES: usize = 4096;

/// The most characters of a value or name an error quotes.
const ECHO_CHARS: usize = 64;

/// The `type` attribute: the class of the object a URI names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectType {
    /// `private`: a private key.
    Private,
    /// `public`: a public key.
    Public,
    /// `cert`: a certificate.
    Cert,
    /// `secret-key`: a secret (symmetric) key.
    SecretKey,
    /// `data`: a data object.
    Data,
}

impl ObjectType {
    const ALL: [ObjectType; 5] = [
        ObjectType::Private,
        ObjectType::Public,
        ObjectType::Cert,
        ObjectType::SecretKey,
        ObjectType::Data,
    ];

    /// The spelling in a URI.
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectType::Private => "private",
            ObjectType::Public => "public",
            ObjectType::Cert => "cert",
            ObjectType::SecretKey => "secret-key",
            ObjectType::Data => "data",
        }
    }
}

impl fmt::Display for ObjectType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The path attributes, in the order `Display` writes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PathAttr {
    Token,
    Manufacturer,
    Model,
    Serial,
    Object,
    Type,
    Id,
    LibraryManufacturer,
    LibraryDescription,
    LibraryVersion,
    SlotId,
    SlotDescription,
    SlotManufacturer,
}

const PATH_ATTRS: [(&str, PathAttr); 13] = [
    ("token", PathAttr::Token),
    ("manufacturer", PathAttr::Manufacturer),
    ("model", PathAttr::Model),
    ("serial", PathAttr::Serial),
    ("object", PathAttr::Object),
    ("type", PathAttr::Type),
    ("id", PathAttr::Id),
    ("library-manufacturer", PathAttr::LibraryManufacturer),
    ("library-description", PathAttr::LibraryDescription),
    ("library-version", PathAttr::LibraryVersion),
    ("slot-id", PathAttr::SlotId),
    ("slot-description", PathAttr::SlotDescription),
    ("slot-manufacturer", PathAttr::SlotManufacturer),
];

const PATH_NAMES: &str = "token, manufacturer, model, serial, object, type, id, \
library-manufacturer, library-description, library-version, slot-id, slot-description, slot-manufacturer";

const QUERY_NAMES: &str = "module-name, module-path";

/// An RFC 7512 `pkcs11:` URI without a PIN: which token, and which object in it.
///
/// Two URIs are equal when they have the same attributes with the same decoded values, however they
/// were spelled. `Display` writes the canonical form: `pkcs11:`, the path attributes in a fixed
/// order (`token`, `manufacturer`, `model`, `serial`, `object`, `type`, `id`, the library and slot
/// attributes, then vendor `x-` attributes by name), then `?` and the query attributes if any; every
/// character that RFC 7512 does not allow as is is percent-encoded, and `id` is percent-encoded
/// byte by byte. [`Pkcs11Uri::parse`] bounds that form too, so the canonical form of every URI it
/// returns parses back to an equal value.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Pkcs11Uri {
    token: Option<String>,
    object: Option<String>,
    object_type: Option<ObjectType>,
    id: Option<Vec<u8>>,
    /// The attributes that do not pick a key, boxed: a URI sits in every data source that may hold
    /// one.
    details: Box<Details>,
}

/// The attributes of a [`Pkcs11Uri`] that meshca keeps but does not use to pick a key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Details {
    manufacturer: Option<String>,
    model: Option<String>,
    serial: Option<String>,
    library_manufacturer: Option<String>,
    library_description: Option<String>,
    /// Digits, optionally `.` and digits, as given.
    library_version: Option<String>,
    slot_id: Option<u64>,
    slot_description: Option<String>,
    slot_manufacturer: Option<String>,
    /// Vendor path attributes (`x-...`), kept and otherwise ignored.
    vendor_path: BTreeMap<String, String>,
    module_name: Option<String>,
    module_path: Option<String>,
    /// Vendor query attributes (`x-...`), kept and otherwise ignored.
    vendor_query: BTreeMap<String, String>,
}

/// Which part of the URI an attribute is in: they allow different characters as is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Component {
    Path,
    Query,
}

impl Component {
    fn as_str(self) -> &'static str {
        match self {
            Component::Path => "path",
            Component::Query => "query",
        }
    }

    /// Whether RFC 7512 allows `byte` unencoded in a value of this component (`pk11-pchar`,
    /// `pk11-qchar`, without `pct-encoded`).
    fn allows(self, byte: u8) -> bool {
        let unreserved = byte.is_ascii_alphanumeric() || b"-._~".contains(&byte);
        let res_avail = b":[]@!$'()*+,=".contains(&byte);
        unreserved
            || res_avail
            || match self {
                Component::Path => byte == b'&',
                Component::Query => b"/?|".contains(&byte),
            }
    }
}

impl Pkcs11Uri {
    /// The URI of a private key meshca made: `pkcs11:token=<token>;object=<object>;type=private;id=<id>`.
    ///
    /// The labels and ids meshca gives its keys are short; a URI whose canonical text passed 4 KiB
    /// would be refused when read back.
    pub fn key(token: &str, object: &str, id: &[u8]) -> Pkcs11Uri {
        Pkcs11Uri {
            token: Some(token.to_owned()),
            object: Some(object.to_owned()),
            object_type: Some(ObjectType::Private),
            id: Some(id.to_vec()),
            ..Pkcs11Uri::default()
        }
    }

    /// Reads a `pkcs11:` URI (the scheme in any case).
    pub fn parse(text: &str) -> Result<Pkcs11Uri, UriError> {
        if text.len() > MAX_URI_BYTES {
            return Err(UriError::TooLong { len: text.len() });
        }
        let rest = match text.get(..7) {
            Some(scheme) if scheme.eq_ignore_ascii_case("pkcs11:") => &text[7..],
            _ => {
                return Err(UriError::Scheme {
                    found: cut(text.split(':').next().unwrap_or(text)),
                })
            }
        };
        let (path, query) = match rest.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (rest, None),
        };
        let mut uri = Pkcs11Uri::default();
        if !path.is_empty() {
            for (i, attribute) in path.split(';').enumerate() {
                uri.path_attribute(i, attribute)?;
            }
        }
        if let Some(query) = query.filter(|q| !q.is_empty()) {
            for (i, attribute) in query.split('&').enumerate() {
                uri.query_attribute(i, attribute)?;
            }
        }
        // `id` is written back percent-encoded byte by byte, up to three times its length as given:
        // the canonical form is bounded too, so that it always parses back.
        let canonical = uri.to_string().len();
        if canonical > MAX_URI_BYTES {
            return Err(UriError::TooLong { len: canonical });
        }
        Ok(uri)
    }

    /// `token`: the token's label.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// `object`: the object's label (`CKA_LABEL`).
    pub fn object(&self) -> Option<&str> {
        self.object.as_deref()
    }

    /// `id`: the object's `CKA_ID`, binary.
    pub fn id(&self) -> Option<&[u8]> {
        self.id.as_deref()
    }

    /// `type`: the object's class.
    pub fn object_type(&self) -> Option<ObjectType> {
        self.object_type
    }

    /// `serial`: the token's serial number.
    pub fn serial(&self) -> Option<&str> {
        self.details.serial.as_deref()
    }

    /// `slot-id`: the slot's number.
    pub fn slot_id(&self) -> Option<u64> {
        self.details.slot_id
    }

    /// `module-path`: the PKCS#11 module this URI was written for.
    pub fn module_path(&self) -> Option<&str> {
        self.details.module_path.as_deref()
    }

    fn path_attribute(&mut self, index: usize, attribute: &str) -> Result<(), UriError> {
        let (name, raw) = split(Component::Path, index, attribute)?;
        let Some(kind) = PATH_ATTRS.iter().find(|(n, _)| *n == name).map(|(_, k)| *k) else {
            let value = vendor(Component::Path, name, raw, PATH_NAMES)?;
            return insert_vendor(&mut self.details.vendor_path, name, value);
        };
        let text = || decode_text(Component::Path, name, raw);
        match kind {
            PathAttr::Id => {
                let bytes = decode(Component::Path, name, raw)?;
                set(&mut self.id, name, bytes)
            }
            PathAttr::Token => set(&mut self.token, name, text()?),
            PathAttr::Manufacturer => set(&mut self.details.manufacturer, name, text()?),
            PathAttr::Model => set(&mut self.details.model, name, text()?),
            PathAttr::Serial => set(&mut self.details.serial, name, text()?),
            PathAttr::Object => set(&mut self.object, name, text()?),
            PathAttr::LibraryManufacturer => {
                set(&mut self.details.library_manufacturer, name, text()?)
            }
            PathAttr::LibraryDescription => {
                set(&mut self.details.library_description, name, text()?)
            }
            PathAttr::SlotDescription => set(&mut self.details.slot_description, name, text()?),
            PathAttr::SlotManufacturer => set(&mut self.details.slot_manufacturer, name, text()?),
            PathAttr::Type => {
                let value = text()?;
                let Some(t) = ObjectType::ALL.into_iter().find(|t| t.as_str() == value) else {
                    return Err(UriError::UnknownType { value: cut(&value) });
                };
                set(&mut self.object_type, name, t)
            }
            PathAttr::LibraryVersion => {
                let value = text()?;
                let (major, minor) = match value.split_once('.') {
                    Some((major, minor)) => (major, Some(minor)),
                    None => (value.as_str(), None),
                };
                if !digits(major) || !minor.is_none_or(digits) {
                    return Err(bad_number(
                        name,
                        &value,
                        "a version: digits, or digits.digits",
                    ));
                }
                set(&mut self.details.library_version, name, value)
            }
            PathAttr::SlotId => {
                let value = text()?;
                let slot = Some(&value)
                    .filter(|v| digits(v))
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or_else(|| bad_number(name, &value, "a slot number (decimal digits)"))?;
                set(&mut self.details.slot_id, name, slot)
            }
        }
    }

    fn query_attribute(&mut self, index: usize, attribute: &str) -> Result<(), UriError> {
        let (name, raw) = split(Component::Query, index, attribute)?;
        match name {
            "module-name" => {
                let value = decode_text(Component::Query, name, raw)?;
                set(&mut self.details.module_name, name, value)
            }
            "module-path" => {
                let value = decode_text(Component::Query, name, raw)?;
                set(&mut self.details.module_path, name, value)
            }
            _ => {
                let value = vendor(Component::Query, name, raw, QUERY_NAMES)?;
                insert_vendor(&mut self.details.vendor_query, name, value)
            }
        }
    }
}

/// Splits `name=value`, refusing an empty name and a missing `=`.
fn split(component: Component, index: usize, attribute: &str) -> Result<(&str, &str), UriError> {
    let (name, raw) = match attribute.split_once('=') {
        Some(pair) => pair,
        None if attribute.is_empty() => ("", ""),
        None => {
            return Err(UriError::MissingValue {
                attribute: cut(attribute),
            })
        }
    };
    if name.is_empty() {
        return Err(UriError::EmptyName {
            component: component.as_str(),
            position: index + 1,
        });
    }
    // Refused by name wherever it is, before its value is read: no error quotes a PIN.
    if let Some(pin) = ["pin-value", "pin-source"].into_iter().find(|p| *p == name) {
        return Err(UriError::Pin { attribute: pin });
    }
    Ok((name, raw))
}

/// The decoded value of a vendor attribute, or the refusal of a name that is not one.
fn vendor(
    component: Component,
    name: &str,
    raw: &str,
    known: &'static str,
) -> Result<String, UriError> {
    let Some(suffix) = name.strip_prefix("x-") else {
        return Err(UriError::UnknownAttribute {
            component: component.as_str(),
            attribute: cut(name),
            known,
        });
    };
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if suffix.is_empty() || !suffix.chars().all(valid) {
        return Err(UriError::VendorName {
            attribute: cut(name),
        });
    }
    decode_text(component, name, raw)
}

fn insert_vendor(
    map: &mut BTreeMap<String, String>,
    name: &str,
    value: String,
) -> Result<(), UriError> {
    if map.contains_key(name) {
        return Err(UriError::Duplicate {
            attribute: name.to_owned(),
        });
    }
    map.insert(name.to_owned(), value);
    Ok(())
}

fn set<T>(slot: &mut Option<T>, name: &str, value: T) -> Result<(), UriError> {
    if slot.is_some() {
        return Err(UriError::Duplicate {
            attribute: name.to_owned(),
        });
    }
    *slot = Some(value);
    Ok(())
}

fn digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

fn bad_number(name: &str, value: &str, expected: &'static str) -> UriError {
    UriError::BadNumber {
        attribute: name.to_owned(),
        value: cut(value),
        expected,
    }
}

/// Percent-decodes a value, refusing a bad escape and a character the component allows only
/// encoded.
fn decode(component: Component, name: &str, raw: &str) -> Result<Vec<u8>, UriError> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        if byte == b'%' {
            let hex = |b: Option<&u8>| b.and_then(|b| char::from(*b).to_digit(16));
            match (hex(bytes.get(i + 1)), hex(bytes.get(i + 2))) {
                (Some(high), Some(low)) => {
                    out.push((high * 16 + low) as u8);
                    i += 3;
                }
                _ => {
                    return Err(UriError::BadEscape {
                        attribute: name.to_owned(),
                        escape: raw[i..].chars().take(3).collect(),
                    })
                }
            }
        } else if component.allows(byte) {
            out.push(byte);
            i += 1;
        } else {
            // `i` is at a character boundary: every byte before it was ASCII or an escape.
            let character = raw[i..]
                .chars()
                .next()
                .unwrap_or(char::REPLACEMENT_CHARACTER);
            let mut encoded = String::new();
            let mut utf8 = [0; 4];
            for b in character.encode_utf8(&mut utf8).bytes() {
                let _ = write!(encoded, "%{b:02X}");
            }
            return Err(UriError::Unencoded {
                attribute: name.to_owned(),
                character,
                encoded,
            });
        }
    }
    Ok(out)
}

fn decode_text(component: Component, name: &str, raw: &str) -> Result<String, UriError> {
    String::from_utf8(decode(component, name, raw)?).map_err(|_| UriError::NotUtf8 {
        attribute: name.to_owned(),
    })
}

/// At most [`ECHO_CHARS`] characters of `text`, for an error message.
fn cut(text: &str) -> String {
    match text.char_indices().nth(ECHO_CHARS) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_owned(),
    }
}

/// Writes `bytes` percent-encoding every byte `component` does not allow as is (all of them with
/// `all`).
fn encode(
    f: &mut fmt::Formatter<'_>,
    component: Component,
    bytes: &[u8],
    all: bool,
) -> fmt::Result {
    for &b in bytes {
        if !all && component.allows(b) {
            f.write_char(char::from(b))?;
        } else {
            write!(f, "%{b:02X}")?;
        }
    }
    Ok(())
}

impl fmt::Display for Pkcs11Uri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let slot_id = self.details.slot_id.map(|s| s.to_string());
        let path: [(&str, Option<&[u8]>); 13] = [
            ("token", self.token.as_deref().map(str::as_bytes)),
            (
                "manufacturer",
                self.details.manufacturer.as_deref().map(str::as_bytes),
            ),
            ("model", self.details.model.as_deref().map(str::as_bytes)),
            ("serial", self.details.serial.as_deref().map(str::as_bytes)),
            ("object", self.object.as_deref().map(str::as_bytes)),
            ("type", self.object_type.map(|t| t.as_str().as_bytes())),
            ("id", self.id.as_deref()),
            (
                "library-manufacturer",
                self.details
                    .library_manufacturer
                    .as_deref()
                    .map(str::as_bytes),
            ),
            (
                "library-description",
                self.details
                    .library_description
                    .as_deref()
                    .map(str::as_bytes),
            ),
            (
                "library-version",
                self.details.library_version.as_deref().map(str::as_bytes),
            ),
            ("slot-id", slot_id.as_deref().map(str::as_bytes)),
            (
                "slot-description",
                self.details.slot_description.as_deref().map(str::as_bytes),
            ),
            (
                "slot-manufacturer",
                self.details.slot_manufacturer.as_deref().map(str::as_bytes),
            ),
        ];
        let vendor_path = self
            .details
            .vendor_path
            .iter()
            .map(|(n, v)| (n.as_str(), Some(v.as_bytes())));
        f.write_str("pkcs11:")?;
        let mut first = true;
        for (name, value) in path.into_iter().chain(vendor_path) {
            let Some(value) = value else { continue };
            if !first {
                f.write_char(';')?;
            }
            first = false;
            write!(f, "{name}=")?;
            encode(f, Component::Path, value, name == "id")?;
        }
        let query = [
            ("module-name", self.details.module_name.as_deref()),
            ("module-path", self.details.module_path.as_deref()),
        ];
        let vendor_query = self
            .details
            .vendor_query
            .iter()
            .map(|(n, v)| (n.as_str(), Some(v.as_str())));
        let mut first = true;
        for (name, value) in query.into_iter().chain(vendor_query) {
            let Some(value) = value else { continue };
            f.write_char(if first { '?' } else { '&' })?;
            first = false;
            write!(f, "{name}=")?;
            encode(f, Component::Query, value.as_bytes(), false)?;
        }
        Ok(())
    }
}
