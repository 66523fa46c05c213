//! Reading a file meshca is pointed at without trusting what it turned out to be.
//!
//! A path in the settings, on the command line or in the data directory can name a FIFO (opening it
//! blocks until a writer comes, reading it until the writer stops), a device (`/dev/zero` never ends),
//! a directory, or a file far larger than anything meshca expects. Every file meshca reads goes
//! through [`open`]: opened without blocking, checked to be a regular file on the descriptor it will
//! read (so a path swapped between a check and the read cannot slip through), and read to at most a
//! bound, which is an error past it, never a cut.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use zeroize::Zeroizing;

mod shown;

pub use shown::{bounded, shown, ECHO_CHARS};

/// The largest certificate, key or token file read where no setting gives a bound: a CA bundle of a
/// whole system is a few hundred KiB.
pub const PEM_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// How errors name [`PEM_FILE_BYTES`].
pub const PEM_FILE_BOUND: &str = "the largest certificate, key or token file read";

/// A regular file, opened for reading.
#[derive(Debug)]
pub struct Regular {
    file: File,
    meta: Metadata,
}

/// Opens `path` for reading if it is a regular file (following symbolic links). The open does not
/// block: a FIFO or a device is refused before anything is read from it, with an error saying what
/// it is.
pub fn open(path: &Path) -> io::Result<Regular> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)?;
    let meta = file.metadata()?;
    let kind = meta.file_type();
    if !kind.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a regular file ({}); refused", describe(kind)),
        ));
    }
    Ok(Regular { file, meta })
}

impl Regular {
    /// The file's metadata (of the descriptor, not the path).
    pub fn metadata(&self) -> &Metadata {
        &self.meta
    }

    /// Reads the whole file if it holds at most `max_bytes`; `setting` names the bound in the error
    /// (a setting, or a sentence saying it is fixed).
    pub fn read(self, max_bytes: u64, setting: &str) -> io::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        self.read_into(&mut bytes, max_bytes, setting)?;
        Ok(bytes)
    }

    /// [`Self::read`] for a file that holds a secret: the buffer is sized once (a reallocation would
    /// leave an unwiped copy behind) and wiped when dropped.
    pub fn read_secret(self, max_bytes: u64, setting: &str) -> io::Result<Zeroizing<Vec<u8>>> {
        let capacity = self.meta.len().min(max_bytes).saturating_add(1);
        let mut bytes = Zeroizing::new(Vec::with_capacity(
            usize::try_from(capacity).unwrap_or(usize::MAX),
        ));
        self.read_into(&mut bytes, max_bytes, setting)?;
        Ok(bytes)
    }

    /// Reads the whole file as UTF-8 text, like [`Self::read`].
    pub fn read_text(self, max_bytes: u64, setting: &str) -> io::Result<String> {
        String::from_utf8(self.read(max_bytes, setting)?)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "is not UTF-8 text; refused"))
    }

    fn read_into(self, bytes: &mut Vec<u8>, max_bytes: u64, setting: &str) -> io::Result<()> {
        self.file
            .take(max_bytes.saturating_add(1))
            .read_to_end(bytes)?;
        if bytes.len() as u64 > max_bytes {
            return Err(too_large(max_bytes, setting));
        }
        Ok(())
    }
}

/// Reads `path` whole if it is a regular file of at most `max_bytes` (see [`open`]).
pub fn read(path: &Path, max_bytes: u64, setting: &str) -> io::Result<Vec<u8>> {
    open(path)?.read(max_bytes, setting)
}

/// Reads `path` whole as UTF-8 text if it is a regular file of at most `max_bytes` (see [`open`]).
pub fn read_text(path: &Path, max_bytes: u64, setting: &str) -> io::Result<String> {
    open(path)?.read_text(max_bytes, setting)
}

fn too_large(max_bytes: u64, setting: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("larger than {max_bytes} bytes ({setting}); refused"),
    )
}

fn describe(kind: std::fs::FileType) -> &'static str {
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fifo_in(dir: &Path) -> std::path::PathBuf {
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo runs");
        assert!(made.success());
        fifo
    }

    #[test]
    fn only_regular_files_of_bounded_size_are_read() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("a.yaml");
        std::fs::write(&file, b"0123456789").expect("write");
        assert_eq!(read(&file, 10, "x").expect("fits"), b"0123456789");
        assert_eq!(read_text(&file, 10, "x").expect("fits"), "0123456789");
        let error = read(&file, 9, "limits.x").expect_err("too large");
        assert!(
            error.to_string().contains("larger than 9 bytes (limits.x)"),
            "{error}"
        );
        let error = read(dir.path(), 10, "x").expect_err("a directory");
        assert!(error.to_string().contains("a directory"), "{error}");
        let fifo = fifo_in(dir.path());
        let error = read(&fifo, 10, "x").expect_err("a FIFO, refused without blocking");
        assert!(error.to_string().contains("a FIFO"), "{error}");
        let error = read(Path::new("/dev/zero"), 10, "x").expect_err("a device");
        assert!(error.to_string().contains("a device"), "{error}");
        let link = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &link).expect("symlink");
        let error = read(&link, 10, "x").expect_err("a link to a device");
        assert!(error.to_string().contains("a device"), "{error}");
    }

    #[test]
    fn secrets_are_read_into_one_buffer_and_bounded_too() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("key");
        std::fs::write(&file, [7u8; 100]).expect("write");
        let read = open(&file)
            .expect("opens")
            .read_secret(100, "x")
            .expect("fits");
        assert_eq!(read.as_slice(), &[7u8; 100]);
        assert!(read.capacity() <= 101, "sized once: {}", read.capacity());
        let error = open(&file)
            .expect("opens")
            .read_secret(99, "x")
            .expect_err("too large");
        assert!(error.to_string().contains("larger than 99"), "{error}");
    }

    #[test]
    fn text_must_be_utf8() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("t");
        std::fs::write(&file, [0xff, 0xfe]).expect("write");
        let error = read_text(&file, 10, "x").expect_err("not UTF-8");
        assert!(error.to_string().contains("UTF-8"), "{error}");
    }
}
