//! What the embedder tunes: the Workload API server's options and bounds.

use std::time::Duration;

use crate::attest::AttestLimits;
use crate::jwt::CacheLimits;

/// The default of [`WorkloadOptions::ack_after`] (the setting `workloadApi.ackAfter`).
pub const DEFAULT_ACK_AFTER: Duration = Duration::from_secs(1);

/// The default of [`WorkloadOptions::jwt_key_lifetime`] (the setting `workloadApi.jwtKeyLifetime`).
pub const DEFAULT_JWT_KEY_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// Tunables and bounds of the Workload API server.
#[derive(Debug, Clone)]
pub struct WorkloadOptions {
    /// How long a stream waits for its caller's identity before failing with `UNAVAILABLE`.
    pub identity_wait: Duration,
    /// How long after a message is written it counts as ACKed for the rollout gate: a Workload API
    /// client sends nothing back, so this is the time a workload gets to put a new bundle or SVID in
    /// use (a SPIFFE library does at once; an application reloading files from spiffe-helper takes
    /// longer).
    pub ack_after: Duration,
    /// How long a trust domain's JWT signing key signs before the next one takes over
    /// (`workloadApi.jwtKeyLifetime`; see [`crate::jwt_keys`]).
    pub jwt_key_lifetime: Duration,
    /// Concurrent streams of one caller (one process).
    pub streams_per_caller: usize,
    /// Connections one uid may hold on one socket (`limits.workloadConnectionsPerUid`).
    pub connections_per_uid: usize,
    /// The largest request message, in bytes.
    pub request_bytes: usize,
    /// Bounds on attesting a caller.
    pub attest: AttestLimits,
    /// Warnings about refused callers logged per minute.
    pub warnings_per_minute: u32,
    /// Audiences one JWT-SVID request may ask for (`limits.jwtAudiencesPerRequest`).
    pub jwt_audiences_per_request: usize,
    /// The longest audience, in bytes (`limits.jwtAudienceBytes`).
    pub jwt_audience_bytes: usize,
    /// Signed JWT-SVIDs kept for reuse (`limits.jwtSvidCacheEntries`, `limits.jwtSvidCacheBytes`,
    /// `limits.jwtSvidCacheBytesPerIdentity`).
    pub jwt_svid_cache: CacheLimits,
    /// Which registrations this socket serves: those naming this agent (`spec.agent`), or with
    /// `None` those naming no agent (the server's own socket).
    pub agent: Option<String>,
}

impl Default for WorkloadOptions {
    fn default() -> Self {
        WorkloadOptions {
            identity_wait: Duration::from_secs(15),
            ack_after: DEFAULT_ACK_AFTER,
            jwt_key_lifetime: DEFAULT_JWT_KEY_LIFETIME,
            streams_per_caller: 64,
            connections_per_uid: 256,
            request_bytes: 64 * 1024,
            attest: AttestLimits::default(),
            warnings_per_minute: 10,
            jwt_audiences_per_request: 32,
            jwt_audience_bytes: 1024,
            jwt_svid_cache: CacheLimits::default(),
            agent: None,
        }
    }
}
