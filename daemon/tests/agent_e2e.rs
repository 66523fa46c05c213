//! A daemon and `meshca agent`s together, all in this process: a workload on an agent's socket gets
//! an SVID over a key the agent made, the server side holds that key nowhere (data directory, admin
//! API), a CA rotation reaches the workload's bundle before its SVID moves to the new CA, the agent
//! keeps serving while the server is down and catches up when it returns, and a revoked agent token
//! gets no new certificate while the agent keeps serving what it holds.

mod common;

use std::time::Duration;

use base64::Engine;
use common::{
    admin_text, ca_subjects, connected_agents, dataplane, leaf_der, leaf_issuer, mesh, my_uid,
    next, registration, reload, settings, start, start_daemon, workloads, write_resources,
    x509_stream, TestAgent, WorkloadKey, ACK_AFTER, TIMEOUT,
};
use meshca_agent::ServerAddr;
use meshca_daemon::revocations::{self, Revoked};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_behind_an_agent_gets_its_identity_over_a_key_the_server_never_holds() {
    let root = tempfile::tempdir().expect("a temp dir");
    let resources = write_resources(root.path(), &workloads(&my_uid()));
    let daemon = start_daemon(root.path()).await;
    let agent = TestAgent::start(
        root.path(),
        "host-a",
        vec![ServerAddr::Unix(root.path().join("sds.sock"))],
        &daemon,
        Duration::from_millis(200),
    )
    .await;

    // The workload gets the dataplane's identity, over a key the agent made.
    let mut svids = x509_stream(&agent.socket).await;
    let first = next(&mut svids).await;
    assert_eq!(first.svids.len(), 1);
    assert_eq!(first.svids[0].spiffe_id, "spiffe://default/batch");
    let old_issuer = leaf_issuer(&first);
    let old_cas = ca_subjects(&first.svids[0].bundle);
    assert!(old_cas.contains(&old_issuer), "the bundle holds its issuer");

    // The key is nowhere on the server's side: not in its data directory, not in its admin API.
    let key = WorkloadKey::of(&first.svids[0].x509_svid_key);
    key.assert_not_under(&root.path().join("data"));
    for path in [
        "/api/status",
        "/api/agents",
        "/api/dataplanes",
        "/api/dataplanes/default/batch-1",
        "/api/streams",
    ] {
        let text = admin_text(daemon.admin_addr, path).await;
        key.assert_not_in(path, text.as_bytes());
    }
    let agents = admin_text(daemon.admin_addr, "/api/agents").await;
    assert!(agents.contains("host-a"), "{agents}");

    // A CA rotation: the workload's bundle holds the new CA before its SVID comes from it.
    std::fs::write(resources.join("mesh.yaml"), mesh("ca-2", &["ca-1"])).expect("mesh.yaml");
    reload(&daemon).await;
    // The agent acknowledges a state only once its streams have had `ackAfter` to apply it, and the
    // server issues from the new CA only once the agent acknowledged its trust: so the SVID comes at
    // least `ackAfter` after the agent sent the bundle that holds its CA. This test reads the bundle
    // some time after it was sent; half of `ackAfter` is the margin left for that. (Without the gate
    // the SVID follows within milliseconds.)
    let mut bundle = old_cas.clone();
    let mut bundle_since = tokio::time::Instant::now();
    loop {
        let message = next(&mut svids).await;
        let issuer = leaf_issuer(&message);
        if issuer != old_issuer {
            assert!(
                bundle.contains(&issuer),
                "the SVID from {issuer} came before a bundle with its CA (bundle held {bundle:?})"
            );
            assert!(
                bundle_since.elapsed() >= ACK_AFTER / 2,
                "the SVID from the new CA came {:?} after the bundle with it, before the agent \
                 could have acknowledged that bundle",
                bundle_since.elapsed()
            );
            assert!(ca_subjects(&message.svids[0].bundle).contains(&issuer));
            break;
        }
        let cas = ca_subjects(&message.svids[0].bundle);
        if cas != bundle {
            bundle = cas;
            bundle_since = tokio::time::Instant::now();
        }
    }
    assert!(
        bundle.len() > old_cas.len(),
        "the new CA came in a message of its own first"
    );

    // The server goes away: the agent keeps serving what it holds, to a new stream too.
    daemon.stop().await;
    let mut again = x509_stream(&agent.socket).await;
    let held = next(&mut again).await;
    assert_eq!(held.svids[0].spiffe_id, "spiffe://default/batch");

    // The server comes back on the same data directory; the agent reconnects, and a rotation that
    // drops the old CA reaches the workload.
    let daemon = start_daemon(root.path()).await;
    std::fs::write(resources.join("mesh.yaml"), mesh("ca-2", &[])).expect("mesh.yaml");
    reload(&daemon).await;
    loop {
        let message = next(&mut again).await;
        let cas = ca_subjects(&message.svids[0].bundle);
        if !cas.contains(&old_issuer) {
            assert_ne!(leaf_issuer(&message), old_issuer);
            break;
        }
    }
    agent.stop().await;
    daemon.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_agent_token_gets_no_new_certificate_and_its_agent_keeps_serving_what_it_holds() {
    let root = tempfile::tempdir().expect("a temp dir");
    let uid = my_uid();
    let resources = write_resources(
        root.path(),
        &format!(
            "{}---\n{}",
            registration("host-a", "batch-1", "batch", "10.0.0.1", &uid),
            registration("host-b", "reports-1", "reports", "10.0.0.2", &uid)
        ),
    );
    // The revocation list is watched, as `meshca serve` watches it.
    let daemon = start(settings(root.path()), true).await;
    let servers = vec![ServerAddr::Unix(root.path().join("sds.sock"))];
    // The revoked agent keeps asking; the server refuses each time.
    let retry = Duration::from_millis(200);
    let revoked = TestAgent::start(root.path(), "host-a", servers.clone(), &daemon, retry).await;
    let other = TestAgent::start(root.path(), "host-b", servers, &daemon, retry).await;

    let mut held_stream = x509_stream(&revoked.socket).await;
    let held = next(&mut held_stream).await;
    assert_eq!(held.svids[0].spiffe_id, "spiffe://default/batch");
    let held_leaf = leaf_der(&held);
    let old_issuer = leaf_issuer(&held);
    let old_cas = ca_subjects(&held.svids[0].bundle);
    let mut other_stream = x509_stream(&other.socket).await;
    let other_first = next(&mut other_stream).await;
    assert_eq!(other_first.svids[0].spiffe_id, "spiffe://default/reports");
    assert_eq!(leaf_issuer(&other_first), old_issuer);
    let before = dataplane(&daemon, "batch-1").await;
    assert!(before.connected, "{before:?}");
    let held_expiry = revoked.agent.status().get().registrations[0]
        .registration
        .expires
        .clone();
    assert!(held_expiry.is_some(), "the agent reports what it serves");

    // The operator revokes host-a's token as `meshca token --revoke` does: into the list the daemon
    // watches.
    let list = root.path().join("data").join(revocations::FILE_NAME);
    assert_eq!(
        revocations::revoke(&list, &revoked.claims.id, true).expect("revokes"),
        Revoked::Added
    );
    // The server ends the agent's stream and refuses it from then on; the agent says why.
    let mut agent_status = revoked.agent.status().subscribe();
    let refused = tokio::time::timeout(
        TIMEOUT,
        agent_status.wait_for(|s| {
            s.server.connected.is_none()
                && s.server
                    .last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("revoked"))
        }),
    )
    .await
    .expect("the agent is refused in time")
    .expect("the agent runs")
    .clone();
    let reason = refused.server.last_error.unwrap_or_default();
    assert!(
        reason.contains(&revoked.claims.id),
        "the reason names the token: {reason}"
    );
    // The stream ends with PERMISSION_DENIED; a new one is refused as unauthenticated.
    assert!(
        reason.contains("PermissionDenied") || reason.contains("Unauthenticated"),
        "{reason}"
    );
    assert!(refused.serving, "the agent still serves what it holds");

    // A CA rotation: the owner issues anew to every connected proxy. Host-b's workload, whose agent's
    // token stands, gets an SVID from the new CA; once it has, the rotation is done.
    std::fs::write(resources.join("mesh.yaml"), mesh("ca-2", &["ca-1"])).expect("mesh.yaml");
    reload(&daemon).await;
    let new_issuer = loop {
        let issuer = leaf_issuer(&next(&mut other_stream).await);
        if issuer != old_issuer {
            break issuer;
        }
    };

    // No certificate was issued over host-a's keys: the server holds batch-1's old one, disconnected.
    let after = dataplane(&daemon, "batch-1").await;
    assert!(!after.connected, "{after:?}");
    assert_eq!(
        (&after.serial, after.regenerations),
        (&before.serial, before.regenerations),
        "no new certificate for batch-1"
    );
    let reports = dataplane(&daemon, "reports-1").await;
    assert!(reports.connected, "{reports:?}");
    assert!(
        reports
            .issuer
            .as_deref()
            .is_some_and(|i| i.contains("ca-2")),
        "{reports:?}"
    );
    assert_eq!(connected_agents(&daemon).await, ["host-b"]);

    // Host-a's workload holds its SVID: whatever reached its stream since is the same certificate
    // and key, and a new stream gets them too, with the bundle it had (nothing of the new CA).
    while let Ok(message) = tokio::time::timeout(Duration::ZERO, held_stream.message()).await {
        let message = message.expect("the stream stays open").expect("a message");
        assert_eq!(leaf_der(&message), held_leaf, "the SVID did not change");
    }
    let mut fresh = x509_stream(&revoked.socket).await;
    let now = next(&mut fresh).await;
    assert_eq!(leaf_der(&now), held_leaf, "the workload keeps the old SVID");
    assert_eq!(now.svids[0].x509_svid_key, held.svids[0].x509_svid_key);
    assert_eq!(leaf_issuer(&now), old_issuer);
    let bundle = ca_subjects(&now.svids[0].bundle);
    assert_eq!(bundle, old_cas);
    assert!(!bundle.contains(&new_issuer));
    let status = revoked.agent.status().get();
    assert!(status.serving && status.server.connected.is_none());
    assert_eq!(status.registrations[0].registration.expires, held_expiry);

    revoked.stop().await;
    other.stop().await;
    daemon.stop().await;
}

