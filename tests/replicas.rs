//! Replicas of `meshca serve` on one PostgreSQL database (a real server from Debian's packages): they
//! start together on an empty database and become one CA with one token key, a token minted on one
//! replica is served by the others until it is revoked, which every replica then refuses, and one
//! replica's laggard holds a rotation back on the others.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::sds_proxy::{SdsProxy, PUSH_TIMEOUT};
use common::{wait_for, Env, Token};
use meshca_testpg::TestPostgres;
use tokio::task::block_in_place;

/// Writes `bytes` to `path`, readable by its owner only.
fn write_private(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).expect("the temp dir is writable");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}

/// What every replica of `pg` shares, in a directory of its own: the key-encryption key (`kek`) and the
/// database password (`db-password`, with the trailing newline an editor leaves).
fn shared_secrets(pg: &TestPostgres) -> tempfile::TempDir {
    let shared = tempfile::tempdir().expect("temp dir");
    write_private(&shared.path().join("kek"), &[7u8; 32]);
    write_private(
        &shared.path().join("db-password"),
        format!("{}\n", pg.password()).as_bytes(),
    );
    shared
}

/// A replica's environment: its own data directory and ports, the shared database, key and password.
fn replica(pg: &TestPostgres, shared: &Path, name: &str) -> Env {
    replica_with(pg, shared, name, "")
}

/// The same, with `extra` appended to its settings.
fn replica_with(pg: &TestPostgres, shared: &Path, name: &str, extra: &str) -> Env {
    let env = Env::with_settings(&format!(
        "keystore:\n  type: postgres\n  postgres:\n    url: {url}\n    passwordFile: {shared}/db-password\n    \
         keyEncryptionKeyFile: {shared}/kek\nreplica:\n  name: {name}\n{extra}",
        url = pg.url(),
        shared = shared.display(),
    ));
    env.write_resource("mesh.yaml", CA1);
    env
}

/// Mesh `default` on builtin ca-1.
const CA1: &str = "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\nmtls:\n  enabledBackend: ca-1\n  backends:\n    - name: ca-1\n      type: builtin\n";

/// The one-edit switch to builtin ca-2, ca-1 kept as a secondary backend.
const SWITCH: &str = "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\nmtls:\n  enabledBackend: ca-2\n  secondaryBackends: [ca-1]\n  backends:\n    - name: ca-1\n      type: builtin\n    - name: ca-2\n      type: builtin\n";

/// The issuer of the identity `token` is served by `env`'s daemon.
fn issuer(env: &Env, token: &Token) -> String {
    let chain = env.fetch_identity(token);
    env.inspect(&chain)[0]["issuer"]
        .as_str()
        .expect("inspect prints the issuer")
        .to_owned()
}

#[test]
fn replicas_starting_together_on_an_empty_database_are_one_ca_and_share_tokens_and_revocations() {
    let pg = TestPostgres::start();
    let shared = shared_secrets(&pg);
    let envs: Vec<Env> = ["meshca-a", "meshca-b", "meshca-c"]
        .iter()
        .map(|name| replica(&pg, shared.path(), name))
        .collect();
    // All three start at once on the empty database: each creates the schema, the CA and the token key
    // unless another was first.
    let daemons: Vec<_> = std::thread::scope(|scope| {
        let starting: Vec<_> = envs.iter().map(|env| scope.spawn(|| env.start())).collect();
        starting
            .into_iter()
            .map(|s| s.join().expect("a replica started"))
            .collect()
    });
    // Each replica heartbeats, and each sees the three.
    for daemon in &daemons {
        let names = daemon.wait_json("/api/replicas", "three live replicas", |v| {
            let replicas = v["replicas"].as_array()?;
            let live: Vec<&str> = replicas
                .iter()
                .filter(|r| r["live"] == true)
                .filter_map(|r| r["name"].as_str())
                .collect();
            (live.len() == 3).then(|| live.join(","))
        });
        assert_eq!(names, "meshca-a,meshca-b,meshca-c");
    }
    let count = |sql: &str| pg.psql("meshca", sql);
    assert_eq!(
        count("SELECT count(*) FROM meshca_entries WHERE name = 'daemon/token-signing-key.p8'"),
        "1"
    );
    assert_eq!(
        count("SELECT count(*) FROM meshca_entries WHERE name LIKE 'ca/default/%key.pem'"),
        "1",
        "one CA key for the mesh: {}",
        count("SELECT string_agg(name, ', ') FROM meshca_entries")
    );

    // A token minted against replica a is honoured by b and c, which serve certificates of the one CA.
    let token = envs[0].token("default", "web-1", &["--tag", "kuma.io/service=web"]);
    let issuers: Vec<String> = envs.iter().map(|env| issuer(env, &token)).collect();
    assert!(issuers.iter().all(|i| i == &issuers[0]), "{issuers:?}");

    // Revoked through replica c's settings: every replica refuses it once it has read the database.
    envs[2]
        .cli(&["token", "--config", envs[2].cfg(), "--revoke", &token.id])
        .ok();
    for env in &envs {
        let refused = wait_for("every replica to refuse the revoked token", || {
            let run = env.fetch(&token, &["default"]);
            (run.code() != Some(0)).then_some(run)
        });
        assert!(
            refused.stderr.contains("revoked"),
            "refused because it is revoked: {refused}"
        );
    }
    drop(daemons);
}

