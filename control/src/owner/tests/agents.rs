//! Dataplanes a `meshca agent` serves: the agent makes their keys and offers the public halves; the
//! owner certifies those, never a key of its own, in the order the rollout gate allows.

use meshca_ca::{PrivateKey, PublicKey};
use meshca_identity::KeyAlgorithm;

use super::*;
use crate::LeafKey;

/// web-1 is served by agent host-1 (a WorkloadRegistration names it); web-2 by meshca over SDS.
const SERVED: &str = r#"
---
type: Dataplane
mesh: default
name: web-1
labels: {app: web}
networking:
  inbound: [{port: 8080, tags: {kuma.io/service: web}}]
---
type: Dataplane
mesh: default
name: web-2
labels: {app: web}
networking:
  inbound: [{port: 8080, tags: {kuma.io/service: web}}]
---
type: WorkloadRegistration
mesh: default
name: billing
spec:
  dataplane: web-1
  selectors: [unix:uid:1001]
  agent: host-1
"#;

fn world(mesh: &str) -> String {
    format!("{mesh}{SERVED}")
}

/// A fresh key of `algorithm`, as an agent would make it; only its public half reaches the owner.
fn agent_key(algorithm: KeyAlgorithm) -> Arc<PublicKey> {
    let (_private, public) = PrivateKey::generate(algorithm).expect("a key");
    Arc::new(public)
}

/// The key the certificate `identity` serves certifies.
fn certified(identity: &ProxyIdentity) -> PublicKey {
    meshca_ca::certificate_public_key(&leaf_der(identity)).expect("a readable leaf")
}

/// Connects `name` as its Dataplane file describes it; its stream subscribes to its identity and the
/// mesh trust.
fn connect_filed(h: &mut Harness, name: &str) -> StreamId {
    let stream = h.connect(name, &[("app", "web")], &[("kuma.io/service", "web")]);
    h.stream(stream.0, &["default", "system_trust_bundle"], None);
    stream
}

fn offer(h: &mut Harness, stream: StreamId, key: &Arc<PublicKey>, replace_now: bool) -> bool {
    h.owner.on_event(StreamEvent::KeyOffered {
        stream,
        key: key.clone(),
        replace_now,
    })
}

/// Asserts that `identity` is served over the agent's `key`, and holds no private key anywhere.
fn assert_over(identity: &ProxyIdentity, key: &PublicKey) {
    assert_eq!(
        certified(identity),
        *key,
        "the leaf certifies the agent's key"
    );
    match &identity.key {
        LeafKey::Agent(published) => assert_eq!(**published, *key),
        LeafKey::Held(_) => panic!("an agent-served identity carries a private key"),
    }
    assert!(!identity.chain_pem.contains("PRIVATE KEY"));
}

#[test]
fn an_agent_served_dataplane_waits_for_its_agents_key_and_is_issued_over_it() {
    let mut h = Harness::new(&world(LEGACY));
    let stream = connect_filed(&mut h, "web-1");
    h.reconcile(t0());
    // No key yet: no job, Pending, and the status says whose key it waits for.
    assert!(h.owner.take_jobs().is_empty());
    assert!(matches!(h.entry("web-1"), ProxyEntry::Pending));
    let status = h.status();
    let reason = dataplane(&status, "web-1")
        .reason
        .clone()
        .unwrap_or_default();
    assert!(
        reason.contains("meshca agent host-1's key request"),
        "{reason}"
    );

    let key = agent_key(KeyAlgorithm::EcdsaP256);
    assert!(
        offer(&mut h, stream, &key, false),
        "a key for a proxy waiting for one matters"
    );
    h.reconcile(t0() + Duration::from_secs(1));
    let served = h.ready("web-1");
    assert_over(&served, &key);
    assert_eq!(served.spiffe_id, "spiffe://default/web");
    assert_eq!(dataplane(&h.status(), "web-1").reason, None);
}

