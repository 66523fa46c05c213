//! The PostgreSQL keystore against a real server from Debian's packages, started for each test.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use meshca_db::{Database, DbError, DbOptions, KeyEncryptionKey, PostgresKeystore, SCHEMA_VERSION};
use meshca_keystore::{Creation, Keystore, KeystoreError, NewEntry};
use meshca_testpg::TestPostgres;
use zeroize::Zeroizing;

fn options(pg: &TestPostgres) -> DbOptions {
    DbOptions {
        url: pg.url(),
        password: Some(Zeroizing::new(pg.password().to_owned())),
        ca_file: None,
        timeout: Duration::from_secs(5),
        max_connections: 4,
    }
}

fn keystore(pg: &TestPostgres, key: u8) -> Result<PostgresKeystore, DbError> {
    let db = Arc::new(Database::connect(&options(pg))?);
    PostgresKeystore::open(db, KeyEncryptionKey::from_bytes(&[key; 32]))
}

const KEY_PEM: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgSECRETSECRETSECRET\n-----END PRIVATE KEY-----\n";

#[test]
fn replicas_racing_to_create_a_ca_create_it_once_and_all_read_the_winners() {
    let pg = TestPostgres::start();
    let replicas = 3;
    let barrier = Arc::new(Barrier::new(replicas));
    let outcomes: Vec<(Creation, Vec<u8>, Vec<u8>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..replicas)
            .map(|i| {
                let barrier = barrier.clone();
                let pg = &pg;
                scope.spawn(move || {
                    // Each replica connects (and checks the schema) at the same time, then creates.
                    barrier.wait();
                    let store = keystore(pg, 1).expect("opens");
                    let key = format!("key of replica {i}");
                    let cert = format!("cert of replica {i}");
                    let created = store
                        .create_if_absent(&[
                            NewEntry::secret("ca/default/ca-1/key.pem", key.as_bytes()),
                            NewEntry::public("ca/default/ca-1/cert.pem", cert.as_bytes()),
                        ])
                        .expect("creates or finds");
                    let key = store
                        .get_secret("ca/default/ca-1/key.pem")
                        .expect("reads")
                        .expect("present");
                    let cert = store
                        .get_public("ca/default/ca-1/cert.pem")
                        .expect("reads")
                        .expect("present");
                    (created, key.expose().to_vec(), cert)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect()
    });
    let created = outcomes
        .iter()
        .filter(|(c, _, _)| *c == Creation::Created)
        .count();
    assert_eq!(created, 1, "exactly one replica creates the CA");
    let (_, key, cert) = &outcomes[0];
    assert!(outcomes.iter().all(|(_, k, c)| k == key && c == cert));
    let winner = String::from_utf8(key.clone()).expect("text");
    assert_eq!(
        String::from_utf8(cert.clone()).expect("text"),
        winner.replace("key", "cert"),
        "the key and certificate come from the same replica"
    );
    assert_eq!(
        pg.psql("meshca", "SELECT version FROM meshca_schema"),
        SCHEMA_VERSION.to_string(),
        "the schema was migrated once, to the current version"
    );
}

#[test]
fn a_dump_of_the_database_holds_no_private_key_in_clear() {
    let pg = TestPostgres::start();
    let store = keystore(&pg, 1).expect("opens");
    store
        .put_secret("ca/default/ca-1/key.pem", KEY_PEM.as_bytes())
        .expect("writes");
    store
        .put_public("ca/default/ca-1/cert.pem", b"PUBLIC CERTIFICATE DATA")
        .expect("writes");
    store
        .put_secret("daemon/token-signing-key", b"TOKENSIGNINGKEYBYTES")
        .expect("writes");
    let records = proxy_records(&pg, 1);
    runtime()
        .block_on(records.put(&[proxy("web-1", "PROXYKEYSECRETBYTES")]))
        .expect("writes a proxy's identity");
    let dump = pg.dump("meshca");
    let contains = |needle: &[u8]| dump.windows(needle.len()).any(|w| w == needle);
    // bytea is dumped as hex: look for the hex of each value too.
    let hex = |text: &[u8]| hex::encode(text).into_bytes();
    assert!(contains(b"meshca_entries"), "the dump has the table");
    assert!(
        contains(&hex(b"PUBLIC CERTIFICATE DATA")),
        "public data is stored as written"
    );
    for secret in [
        &b"SECRETSECRETSECRET"[..],
        b"PRIVATE KEY",
        b"TOKENSIGNINGKEYBYTES",
        b"PROXYKEYSECRETBYTES",
    ] {
        assert!(
            !contains(secret) && !contains(&hex(secret)),
            "{:?} is in the dump",
            String::from_utf8_lossy(secret)
        );
    }
    let secret = store
        .get_secret("ca/default/ca-1/key.pem")
        .expect("reads")
        .expect("present");
    assert_eq!(secret.expose(), KEY_PEM.as_bytes());
}

#[test]
fn a_replica_with_another_key_encryption_key_is_refused() {
    let pg = TestPostgres::start();
    keystore(&pg, 1).expect("the first key is the database's");
    let err = keystore(&pg, 2).expect_err("another key");
    assert!(matches!(err, DbError::WrongKey), "{err}");
    assert!(err.to_string().contains("keyEncryptionKeyFile"), "{err}");
    keystore(&pg, 1).expect("the first key still opens it");
}

#[test]
fn entries_behave_as_in_the_file_keystore() {
    let pg = TestPostgres::start();
    let store = keystore(&pg, 1).expect("opens");
    assert_eq!(store.get_public("a/b").expect("reads"), None);
    assert!(store.get_secret("a/b").expect("reads").is_none());
    store.put_public("b/2", b"two").expect("writes");
    store.put_public("b/10", b"ten").expect("writes");
    store.put_public("a/1", b"one").expect("writes");
    store.put_secret("b/key", b"k").expect("writes");
    assert_eq!(store.list("b/").expect("lists"), ["b/10", "b/2", "b/key"]);
    assert_eq!(store.list("").expect("lists").len(), 4);
    store.put_public("b/2", b"deux").expect("replaces");
    assert_eq!(
        store.get_public("b/2").expect("reads").as_deref(),
        Some(&b"deux"[..])
    );
    assert!(matches!(
        store.get_secret("b/2"),
        Err(KeystoreError::WrongKind { .. })
    ));
    assert!(matches!(
        store.get_public("b/key"),
        Err(KeystoreError::WrongKind { .. })
    ));
    store.delete("b/2").expect("deletes");
    store
        .delete("b/2")
        .expect("deleting an absent entry succeeds");
    assert_eq!(store.get_public("b/2").expect("reads"), None);
    assert!(matches!(
        store.put_public("../escape", b"x"),
        Err(KeystoreError::InvalidName { .. })
    ));
    // A group of which one entry exists is refused whole, naming both.
    let err = store
        .create_if_absent(&[
            NewEntry::public("a/1", b"x"),
            NewEntry::secret("a/new", b"y"),
        ])
        .expect_err("partly present");
    match err {
        KeystoreError::PartlyPresent { present, missing } => {
            assert_eq!(present, ["a/1"]);
            assert_eq!(missing, ["a/new"]);
        }
        other => panic!("{other}"),
    }
    assert_eq!(
        store.get_public("a/new").ok().flatten(),
        None,
        "nothing was written"
    );
}

#[test]
fn a_sealed_value_moved_to_another_entry_is_refused() {
    let pg = TestPostgres::start();
    let store = keystore(&pg, 1).expect("opens");
    store
        .put_secret("ca/m/one/key.pem", b"first")
        .expect("writes");
    store
        .put_secret("ca/m/two/key.pem", b"second")
        .expect("writes");
    pg.psql(
        "meshca",
        "UPDATE meshca_entries SET data = (SELECT data FROM meshca_entries WHERE name = 'ca/m/one/key.pem') \
         WHERE name = 'ca/m/two/key.pem'",
    );
    let err = store.get_secret("ca/m/two/key.pem").expect_err("moved");
    assert!(matches!(err, KeystoreError::Refused { .. }), "{err}");
    assert!(err.to_string().contains("ca/m/two/key.pem"), "{err}");
}

#[test]
fn a_schema_newer_than_this_build_is_refused_and_left_alone() {
    let pg = TestPostgres::start();
    Database::connect(&options(&pg)).expect("creates the schema");
    pg.psql("meshca", "UPDATE meshca_schema SET version = 999");
    let err = Database::connect(&options(&pg)).expect_err("too new");
    assert!(
        matches!(err, DbError::SchemaTooNew { found: 999, .. }),
        "{err}"
    );
    assert_eq!(
        pg.psql("meshca", "SELECT version FROM meshca_schema"),
        "999"
    );
}

#[test]
fn a_password_in_the_url_is_refused() {
    let pg = TestPostgres::start();
    let mut options = options(&pg);
    options.url = options.url.replace("meshca@", "meshca:hunter2@");
    let err = Database::connect(&options).expect_err("password in the URL");
    assert!(err.to_string().contains("passwordFile"), "{err}");
    assert!(!err.to_string().contains("hunter2"), "{err}");
}

#[test]
fn while_the_database_is_down_operations_fail_clearly_and_work_again_when_it_returns() {
    let mut pg = TestPostgres::start();
    let store = keystore(&pg, 1).expect("opens");
    store.put_public("a/1", b"one").expect("writes");
    pg.stop();
    let err = store.get_public("a/1").expect_err("the database is down");
    assert!(err.to_string().starts_with("database: cannot"), "{err}");
    pg.start_again();
    assert_eq!(
        store.get_public("a/1").expect("reads again").as_deref(),
        Some(&b"one"[..])
    );
}

#[test]
fn tls_to_the_server_is_verified_against_the_given_ca() {
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).expect("CA");
    let server_key = rcgen::KeyPair::generate().expect("key");
    let server_params =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).expect("params");
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let server = server_params
        .signed_by(&server_key, &issuer)
        .expect("server certificate");
    let pg = TestPostgres::start_with_tls(&server.pem(), &server_key.serialize_pem());
    let dir = tempfile::tempdir().expect("temp dir");
    let ca_file = dir.path().join("db-ca.pem");
    std::fs::write(&ca_file, ca.pem()).expect("write");

    let mut verified = options(&pg);
    verified.url = format!("{}?sslmode=require", pg.url());
    verified.ca_file = Some(ca_file);
    let db = Database::connect(&verified).expect("TLS against the given CA");
    drop(db);

    let mut unverified = options(&pg);
    unverified.url = format!("{}?sslmode=require", pg.url());
    let err = Database::connect(&unverified).expect_err("the system's roots do not know this CA");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );
}

