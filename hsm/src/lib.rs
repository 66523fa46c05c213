//! CA keys, and the key that seals the database's secrets, held in a PKCS#11 token: a hardware security
//! module, a cloud HSM's PKCS#11 library, or SoftHSM2 for a trial.
//!
//! The vendor's module is loaded at run time (nothing is linked). [`Token`] opens one token by its
//! label and logs in; keys made in it are sensitive and never extractable, and everything meshca does
//! with them (sign a certificate, seal or unseal the database's data key) happens inside the token.
//! A key is named in the keystore and in resources by an RFC 7512 `pkcs11:` URI.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod der;
mod error;
mod key;
mod module_file;
mod pending;
mod seal;
mod token;
mod uri;

pub use error::HsmError;
pub use key::{p256_public_key_from_pem, KeySelector, TokenKey};
pub use pending::{Settled, ABANDONED_AFTER};
pub use seal::SEALING_KEY_LABEL;
pub use token::{Token, TokenStatus};
pub use uri::{ObjectType, Pkcs11Uri, UriError};
