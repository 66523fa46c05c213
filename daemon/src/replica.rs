//! This replica among those of one database: its heartbeat, what the others said in theirs, the
//! rollout state it exchanges with them, and whether the database answers. A replica that loses the database keeps serving what it holds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use meshca_control::{keep_gone, peer_views, GateView, GoneViews, LiveViews, PeerView};
use meshca_db::{PeerGate, ReplicaRecord, Replicas, MAX_GATE_VIEW};
use meshca_sds::StreamRegistry;
use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::metrics::Metrics;
use super::reload::{Change, Reloader};

/// The fastest heartbeat, however short `replica.leaseTimeout` is.
const MIN_HEARTBEAT: Duration = Duration::from_millis(200);

/// What the database said last, for the status and `/ready`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DatabaseView {
    /// This replica's name.
    pub replica: String,
    /// Whether the database answered the last heartbeat.
    pub up: bool,
    /// Why it did not, while it does not.
    pub error: Option<String>,
    /// What waits for the database while it does not answer.
    pub waiting: Vec<&'static str>,
    /// Every replica, as of the last answer (kept while the database does not answer).
    pub replicas: Vec<ReplicaRecord>,
    /// The other replicas whose rollouts this replica's gate counts (those whose lease holds), as of
    /// the last read.
    pub rollout_peers: Vec<RolloutPeer>,
}

/// Another replica as this replica's rollout gate counts it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RolloutPeer {
    /// Its `replica.name`.
    pub name: String,
    /// Whether its rollout state could be read; one that cannot holds every rollout step back until
    /// `rollout.ackTimeout`.
    pub readable: bool,
    /// Its lease expired: its last state still holds what it held, for another `replica.leaseTimeout`.
    pub gone: bool,
}

/// What waits for the database while it is unreachable (everything else is served from memory).
const WAITS_FOR_DATABASE: [&str; 2] = [
    "a resource update that needs a CA this replica has not loaded (a new backend, MeshIdentity or rotation generation) is rejected until it answers, then applied",
    "tokens revoked through other replicas are refused here only once it answers",
];

/// The heartbeat: every third of `lease`, records this replica's proxies and streams and reads every
/// replica's, until `shutdown`. Publishes what it learns on `view`.
pub struct Heartbeat {
    /// The replicas table.
    pub replicas: Replicas,
    /// `replica.name`.
    pub name: String,
    /// `replica.leaseTimeout`.
    pub lease: Duration,
    /// This replica's open streams.
    pub streams: StreamRegistry,
    /// Where the view is published.
    pub view: watch::Sender<Arc<DatabaseView>>,
    /// Where the gauges go.
    pub metrics: Arc<Metrics>,
    /// Re-applies the resource files when the database answers again.
    pub reloader: Reloader,
}

impl Heartbeat {
    /// Runs until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let every = (self.lease / 3).max(MIN_HEARTBEAT);
        loop {
            self.beat(started).await;
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    }

    async fn beat(&self, started: f64) {
        let proxies = u32::try_from(self.streams.connected_proxies()).unwrap_or(u32::MAX);
        let streams = u32::try_from(self.streams.len()).unwrap_or(u32::MAX);
        let heard = async {
            self.replicas
                .heartbeat(&self.name, started, proxies, streams)
                .await?;
            self.replicas.list(self.lease).await
        }
        .await;
        let (was_up, was_down) = {
            let view = self.view.borrow();
            (view.up, view.error.is_some())
        };
        match heard {
            Ok(replicas) => {
                if !was_up {
                    tracing::info!(replica = %self.name, replicas = replicas.len(), "the database answers");
                }
                if was_down {
                    // An update that needed the database (a new CA) was rejected while it did not
                    // answer: the files are read again now, so that it applies without an edit.
                    tracing::info!(
                        "re-reading the resource files, now that the database answers again"
                    );
                    self.reloader.try_apply_with(Change::Resources, None);
                }
                self.metrics.observe_replicas(&self.name, Some(&replicas));
                self.view.send_modify(|view| {
                    *view = Arc::new(DatabaseView {
                        replica: self.name.clone(),
                        up: true,
                        error: None,
                        waiting: Vec::new(),
                        replicas,
                        rollout_peers: view.rollout_peers.clone(),
                    });
                });
            }
            Err(e) => {
                let first = was_up || self.view.borrow().error.is_none();
                if first {
                    tracing::error!(
                        replica = %self.name,
                        "the database does not answer; serving and renewing from what this replica holds. Waiting for it: {}. {e}",
                        WAITS_FOR_DATABASE.join("; ")
                    );
                }
                self.metrics.observe_replicas(&self.name, None);
                self.view.send_modify(|view| {
                    *view = Arc::new(DatabaseView {
                        replica: self.name.clone(),
                        up: false,
                        error: Some(e.to_string()),
                        waiting: WAITS_FOR_DATABASE.to_vec(),
                        replicas: view.replicas.clone(),
                        rollout_peers: view.rollout_peers.clone(),
                    });
                });
            }
        }
    }
}

