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
//! other. They describe the process as it is when attested: a process that runs another binary
//! after connecting is attested as that binary.

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
pub use selector::{parse_selector, Selector, SelectorError, SelectorKind, Selectors};

use binary::BinaryDigest;

/// How much work hashing one caller's binary may cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttestLimits {
    /// A binary larger than this gets no `unix:sha256` selector (default 256 MiB).
    pub max_binary_bytes: u64,
    /// A binary not hashed within this time gets no `unix:sha256` selector (default 10 s).
    pub hash_timeout: Duration,
}

impl Default for AttestLimits {
    fn default() -> Self {
        Self {
            max_binary_bytes: 256 * 1024 * 1024,
            hash_timeout: Duration::from_secs(10),
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
    add_binary(&mut selectors, peer, limits);
    let cgroup_path = proc::path(pid, "cgroup");
    let cgroup = read_live(peer, &cgroup_path, proc::CGROUP_MAX)?;
    selectors.insert(parse::cgroup_unit(&cgroup).and_then(selector::systemd_unit));
    still_same(peer)?;
    Ok(Caller {
        pid,
        uid,
        gid,
        selectors,
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

/// `unix:path` and `unix:sha256`, of the binary the process runs.
fn add_binary(selectors: &mut Selectors, peer: &PeerProcess, limits: &AttestLimits) {
    let pid = peer.pid();
    let exe = proc::path(pid, "exe");
    let target = match fs::read_link(&exe) {
        Ok(target) => target,
        // The process is gone (the final check says so) or is a kernel thread.
        Err(error) if error.kind() == io::ErrorKind::NotFound => return,
        Err(error) => {
            if peer.first_warning() {
                tracing::warn!(pid, %error, path = %exe.display(),
                    "cannot read the Workload API caller's binary; it gets no unix:path or unix:sha256 selector");
            }
            return;
        }
    };
    let text = target.to_str();
    if text.is_some_and(|text| text.ends_with(" (deleted)")) {
        return;
    }
    selectors.insert(text.and_then(selector::path));
    let skipped = match binary::hash(&exe, limits) {
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
        Err(error) if error.kind() == io::ErrorKind::NotFound => return,
        Err(error) => format!("it could not be read: {error}"),
    };
    if peer.first_warning() {
        tracing::warn!(pid, binary = %target.display(), reason = %skipped,
            "the Workload API caller's binary gets no unix:sha256 selector");
    }
}
