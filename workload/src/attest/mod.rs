//! Who is calling: attestation of a Workload API caller by what the kernel says about it.
//!
//! A caller proves nothing itself. At accept time the server captures the peer of the
//! connection ([`PeerProcess::of`]: its credentials from `connect()` and a pidfd on the process);
//! for a request it runs [`attest`], which reads `/proc/<pid>` into [`Selectors`] and then checks
//! that the process read is still the one that connected, so that a pid recycled by another
//! process or a socket handed on by a process that has since exited gets
//! [`AttestError::CallerGone`], never someone else's identity.
//!
//! The selectors are SPIRE's names for the same facts (`unix:uid:1001`, `unix:path:/usr/bin/x`,
//! `systemd:unit:billing.service`, ...), so a registration written for one reads the same in the
//! other. A caller is held to what it was when its connection was accepted: a process that has
//! since run another binary, or moved to another mount namespace, is no longer the caller (as one
//! that changed its uid or gid), and must reconnect to be attested as what it now is.

mod binary;
mod error;
mod parse;
mod peer;
mod proc;
mod selector;

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::time::Duration;

use nix::unistd::{Gid, Group, Uid, User};

pub use error::{AttestError, GoneReason};
pub use peer::{still_same, PeerProcess};

use peer::FileId;
pub use selector::{parse_selector, Selector, SelectorError, SelectorKind, Selectors};

use binary::BinaryDigest;

/// How much work hashing one caller's binary may cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttestLimits {
    /// A binary larger than this gets no `unix:sha256` selector (default 256 MiB).
    pub max_binary_bytes: u64,
    /// A binary not hashed within this time gets no `unix:sha256` selector (default 10 s).
    pub hash_timeout: Duration,
    /// Bytes hashed for the callers of one uid in a minute (default 1 GiB); past it, the uid's
    /// callers whose binary's digest is not kept get no `unix:sha256` selector until the minute ends.
    pub hash_bytes_per_uid_minute: u64,
}

impl Default for AttestLimits {
    fn default() -> Self {
        Self {
            max_binary_bytes: 256 * 1024 * 1024,
            hash_timeout: Duration::from_secs(10),
            hash_bytes_per_uid_minute: 1024 * 1024 * 1024,
        }
    }
}

/// An attested caller: the process that connected, with every selector it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Its pid, in this pid namespace.
    pub pid: u32,
    /// Its effective uid, the one it connected with.
    pub uid: u32,
    /// Its effective gid, the one it connected with.
    pub gid: u32,
    /// Everything attestation found: ids and names always; the binary's path and digest, and
    /// the systemd service, where there are any.
    pub selectors: Selectors,
    /// Whether the binary's digest was left out because no registration could use it (see
    /// [`attest_for`]): a registration that could is matched only after the caller reconnects.
    pub digest_skipped: bool,
}

/// Attests the process that connected: reads its `/proc/<pid>` files, computes every selector,
/// then checks with [`still_same`] that the process read is still the one that connected (alive,
/// same pid, same effective ids), so that nothing read belongs to another process.
///
/// Blocking: it reads `/proc`, looks names up in the user database and may hash a binary of up to
/// [`AttestLimits::max_binary_bytes`]; run it off the async runtime (`spawn_blocking`).
///
/// A binary that cannot be read (`/proc/<pid>/exe` of another user when the server is not root),
/// that was deleted since it started (`(deleted)`), or that is too big or too slow to hash, gives
/// fewer selectors and one warning per connection, not an error: with fewer selectors a caller
/// matches fewer registrations, never more.
pub fn attest(peer: &PeerProcess, limits: &AttestLimits) -> Result<Caller, AttestError> {
    attest_for(peer, limits, &|_: &Selectors| true)
}

/// [`attest`], hashing the caller's binary only when `wants_digest` says a `unix:sha256` selector
/// could decide a match given the caller's other selectors (a registration naming a digest whose
/// other selectors the caller all has): a caller that no such registration could match costs no
/// hashing, whatever binary it runs.
pub fn attest_for(
    peer: &PeerProcess,
    limits: &AttestLimits,
    wants_digest: &dyn Fn(&Selectors) -> bool,
) -> Result<Caller, AttestError> {
    let pid = peer.pid();
    let status_path = proc::path(pid, "status");
    let status = read_live(peer, &status_path, proc::STATUS_MAX)?;
    let (uid, gid) = peer::effective_ids(peer, &status, &status_path)?;
    let groups = parse::status_groups(&status).ok_or_else(|| AttestError::ProcMalformed {
        path: status_path.clone(),
        what: "Groups line",
    })?;
    let mut selectors = Selectors::default();
    add_ids(&mut selectors, uid, gid, &groups);
    let cgroup_path = proc::path(pid, "cgroup");
    let cgroup = read_live(peer, &cgroup_path, proc::CGROUP_MAX)?;
    selectors.insert(parse::cgroup_unit(&cgroup).and_then(selector::systemd_unit));
    let binary = add_path(&mut selectors, peer);
    let mut digest_skipped = false;
    if let Some(binary) = binary {
        if wants_digest(&selectors) {
            add_digest(&mut selectors, peer, uid, &binary, limits);
        } else {
            digest_skipped = true;
        }
    }
    still_same(peer)?;
    Ok(Caller {
        pid,
        uid,
        gid,
        selectors,
        digest_skipped,
    })
}

/// Reads a caller's `/proc` file; when that fails, a caller that is gone is the answer.
fn read_live(peer: &PeerProcess, path: &std::path::Path, max: u64) -> Result<String, AttestError> {
    peer::read_or_gone(peer.pid(), path, max).map_err(|error| match still_same(peer) {
        Err(gone @ AttestError::CallerGone { .. }) => gone,
        _ => error,
    })
}