#[test]
fn a_replica_with_another_key_encryption_key_does_not_start_and_says_why() {
    let pg = TestPostgres::start();
    let shared = shared_secrets(&pg);
    let first = replica(&pg, shared.path(), "meshca-a");
    let daemon = first.start();
    drop(daemon);

    write_private(&shared.path().join("kek"), &[8u8; 32]);
    let second = replica(&pg, shared.path(), "meshca-b");
    let run = second.cli(&["serve", "--config", second.cfg()]);
    assert_ne!(run.code(), Some(0), "{run}");
    assert!(
        run.stderr.contains("keyEncryptionKeyFile"),
        "the error names the setting: {run}"
    );
}

#[test]
fn a_replica_that_loses_the_database_keeps_serving_says_so_and_recovers_when_it_returns() {
    let mut pg = TestPostgres::start();
    let shared = shared_secrets(&pg);
    let env = replica(&pg, shared.path(), "meshca-a");
    let daemon = env.start();
    let known = env.token("default", "web-1", &["--tag", "kuma.io/service=web"]);
    let before = issuer(&env, &known);
    let fresh = env.token("default", "web-2", &["--tag", "kuma.io/service=web"]);

    pg.stop();
    let body = wait_for("/ready to say the database does not answer", || {
        let r = daemon.admin_get("/ready");
        assert_eq!(r.status, 200, "every replica loses it together: stay ready");
        r.body
            .contains("the database does not answer")
            .then_some(r.body)
    });
    assert!(body.contains("waiting for it"), "{body}");
    let metrics = daemon.admin_get("/metrics").body;
    assert!(
        metrics.contains("meshca_database_up{replica=\"meshca-a\"} 0"),
        "{metrics}"
    );
    let admin = env.admin.to_string();
    let status = env.cli(&["status", "--admin", &admin]).ok();
    assert!(
        status.stdout.contains("database: DOES NOT ANSWER"),
        "{status}"
    );
    // Served from what the replica holds: a known proxy, and one it never saw, from the loaded CA.
    assert_eq!(issuer(&env, &known), before);
    assert_eq!(issuer(&env, &fresh), before);

    pg.start_again();
    wait_for("/ready to say plainly ready again", || {
        (daemon.admin_get("/ready").body == "ready\n").then_some(())
    });
    let metrics = daemon.admin_get("/metrics").body;
    assert!(
        metrics.contains("meshca_database_up{replica=\"meshca-a\"} 1"),
        "{metrics}"
    );
}

#[test]
fn a_replica_started_while_the_database_is_down_becomes_ready_when_it_answers() {
    let mut pg = TestPostgres::start();
    let shared = shared_secrets(&pg);
    let env = replica(&pg, shared.path(), "meshca-a");
    pg.stop();
    std::thread::scope(|scope| {
        let starting = scope.spawn(|| env.start());
        wait_for("the replica to say it waits for the database", || {
            let logs = std::fs::read_dir(env.root()).ok()?;
            logs.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("daemon-"))
                .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                .any(|log| log.contains("not ready: the database does not answer"))
                .then_some(())
        });
        assert!(
            common::http_get(env.admin, "/ready").is_err(),
            "nothing answers /ready before the CAs are loaded"
        );
        pg.start_again();
        let daemon = starting.join().expect("the replica became ready");
        let token = env.token("default", "web-1", &["--tag", "kuma.io/service=web"]);
        assert!(!issuer(&env, &token).is_empty());
        drop(daemon);
    });
}