#[test]
fn renewal_uses_the_newest_offered_key_or_the_current_one_when_none_came() {
    let mut h = Harness::new(&world(LEGACY));
    let stream = connect_filed(&mut h, "web-1");
    let first = agent_key(KeyAlgorithm::EcdsaP256);
    offer(&mut h, stream, &first, false);
    h.reconcile(t0());
    let issued = h.ready("web-1");
    assert_over(&issued, &first);

    // The agent sends its next key at once; it is for the next renewal, not a reason to reissue.
    let second = agent_key(KeyAlgorithm::EcdsaP256);
    let third = agent_key(KeyAlgorithm::EcdsaP256);
    assert!(!offer(&mut h, stream, &second, false));
    assert!(
        !offer(&mut h, stream, &third, false),
        "the newest offer replaces the last"
    );
    let renew = h
        .reconcile(t0() + Duration::from_secs(1))
        .expect("a renewal is due some day");
    assert!(
        Arc::ptr_eq(&h.ready("web-1"), &issued),
        "reissued before its renewal"
    );

    let renewed_at = renew;
    let next = h.reconcile(renewed_at).expect("connected");
    let renewed = h.ready("web-1");
    assert_over(&renewed, &third);
    assert_eq!(h.owner.agent_keys.offers(), 0, "the offer is used");

    // A silent agent: the next renewal certifies the key the agent already holds.
    h.reconcile(next);
    let again = h.ready("web-1");
    assert!(!Arc::ptr_eq(&again, &renewed), "renewed");
    assert_ne!(again.chain_pem, renewed.chain_pem);
    assert_over(&again, &third);
    assert_eq!(dataplane(&h.status(), "web-1").regenerations, 2);
}

#[test]
fn replace_now_reissues_over_the_new_key_at_once() {
    let mut h = Harness::new(&world(LEGACY));
    let stream = connect_filed(&mut h, "web-1");
    let first = agent_key(KeyAlgorithm::EcdsaP256);
    offer(&mut h, stream, &first, false);
    h.reconcile(t0());
    assert_over(&h.ready("web-1"), &first);
    // Offering the key it holds, even saying replace now, changes nothing.
    assert!(!offer(&mut h, stream, &first, true));

    // The agent restarted and lost its keys.
    let fresh = agent_key(KeyAlgorithm::EcdsaP256);
    assert!(
        offer(&mut h, stream, &fresh, true),
        "the proxy must be looked at now"
    );
    h.reconcile(t0() + Duration::from_secs(1));
    assert_over(&h.ready("web-1"), &fresh);
}

#[test]
fn a_key_offered_for_a_proxy_no_agent_serves_is_ignored() {
    let mut h = Harness::new(&world(LEGACY));
    let web2 = connect_filed(&mut h, "web-2");
    let key = agent_key(KeyAlgorithm::EcdsaP256);
    assert!(!offer(&mut h, web2, &key, true));
    // A stream of no connected proxy.
    assert!(!offer(&mut h, StreamId(99), &key, true));
    assert_eq!(h.owner.agent_keys.offers(), 0);
    h.reconcile(t0());
    let served = h.ready("web-2");
    assert!(served.key.held().is_some(), "meshca makes web-2's key");
    assert_ne!(certified(&served), *key);
}

#[test]
fn a_key_of_the_wrong_algorithm_fails_issuance_and_is_dropped_for_the_next_one() {
    let mut h = Harness::new(&world(LEGACY));
    let stream = connect_filed(&mut h, "web-1");
    // Leaves are ECDSA P-256 (issuance.keyAlgorithm); the agent offers P-384.
    let wrong = agent_key(KeyAlgorithm::EcdsaP384);
    assert!(offer(&mut h, stream, &wrong, false));
    h.reconcile(t0());
    assert_eq!(
        h.owner.agent_keys.offers(),
        0,
        "the unusable key is dropped"
    );
    assert!(matches!(
        h.entry("web-1"),
        ProxyEntry::NoIdentity { .. } | ProxyEntry::Pending
    ));
    // Its retry finds no key, and waits for the agent's next one.
    h.reconcile(t0() + Duration::from_secs(60));
    assert!(matches!(h.entry("web-1"), ProxyEntry::Pending));
    let right = agent_key(KeyAlgorithm::EcdsaP256);
    assert!(offer(&mut h, stream, &right, false));
    h.reconcile(t0() + Duration::from_secs(61));
    assert_over(&h.ready("web-1"), &right);
}

