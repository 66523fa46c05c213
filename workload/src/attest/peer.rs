//! The process at the other end of a Workload API connection, pinned at accept time.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use nix::errno::Errno;
use nix::sys::socket::{getsockopt, sockopt};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::process::{pidfd_open, Pid, PidfdFlags};

use super::{parse, proc, AttestError, GoneReason};

/// The process that connected to a Workload API socket, as the kernel reported it when the
/// connection was accepted.
///
/// Capture it with [`PeerProcess::of`] right after `accept()`, before the peer can hand its end
/// of the socket to another process or exit. It holds the peer's credentials as of `connect()`
/// and a pidfd: a handle on that very process that the kernel never re-targets, so a pid recycled
/// by another process, or a socket passed on (by `SCM_RIGHTS` or `fork`) by a process that then
/// exits, is recognised by [`still_same`](super::still_same) and never inherits the identity.
///
/// `Send + Sync` and cheap to clone (an [`Arc`] inside), so that every request on one connection
/// shares it; the pidfd closes when the last clone is dropped.
#[derive(Clone)]
pub struct PeerProcess {
    inner: Arc<Inner>,
}

struct Inner {
    pid: u32,
    uid: u32,
    gid: u32,
    hold: Hold,
    /// What the process ran when the connection was accepted.
    pinned: Pinned,
    warned: AtomicBool,
}

/// A file as the kernel names it: device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileId {
    pub(crate) dev: u64,
    pub(crate) ino: u64,
}

impl FileId {
    pub(crate) fn of(metadata: &std::fs::Metadata) -> FileId {
        FileId {
            dev: metadata.dev(),
            ino: metadata.ino(),
        }
    }
}

/// The binary a process runs and the mount namespace it lives in, each as the file the kernel
/// links from `/proc/<pid>/exe` and `/proc/<pid>/ns/mnt` (`None` where that link cannot be
/// followed: another user's process when the server is not root, a kernel thread, a process gone).
/// `exec` changes the first and `unshare`/`setns` the second; neither can be changed back to the
/// same values by a process that once changed them except by running the very same file in the
/// very same namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pinned {
    binary: Option<FileId>,
    mount_namespace: Option<FileId>,
}

impl Pinned {
    fn read(pid: u32) -> Pinned {
        Pinned {
            binary: linked_file(pid, "exe"),
            mount_namespace: linked_file(pid, "ns/mnt"),
        }
    }
}

/// The file `/proc/<pid>/<link>` links to, followed by the kernel (whatever namespace the process
/// is in, this names the very file).
fn linked_file(pid: u32, link: &str) -> Option<FileId> {
    std::fs::metadata(proc::path(pid, link))
        .ok()
        .map(|metadata| FileId::of(&metadata))
}

/// How the process is held on to.
enum Hold {
    /// `SO_PEERPIDFD` (Linux 6.5 and later): the kernel's own record of the process that
    /// connected, with no window in which its pid could be reused.
    PeerPidfd(OwnedFd),
    /// Kernels before 6.5. See [`PeerProcess::of`].
    Opened {
        pidfd: Option<OwnedFd>,
        starttime: u64,
    },
}

impl PeerProcess {
    /// Reads who is at the other end of a connected unix socket (a `std` or `tokio`
    /// `UnixStream`): `SO_PEERCRED` (pid, effective uid and gid, fixed at `connect()`) and
    /// `SO_PEERPIDFD`. It reads nothing under `/proc` unless the fallback below is taken.
    ///
    /// Where the kernel has no `SO_PEERPIDFD` (before Linux 6.5: `ENOPROTOOPT`), the fallback
    /// opens a pidfd from the pid (`pidfd_open`, Linux 5.3; without it, none) and records the
    /// process's start time from `/proc/<pid>/stat`. From then on a process that exits, or a
    /// pid that comes to name another process, is recognised as surely as with `SO_PEERPIDFD`.
    /// What the fallback cannot see is a pid reused *before* this call: if the process that
    /// connected exited and its pid was taken by a new process between `connect()` and here, the
    /// new process is the one held. The effective uid and gid of the process at attestation must
    /// still equal those the connection was made with, which limits such an impostor to the
    /// connecting user's own identities; a server calls this right after `accept()` to keep the
    /// window short.
    ///
    /// An `EINVAL` or `ESRCH` from `SO_PEERPIDFD` means the peer has already been reaped (Linux
    /// 6.5 to 6.15 cannot give a pidfd for it): that is [`AttestError::CallerGone`], never the
    /// fallback, which would look the pid up again and could find a new process.
    pub fn of(socket: impl AsFd) -> Result<Self, AttestError> {
        let socket = socket.as_fd();
        let creds = getsockopt(&socket, sockopt::PeerCredentials).map_err(|errno| {
            AttestError::PeerCredentials {
                what: "the peer credentials (SO_PEERCRED)",
                source: io::Error::from(errno),
            }
        })?;
        let pid = u32::try_from(creds.pid())
            .ok()
            .filter(|pid| *pid > 0)
            .ok_or(AttestError::PeerNotVisible)?;
        let (uid, gid) = (creds.uid(), creds.gid());
        let hold = match getsockopt(&socket, sockopt::PeerPidfd) {
            Ok(pidfd) => Hold::PeerPidfd(pidfd),
            Err(Errno::ENOPROTOOPT) => return Self::by_pid(pid, uid, gid),
            Err(Errno::EINVAL | Errno::ESRCH) => return Err(gone(pid, GoneReason::Exited)),
            Err(errno) => {
                return Err(AttestError::PeerCredentials {
                    what: "the peer's pidfd (SO_PEERPIDFD)",
                    source: io::Error::from(errno),
                })
            }
        };
        Ok(Self::new(pid, uid, gid, hold))
    }

