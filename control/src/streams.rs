//! The owner's table of open streams, kept from [`StreamEvent`](crate::StreamEvent)s: which proxy
//! each stream speaks for, what it subscribes to, and the newest snapshot generation it ACKed. The
//! rollout gate reads it to know whom a step waits for.

use std::collections::{BinaryHeap, HashMap};

use crate::events::StreamId;
use crate::resource_name::{Asker, ResourceName, Target, TrustScope};
use crate::snapshot::{ProxyHashMap, ProxyHashSet, ProxyKey};
use crate::trust::BundleKey;

/// One open stream (or fetch, which subscribes to nothing).
#[derive(Debug)]
pub(crate) struct Stream {
    /// The proxy at the other end.
    pub proxy: ProxyKey,
    /// Whether its token is a zone egress token.
    pub zone_egress: bool,
    /// What it subscribes to.
    pub resources: Vec<ResourceName>,
    /// The newest snapshot generation whose content it ACKed.
    pub acked: Option<u64>,
    /// The version of the response it ACKed last (for operators).
    pub acked_version: Option<String>,
}

impl Stream {
    /// The stream's proxy as the resource-name table sees it.
    pub fn asker(&self) -> Asker<'_> {
        Asker {
            key: &self.proxy,
            zone_egress: self.zone_egress,
        }
    }

    /// Whether it holds the content of `generation` (or newer).
    pub fn has_acked(&self, generation: u64) -> bool {
        self.acked.is_some_and(|g| g >= generation)
    }

    /// The trusts it carries (see [`ResourceName::carries_mesh_trust`]), without repeats.
    fn carries(&self) -> Vec<Carries> {
        let mut carries: Vec<Carries> = self
            .resources
            .iter()
            .filter_map(|resource| match resource.target(self.asker(), None) {
                Target::Trust {
                    scope: TrustScope::All,
                    ..
                } => Some(Carries::AllMeshes),
                Target::Trust {
                    scope: TrustScope::Mesh(mesh),
                    ..
                }
                | Target::MeshService { mesh, .. } => Some(Carries::Bundle(BundleKey::mesh(mesh))),
                Target::Trust {
                    scope: TrustScope::Egress,
                    ..
                } => Some(Carries::Bundle(BundleKey::Egress)),
                Target::Identity | Target::Unknown => None,
            })
            .collect();
        carries.sort_unstable();
        carries.dedup();
        carries
    }

    /// Whether it subscribes to a name that may mean its proxy's identity
    /// ([`ResourceName::may_name_identity`]).
    fn may_ask_identity(&self) -> bool {
        self.resources
            .iter()
            .any(|r| r.may_name_identity(self.asker()))
    }
}

/// The streams of one proxy. Most proxies have one stream carrying one trust, so both lists are
/// small sorted vectors, not hash tables: an idle proxy's entry is 56 bytes and two small allocations,
/// where a set and a map were 104 bytes and about 250 more (at 10,000 streams, with the table's own
/// free slots, 0.3 KB per stream).
#[derive(Debug, Default)]
struct ProxyStreams {
    /// Its streams, sorted (ids are handed out in order, so a new one goes at the end); at most
    /// `limits.streamsPerProxy` of them.
    ids: Vec<StreamId>,
    /// How many of them may ask for its identity: kept as subscriptions change, so that the owner
    /// can tell whether a proxy waits for its identity without reading every stream's names.
    asking_identity: usize,
    /// How many of them carry each trust, sorted by trust, kept likewise (a proxy may have many
    /// streams); one entry per mesh at most, and the egress bundle and every mesh's.
    carrying: Vec<(Carries, u32)>,
}

impl ProxyStreams {
    /// Whose trust its streams carry, all of them together.
    fn carried(&self) -> Carried {
        let mut carried = Carried::default();
        for (carries, _) in &self.carrying {
            match carries {
                Carries::AllMeshes => carried.all_meshes = true,
                Carries::Bundle(bundle) => carried.bundles.push(bundle.clone()),
            }
        }
        // `Carries` sorts `AllMeshes` first and the bundles in their own order: already sorted.
        carried
    }

