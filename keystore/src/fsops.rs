//! The filesystem steps behind [`crate::FileKeystore`]: atomic replace, private directories, checked reads.

use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use zeroize::Zeroizing;

use crate::crash::crash_point;
use crate::error::KeystoreError;

/// Mode of every directory in the keystore.
pub(crate) const DIR_MODE: u32 = 0o700;
/// Mode of secret files.
pub(crate) const SECRET_MODE: u32 = 0o600;
/// Mode of public files.
pub(crate) const PUBLIC_MODE: u32 = 0o644;

/// Bookkeeping files start with this; `#` is not a name character, so they never look like entries.
const BOOKKEEPING_MARKER: &str = ".#";
/// The largest entry read: keys, certificates and state are kilobytes; a larger file is not one of ours.
const MAX_ENTRY_BYTES: u64 = 64 * 1024 * 1024;
const TEMP_SUFFIX: &str = ".tmp";

/// A temporary file name next to `file_name`: `.#<file_name>.<pid>.<counter>.tmp`.
fn temp_name(file_name: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "{BOOKKEEPING_MARKER}{file_name}.{}.{n}{TEMP_SUFFIX}",
        std::process::id()
    )
}

/// Whether a directory entry is a temporary file; with `for_file`, one written for that target.
pub(crate) fn is_temp(entry: &str, for_file: Option<&str>) -> bool {
    let Some(rest) = entry
        .strip_prefix(BOOKKEEPING_MARKER)
        .and_then(|rest| rest.strip_suffix(TEMP_SUFFIX))
    else {
        return false;
    };
    // rest = "<file>.<pid>.<counter>"
    let mut fields = rest.rsplitn(3, '.');
    let numeric = |field: Option<&str>| {
        field.is_some_and(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()))
    };
    let (counter, pid, file) = (fields.next(), fields.next(), fields.next());
    numeric(counter)
        && numeric(pid)
        && file.is_some_and(|file| for_file.is_none_or(|target| target == file))
}

/// Replaces `dir/file_name` with `data` atomically: a temporary file created with `mode` from the start,
/// written and synced, renamed over the target, then the directory synced. On failure the temporary file is
/// removed and the target is untouched.
pub(crate) fn write_atomic(
    dir: &Path,
    file_name: &str,
    data: &[u8],
    mode: u32,
) -> Result<(), KeystoreError> {
    let temp = dir.join(temp_name(file_name));
    let target = dir.join(file_name);
    let written = (|| {
        crash_point(format_args!("create {}", temp.display()));
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&temp)
            .map_err(KeystoreError::io("create temporary file", &temp))?;
        // The umask may have narrowed `mode`; set it exactly (only ever narrower before this point).
        file.set_permissions(Permissions::from_mode(mode))
            .map_err(KeystoreError::io("set permissions of", &temp))?;
        crash_point(format_args!("write {}", temp.display()));
        file.write_all(data)
            .map_err(KeystoreError::io("write", &temp))?;
        file.sync_all().map_err(KeystoreError::io("sync", &temp))?;
        drop(file);
        crash_point(format_args!(
            "rename {} to {}",
            temp.display(),
            target.display()
        ));
        fs::rename(&temp, &target).map_err(KeystoreError::io("replace", &target))
    })();
    if let Err(err) = written {
        if let Err(cleanup) = fs::remove_file(&temp) {
            if cleanup.kind() != io::ErrorKind::NotFound {
                tracing::warn!(path = %temp.display(), error = %cleanup, "could not remove temporary keystore file");
            }
        }
        return Err(err);
    }
    sync_dir(dir)
}

/// Makes the rename or removal of an entry in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), KeystoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(KeystoreError::io("sync directory", dir))
}

/// Creates `path` as a 0700 directory if it is missing (its parent must exist); an existing non-directory is
/// an error.
pub(crate) fn ensure_dir(path: &Path) -> Result<(), KeystoreError> {
    if path.is_dir() {
        return Ok(());
    }
    crash_point(format_args!("create directory {}", path.display()));
    match DirBuilder::new().mode(DIR_MODE).create(path) {
        Ok(()) => {
            fs::set_permissions(path, Permissions::from_mode(DIR_MODE))
                .map_err(KeystoreError::io("set permissions of", path))?;
            match path.parent() {
                Some(parent) => sync_dir(parent),
                None => Ok(()),
            }
        }
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
            let meta = fs::metadata(path).map_err(KeystoreError::io("inspect", path))?;
            if meta.is_dir() {
                Ok(())
            } else {
                Err(KeystoreError::NotADirectory { path: path.into() })
            }
        }
        Err(err) => Err(KeystoreError::io("create directory", path)(err)),
    }
}

