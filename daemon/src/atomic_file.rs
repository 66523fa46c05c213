//! Replacing a file atomically, safe in a directory others could write.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::{anyhow, Context};
use meshca_keystore::crash_point;

/// Writes `data` to `dir/name` atomically: a temporary file with a random name, created exclusively
/// (never an existing file, never through a symlink) with `mode` from the start, written, synced, then
/// renamed over the target, and the directory synced. A reader sees the old or the new file, never a mix;
/// on failure the target is untouched and the temporary file removed.
pub fn write_atomic(dir: &Path, name: &str, data: &[u8], mode: u32) -> crate::Result<()> {
    replace(dir, name, data, mode).map_err(crate::Error::from_internal)
}

fn replace(dir: &Path, name: &str, data: &[u8], mode: u32) -> anyhow::Result<()> {
    let target = dir.join(name);
    let tmp = dir.join(format!(".{name}.{}.tmp", random_suffix()?));
    crash_point(format_args!("create {}", tmp.display()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("cannot create {}", tmp.display()))?;
    crash_point(format_args!("write {}", tmp.display()));
    let written = f.write_all(data).and_then(|_| f.sync_all()).and_then(|_| {
        crash_point(format_args!(
            "rename {} to {}",
            tmp.display(),
            target.display()
        ));
        std::fs::rename(&tmp, &target)
    });
    if let Err(e) = written {
        // Nothing half-written is left behind.
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot replace {}", target.display()));
    }
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync {}", dir.display()))?;
    Ok(())
}

/// Writes `data` to `path` atomically (see [`write_atomic`]).
pub fn write_atomic_path(path: &Path, data: &[u8], mode: u32) -> crate::Result<()> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Err(crate::Error::from_internal(anyhow!(
            "{} is not a file path",
            path.display()
        )));
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    write_atomic(dir, name, data, mode)
}

/// 16 random hex digits for a temporary file's name.
fn random_suffix() -> anyhow::Result<String> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 8];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| anyhow!("the system's random source failed"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