    /// Counts one stream's `carries` in (`by: 1`) or out (`by: -1`).
    fn count(&mut self, carries: Vec<Carries>, by: i32) {
        for key in carries {
            match self.carrying.binary_search_by(|(k, _)| k.cmp(&key)) {
                Ok(at) => {
                    let count = &mut self.carrying[at].1;
                    *count = count.saturating_add_signed(by);
                    if *count == 0 {
                        self.carrying.remove(at);
                    }
                }
                Err(at) if by > 0 => insert_tight(&mut self.carrying, at, (key, by.unsigned_abs())),
                Err(_) => {}
            }
        }
    }

    /// Adds stream `id`.
    fn insert(&mut self, id: StreamId) {
        if let Err(at) = self.ids.binary_search(&id) {
            insert_tight(&mut self.ids, at, id);
        }
    }

    /// Removes stream `id`.
    fn remove(&mut self, id: StreamId) {
        if let Ok(at) = self.ids.binary_search(&id) {
            self.ids.remove(at);
        }
    }
}

/// Inserts `item` at `at`, growing `list` from room for one (a `Vec` starts at four) and doubling
/// from there.
fn insert_tight<T>(list: &mut Vec<T>, at: usize, item: T) {
    if list.len() == list.capacity() {
        list.reserve_exact(list.len().max(1));
    }
    list.insert(at, item);
}

/// A trust a stream carries.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Carries {
    /// Every mesh's (`ALL`).
    AllMeshes,
    /// One bundle's.
    Bundle(BundleKey),
}

/// Every open stream, by id and by proxy.
#[derive(Debug, Default)]
pub(crate) struct StreamTable {
    /// Boxed: a slot holds a pointer, not the 104-byte record (a table keeps a third of its slots
    /// free).
    by_id: HashMap<StreamId, Box<Stream>>,
    by_proxy: ProxyHashMap<ProxyStreams>,
    /// The proxies with a stream that may ask for their identity.
    asking: ProxyHashSet,
    /// How many connected proxies carry each bundle's trust.
    carrying: Carrying,
    /// The newest generation any stream ACKed.
    newest_ack: Option<u64>,
}

/// Whose trust one proxy's streams carry, all of them together (see
/// [`ResourceName::carries_mesh_trust`]).
#[derive(Debug, Default, PartialEq, Eq)]
struct Carried {
    /// Every mesh's (`ALL`).
    all_meshes: bool,
    /// These bundles', sorted, without repeats.
    bundles: Vec<BundleKey>,
}

/// How many connected proxies carry each bundle's trust, kept as streams subscribe and leave, so that
/// the gate can say how many a trust step waits for when it begins without a pass over the fleet.
#[derive(Debug, Default)]
struct Carrying {
    /// Proxies that carry every mesh's trust.
    all_meshes: usize,
    /// Per bundle, the proxies that carry it by name: a mesh's only when they do not carry every
    /// mesh's.
    by_bundle: HashMap<BundleKey, usize>,
}

impl Carrying {
    /// Counts `carried` in (`by: 1`) or out (`by: -1`).
    fn add(&mut self, carried: &Carried, by: isize) {
        let step = |n: &mut usize| *n = n.checked_add_signed(by).unwrap_or_default();
        if carried.all_meshes {
            step(&mut self.all_meshes);
        }
        for bundle in &carried.bundles {
            if carried.all_meshes && bundle.mesh_name().is_some() {
                continue;
            }
            let count = self.by_bundle.entry(bundle.clone()).or_default();
            step(count);
            if *count == 0 {
                self.by_bundle.remove(bundle);
            }
        }
    }

    /// How many proxies carry `bundle`'s trust.
    fn count(&self, bundle: &BundleKey) -> usize {
        let by_name = self.by_bundle.get(bundle).copied().unwrap_or_default();
        match bundle {
            BundleKey::Mesh(_) => self.all_meshes + by_name,
            BundleKey::Egress => by_name,
        }
    }
}