/// Reads a whole file into wiped-on-drop memory. Missing → `Ok(None)`. With `secret`, a file whose mode
/// grants anything to group or others is refused; the mode is checked on the opened file, so a swap between
/// check and read is impossible.
pub(crate) fn read_file(
    path: &Path,
    secret: bool,
) -> Result<Option<Zeroizing<Vec<u8>>>, KeystoreError> {
    // Opened without blocking and checked on the descriptor: a FIFO or a device put where an entry
    // belongs is refused before anything is read from it.
    let file = match meshca_files::open(path) {
        Ok(file) => file,
        // A missing file, or a name whose parent "directory" is a file: either way there is no such entry.
        Err(err)
            if matches!(
                err.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(None)
        }
        Err(err) if err.kind() == io::ErrorKind::InvalidInput => {
            return Err(KeystoreError::NotAFile { path: path.into() })
        }
        Err(err) => return Err(KeystoreError::io("open", path)(err)),
    };
    let mode = file.metadata().mode() & 0o7777;
    if secret && mode & 0o077 != 0 {
        return Err(KeystoreError::InsecurePermissions {
            path: path.into(),
            mode,
        });
    }
    let data = file
        .read_secret(MAX_ENTRY_BYTES, "the largest keystore entry")
        .map_err(KeystoreError::io("read", path))?;
    Ok(Some(data))
}

/// Removes leftover temporary files in `dir` (all, or those for one target), logging each.
pub(crate) fn remove_stale_temps(dir: &Path, for_file: Option<&str>) -> Result<(), KeystoreError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(KeystoreError::io("list", dir)(err)),
    };
    let mut removed = false;
    for entry in entries {
        let entry = entry.map_err(KeystoreError::io("list", dir))?;
        let is_stale = entry
            .file_name()
            .to_str()
            .is_some_and(|name| is_temp(name, for_file));
        if !is_stale {
            continue;
        }
        let path = entry.path();
        crash_point(format_args!("remove {}", path.display()));
        match fs::remove_file(&path) {
            Ok(()) => {
                tracing::warn!(path = %path.display(), "removed a temporary keystore file left by an interrupted write");
                removed = true;
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(KeystoreError::io("remove temporary file", &path)(err)),
        }
    }
    if removed {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Removes the file at `path` and makes that durable; a missing file (or parent) counts as removed.
/// Returns whether there was a file to remove.
pub(crate) fn remove_file(path: &Path) -> Result<bool, KeystoreError> {
    if let Err(err) = fs::symlink_metadata(path) {
        if matches!(
            err.kind(),
            io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
        ) {
            return Ok(false);
        }
    }
    crash_point(format_args!("remove {}", path.display()));
    match fs::remove_file(path) {
        Ok(()) => {
            if let Some(parent) = path.parent() {
                sync_dir(parent)?;
            }
            Ok(true)
        }
        Err(err)
            if matches!(
                err.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            Ok(false)
        }
        Err(err) => Err(KeystoreError::io("remove", path)(err)),
    }
}

/// Opens (creating with 0600) the keystore's lock file. Its creation is no crash point: a lock file is
/// empty, and a missing one is created by whoever locks next.
pub(crate) fn open_lock_file(root: &Path) -> Result<File, KeystoreError> {
    let path = root.join(format!("{BOOKKEEPING_MARKER}lock"));
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(SECRET_MODE)
        .open(&path)
        .map_err(KeystoreError::io("open lock file", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_are_recognised_per_target() {
        let name = temp_name("key.pem");
        assert!(is_temp(&name, None));
        assert!(is_temp(&name, Some("key.pem")));
        assert!(!is_temp(&name, Some("key")));
        assert!(!is_temp(&name, Some("key.pem.bak")));
        assert!(!is_temp("key.pem", None));
        assert!(!is_temp(".#lock", None));
        assert_ne!(temp_name("key.pem"), temp_name("key.pem"));
        assert!(
            crate::validate_name(&name).is_err(),
            "temp names never look like entries"
        );
    }
}