/// How often a replica reads the other replicas' rollout state.
pub const GATE_POLL: Duration = Duration::from_millis(500);

/// The rollout gate's exchange with the other replicas: writes this replica's view whenever the
/// owner changes it, and every [`GATE_POLL`] reads the views of the replicas whose lease holds,
/// handing them to the owner when they changed. While the database does not answer, the last views
/// read stay (the owner's timeouts still bound every wait) and the last view written is written again
/// once it answers.
pub struct GateSync {
    /// The replicas table.
    pub replicas: Replicas,
    /// `replica.name`.
    pub name: String,
    /// `replica.leaseTimeout`: a replica silent for longer is gone, its proxies disconnected.
    pub lease: Duration,
    /// How long a gone replica's last view still holds what it held: `replica.leaseTimeout` again,
    /// for its proxies to reconnect to the others.
    pub hold_gone: Duration,
    /// This replica's view, from the owner.
    pub view: watch::Receiver<Arc<GateView>>,
    /// The peers' views, to the owner.
    pub peers: watch::Sender<Vec<PeerView>>,
    /// Where the status learns which peers the gate counts.
    pub database: watch::Sender<Arc<DatabaseView>>,
}

impl GateSync {
    /// Runs until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        // Versions read so far, and what each said.
        let mut known: LiveViews = BTreeMap::new();
        // Replicas whose lease expired: since when, and their last view.
        let mut gone: GoneViews = BTreeMap::new();
        let mut unwritten = true;
        let mut poll = tokio::time::interval(GATE_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                changed = self.view.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    unwritten = true;
                }
                _ = poll.tick() => self.read_peers(&mut known, &mut gone).await,
            }
            if unwritten {
                unwritten = !self.write_view().await;
            }
        }
    }

    /// Writes this replica's current view; whether it was written.
    async fn write_view(&mut self) -> bool {
        let view = self.view.borrow_and_update().clone();
        let json = match serde_json::to_string(&*view) {
            Ok(json) => json,
            Err(e) => {
                tracing::error!("cannot encode this replica's rollout state: {e}");
                return true;
            }
        };
        let (bytes, started) = (json.len(), std::time::Instant::now());
        match self.replicas.publish_gate(&self.name, json).await {
            Ok(()) => {
                tracing::debug!(
                    bytes,
                    micros = started.elapsed().as_micros() as u64,
                    "wrote this replica's rollout state"
                );
                true
            }
            Err(e) => {
                tracing::debug!("this replica's rollout state waits for the database: {e}");
                false
            }
        }
    }

    /// Reads the live peers' views and hands them to the owner, with the gone ones' last views
    /// (see [`meshca_control::keep_gone`]), when they changed.
    async fn read_peers(&self, known: &mut LiveViews, gone: &mut GoneViews) {
        let versions: Vec<(String, i64)> = known
            .iter()
            .map(|(name, (version, _))| (name.clone(), *version))
            .collect();
        let read = match self
            .replicas
            .peer_gates(&self.name, self.lease, &versions)
            .await
        {
            Ok(read) => read,
            Err(e) => {
                tracing::debug!("the other replicas' rollout state waits for the database: {e}");
                return;
            }
        };
        let mut now_known = BTreeMap::new();
        for PeerGate {
            name,
            version,
            state,
        } in read
        {
            let view = match state {
                None => None,
                Some(None) => known.get(&name).and_then(|(_, view)| view.clone()),
                Some(Some(json)) => parse_view(&name, &json),
            };
            now_known.insert(name, (version, view));
        }
        keep_gone(
            std::mem::replace(known, now_known),
            known,
            gone,
            Instant::now(),
            self.hold_gone,
        );
        let peers = peer_views(known, gone);
        let counted: Vec<RolloutPeer> = peers
            .iter()
            .map(|peer| RolloutPeer {
                name: peer.replica.clone(),
                readable: peer.view.is_some(),
                gone: peer.gone,
            })
            .collect();
        // Every read is told, changed or not: the gate counts on its list of peers for a rollout
        // step only once the database was read after the step began.
        self.peers.send_modify(|current| {
            if *current != peers {
                *current = peers;
            }
        });
        self.database.send_if_modified(|view| {
            if view.rollout_peers == counted {
                return false;
            }
            let mut updated = (**view).clone();
            updated.rollout_peers = counted;
            *view = Arc::new(updated);
            true
        });
    }
}

