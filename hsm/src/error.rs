//! Why the token could not be used. Messages name the setting to check and never hold the PIN.

use std::path::PathBuf;

/// A failure of the token or of an operation in it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HsmError {
    /// The module could not be loaded or initialised.
    #[error("keystore.pkcs11.module {}: {reason}", module.display())]
    Module {
        /// The module's path.
        module: PathBuf,
        /// What failed.
        reason: String,
    },
    /// No token with the label is present.
    #[error(
        "keystore.pkcs11.token: no token labelled {label:?} is present{}",
        present_list(present)
    )]
    NoToken {
        /// The label looked for.
        label: String,
        /// The labels of the tokens present.
        present: Vec<String>,
    },
    /// The token refused the PIN.
    #[error("keystore.pkcs11.pinFile (or MESHCA_KEYSTORE_PKCS11_PIN): the token {label:?} refused the PIN")]
    WrongPin {
        /// The token's label.
        label: String,
    },
    /// The token locked its user PIN after too many failures.
    #[error("keystore.pkcs11.pinFile (or MESHCA_KEYSTORE_PKCS11_PIN): the token {label:?} has locked the user PIN \
             after too many wrong attempts; its security officer must unlock it")]
    PinLocked {
        /// The token's label.
        label: String,
    },
    /// The module is already open in this process for another token.
    #[error("keystore.pkcs11.module {}: already open in this process for the token {label:?}; one token per module",
            module.display())]
    AlreadyOpen {
        /// The module's path.
        module: PathBuf,
        /// The token it was opened for.
        label: String,
    },
    /// The token went away: nothing is signed until it answers again.
    #[error("the PKCS#11 token {label:?} does not answer ({reason}); no new certificate can be signed until it does")]
    Unavailable {
        /// The token's label.
        label: String,
        /// The failure that marked it down.
        reason: String,
    },
    /// No key matches.
    #[error("the PKCS#11 token {label:?} holds no {what}{}{}", object.as_ref().map(|o| format!(" labelled {o:?}")).unwrap_or_default(),
            id.as_ref().map(|i| format!(" with id {i}")).unwrap_or_default())]
    KeyNotFound {
        /// What was looked for: `private key` (a CA's) or `AES key` (the one that seals).
        what: &'static str,
        /// The token's label.
        label: String,
        /// The key label looked for.
        object: Option<String>,
        /// The key id looked for, hex.
        id: Option<String>,
    },
    /// More than one private key matches.
    #[error("the PKCS#11 token {label:?} holds {matches} private keys that match: name one by its id as well")]
    AmbiguousKey {
        /// The token's label.
        label: String,
        /// How many match.
        matches: usize,
    },
    /// The key in the token is not the certificate's.
    #[error(
        "the key {object:?} in the PKCS#11 token {label:?} is not the certificate's key: {reason}"
    )]
    KeyMismatch {
        /// The token's label.
        label: String,
        /// The key's label.
        object: String,
        /// How it differs.
        reason: String,
    },
    /// The token made a key whose public half cannot be read.
    #[error(
        "the PKCS#11 token made the key {label:?} but did not give its public key in a usable form"
    )]
    PublicKey {
        /// The key's label.
        label: String,
    },
    /// The token returned a signature of the wrong form.
    #[error("the PKCS#11 token returned a malformed signature for the key {label:?}")]
    BadSignature {
        /// The key's label.
        label: String,
    },
    /// A sealed value is malformed.
    #[error("the sealed value cannot be read: {0}")]
    Sealed(&'static str),
    /// The token did not open a sealed value.
    #[error("the PKCS#11 token {label:?} did not open the sealed key-encryption key ({reason}): it was sealed by another token's key, or changed")]
    Unseal {
        /// The token's label.
        label: String,
        /// The module's answer.
        reason: String,
    },
    /// The system's random source failed.
    #[error("the system's random source failed")]
    Random,
    /// Another PKCS#11 failure.
    #[error("PKCS#11, {what}: {error}")]
    Pkcs11 {
        /// What was being done.
        what: &'static str,
        /// The module's answer.
        #[source]
        error: cryptoki::error::Error,
    },
}

fn present_list(present: &[String]) -> String {
    if present.is_empty() {
        "; the module sees no initialised token".into()
    } else {
        format!("; the tokens present are {}", present.join(", "))
    }
}
