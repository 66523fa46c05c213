//! Reading `/proc` files of a caller, bounded: a caller shapes some of them (its cgroup path,
//! its supplementary groups), so none is read whole without a limit.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// `/proc/<pid>/status`: a few KiB, plus up to 65,536 supplementary groups of 11 bytes each.
pub(crate) const STATUS_MAX: u64 = 1024 * 1024;
/// `/proc/<pid>/stat`: one line.
pub(crate) const STAT_MAX: u64 = 64 * 1024;
/// `/proc/<pid>/cgroup`: a line per hierarchy, each a path of at most a few KiB.
pub(crate) const CGROUP_MAX: u64 = 256 * 1024;
/// `/proc/self/fdinfo/<fd>`: a few lines.
pub(crate) const FDINFO_MAX: u64 = 64 * 1024;

/// `/proc/<pid>/<name>`.
pub(crate) fn path(pid: u32, name: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/{name}"))
}

/// The file's text, at most `max` bytes of it (more is an error, never a truncated read). Bytes
/// that are not UTF-8 (a command name, a cgroup path) become U+FFFD, which no field parsed from
/// these files may hold, so they are refused where they matter.
pub(crate) fn read_bounded(path: &Path, max: u64) -> io::Result<String> {
    let mut bytes = Vec::new();
    File::open(path)?
        .take(max.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("holds more than {max} bytes"),
        ));
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}
