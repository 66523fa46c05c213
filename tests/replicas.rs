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
    let shared = tempfile::tempdir().expect("temp dir");
    write_private(&shared.path().join("kek"), &[7u8; 32]);
    write_private(
        &shared.path().join("db-password"),
        format!("{}\n", pg.password()).as_bytes(),
    );
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
    let shared = tempfile::tempdir().expect("temp dir");
    write_private(&shared.path().join("kek"), &[7u8; 32]);
    write_private(&shared.path().join("db-password"), pg.password().as_bytes());
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