/// A peer's view from its JSON; `None` (it holds every rollout step back) when it does not parse or
/// is too large, which is logged.
fn parse_view(replica: &str, json: &str) -> Option<GateView> {
    if json.len() > MAX_GATE_VIEW {
        tracing::warn!(
            replica = %replica,
            bytes = json.len(),
            "a replica's rollout state is larger than {MAX_GATE_VIEW} bytes; it holds every rollout step back until rollout.ackTimeout"
        );
        return None;
    }
    match serde_json::from_str(json) {
        Ok(view) => Some(view),
        Err(e) => {
            tracing::warn!(
                replica = %replica,
                "a replica's rollout state cannot be read ({e}); it holds every rollout step back until rollout.ackTimeout (is it another meshca version?)"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use meshca_control::{PresentedCa, TrustEntry};
    use proptest::prelude::*;

    use super::*;

    fn view(mesh: &str, ca: &str, named: Vec<String>) -> GateView {
        let mut view = GateView::default();
        view.trust_acked.insert(
            mesh.to_owned(),
            BTreeSet::from([TrustEntry {
                trust_domain: mesh.to_owned(),
                ca: ca.to_owned(),
            }]),
        );
        view.presented.push(PresentedCa {
            mesh: mesh.to_owned(),
            trust_domain: mesh.to_owned(),
            ca: ca.to_owned(),
            anchors: vec!["-----BEGIN CERTIFICATE-----".to_owned()],
            proxies: named.len(),
            named,
        });
        view
    }

    proptest! {
        /// What a replica writes, another reads back the same.
        #[test]
        fn a_view_reads_back_as_written(
            mesh in "\\PC{0,20}",
            ca in "[0-9a-f]{0,64}",
            named in proptest::collection::vec("\\PC{0,30}", 0..5),
        ) {
            let written = view(&mesh, &ca, named);
            let json = serde_json::to_string(&written).expect("encodes");
            prop_assert_eq!(parse_view("b", &json), Some(written));
        }

        /// Whatever a row holds, reading it never panics, and what is not a view holds everything.
        #[test]
        fn any_text_reads_as_a_view_or_as_unreadable(json in "\\PC{0,200}") {
            if let Some(view) = parse_view("b", &json) {
                let again = serde_json::to_string(&view).expect("encodes");
                prop_assert_eq!(parse_view("b", &again), Some(view));
            }
        }
    }

    #[test]
    fn a_view_of_another_shape_is_unreadable() {
        assert_eq!(parse_view("b", r#"{"trust_acked": 7}"#), None);
        assert_eq!(parse_view("b", "not json"), None);
        // A field missing (another version) is not read as empty, which would hold nothing back.
        assert_eq!(parse_view("b", "{}"), None);
    }
}
