//! What the SDS server tells the owner about streams: who connected, what they subscribe to, what
//! they ACKed. The owner keeps its own table of streams from these events (see `streams.rs`), so the
//! rollout gate never has to ask the server.

use std::fmt;
use std::sync::Arc;

use meshca_auth::Claims;

use crate::resource_name::ResourceName;

/// Identifies one SDS stream (or fetch) for the lifetime of the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(transparent)]
pub struct StreamId(pub u64);

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A stream's life, reported on the event channel given to the server.
///
/// `generation` is the newest snapshot generation whose content, for the stream's resources, equals
/// what the proxy holds: when a snapshot change leaves a stream's content untouched no response is
/// sent, the pending or last ACKed response is deemed to be of the new generation, and (if already
/// ACKed) an `Acked` event is emitted again with the new generation. So "every stream has ACKed
/// generation ≥ G" means every proxy holds G's content.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum StreamEvent {
    /// A proxy authenticated (stream or fetch). Emitted before waiting for its identity, so the
    /// owner can register a proxy it does not know yet.
    Connected {
        /// The stream.
        stream: StreamId,
        /// The verified token claims, shared with the stream that holds them.
        claims: Arc<Claims>,
    },
    /// The stream's subscription is now exactly `resources` (sent when it changes).
    Subscribed {
        /// The stream.
        stream: StreamId,
        /// The names it subscribes to.
        resources: Vec<ResourceName>,
    },
    /// The proxy accepted the content of snapshot `generation` for its resources.
    Acked {
        /// The stream.
        stream: StreamId,
        /// The snapshot generation the ACKed content corresponds to.
        generation: u64,
        /// The version of the ACKed response.
        version: String,
    },
    /// The proxy rejected a response and keeps its previous secrets (the server logs and counts it).
    Nacked {
        /// The stream.
        stream: StreamId,
        /// The snapshot generation of the rejected response.
        generation: u64,
        /// The version of the rejected response.
        version: String,
        /// The proxy's error message.
        message: String,
    },
    /// The stream's proxy holds its own keys (a `meshca agent` serving a Workload API registration):
    /// this is a key it made for its next certificate, from a request whose signature proved the agent
    /// holds the private half. The owner issues the proxy's certificates over the newest key offered,
    /// never over a key of its own.
    KeyOffered {
        /// The stream (the agent's stream for the registration's Dataplane).
        stream: StreamId,
        /// The public key to certify.
        key: Arc<meshca_ca::PublicKey>,
        /// The agent holds no key for the certificate it has (it restarted): issue over this key at
        /// once, instead of at the next renewal.
        replace_now: bool,
    },
    /// A stream or a fetch ended.
    Disconnected {
        /// The stream.
        stream: StreamId,
    },
}

impl StreamEvent {
    /// The stream the event is about.
    pub fn stream(&self) -> StreamId {
        match self {
            StreamEvent::Connected { stream, .. }
            | StreamEvent::Subscribed { stream, .. }
            | StreamEvent::Acked { stream, .. }
            | StreamEvent::Nacked { stream, .. }
            | StreamEvent::KeyOffered { stream, .. }
            | StreamEvent::Disconnected { stream } => *stream,
        }
    }
}
