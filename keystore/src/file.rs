//! The on-disk keystore.

use std::fs::{self, DirBuilder, File, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

use crate::error::KeystoreError;
use crate::fsops::{self, DIR_MODE, PUBLIC_MODE, SECRET_MODE};
use crate::journal;
use crate::name::{split_prefix, validate_name, validate_prefix};
use crate::secret::Secret;
use crate::store::{Creation, Keystore, NewEntry};

/// Where keys found without their certificates in a keystore without [`JOURNALED`] are moved.
const INTERRUPTED_DIR: &str = ".#interrupted";

/// Marks a keystore opened by a meshca that creates groups under the journal.
const JOURNALED: &str = ".#journaled";

/// A keystore in a directory: each entry is a file at its name's path.
///
/// Directories are 0700, secrets 0600, public data 0644. Writes replace files atomically (temporary file,
/// fsync, rename, directory fsync) and are serialised across threads and processes by an advisory lock on
/// `<dir>/.#lock`; reads take no lock. Leftover temporary files of interrupted writes are never read, and are
/// removed on [`FileKeystore::open`] and on the next write of the same entry.
///
/// A group of entries ([`Keystore::create_if_absent`]) is created under a journal, `<dir>/.#creating`, that
/// names it while its files are written; a creation a kill interrupted is completed or rolled back on
/// [`FileKeystore::open`] and before the next creation, so a crash never leaves half a CA (see the
/// `journal` module). A keystore an earlier meshca wrote without the journal is checked once for a CA key
/// a kill left without its certificate, which is set aside.
#[derive(Debug)]
pub struct FileKeystore {
    root: PathBuf,
}

impl FileKeystore {
    /// Opens the keystore at `dir`, creating it with mode 0700 (missing parents get the default mode). An
    /// existing directory that group or others can access is tightened to 0700 with a warning. Removes
    /// leftover temporary files, and recovers a creation a kill interrupted.
    pub fn open(dir: &Path) -> Result<FileKeystore, KeystoreError> {
        match fs::metadata(dir) {
            Ok(meta) if !meta.is_dir() => {
                return Err(KeystoreError::NotADirectory { path: dir.into() })
            }
            Ok(meta) => {
                let mode = meta.mode() & 0o7777;
                if mode & 0o077 != 0 {
                    tracing::warn!(
                        path = %dir.display(),
                        mode = format_args!("{mode:04o}"),
                        "keystore directory was accessible to other users; tightening it to 0700"
                    );
                    fs::set_permissions(dir, Permissions::from_mode(DIR_MODE))
                        .map_err(KeystoreError::io("set permissions of", dir))?;
                }
            }
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                // Missing parents get the default mode: the data directory above may hold files other
                // users need (the SDS socket); only the keystore itself is private.
                if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                    fs::create_dir_all(parent)
                        .map_err(KeystoreError::io("create directory", parent))?;
                }
                crate::crash::crash_point(format_args!("create directory {}", dir.display()));
                match DirBuilder::new().mode(DIR_MODE).create(dir) {
                    Ok(()) => {}
                    // Another process created it in between; the permission fix below still applies.
                    Err(err) if err.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => {}
                    Err(err) => return Err(KeystoreError::io("create directory", dir)(err)),
                }
                fs::set_permissions(dir, Permissions::from_mode(DIR_MODE))
                    .map_err(KeystoreError::io("set permissions of", dir))?;
            }
            Err(err) => return Err(KeystoreError::io("inspect", dir)(err)),
        }
        let store = FileKeystore { root: dir.into() };
        let _lock = store.lock()?;
        store.remove_all_stale_temps(&store.root)?;
        journal::recover(&store.root)?;
        store.adopt_unjournaled()?;
        Ok(store)
    }

    /// Sets aside what a creation killed by a meshca that kept no creation journal left, once per
    /// keystore: [`JOURNALED`] marks a keystore this code has opened, after which half a group can only
    /// be a file removed by hand ([`KeystoreError::PartlyPresent`], the operator's to judge).
    ///
    /// Such a meshca wrote a CA's key and then its certificate, so a kill between the two left a key
    /// without a certificate, which nothing used: it is moved to `<dir>/.#interrupted/` (where nothing
    /// reads it and the operator finds it), logged, and the CA is created anew. The caller holds the
    /// writers' lock.
    fn adopt_unjournaled(&self) -> Result<(), KeystoreError> {
        let marker = self.root.join(JOURNALED);
        if marker.exists() {
            return Ok(());
        }
        let mut halves = Vec::new();
        for name in self.list("")? {
            let Some(dir) = name.strip_suffix("/key.pem") else {
                continue;
            };
            let cert = self.root.join(dir).join("cert.pem");
            if fs::symlink_metadata(&cert).is_err() {
                halves.push(name);
            }
        }
        if !halves.is_empty() {
            let aside = self.root.join(INTERRUPTED_DIR);
            fsops::ensure_dir(&aside)?;
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            for name in &halves {
                let from = self.root.join(name);
                let to = aside.join(format!("{}.{stamp}", name.replace('/', "%")));
                crate::crash::crash_point(format_args!("set aside {}", from.display()));
                fs::rename(&from, &to).map_err(KeystoreError::io("set aside", &from))?;
                fsops::sync_dir(&aside)?;
                if let Some(parent) = from.parent() {
                    fsops::sync_dir(parent)?;
                }
                tracing::warn!(
                    key = %name,
                    moved_to = %to.display(),
                    "found a CA key without its certificate in a keystore an earlier meshca wrote without a \
                     creation journal: a creation killed before its last write, which nothing used; set \
                     aside, and the CA is created anew"
                );
            }
        }
        fsops::write_atomic(&self.root, JOURNALED, b"creation journal\n", PUBLIC_MODE)
    }

    /// The keystore directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file that holds `name` (checked).
    fn path_of(&self, name: &str) -> Result<PathBuf, KeystoreError> {
        validate_name(name)?;
        Ok(self.root.join(name))
    }

    /// Takes the exclusive writers' lock (waiting for it); it is released when the returned file is dropped.
    /// Every write takes it, so a check made under it ([`Keystore::create_if_absent`]) holds until the
    /// writes that depend on it are done.
    fn lock(&self) -> Result<File, KeystoreError> {
        let file = fsops::open_lock_file(&self.root)?;
        file.lock()
            .map_err(KeystoreError::io("lock", self.root.join(".#lock")))?;
        Ok(file)
    }

    fn put(&self, name: &str, data: &[u8], mode: u32) -> Result<(), KeystoreError> {
        validate_name(name)?;
        let _lock = self.lock()?;
        self.write_locked(name, data, mode)
    }

    /// Writes an entry; the caller holds the writers' lock and has checked the name.
    fn write_locked(&self, name: &str, data: &[u8], mode: u32) -> Result<(), KeystoreError> {
        let (dirs, file_name) = name
            .rsplit_once('/')
            .map_or((None, name), |(d, f)| (Some(d), f));
        let mut dir = self.root.clone();
        for segment in dirs.into_iter().flat_map(|d| d.split('/')) {
            dir.push(segment);
            fsops::ensure_dir(&dir)?;
        }
        fsops::remove_stale_temps(&dir, Some(file_name))?;
        fsops::write_atomic(&dir, file_name, data, mode)
    }

    fn read(&self, name: &str, secret: bool) -> Result<Option<Zeroizing<Vec<u8>>>, KeystoreError> {
        fsops::read_file(&self.path_of(name)?, secret)
    }

    fn remove_all_stale_temps(&self, dir: &Path) -> Result<(), KeystoreError> {
        fsops::remove_stale_temps(dir, None)?;
        for entry in fs::read_dir(dir).map_err(KeystoreError::io("list", dir))? {
            let entry = entry.map_err(KeystoreError::io("list", dir))?;
            let is_dir = entry
                .file_type()
                .map_err(KeystoreError::io("inspect", entry.path()))?
                .is_dir();
            if is_dir {
                self.remove_all_stale_temps(&entry.path())?;
            }
        }
        Ok(())
    }

    /// Appends every entry under `dir` (whose name is `dir_name`, empty for the root) to `out`.
    fn collect(
        &self,
        dir: &Path,
        dir_name: &str,
        out: &mut Vec<String>,
    ) -> Result<(), KeystoreError> {
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(err)
                if matches!(
                    err.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                return Ok(())
            }
            Err(err) => return Err(KeystoreError::io("list", dir)(err)),
        };
        for entry in entries {
            let entry = entry.map_err(KeystoreError::io("list", dir))?;
            // Names that are not valid entries (temporary files, the lock, foreign files) are skipped.
            let Some(file_name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let name = if dir_name.is_empty() {
                file_name
            } else {
                format!("{dir_name}/{file_name}")
            };
            if validate_name(&name).is_err() {
                continue;
            }
            let file_type = entry
                .file_type()
                .map_err(KeystoreError::io("inspect", entry.path()))?;
            if file_type.is_dir() {
                self.collect(&entry.path(), &name, out)?;
            } else {
                out.push(name);
            }
        }
        Ok(())
    }
}

