//! Replicas of `meshca serve` on one PostgreSQL database (a real server from Debian's packages): they
//! start together on an empty database and become one CA with one token key, and a token minted on one
//! replica is served by the others until it is revoked, which every replica then refuses.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{wait_for, Env, Token};
use meshca_testpg::TestPostgres;

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
    let env = Env::with_settings(&format!(
        "keystore:\n  type: postgres\n  postgres:\n    url: {url}\n    passwordFile: {shared}/db-password\n    \
         keyEncryptionKeyFile: {shared}/kek\nreplica:\n  name: {name}\n",
        url = pg.url(),
        shared = shared.display(),
    ));
    env.write_resource("mesh.yaml", "type: Mesh\nname: default\nmtls:\n  enabledBackend: ca-1\n  backends:\n    - name: ca-1\n      type: builtin\n");
    env
}

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