/// Whether `chain` (DER, leaf first) was issued by the CA `ca` (DER).
fn issued_by(chain: &[Vec<u8>], ca: &[u8]) -> bool {
    let id = meshca_identity::SpiffeId::parse("spiffe://default/web").expect("valid");
    meshca_ca::verify_svid(chain, &[ca.to_vec()], &id, std::time::SystemTime::now()).is_ok()
}

/// A proxy on replica a ACKs the new trust; one on replica b does not. Replica a must not issue from
/// the new CA until b's proxy has ACKed it too, and its status names the replica it waits for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_laggard_on_one_replica_holds_the_new_ca_back_on_the_other() {
    let pg = TestPostgres::start();
    let shared = shared_secrets(&pg);
    let no_timeout = "rollout: {ackTimeout: 10m}\n";
    let env_a = replica_with(&pg, shared.path(), "meshca-a", no_timeout);
    let env_b = replica_with(&pg, shared.path(), "meshca-b", no_timeout);
    let daemon_a = block_in_place(|| env_a.start());
    let daemon_b = block_in_place(|| env_b.start());
    let tags = ["--tag", "kuma.io/service=web"];
    let mut on_a =
        SdsProxy::connect(&env_a, "default", "web-a", &tags, "spiffe://default/web").await;
    let mut on_b =
        SdsProxy::connect(&env_b, "default", "web-b", &tags, "spiffe://default/web").await;
    for p in [&mut on_a, &mut on_b] {
        p.next("the first push").await;
        p.ack().await;
    }
    let ca1 = on_a.last().bundle[0].clone();
    // Each replica's gate counts the other before the rotation starts.
    wait_gated_together([(&daemon_a, "meshca-b"), (&daemon_b, "meshca-a")]);
    let admin = env_a.admin.to_string();
    let status = env_a.cli(&["status", "--admin", &admin]).ok();
    assert!(
        status.stdout.contains("rollouts gated with: meshca-b"),
        "{status}"
    );

    env_a.write_resource("mesh.yaml", SWITCH);
    env_b.write_resource("mesh.yaml", SWITCH);
    let two = |r: &common::sds_proxy::Received| r.bundle.len() == 2;
    on_a.next_until("a bundle with two CAs", PUSH_TIMEOUT, two)
        .await;
    on_b.next_until("a bundle with two CAs", PUSH_TIMEOUT, two)
        .await;
    let ca2 = on_a
        .last()
        .bundle
        .iter()
        .find(|c| c.as_slice() != ca1)
        .expect("ca-2 beside ca-1")
        .clone();
    on_a.ack().await;

    // a's own streams have all ACKed; b's laggard holds the new CA back.
    let wait = block_in_place(|| {
        daemon_a.wait_json("/api/status", "a wait for replica meshca-b", |v| {
            v["rollout"]
                .as_array()?
                .iter()
                .find(|w| {
                    w["step"] == "trust-before-identity"
                        && w["waiting_for"] == serde_json::json!(["replica meshca-b"])
                })
                .cloned()
        })
    });
    assert_eq!(wait["waiting_count"], 1, "{wait}");
    let b_view = pg.psql(
        "meshca",
        "SELECT gate->'trust_acked'->'default' FROM meshca_replicas WHERE name = 'meshca-b'",
    );
    assert!(
        !b_view.contains(&fingerprint(&ca2)),
        "b's state does not list ca-2 as ACKed: {b_view}"
    );
    on_a.drain();
    assert!(
        on_a.received.iter().all(|r| issued_by(&r.chain, &ca1)),
        "a certificate from ca-2 reached web-a before web-b ACKed ca-2"
    );
    let dp = block_in_place(|| daemon_a.admin_json("/api/dataplanes/default/web-a"));
    assert_eq!(dp["issuer"], "backend ca-1", "{dp}");

    on_b.ack().await;
    for p in [&mut on_a, &mut on_b] {
        let got = p
            .next_until("a certificate from ca-2", PUSH_TIMEOUT, |r| {
                issued_by(&r.chain, &ca2)
            })
            .await;
        assert!(got.trusts(&ca1) && got.trusts(&ca2), "{}", p.name);
    }
    drop((daemon_a, daemon_b));
}

