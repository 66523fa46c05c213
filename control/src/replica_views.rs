//! The rollout views of the other replicas on one database, as the gate counts them: the live ones,
//! and for a while the last view of each one whose lease expired.
//!
//! A replica that dies in a rollout leaves proxies that keep serving with the trust they had until
//! they reconnect to another replica, which Envoy may take seconds to do. For a hold
//! (`replica.leaseTimeout`) its last view keeps holding the steps it held, as it would have alive,
//! and a proxy that reconnects meanwhile is counted by the replica it reaches.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::{GateView, PeerView};

/// The replicas whose lease holds, by name: the version of their view last read, and the view
/// (`None`: not written yet, or unreadable).
pub type LiveViews = BTreeMap<String, (i64, Option<GateView>)>;

/// The replicas whose lease expired, by name: since when, and their last view.
pub type GoneViews = BTreeMap<String, (Instant, GateView)>;

/// Moves the replicas of `before` that are no longer live (not in `live`) to `gone` with their last
/// view, and forgets gone replicas after `hold` (or when they are live again). One whose view could
/// not be read goes with its lease.
pub fn keep_gone(
    before: LiveViews,
    live: &LiveViews,
    gone: &mut GoneViews,
    now: Instant,
    hold: Duration,
) {
    for (name, (_, view)) in before {
        if live.contains_key(&name) {
            continue;
        }
        if let Some(view) = view {
            tracing::info!(
                replica = %name,
                "a replica's lease expired; what its last rollout state held back stays held for another replica.leaseTimeout while its proxies reconnect"
            );
            gone.insert(name, (now, view));
        }
    }
    gone.retain(|name, (since, _)| !live.contains_key(name) && now < *since + hold);
}

/// The peers the gate counts: every live replica, then every gone one still held.
pub fn peer_views(live: &LiveViews, gone: &GoneViews) -> Vec<PeerView> {
    let live = live.iter().map(|(name, (_, view))| PeerView {
        replica: name.clone(),
        view: view.clone(),
        gone: false,
    });
    let departed = gone.iter().map(|(name, (_, view))| PeerView {
        replica: name.clone(),
        view: Some(view.clone()),
        gone: true,
    });
    live.chain(departed).collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::{PresentedCa, TrustEntry};

    fn view(mesh: &str, ca: &str) -> GateView {
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
            proxies: 0,
            named: Vec::new(),
        });
        view
    }

    /// A replica whose lease expired keeps its last view for `hold` (its proxies keep the trust they
    /// had until they reconnect elsewhere); one that comes back, or whose view was unreadable, does not.
    #[test]
    fn a_gone_replica_keeps_its_last_view_for_the_hold() {
        let hold = Duration::from_secs(30);
        let t0 = Instant::now();
        let before: LiveViews = BTreeMap::from([
            ("b".to_owned(), (3, Some(view("default", "ca-1")))),
            ("c".to_owned(), (4, None)),
            ("d".to_owned(), (5, Some(view("default", "ca-2")))),
        ]);
        let live = BTreeMap::from([("d".to_owned(), (6, None))]);
        let mut gone = BTreeMap::new();
        keep_gone(before, &live, &mut gone, t0, hold);
        assert_eq!(
            gone.keys().collect::<Vec<_>>(),
            ["b"],
            "b went with a readable view; c's was unreadable; d is live"
        );
        assert_eq!(gone["b"].1, view("default", "ca-1"));
        let peers = peer_views(&live, &gone);
        assert_eq!(
            peers
                .iter()
                .map(|p| (p.replica.as_str(), p.gone, p.view.is_some()))
                .collect::<Vec<_>>(),
            [("d", false, false), ("b", true, true)],
            "the live first, then the gone ones held"
        );
        keep_gone(live.clone(), &live, &mut gone, t0 + hold / 2, hold);
        assert!(gone.contains_key("b"), "still held halfway");
        keep_gone(live.clone(), &live, &mut gone, t0 + hold, hold);
        assert!(gone.is_empty(), "forgotten once the hold is over");
        // One that comes back is live again, not gone.
        let b_live = BTreeMap::from([("b".to_owned(), (7, None))]);
        keep_gone(
            BTreeMap::from([("b".to_owned(), (3, Some(GateView::default())))]),
            &BTreeMap::new(),
            &mut gone,
            t0,
            hold,
        );
        keep_gone(BTreeMap::new(), &b_live, &mut gone, t0, hold);
        assert!(gone.is_empty());
    }
}
