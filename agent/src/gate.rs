//! The rollout gate through the agent: a state is acknowledged to the server only once every
//! Workload API stream open on the host has been sent it.
//!
//! The local Workload API server reports its streams as it would to meshca's owner: connected
//! (with the Dataplane it serves), and the local snapshot generation each has applied (a message
//! counts once the workload had `workloadApi.ackAfter` to put it in use). Each server version is
//! mapped to the local generation that first served it; the version is acknowledged once every
//! open stream has applied that generation or a later one, at once when none is open.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::Hash;

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
///
/// An event or a question costs the same with ten streams open as with ten thousand: the streams
/// are counted as they come, go and apply, per generation and per Dataplane, and the oldest
/// generation applied is read from those counts, not by visiting every stream.
#[derive(Debug, Default)]
pub(crate) struct LocalStreams {
    open: HashMap<StreamId, Open>,
    /// How many open streams have applied each local generation above 0, as their newest.
    by_generation: BTreeMap<u64, usize>,
    /// How many open streams of each Dataplane have applied nothing yet.
    unapplied: HashMap<ProxyKey, usize>,
    /// How many streams each Dataplane has open.
    per_proxy: HashMap<ProxyKey, usize>,
    /// Server versions not acknowledged yet, with the local generation that serves each, oldest
    /// first.
    waiting: VecDeque<(u64, u64)>,
}

/// Takes one from `key`'s count, forgetting the key at none.
fn take_one<K: Hash + Eq>(counts: &mut HashMap<K, usize>, key: &K) {
    if let Some(count) = counts.get_mut(key) {
        *count -= 1;
        if *count == 0 {
            counts.remove(key);
        }
    }
}

/// Takes one from `generation`'s count, forgetting it at none.
fn take_generation(counts: &mut BTreeMap<u64, usize>, generation: u64) {
    if let Some(count) = counts.get_mut(&generation) {
        *count -= 1;
        if *count == 0 {
            counts.remove(&generation);
        }
    }
}

/// Takes the versions of `waiting` served by a generation every open stream has applied (`oldest`
/// is the oldest one an open stream has applied; `None`: no stream counts), and returns the newest.
fn take_due(waiting: &mut VecDeque<(u64, u64)>, oldest: Option<u64>) -> Option<u64> {
    let mut due = None;
    while let Some(&(version, generation)) = waiting.front() {
        if oldest.is_some_and(|applied| applied < generation) {
            break;
        }
        due = Some(version);
        waiting.pop_front();
    }
    due
}

impl LocalStreams {
    /// Takes one event of the local Workload API server.
    pub(crate) fn event(&mut self, event: StreamEvent) {
        match event {
            StreamEvent::Connected { stream, claims } => {
                let proxy = ProxyKey::new(claims.mesh.as_str(), claims.name.as_str());
                *self.unapplied.entry(proxy.clone()).or_default() += 1;
                *self.per_proxy.entry(proxy.clone()).or_default() += 1;
                if let Some(before) = self.open.insert(stream, Open { proxy, applied: 0 }) {
                    self.forget(&before);
                }
            }
            StreamEvent::Acked {
                stream, generation, ..
            } => {
                let Some(open) = self.open.get_mut(&stream) else {
                    return;
                };
                if generation <= open.applied {
                    return;
                }
                match open.applied {
                    0 => take_one(&mut self.unapplied, &open.proxy),
                    before => take_generation(&mut self.by_generation, before),
                }
                open.applied = generation;
                *self.by_generation.entry(generation).or_default() += 1;
            }
            StreamEvent::Disconnected { stream } => {
                if let Some(open) = self.open.remove(&stream) {
                    self.forget(&open);
                }
            }
            _ => {}
        }
    }

