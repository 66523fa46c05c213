//! The creation journal of [`crate::FileKeystore`]: what makes creating a group of entries all-or-nothing.
//!
//! A group (a CA's key and certificate) is several files, and no filesystem renames several files at once.
//! So before writing a group, [`begin`] records its names in `<root>/.#creating` (atomically: a temporary
//! file, fsync, rename); the entries are then written one by one, and [`finish`] removes the journal before
//! the creator is told [`crate::Creation::Created`]. All of it happens under the keystore's writers' lock.
//!
//! A journal found later (by [`recover`], under the same lock) means its creator was killed before it
//! finished, so it never used the group and issued nothing from it:
//! - if every entry it names exists, the group is complete (each entry is renamed into place only once
//!   fully written and synced): it is kept, as a reader that takes no lock may already use it;
//! - otherwise the entries that exist are removed, so the next creator starts from nothing.
//!
//! Either way the journal goes last, so a kill during recovery leaves it to be recovered again. A group
//! that is only partly present without a journal (a file removed by hand) is not touched: that one is
//! [`crate::KeystoreError::PartlyPresent`], for the operator.

use std::fs;
use std::io;
use std::path::Path;

use crate::error::KeystoreError;
use crate::fsops::{self, SECRET_MODE};
use crate::name::validate_name;

/// The journal's file name in the keystore root (`#` never appears in an entry name).
const JOURNAL: &str = ".#creating";

/// The largest journal read: a few entry names.
const MAX_JOURNAL_BYTES: u64 = 64 * 1024;

/// Records that the group `names` is about to be written. The caller holds the writers' lock, has
/// checked the names, and recovered any earlier journal.
pub(crate) fn begin(root: &Path, names: &[&str]) -> Result<(), KeystoreError> {
    let mut text = String::new();
    for name in names {
        text.push_str(name);
        text.push('\n');
    }
    fsops::write_atomic(root, JOURNAL, text.as_bytes(), SECRET_MODE)
}

/// Records that every entry of the group is written: from now on it is a complete group like any other.
pub(crate) fn finish(root: &Path) -> Result<(), KeystoreError> {
    fsops::remove_file(&root.join(JOURNAL)).map(drop)
}

/// Completes or rolls back the creation a killed writer left (see the module doc); nothing to do without
/// a journal. The caller holds the writers' lock.
pub(crate) fn recover(root: &Path) -> Result<(), KeystoreError> {
    let path = root.join(JOURNAL);
    let text =
        match meshca_files::read_text(&path, MAX_JOURNAL_BYTES, "the largest creation journal") {
            Ok(text) => text,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(err) => return Err(KeystoreError::io("read", &path)(err)),
        };
    let names: Vec<&str> = text.lines().filter(|line| !line.is_empty()).collect();
    for name in &names {
        // Only this crate writes the journal, atomically; anything else in it was put there by hand.
        validate_name(name).map_err(|_| KeystoreError::Journal { path: path.clone() })?;
    }
    let mut present = Vec::new();
    for name in &names {
        let entry = root.join(name);
        match fs::symlink_metadata(&entry) {
            Ok(_) => present.push(*name),
            Err(err)
                if matches!(
                    err.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) => {}
            Err(err) => return Err(KeystoreError::io("inspect", &entry)(err)),
        }
    }
    if present.len() == names.len() {
        tracing::warn!(
            entries = ?names,
            "a creation in the keystore was interrupted after its last write: its entries are complete and kept"
        );
    } else {
        for name in &present {
            fsops::remove_file(&root.join(name))?;
        }
        tracing::warn!(
            removed = ?present,
            group = ?names,
            "a creation in the keystore was interrupted before all its entries were written; nothing used them: \
             removed the ones written, to be created anew"
        );
    }
    finish(root)
}