/// Lowercase hex SHA-256 of a DER certificate: a CA's id.
fn fingerprint(der: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, der)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `meshca drill failover` on the test server: the password from the environment, as an operator
/// gives it.
fn failover_drill(pg: &TestPostgres, gate: &str) -> common::Run {
    replicated_drill(pg, &["failover", "--gate", gate])
}

/// `meshca drill <scenario...>` over replicas on the test server.
fn replicated_drill(pg: &TestPostgres, scenario: &[&str]) -> common::Run {
    let env = Env::new();
    let url = pg.url();
    let mut args = vec!["drill"];
    args.extend(scenario);
    args.extend([
        "--postgres",
        &url,
        "--proxies",
        "12",
        "--handshakes",
        "1500",
        "--seed",
        "3",
        "--output",
        "json",
    ]);
    let mut command = env.command(&args);
    command.env("MESHCA_KEYSTORE_POSTGRES_PASSWORD", pg.password());
    env.cli_with(command, &args)
}

fn meshca_tables(pg: &TestPostgres) -> String {
    pg.psql(
        "meshca",
        "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'meshca%'",
    )
}

#[test]
fn the_failover_drill_breaks_nothing_with_the_gate_and_breaks_handshakes_without() {
    let pg = TestPostgres::start();
    let run = failover_drill(&pg, "on");
    let report = run.json();
    assert_eq!(run.code(), Some(0), "{run}");
    assert_eq!(report["ok"], true, "{run}");
    assert_eq!(report["failover"]["replicas"], 3, "{run}");
    assert_eq!(report["failover"]["killed"], "drill-c", "{run}");
    assert!(
        report["failover"]["moved_streams"].as_u64().unwrap_or(0) >= 4,
        "the killed replica's four proxies moved: {run}"
    );
    let phases: Vec<&str> = report["phases"]
        .as_array()
        .expect("phases")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(phases, ["steady", "failover", "converged"]);
    assert!(report["phases"]
        .as_array()
        .expect("phases")
        .iter()
        .all(|p| p["failed"] == 0));
    assert_eq!(
        meshca_tables(&pg),
        "0",
        "the drill leaves the database empty"
    );

    let run = failover_drill(&pg, "off");
    let report = run.json();
    assert_eq!(run.code(), Some(1), "{run}");
    assert!(
        report["phases"][1]["failed"].as_u64().unwrap_or(0) > 0,
        "without the gate the rotation breaks handshakes: {run}"
    );
    assert_eq!(meshca_tables(&pg), "0");
}

#[test]
fn the_workload_drill_behind_agents_over_replicas_breaks_nothing_when_the_agents_replica_is_killed()
{
    let pg = TestPostgres::start();
    let run = replicated_drill(&pg, &["workload", "--agent"]);
    let report = run.json();
    assert_eq!(run.code(), Some(0), "{run}");
    assert_eq!(report["ok"], true, "{run}");
    assert_eq!(report["scenario"], "workload", "{run}");
    assert_eq!(report["agents"], 2, "{run}");
    assert_eq!(report["failover"]["killed"], "drill-c", "{run}");
    // The first agent started on the killed replica: it moved; the other stayed where it was.
    assert_eq!(report["failover"]["moved_streams"], 1, "{run}");
    assert!(report["phases"]
        .as_array()
        .expect("phases")
        .iter()
        .all(|p| p["failed"] == 0 && p["handshakes"].as_u64().unwrap_or(0) > 0));
    assert!(
        run.stderr.contains("trying the next server"),
        "the agent says it moved: {run}"
    );
    assert_eq!(
        meshca_tables(&pg),
        "0",
        "the drill leaves the database empty"
    );
}

#[test]
fn the_failover_drill_refuses_a_database_that_is_not_empty_and_leaves_it_alone() {
    let pg = TestPostgres::start();
    pg.psql("meshca", "CREATE TABLE meshca_entries (name text)");
    let run = failover_drill(&pg, "on");
    assert_ne!(run.code(), Some(0), "{run}");
    assert!(
        run.stderr.contains("meshca_entries") && run.stderr.contains("empty"),
        "{run}"
    );
    assert_eq!(meshca_tables(&pg), "1", "its table is still there");

    let env = Env::new();
    let run = env.cli(&["drill", "ca-rotation", "--postgres", &pg.url()]);
    assert_eq!(run.code(), Some(2), "{run}");
    let run = env.cli(&["drill", "failover"]);
    assert_eq!(run.code(), Some(2), "{run}");
    assert!(run.stderr.contains("--postgres"), "{run}");
}