impl StreamTable {
    /// Records a new stream; returns whether its proxy was not connected before.
    pub fn connect(&mut self, id: StreamId, proxy: ProxyKey, zone_egress: bool) -> bool {
        let streams = self.by_proxy.entry(proxy.clone()).or_default();
        let first = streams.ids.is_empty();
        streams.insert(id);
        self.by_id.insert(
            id,
            Box::new(Stream {
                proxy,
                zone_egress,
                resources: Vec::new(),
                acked: None,
                acked_version: None,
            }),
        );
        first
    }

    /// Replaces a stream's subscription; false for a stream the table does not hold.
    pub fn subscribe(&mut self, id: StreamId, resources: Vec<ResourceName>) -> bool {
        let Some(proxy) = self.by_id.get(&id).map(|s| s.proxy.clone()) else {
            return false;
        };
        self.counting_carriers(&proxy, |table| table.replace_subscription(id, resources));
        true
    }

    /// Applies `change` to the streams of `proxy`, keeping the count of proxies that carry each trust.
    fn counting_carriers<T>(
        &mut self,
        proxy: &ProxyKey,
        change: impl FnOnce(&mut StreamTable) -> T,
    ) -> T {
        let carried = |table: &StreamTable| {
            table
                .by_proxy
                .get(proxy)
                .map(ProxyStreams::carried)
                .unwrap_or_default()
        };
        let before = carried(self);
        let changed = change(self);
        let after = carried(self);
        if before != after {
            self.carrying.add(&before, -1);
            self.carrying.add(&after, 1);
        }
        changed
    }

    /// Replaces the subscription of `id`, a stream the table holds.
    fn replace_subscription(&mut self, id: StreamId, resources: Vec<ResourceName>) {
        let Some(stream) = self.by_id.get_mut(&id) else {
            return;
        };
        let asked = stream.may_ask_identity();
        let carried = stream.carries();
        stream.resources = resources;
        let asks = stream.may_ask_identity();
        if let Some(streams) = self.by_proxy.get_mut(&stream.proxy) {
            streams.count(carried, -1);
            streams.count(stream.carries(), 1);
        }
        if asked != asks {
            if let Some(streams) = self.by_proxy.get_mut(&stream.proxy) {
                if asks {
                    streams.asking_identity += 1;
                    self.asking.insert(stream.proxy.clone());
                } else {
                    streams.asking_identity -= 1;
                    if streams.asking_identity == 0 {
                        self.asking.remove(&stream.proxy);
                    }
                }
            }
        }
    }

    /// How many connected proxies carry `bundle`'s trust (see
    /// [`ResourceName::carries_mesh_trust`]), if no stream has ACKed `generation` yet: then that many
    /// wait for a step of `bundle` published in `generation`. `None` once one has.
    pub fn carrying_unacked(&self, generation: u64, bundle: &BundleKey) -> Option<usize> {
        if self.newest_ack.is_some_and(|newest| newest >= generation) {
            return None;
        }
        Some(self.carrying.count(bundle))
    }

    /// Records an ACK of `version`, which carries snapshot `generation`; false for a stream the table
    /// does not hold.
    pub fn ack(&mut self, id: StreamId, generation: u64, version: String) -> bool {
        match self.by_id.get_mut(&id) {
            Some(stream) => {
                if stream.acked.is_none_or(|g| generation >= g) {
                    stream.acked = Some(generation);
                    stream.acked_version = Some(version);
                }
                self.newest_ack = self.newest_ack.max(Some(generation));
                true
            }
            None => false,
        }
    }

    /// Forgets a stream; returns its proxy when that was its last stream.
    pub fn disconnect(&mut self, id: StreamId) -> Option<ProxyKey> {
        let proxy = self.by_id.get(&id)?.proxy.clone();
        self.counting_carriers(&proxy, |table| table.forget(id))
    }

    /// Forgets a stream the table holds; returns its proxy when that was its last stream.
    fn forget(&mut self, id: StreamId) -> Option<ProxyKey> {
        let stream = self.by_id.remove(&id)?;
        let streams = self.by_proxy.get_mut(&stream.proxy)?;
        streams.remove(id);
        streams.count(stream.carries(), -1);
        if stream.may_ask_identity() {
            streams.asking_identity -= 1;
            if streams.asking_identity == 0 {
                self.asking.remove(&stream.proxy);
            }
        }
        if streams.ids.is_empty() {
            self.by_proxy.remove(&stream.proxy);
            return Some(stream.proxy);
        }
        None
    }

