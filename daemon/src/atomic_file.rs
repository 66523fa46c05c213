//! Replacing a file atomically, safe in a directory others could write.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use meshca_keystore::crash_point;

/// Why a file could not be replaced; the target is untouched.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AtomicFileError {
    /// No random name for the temporary file.
    #[error("the system's random source failed")]
    RandomSource,
    /// The temporary file could not be created.
    #[error("cannot create {path}")]
    Create {
        /// The temporary file.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The temporary file could not be written, synced or renamed over the target.
    #[error("cannot replace {path}")]
    Replace {
        /// The target.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The directory could not be synced after the rename.
    #[error("cannot sync {path}")]
    SyncDir {
        /// The directory.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The path given names no file in a directory.
    #[error("{path} is not a file path")]
    NotAFilePath {
        /// The path given.
        path: PathBuf,
    },
}

/// Writes `data` to `dir/name` atomically: a temporary file with a random name, created exclusively
/// (never an existing file, never through a symlink) with `mode` from the start, written, synced, then
/// renamed over the target, and the directory synced. A reader sees the old or the new file, never a mix;
/// on failure the target is untouched and the temporary file removed.
pub fn write_atomic(dir: &Path, name: &str, data: &[u8], mode: u32) -> crate::Result<()> {
    Ok(replace(dir, name, data, mode)?)
}

/// [`write_atomic`], inside the library.
pub(crate) fn replace(
    dir: &Path,
    name: &str,
    data: &[u8],
    mode: u32,
) -> Result<(), AtomicFileError> {
    let target = dir.join(name);
    let tmp = dir.join(format!(".{name}.{}.tmp", random_suffix()?));
    crash_point(format_args!("create {}", tmp.display()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(|source| AtomicFileError::Create {
            path: tmp.clone(),
            source,
        })?;
    crash_point(format_args!("write {}", tmp.display()));
    let written = f.write_all(data).and_then(|_| f.sync_all()).and_then(|_| {
        crash_point(format_args!(
            "rename {} to {}",
            tmp.display(),
            target.display()
        ));
        std::fs::rename(&tmp, &target)
    });
    if let Err(source) = written {
        // Nothing half-written is left behind.
        let _ = std::fs::remove_file(&tmp);
        return Err(AtomicFileError::Replace {
            path: target,
            source,
        });
    }
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| AtomicFileError::SyncDir {
            path: dir.to_owned(),
            source,
        })
}

/// Writes `data` to `path` atomically (see [`write_atomic`]).
pub fn write_atomic_path(path: &Path, data: &[u8], mode: u32) -> crate::Result<()> {
    Ok(replace_path(path, data, mode)?)
}

/// [`write_atomic_path`], inside the library.
pub(crate) fn replace_path(path: &Path, data: &[u8], mode: u32) -> Result<(), AtomicFileError> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Err(AtomicFileError::NotAFilePath {
            path: path.to_owned(),
        });
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    replace(dir, name, data, mode)
}

/// How old a temporary file must be to be taken for one a killed writer left: a write takes
/// milliseconds, so one this old is no other process's write in progress.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Removes from `dir` the temporary files of [`write_atomic`] that a writer killed between creating and
/// renaming them left behind (`.<name>.<16 hex digits>.tmp`, last modified over a minute ago), each
/// logged; returns how many. Nothing else is touched, and a file that cannot be removed is logged and
/// left: a start never fails for it.
pub fn remove_stale_temps(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let now = std::time::SystemTime::now();
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !is_temp_name(name) {
            continue;
        }
        let Ok(metadata) = entry.metadata() else {
            continue;
        };
        let old = metadata
            .modified()
            .ok()
            .and_then(|modified| now.duration_since(modified).ok())
            .is_some_and(|age| age >= STALE_AFTER);
        if !metadata.is_file() || !old {
            continue;
        }
        match std::fs::remove_file(entry.path()) {
            Ok(()) => {
                removed += 1;
                tracing::info!(file = %entry.path().display(), "removed a temporary file an interrupted write left");
            }
            Err(error) => {
                tracing::warn!(file = %entry.path().display(), %error, "cannot remove a temporary file an interrupted write left");
            }
        }
    }
    removed
}

/// Whether `name` is one [`write_atomic`] gives its temporary files: `.<name>.<16 hex digits>.tmp`.
fn is_temp_name(name: &str) -> bool {
    let Some(rest) = name
        .strip_prefix('.')
        .and_then(|rest| rest.strip_suffix(".tmp"))
    else {
        return false;
    };
    match rest.rsplit_once('.') {
        Some((target, suffix)) => {
            !target.is_empty()
                && suffix.len() == 16
                && suffix
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        }
        None => false,
    }
}

/// 16 random hex digits for a temporary file's name.
fn random_suffix() -> Result<String, AtomicFileError> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 8];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| AtomicFileError::RandomSource)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl From<AtomicFileError> for crate::Error {
    fn from(error: AtomicFileError) -> crate::Error {
        crate::Error::failed(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn age(path: &Path, seconds: u64) {
        let when = std::time::SystemTime::now() - std::time::Duration::from_secs(seconds);
        std::fs::File::options()
            .write(true)
            .open(path)
            .expect("opening")
            .set_times(std::fs::FileTimes::new().set_modified(when))
            .expect("setting its time");
    }

    #[test]
    fn only_old_temporary_files_of_this_writer_are_removed() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let stale = dir.path().join(".revoked-tokens.0123456789abcdef.tmp");
        let fresh = dir.path().join(".sds-ca.pem.fedcba9876543210.tmp");
        let others = [
            "revoked-tokens",
            ".revoked-tokens.0123456789ABCDEF.tmp",
            ".revoked-tokens.0123.tmp",
            "x.0123456789abcdef.tmp",
            "..0123456789abcdef.tmp",
        ];
        for path in [&stale, &fresh] {
            std::fs::write(path, b"cut").expect("writing");
        }
        for other in others {
            let path = dir.path().join(other);
            std::fs::write(&path, b"keep").expect("writing");
            age(&path, 3600);
        }
        age(&stale, 3600);
        write_atomic(dir.path(), "target", b"whole", 0o600).expect("a write");
        assert_eq!(remove_stale_temps(dir.path()), 1);
        assert!(!stale.exists());
        assert!(fresh.exists(), "a write that may be in progress is left");
        for other in others {
            assert!(dir.path().join(other).exists(), "{other}");
        }
        assert_eq!(
            std::fs::read(dir.path().join("target")).expect("read"),
            b"whole"
        );
    }
}
