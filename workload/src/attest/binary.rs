//! The SHA-256 of a caller's binary, bounded in size and time.
//!
//! A caller picks the binary it runs, so it picks how much hashing it costs: a multi-gigabyte
//! binary, or one on a slow network filesystem, must cost the server a bounded amount of work.
//! Hashing stops at the size limit or the deadline and the caller simply gets no `unix:sha256`
//! selector. The deadline is checked between chunks: a single read that the kernel does not return
//! from (a hung network filesystem) is not interrupted.
//!
//! Every stream of every caller is attested, and thousands of streams often run one binary, so digests
//! are kept ([`DigestCache`]) by the file's identity as the kernel reports it on the opened file: device,
//! inode, size, and modification and change times to the nanosecond. Writing to the file or replacing
//! it changes one of them (the change time cannot be set by the file's owner), so a kept digest is
//! never a stale one.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use ring::digest;

use super::peer::FileId;
use super::AttestLimits;

/// How much is read at a time between deadline checks.
const CHUNK: usize = 64 * 1024;

/// What hashing a binary came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BinaryDigest {
    /// The whole binary was read in time.
    Sha256([u8; 32]),
    /// The binary holds more than the limit; `size` is what was seen of it when hashing stopped.
    TooBig { size: u64 },
    /// The deadline passed after `read` bytes.
    TooSlow { read: u64 },
    /// The file opened is not the one expected (the process runs another binary now).
    Changed,
    /// Hashing its `size` bytes would take the uid past its hashing budget for this minute.
    OverBudget { size: u64 },
}

/// How many binaries' digests are kept.
const KEPT_DIGESTS: usize = 256;

/// A file as the kernel identifies it: the same identity means the same content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FileIdentity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileIdentity {
    fn of(metadata: &std::fs::Metadata) -> FileIdentity {
        FileIdentity {
            dev: metadata.dev(),
            ino: metadata.ino(),
            size: metadata.len(),
            mtime: (metadata.mtime(), metadata.mtime_nsec()),
            ctime: (metadata.ctime(), metadata.ctime_nsec()),
        }
    }
}

/// Digests by file identity, and the identities in the order they were kept.
type Kept = (HashMap<FileIdentity, [u8; 32]>, VecDeque<FileIdentity>);

/// Digests of binaries hashed whole, by file identity; the oldest leave first.
#[derive(Debug, Default)]
pub(crate) struct DigestCache {
    kept: Mutex<Kept>,
}

impl DigestCache {
    fn get(&self, identity: &FileIdentity) -> Option<[u8; 32]> {
        self.lock().0.get(identity).copied()
    }

