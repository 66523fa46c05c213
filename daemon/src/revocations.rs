//! The token revocation list file, `<dataDir>/revoked-tokens`: created with the token signing key, rewritten
//! atomically under a lock shared by every writer, and read fail-closed (a list that existed and is now
//! missing or invalid never means "nothing revoked").

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use meshca_auth::{AuthError, RevocationList};
use meshca_db::{DbError, TokenRevocations};

use crate::atomic_file::{replace_path, AtomicFileError};

/// Mode of the list: the daemon's user writes it, anyone who can reach the data directory may read it.
const LIST_MODE: u32 = 0o644;

/// The list file's name in the data directory.
pub const FILE_NAME: &str = "revoked-tokens";

/// The writers' lock beside it (the daemon creating the list, `meshca token --revoke`).
const LOCK_NAME: &str = "revoked-tokens.lock";

/// The largest list read: two million revoked tokens, each with the note `--revoke` writes.
const MAX_LIST_BYTES: u64 = 128 * 1024 * 1024;

/// Why the token revocation list could not be read, created or added to.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RevocationsError {
    /// The list is missing, but a token signing key exists: tokens revoked in it would be accepted
    /// again.
    #[error(
        "the token revocation list {path} is missing, but this data directory has a token signing key: every \
         token revoked in it would be accepted again. Restore it from a backup; or, to start with no revoked \
         tokens on purpose, create it empty (`touch {path}`)"
    )]
    Missing {
        /// The list.
        path: PathBuf,
    },
    /// The list could not be read.
    #[error("cannot read the token revocation list {path}: {error}")]
    Read {
        /// The list.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The list does not parse.
    #[error("the token revocation list {path} is invalid: {error}")]
    Invalid {
        /// The list.
        path: PathBuf,
        /// What is wrong, and on which line.
        error: AuthError,
    },
    /// The list could not be read to add an id to it.
    #[error("cannot read the token revocation list {path}")]
    ReadToRevoke {
        /// The list.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The list does not parse, so no id was added to it.
    #[error(
        "the token revocation list {path} is invalid, so nothing was revoked: {error}; fix that line first"
    )]
    InvalidToRevoke {
        /// The list.
        path: PathBuf,
        /// What is wrong, and on which line.
        error: AuthError,
    },
    /// The task reading the list failed.
    #[error("reading the token revocation list failed: {0}")]
    ReadTask(tokio::task::JoinError),
    /// The database's revoked tokens could not be read.
    #[error("{0}")]
    Database(DbError),
    /// The database holds something that is not a token id.
    #[error("the database's revoked tokens (table meshca_revoked_tokens) are invalid: {0}")]
    InvalidInDatabase(AuthError),
    /// The writers' lock file could not be opened.
    #[error("cannot open {path}")]
    OpenLock {
        /// The lock file.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The writers' lock could not be taken.
    #[error("cannot lock {path}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Whether the list exists could not be found out.
    #[error("cannot inspect {path}")]
    Inspect {
        /// The list.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The list could not be written.
    #[error(transparent)]
    Write(#[from] AtomicFileError),
}

/// What [`revoke`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revoked {
    /// The id was added.
    Added,
    /// The id was on the list already; the file is unchanged.
    Already,
}

/// Reads and parses the list. Missing, unreadable and invalid are all errors naming the file: the caller
/// keeps what it had (a running daemon) or stops (a starting one).
pub(crate) fn read(path: &Path) -> Result<RevocationList, RevocationsError> {
    let text = read_text(path).map_err(|error| match error.kind() {
        std::io::ErrorKind::NotFound => RevocationsError::Missing {
            path: path.to_owned(),
        },
        _ => RevocationsError::Read {
            path: path.to_owned(),
            error,
        },
    })?;
    RevocationList::parse(&text).map_err(|error| RevocationsError::Invalid {
        path: path.to_owned(),
        error,
    })
}

/// Creates the list, empty with its explanatory header, unless it exists. Called whenever the token
/// signing key is about to be created, so that a data directory with a key always has a list and a
/// missing list is a loss, never a fresh start.
pub(crate) fn create_if_missing(path: &Path) -> Result<(), RevocationsError> {
    let _lock = lock(path)?;
    if path_exists(path)? {
        return Ok(());
    }
    replace_path(path, RevocationList::EMPTY_FILE.as_bytes(), LIST_MODE)?;
    tracing::info!(file = %path.display(), "created the empty token revocation list");
    Ok(())
}

/// Adds `id` to the list: reads and parses the current list (an invalid one is refused, naming its line),
/// adds the id on its own line and replaces the file atomically, all under the writers' lock.
///
/// A missing list is created when `key_exists` is false (no token was ever minted here); otherwise it is
/// an error, since writing a list with only this id would un-revoke every token of the lost one.
pub fn revoke(path: &Path, id: &str, key_exists: bool) -> crate::Result<Revoked> {
    Ok(add(path, id, key_exists)?)
}

/// [`revoke`], inside the library.
fn add(path: &Path, id: &str, key_exists: bool) -> Result<Revoked, RevocationsError> {
    let _lock = lock(path)?;
    let text = match read_text(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !key_exists => {
            RevocationList::EMPTY_FILE.to_owned()
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(RevocationsError::Missing {
                path: path.to_owned(),
            })
        }
        Err(source) => {
            return Err(RevocationsError::ReadToRevoke {
                path: path.to_owned(),
                source,
            })
        }
    };
    let note = format!("revoked {}", meshca_control::rfc3339(SystemTime::now()));
    let updated = RevocationList::add_to_file(&text, id, &note).map_err(|error| {
        RevocationsError::InvalidToRevoke {
            path: path.to_owned(),
            error,
        }
    })?;
    match updated {
        None => Ok(Revoked::Already),
        Some(text) => {
            replace_path(path, text.as_bytes(), LIST_MODE)?;
            Ok(Revoked::Added)
        }
    }
}

/// Where the revoked tokens are kept: the data directory's file, or the database replicas share.
#[derive(Clone, Debug)]
pub(crate) enum Source {
    /// `<dataDir>/revoked-tokens`, re-read when it changes.
    File(PathBuf),
    /// The database's table, read every [`DATABASE_POLL`].
    Database(TokenRevocations),
}

/// How often a replica reads the database's revoked tokens: a token revoked on one replica is refused
/// by all within about this long.
pub const DATABASE_POLL: std::time::Duration = std::time::Duration::from_secs(1);

impl Source {
    /// Reads the list. Every failure is an error: the caller keeps what it had, or does not start.
    pub(crate) async fn read(&self) -> Result<RevocationList, RevocationsError> {
        match self {
            // Off the runtime's threads: a file read can take as long as the disk does.
            Source::File(path) => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || read(&path))
                    .await
                    .map_err(RevocationsError::ReadTask)?
            }
            Source::Database(revocations) => {
                let ids = revocations
                    .ids()
                    .await
                    .map_err(RevocationsError::Database)?;
                from_ids(&ids)
            }
        }
    }
}

