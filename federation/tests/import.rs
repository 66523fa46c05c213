//! Following a peer's bundle endpoint (written against the standard in `peer/`): the initial bundle,
//! the first fetch, the peer's rotation, every refusal, the peer's outage, and a restart that finds the
//! last good bundle stored. Each step is a fetch asked for with `Importer::refresh` and awaited on the
//! status channel, never a sleep.

use std::sync::Arc;

use meshca_federation::import::{stored_path, ImportOptions, Importer, PeerStatuses};
use meshca_federation::{HeldFrom, Peer, PeerProfile, PeerStatus, SpiffeBundle};
use meshca_identity::SpiffeId;
use meshca_keystore::{Keystore, MemoryKeystore};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

mod peer;

use peer::{bundle_json, held, td, Ca, Endpoint, ENDPOINT_ID};

fn spiffe_peer(endpoint: &Endpoint, initial: Option<SpiffeBundle>) -> Peer {
    Peer {
        trust_domain: td(),
        url: endpoint.url(),
        profile: PeerProfile::Spiffe {
            id: SpiffeId::parse(ENDPOINT_ID).expect("a SPIFFE ID"),
        },
        initial: initial.map(Arc::new),
    }
}

struct Following {
    importer: Importer,
    status: watch::Receiver<Arc<PeerStatuses>>,
    peers: watch::Sender<Arc<Vec<Peer>>>,
    _shutdown: tokio_util::sync::DropGuard,
}

fn follow(peers: Vec<Peer>, keystore: Arc<dyn Keystore>) -> Following {
    let (tx, rx) = watch::channel(Arc::new(peers));
    let shutdown = CancellationToken::new();
    let importer = Importer::spawn(rx, keystore, ImportOptions::default(), shutdown.clone());
    Following {
        status: importer.status(),
        importer,
        peers: tx,
        _shutdown: shutdown.drop_guard(),
    }
}

impl Following {
    /// The status once the peer has had `attempts` fetches.
    async fn after(&mut self, attempts: u64) -> PeerStatus {
        let all = self
            .status
            .wait_for(|all| {
                all.get(&td()).is_some_and(|s| {
                    s.fetches.ok + s.fetches.failed + s.fetches.refused >= attempts
                        && s.next_fetch.is_some()
                })
            })
            .await
            .expect("the importer runs");
        all[&td()].clone()
    }

    /// Asks for a fetch now and returns the status after it (the `attempts`-th).
    async fn refresh(&mut self, attempts: u64) -> PeerStatus {
        assert!(self.importer.refresh(&td()), "the peer is followed");
        self.after(attempts).await
    }

    fn held(&self) -> Option<Arc<SpiffeBundle>> {
        self.importer.held().borrow().get(&td()).cloned()
    }
}

fn ders(bundle: &SpiffeBundle) -> Vec<Vec<u8>> {
    bundle
        .x509_authorities()
        .iter()
        .map(|a| a.der().to_vec())
        .collect()
}

#[tokio::test]
async fn a_peer_is_followed_through_its_rotation_and_every_refusal_keeps_the_last_good_bundle() {
    let ca = Ca::new("peer.example");
    let endpoint =
        Endpoint::start(ca.svid(ENDPOINT_ID), "200 OK", bundle_json(&[ca.jwk()], 5)).await;
    let keystore: Arc<dyn Keystore> = Arc::new(MemoryKeystore::new());
    let mut following = follow(
        vec![spiffe_peer(&endpoint, Some(held(&ca)))],
        keystore.clone(),
    );

    // The first fetch happens at once, checked by the initial bundle, and is stored.
    let status = following.after(1).await;
    assert_eq!(status.fetches.ok, 1, "{status:?}");
    assert_eq!(status.held_from, HeldFrom::Fetched);
    assert_eq!(status.sequence, Some(5));
    assert!(status.fetched_at.is_some() && status.last_error.is_none());
    assert_eq!(status.profile, "https_spiffe");
    assert!(keystore
        .get_public(&stored_path(&td()))
        .expect("reads")
        .is_some());

    // The peer prepares its next CA: the bundle with both is held.
    let next = Ca::new("peer.example");
    endpoint.answer("200 OK", bundle_json(&[ca.jwk(), next.jwk()], 6));
    let status = following.refresh(2).await;
    assert_eq!(status.sequence, Some(6), "{status:?}");
    let held_now = following.held().expect("held");
    assert_eq!(ders(&held_now), [ca.der(), next.der()]);

    // Refused whole, each keeping the bundle of sequence 6: the sequence going backwards...
    endpoint.answer("200 OK", bundle_json(&[next.jwk()], 4));
    let status = following.refresh(3).await;
    assert_eq!(status.fetches.refused, 1, "{status:?}");
    let error = status.last_error.clone().expect("an error");
    assert!(error.contains("went backwards, from 6 to 4"), "{error}");
    // ...a CA of another trust domain...
    let stranger = Ca::new("other.example");
    endpoint.answer("200 OK", bundle_json(&[stranger.jwk()], 7));
    let status = following.refresh(4).await;
    assert_eq!(status.fetches.refused, 2, "{status:?}");
    let error = status.last_error.clone().expect("an error");
    assert!(error.contains("other.example"), "{error}");
    // ...a document that is no bundle, and one over the size limit.
    endpoint.answer("200 OK", b"{\"keys\": 3}".to_vec());
    let status = following.refresh(5).await;
    assert_eq!(status.fetches.refused, 3, "{status:?}");
    endpoint.answer("200 OK", vec![b' '; 300 * 1024]);
    let status = following.refresh(6).await;
    assert_eq!(status.fetches.refused, 4, "{status:?}");
    let error = status.last_error.clone().expect("an error");
    assert!(error.contains("262144"), "{error}");
    // The peer is down.
    endpoint.answer("503 Service Unavailable", Vec::new());
    let status = following.refresh(7).await;
    assert_eq!(status.fetches.failed, 1, "{status:?}");
    assert!(status
        .last_error
        .as_deref()
        .is_some_and(|e| e.contains("503")));
    // Through all of it, the last good bundle is held and stored.
    assert_eq!(status.sequence, Some(6));
    assert_eq!(following.held().expect("held"), held_now);
    assert!(status.next_fetch.is_some());

    // The peer is back, with its next CA only (sequence 8): held.
    endpoint.answer("200 OK", bundle_json(&[next.jwk()], 8));
    let status = following.refresh(8).await;
    assert_eq!(status.sequence, Some(8), "{status:?}");
    assert!(status.last_error.is_none());
    assert_eq!(ders(&following.held().expect("held")), [next.der()]);

    // Its endpoint now presents an SVID of the next CA: checked by the bundle held.
    let moved = Endpoint::start(
        next.svid(ENDPOINT_ID),
        "200 OK",
        bundle_json(&[next.jwk()], 9),
    )
    .await;
    following
        .peers
        .send(Arc::new(vec![spiffe_peer(&moved, Some(held(&ca)))]))
        .expect("followed");
    let status = following
        .status
        .wait_for(|all| {
            all.get(&td())
                .is_some_and(|s| s.url == moved.url() && s.fetches.ok == 1)
        })
        .await
        .expect("runs")[&td()]
        .clone();
    // The stored bundle (sequence 8) took over from the initial one, and checked the new endpoint.
    assert_eq!(status.sequence, Some(9), "{status:?}");
    assert_eq!(moved.served(), 1);

    // The relationship is removed: nothing is held for the trust domain any more.
    following.peers.send(Arc::new(Vec::new())).expect("sent");
    following
        .status
        .wait_for(|all| all.is_empty())
        .await
        .expect("runs");
    assert!(following.held().is_none());
}

