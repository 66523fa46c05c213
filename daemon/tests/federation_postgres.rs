//! Replicas on one PostgreSQL database share what they fetched from a federation peer: a replica that
//! starts while the peer is down holds the bundle another replica stored, not only its initial one.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;

use common::{on_postgres, peer_status, settings, start, write_private, TIMEOUT};
use meshca_config::{EndpointServing, FederationEndpoint, Settings};
use meshca_federation::HeldFrom;
use meshca_identity::TrustDomain;
use meshca_testpg::TestPostgres;

fn alpha() -> TrustDomain {
    "alpha".parse().expect("a trust domain")
}

/// Replica `name` in `root`, on `pg`'s database, following alpha's endpoint at `url` with `initial`.
fn replica(
    root: &Path,
    pg: &TestPostgres,
    shared: &Path,
    name: &str,
    url: &str,
    initial: &Path,
) -> Settings {
    let resources = root.join("resources");
    std::fs::create_dir_all(&resources).expect("resources");
    std::fs::write(
        resources.join("mesh.yaml"),
        "type: Mesh\nname: beta\nmeshServices:\n  mode: Exclusive\nmtls: {enabledBackend: ca-1, backends: [{name: ca-1, type: builtin}]}\n",
    )
    .expect("mesh");
    std::fs::write(
        resources.join("alpha.yaml"),
        format!(
            "type: FederationRelationship\nname: alpha\nmesh: beta\nspec:\n  trustDomain: alpha\n  bundleEndpoint: {{url: \"{url}\", profile: https_spiffe, spiffeID: \"spiffe://alpha/meshca/bundle-endpoint\"}}\n  initialBundle: {{file: {}}}\n",
            initial.display()
        ),
    )
    .expect("relationship");
    on_postgres(settings(root), pg, shared, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_starts_while_the_peer_is_down_holds_what_another_replica_stored() {
    let pg = tokio::task::block_in_place(TestPostgres::start);
    let shared = tempfile::tempdir().expect("a temp dir");
    write_private(&shared.path().join("kek"), &[7u8; 32]);
    write_private(
        &shared.path().join("db-password"),
        format!("{}\n", pg.password()).as_bytes(),
    );

    // alpha serves its bundle; what it serves first becomes beta's initial bundle.
    let alpha_root = tempfile::tempdir().expect("a temp dir");
    let resources = alpha_root.path().join("resources");
    std::fs::create_dir_all(&resources).expect("resources");
    std::fs::write(
        resources.join("mesh.yaml"),
        "type: Mesh\nname: alpha\nmeshServices:\n  mode: Exclusive\nmtls: {enabledBackend: ca-1, backends: [{name: ca-1, type: builtin}]}\n",
    )
    .expect("mesh");
    let mut s = settings(alpha_root.path());
    s.federation.endpoints = vec![FederationEndpoint {
        trust_domain: alpha(),
        listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        profile: EndpointServing::HttpsSpiffe,
    }];
    let alpha_daemon = start(s, false).await;
    let endpoint = &alpha_daemon.bundle_endpoints[0];
    tokio::time::timeout(TIMEOUT, endpoint.ready())
        .await
        .expect("alpha's endpoint is ready");
    let url = format!("https://{}/", endpoint.addr);
    let first = endpoint.served.borrow().clone().expect("a bundle");
    let initial = shared.path().join("alpha-initial.json");
    std::fs::write(&initial, &first.json).expect("initial bundle");

    // alpha rotates: the bundle it serves now (sequence 2) is not the initial one.
    std::fs::write(
        resources.join("mesh.yaml"),
        "type: Mesh\nname: alpha\nmeshServices:\n  mode: Exclusive\nmtls: {enabledBackend: ca-2, secondaryBackends: [ca-1], backends: [{name: ca-1, type: builtin}, {name: ca-2, type: builtin}]}\n",
    )
    .expect("rotation");
    alpha_daemon
        .reload_resources()
        .await
        .expect("reloads")
        .expect("accepted");
    let mut served = endpoint.served.clone();
    tokio::time::timeout(
        TIMEOUT,
        served.wait_for(|b| b.as_ref().is_some_and(|b| b.bundle.sequence == Some(2))),
    )
    .await
    .expect("served in time")
    .expect("serving");

    // Replica beta-a fetches it and stores it in the database.
    let root_a = tempfile::tempdir().expect("a temp dir");
    let replica_a = start(
        replica(root_a.path(), &pg, shared.path(), "beta-a", &url, &initial),
        false,
    )
    .await;
    peer_status(&replica_a, &alpha(), |s| s.sequence == Some(2)).await;
    replica_a.stop().await;
    alpha_daemon.stop().await;

    // alpha is down. Replica beta-b starts: it holds what beta-a stored, sequence 2 with both CAs.
    let root_b = tempfile::tempdir().expect("a temp dir");
    let replica_b = start(
        replica(root_b.path(), &pg, shared.path(), "beta-b", &url, &initial),
        false,
    )
    .await;
    let peer = &peer_status(&replica_b, &alpha(), |s| s.fetches.failed >= 1).await;
    assert_eq!(peer.held_from, HeldFrom::Stored, "{peer:?}");
    assert_eq!(peer.sequence, Some(2));
    assert_eq!(peer.x509_authorities, 2);
    replica_b.stop().await;
}