/// Waits until each replica's gate counts the other.
fn wait_gated_together(daemons: [(&common::Daemon, &str); 2]) {
    for (daemon, other) in daemons {
        block_in_place(|| {
            daemon.wait_json(
                "/api/replicas",
                "the gate to count the other replica",
                |v| {
                    let want =
                        serde_json::json!([{"name": other, "readable": true, "gone": false}]);
                    (v["rollout_peers"] == want).then_some(())
                },
            )
        });
    }
}

/// web-1 moves from replica a to replica b while a rotation waits for a laggard on b: b cannot issue
/// it a certificate from the new CA yet, so it serves the one a issued (from the database), with the
/// current trust, at once; its ACK then counts for the rotation like any of b's streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_proxy_that_moves_to_another_replica_mid_rotation_is_served_the_identity_it_holds() {
    let pg = TestPostgres::start();
    let shared = shared_secrets(&pg);
    let no_timeout = "rollout: {ackTimeout: 10m}\n";
    let env_a = replica_with(&pg, shared.path(), "meshca-a", no_timeout);
    let env_b = replica_with(&pg, shared.path(), "meshca-b", no_timeout);
    let daemon_a = block_in_place(|| env_a.start());
    let daemon_b = block_in_place(|| env_b.start());
    wait_gated_together([(&daemon_a, "meshca-b"), (&daemon_b, "meshca-a")]);
    let tags = ["--tag", "kuma.io/service=web"];
    let id = "spiffe://default/web";
    let mut web = SdsProxy::connect(&env_a, "default", "web-1", &tags, id).await;
    let mut laggard = SdsProxy::connect(&env_b, "default", "web-b", &tags, id).await;
    for p in [&mut web, &mut laggard] {
        p.next("the first push").await;
        p.ack().await;
    }
    let held = web.last().chain.clone();

    env_a.write_resource("mesh.yaml", SWITCH);
    env_b.write_resource("mesh.yaml", SWITCH);
    let two = |r: &common::sds_proxy::Received| r.bundle.len() == 2;
    web.next_until("a bundle with two CAs", PUSH_TIMEOUT, two)
        .await;
    laggard
        .next_until("a bundle with two CAs", PUSH_TIMEOUT, two)
        .await;
    web.ack().await;
    assert_eq!(web.last().chain, held, "the laggard holds the new CA back");

    web.disconnect();
    let mut moved = SdsProxy::connect(&env_b, "default", "web-1", &tags, id).await;
    let first = moved.next("web-1's first push from b").await.clone();
    assert_eq!(first.chain, held, "b serves the identity web-1 holds");
    assert_eq!(first.bundle.len(), 2, "with the current trust");
    let wait = block_in_place(|| {
        daemon_b.wait_json("/api/status", "b's trust wait to name web-1", |v| {
            v["rollout"]
                .as_array()?
                .iter()
                .find(|w| {
                    w["step"] == "trust-before-identity"
                        && w["waiting_for"] == serde_json::json!(["default.web-1", "default.web-b"])
                })
                .cloned()
        })
    });
    assert_eq!(wait["waiting_count"], 2, "{wait}");

    moved.ack().await;
    laggard.ack().await;
    let ca1 = first
        .bundle
        .iter()
        .find(|ca| issued_by(&held, ca))
        .expect("web-1's CA is in the bundle")
        .clone();
    for p in [&mut moved, &mut laggard] {
        let got = p
            .next_until("a certificate from the new CA", PUSH_TIMEOUT, |r| {
                !issued_by(&r.chain, &ca1)
            })
            .await;
        assert!(got.trusts(&ca1), "{}: ca-1 is still trusted", p.name);
    }
    drop((daemon_a, daemon_b));
}

/// A database that only reads (a standby, or `default_transaction_read_only`) still lets
/// `meshca token` mint with the key it holds: nothing is written to check the schema.
#[test]
fn tokens_are_minted_while_the_database_only_reads() {
    let pg = TestPostgres::start();
    let shared = shared_secrets(&pg);
    let env = replica(&pg, shared.path(), "meshca-a");
    let first = env.token("default", "web-1", &[]);
    pg.psql(
        "postgres",
        "ALTER DATABASE meshca SET default_transaction_read_only = on;",
    );
    let second = env.token("default", "web-2", &[]);
    assert_ne!(first.id, second.id);
    let refused = env.cli(&["token", "--config", env.cfg(), "--revoke", &first.id]);
    assert_ne!(
        refused.code(),
        Some(0),
        "a revocation needs a write, and says it failed: {refused}"
    );
    assert!(refused.stderr.contains("read-only"), "{refused}");
}

