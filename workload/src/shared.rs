//! What every request of one Workload API server shares, and admitting a caller: its attestation,
//! its place in the per-process stream limit, and the snapshot it is matched against.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use meshca_control::Snapshot;
use meshca_serve::{ConnInfo, Hub, LogBudget};
use tonic::Status;

use crate::attest::{self, AttestError, PeerProcess, SelectorKind, Selectors};
use crate::callers::Callers;
use crate::jwt::JwtSvidCache;
use crate::jwt_source::JwtSource;
use crate::messages::MessageCache;
use crate::options::WorkloadOptions;
use crate::proto::{X509BundlesResponse, X509SvidResponse};

/// What every request of one server shares.
pub(crate) struct Shared {
    /// The hub the streams stand on: snapshots, and the owner they report to.
    pub(crate) hub: Hub,
    pub(crate) options: WorkloadOptions,
    /// Open streams per caller process.
    streams: Mutex<HashMap<u32, usize>>,
    /// The open streams, for operators.
    pub(crate) callers: Callers,
    refusals_logged: LogBudget,
    /// Where JWT-SVIDs come from; `None` on a socket that serves X.509-SVIDs only.
    pub(crate) jwt: Option<JwtSource>,
    /// Signed JWT-SVIDs kept for reuse.
    pub(crate) jwt_cache: Mutex<JwtSvidCache>,
    /// `FetchX509SVID` messages, encoded once for the streams that send them.
    pub(crate) svid_messages: MessageCache<X509SvidResponse>,
    /// `FetchX509Bundles` messages, encoded once for the streams that send them.
    pub(crate) bundle_messages: MessageCache<X509BundlesResponse>,
}

impl Shared {
    /// The state of a server whose streams are `hub`'s, with JWT-SVIDs from `jwt` (none: the JWT
    /// methods answer `UNAVAILABLE`).
    pub(crate) fn new(hub: Hub, options: WorkloadOptions, jwt: Option<JwtSource>) -> Shared {
        Shared {
            hub,
            jwt,
            jwt_cache: Mutex::new(JwtSvidCache::new(options.jwt_svid_cache)),
            refusals_logged: LogBudget::new(options.warnings_per_minute),
            options,
            streams: Mutex::new(HashMap::new()),
            callers: Callers::default(),
            svid_messages: MessageCache::default(),
            bundle_messages: MessageCache::default(),
        }
    }
}

impl Shared {
    /// Where JWT-SVIDs come from, or `UNAVAILABLE` on a socket that serves no JWT-SVIDs.
    pub(crate) fn jwt(&self) -> Result<&JwtSource, Status> {
        self.jwt.as_ref().ok_or_else(|| {
            Status::unavailable("JWT-SVIDs are not served on this Workload API socket")
        })
    }
}

/// One open stream's place in its caller's limit; released when the stream ends.
pub(crate) struct CallerSlot {
    shared: Arc<Shared>,
    pid: u32,
}

impl Drop for CallerSlot {
    fn drop(&mut self) {
        let mut streams = self
            .shared
            .streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(open) = streams.get_mut(&self.pid) {
            *open -= 1;
            if *open == 0 {
                streams.remove(&self.pid);
            }
        }
    }
}

/// A caller that passed attestation, with its stream slot.
pub(crate) struct Admitted {
    pub selectors: Arc<Selectors>,
    /// Whether the binary's digest was left out, no registration wanting it when admitted.
    pub digest_skipped: bool,
    pub caller: String,
    /// The caller's pid, uid and gid.
    pub ids: (u32, u32, u32),
    pub slot: CallerSlot,
    pub open: Option<meshca_serve::OpenStream>,
    /// The connection the request came on.
    pub conn: Option<ConnInfo>,
}

