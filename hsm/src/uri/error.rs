//! Why a text is not a `pkcs11:` URI meshca accepts.

use std::fmt;

use super::MAX_URI_BYTES;

/// What the PIN refusal says, for `pin-value` and `pin-source` alike.
const PIN_REFUSED: &str = "a PIN in the URI is refused: meshca takes the PIN from \
keystore.pkcs11.pinFile or MESHCA_KEYSTORE_PKCS11_PIN";

/// Why a text is not a `pkcs11:` URI meshca accepts. Each error names the attribute at fault, where
/// there is one; none quotes a PIN.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UriError {
    /// The text does not start with `pkcs11:`.
    #[error("not a PKCS#11 URI: it must start with \"pkcs11:\", not {found:?}")]
    Scheme {
        /// The start of the text (cut).
        found: String,
    },
    /// The text, or its canonical form, is longer than 4 KiB.
    #[error("a pkcs11: URI of {len} bytes (as given, or written canonically with id percent-encoded byte by byte); at most {MAX_URI_BYTES} are accepted")]
    TooLong {
        /// Its length in bytes, as given or in canonical form.
        len: usize,
    },
    /// An attribute with no name: `;;`, a trailing `;`, or `=value` alone.
    #[error("the {} {component} attribute has an empty name (look for ';;', '&&', a trailing separator or a lone '=')", Ordinal(*position))]
    EmptyName {
        /// `path` or `query`.
        component: &'static str,
        /// Which attribute of its component, 1-based.
        position: usize,
    },
    /// An attribute with no `=`.
    #[error("attribute {attribute:?} has no '=': attributes are name=value")]
    MissingValue {
        /// The attribute's name.
        attribute: String,
    },
    /// An attribute given twice.
    #[error("attribute {attribute:?} is given twice")]
    Duplicate {
        /// The attribute's name.
        attribute: String,
    },
    /// An attribute RFC 7512 does not define in this component, and not a vendor `x-` one.
    #[error("unknown {component} attribute {attribute:?}; the {component} attributes are {known} (and vendor attributes x-...)")]
    UnknownAttribute {
        /// `path` or `query`.
        component: &'static str,
        /// The attribute's name (cut).
        attribute: String,
        /// The names this component accepts.
        known: &'static str,
    },
    /// A vendor attribute whose name is `x-` without letters, digits, `-` or `_` after it.
    #[error("vendor attribute {attribute:?}: the name must be x- followed by letters, digits, '-' or '_'")]
    VendorName {
        /// The attribute's name (cut).
        attribute: String,
    },
    /// A `type` other than RFC 7512's five.
    #[error("attribute \"type\": {value:?} is not an object type; one of private, public, cert, secret-key, data")]
    UnknownType {
        /// The value given (cut).
        value: String,
    },
    /// A `%` not followed by two hex digits.
    #[error("attribute {attribute:?}: {escape:?} is not a percent-escape (% and two hex digits)")]
    BadEscape {
        /// The attribute's name.
        attribute: String,
        /// The `%` and what follows it (up to two characters).
        escape: String,
    },
    /// A character that RFC 7512 allows only percent-encoded.
    #[error(
        "attribute {attribute:?}: the character {character:?} must be percent-encoded ({encoded})"
    )]
    Unencoded {
        /// The attribute's name.
        attribute: String,
        /// The character.
        character: char,
        /// Its UTF-8 bytes percent-encoded.
        encoded: String,
    },
    /// A value other than `id` that is not UTF-8 once decoded.
    #[error("attribute {attribute:?}: the decoded value is not UTF-8 text")]
    NotUtf8 {
        /// The attribute's name.
        attribute: String,
    },
    /// A `slot-id` or `library-version` that is not a number of the form RFC 7512 gives.
    #[error("attribute {attribute:?}: {value:?} is not {expected}")]
    BadNumber {
        /// The attribute's name.
        attribute: String,
        /// The value given (cut).
        value: String,
        /// What the attribute takes.
        expected: &'static str,
    },
    /// `pin-value` or `pin-source`.
    #[error("attribute {attribute:?}: {PIN_REFUSED}")]
    Pin {
        /// `pin-value` or `pin-source`.
        attribute: &'static str,
    },
}

/// A 1-based position, displayed as an English ordinal (`1st`, `2nd`, `11th`).
pub(super) struct Ordinal(pub(super) usize);

impl fmt::Display for Ordinal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        let suffix = match (n % 10, n % 100) {
            (_, 11..=13) => "th",
            (1, _) => "st",
            (2, _) => "nd",
            (3, _) => "rd",
            _ => "th",
        };
        write!(f, "{n}{suffix}")
    }
}