/// An update that needs the database (a new CA) is rejected while the database does not answer, and
/// applied without another edit once it answers again.
#[test]
fn an_update_rejected_while_the_database_was_down_applies_when_it_answers() {
    let mut pg = TestPostgres::start();
    let shared = shared_secrets(&pg);
    let env = replica(&pg, shared.path(), "meshca-a");
    let daemon = env.start_with(|daemon| {
        daemon
            .env("MESHCA_REPLICA_LEASE_TIMEOUT", "3s")
            .env("MESHCA_KEYSTORE_POSTGRES_TIMEOUT", "2s");
    });
    pg.stop();
    wait_for("the replica to see the database gone", || {
        daemon
            .admin_get("/ready")
            .body
            .contains("the database does not answer")
            .then_some(())
    });
    env.write_resource("mesh.yaml", SWITCH);
    let rejected = wait_for("the update to be rejected", || {
        let rejected = daemon.admin_json("/api/rejected-update");
        (!rejected.is_null()).then_some(rejected)
    });
    assert!(rejected.to_string().contains("ca-2"), "{rejected}");

    pg.start_again();
    wait_for("the update to apply once the database answers", || {
        daemon
            .admin_json("/api/rejected-update")
            .is_null()
            .then_some(())
    });
    let mesh = daemon.admin_json("/api/meshes/default");
    assert!(mesh.to_string().contains("ca-2"), "{mesh}");
    assert!(
        daemon.log().contains("re-reading the resource files"),
        "{}",
        daemon.log()
    );
}

/// A self-signed CA certificate, PEM: what someone who can write the database would slip in.
fn attackers_ca() -> String {
    let key = rcgen::KeyPair::generate().expect("a key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "attacker");
    params.self_signed(&key).expect("self-signed").pem()
}

/// No row the database can edit changes what meshca trusts: a mesh CA's certificate row with another CA
/// appended, or the SDS CA's certificate row replaced, stops a replica's start with an error naming the
/// entry, instead of putting that CA in every proxy's bundle or in `sds-ca.pem`. The row restored, the
/// replica starts.
#[test]
fn a_replica_refuses_ca_rows_edited_in_the_database_and_says_which() {
    let pg = TestPostgres::start();
    let shared = shared_secrets(&pg);
    let first = replica(&pg, shared.path(), "meshca-a");
    drop(first.start());
    let ca_cert = pg.psql(
        "meshca",
        "SELECT name FROM meshca_entries WHERE name LIKE 'ca/default/%ca-1/cert.pem'",
    );
    assert!(
        !ca_cert.is_empty(),
        "the CA's certificate is in the database"
    );
    let attacker = attackers_ca();
    let attacker_hex: String = attacker.bytes().map(|b| format!("{b:02x}")).collect();
    let second = replica(&pg, shared.path(), "meshca-b");
    for (entry, edit) in [
        (
            ca_cert.as_str(),
            format!("UPDATE meshca_entries SET data = data || '\\x{attacker_hex}' WHERE name = '{ca_cert}'"),
        ),
        (
            "daemon/sds-ca/cert.pem",
            format!("UPDATE meshca_entries SET data = '\\x{attacker_hex}' WHERE name = 'daemon/sds-ca/cert.pem'"),
        ),
    ] {
        let saved = pg.psql(
            "meshca",
            &format!("SELECT encode(data, 'hex') FROM meshca_entries WHERE name = '{entry}'"),
        );
        pg.psql("meshca", &edit);
        let run = second.cli(&["serve", "--config", second.cfg()]);
        assert_ne!(run.code(), Some(0), "{run}");
        assert!(
            run.stderr.contains(entry) && run.stderr.contains("refused"),
            "the error names the refused entry: {run}"
        );
        let sds_ca = std::fs::read_to_string(second.data.join("sds-ca.pem")).unwrap_or_default();
        assert!(!sds_ca.contains(&attacker), "the attacker's CA was not written out");
        pg.psql(
            "meshca",
            &format!("UPDATE meshca_entries SET data = '\\x{saved}' WHERE name = '{entry}'"),
        );
    }
    drop(second.start());
}
