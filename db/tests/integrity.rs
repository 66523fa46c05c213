//! No row the database can edit changes what meshca trusts: against a real PostgreSQL server, each
//! way of editing a row that holds trust or identity (a CA's certificate, a MeshTrust record, the SDS
//! CA, a proxy's record, the revoked tokens) is refused, never served.

use std::sync::Arc;
use std::time::Duration;

use meshca_db::{
    Database, DbError, DbOptions, KeyEncryptionKey, PostgresKeystore, ProxyRecord, ProxyRecords,
};
use meshca_keystore::{Keystore, KeystoreError, NewEntry};
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

/// A replica's keystore: its own connection, and its own memory of the versions it read.
fn replica(pg: &TestPostgres) -> PostgresKeystore {
    let db = Arc::new(Database::connect(&options(pg)).expect("connects"));
    PostgresKeystore::open(db, KeyEncryptionKey::from_bytes(&[1; 32])).expect("opens")
}

/// A CA certificate, PEM, with `name` as its common name.
fn ca_pem(name: &str) -> String {
    let key = rcgen::KeyPair::generate().expect("a key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.self_signed(&key).expect("self-signed").pem()
}

/// Hex of `bytes` as a PostgreSQL bytea literal.
fn bytea(bytes: &[u8]) -> String {
    format!("'\\x{}'::bytea", hex::encode(bytes))
}

/// Asserts that reading `name` public is refused, naming the entry, and holds nothing of `not`.
fn assert_refused(store: &PostgresKeystore, name: &str, not: &str) {
    let read = store.get_public(name);
    match &read {
        Err(e @ KeystoreError::Refused { name: refused, .. }) => {
            assert_eq!(refused, name);
            assert!(e.to_string().contains(name), "{e}");
            assert!(!e.to_string().contains(not), "{e}");
        }
        other => panic!("{name} was not refused: {other:?}"),
    }
}

const CA_CERT: &str = "ca/default/backend/ca-1/cert.pem";
const CA_KEY: &str = "ca/default/backend/ca-1/key.pem";
const SDS_CA_CERT: &str = "daemon/sds-ca/cert.pem";
const SDS_CA_KEY: &str = "daemon/sds-ca/key.pem";
const TRUST: &str = "meshtrust/default/web.yaml";

fn trust_yaml(pems: &[&str]) -> String {
    let mut yaml = "type: MeshTrust\nmesh: default\nname: web\nspec:\n  caBundles:\n".to_owned();
    for pem in pems {
        yaml.push_str("  - type: Pem\n    pem:\n      value: |\n");
        for line in pem.lines() {
            yaml.push_str(&format!("        {line}\n"));
        }
    }
    yaml
}

#[test]
fn an_attackers_ca_appended_to_a_ca_certificate_row_is_refused() {
    let pg = TestPostgres::start();
    let store = replica(&pg);
    let ours = ca_pem("ours");
    store
        .create_if_absent(&[
            NewEntry::secret(CA_KEY, b"KEY"),
            NewEntry::public(CA_CERT, ours.as_bytes()),
        ])
        .expect("creates");
    assert_eq!(
        store.get_public(CA_CERT).expect("reads"),
        Some(ours.clone().into_bytes())
    );
    let attacker = ca_pem("attacker");
    pg.psql(
        "meshca",
        &format!(
            "UPDATE meshca_entries SET data = data || {} WHERE name = '{CA_CERT}'",
            bytea(attacker.as_bytes())
        ),
    );
    assert_refused(&store, CA_CERT, "attacker");
    assert_refused(&replica(&pg), CA_CERT, "attacker");
    assert!(meshca_db::refused_rows() >= 2);
}

#[test]
fn an_attackers_ca_added_to_a_meshtrust_record_is_refused() {
    let pg = TestPostgres::start();
    let store = replica(&pg);
    let ours = ca_pem("ours");
    store
        .put_public(TRUST, trust_yaml(&[&ours]).as_bytes())
        .expect("writes");
    let attacker = ca_pem("attacker");
    pg.psql(
        "meshca",
        &format!(
            "UPDATE meshca_entries SET data = {} WHERE name = '{TRUST}'",
            bytea(trust_yaml(&[&ours, &attacker]).as_bytes())
        ),
    );
    assert_refused(&store, TRUST, "attacker");
    assert_refused(&replica(&pg), TRUST, "attacker");
}

#[test]
fn a_replaced_sds_ca_is_refused() {
    let pg = TestPostgres::start();
    let store = replica(&pg);
    store
        .create_if_absent(&[
            NewEntry::secret(SDS_CA_KEY, b"KEY"),
            NewEntry::public(SDS_CA_CERT, ca_pem("sds").as_bytes()),
        ])
        .expect("creates");
    // The whole row replaced by one the attacker wrote (as an older meshca would have: no tag).
    let attacker = ca_pem("attacker");
    pg.psql(
        "meshca",
        &format!(
            "DELETE FROM meshca_entries WHERE name = '{SDS_CA_CERT}';
             INSERT INTO meshca_entries (name, secret, data) VALUES ('{SDS_CA_CERT}', false, {})",
            bytea(attacker.as_bytes())
        ),
    );
    assert_refused(&store, SDS_CA_CERT, "attacker");
    assert_refused(&replica(&pg), SDS_CA_CERT, "attacker");
    // A row the attacker added where none was: a new rotation generation, say.
    let generation = "ca/default/backend/ca-1/gen-1/cert.pem";
    pg.psql(
        "meshca",
        &format!(
            "INSERT INTO meshca_entries (name, secret, data, version, tag)
             VALUES ('{generation}', false, {}, 1, '\\x00'::bytea)",
            bytea(attacker.as_bytes())
        ),
    );
    assert_refused(&store, generation, "attacker");
}

#[test]
fn a_valid_row_swapped_to_another_name_is_refused() {
    let pg = TestPostgres::start();
    let store = replica(&pg);
    let (one, two) = (ca_pem("one"), ca_pem("two"));
    let other = "ca/other/backend/ca-1/cert.pem";
    store.put_public(CA_CERT, one.as_bytes()).expect("writes");
    store.put_public(other, two.as_bytes()).expect("writes");
    // Mesh `default` gets mesh `other`'s CA, tag and all.
    pg.psql(
        "meshca",
        &format!(
            "UPDATE meshca_entries AS e SET data = o.data, version = o.version, tag = o.tag
             FROM meshca_entries AS o WHERE e.name = '{CA_CERT}' AND o.name = '{other}'"
        ),
    );
    assert_refused(&replica(&pg), CA_CERT, "two");
    // A public row turned into a secret, or a secret into public data, is refused too.
    pg.psql(
        "meshca",
        &format!("UPDATE meshca_entries SET secret = true WHERE name = '{other}'"),
    );
    assert!(matches!(
        replica(&pg).get_secret(other),
        Err(KeystoreError::Refused { .. })
    ));
}

#[test]
fn an_older_row_put_back_is_refused_by_a_replica_that_read_the_newer_one() {
    let pg = TestPostgres::start();
    let (a, b) = (replica(&pg), replica(&pg));
    let (old_ca, new_ca) = (ca_pem("old"), ca_pem("new"));
    a.put_public(TRUST, trust_yaml(&[&old_ca]).as_bytes())
        .expect("writes");
    let saved = pg.psql(
        "meshca",
        &format!("SELECT encode(data, 'hex'), version, encode(tag, 'hex') FROM meshca_entries WHERE name = '{TRUST}'"),
    );
    let [data, version, tag] = saved.split('|').collect::<Vec<_>>()[..] else {
        panic!("one row: {saved}");
    };
    a.put_public(TRUST, trust_yaml(&[&new_ca]).as_bytes())
        .expect("writes again");
    assert!(b.get_public(TRUST).expect("reads").is_some());
    pg.psql(
        "meshca",
        &format!(
            "UPDATE meshca_entries SET data = '\\x{data}', version = {version}, tag = '\\x{tag}'
             WHERE name = '{TRUST}'"
        ),
    );
    // The writer and a replica that read the newer row refuse the older one.
    for store in [&a, &b] {
        let err = store.get_public(TRUST).expect_err("an older row");
        assert!(err.to_string().contains("older"), "{err}");
    }
    // What remains: a replica that starts now never saw the newer one (SECURITY.md says so).
    let fresh = replica(&pg).get_public(TRUST).expect("reads");
    assert_eq!(fresh, Some(trust_yaml(&[&old_ca]).into_bytes()));
}

#[test]
fn a_database_written_before_rows_were_tagged_is_tagged_once_as_found() {
    let pg = TestPostgres::start();
    let store = replica(&pg);
    let ours = ca_pem("ours");
    store.put_public(CA_CERT, ours.as_bytes()).expect("writes");
    store.put_secret(CA_KEY, b"KEY").expect("writes");
    store
        .revocations()
        .revoke(&"a".repeat(32), "n")
        .expect("revokes");
    // As an older meshca left it: no tags, no authenticated revocations, its check value.
    let key = KeyEncryptionKey::from_bytes(&[1; 32]);
    let legacy = key
        .seal(
            "key-encryption-key-check",
            b"meshca: this database's key-encryption key",
        )
        .expect("seals");
    let make_legacy = format!(
        "UPDATE meshca_entries SET tag = NULL, version = 0;
         DELETE FROM meshca_meta WHERE key = 'revoked-tokens-digest';
         UPDATE meshca_meta SET value = {} WHERE key = 'key-encryption-key-check';",
        bytea(&legacy)
    );
    pg.psql("meshca", &make_legacy);
    let upgraded = replica(&pg);
    assert_eq!(
        upgraded.get_public(CA_CERT).expect("tagged as found"),
        Some(ours.into_bytes())
    );
    assert_eq!(
        upgraded
            .get_secret(CA_KEY)
            .expect("tagged")
            .expect("present")
            .expose(),
        b"KEY"
    );
    assert_eq!(
        upgraded
            .revocations()
            .ids_blocking()
            .expect("authenticated as found"),
        ["a".repeat(32)]
    );
    // Once only: stripping the tags again does not get a row tagged again.
    pg.psql(
        "meshca",
        "UPDATE meshca_entries SET tag = NULL; DELETE FROM meshca_meta WHERE key = 'revoked-tokens-digest'",
    );
    let later = replica(&pg);
    assert!(matches!(
        later.get_public(CA_CERT),
        Err(KeystoreError::Refused { .. })
    ));
    assert!(matches!(
        later.revocations().ids_blocking(),
        Err(DbError::Refused { .. })
    ));
}

#[test]
fn a_revocation_removed_or_added_outside_meshca_is_refused() {
    let pg = TestPostgres::start();
    let store = replica(&pg);
    let revocations = store.revocations();
    let (a, b, c) = ("a".repeat(32), "b".repeat(32), "c".repeat(32));
    assert!(revocations.revoke(&a, "n").expect("revokes"));
    assert!(revocations.revoke(&b, "n").expect("revokes"));
    assert!(!revocations.revoke(&b, "n").expect("already"));
    assert_eq!(
        revocations.ids_blocking().expect("reads"),
        [a.clone(), b.clone()]
    );

    // Removing a revocation would accept its token again.
    pg.psql(
        "meshca",
        &format!("DELETE FROM meshca_revoked_tokens WHERE id = '{a}'"),
    );
    for reader in [&revocations, &replica(&pg).revocations()] {
        let err = reader.ids_blocking().expect_err("a revocation is missing");
        assert!(err.to_string().contains("meshca_revoked_tokens"), "{err}");
    }
    // Revoking meanwhile does not vouch for the changed set.
    assert!(matches!(
        revocations.revoke(&c, "n"),
        Err(DbError::Refused { .. })
    ));
    pg.psql(
        "meshca",
        &format!("INSERT INTO meshca_revoked_tokens (id, note) VALUES ('{a}', 'n')"),
    );
    assert_eq!(
        revocations.ids_blocking().expect("as it was"),
        [a.clone(), b.clone()]
    );

    // An older set put back whole (its rows and its tag) is refused by a replica that read the newer.
    let saved = pg.psql(
        "meshca",
        "SELECT encode(value, 'hex') FROM meshca_meta WHERE key = 'revoked-tokens-digest'",
    );
    assert!(revocations.revoke(&c, "n").expect("revokes"));
    assert_eq!(revocations.ids_blocking().expect("reads").len(), 3);
    pg.psql(
        "meshca",
        &format!(
            "DELETE FROM meshca_revoked_tokens WHERE id = '{c}';
             UPDATE meshca_meta SET value = '\\x{saved}' WHERE key = 'revoked-tokens-digest'"
        ),
    );
    let err = revocations.ids_blocking().expect_err("an older set");
    assert!(err.to_string().contains("older"), "{err}");

    // Removing the key's check value too makes the database look new to meshca, not its set authentic.
    pg.psql(
        "meshca",
        "DELETE FROM meshca_meta; DELETE FROM meshca_revoked_tokens WHERE id LIKE 'a%'",
    );
    let err = replica(&pg)
        .revocations()
        .ids_blocking()
        .expect_err("not authenticated anew");
    assert!(matches!(err, DbError::Refused { .. }), "{err}");
}

fn proxy(name: &str) -> ProxyRecord {
    ProxyRecord {
        mesh: "default".into(),
        name: name.into(),
        replica: "meshca-a".into(),
        ca_id: "ab".repeat(32),
        issuer: "backend ca-1".into(),
        chain_pem: format!("CHAIN OF {name}"),
        key_pem: Some(Zeroizing::new(format!("KEY OF {name}"))),
        not_after: 1_900_000_000,
    }
}

#[test]
fn a_proxy_record_changed_or_swapped_is_refused() {
    let pg = TestPostgres::start();
    let records: ProxyRecords = replica(&pg).proxy_records();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime
        .block_on(records.put(&[proxy("web-1"), proxy("web-2")]))
        .expect("writes");
    // Its expiry pushed back, so that no replica would renew it.
    pg.psql(
        "meshca",
        "UPDATE meshca_proxies SET not_after = not_after + 100000000 WHERE name = 'web-1'",
    );
    let changed = runtime.block_on(records.get("default", "web-1"));
    assert!(
        matches!(changed, Err(DbError::Refused { .. })),
        "{changed:?}"
    );
    // Another proxy's whole row, tag and sealed key included.
    pg.psql(
        "meshca",
        "UPDATE meshca_proxies AS p SET chain = o.chain, key = o.key, tag = o.tag
         FROM meshca_proxies AS o WHERE p.name = 'web-1' AND o.name = 'web-2'",
    );
    let swapped = runtime.block_on(records.get("default", "web-1"));
    assert!(
        matches!(swapped, Err(DbError::Refused { .. })),
        "{swapped:?}"
    );
    assert_eq!(
        runtime
            .block_on(records.get("default", "web-2"))
            .expect("reads"),
        Some(proxy("web-2"))
    );
}
