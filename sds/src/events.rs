//! What the server tells the owner about streams.

use std::fmt;

use meshca_auth::Claims;

use crate::snapshot::ProxyKey;

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
/// `generation` is the newest snapshot generation whose content, for the stream's
/// resources, equals what the proxy received: when a snapshot change leaves a stream's
/// content untouched no response is sent, the pending or last ACKed response is deemed to
/// be of the new generation, and (if already ACKed) an `Acked` event is emitted again with
/// the new generation. So "every stream has ACKed generation ≥ G" means every proxy holds
/// G's content.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum StreamEvent {
    /// A proxy authenticated (stream or fetch). Emitted before waiting for its identity,
    /// so the owner can register a proxy it does not know yet.
    Connected {
        /// The stream.
        stream: StreamId,
        /// The verified token claims.
        claims: Claims,
    },
    /// The proxy accepted a response.
    Acked {
        /// The stream.
        stream: StreamId,
        /// The proxy.
        proxy: ProxyKey,
        /// The snapshot generation the ACKed content corresponds to.
        generation: u64,
        /// The resources of the ACKed response (delta: the ones it changed or removed).
        resources: Vec<String>,
        /// The version of the ACKed response.
        version: String,
    },
    /// The proxy rejected a response; it keeps its previous secrets.
    Nacked {
        /// The stream.
        stream: StreamId,
        /// The proxy.
        proxy: ProxyKey,
        /// The snapshot generation of the rejected response.
        generation: u64,
        /// The resources of the rejected response.
        resources: Vec<String>,
        /// The version of the rejected response.
        version: String,
        /// The proxy's error message.
        message: String,
    },
    /// A stream or a fetch ended.
    Disconnected {
        /// The stream.
        stream: StreamId,
        /// The proxy.
        proxy: ProxyKey,
    },
}
