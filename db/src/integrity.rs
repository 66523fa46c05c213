//! What keeps the database from changing what meshca trusts. Whoever can write the database can
//! change any row, so every row meshca reads as the truth carries a tag (HMAC-SHA256 under a key
//! derived from the key-encryption key, see [`KeyEncryptionKey::row_tag`]) over its kind, its name, its
//! version and its data: a row changed, written by hand, or moved to another name is refused, never
//! used. Each keystore entry's version grows with every write, and a replica refuses an entry older
//! than one it has read before: an older row put back is refused by every replica that saw the newer
//! one (a replica that starts after the swap cannot tell).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::DbError;
use crate::kek::KeyEncryptionKey;

/// The tag label of a keystore entry's row (`meshca_entries`).
const ENTRY: &str = "meshca_entries v1";

/// Rows refused for failing their authentication, since the process started.
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// How many database rows this process refused because they failed their authentication (changed,
/// moved, untagged, or older than one read before). For the `meshca_database_rows_refused_total`
/// metric.
pub fn refused_rows() -> u64 {
    REFUSED.load(Ordering::Relaxed)
}

/// Why a row was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// It has no tag: written by hand, or by a meshca older than row tags after they were turned on.
    Untagged,
    /// Its tag is not the one of its kind, name, version and data under this key.
    Mismatch,
    /// It is an older version than one this replica read or wrote before.
    Older {
        /// The row's version.
        version: i64,
        /// The newest version seen.
        seen: i64,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Untagged => f.write_str("it carries no tag, so meshca did not write it"),
            Refusal::Mismatch => f.write_str(
                "its tag does not match its name and contents: it was changed, or moved from another row, \
                 outside meshca",
            ),
            Refusal::Older { version, seen } => write!(
                f,
                "it is version {version}, older than version {seen} this replica read before: an older \
                 copy was put back"
            ),
        }
    }
}

/// The error for `row` refused for `why`: logged, counted, and returned, so the caller fails instead
/// of using it.
pub(crate) fn refuse(row: &str, why: Refusal) -> DbError {
    REFUSED.fetch_add(1, Ordering::Relaxed);
    tracing::error!(
        row,
        "refused a database row that fails its authentication: {why}"
    );
    DbError::Refused {
        row: row.to_owned(),
        reason: why.to_string(),
    }
}

/// Checks a row's `stored` tag against the one `expected` computes.
pub(crate) fn check(
    stored: Option<&[u8]>,
    expected: crate::kek::RowTag<'_>,
) -> Result<(), Refusal> {
    match stored {
        None => Err(Refusal::Untagged),
        Some(stored) if expected.matches(stored) => Ok(()),
        Some(_) => Err(Refusal::Mismatch),
    }
}

/// The tag of keystore entry `name`'s row: whether it is a secret, its version and its stored bytes
/// (sealed, for a secret).
pub(crate) fn entry_tag<'k>(
    key: &'k KeyEncryptionKey,
    name: &str,
    secret: bool,
    version: i64,
    stored: &[u8],
) -> crate::kek::RowTag<'k> {
    let mut tag = key.row_tag(ENTRY);
    tag.field(name.as_bytes())
        .field(&[u8::from(secret)])
        .field(&version.to_be_bytes())
        .field(stored);
    tag
}

/// The version a new write of an entry gets: past the `previous` row's, and at least the writer's
/// clock in microseconds, so that an entry removed and written anew still gets a version newer than
/// any it had before.
pub(crate) fn next_version(previous: Option<i64>, name: &str) -> Result<i64, DbError> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    let after = match previous {
        None => 1,
        Some(previous) => previous.checked_add(1).ok_or_else(|| {
            DbError::Invalid(format!(
                "keystore entry {name} has the largest version there is; it was not written by meshca"
            ))
        })?,
    };
    Ok(after.max(now))
}

/// The newest version of each entry this replica read or wrote, so that an older row put back in
/// its place is refused.
#[derive(Debug, Default)]
pub(crate) struct Versions(Mutex<HashMap<String, i64>>);

impl Versions {
    /// The newest version of `name` seen, if any.
    pub(crate) fn newest(&self, name: &str) -> Option<i64> {
        let seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        seen.get(name).copied()
    }

    /// Records that `name` is at `version`; an older version than one seen is refused.
    pub(crate) fn saw(&self, name: &str, version: i64) -> Result<(), Refusal> {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match seen.get_mut(name) {
            Some(newest) if *newest > version => Err(Refusal::Older {
                version,
                seen: *newest,
            }),
            Some(newest) => {
                *newest = version;
                Ok(())
            }
            None => {
                seen.insert(name.to_owned(), version);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_tag_binds_name_kind_version_and_data() {
        let key = KeyEncryptionKey::from_bytes(&[5; 32]);
        let stored = entry_tag(&key, "ca/a/cert.pem", false, 7, b"data").sign();
        let ok = |name, secret, version, data: &[u8]| {
            check(Some(&stored), entry_tag(&key, name, secret, version, data))
        };
        assert_eq!(ok("ca/a/cert.pem", false, 7, b"data"), Ok(()));
        assert_eq!(
            ok("ca/b/cert.pem", false, 7, b"data"),
            Err(Refusal::Mismatch)
        );
        assert_eq!(
            ok("ca/a/cert.pem", true, 7, b"data"),
            Err(Refusal::Mismatch)
        );
        assert_eq!(
            ok("ca/a/cert.pem", false, 8, b"data"),
            Err(Refusal::Mismatch)
        );
        assert_eq!(
            ok("ca/a/cert.pem", false, 7, b"datA"),
            Err(Refusal::Mismatch)
        );
        assert_eq!(
            check(None, entry_tag(&key, "ca/a/cert.pem", false, 7, b"data")),
            Err(Refusal::Untagged)
        );
    }

    #[test]
    fn versions_never_go_back() {
        let versions = Versions::default();
        assert_eq!(versions.saw("a", 5), Ok(()));
        assert_eq!(versions.saw("a", 5), Ok(()));
        assert_eq!(versions.saw("b", 1), Ok(()));
        assert_eq!(
            versions.saw("a", 4),
            Err(Refusal::Older {
                version: 4,
                seen: 5
            })
        );
        assert_eq!(versions.saw("a", 6), Ok(()));
    }

    #[test]
    fn a_new_version_is_past_the_previous_one_and_the_clock() {
        let first = next_version(None, "a").expect("a version");
        assert!(first > 1_600_000_000_000_000, "{first}");
        assert_eq!(
            next_version(Some(i64::MAX - 1), "a").expect("a version"),
            i64::MAX
        );
        assert!(next_version(Some(i64::MAX), "a").is_err());
    }
}
