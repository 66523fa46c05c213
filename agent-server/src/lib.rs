//! The server side of the agent protocol, and the protocol itself ([`proto`], one place for the process
//! and the server): the `meshca.agent.v1.Agent` gRPC service a meshca daemon serves on its SDS listeners,
//! beside SDS. The agent process is the `meshca-agent` crate; the daemon links only this one.
//!
//! Each agent authenticates with its token (of type `agent`, checked as SDS checks tokens: same key,
//! revocation list and expiry). Its `Sync` stream speaks to the owner for every registration that names
//! the agent as an SDS stream of that registration's Dataplane would ([`sync`]): connected, subscribed,
//! ACKed when the agent acknowledges a state, so the rollout gate orders a rotation for the workloads
//! behind the agent as it does for Envoys. The agent's key requests are checked here ([`keys`]) and
//! handed to the owner as `KeyOffered`; the server never sees a private key.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod keys;
mod mint;
pub mod proto;
mod state;
mod status;
mod sync;

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meshca_auth::{Claims, ProxyType};
use meshca_identity::KeyAlgorithm;
use meshca_serve::grpc_service::{Grpc, GrpcMethods};
use meshca_serve::{shown, ConnInfo, Hub, LogBudget, OpenStream};
use meshca_workload::jwt::{CacheLimits, JwtSvidCache};
use meshca_workload::jwt_keys::JwtKeys;
use tonic::codegen::{http, BoxFuture};
use tonic::Status;

use crate::proto::paths;

pub use status::{AgentStatus, Agents, RegistrationStatus};

pub use proto::KEY_REQUESTS_PER_MESSAGE;

/// Tunables and bounds of the agent protocol's server side (the daemon takes them from its settings).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AgentOptions {
    /// The algorithm of the keys agents must make: the daemon's leaf key algorithm
    /// (`issuance.keyAlgorithm`).
    pub key_algorithm: KeyAlgorithm,
    /// `Sync` streams one agent (one token name) may hold open at once (`limits.agentStreamsPerAgent`).
    pub streams_per_agent: usize,
    /// The largest message an agent may send, in bytes (`limits.agentMessageBytes`).
    pub message_bytes: usize,
    /// Audiences one JWT-SVID request may ask for (`limits.jwtAudiencesPerRequest`).
    pub jwt_audiences_per_request: usize,
    /// The longest audience, in bytes (`limits.jwtAudienceBytes`).
    pub jwt_audience_bytes: usize,
    /// Signed JWT-SVIDs kept for reuse (`limits.jwtSvidCache*`).
    pub jwt_svid_cache: CacheLimits,
    /// Warnings about one agent's requests logged per minute (`limits.warningsPerMinute`).
    pub warnings_per_minute: u32,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            key_algorithm: KeyAlgorithm::default(),
            streams_per_agent: 4,
            message_bytes: 1024 * 1024,
            jwt_audiences_per_request: 32,
            jwt_audience_bytes: 1024,
            jwt_svid_cache: CacheLimits::default(),
            warnings_per_minute: 10,
        }
    }
}

impl AgentOptions {
    /// The defaults, with agents' keys of `key_algorithm`.
    pub fn new(key_algorithm: KeyAlgorithm) -> Self {
        AgentOptions {
            key_algorithm,
            ..AgentOptions::default()
        }
    }

    /// These options with at most `streams` `Sync` streams per agent.
    pub fn with_streams_per_agent(mut self, streams: usize) -> Self {
        self.streams_per_agent = streams;
        self
    }

    /// These options with messages of at most `bytes`.
    pub fn with_message_bytes(mut self, bytes: usize) -> Self {
        self.message_bytes = bytes;
        self
    }

    /// These options with the JWT-SVID bounds: audiences per request, bytes per audience, and signed
    /// tokens kept for reuse.
    pub fn with_jwt_limits(
        mut self,
        audiences: usize,
        audience_bytes: usize,
        cached: CacheLimits,
    ) -> Self {
        self.jwt_audiences_per_request = audiences;
        self.jwt_audience_bytes = audience_bytes;
        self.jwt_svid_cache = cached;
        self
    }

    /// These options with `per_minute` warnings per agent.
    pub fn with_warnings_per_minute(mut self, per_minute: u32) -> Self {
        self.warnings_per_minute = per_minute;
        self
    }
}