#[test]
fn the_key_scan_finds_a_key_stored_as_bytes_hex_or_pem_in_a_dump() {
    use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).expect("a key");
    let pkcs8 = pkcs8.as_ref();
    let key = WorkloadKey::of(pkcs8);
    let found = |content: &[u8]| {
        std::panic::catch_unwind(|| key.assert_not_in("content", content))
            .expect_err("the key is found")
    };
    // The bytes themselves, anywhere in a file.
    found(&[b"prefix".as_slice(), pkcs8, b"suffix"].concat());
    // A bytea, as pg_dump writes it.
    let hex: String = pkcs8.iter().map(|b| format!("{b:02x}")).collect();
    found(format!("COPY t (key) FROM stdin;\n\\\\x{hex}\n\\.\n").as_bytes());
    // PEM in a text column, its line breaks escaped, after text of every length modulo 3.
    let pem = pem::encode(&pem::Pem::new("PRIVATE KEY", pkcs8.to_vec())).replace('\n', "\\n");
    for prefix in ["", "a", "ab"] {
        found(format!("{prefix}{pem}").as_bytes());
    }
    // The private scalar alone, inside a longer base64 text at each alignment.
    let scalar = &pkcs8[36..68];
    for before in 0..3 {
        let blob = [vec![0u8; before], scalar.to_vec(), vec![1u8; 5]].concat();
        found(
            base64::engine::general_purpose::STANDARD
                .encode(blob)
                .as_bytes(),
        );
    }
    // And nothing in what does not hold it.
    key.assert_not_in("another key", &[0u8; 200]);
}
