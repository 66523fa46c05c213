//! Callers a service knows without a token: the Workload API socket knows its callers by their process,
//! and another protocol on the same socket (SDS, for Envoys set up for a SPIRE agent's socket) serves
//! them as that service says.

use std::sync::Arc;

use futures::future::BoxFuture;
use meshca_auth::Claims;
use meshca_control::Snapshot;
use tonic::Status;

use crate::conn::ConnInfo;

/// Whether a caller that was authenticated without a token may still be served from a snapshot: run
/// on every snapshot its stream wakes for; the error ends the stream.
pub type AttestedCheck = Arc<dyn Fn(&Snapshot) -> Result<(), Status> + Send + Sync>;

/// A caller another service authenticated instead of by a token. Its requests carry no token and their
/// node ids are not checked; the rest is as for a proxy with a token.
pub struct Attested {
    /// What the caller is served as: the proxy, its labels, and the expiry that ends its streams.
    pub claims: Claims,
    /// Asked of each snapshot the caller is served from; an error ends its stream (its registration
    /// went away).
    pub check: AttestedCheck,
    /// Kept for as long as the stream or fetch runs (e.g. the caller's place in a limit).
    pub hold: Box<dyn std::any::Any + Send + Sync>,
}

impl std::fmt::Debug for Attested {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attested")
            .field("mesh", &self.claims.mesh)
            .field("name", &self.claims.name)
            .finish_non_exhaustive()
    }
}

/// A service that attests the callers of its socket: who the caller of a connection is, or why it is
/// refused.
pub trait Attest: Send + Sync + 'static {
    /// The caller at the other end of `conn` (`None`: the request came through no listener of the hub).
    fn attest(&self, conn: Option<ConnInfo>) -> BoxFuture<'static, Result<Attested, Status>>;
}

/// Adds to a socket's routes a protocol whose callers `attest` knows: SDS on the Workload API socket,
/// for Envoys set up for a SPIRE agent's socket. The socket's owner (the Workload API) attests; the
/// protocol's server (SDS) serves.
pub type AttestedRoutes =
    Box<dyn FnOnce(tonic::service::Routes, Arc<dyn Attest>) -> tonic::service::Routes + Send>;