#[test]
fn an_agent_served_proxy_is_rotated_to_a_new_ca_only_once_every_stream_acked_its_trust() {
    let mut h = Harness::new(&world(LEGACY));
    let agent = connect_filed(&mut h, "web-1");
    let web2 = connect_filed(&mut h, "web-2");
    let key = agent_key(KeyAlgorithm::EcdsaP256);
    offer(&mut h, agent, &key, false);
    h.reconcile(t0());
    let g = generation(&h);
    h.ack(agent.0, Some(g));
    h.ack(web2.0, Some(g));
    let ca1 = issuer_of(&h.ready("web-1"));

    h.update(&world(SWITCHED)).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    let ca2 = ca_subject(&h, "ca-2");
    let g_trust = generation(&h);
    assert!(
        bundle_subjects(&h).contains(&ca2),
        "the new CA is trusted at once"
    );
    assert_eq!(issuer_of(&h.ready("web-1")), ca1, "but issues nothing yet");

    // The agent's stream ACKs the new trust; web-2 has not: still nothing from ca-2.
    h.ack(agent.0, Some(g_trust));
    h.reconcile(t0() + Duration::from_secs(2));
    assert_eq!(issuer_of(&h.ready("web-1")), ca1);
    assert_eq!(issuer_of(&h.ready("web-2")), ca1);

    h.ack(web2.0, Some(g_trust));
    h.reconcile(t0() + Duration::from_secs(3));
    let rotated = h.ready("web-1");
    assert_eq!(issuer_of(&rotated), ca2);
    // A silent agent does not stall the rotation: the key it holds is certified again.
    assert_over(&rotated, &key);
    assert_eq!(issuer_of(&h.ready("web-2")), ca2);
}

#[test]
fn a_forgotten_proxy_forgets_its_offer_and_an_unregistered_one_gets_a_key_of_meshcas() {
    let mut h = Harness::new(&world(LEGACY));
    let stream = connect_filed(&mut h, "web-1");
    let first = agent_key(KeyAlgorithm::EcdsaP256);
    offer(&mut h, stream, &first, false);
    h.reconcile(t0());
    assert_over(&h.ready("web-1"), &first);
    offer(&mut h, stream, &agent_key(KeyAlgorithm::EcdsaP256), false);
    assert_eq!(h.owner.agent_keys.offers(), 1);

    // The registration goes: meshca serves web-1 itself, over a key of its own, at once.
    let unregistered = world(LEGACY).replace("  agent: host-1\n", "");
    h.update(&unregistered).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(h.owner.agent_keys.offers(), 0);
    let served = h.ready("web-1");
    assert!(served.key.held().is_some());
    assert_ne!(certified(&served), *first);
}

/// Both ends of an owner's link to the replicas' records.
struct Records {
    issued: tokio::sync::mpsc::UnboundedReceiver<Vec<crate::owner::IssuedIdentity>>,
    _lookups: tokio::sync::mpsc::UnboundedReceiver<ProxyKey>,
}

fn records(h: &mut Harness) -> Records {
    let (issued_tx, issued) = tokio::sync::mpsc::unbounded_channel();
    let (lookups_tx, lookups) = tokio::sync::mpsc::unbounded_channel();
    h.owner.record_through(crate::owner::RecordLink {
        issued: issued_tx,
        lookups: lookups_tx,
    });
    Records {
        issued,
        _lookups: lookups,
    }
}

/// What another replica serving the same configuration recorded for `name`, served over `key` when
/// an agent serves it.
fn recorded_elsewhere(
    h: &Harness,
    name: &str,
    key: Option<&Arc<PublicKey>>,
) -> crate::owner::IssuedIdentity {
    recorded_by(h, OwnerConfig::from_settings(&h.settings), name, key)
}

/// [`recorded_elsewhere`], by a replica configured as `config`.
fn recorded_by(
    h: &Harness,
    config: OwnerConfig,
    name: &str,
    key: Option<&Arc<PublicKey>>,
) -> crate::owner::IssuedIdentity {
    let (snapshot_tx, snapshots) = watch::channel(Arc::new(Snapshot::empty()));
    let mut b = Harness {
        keystore: MemoryKeystore::new(),
        settings: h.settings.clone(),
        owner: Owner::new(
            config,
            (**h.owner.world()).clone(),
            Arc::new(NoTelemetry),
            snapshot_tx,
        ),
        snapshots,
        next_stream: 0,
    };
    let mut link = records(&mut b);
    let stream = connect_filed(&mut b, name);
    if let Some(key) = key {
        offer(&mut b, stream, key, false);
    }
    b.reconcile(t0());
    link.issued.try_recv().expect("b issued")[0].clone()
}

