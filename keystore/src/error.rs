//! The one error type of this crate.

use std::io;
use std::path::PathBuf;

/// Why a keystore operation failed. Messages name the path or entry and never contain stored bytes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeystoreError {
    /// An entry name is not a valid relative slash path of `[A-Za-z0-9._-]` segments.
    #[error("invalid keystore entry name {name}: {reason}")]
    InvalidName {
        /// The rejected name, escaped and truncated.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A secret file can be read by users other than its owner; it is refused, never used.
    #[error(
        "{} has mode {mode:04o}, but a secret must be accessible by its owner only (0600): \
         check whether anyone else read it, then `chmod 600` it", path.display()
    )]
    InsecurePermissions {
        /// The secret file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A path that must be a regular file is something else (a directory, a device, ...).
    #[error("{} is not a regular file", path.display())]
    NotAFile {
        /// The offending path.
        path: PathBuf,
    },
    /// A path that must be a directory is something else.
    #[error("{} is not a directory", path.display())]
    NotADirectory {
        /// The offending path.
        path: PathBuf,
    },
    /// Some entries of a group that is created together exist and others do not, and no interrupted
    /// creation explains it (see [`crate::Keystore::create_if_absent`]): a file was removed or lost.
    /// Nothing was written.
    #[error(
        "the keystore holds {} but not {}, and no creation was interrupted there: a file was removed or lost; \
         restore the missing entries from a backup, or remove the others to have them created anew",
        present.join(", "), missing.join(", ")
    )]
    PartlyPresent {
        /// The entries that exist.
        present: Vec<String>,
        /// The entries that do not.
        missing: Vec<String>,
    },
    /// The creation journal does not list entry names: it was not written by meshca.
    #[error(
        "{} is not a creation journal meshca wrote (a line is not an entry name); it was edited by hand: \
         restore it, or remove it to leave the entries it named as they are",
        path.display()
    )]
    Journal {
        /// The journal file.
        path: PathBuf,
    },
    /// A database keystore could not do what was asked (the message names the operation and the cause).
    #[error("{0}")]
    Database(String),
    /// A secret's stored value does not open with the key-encryption key: it was sealed with another
    /// key or for another entry, or changed.
    #[error(
        "keystore entry {name} does not open with the key-encryption key: it was written with another \
         key, moved from another entry, or changed; restore it from a backup"
    )]
    Unsealable {
        /// The entry.
        name: String,
    },
    /// A database keystore holds a row for the entry that fails its authentication (changed, moved from
    /// another entry, written by hand, or an older copy put back); it is refused, never used.
    #[error("{message}")]
    Refused {
        /// The entry.
        name: String,
        /// What the database layer said, naming the entry and why.
        message: String,
    },
    /// An entry was read as the other kind: a secret as public data, or public data as a secret.
    #[error("keystore entry {name} holds {stored}, not {asked}")]
    WrongKind {
        /// The entry.
        name: String,
        /// What it holds (`a secret` or `public data`).
        stored: &'static str,
        /// What was asked for.
        asked: &'static str,
    },
    /// A filesystem operation failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done (`read`, `create directory`, `rename temporary file over`, ...).
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
}

impl KeystoreError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| KeystoreError::Io {
            action,
            path,
            source,
        }
    }
}