/// The id selectors, with a name selector for each id the user database names.
fn add_ids(selectors: &mut Selectors, uid: u32, gid: u32, groups: &[u32]) {
    selectors.insert(selector::uid(uid));
    selectors.insert(user_name(uid).as_deref().and_then(selector::user));
    let mut group_names = BTreeMap::new();
    let mut group_name = |gid: u32| -> Option<String> {
        group_names
            .entry(gid)
            .or_insert_with(|| group_name(gid))
            .clone()
    };
    selectors.insert(selector::gid(gid));
    selectors.insert(group_name(gid).as_deref().and_then(selector::group));
    for &supplementary in groups {
        selectors.insert(selector::supplementary_gid(supplementary));
        let name = group_name(supplementary);
        selectors.insert(name.as_deref().and_then(selector::supplementary_group));
    }
}

fn user_name(uid: u32) -> Option<String> {
    match User::from_uid(Uid::from_raw(uid)) {
        Ok(user) => user.map(|user| user.name),
        Err(errno) => {
            tracing::debug!(uid, %errno, "the user database did not answer for a caller's uid");
            None
        }
    }
}

fn group_name(gid: u32) -> Option<String> {
    match Group::from_gid(Gid::from_raw(gid)) {
        Ok(group) => group.map(|group| group.name),
        Err(errno) => {
            tracing::debug!(gid, %errno, "the group database did not answer for a caller's gid");
            None
        }
    }
}

/// The binary a caller runs, as seen from this server: the path it was found at and its identity.
struct SeenBinary {
    path: String,
    id: FileId,
}

/// `unix:path`, of the binary the process runs: only when the path the kernel gives for it names, in
/// this server's own mount namespace, the very file the process runs (the same device and inode as
/// `/proc/<pid>/exe`, pinned when the connection was accepted). The path is text from the caller's
/// mount namespace, which any user can build (`unshare -Urm` and a tmpfs over `/usr/local/bin`), so
/// it is evidence only where the server sees the same file there. Returns the binary, for its digest.
fn add_path(selectors: &mut Selectors, peer: &PeerProcess) -> Option<SeenBinary> {
    let pid = peer.pid();
    let Some(running) = peer.binary() else {
        // Not visible when the connection was accepted: another user's process when the server is
        // not root, a kernel thread, or a process already gone (the final check says so).
        if peer.first_warning() {
            tracing::warn!(pid, path = %proc::path(pid, "exe").display(),
                "cannot see the Workload API caller's binary; it gets no unix:path or unix:sha256 selector");
        }
        return None;
    };
    let exe = proc::path(pid, "exe");
    let target = match fs::read_link(&exe) {
        Ok(target) => target,
        // The process is gone (the final check says so).
        Err(error) if error.kind() == io::ErrorKind::NotFound => return None,
        Err(error) => {
            if peer.first_warning() {
                tracing::warn!(pid, %error, path = %exe.display(),
                    "cannot read the Workload API caller's binary; it gets no unix:path or unix:sha256 selector");
            }
            return None;
        }
    };
    let text = target.to_str()?;
    if text.ends_with(" (deleted)") {
        return None;
    }
    let here = fs::metadata(&target).map(|metadata| FileId::of(&metadata));
    if here.as_ref().ok() != Some(&running) {
        if peer.first_warning() {
            let seen = match &here {
                Ok(_) => "another file".to_owned(),
                Err(error) => format!("nothing ({error})"),
            };
            tracing::warn!(pid, binary = %meshca_serve::shown(text), %seen,
                "the Workload API caller's binary path names {seen} in this server's mount namespace \
                 (the caller runs in a mount namespace of its own); it gets no unix:path or unix:sha256 selector");
        }
        return None;
    }
    selectors.insert(selector::path(text));
    Some(SeenBinary {
        path: text.to_owned(),
        id: running,
    })
}

/// `unix:sha256`, of the binary [`add_path`] found: hashed through `/proc/<pid>/exe` (the very file
/// the process runs), within the size, time and per-uid limits.
fn add_digest(
    selectors: &mut Selectors,
    peer: &PeerProcess,
    uid: u32,
    binary: &SeenBinary,
    limits: &AttestLimits,
) {
    let exe = proc::path(peer.pid(), "exe");
    let skipped = match binary::hash(&exe, binary.id, uid, limits) {
        Ok(BinaryDigest::Sha256(digest)) => {
            selectors.insert(selector::sha256(digest));
            return;
        }
        Ok(BinaryDigest::TooBig { size }) => format!(
            "it holds {size} bytes or more, over the limit of {}",
            limits.max_binary_bytes
        ),
        Ok(BinaryDigest::TooSlow { read }) => format!(
            "hashing it took longer than {:?} ({read} bytes read)",
            limits.hash_timeout
        ),
        Ok(BinaryDigest::OverBudget { size }) => format!(
            "its {size} bytes are more than is left of uid {uid}'s hashing budget ({} bytes a minute)",
            limits.hash_bytes_per_uid_minute
        ),
        // The process is gone or runs another binary now (the final check says so).
        Ok(BinaryDigest::Changed) => return,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return,
        Err(error) => format!("it could not be read: {error}"),
    };
    if peer.first_warning() {
        tracing::warn!(pid = peer.pid(), binary = %meshca_serve::shown(&binary.path), reason = %skipped,
            "the Workload API caller's binary gets no unix:sha256 selector");
    }
}