/// The list of the database's ids; an id that is not one (a row written by hand) refuses the whole
/// list, naming it.
fn from_ids(ids: &[String]) -> Result<RevocationList, RevocationsError> {
    RevocationList::parse(&ids.join("\n")).map_err(RevocationsError::InvalidInDatabase)
}

/// The list's text: a regular file (a FIFO or a device put in its place is refused without blocking)
/// of at most [`MAX_LIST_BYTES`].
fn read_text(path: &Path) -> std::io::Result<String> {
    meshca_files::read_text(path, MAX_LIST_BYTES, "the largest token revocation list")
}

/// Takes the writers' lock of the list at `path` (waiting for it); released when the file is dropped.
fn lock(path: &Path) -> Result<File, RevocationsError> {
    let lock_path = lock_path(path);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|source| RevocationsError::OpenLock {
            path: lock_path.clone(),
            source,
        })?;
    file.lock().map_err(|source| RevocationsError::Lock {
        path: lock_path,
        source,
    })?;
    Ok(file)
}

fn lock_path(path: &Path) -> PathBuf {
    path.with_file_name(LOCK_NAME)
}

fn path_exists(path: &Path) -> Result<bool, RevocationsError> {
    path.try_exists()
        .map_err(|source| RevocationsError::Inspect {
            path: path.to_owned(),
            source,
        })
}

impl From<RevocationsError> for crate::Error {
    fn from(error: RevocationsError) -> crate::Error {
        crate::Error::failed(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "0123456789abcdef0123456789abcdef";
    const B: &str = "fedcba9876543210fedcba9876543210";

    fn list_in(dir: &tempfile::TempDir) -> PathBuf {
        dir.path().join(FILE_NAME)
    }

    #[test]
    fn revoking_into_a_file_without_a_final_newline_keeps_both_ids() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = list_in(&dir);
        std::fs::write(&path, A).expect("writable");
        assert_eq!(revoke(&path, B, true).expect("revokes"), Revoked::Added);
        let list = read(&path).expect("the rewritten list is valid");
        assert!(list.contains(A) && list.contains(B), "{list:?}");
        assert_eq!(
            revoke(&path, B, true).expect("revoking twice is fine"),
            Revoked::Already
        );
        assert_eq!(read(&path).expect("valid"), list);
    }

    #[test]
    fn an_invalid_list_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = list_in(&dir);
        let invalid = format!("{A}\nnot-an-id\n");
        std::fs::write(&path, &invalid).expect("writable");
        let message = format!("{:#}", revoke(&path, B, true).expect_err("refused"));
        assert!(
            message.contains(&path.display().to_string()) && message.contains("line 2"),
            "{message}"
        );
        assert_eq!(std::fs::read_to_string(&path).expect("readable"), invalid);
    }

    #[test]
    fn a_missing_list_is_created_only_where_no_token_key_exists() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = list_in(&dir);
        let message = format!("{:#}", revoke(&path, A, true).expect_err("refused"));
        assert!(
            message.contains("is missing")
                && message.contains(&format!("touch {}", path.display())),
            "{message}"
        );
        assert!(!path.exists(), "no list with only the new id");
        assert!(read(&path).is_err(), "reading a missing list is an error");

        assert_eq!(revoke(&path, A, false).expect("revokes"), Revoked::Added);
        let text = std::fs::read_to_string(&path).expect("created");
        assert!(text.starts_with(RevocationList::EMPTY_FILE), "{text}");
        assert!(read(&path).expect("valid").contains(A));
    }

    #[test]
    fn create_if_missing_writes_the_header_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = list_in(&dir);
        create_if_missing(&path).expect("creates");
        assert!(read(&path).expect("valid").is_empty());
        revoke(&path, A, true).expect("revokes");
        create_if_missing(&path).expect("finds it");
        assert!(read(&path).expect("valid").contains(A), "never overwritten");
    }

    #[test]
    fn concurrent_revocations_all_land() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = list_in(&dir);
        create_if_missing(&path).expect("creates");
        let ids: Vec<String> = (0..8).map(|i| format!("{i:032x}")).collect();
        std::thread::scope(|scope| {
            for id in &ids {
                let path = &path;
                scope.spawn(move || revoke(path, id, true).expect("revokes"));
            }
        });
        let list = read(&path).expect("valid");
        assert_eq!(list.len(), ids.len(), "no revocation was lost: {list:?}");
    }
}
