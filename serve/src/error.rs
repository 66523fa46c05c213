//! Errors of the listeners and of opening a channel.

use std::io;
use std::path::PathBuf;

/// A listener could not be set up. Each variant names the address to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ListenError {
    /// The socket could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// The address, as configured.
        address: String,
        /// The operating system's reason.
        source: io::Error,
    },
    /// The directory that should hold a unix socket does not exist.
    #[error("cannot listen on unix socket {path}: its directory {parent} does not exist; create it (mode 0750 or stricter) first", path = .path.display(), parent = .parent.display())]
    MissingParent {
        /// The socket path.
        path: PathBuf,
        /// The missing directory.
        parent: PathBuf,
    },
    /// Something other than a socket sits at the socket path.
    #[error("cannot listen on unix socket {path}: the path exists and is not a socket; remove it or choose another path", path = .path.display())]
    NotASocket {
        /// The socket path.
        path: PathBuf,
    },
    /// A live process is already serving on the socket path.
    #[error("cannot listen on unix socket {path}: another process is already serving on it", path = .path.display())]
    SocketInUse {
        /// The socket path.
        path: PathBuf,
    },
    /// The unix socket could not be restricted to its owner and group.
    #[error("cannot set mode 0660 on unix socket {path}: {source}", path = .path.display())]
    Permissions {
        /// The socket path.
        path: PathBuf,
        /// The operating system's reason.
        source: io::Error,
    },
    /// A plaintext TCP listener was asked for on an address other than loopback.
    #[error("refusing plaintext SDS on {address}: an insecure listener must use a loopback address (127.0.0.1 or ::1); use TLS for anything else")]
    NotLoopback {
        /// The refused address.
        address: std::net::SocketAddr,
    },
}

/// The gRPC server stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The HTTP/2 transport failed.
    #[error("SDS server failed: {message}")]
    Transport {
        /// What failed.
        message: String,
    },
}

/// A channel to a meshca listener could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The target is neither `unix:///path` nor `host:port`.
    #[error("invalid SDS server address {target:?}: {reason}")]
    InvalidTarget {
        /// The target as given.
        target: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The TLS settings could not be used (bad CA PEM, bad server name).
    #[error("invalid TLS settings for the SDS client: {reason}")]
    Tls {
        /// What is wrong.
        reason: String,
    },
    /// Connecting to the server failed.
    #[error("cannot connect to the SDS server at {target}: {reason}")]
    Connect {
        /// The target.
        target: String,
        /// Why.
        reason: String,
    },
}

/// Displays an error with its sources, `what failed: why: why`: for messages and logs that say the
/// whole of an error.
#[derive(Debug)]
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}