impl Keystore for FileKeystore {
    fn get_secret(&self, name: &str) -> Result<Option<Secret>, KeystoreError> {
        Ok(self.read(name, true)?.map(Secret::from))
    }

    fn put_secret(&self, name: &str, data: &[u8]) -> Result<(), KeystoreError> {
        self.put(name, data, SECRET_MODE)
    }

    fn get_public(&self, name: &str) -> Result<Option<Vec<u8>>, KeystoreError> {
        Ok(self.read(name, false)?.map(|data| data.to_vec()))
    }

    fn put_public(&self, name: &str, data: &[u8]) -> Result<(), KeystoreError> {
        self.put(name, data, PUBLIC_MODE)
    }

    fn create_if_absent(&self, entries: &[NewEntry<'_>]) -> Result<Creation, KeystoreError> {
        let paths = entries
            .iter()
            .map(|entry| self.path_of(entry.name()))
            .collect::<Result<Vec<_>, _>>()?;
        let _lock = self.lock()?;
        // A creation a killed writer left half done would otherwise read as PartlyPresent below.
        journal::recover(&self.root)?;
        let (mut present, mut missing) = (Vec::new(), Vec::new());
        for (entry, path) in entries.iter().zip(&paths) {
            let exists = match fs::metadata(path) {
                Ok(_) => true,
                Err(err)
                    if matches!(
                        err.kind(),
                        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                    ) =>
                {
                    false
                }
                Err(err) => return Err(KeystoreError::io("inspect", path)(err)),
            };
            match exists {
                true => present.push(entry.name().to_owned()),
                false => missing.push(entry.name().to_owned()),
            }
        }
        if missing.is_empty() {
            return Ok(Creation::Existing);
        }
        if !present.is_empty() {
            return Err(KeystoreError::PartlyPresent { present, missing });
        }
        // One entry is one atomic rename already; a group of several needs the journal.
        let journaled = entries.len() > 1;
        if journaled {
            let names: Vec<&str> = entries.iter().map(NewEntry::name).collect();
            journal::begin(&self.root, &names)?;
        }
        for entry in entries {
            let mode = if entry.is_secret() {
                SECRET_MODE
            } else {
                PUBLIC_MODE
            };
            // On an error the journal stays: the next creation (or open) rolls back what was written.
            self.write_locked(entry.name(), entry.data(), mode)?;
        }
        if journaled {
            journal::finish(&self.root)?;
        }
        Ok(Creation::Created)
    }

    fn delete(&self, name: &str) -> Result<(), KeystoreError> {
        let path = self.path_of(name)?;
        let _lock = self.lock()?;
        fsops::remove_file(&path).map(drop)
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>, KeystoreError> {
        validate_prefix(prefix)?;
        let (dir_name, _) = split_prefix(prefix);
        let dir_name = dir_name.unwrap_or("");
        let mut names = Vec::new();
        self.collect(&self.root.join(dir_name), dir_name, &mut names)?;
        names.retain(|name| name.starts_with(prefix));
        names.sort();
        Ok(names)
    }
}