impl Shared {
    /// Attests the caller of a request on `conn` and takes a slot of its stream limit.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        conn: Option<&ConnInfo>,
    ) -> Result<Admitted, Status> {
        let peer = conn.and_then(ConnInfo::peer::<PeerProcess>).ok_or_else(|| {
            Status::unauthenticated(
                "the Workload API identifies callers by their process: connect over its unix socket",
            )
        })?;
        let slot = self.take_slot(peer.pid())?;
        let limits = self.options.attest;
        // The binary's digest is computed only where a registration could use it.
        let snapshot = self.published().await?;
        let agent = self.options.agent.clone();
        let attested = {
            let peer = peer.clone();
            tokio::task::spawn_blocking(move || {
                let wants_digest = |selectors: &Selectors| {
                    snapshot.registrations.could_be_decided_by(
                        agent.as_deref(),
                        SelectorKind::Sha256,
                        |s| selectors.contains(s),
                    )
                };
                attest::attest_for(&peer, &limits, &wants_digest)
            })
            .await
        };
        let caller = match attested {
            Ok(Ok(caller)) => caller,
            Ok(Err(error)) => return Err(self.refuse_attestation(&peer, conn, error)),
            Err(_) => return Err(Status::unavailable("workload attestation failed")),
        };
        Ok(Admitted {
            digest_skipped: caller.digest_skipped,
            caller: format!("pid {} uid {}", caller.pid, caller.uid),
            ids: (caller.pid, caller.uid, caller.gid),
            selectors: Arc::new(caller.selectors),
            slot,
            open: conn.map(ConnInfo::stream_opened),
            conn: conn.cloned(),
        })
    }

    fn take_slot(self: &Arc<Self>, pid: u32) -> Result<CallerSlot, Status> {
        let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        let open = streams.entry(pid).or_default();
        if *open >= self.options.streams_per_caller {
            return Err(Status::resource_exhausted(format!(
                "the caller has {} Workload API streams open, the most one process may \
                 (limits.workloadStreamsPerCaller)",
                *open
            )));
        }
        *open += 1;
        Ok(CallerSlot {
            shared: self.clone(),
            pid,
        })
    }

    fn refuse_attestation(
        &self,
        peer: &PeerProcess,
        conn: Option<&ConnInfo>,
        error: AttestError,
    ) -> Status {
        if self.refusals_logged.admit().is_some() {
            tracing::warn!(pid = peer.pid(), %error, "refused a Workload API caller");
        }
        match error {
            AttestError::CallerGone { .. } => {
                // Nothing on this connection will attest again: the caller must reconnect.
                if let Some(conn) = conn {
                    conn.close_when_idle();
                }
                Status::unauthenticated(
                    "could not verify that the caller is still the process that connected",
                )
            }
            _ => Status::unavailable("workload attestation failed"),
        }
    }

    /// The snapshot to match callers against: the newest one, once the owner has published its first
    /// (a caller right after the start waits for it, then `UNAVAILABLE`, which clients retry).
    pub(crate) async fn published(&self) -> Result<Arc<Snapshot>, Status> {
        let mut snapshots = self.hub.snapshots();
        let first = async {
            loop {
                let snapshot = snapshots.borrow_and_update().clone();
                if snapshot.generation > 0 {
                    return Ok(snapshot);
                }
                if snapshots.changed().await.is_err() {
                    return Err(Status::unavailable("the server is shutting down"));
                }
            }
        };
        tokio::time::timeout(self.options.identity_wait, first)
            .await
            .unwrap_or_else(|_| {
                Err(Status::unavailable(
                    "the daemon is starting: it has not published its identities yet",
                ))
            })
    }

    /// Refuses a caller that matches no registration (it may be registered later: clients retry,
    /// on a new connection). Its connection closes once its streams have ended, rather than holding
    /// a connection slot for the idle timeout.
    pub(crate) fn no_registration(&self, admitted: &Admitted) -> Status {
        if let Some(conn) = &admitted.conn {
            conn.close_when_idle();
        }
        let caller = &admitted.caller;
        if self.refusals_logged.admit().is_some() {
            tracing::info!(%caller, "a Workload API caller matches no WorkloadRegistration");
        }
        Status::permission_denied("no identity issued: the caller matches no WorkloadRegistration")
    }
}
