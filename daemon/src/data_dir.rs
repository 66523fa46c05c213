//! The data directory: created private, refused when others can write into it, and held by one daemon
//! at a time.

use std::fs::{DirBuilder, File, OpenOptions, Permissions, TryLockError};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use meshca_keystore::{crash_point, FileKeystore};

/// Mode of a data directory meshca creates.
const DIR_MODE: u32 = 0o700;

/// The file a running daemon holds locked; it records the daemon's pid.
const DAEMON_LOCK: &str = "daemon.lock";

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
    pub(crate) fn open(path: &Path) -> anyhow::Result<DataDir> {
        if !path.exists() {
            create_private(path)?;
        }
        let meta = std::fs::metadata(path)
            .with_context(|| format!("dataDir: cannot read {}", path.display()))?;
        if !meta.is_dir() {
            return Err(anyhow!("dataDir: {} is not a directory", path.display()));
        }
        let mode = meta.mode() & 0o7777;
        if mode & 0o022 != 0 {
            return Err(anyhow!(
                "dataDir: {path} has mode {mode:04o}: other users can write into it and could replace the token \
                 revocation list, sds-ca.pem or the SDS socket; make it private with `chmod 700 {path}` (or 750 \
                 when a group must reach the SDS socket in it)",
                path = path.display()
            ));
        }
        Ok(DataDir { path: path.into() })
    }

    /// The token revocation list in it (`revoked-tokens`).
    pub fn revocation_list(&self) -> PathBuf {
        self.path.join(super::revocations::FILE_NAME)
    }

    /// The keystore in it (`keystore/`).
    pub(crate) fn keystore(&self) -> anyhow::Result<FileKeystore> {
        FileKeystore::open(&self.path.join("keystore")).with_context(|| {
            format!(
                "dataDir: cannot open the keystore in {}",
                self.path.display()
            )
        })
    }

    /// Takes the daemon's lock on the directory, without waiting: a second daemon on the same data
    /// directory fails here, naming the first one's pid. The lock lasts as long as the returned value.
    pub(crate) fn lock_for_daemon(&self) -> anyhow::Result<DaemonLock> {
        let path = self.path.join(DAEMON_LOCK);
        crash_point(format_args!("open {}", path.display()));
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("cannot open the daemon lock {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                // The holder may not have written its pid yet; the message then goes without it.
                let _ = file.read_to_string(&mut text);
                let holder = match text.trim().parse::<u32>() {
                    Ok(pid) => format!("another meshca daemon (pid {pid})"),
                    Err(_) => "another meshca daemon".to_owned(),
                };
                return Err(anyhow!(
                    "{holder} is already running on the data directory {dir} (it holds {lock}); two daemons \
                     on one data directory would each generate and serve their own keys. Stop the other \
                     daemon, or give this one its own dataDir",
                    dir = self.path.display(),
                    lock = path.display()
                ));
            }
            Err(TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("cannot lock {}", path.display()))
            }
        }
        let pid = std::process::id();
        crash_point(format_args!("write the pid into {}", path.display()));
        file.set_len(0)
            .and_then(|_| file.rewind())
            .and_then(|_| writeln!(file, "{pid}"))
            .with_context(|| format!("cannot write {}", path.display()))?;
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
fn create_private(path: &Path) -> anyhow::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("dataDir: cannot create {}", parent.display()))?;
    }
    crash_point(format_args!("create directory {}", path.display()));
    match DirBuilder::new().mode(DIR_MODE).create(path) {
        Ok(()) => std::fs::set_permissions(path, Permissions::from_mode(DIR_MODE))
            .with_context(|| format!("dataDir: cannot set the mode of {}", path.display())),
        // Created by another process in between; checked like any existing directory.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e).with_context(|| format!("dataDir: cannot create {}", path.display())),
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