    /// The fallback of [`PeerProcess::of`] for kernels without `SO_PEERPIDFD`.
    pub(crate) fn by_pid(pid: u32, uid: u32, gid: u32) -> Result<Self, AttestError> {
        let raw = i32::try_from(pid)
            .ok()
            .and_then(Pid::from_raw)
            .ok_or(AttestError::PeerNotVisible)?;
        let pidfd = match pidfd_open(raw, PidfdFlags::empty()) {
            Ok(pidfd) => Some(pidfd),
            Err(rustix::io::Errno::NOSYS) => None,
            Err(rustix::io::Errno::SRCH) => return Err(gone(pid, GoneReason::Exited)),
            Err(errno) => {
                return Err(AttestError::PeerCredentials {
                    what: "a pidfd of the peer (pidfd_open)",
                    source: io::Error::from(errno),
                })
            }
        };
        let stat = read_stat(pid)?;
        if stat.has_exited() {
            return Err(gone(pid, GoneReason::Exited));
        }
        let hold = Hold::Opened {
            pidfd,
            starttime: stat.starttime,
        };
        Ok(Self::new(pid, uid, gid, hold))
    }

    fn new(pid: u32, uid: u32, gid: u32, hold: Hold) -> Self {
        let inner = Inner {
            pid,
            uid,
            gid,
            hold,
            pinned: Pinned::read(pid),
            warned: AtomicBool::new(false),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The pid of the process that connected, in this pid namespace.
    pub fn pid(&self) -> u32 {
        self.inner.pid
    }

    /// The effective uid the process connected with.
    pub fn uid(&self) -> u32 {
        self.inner.uid
    }

    /// The effective gid the process connected with.
    pub fn gid(&self) -> u32 {
        self.inner.gid
    }

    /// The binary the process ran when its connection was accepted (device and inode), if the
    /// server could see it.
    pub(crate) fn binary(&self) -> Option<FileId> {
        self.inner.pinned.binary
    }

    /// True the first time it is asked: attestation warns once per connection, not per request.
    pub(crate) fn first_warning(&self) -> bool {
        !self.inner.warned.swap(true, Ordering::Relaxed)
    }
}

impl fmt::Debug for PeerProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &self.inner;
        let mut debug = f.debug_struct("PeerProcess");
        debug
            .field("pid", &inner.pid)
            .field("uid", &inner.uid)
            .field("gid", &inner.gid)
            .field("pinned", &inner.pinned);
        match &inner.hold {
            Hold::PeerPidfd(_) => debug.field("held_by", &"SO_PEERPIDFD"),
            Hold::Opened { pidfd, starttime } => debug
                .field(
                    "held_by",
                    &if pidfd.is_some() { "pidfd_open" } else { "pid" },
                )
                .field("starttime", starttime),
        };
        debug.finish()
    }
}