    /// The proxy a stream speaks for.
    pub fn proxy_of(&self, id: StreamId) -> Option<&ProxyKey> {
        self.by_id.get(&id).map(|s| &s.proxy)
    }

    /// Whether `proxy` has an open stream or fetch.
    pub fn is_connected(&self, proxy: &ProxyKey) -> bool {
        self.by_proxy.contains_key(proxy)
    }

    /// Every connected proxy.
    pub fn proxies(&self) -> impl Iterator<Item = &ProxyKey> {
        self.by_proxy.keys()
    }

    /// How many streams and fetches `proxy` has open.
    pub fn count(&self, proxy: &ProxyKey) -> usize {
        self.by_proxy.get(proxy).map_or(0, |s| s.ids.len())
    }

    /// Whether a stream of `proxy` subscribes to a name that may mean its identity
    /// ([`ResourceName::may_name_identity`]).
    pub fn may_ask_identity(&self, proxy: &ProxyKey) -> bool {
        self.asking.contains(proxy)
    }

    /// The proxies with a stream that may ask for their identity.
    pub fn asking_identity(&self) -> impl Iterator<Item = &ProxyKey> {
        self.asking.iter()
    }

    /// The streams of `proxy`.
    pub fn of<'a>(&'a self, proxy: &ProxyKey) -> impl Iterator<Item = &'a Stream> + 'a {
        self.by_proxy
            .get(proxy)
            .into_iter()
            .flat_map(|s| &s.ids)
            .filter_map(|id| self.by_id.get(id).map(Box::as_ref))
    }

    /// Whether a stream selected by `selected` has not ACKed `generation`; stops at the first.
    pub fn any_waiting(&self, generation: u64, selected: impl Fn(&Stream) -> bool) -> bool {
        self.by_id
            .values()
            .any(|s| !s.has_acked(generation) && selected(s))
    }

    /// The proxies with a stream selected by `selected` that has not ACKed `generation`: how many, and
    /// the first `named` of them by name. One pass over the proxies that allocates nothing per proxy (it
    /// runs for every batch of ACKs while a rollout waits), and builds no name but the first `named`.
    pub fn waiting_for(
        &self,
        generation: u64,
        named: usize,
        selected: impl Fn(&Stream) -> bool,
    ) -> Waiting {
        let mut count = 0;
        // The `named` smallest waiting proxies so far; the largest of them on top.
        let mut first: BinaryHeap<&ProxyKey> = BinaryHeap::with_capacity(named + 1);
        for (proxy, streams) in &self.by_proxy {
            let waits = streams
                .ids
                .iter()
                .filter_map(|id| self.by_id.get(id))
                .any(|s| !s.has_acked(generation) && selected(s));
            if !waits {
                continue;
            }
            count += 1;
            if first.len() < named || first.peek().is_some_and(|largest| proxy < *largest) {
                first.push(proxy);
                if first.len() > named {
                    first.pop();
                }
            }
        }
        Waiting {
            count,
            first: first
                .into_sorted_vec()
                .into_iter()
                .map(ToString::to_string)
                .collect(),
        }
    }
}

/// Who a wait still waits for.
#[derive(Debug, Default)]
pub(crate) struct Waiting {
    /// How many proxies.
    pub count: usize,
    /// The first of them by name.
    pub first: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proxy_is_connected_while_any_of_its_streams_is_open() {
        let mut streams = StreamTable::default();
        let web = ProxyKey::new("m", "web");
        assert!(streams.connect(StreamId(1), web.clone(), false));
        assert!(!streams.connect(StreamId(2), web.clone(), false));
        assert_eq!(streams.count(&web), 2);
        assert_eq!(streams.disconnect(StreamId(1)), None);
        assert!(streams.is_connected(&web));
        assert_eq!(streams.disconnect(StreamId(2)), Some(web.clone()));
        assert!(!streams.is_connected(&web));
        assert_eq!(streams.disconnect(StreamId(2)), None, "already gone");
    }