/// Rollout state: each write bumps the version; a reader that knows a version gets no state back
/// for it; a replica that never wrote one reads as missing; a replica past its lease is not listed.
#[test]
fn rollout_state_is_read_by_version_and_only_from_live_replicas() {
    use meshca_db::{PeerGate, Replicas, MAX_GATE_VIEW};
    let pg = TestPostgres::start();
    let db = Arc::new(Database::connect(&options(&pg)).expect("connects"));
    keystore(&pg, 1).expect("migrates the schema");
    let replicas = Replicas::new(db.clone());
    let lease = Duration::from_secs(15);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        replicas.heartbeat("a", 0.0, 0, 0).await.expect("a");
        replicas.heartbeat("b", 0.0, 0, 0).await.expect("b");
        replicas.heartbeat("c", 0.0, 0, 0).await.expect("c");
        replicas
            .publish_gate("b", r#"{"trust_acked":{}}"#.into())
            .await
            .expect("b writes");
        let read = replicas.peer_gates("a", lease, &[]).await.expect("reads");
        assert_eq!(
            read,
            [
                PeerGate {
                    name: "b".into(),
                    version: 1,
                    state: Some(Some(r#"{"trust_acked": {}}"#.into())),
                },
                PeerGate {
                    name: "c".into(),
                    version: 0,
                    state: None,
                },
            ]
        );
        let known = [("b".to_owned(), 1), ("c".to_owned(), 0)];
        let again = replicas
            .peer_gates("a", lease, &known)
            .await
            .expect("reads");
        assert_eq!(again[0].state, Some(None), "b's version 1 is known");
        replicas
            .publish_gate("b", r#"{"trust_acked":{"default":[]}}"#.into())
            .await
            .expect("b writes again");
        let changed = replicas
            .peer_gates("a", lease, &known)
            .await
            .expect("reads");
        assert_eq!(changed[0].version, 2);
        assert!(matches!(&changed[0].state, Some(Some(json)) if json.contains("default")));

        let too_large = "x".repeat(MAX_GATE_VIEW + 1);
        let refused = replicas.publish_gate("b", too_large).await;
        assert!(matches!(refused, Err(DbError::Invalid(_))), "{refused:?}");
    });
    pg.psql(
        "meshca",
        "UPDATE meshca_replicas SET heartbeat_at = now() - interval '1 minute' WHERE name = 'c'",
    );
    let read = runtime
        .block_on(replicas.peer_gates("a", lease, &[]))
        .expect("reads");
    let names: Vec<&str> = read.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["b"], "c's lease has expired");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

fn proxy_records(pg: &TestPostgres, key: u8) -> meshca_db::ProxyRecords {
    let db = Arc::new(Database::connect(&options(pg)).expect("connects"));
    meshca_db::ProxyRecords::new(db, KeyEncryptionKey::from_bytes(&[key; 32]))
}

fn proxy(name: &str, key: &str) -> meshca_db::ProxyRecord {
    meshca_db::ProxyRecord {
        mesh: "default".into(),
        name: name.into(),
        replica: "meshca-a".into(),
        ca_id: "ab".repeat(32),
        issuer: "backend ca-1".into(),
        chain_pem: format!("CHAIN OF {name}"),
        key_pem: Some(Zeroizing::new(key.to_owned())),
        not_after: 1_900_000_000,
    }
}

/// A proxy's identity reads back as written, the last write wins, and a sealed key moved to another
/// proxy's row, or read with another key-encryption key, is refused.
#[test]
fn proxies_identities_read_back_and_their_keys_open_only_in_their_own_row() {
    let pg = TestPostgres::start();
    let records = proxy_records(&pg, 1);
    let runtime = runtime();
    runtime.block_on(async {
        assert_eq!(records.get("default", "web-1").await.expect("reads"), None);
        records
            .put(&[proxy("web-1", "KEY ONE"), proxy("web-2", "KEY TWO")])
            .await
            .expect("writes");
        let mut newer = proxy("web-1", "KEY ONE AGAIN");
        newer.replica = "meshca-b".into();
        records.put(&[newer.clone()]).await.expect("replaces");
        assert_eq!(
            records.get("default", "web-1").await.expect("reads"),
            Some(newer)
        );
        assert_eq!(
            records.get("default", "web-2").await.expect("reads"),
            Some(proxy("web-2", "KEY TWO"))
        );
    });
    pg.psql(
        "meshca",
        "UPDATE meshca_proxies SET key = (SELECT key FROM meshca_proxies WHERE name = 'web-2') WHERE name = 'web-1'",
    );
    // Refused by the row's tag before the key is even opened.
    let moved = runtime.block_on(records.get("default", "web-1"));
    assert!(matches!(moved, Err(DbError::Refused { .. })), "{moved:?}");
    let other_key = proxy_records(&pg, 2);
    let wrong = runtime.block_on(other_key.get("default", "web-2"));
    assert!(matches!(wrong, Err(DbError::Refused { .. })), "{wrong:?}");
    assert!(!format!("{moved:?}{wrong:?}").contains("KEY TWO"));
}

/// A proxy whose key a meshca agent holds is recorded without one, and reads back so; a sealed key
/// emptied outside meshca (to pass a record off as key-less) is refused by the row's tag.
#[test]
fn a_keyless_identity_reads_back_without_a_key_and_a_key_emptied_outside_is_refused() {
    let pg = TestPostgres::start();
    let records = proxy_records(&pg, 1);
    let runtime = runtime();
    let keyless = meshca_db::ProxyRecord {
        key_pem: None,
        ..proxy("web-1", "")
    };
    runtime.block_on(async {
        records
            .put(&[keyless.clone(), proxy("web-2", "KEY TWO")])
            .await
            .expect("writes");
        assert_eq!(
            records.get("default", "web-1").await.expect("reads"),
            Some(keyless)
        );
    });
    pg.psql(
        "meshca",
        "UPDATE meshca_proxies SET key = ''::bytea WHERE name = 'web-2'",
    );
    let emptied = runtime.block_on(records.get("default", "web-2"));
    assert!(
        matches!(emptied, Err(DbError::Refused { .. })),
        "{emptied:?}"
    );
}
