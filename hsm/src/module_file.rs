//! The PKCS#11 module is code loaded into the process that holds every key of the mesh: before it is
//! loaded, it must be a regular file that no other user can replace.

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Writable by every user.
const WORLD_WRITABLE: u32 = 0o002;
/// The sticky bit: in such a directory only a file's owner may remove or rename it.
const STICKY: u32 = 0o1000;

/// Checks the module at `module` before it is loaded: it exists, is a regular file (not a directory,
/// FIFO, device or socket, each named as what it is), is not writable by every user, and lies in no
/// directory every user may write to. A world-writable directory with the sticky bit (`/tmp`) is
/// allowed above the module's own directory, where no other user can rename what they do not own.
/// Both the path as given and the file it resolves to are checked, so a symbolic link in a
/// world-writable place is refused too. The reason is what the operator should read after the path.
pub(crate) fn check(module: &Path) -> Result<(), String> {
    let metadata = fs::metadata(module).map_err(|error| match error.kind() {
        io::ErrorKind::NotFound => {
            "no such file: install the HSM vendor's PKCS#11 library, or correct the path".to_owned()
        }
        _ => format!("cannot be read: {error}"),
    })?;
    let file_type = metadata.file_type();
    let not_a_file = if file_type.is_dir() {
        Some("a directory")
    } else if file_type.is_fifo() {
        Some("a FIFO (named pipe)")
    } else if file_type.is_char_device() {
        Some("a character device")
    } else if file_type.is_block_device() {
        Some("a block device")
    } else if file_type.is_socket() {
        Some("a socket")
    } else if !file_type.is_file() {
        Some("not a regular file")
    } else {
        None
    };
    if let Some(what) = not_a_file {
        return Err(format!(
            "is {what}, not a PKCS#11 library: name the vendor's shared library file (a .so)"
        ));
    }
    let mode = metadata.mode() & 0o7777;
    if mode & WORLD_WRITABLE != 0 {
        return Err(format!(
            "is writable by every user (mode {mode:04o}): anyone could replace the code loaded into \
             the process that holds the mesh's keys; make it writable by its owner only (chmod o-w)"
        ));
    }
    let resolved =
        fs::canonicalize(module).map_err(|error| format!("cannot be resolved: {error}"))?;
    for path in [module, resolved.as_path()] {
        check_directories(path)?;
    }
    Ok(())
}

/// Refuses a world-writable directory on the way to `path`: its own directory even with the sticky
/// bit, one further up only without it.
fn check_directories(path: &Path) -> Result<(), String> {
    let absolute = if path.is_absolute() {
        path.to_owned()
    } else {
        std::env::current_dir()
            .map_err(|error| format!("cannot be resolved: {error}"))?
            .join(path)
    };
    for (depth, directory) in absolute.ancestors().skip(1).enumerate() {
        let Ok(metadata) = fs::metadata(directory) else {
            continue;
        };
        let mode = metadata.mode() & 0o7777;
        let sticky_above = depth > 0 && mode & STICKY != 0;
        if mode & WORLD_WRITABLE != 0 && !sticky_above {
            return Err(world_writable_directory(directory.to_owned(), mode));
        }
    }
    Ok(())
}

fn world_writable_directory(directory: PathBuf, mode: u32) -> String {
    format!(
        "lies in {} (mode {mode:04o}), a directory every user may write to: anyone could put other \
         code in its place; install the library where only root can write",
        directory.display()
    )
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn chmod(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
    }

    /// A private directory (mode 0755) holding a library file (mode 0644).
    fn library() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        chmod(dir.path(), 0o755);
        let module = dir.path().join("libvendor.so");
        fs::write(&module, b"\x7fELF").expect("writing the library");
        chmod(&module, 0o644);
        (dir, module)
    }

    #[test]
    fn a_private_library_passes() {
        let (_dir, module) = library();
        assert_eq!(check(&module), Ok(()));
    }

    #[test]
    fn a_world_writable_library_is_refused_with_its_mode() {
        let (_dir, module) = library();
        chmod(&module, 0o666);
        let reason = check(&module).expect_err("world-writable");
        assert!(
            reason.contains("writable by every user (mode 0666)"),
            "{reason}"
        );
    }

    #[test]
    fn a_library_in_a_world_writable_directory_is_refused() {
        let (dir, module) = library();
        for mode in [0o777, 0o1777] {
            chmod(dir.path(), mode);
            let reason = check(&module).expect_err("in a world-writable directory");
            assert!(
                reason.contains(&dir.path().display().to_string()),
                "{reason}"
            );
            assert!(reason.contains(&format!("mode {mode:04o}")), "{reason}");
        }
    }

    #[test]
    fn a_sticky_world_writable_directory_further_up_is_allowed() {
        let (dir, _) = library();
        chmod(dir.path(), 0o1777);
        let inner = dir.path().join("lib");
        fs::create_dir(&inner).expect("mkdir");
        chmod(&inner, 0o755);
        let module = inner.join("libvendor.so");
        fs::write(&module, b"\x7fELF").expect("writing the library");
        chmod(&module, 0o644);
        assert_eq!(check(&module), Ok(()));
        chmod(dir.path(), 0o777);
        assert!(check(&module).is_err(), "not without the sticky bit");
    }

    #[test]
    fn a_link_to_a_library_in_a_world_writable_directory_is_refused() {
        let (dir, module) = library();
        let (elsewhere, _) = library();
        let link = elsewhere.path().join("link.so");
        std::os::unix::fs::symlink(&module, &link).expect("symlink");
        assert_eq!(check(&link), Ok(()));
        chmod(dir.path(), 0o777);
        let reason = check(&link).expect_err("resolves into a world-writable directory");
        assert!(
            reason.contains(&dir.path().display().to_string()),
            "{reason}"
        );
    }

    #[test]
    fn what_is_not_a_file_is_named() {
        let (dir, _) = library();
        let reason = check(dir.path()).expect_err("a directory");
        assert!(reason.contains("is a directory"), "{reason}");
        let fifo = dir.path().join("fifo");
        nix_mkfifo(&fifo);
        let reason = check(&fifo).expect_err("a FIFO");
        assert!(reason.contains("is a FIFO"), "{reason}");
        let reason = check(Path::new("/dev/null")).expect_err("a device");
        assert!(reason.contains("is a character device"), "{reason}");
        let reason = check(&dir.path().join("missing.so")).expect_err("missing");
        assert!(reason.contains("no such file"), "{reason}");
    }

    fn nix_mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .expect("running mkfifo");
        assert!(status.success(), "mkfifo {}", path.display());
    }
}