    /// Many proxies: the count is exact and the names are the first by name, whatever the order.
    #[test]
    fn a_wait_names_the_first_proxies_by_name_and_counts_them_all() {
        let mut streams = StreamTable::default();
        for i in (0..100).rev() {
            streams.connect(StreamId(i), ProxyKey::new("m", format!("p-{i:03}")), false);
        }
        // A second stream of p-000, ACKed: the proxy still waits through its first one.
        streams.connect(StreamId(500), ProxyKey::new("m", "p-000"), false);
        streams.ack(StreamId(500), 1, "v1".to_owned());
        for i in (1..100).step_by(2) {
            streams.ack(StreamId(i), 1, "v1".to_owned());
        }
        let waiting = streams.waiting_for(1, 3, |_| true);
        assert_eq!(waiting.count, 50);
        assert_eq!(waiting.first, ["m.p-000", "m.p-002", "m.p-004"]);
    }

    /// The table knows which proxies may ask for their identity as subscriptions change and streams
    /// leave: a proxy counts while any of its streams names its identity (or an alias of it).
    #[test]
    fn proxies_asking_for_their_identity_are_kept_as_streams_change() {
        let mut streams = StreamTable::default();
        let web = ProxyKey::new("m", "web");
        let names = |names: &[&str]| names.iter().map(|n| ResourceName::parse(*n)).collect();
        let asking = |streams: &StreamTable| streams.asking_identity().cloned().collect::<Vec<_>>();
        streams.connect(StreamId(1), web.clone(), false);
        streams.connect(StreamId(2), web.clone(), false);
        assert!(!streams.may_ask_identity(&web), "no names yet");
        assert!(streams.subscribe(StreamId(1), names(&["system_trust_bundle", "ALL"])));
        assert!(!streams.may_ask_identity(&web), "trust only");
        streams.subscribe(StreamId(1), names(&["identity_cert:secret:other"]));
        assert!(
            !streams.may_ask_identity(&web),
            "another mesh's legacy name"
        );
        streams.subscribe(StreamId(1), names(&["default", "system_trust_bundle"]));
        streams.subscribe(StreamId(2), names(&["spiffe://m/web"]));
        assert_eq!(asking(&streams), std::slice::from_ref(&web));
        streams.subscribe(StreamId(1), names(&["system_trust_bundle"]));
        assert!(
            streams.may_ask_identity(&web),
            "stream 2 still asks, by alias"
        );
        assert_eq!(streams.disconnect(StreamId(2)), None);
        assert!(asking(&streams).is_empty());
        streams.subscribe(StreamId(1), names(&["identity_cert:secret:m"]));
        assert!(
            streams.may_ask_identity(&web),
            "the legacy name of its own mesh"
        );
        assert_eq!(streams.disconnect(StreamId(1)), Some(web.clone()));
        assert!(!streams.may_ask_identity(&web));
    }