    fn keep(&self, identity: FileIdentity, digest: [u8; 32]) {
        let mut kept = self.lock();
        let (digests, order) = &mut *kept;
        if digests.insert(identity, digest).is_none() {
            order.push_back(identity);
        }
        while order.len() > KEPT_DIGESTS {
            if let Some(oldest) = order.pop_front() {
                digests.remove(&oldest);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        // Plain values, valid after any panic.
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The digests every attestation shares.
static DIGESTS: std::sync::LazyLock<DigestCache> = std::sync::LazyLock::new(DigestCache::default);

/// The bytes hashed for each uid's callers this minute, every attestation sharing it.
static BUDGETS: std::sync::LazyLock<HashBudgets> = std::sync::LazyLock::new(HashBudgets::default);

/// How long a uid's hashing budget lasts before it is full again.
const BUDGET_WINDOW: Duration = Duration::from_secs(60);

/// Bytes hashed per uid in the current window: a caller chooses its binary and can change its times
/// before each request (so no kept digest answers), and must not make the server hash without end.
#[derive(Debug, Default)]
pub(crate) struct HashBudgets {
    spent: Mutex<HashMap<u32, (Instant, u64)>>,
}

impl HashBudgets {
    /// Takes `bytes` from `uid`'s budget of `per_minute`, if that much is left.
    fn take(&self, uid: u32, bytes: u64, per_minute: u64) -> bool {
        let mut spent = self.spent.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        // Windows that are over are forgotten, so the map holds only uids hashed for this minute.
        spent.retain(|_, (start, _)| now.duration_since(*start) < BUDGET_WINDOW);
        let (_, used) = spent.entry(uid).or_insert((now, 0));
        if used.saturating_add(bytes) > per_minute {
            return false;
        }
        *used += bytes;
        true
    }
}

/// Hashes the file at `path` (for a caller, `/proc/<pid>/exe`, which opens the very file the
/// process runs even if its path was since replaced), or finds its digest kept; the file opened
/// must be `expected`, and hashing it is charged to `uid`'s budget (a kept digest costs nothing).
pub(crate) fn hash(
    path: &Path,
    expected: FileId,
    uid: u32,
    limits: &AttestLimits,
) -> io::Result<BinaryDigest> {
    hash_with(&DIGESTS, &BUDGETS, path, Some((expected, uid)), limits)
}

fn hash_with(
    cache: &DigestCache,
    budgets: &HashBudgets,
    path: &Path,
    expected: Option<(FileId, u32)>,
    limits: &AttestLimits,
) -> io::Result<BinaryDigest> {
    let started = Instant::now();
    let mut file = File::open(path)?;
    let metadata = file.metadata()?;
    if expected.is_some_and(|(expected, _)| expected != FileId::of(&metadata)) {
        return Ok(BinaryDigest::Changed);
    }
    let size = metadata.len();
    if size > limits.max_binary_bytes {
        return Ok(BinaryDigest::TooBig { size });
    }
    let identity = FileIdentity::of(&metadata);
    if let Some(digest) = cache.get(&identity) {
        return Ok(BinaryDigest::Sha256(digest));
    }
    if let Some((_, uid)) = expected {
        if !budgets.take(uid, size, limits.hash_bytes_per_uid_minute) {
            return Ok(BinaryDigest::OverBudget { size });
        }
    }
    let mut context = digest::Context::new(&digest::SHA256);
    let mut buffer = vec![0u8; CHUNK];
    let mut read: u64 = 0;
    loop {
        if started.elapsed() >= limits.hash_timeout {
            return Ok(BinaryDigest::TooSlow { read });
        }
        let n = match file.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        read = read.saturating_add(n as u64);
        // The file may have grown since its size was read.
        if read > limits.max_binary_bytes {
            return Ok(BinaryDigest::TooBig { size: read });
        }
        context.update(buffer.get(..n).unwrap_or_default());
    }
    let mut sha256 = [0u8; 32];
    sha256.copy_from_slice(context.finish().as_ref());
    cache.keep(identity, sha256);
    Ok(BinaryDigest::Sha256(sha256))
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::time::Duration;

    use super::*;

    fn file_of(len: usize) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().expect("a temporary file");
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        file.write_all(&bytes).expect("writing the temporary file");
        file
    }

    fn limits(max_binary_bytes: u64, hash_timeout: Duration) -> AttestLimits {
        AttestLimits {
            max_binary_bytes,
            hash_timeout,
            ..AttestLimits::default()
        }
    }

    #[test]
    fn hashes_a_file_of_several_chunks() {
        let file = file_of(3 * CHUNK + 17);
        let bytes = std::fs::read(file.path()).expect("reading back");
        let expected = digest::digest(&digest::SHA256, &bytes);
        let got = hash_with(
            &DigestCache::default(),
            &HashBudgets::default(),
            file.path(),
            None,
            &AttestLimits::default(),
        )
        .expect("hashing");
        assert_eq!(
            got,
            BinaryDigest::Sha256(expected.as_ref().try_into().expect("32 bytes"))
        );
    }

    #[test]
    fn a_file_at_the_limit_is_hashed_and_one_byte_more_is_not() {
        let file = file_of(1000);
        let at = hash_with(
            &DigestCache::default(),
            &HashBudgets::default(),
            file.path(),
            None,
            &limits(1000, Duration::from_secs(10)),
        )
        .expect("hashing");
        assert!(matches!(at, BinaryDigest::Sha256(_)), "{at:?}");
        let over = hash_with(
            &DigestCache::default(),
            &HashBudgets::default(),
            file.path(),
            None,
            &limits(999, Duration::from_secs(10)),
        )
        .expect("hashing");
        assert_eq!(over, BinaryDigest::TooBig { size: 1000 });
    }

    #[test]
    fn a_passed_deadline_stops_hashing() {
        let file = file_of(CHUNK);
        let got = hash_with(
            &DigestCache::default(),
            &HashBudgets::default(),
            file.path(),
            None,
            &limits(u64::MAX, Duration::ZERO),
        )
        .expect("hashing");
        assert_eq!(got, BinaryDigest::TooSlow { read: 0 });
    }

    #[test]
    fn a_digest_is_kept_for_the_same_file_and_never_for_a_changed_one() {
        let cache = DigestCache::default();
        let mut file = file_of(2 * CHUNK);
        let limits = AttestLimits::default();
        let first = hash_with(&cache, &HashBudgets::default(), file.path(), None, &limits)
            .expect("hashing");
        assert_eq!(cache.lock().0.len(), 1);
        // Kept: the deadline is already past, so only the kept digest can answer.
        let kept = hash_with(
            &cache,
            &HashBudgets::default(),
            file.path(),
            None,
            &limits_zero(),
        )
        .expect("kept");
        assert_eq!(kept, first);
        file.write_all(b"more").expect("appending");
        file.flush().expect("flushing");
        let changed = hash_with(&cache, &HashBudgets::default(), file.path(), None, &limits)
            .expect("hashing again");
        assert_ne!(changed, first, "a changed file is hashed anew");
        let bytes = std::fs::read(file.path()).expect("reading back");
        let expected = digest::digest(&digest::SHA256, &bytes);
        assert_eq!(
            changed,
            BinaryDigest::Sha256(expected.as_ref().try_into().expect("32 bytes"))
        );
    }

    #[test]
    fn another_file_than_the_one_expected_is_not_hashed() {
        let file = file_of(100);
        let other = file_of(100);
        let metadata = std::fs::metadata(other.path()).expect("the other file");
        let got = hash_with(
            &DigestCache::default(),
            &HashBudgets::default(),
            file.path(),
            Some((FileId::of(&metadata), 1000)),
            &AttestLimits::default(),
        )
        .expect("opening");
        assert_eq!(got, BinaryDigest::Changed);
        let own = std::fs::metadata(file.path()).expect("the file");
        let got = hash(
            file.path(),
            FileId::of(&own),
            1000,
            &AttestLimits::default(),
        )
        .expect("hashing");
        assert!(matches!(got, BinaryDigest::Sha256(_)), "{got:?}");
    }

    /// A caller that changes its binary's times before every request makes every request hash anew;
    /// its uid's budget stops that, and other uids keep theirs.
    #[test]
    fn a_uid_past_its_hashing_budget_gets_no_digest_and_others_still_do() {
        let cache = DigestCache::default();
        let budgets = HashBudgets::default();
        let file = file_of(1000);
        let id = FileId::of(&std::fs::metadata(file.path()).expect("the file"));
        let limits = AttestLimits {
            hash_bytes_per_uid_minute: 2500,
            ..AttestLimits::default()
        };
        let touch = |n: i64| {
            let times = std::fs::FileTimes::new()
                .set_modified(std::time::UNIX_EPOCH + Duration::from_secs(1_000_000 + n as u64));
            std::fs::File::options()
                .write(true)
                .open(file.path())
                .expect("opening")
                .set_times(times)
                .expect("utime");
        };
        for n in 0..2 {
            touch(n);
            let got = hash_with(&cache, &budgets, file.path(), Some((id, 1005)), &limits)
                .expect("hashing");
            assert!(matches!(got, BinaryDigest::Sha256(_)), "{n}: {got:?}");
        }
        touch(2);
        let over =
            hash_with(&cache, &budgets, file.path(), Some((id, 1005)), &limits).expect("opening");
        assert_eq!(over, BinaryDigest::OverBudget { size: 1000 });
        let other =
            hash_with(&cache, &budgets, file.path(), Some((id, 1001)), &limits).expect("hashing");
        assert!(matches!(other, BinaryDigest::Sha256(_)), "{other:?}");
        // A kept digest costs nothing: the spent uid still gets it.
        let kept =
            hash_with(&cache, &budgets, file.path(), Some((id, 1005)), &limits).expect("kept");
        assert_eq!(kept, other);
    }

    fn limits_zero() -> AttestLimits {
        limits(u64::MAX, Duration::ZERO)
    }

    #[test]
    fn a_missing_file_is_an_error() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let missing = dir.path().join("missing");
        let error = hash_with(
            &DigestCache::default(),
            &HashBudgets::default(),
            &missing,
            None,
            &AttestLimits::default(),
        )
        .expect_err("no such file");
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
    }
}
