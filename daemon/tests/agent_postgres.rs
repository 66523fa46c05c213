//! Replicas of a daemon on one PostgreSQL database (a real server, from Debian's packages) with a
//! `meshca agent` that lists them: the database holds the workload's certificate and nothing of its
//! key, the agent moves from a stopped replica to the other, which serves its workload on, and a
//! token revoked through the database ends the agent's stream there.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{
    admin_text, connected_agents, dataplane, leaf_der, leaf_issuer, my_uid, next, on_postgres,
    settings, start, workloads, write_private, write_resources, x509_stream, TestAgent, Traces,
    WorkloadKey, TIMEOUT,
};
use meshca_agent::ServerAddr;
use meshca_config::Settings;
use meshca_testpg::TestPostgres;

/// Replica `name`'s settings in `root`: on `pg`'s database, with the key-encryption key (`kek`) and
/// the database password (`db-password`) every replica shares in `shared`.
fn replica_settings(root: &Path, pg: &TestPostgres, shared: &Path, name: &str) -> Settings {
    on_postgres(settings(root), pg, shared, name)
}

/// How often the database is read while a replica records a certificate.
const RECORD_POLL: Duration = Duration::from_millis(50);

/// The dump of `pg`'s database once it records `leaf` as batch-1's certificate. A replica records
/// what it issued in a task of its own, with nothing a test can await: the row is read until it
/// holds the certificate (or `TIMEOUT` passed).
async fn dump_once_recorded(pg: &TestPostgres, leaf: &Traces) -> Vec<u8> {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let chain = tokio::task::block_in_place(|| {
            pg.psql(
                "meshca",
                "SELECT chain FROM meshca_proxies WHERE mesh = 'default' AND name = 'batch-1'",
            )
        });
        if leaf.found_in(chain.as_bytes()).is_some() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the database did not record batch-1's certificate within {TIMEOUT:?}; it holds {chain:?}"
        );
        tokio::time::sleep(RECORD_POLL).await;
    }
    let dump = tokio::task::block_in_place(|| pg.dump("meshca"));
    // What the scans below look for in the dump is what they would find of a key stored beside it.
    assert!(
        leaf.found_in(&dump).is_some(),
        "the dump holds the workload's certificate"
    );
    dump
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_postgres_store_no_workload_key_serve_on_when_one_stops_and_refuse_a_revoked_agent(
) {
    let pg = tokio::task::block_in_place(TestPostgres::start);
    let shared = tempfile::tempdir().expect("a temp dir");
    write_private(&shared.path().join("kek"), &[7u8; 32]);
    write_private(
        &shared.path().join("db-password"),
        format!("{}\n", pg.password()).as_bytes(),
    );
    let uid = my_uid();
    let (root_a, root_b, agent_root) = (
        tempfile::tempdir().expect("a temp dir"),
        tempfile::tempdir().expect("a temp dir"),
        tempfile::tempdir().expect("a temp dir"),
    );
    write_resources(root_a.path(), &workloads(&uid));
    write_resources(root_b.path(), &workloads(&uid));
    let replica_a = start(
        replica_settings(root_a.path(), &pg, shared.path(), "replica-a"),
        false,
    )
    .await;
    let replica_b = start(
        replica_settings(root_b.path(), &pg, shared.path(), "replica-b"),
        false,
    )
    .await;
    // The agent lists both replicas and connects to the first.
    let agent = TestAgent::start(
        agent_root.path(),
        "host-a",
        vec![
            ServerAddr::Unix(root_a.path().join("sds.sock")),
            ServerAddr::Unix(root_b.path().join("sds.sock")),
        ],
        &replica_a,
        Duration::from_millis(200),
    )
    .await;
    let mut svids = x509_stream(&agent.socket).await;
    let first = next(&mut svids).await;
    assert_eq!(first.svids[0].spiffe_id, "spiffe://default/batch");
    let issuer = leaf_issuer(&first);
    assert_eq!(connected_agents(&replica_a).await, ["host-a"]);
    // The console's overview shows where the state is: the database answers, and this replica.
    let overview = admin_text(replica_a.admin_addr, "/console/overview").await;
    assert!(
        overview.contains("PostgreSQL database: <b>answers</b>")
            && overview.contains("this replica is <b>replica-a</b>"),
        "{overview}"
    );

    // Replica a recorded the workload's certificate in the database, for the other replicas, and
    // nothing of its key: not in the database, not in either replica's data directory.
    let first_leaf = Traces::of("the certificate replica a issued", &leaf_der(&first));
    let first_key = WorkloadKey::of(&first.svids[0].x509_svid_key);
    let dump = dump_once_recorded(&pg, &first_leaf).await;
    first_key.assert_not_in("the database dump", &dump);
    first_key.assert_not_under(&root_a.path().join("data"));
    first_key.assert_not_under(&root_b.path().join("data"));

    // Replica a stops. The agent moves to replica b, which holds no key for the certificate a
    // issued (it may serve it, adopted from the database, until it issues its own) and issues the
    // workload a certificate of its own over a key of the agent's, from the CA the replicas share.
    replica_a.stop().await;
    let moved = loop {
        let message = next(&mut svids).await;
        assert_eq!(message.svids.len(), 1, "the workload keeps an identity");
        if leaf_der(&message) != first_leaf.raw {
            break message;
        }
    };
    assert_eq!(moved.svids[0].spiffe_id, "spiffe://default/batch");
    assert_eq!(leaf_issuer(&moved), issuer, "the CA the replicas share");
    assert_eq!(connected_agents(&replica_b).await, ["host-a"]);
    let on_b = dataplane(&replica_b, "batch-1").await;
    assert!(
        on_b.connected && on_b.reason.is_none(),
        "replica b serves batch-1: {on_b:?}"
    );

    // What replica b recorded holds no key either: neither the agent's new one nor the old one.
    let second_leaf = Traces::of("the certificate replica b issued", &leaf_der(&moved));
    let second_key = WorkloadKey::of(&moved.svids[0].x509_svid_key);
    let dump = dump_once_recorded(&pg, &second_leaf).await;
    for key in [&first_key, &second_key] {
        key.assert_not_in("the database dump", &dump);
        key.assert_not_under(&root_a.path().join("data"));
        key.assert_not_under(&root_b.path().join("data"));
    }

    // The operator revokes the agent's token with replica a's settings, as `meshca token --revoke`
    // does: into the database, which replica b reads. Replica b ends the agent's stream; the agent
    // keeps serving what it holds.
    let settings_a = replica_settings(root_a.path(), &pg, shared.path(), "replica-a");
    let id = agent.claims.id.clone();
    let added = tokio::task::spawn_blocking(move || {
        let (_, store) = meshca_daemon::open_store(&settings_a).expect("the store opens");
        store
            .revocations()
            .expect("the database keeps the revoked tokens")
            .revoke(&id, "revoked by the test")
            .expect("revokes")
    })
    .await
    .expect("the revocation ran");
    assert!(added, "the token was not revoked before");
    let mut agent_status = agent.agent.status().subscribe();
    let refused = tokio::time::timeout(
        TIMEOUT,
        agent_status.wait_for(|s| {
            s.server.connected.is_none()
                && s.server
                    .last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("revoked") && e.contains(&agent.claims.id))
        }),
    )
    .await
    .expect("replica b refuses the agent in time")
    .expect("the agent runs")
    .clone();
    assert!(refused.serving, "the agent still serves what it holds");
    let mut again = x509_stream(&agent.socket).await;
    let held = next(&mut again).await;
    assert_eq!(
        leaf_der(&held),
        second_leaf.raw,
        "the workload keeps its SVID"
    );

    agent.stop().await;
    replica_b.stop().await;
    tokio::task::block_in_place(move || drop(pg));
}
