//! The data directory: created private, refused when others can write into it, and held by one daemon
//! at a time.

use std::fs::{DirBuilder, File, OpenOptions, Permissions, TryLockError};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use meshca_keystore::{crash_point, FileKeystore, KeystoreError};

/// Mode of a data directory meshca creates.
const DIR_MODE: u32 = 0o700;

/// The file a running daemon holds locked; it records the daemon's pid.
const DAEMON_LOCK: &str = "daemon.lock";

/// Why the data directory could not be opened, or held for the daemon.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DataDirError {
    /// The directory could not be created (or a parent of it).
    #[error("dataDir: cannot create {path}")]
    Create {
        /// The directory.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The mode of the directory just created could not be set.
    #[error("dataDir: cannot set the mode of {path}")]
    SetMode {
        /// The directory.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The directory could not be inspected.
    #[error("dataDir: cannot read {path}")]
    Read {
        /// The directory.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Something other than a directory is there.
    #[error("dataDir: {path} is not a directory")]
    NotADirectory {
        /// The path of `dataDir`.
        path: PathBuf,
    },
    /// Group or others can write into the directory.
    #[error(
        "dataDir: {path} has mode {mode:04o}: other users can write into it and could replace the token \
         revocation list, sds-ca.pem or the SDS socket; make it private with `chmod 700 {path}` (or 750 \
         when a group must reach the SDS socket in it)"
    )]
    WritableByOthers {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The keystore in the directory could not be opened.
    #[error("dataDir: cannot open the keystore in {path}")]
    Keystore {
        /// The data directory.
        path: PathBuf,
        #[source]
        source: KeystoreError,
    },
    /// The daemon's lock file could not be opened.
    #[error("cannot open the daemon lock {path}")]
    OpenLock {
        /// The lock file.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Another daemon holds the lock.
    #[error(
        "{holder} is already running on the data directory {dir} (it holds {lock}); two daemons \
         on one data directory would each generate and serve their own keys. Stop the other \
         daemon, or give this one its own dataDir",
        holder = holder(.pid)
    )]
    Locked {
        /// The data directory.
        dir: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// The holder's pid, when it wrote it already.
        pid: Option<u32>,
    },
    /// The lock could not be taken for another reason than another daemon holding it.
    #[error("cannot lock {path}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// This daemon's pid could not be written into the lock file.
    #[error("cannot write {path}")]
    WritePid {
        /// The lock file.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Who holds the daemon's lock, as [`DataDirError::Locked`] says it.
fn holder(pid: &Option<u32>) -> String {
    match pid {
        Some(pid) => format!("another meshca daemon (pid {pid})"),
        None => "another meshca daemon".to_owned(),
    }
}

/// A data directory that exists and that only its owner can write into.
#[derive(Clone, Debug)]
pub struct DataDir {
    path: PathBuf,
}

impl DataDir {
    /// Creates the data directory with mode 0700 (missing parents get the default mode), or checks an
    /// existing one: it must be a directory that neither group nor others can write, since whoever can
    /// could replace the revocation list, `sds-ca.pem` or the SDS socket in it. Group or world read and
    /// search are allowed (a group that must reach the SDS socket in it needs search).
    pub(crate) fn open(path: &Path) -> Result<DataDir, DataDirError> {
        if !path.exists() {
            create_private(path)?;
        }
        let meta = std::fs::metadata(path).map_err(|source| DataDirError::Read {
            path: path.to_owned(),
            source,
        })?;
        if !meta.is_dir() {
            return Err(DataDirError::NotADirectory {
                path: path.to_owned(),
            });
        }
        let mode = meta.mode() & 0o7777;
        if mode & 0o022 != 0 {
            return Err(DataDirError::WritableByOthers {
                path: path.to_owned(),
                mode,
            });
        }
        Ok(DataDir { path: path.into() })
    }

    /// The token revocation list in it (`revoked-tokens`).
    pub fn revocation_list(&self) -> PathBuf {
        self.path.join(super::revocations::FILE_NAME)
    }

    /// The keystore in it (`keystore/`).
    pub(crate) fn keystore(&self) -> Result<FileKeystore, DataDirError> {
        FileKeystore::open(&self.path.join("keystore")).map_err(|source| DataDirError::Keystore {
            path: self.path.clone(),
            source,
        })
    }

    /// Takes the daemon's lock on the directory, without waiting: a second daemon on the same data
    /// directory fails here, naming the first one's pid. The lock lasts as long as the returned value.
    pub(crate) fn lock_for_daemon(&self) -> Result<DaemonLock, DataDirError> {
        let path = self.path.join(DAEMON_LOCK);
        crash_point(format_args!("open {}", path.display()));
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|source| DataDirError::OpenLock {
                path: path.clone(),
                source,
            })?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                // The holder may not have written its pid yet; the message then goes without it.
                let _ = file.read_to_string(&mut text);
                return Err(DataDirError::Locked {
                    dir: self.path.clone(),
                    lock: path,
                    pid: text.trim().parse::<u32>().ok(),
                });
            }
            Err(TryLockError::Error(source)) => return Err(DataDirError::Lock { path, source }),
        }
        let pid = std::process::id();
        crash_point(format_args!("write the pid into {}", path.display()));
        file.set_len(0)
            .and_then(|_| file.rewind())
            .and_then(|_| writeln!(file, "{pid}"))
            .map_err(|source| DataDirError::WritePid { path, source })?;
        Ok(DaemonLock { _file: file })
    }
}