/// Checks that the process that connected is still alive with the same pid, the same effective
/// uid and gid, the same binary and the same mount namespace. Blocking (it reads `/proc`); cheap
/// enough to run before every request.
///
/// Fails with [`AttestError::CallerGone`] when the process has exited (even if not yet reaped),
/// when its pid names another process (the fallback compares start times), or when its effective
/// uid or gid is no longer the one it connected with: a process that changed its credentials must
/// reconnect, so that a connection made by one user cannot be used after the process becomes
/// another (a setuid program run with the socket inherited). Likewise when it runs another binary
/// or lives in another mount namespace than when its connection was accepted: a process that
/// connects, forks a child that keeps the socket and then `exec`s a registered binary must not lend
/// that binary's identity to the child.
pub fn still_same(peer: &PeerProcess) -> Result<(), AttestError> {
    let pid = peer.pid();
    match &peer.inner.hold {
        Hold::PeerPidfd(pidfd) => check_pidfd(pidfd, pid)?,
        Hold::Opened { pidfd, starttime } => {
            if let Some(pidfd) = pidfd {
                check_pidfd(pidfd, pid)?;
            }
            let stat = read_stat(pid)?;
            if stat.has_exited() {
                return Err(gone(pid, GoneReason::Exited));
            }
            if stat.starttime != *starttime {
                return Err(gone(pid, GoneReason::Replaced));
            }
        }
    }
    let path = proc::path(pid, "status");
    let status = read_or_gone(pid, &path, proc::STATUS_MAX)?;
    effective_ids(peer, &status, &path)?;
    let now = Pinned::read(pid);
    let pinned = &peer.inner.pinned;
    if now.binary != pinned.binary {
        return Err(gone(pid, GoneReason::BinaryChanged));
    }
    if now.mount_namespace != pinned.mount_namespace {
        return Err(gone(pid, GoneReason::MountNamespaceChanged));
    }
    Ok(())
}

/// The effective uid and gid in a caller's `/proc/<pid>/status`, which must be those it connected
/// with.
pub(crate) fn effective_ids(
    peer: &PeerProcess,
    status: &str,
    path: &Path,
) -> Result<(u32, u32), AttestError> {
    let malformed = |what| AttestError::ProcMalformed {
        path: path.to_owned(),
        what,
    };
    let [_, uid, _, _] = parse::status_ids(status, "Uid").ok_or_else(|| malformed("Uid line"))?;
    let [_, gid, _, _] = parse::status_ids(status, "Gid").ok_or_else(|| malformed("Gid line"))?;
    let connected = (peer.uid(), peer.gid());
    if uid != connected.0 {
        return Err(gone(
            peer.pid(),
            GoneReason::UidChanged {
                connected: connected.0,
                now: uid,
            },
        ));
    }
    if gid != connected.1 {
        return Err(gone(
            peer.pid(),
            GoneReason::GidChanged {
                connected: connected.1,
                now: gid,
            },
        ));
    }
    Ok((uid, gid))
}

/// Whether the pidfd's process is alive and still has `pid`. A pidfd becomes readable once its
/// process has exited, zombie or not; its fdinfo says `Pid: -1` once the process is reaped.
fn check_pidfd(pidfd: &OwnedFd, pid: u32) -> Result<(), AttestError> {
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    loop {
        let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
        match poll(&mut fds, Some(&now)) {
            Ok(0) => break,
            Ok(_) => return Err(gone(pid, GoneReason::Exited)),
            Err(rustix::io::Errno::INTR) => continue,
            Err(errno) => {
                return Err(AttestError::PeerCredentials {
                    what: "the peer's liveness (poll on its pidfd)",
                    source: io::Error::from(errno),
                })
            }
        }
    }
    let path = PathBuf::from(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd()));
    let fdinfo = proc::read_bounded(&path, proc::FDINFO_MAX).map_err(|source| {
        AttestError::ProcUnreadable {
            path: path.clone(),
            source,
        }
    })?;
    match parse::fdinfo_pid(&fdinfo) {
        None => Err(AttestError::ProcMalformed {
            path,
            what: "Pid line",
        }),
        Some(-1) => Err(gone(pid, GoneReason::Exited)),
        Some(now) if now == i64::from(pid) => Ok(()),
        Some(_) => Err(gone(pid, GoneReason::Replaced)),
    }
}

fn read_stat(pid: u32) -> Result<parse::Stat, AttestError> {
    let path = proc::path(pid, "stat");
    let text = read_or_gone(pid, &path, proc::STAT_MAX)?;
    parse::stat(&text).ok_or(AttestError::ProcMalformed {
        path,
        what: "state and start time (fields 3 and 22)",
    })
}

/// Reads a file of `/proc/<pid>`; its absence (or `ESRCH`) means the process is gone.
pub(crate) fn read_or_gone(pid: u32, path: &Path, max: u64) -> Result<String, AttestError> {
    proc::read_bounded(path, max).map_err(|source| {
        let esrch = source.raw_os_error() == Some(Errno::ESRCH as i32);
        if source.kind() == io::ErrorKind::NotFound || esrch {
            return gone(pid, GoneReason::Exited);
        }
        AttestError::ProcUnreadable {
            path: path.to_owned(),
            source,
        }
    })
}

fn gone(pid: u32, reason: GoneReason) -> AttestError {
    AttestError::CallerGone { pid, reason }
}

#[cfg(test)]
#[path = "peer_tests.rs"]
mod tests;