#[test]
fn a_keyless_identity_is_recorded_and_adopted_by_another_replica_for_an_agent_served_proxy_only() {
    let mut h = Harness::new(&world(LEGACY));
    let key = agent_key(KeyAlgorithm::EcdsaP256);
    let held = recorded_elsewhere(&h, "web-1", Some(&key));
    assert!(held.key_pem.is_none(), "recorded without a key");
    let web2_held = recorded_elsewhere(&h, "web-2", None);
    assert!(web2_held.key_pem.is_some());

    let _link = records(&mut h);
    connect_filed(&mut h, "web-1");
    // The mesh's bundles are published (web-1 waits for its agent's key here).
    h.reconcile(t0());
    assert!(matches!(h.entry("web-1"), ProxyEntry::Pending));
    connect_filed(&mut h, "web-2");
    let web1 = ProxyKey::new("default", "web-1");
    let web2 = ProxyKey::new("default", "web-2");
    // A key-less record of a proxy meshca makes the keys of, and a record with a key for a proxy an
    // agent serves, are not served.
    let keyless_web2 = crate::owner::IssuedIdentity {
        key_pem: None,
        ..web2_held.clone()
    };
    assert!(!h.owner.adopt(web2.clone(), Some(keyless_web2), t0()));
    assert!(
        h.owner.adopt(web2, Some(web2_held.clone()), t0()),
        "with its key it is served"
    );
    let web1_with_a_key = crate::owner::IssuedIdentity {
        key_pem: web2_held.key_pem.clone(),
        ..held.clone()
    };
    assert!(!h.owner.adopt(web1.clone(), Some(web1_with_a_key), t0()));

    assert!(h.owner.adopt(web1, Some(held.clone()), t0()));
    // Served at once, while this replica issues its own.
    h.owner.reconcile(t0());
    let served = h.ready("web-1");
    assert_eq!(
        served.chain_pem, held.chain_pem,
        "the other replica's certificate"
    );
    assert_over(&served, &key);
    // This replica's own is over the key the agent holds (it offered none here yet).
    h.reconcile(t0());
    let renewed = h.ready("web-1");
    assert_ne!(renewed.chain_pem, held.chain_pem);
    assert_over(&renewed, &key);
}

#[test]
fn a_certificate_over_a_key_of_another_algorithm_is_served_until_the_agent_offers_a_new_key() {
    let mut h = Harness::new(&world(LEGACY));
    // Another replica issued web-1's certificate over a P-384 key; leaves here are P-256.
    let p384 = agent_key(KeyAlgorithm::EcdsaP384);
    let config = OwnerConfig {
        key_algorithm: KeyAlgorithm::EcdsaP384,
        ..OwnerConfig::from_settings(&h.settings)
    };
    let held = recorded_by(&h, config, "web-1", Some(&p384));
    let stream = connect_filed(&mut h, "web-1");
    h.reconcile(t0());
    assert!(h
        .owner
        .adopt(ProxyKey::new("default", "web-1"), Some(held.clone()), t0()));
    // Due for replacement at once, but no renewal can reuse its key: it is served, and nothing is
    // issued until the agent offers a key of the leaves' algorithm.
    h.reconcile(t0());
    assert!(h.owner.take_jobs().is_empty());
    let served = h.ready("web-1");
    assert_eq!(served.chain_pem, held.chain_pem);
    assert_over(&served, &p384);
    let reason = dataplane(&h.status(), "web-1").reason.clone();
    assert!(
        reason
            .as_deref()
            .is_some_and(|r| r.contains("meshca agent host-1's key request")),
        "{reason:?}"
    );

    let p256 = agent_key(KeyAlgorithm::EcdsaP256);
    assert!(
        offer(&mut h, stream, &p256, false),
        "a key for a proxy that cannot be renewed without one matters now"
    );
    h.reconcile(t0() + Duration::from_secs(1));
    assert_over(&h.ready("web-1"), &p256);
}