    /// What the table does to its streams, for the property below.
    #[derive(Clone, Debug)]
    enum Op {
        Connect {
            stream: u64,
            proxy: usize,
            egress: bool,
        },
        Subscribe {
            stream: u64,
            names: Vec<usize>,
        },
        Disconnect {
            stream: u64,
        },
        Ack {
            stream: u64,
            generation: u64,
        },
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            (0..8u64, 0..4usize, any::<bool>()).prop_map(|(stream, proxy, egress)| Op::Connect {
                stream,
                proxy,
                egress
            }),
            (
                0..8u64,
                proptest::collection::vec(0..CARRIER_NAMES.len(), 0..4)
            )
                .prop_map(|(stream, names)| Op::Subscribe { stream, names }),
            (0..8u64).prop_map(|stream| Op::Disconnect { stream }),
            (0..8u64, 1..4u64).prop_map(|(stream, generation)| Op::Ack { stream, generation }),
        ]
    }

    const CARRIER_NAMES: &[&str] = &[
        "default",
        "system_trust_bundle",
        "ROOTCA",
        "ALL",
        "mesh_ca:secret:all",
        "system_trust_bundle_egress",
        "meshservice:web",
        "mesh_ca:secret:m",
        "mesh_ca:secret:n",
        "identity_cert:secret:m",
    ];

    proptest::proptest! {
        /// However streams connect, subscribe, ACK and leave, the proxies carrying a bundle's trust are
        /// counted as a pass over every stream would count them, while no stream has ACKed; and each
        /// proxy's streams are the streams that name it.
        #[test]
        fn the_proxies_carrying_a_bundle_are_counted_as_a_pass_would(
            ops in proptest::collection::vec(op(), 0..40)
        ) {
            let mut streams = StreamTable::default();
            let proxies = [("m", "a"), ("m", "b"), ("n", "c"), ("n", "d")];
            for op in ops {
                match op {
                    Op::Connect { stream, proxy, egress } => {
                        if streams.proxy_of(StreamId(stream)).is_none() {
                            let (mesh, name) = proxies[proxy];
                            streams.connect(StreamId(stream), ProxyKey::new(mesh, name), egress);
                        }
                    }
                    Op::Subscribe { stream, names } => {
                        let names = names.iter().map(|n| ResourceName::parse(CARRIER_NAMES[*n])).collect();
                        streams.subscribe(StreamId(stream), names);
                    }
                    Op::Disconnect { stream } => {
                        streams.disconnect(StreamId(stream));
                    }
                    Op::Ack { stream, generation } => {
                        streams.ack(StreamId(stream), generation, String::new());
                    }
                }
                for (mesh, name) in proxies {
                    let key = ProxyKey::new(mesh, name);
                    let open = streams.by_id.values().filter(|s| s.proxy == key).count();
                    proptest::prop_assert_eq!(streams.count(&key), open);
                    proptest::prop_assert_eq!(streams.of(&key).count(), open);
                    proptest::prop_assert_eq!(streams.is_connected(&key), open > 0);
                }
                for bundle in [BundleKey::mesh("m"), BundleKey::mesh("n"), BundleKey::Egress] {
                    let carries = |s: &Stream| s.resources.iter().any(|r| r.carries_mesh_trust(s.asker(), &bundle));
                    let passed = streams.waiting_for(10, 0, carries).count;
                    proptest::prop_assert_eq!(streams.carrying_unacked(10, &bundle), Some(passed), "{:?}", bundle);
                    let acked = streams.newest_ack.unwrap_or_default();
                    if acked > 0 {
                        proptest::prop_assert_eq!(streams.carrying_unacked(acked, &bundle), None);
                    }
                }
            }
        }
    }

    #[test]
    fn acks_only_move_forward_and_unknown_streams_are_ignored() {
        let mut streams = StreamTable::default();
        let web = ProxyKey::new("m", "web");
        streams.connect(StreamId(1), web.clone(), false);
        assert!(streams.subscribe(StreamId(1), vec![ResourceName::parse("default")]));
        assert!(streams.ack(StreamId(1), 5, "v5".to_owned()));
        assert!(streams.ack(StreamId(1), 3, "v3".to_owned()));
        let acked = streams.of(&web).map(|s| s.acked_version.as_deref());
        assert_eq!(
            acked.collect::<Vec<_>>(),
            [Some("v5")],
            "an older ACK changes nothing"
        );
        assert_eq!(streams.waiting_for(5, 20, |_| true).count, 0);
        let waiting = streams.waiting_for(6, 20, |_| true);
        assert_eq!(
            (waiting.count, waiting.first),
            (1, vec!["m.web".to_owned()])
        );
        streams.connect(StreamId(2), ProxyKey::new("m", "api"), false);
        let waiting = streams.waiting_for(6, 1, |_| true);
        assert_eq!(
            (waiting.count, waiting.first),
            (2, vec!["m.api".to_owned()])
        );
        assert!(streams.any_waiting(6, |_| true));
        assert!(!streams.any_waiting(6, |s| s.proxy.name.as_ref() == "nobody"));
        streams.ack(StreamId(1), 6, "v6".to_owned());
        streams.ack(StreamId(2), 7, "v7".to_owned());
        assert!(!streams.any_waiting(6, |_| true));
        assert!(!streams.ack(StreamId(9), 1, "v1".to_owned()));
        assert!(!streams.subscribe(StreamId(9), Vec::new()));
    }
}