/// The running daemon's exclusive hold on its data directory; released when dropped (or when the process
/// ends, however it ends).
#[derive(Debug)]
pub struct DaemonLock {
    _file: File,
}

/// Creates `path` with mode 0700 exactly (the umask can only narrow it; it is set again after).
fn create_private(path: &Path) -> Result<(), DataDirError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|source| DataDirError::Create {
            path: parent.to_owned(),
            source,
        })?;
    }
    crash_point(format_args!("create directory {}", path.display()));
    match DirBuilder::new().mode(DIR_MODE).create(path) {
        Ok(()) => {
            std::fs::set_permissions(path, Permissions::from_mode(DIR_MODE)).map_err(|source| {
                DataDirError::SetMode {
                    path: path.to_owned(),
                    source,
                }
            })
        }
        // Created by another process in between; checked like any existing directory.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(DataDirError::Create {
            path: path.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).expect("exists").mode() & 0o7777
    }

    #[test]
    fn a_new_data_directory_is_private() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let path = tmp.path().join("a/b/data");
        DataDir::open(&path).expect("created");
        assert_eq!(mode(&path), 0o700);
    }

    #[test]
    fn a_directory_others_can_write_is_refused() {
        let tmp = tempfile::tempdir().expect("temp dir");
        for (bits, refused) in [
            (0o777, true),
            (0o1777, true),
            (0o770, true),
            (0o702, true),
            (0o755, false),
            (0o750, false),
            (0o700, false),
        ] {
            let path = tmp.path().join(format!("data-{bits:o}"));
            std::fs::create_dir(&path).expect("mkdir");
            std::fs::set_permissions(&path, Permissions::from_mode(bits)).expect("chmod");
            match DataDir::open(&path) {
                Ok(_) => assert!(!refused, "{bits:04o} was accepted"),
                Err(e) => {
                    assert!(refused, "{bits:04o} was refused: {e:#}");
                    let message = format!("{e:#}");
                    assert!(
                        message.contains(&path.display().to_string())
                            && message.contains(&format!("{bits:04o}"))
                            && message.contains("chmod 700"),
                        "{message}"
                    );
                }
            }
            assert_eq!(mode(&path), bits, "the mode is left as the operator set it");
        }
    }

    #[test]
    fn a_second_lock_is_refused_naming_the_holder_until_the_first_is_dropped() {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = DataDir::open(tmp.path()).expect("opens");
        let first = dir.lock_for_daemon().expect("the first daemon locks");
        let message = format!(
            "{:#}",
            dir.lock_for_daemon()
                .expect_err("a second daemon is refused")
        );
        assert!(
            message.contains(&format!("pid {}", std::process::id()))
                && message.contains(&tmp.path().display().to_string()),
            "{message}"
        );
        drop(first);
        dir.lock_for_daemon()
            .expect("the lock is free once its holder is gone");
    }
}
