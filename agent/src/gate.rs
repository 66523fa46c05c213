//! The rollout gate through the agent: a state is acknowledged to the server only once every
//! Workload API stream open on the host has been sent it.
//!
//! The local Workload API server reports its streams as it would to meshca's owner: connected
//! (with the Dataplane it serves), and the local snapshot generation each has applied (a message
//! counts once the workload had `workloadApi.ackAfter` to put it in use). Each server version is
//! mapped to the local generation that first served it; the version is acknowledged once every
//! open stream has applied that generation or a later one, at once when none is open.

use std::collections::{HashMap, VecDeque};

use meshca_control::{ProxyKey, StreamEvent, StreamId};

use crate::proto::{OpenStreams, Registration};

/// One open local stream.
#[derive(Debug)]
struct Open {
    proxy: ProxyKey,
    /// The newest local generation it applied.
    applied: u64,
}

/// The local streams, and the server versions waiting for them.
#[derive(Debug, Default)]
pub(crate) struct LocalStreams {
    open: HashMap<StreamId, Open>,
    /// Server versions not acknowledged yet, with the local generation that serves each, oldest
    /// first.
    waiting: VecDeque<(u64, u64)>,
}

impl LocalStreams {
    /// Takes one event of the local Workload API server.
    pub(crate) fn event(&mut self, event: StreamEvent) {
        match event {
            StreamEvent::Connected { stream, claims } => {
                self.open.insert(
                    stream,
                    Open {
                        proxy: ProxyKey::new(claims.mesh.as_str(), claims.name.as_str()),
                        applied: 0,
                    },
                );
            }
            StreamEvent::Acked {
                stream, generation, ..
            } => {
                if let Some(open) = self.open.get_mut(&stream) {
                    open.applied = open.applied.max(generation);
                }
            }
            StreamEvent::Disconnected { stream } => {
                self.open.remove(&stream);
            }
            _ => {}
        }
    }

    /// The server's state `version` is served from local generation `generation` on.
    pub(crate) fn served(&mut self, version: u64, generation: u64) {
        self.waiting.push_back((version, generation));
    }

    /// A new stream to a server: the versions of the last one are never acknowledged.
    pub(crate) fn new_stream(&mut self) {
        self.waiting.clear();
    }

    /// The newest version every open stream has applied, if one waits: it is acknowledged, and
    /// so are the ones before it. A stream that has applied nothing yet and whose Dataplane has no
    /// identity to serve (`serving` says which have) holds nothing back: it is waiting for its
    /// identity, and whatever it is sent first is the newest state.
    pub(crate) fn due(&mut self, serving: impl Fn(&ProxyKey) -> bool) -> Option<u64> {
        let oldest_applied = self
            .open
            .values()
            .filter(|o| o.applied > 0 || serving(&o.proxy))
            .map(|o| o.applied)
            .min();
        let mut due = None;
        while let Some(&(version, generation)) = self.waiting.front() {
            if oldest_applied.is_some_and(|applied| applied < generation) {
                break;
            }
            due = Some(version);
            self.waiting.pop_front();
        }
        due
    }

    /// How many local streams each registration has open (a stream counts for every registration
    /// of its Dataplane).
    pub(crate) fn counts(&self, registrations: &[Registration]) -> Vec<OpenStreams> {
        let mut per_proxy: HashMap<&ProxyKey, u32> = HashMap::new();
        for open in self.open.values() {
            *per_proxy.entry(&open.proxy).or_default() += 1;
        }
        registrations
            .iter()
            .map(|r| OpenStreams {
                mesh: r.mesh.clone(),
                registration: r.name.clone(),
                streams: per_proxy
                    .get(&ProxyKey::new(r.mesh.as_str(), r.dataplane.as_str()))
                    .copied()
                    .unwrap_or(0),
            })
            .collect()
    }

    /// The streams open, in all.
    pub(crate) fn open(&self) -> usize {
        self.open.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use meshca_auth::{Claims, ProxyType};

    use super::*;

    fn connected(id: u64, dataplane: &str) -> StreamEvent {
        let claims = Claims::new(
            ProxyType::Dataplane,
            "default",
            dataplane,
            Default::default(),
            Default::default(),
            Duration::from_secs(60),
            1,
        )
        .expect("claims");
        StreamEvent::Connected {
            stream: StreamId(id),
            claims: Arc::new(claims),
        }
    }

    fn acked(id: u64, generation: u64) -> StreamEvent {
        StreamEvent::Acked {
            stream: StreamId(id),
            generation,
            version: generation.to_string(),
        }
    }

    #[test]
    fn with_no_stream_open_a_version_is_due_at_once() {
        let mut streams = LocalStreams::default();
        streams.served(7, 1);
        assert_eq!(streams.due(|_| true), Some(7));
        assert_eq!(streams.due(|_| true), None, "acknowledged once");
    }

    #[test]
    fn a_version_waits_for_every_open_stream() {
        let mut streams = LocalStreams::default();
        streams.event(connected(1, "a"));
        streams.event(connected(2, "b"));
        streams.served(10, 3);
        streams.served(11, 4);
        assert_eq!(streams.due(|_| true), None);
        streams.event(acked(1, 4));
        assert_eq!(
            streams.due(|_| true),
            None,
            "stream 2 has not applied generation 3"
        );
        streams.event(acked(2, 3));
        assert_eq!(streams.due(|_| true), Some(10));
        streams.event(disconnected(2));
        assert_eq!(
            streams.due(|_| true),
            Some(11),
            "the stream that lagged is gone"
        );
    }

    fn disconnected(id: u64) -> StreamEvent {
        StreamEvent::Disconnected {
            stream: StreamId(id),
        }
    }

    #[test]
    fn a_stream_waiting_for_its_identity_holds_nothing_back() {
        let mut streams = LocalStreams::default();
        streams.event(connected(1, "a"));
        streams.served(10, 3);
        let serving_a = |proxy: &ProxyKey| &*proxy.name == "a";
        assert_eq!(streams.due(|_| false), Some(10), "a has no identity yet");
        streams.served(11, 4);
        assert_eq!(streams.due(serving_a), None, "a has its identity now");
        streams.event(acked(1, 4));
        assert_eq!(streams.due(|_| false), Some(11), "once applied, it counts");
    }

    #[test]
    fn a_new_server_stream_forgets_the_versions_of_the_last() {
        let mut streams = LocalStreams::default();
        streams.event(connected(1, "a"));
        streams.served(10, 3);
        streams.new_stream();
        streams.event(acked(1, 3));
        assert_eq!(streams.due(|_| true), None);
    }

    #[test]
    fn open_streams_are_counted_per_registration_of_their_dataplane() {
        let mut streams = LocalStreams::default();
        streams.event(connected(1, "a"));
        streams.event(connected(2, "a"));
        let registration = |name: &str, dataplane: &str| Registration {
            mesh: "default".into(),
            name: name.into(),
            dataplane: dataplane.into(),
            ..Default::default()
        };
        let counts = streams.counts(&[registration("r1", "a"), registration("r2", "b")]);
        assert_eq!(counts[0].streams, 2);
        assert_eq!(counts[1].streams, 0);
    }
}