/// The agent protocol's server: a tonic service (`meshca.agent.v1.Agent`) to add beside SDS on the SDS
/// listeners (`Routes::new(sds.into_service()).add_service(agent.into_service())`). Cheap to clone; every clone serves
/// the same agents.
#[derive(Clone)]
pub struct AgentServer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for AgentServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentServer")
            .field("options", &self.shared.options)
            .field("agents", &self.shared.agents.len())
            .finish_non_exhaustive()
    }
}

impl AgentServer {
    /// A server that serves agents `hub`'s snapshots (with its tokens and revocations), reports their
    /// streams to the owner through it, and signs JWT-SVIDs with `jwt_keys`.
    pub fn new(hub: Hub, jwt_keys: JwtKeys, options: AgentOptions) -> Self {
        AgentServer {
            shared: Arc::new(Shared {
                jwt_cache: Mutex::new(JwtSvidCache::new(options.jwt_svid_cache)),
                refusals_logged: LogBudget::new(options.warnings_per_minute),
                hub,
                jwt_keys,
                options,
                agents: Agents::default(),
                ignored_key_requests: AtomicU64::new(0),
            }),
        }
    }

    /// The connected agents, for the admin API.
    pub fn agents(&self) -> Agents {
        self.shared.agents.clone()
    }

    /// Key requests ignored since the start because their registration did not name the agent that
    /// sent them (it may have moved to another agent while the request was in flight).
    pub fn ignored_key_requests(&self) -> u64 {
        self.shared.ignored_key_requests.load(Ordering::Relaxed)
    }
}

/// What every request of one server shares.
pub(crate) struct Shared {
    /// The hub the agents' streams stand on.
    pub(crate) hub: Hub,
    pub(crate) jwt_keys: JwtKeys,
    pub(crate) options: AgentOptions,
    pub(crate) agents: Agents,
    pub(crate) jwt_cache: Mutex<JwtSvidCache>,
    /// Log lines about refused requests, which anyone who can connect can cause.
    refusals_logged: LogBudget,
    pub(crate) ignored_key_requests: AtomicU64,
}

/// An agent whose token was accepted.
pub(crate) struct Admitted {
    pub(crate) claims: Arc<Claims>,
    /// Where it connected from, for status.
    pub(crate) peer: Option<String>,
    /// The request counted as a stream of its connection (the connection's limits and idle deadline).
    pub(crate) open: Option<OpenStream>,
}

impl Shared {
    /// Checks a request's token: verified as SDS verifies tokens, and an agent's.
    pub(crate) fn admit(
        &self,
        request: &http::Request<tonic::body::Body>,
    ) -> Result<Admitted, Status> {
        let claims = self.hub.verify_bearer(request.headers())?;
        if claims.proxy_type != ProxyType::Agent {
            let status = Status::permission_denied(format!(
                "token {} is not an agent token (it is {}'s): the agent protocol takes tokens made with \
                 `meshca token --type agent --name HOST`",
                claims.id,
                shown(&claims.subject())
            ));
            if let Some(suppressed) = self.refusals_logged.admit() {
                tracing::info!(code = ?status.code(), message = status.message(), suppressed, "agent request refused");
            }
            return Err(status);
        }
        let conn = request.extensions().get::<ConnInfo>();
        Ok(Admitted {
            claims: Arc::new(claims),
            peer: conn.and_then(|c| c.remote_addr).map(|a| a.to_string()),
            open: conn.map(ConnInfo::stream_opened),
        })
    }

    /// How long an agent has to send its Hello, and a JWT-SVID request waits for a signing key.
    pub(crate) fn first_message_wait(&self) -> Duration {
        self.hub.first_request_wait()
    }
}

impl AgentServer {
    /// The service tonic's router mounts beside SDS.
    pub fn into_service(self) -> Grpc<AgentServer> {
        Grpc(self)
    }
}

impl GrpcMethods for AgentServer {
    const NAME: &'static str = paths::SERVICE;

    fn answer(
        &self,
        request: http::Request<tonic::body::Body>,
    ) -> BoxFuture<http::Response<tonic::body::Body>, Infallible> {
        let shared = self.shared.clone();
        Box::pin(async move {
            Ok(match request.uri().path() {
                paths::SYNC => sync::serve(shared, request).await,
                paths::MINT_JWT_SVID => mint::serve(shared, request).await,
                _ => Status::unimplemented("no such method of meshca.agent.v1.Agent").into_http(),
            })
        })
    }
}
