//! The list of open streams, for the admin API.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use meshca_control::{ProxyKey, StreamId};

/// Which SDS protocol a stream speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamKind {
    /// `StreamSecrets`, state of the world.
    Sotw,
    /// `DeltaSecrets`, incremental.
    Delta,
}

/// One open stream, as the admin API shows it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct StreamInfo {
    /// The stream.
    pub id: StreamId,
    /// The proxy at the other end.
    pub proxy: ProxyKey,
    /// The protocol.
    pub kind: StreamKind,
    /// When the proxy connected.
    pub connected_at: SystemTime,
    /// The resource names it subscribes to.
    pub resources: Vec<String>,
    /// The version of the last response sent (empty before the first).
    pub last_sent_version: String,
    /// The version of the last response it ACKed.
    pub last_acked_version: Option<String>,
    /// The snapshot generation of the last ACKed content.
    pub acked_generation: Option<u64>,
    /// How many responses it rejected.
    pub nacks: u64,
    /// Its last rejection message.
    pub last_nack: Option<String>,
}

/// Open streams, shared between the server and the admin API. Cheap to clone; the lock
/// is held only to copy or update one entry, never across an await.
#[derive(Clone, Debug, Default)]
pub struct StreamRegistry {
    inner: Arc<Mutex<HashMap<StreamId, StreamInfo>>>,
}

impl StreamRegistry {
    /// Every open stream, ordered by id.
    pub fn list(&self) -> Vec<StreamInfo> {
        let mut all: Vec<StreamInfo> = self.lock().values().cloned().collect();
        all.sort_by_key(|info| info.id);
        all
    }

    /// The number of open streams.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when no stream is open.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    pub(crate) fn insert(&self, info: StreamInfo) {
        self.lock().insert(info.id, info);
    }

    pub(crate) fn update(&self, id: StreamId, change: impl FnOnce(&mut StreamInfo)) {
        if let Some(info) = self.lock().get_mut(&id) {
            change(info);
        }
    }

    pub(crate) fn remove(&self, id: StreamId) {
        self.lock().remove(&id);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<StreamId, StreamInfo>> {
        // A panic while holding this lock cannot leave an entry half-updated in a way
        // that matters to readers: keep serving the data.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
