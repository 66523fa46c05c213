//! Why a caller could not be attested.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Why attestation failed. Every message names the caller's pid or the file involved, for an
/// operator's log line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AttestError {
    /// The kernel would not say who is at the other end of the socket.
    #[error("could not get {what} for the Workload API connection: {source}")]
    PeerCredentials {
        /// What was asked of the kernel (`SO_PEERCRED`, `SO_PEERPIDFD`, ...).
        what: &'static str,
        /// The kernel's answer.
        source: io::Error,
    },
    /// The peer's process is not visible from this pid namespace (the kernel reports pid 0), so
    /// nothing about it can be read.
    #[error(
        "the Workload API caller's process is outside this pid namespace (its peer credentials \
         carry no pid); serve the socket from a namespace that sees its callers"
    )]
    PeerNotVisible,
    /// The process that connected has exited, or its pid now names another process, or its
    /// effective ids, binary or mount namespace changed since it connected. The server answers `UNAUTHENTICATED`: the caller
    /// cannot be shown to still be the process that connected.
    #[error(
        "could not verify the caller is still the process that connected (pid {pid}): {reason}"
    )]
    CallerGone {
        /// The pid the caller had when it connected.
        pid: u32,
        /// What changed.
        reason: GoneReason,
    },
    /// A file under `/proc` about a live caller could not be read.
    #[error("could not read {path} to attest the Workload API caller: {source}", path = path.display())]
    ProcUnreadable {
        /// The file.
        path: PathBuf,
        /// Why it could not be read.
        source: io::Error,
    },
    /// A file under `/proc` did not hold what the kernel writes there.
    #[error("{path} has no readable {what}; cannot attest the Workload API caller", path = path.display())]
    ProcMalformed {
        /// The file.
        path: PathBuf,
        /// The field that is missing or malformed.
        what: &'static str,
    },
}

/// What shows that a caller is no longer the process that connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GoneReason {
    /// The process has exited (it may be a zombie not yet reaped).
    Exited,
    /// The pid now belongs to another process (its start time differs, or the pidfd names another
    /// pid).
    Replaced,
    /// The effective user id is not the one the process connected with.
    UidChanged {
        /// At `connect()`.
        connected: u32,
        /// Now.
        now: u32,
    },
    /// The effective group id is not the one the process connected with.
    GidChanged {
        /// At `connect()`.
        connected: u32,
        /// Now.
        now: u32,
    },
    /// The process runs another binary than when its connection was accepted (it `exec`ed).
    BinaryChanged,
    /// The process lives in another mount namespace than when its connection was accepted.
    MountNamespaceChanged,
}

impl fmt::Display for GoneReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exited => f.write_str("the process has exited"),
            Self::Replaced => f.write_str("the pid now names another process"),
            Self::UidChanged { connected, now } => write!(
                f,
                "its effective uid is {now}, but it connected as uid {connected}; it must reconnect"
            ),
            Self::GidChanged { connected, now } => write!(
                f,
                "its effective gid is {now}, but it connected as gid {connected}; it must reconnect"
            ),
            Self::BinaryChanged => f.write_str(
                "it runs another binary than when it connected (it exec'ed); it must reconnect",
            ),
            Self::MountNamespaceChanged => f.write_str(
                "it lives in another mount namespace than when it connected; it must reconnect",
            ),
        }
    }
}