#[tokio::test]
async fn after_a_restart_the_stored_bundle_serves_through_the_peers_outage() {
    let ca = Ca::new("peer.example");
    let next = Ca::new("peer.example");
    let endpoint = Endpoint::start(
        ca.svid(ENDPOINT_ID),
        "200 OK",
        bundle_json(&[ca.jwk(), next.jwk()], 3),
    )
    .await;
    let keystore: Arc<dyn Keystore> = Arc::new(MemoryKeystore::new());
    let mut first = follow(
        vec![spiffe_peer(&endpoint, Some(held(&ca)))],
        keystore.clone(),
    );
    assert_eq!(first.after(1).await.sequence, Some(3));
    drop(first);

    // Restarted while the peer is down: the stored bundle is held, not the initial one.
    endpoint.answer("500 Internal Server Error", Vec::new());
    let mut second = follow(vec![spiffe_peer(&endpoint, Some(held(&ca)))], keystore);
    let status = second.after(1).await;
    assert_eq!(status.held_from, HeldFrom::Stored, "{status:?}");
    assert_eq!(status.sequence, Some(3));
    assert_eq!(status.fetches.failed, 1);
    assert_eq!(ders(&second.held().expect("held")), [ca.der(), next.der()]);
    assert!(status.age(std::time::SystemTime::now()).is_some());
}

#[tokio::test]
async fn a_corrupt_stored_bundle_is_said_and_the_initial_bundle_serves() {
    let ca = Ca::new("peer.example");
    let endpoint = Endpoint::start(
        ca.svid(ENDPOINT_ID),
        "500 Internal Server Error",
        Vec::new(),
    )
    .await;
    let keystore: Arc<dyn Keystore> = Arc::new(MemoryKeystore::new());
    keystore
        .put_public(
            &stored_path(&td()),
            b"{\"fetched_at\": 1, \"bundle\": {\"keys\": []}}",
        )
        .expect("writes");
    let mut following = follow(vec![spiffe_peer(&endpoint, Some(held(&ca)))], keystore);
    let status = following.after(1).await;
    assert_eq!(status.held_from, HeldFrom::InitialBundle, "{status:?}");
    assert_eq!(ders(&following.held().expect("held")), [ca.der()]);
    // The fetch's own failure is what the status says last; the log said the record was corrupt.
    assert!(status.last_error.is_some());
}

#[tokio::test]
async fn an_https_spiffe_peer_with_nothing_held_cannot_be_fetched_and_says_why() {
    let ca = Ca::new("peer.example");
    let endpoint =
        Endpoint::start(ca.svid(ENDPOINT_ID), "200 OK", bundle_json(&[ca.jwk()], 1)).await;
    let mut following = follow(
        vec![spiffe_peer(&endpoint, None)],
        Arc::new(MemoryKeystore::new()),
    );
    let status = following.after(1).await;
    assert_eq!(status.held_from, HeldFrom::Nothing);
    assert_eq!(status.fetches.failed, 1);
    let error = status.last_error.expect("an error");
    assert!(
        error.contains("give the relationship an initialBundle"),
        "{error}"
    );
    assert!(following.held().is_none());
    assert_eq!(
        endpoint.served(),
        0,
        "nothing was sent to an endpoint that cannot be checked"
    );
}