    /// Takes a stream that is no longer open out of the counts.
    fn forget(&mut self, open: &Open) {
        match open.applied {
            0 => take_one(&mut self.unapplied, &open.proxy),
            applied => take_generation(&mut self.by_generation, applied),
        }
        take_one(&mut self.per_proxy, &open.proxy);
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
    ///
    /// Costs a lookup in `serving` per Dataplane with a stream that has applied nothing, at most.
    pub(crate) fn due(&mut self, serving: impl Fn(&ProxyKey) -> bool) -> Option<u64> {
        if self.waiting.is_empty() {
            return None;
        }
        let oldest_applied = if self.unapplied.keys().any(serving) {
            Some(0)
        } else {
            self.by_generation.keys().next().copied()
        };
        take_due(&mut self.waiting, oldest_applied)
    }

    /// How many local streams each registration has open (a stream counts for every registration
    /// of its Dataplane).
    pub(crate) fn counts(&self, registrations: &[Registration]) -> Vec<OpenStreams> {
        registrations
            .iter()
            .map(|r| OpenStreams {
                mesh: r.mesh.clone(),
                registration: r.name.clone(),
                streams: self
                    .per_proxy
                    .get(&ProxyKey::new(r.mesh.as_str(), r.dataplane.as_str()))
                    .map_or(0, |&open| u32::try_from(open).unwrap_or(u32::MAX)),
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
    /// What the counts stand for, kept the plain way: every open stream, visited on each question
    /// (the versions it makes due are taken as [`take_due`] takes them).
    #[derive(Default)]
    struct Model {
        open: std::collections::BTreeMap<u64, (String, u64)>,
        waiting: VecDeque<(u64, u64)>,
    }

    impl Model {
        fn due(&mut self, serving: &dyn Fn(&str) -> bool) -> Option<u64> {
            let oldest = self
                .open
                .values()
                .filter(|(proxy, applied)| *applied > 0 || serving(proxy))
                .map(|(_, applied)| *applied)
                .min();
            take_due(&mut self.waiting, oldest)
        }
    }

    #[derive(Clone, Debug)]
    enum Step {
        Connect(u64, u8),
        Ack(u64, u64),
        Disconnect(u64),
        Serve(u64),
        NewServerStream,
        Due(u8),
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            (0..8u64, 0..3u8).prop_map(|(s, p)| Step::Connect(s, p)),
            (0..8u64, 0..6u64).prop_map(|(s, g)| Step::Ack(s, g)),
            (0..8u64).prop_map(Step::Disconnect),
            (1..6u64).prop_map(Step::Serve),
            Just(Step::NewServerStream),
            (0..8u8).prop_map(Step::Due),
        ]
    }

    proptest::proptest! {
        /// Whatever the local streams do, the counts answer as visiting every stream would, and
        /// count the streams per registration as it would.
        #[test]
        fn the_counts_answer_as_a_scan_of_every_stream_would(
            steps in proptest::collection::vec(step(), 0..64)
        ) {
            let mut streams = LocalStreams::default();
            let mut model = Model::default();
            let mut version = 0;
            let proxies = ["a", "b", "c"];
            for step in steps {
                match step {
                    Step::Connect(id, proxy) => {
                        streams.event(connected(id, proxies[usize::from(proxy)]));
                        model.open.insert(id, (proxies[usize::from(proxy)].to_owned(), 0));
                    }
                    Step::Ack(id, generation) => {
                        streams.event(acked(id, generation));
                        if let Some((_, applied)) = model.open.get_mut(&id) {
                            *applied = (*applied).max(generation);
                        }
                    }
                    Step::Disconnect(id) => {
                        streams.event(disconnected(id));
                        model.open.remove(&id);
                    }
                    Step::Serve(generation) => {
                        version += 1;
                        streams.served(version, generation);
                        model.waiting.push_back((version, generation));
                    }
                    Step::NewServerStream => {
                        streams.new_stream();
                        model.waiting.clear();
                    }
                    Step::Due(serving) => {
                        // Bit i: whether proxies[i] has an identity to serve.
                        let serves = |name: &str| {
                            proxies.iter().position(|p| *p == name).is_some_and(|i| serving & (1 << i) != 0)
                        };
                        let got = streams.due(|proxy: &ProxyKey| serves(&proxy.name));
                        proptest::prop_assert_eq!(got, model.due(&serves));
                    }
                }
                proptest::prop_assert_eq!(streams.open(), model.open.len());
                let registrations: Vec<Registration> = proxies
                    .iter()
                    .map(|p| Registration {
                        mesh: "default".into(),
                        name: format!("r-{p}"),
                        dataplane: (*p).into(),
                        ..Default::default()
                    })
                    .collect();
                let counts: Vec<u32> =
                    streams.counts(&registrations).iter().map(|c| c.streams).collect();
                let expected: Vec<u32> = proxies
                    .iter()
                    .map(|p| model.open.values().filter(|(proxy, _)| proxy == p).count() as u32)
                    .collect();
                proptest::prop_assert_eq!(counts, expected);
            }
        }
    }
}
