use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::*;
use crate::Duration;
use meshca_identity::KeyAlgorithm;

fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
    vars.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn no_env() -> Vec<(String, String)> {
    Vec::new()
}

/// Writes `text` as `settings.yaml` in a fresh directory and loads it with `vars`.
fn load_yaml(
    text: &str,
    vars: &[(&str, &str)],
) -> (tempfile::TempDir, Result<Settings, SettingsError>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("settings.yaml");
    std::fs::write(&path, text).expect("write settings");
    let result = Settings::load(Some(&path), env(vars));
    (dir, result)
}

fn err_text(result: Result<Settings, SettingsError>) -> String {
    match result {
        Ok(s) => panic!("expected an error, got {s:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn defaults_match_the_design() {
    let s = Settings::load(None, no_env()).expect("defaults are valid");
    assert_eq!(s, Settings::default());
    assert_eq!(s.zone, "default");
    assert_eq!(s.data_dir, PathBuf::from("./meshca-data"));
    assert_eq!(s.resources, PathBuf::from("./meshca-data/resources"));
    assert_eq!(s.defaults.mesh, None);
    assert_eq!(
        s.sds.listen,
        vec![
            ListenAddr::Unix("./meshca-data/sds.sock".into()),
            ListenAddr::Tcp("127.0.0.1:5678".parse().expect("addr")),
        ]
    );
    assert_eq!(s.sds.listen[0].to_string(), "unix://./meshca-data/sds.sock");
    assert_eq!(s.sds.tls, None);
    assert!(!s.sds.insecure);
    assert_eq!(
        s.admin.listen,
        "127.0.0.1:5681".parse::<SocketAddr>().expect("addr")
    );
    assert_eq!(s.issuance.key_algorithm, KeyAlgorithm::EcdsaP256);
    assert_eq!(s.issuance.renew_at, 0.8);
    assert_eq!(s.rollout.ack_timeout, Duration::from_secs(30));
    assert_eq!(s.keystore.kind, KeystoreType::File);
    assert_eq!(s.tokens.max_valid_for, Duration::from_secs(365 * 24 * 3600));
}

#[test]
fn full_file_is_read() {
    let (_dir, s) = load_yaml(
        r#"
zone: zone-1
dataDir: /var/lib/meshca
resources: /etc/meshca/resources
defaults:
  mesh: default
sds:
  listen: ["unix:///run/meshca/sds.sock", "0.0.0.0:5678"]
  tls: {certFile: /etc/meshca/tls.crt, keyFile: /etc/meshca/tls.key}
admin:
  listen: 127.0.0.1:9000
issuance:
  keyAlgorithm: rsa-3072
  renewAt: 0.5
rollout:
  ackTimeout: 1m30s
keystore:
  type: file
tokens:
  maxValidFor: 30d
"#,
        &[],
    );
    let s = s.expect("valid settings");
    assert_eq!(s.zone, "zone-1");
    assert_eq!(s.data_dir, Path::new("/var/lib/meshca"));
    assert_eq!(s.resources, Path::new("/etc/meshca/resources"));
    assert_eq!(s.defaults.mesh.as_deref(), Some("default"));
    assert_eq!(
        s.sds.listen,
        vec![
            ListenAddr::Unix("/run/meshca/sds.sock".into()),
            ListenAddr::Tcp("0.0.0.0:5678".parse().expect("addr")),
        ]
    );
    assert_eq!(
        s.sds.tls,
        Some(TlsFiles {
            cert_file: "/etc/meshca/tls.crt".into(),
            key_file: "/etc/meshca/tls.key".into(),
        })
    );
    assert_eq!(s.admin.listen.port(), 9000);
    assert_eq!(s.issuance.key_algorithm, KeyAlgorithm::Rsa3072);
    assert_eq!(s.issuance.renew_at, 0.5);
    assert_eq!(s.rollout.ack_timeout, Duration::from_secs(90));
    assert_eq!(s.tokens.max_valid_for, Duration::from_secs(30 * 24 * 3600));
}

#[test]
fn empty_file_means_defaults() {
    let (_dir, s) = load_yaml("# nothing here\n", &[]);
    assert_eq!(s.expect("valid"), Settings::default());
}

#[test]
fn resources_and_socket_follow_data_dir() {
    let (_dir, s) = load_yaml("dataDir: /srv/ca\n", &[]);
    let s = s.expect("valid");
    assert_eq!(s.resources, Path::new("/srv/ca/resources"));
    assert_eq!(s.sds.listen[0], ListenAddr::Unix("/srv/ca/sds.sock".into()));
    let from_env = Settings::load(None, env(&[("MESHCA_DATA_DIR", "/x")])).expect("valid");
    assert_eq!(from_env.resources, Path::new("/x/resources"));
}

#[test]
fn renew_at_out_of_range_names_file_and_field() {
    let (dir, s) = load_yaml("issuance:\n  renewAt: 1.5\n", &[]);
    let expected = format!(
        "{}: issuance.renewAt: must be between 0 and 1 (exclusive), got 1.5",
        dir.path().join("settings.yaml").display()
    );
    assert_eq!(err_text(s), expected);
    for bad in ["0", "1", "-0.1", "NaN"] {
        let e = err_text(Settings::load(
            None,
            env(&[("MESHCA_ISSUANCE_RENEW_AT", bad)]),
        ));
        assert!(
            e.starts_with("MESHCA_ISSUANCE_RENEW_AT: issuance.renewAt: must be between 0 and 1"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn admin_allowed_hosts_are_host_names_from_the_file_or_the_environment() {
    let (_dir, s) = load_yaml("admin:\n  allowedHosts: [CA-1.Example.com., meshca]\n", &[]);
    assert_eq!(
        s.expect("valid").admin.allowed_hosts,
        ["ca-1.example.com", "meshca"]
    );
    let from_env = Settings::load(None, env(&[("MESHCA_ADMIN_ALLOWED_HOSTS", "a.example, b")]))
        .expect("valid");
    assert_eq!(from_env.admin.allowed_hosts, ["a.example", "b"]);
    assert!(Settings::default().admin.allowed_hosts.is_empty());
    for bad in ["http://x", "x:5681", "a b", "", "a..b", "-/"] {
        let yaml = format!("admin:\n  allowedHosts: [ok, {bad:?}]\n");
        let (dir, s) = load_yaml(&yaml, &[]);
        let e = err_text(s);
        let prefix = format!(
            "{}: admin.allowedHosts: entry 1",
            dir.path().join("settings.yaml").display()
        );
        assert!(e.starts_with(&prefix), "{bad}: {e}");
    }
}

#[test]
fn unknown_keys_are_errors_naming_the_key() {
    let (_dir, s) = load_yaml("issuance:\n  renewAfter: 0.5\n", &[]);
    let e = err_text(s);
    assert!(
        e.contains(": issuance.renewAfter: unknown field `renewAfter`"),
        "{e}"
    );
    assert!(e.contains("line 2"), "{e}");
    let (_dir, s) = load_yaml("datadir: /x\n", &[]);
    assert!(err_text(s).contains(": datadir: unknown field `datadir`"));
}

#[test]
fn bad_values_in_file_name_the_field() {
    let (_dir, s) = load_yaml("issuance:\n  keyAlgorithm: ed25519\n", &[]);
    let e = err_text(s);
    assert!(
        e.contains("issuance.keyAlgorithm: unknown variant `ed25519`"),
        "{e}"
    );
    let (_dir, s) = load_yaml("rollout:\n  ackTimeout: soon\n", &[]);
    let e = err_text(s);
    assert!(
        e.contains("rollout.ackTimeout: invalid duration \"soon\""),
        "{e}"
    );
    let (_dir, s) = load_yaml("keystore:\n  type: vault\n", &[]);
    let e = err_text(s);
    assert!(
        e.contains("keystore.type: unknown keystore type \"vault\"; supported: file, postgres"),
        "{e}"
    );
    let (_dir, s) = load_yaml("sds:\n  listen: [\"localhost:1\"]\n", &[]);
    let e = err_text(s);
    assert!(
        e.contains("sds.listen[0]: invalid listen address \"localhost:1\""),
        "{e}"
    );
    let (_dir, s) = load_yaml("zone: Zone_1\n", &[]);
    assert!(err_text(s).contains(": zone: \"Zone_1\" is not a valid name"));
}

#[test]
fn yaml_syntax_errors_carry_the_line() {
    let (_dir, s) = load_yaml("zone: a\nsds: [\n", &[]);
    let e = err_text(s);
    assert!(e.contains(": YAML syntax error: "), "{e}");
    assert!(e.contains("line 3"), "{e}");
}

#[test]
fn missing_file_is_an_error() {
    let e = err_text(Settings::load(
        Some(Path::new("/nonexistent/meshca.yaml")),
        no_env(),
    ));
    assert!(
        e.starts_with("/nonexistent/meshca.yaml: cannot read the settings file"),
        "{e}"
    );
}

#[test]
fn env_overrides_file() {
    let (_dir, s) = load_yaml(
        "zone: from-file\nissuance:\n  renewAt: 0.5\n",
        &[
            ("MESHCA_ZONE", "from-env"),
            ("MESHCA_DATADIR", "/d"),
            ("MESHCA_RESOURCES", "/r"),
            ("MESHCA_DEFAULTS_MESH", "m1"),
            ("MESHCA_SDS_LISTEN", "unix:///s.sock, [::1]:7000"),
            ("MESHCA_SDS_INSECURE", "true"),
            ("MESHCA_ADMIN_LISTEN", "127.0.0.1:1"),
            ("MESHCA_ISSUANCE_KEY_ALGORITHM", "ecdsa-p384"),
            ("MESHCA_ISSUANCE_RENEWAT", "0.7"),
            ("MESHCA_ROLLOUT_ACK_TIMEOUT", "2m"),
            ("MESHCA_KEYSTORE_TYPE", "file"),
            ("PATH", "/usr/bin"),
        ],
    );
    let s = s.expect("valid");
    assert_eq!(s.zone, "from-env");
    assert_eq!(s.data_dir, Path::new("/d"));
    assert_eq!(s.resources, Path::new("/r"));
    assert_eq!(s.defaults.mesh.as_deref(), Some("m1"));
    assert_eq!(
        s.sds.listen,
        vec![
            ListenAddr::Unix("/s.sock".into()),
            ListenAddr::Tcp("[::1]:7000".parse().expect("addr")),
        ]
    );
    assert!(s.sds.insecure);
    assert_eq!(s.admin.listen.port(), 1);
    assert_eq!(s.issuance.key_algorithm, KeyAlgorithm::EcdsaP384);
    assert_eq!(s.issuance.renew_at, 0.7);
    assert_eq!(s.rollout.ack_timeout, Duration::from_secs(120));
}

#[test]
fn env_sets_tls_files() {
    let s = Settings::load(
        None,
        env(&[
            ("MESHCA_SDS_TLS_CERT_FILE", "/c.pem"),
            ("MESHCA_SDS_TLS_KEYFILE", "/k.pem"),
        ]),
    )
    .expect("valid");
    assert_eq!(
        s.sds.tls,
        Some(TlsFiles {
            cert_file: "/c.pem".into(),
            key_file: "/k.pem".into()
        })
    );
    let e = err_text(Settings::load(
        None,
        env(&[("MESHCA_SDS_TLS_CERT_FILE", "/c.pem")]),
    ));
    assert_eq!(
        e,
        "MESHCA_SDS_TLS_CERT_FILE: sds.tls.keyFile: required when sds.tls.certFile is set"
    );
}

#[test]
fn unknown_env_var_is_ignored_not_applied() {
    let s = Settings::load(
        None,
        env(&[("MESHCA_RENEW_AT", "0.5"), ("MESHCA_BIN", "/x")]),
    )
    .expect("unknown MESHCA_* variables only warn");
    assert_eq!(s, Settings::default());
    let (s, warnings) = Settings::load_reporting(
        None,
        env(&[("MESHCA_RENEW_AT", "0.5"), ("MESHCA_BIN", "/x")]),
    )
    .expect("valid");
    assert_eq!(s, Settings::default());
    let origins: Vec<&str> = warnings.iter().map(|w| w.origin.as_str()).collect();
    assert_eq!(origins, ["MESHCA_BIN", "MESHCA_RENEW_AT"]);
    assert!(
        warnings[0]
            .to_string()
            .starts_with("MESHCA_BIN: not a meshca setting, ignored"),
        "{}",
        warnings[0]
    );
}

#[test]
fn env_values_are_checked() {
    let e = err_text(Settings::load(
        None,
        env(&[("MESHCA_ROLLOUT_ACK_TIMEOUT", "5 minutes")]),
    ));
    assert!(
        e.starts_with("MESHCA_ROLLOUT_ACK_TIMEOUT: rollout.ackTimeout: invalid duration"),
        "{e}"
    );
    let e = err_text(Settings::load(None, env(&[("MESHCA_SDS_INSECURE", "yes")])));
    assert_eq!(
        e,
        "MESHCA_SDS_INSECURE: sds.insecure: expected true or false, got \"yes\""
    );
    let e = err_text(Settings::load(None, env(&[("MESHCA_ZONE", "")])));
    assert!(e.starts_with("MESHCA_ZONE: zone: must not be empty"), "{e}");
    let e = err_text(Settings::load(
        None,
        env(&[("MESHCA_ISSUANCE_KEY_ALGORITHM", "dsa")]),
    ));
    assert!(e.contains("unknown key algorithm \"dsa\""), "{e}");
    let e = err_text(Settings::load(
        None,
        env(&[("MESHCA_ROLLOUT_ACK_TIMEOUT", "0s")]),
    ));
    assert_eq!(
        e,
        "MESHCA_ROLLOUT_ACK_TIMEOUT: rollout.ackTimeout: must be greater than zero"
    );
}

#[test]
fn token_validity_cap_comes_from_file_or_env_and_is_never_zero() {
    let (_dir, s) = load_yaml("tokens:\n  maxValidFor: 2h\n", &[]);
    assert_eq!(
        s.expect("valid").tokens.max_valid_for,
        Duration::from_secs(7200)
    );
    let s = Settings::load(None, env(&[("MESHCA_TOKENS_MAX_VALID_FOR", "90d")])).expect("valid");
    assert_eq!(s.tokens.max_valid_for, Duration::from_secs(90 * 86_400));
    let (_dir, s) = load_yaml("tokens:\n  maxValidFor: 500ms\n", &[]);
    let e = err_text(s);
    assert!(
        e.ends_with("tokens.maxValidFor: must be at least one second (a token's validity is counted in whole seconds)"),
        "{e}"
    );
    let (_dir, s) = load_yaml("tokens:\n  maxValidity: 1d\n", &[]);
    assert!(
        err_text(s).contains("tokens.maxValidity: unknown field `maxValidity`"),
        "unknown keys under tokens are refused"
    );
}

#[test]
fn both_spellings_of_one_field_conflict() {
    let e = err_text(Settings::load(
        None,
        env(&[("MESHCA_DATA_DIR", "/a"), ("MESHCA_DATADIR", "/b")]),
    ));
    assert_eq!(
        e,
        "MESHCA_DATADIR and MESHCA_DATA_DIR both set dataDir; set only one of them"
    );
}

#[test]
fn insecure_requires_loopback_tcp() {
    let ok = Settings::load(None, env(&[("MESHCA_SDS_INSECURE", "true")]))
        .expect("defaults are loopback");
    assert!(ok.sds.insecure);
    let (dir, s) = load_yaml(
        "sds:\n  listen: [\"unix:///s\", \"127.0.0.1:1\", \"0.0.0.0:5678\"]\n  insecure: true\n",
        &[],
    );
    let e = err_text(s);
    let file = dir.path().join("settings.yaml").display().to_string();
    assert!(
        e.starts_with(&format!(
            "{file}: sds.insecure: plaintext SDS is only allowed on loopback"
        )),
        "{e}"
    );
    assert!(e.contains("0.0.0.0:5678"), "{e}");
    let e = err_text(Settings::load(
        None,
        env(&[
            ("MESHCA_SDS_INSECURE", "1"),
            ("MESHCA_SDS_LISTEN", "10.0.0.1:5678"),
        ]),
    ));
    assert!(
        e.contains("sds.listen (from MESHCA_SDS_LISTEN) includes 10.0.0.1:5678"),
        "{e}"
    );
}

#[test]
fn insecure_and_tls_conflict() {
    let (_dir, s) = load_yaml(
        "sds:\n  insecure: true\n  tls: {certFile: /c, keyFile: /k}\n",
        &[],
    );
    assert!(err_text(s).contains("sds.insecure: cannot be combined with sds.tls"));
}

#[test]
fn listen_list_must_be_non_empty_and_unique() {
    let (_dir, s) = load_yaml("sds:\n  listen: []\n", &[]);
    assert!(err_text(s).contains("sds.listen: at least one listen address is required"));
    let (_dir, s) = load_yaml("sds:\n  listen: [\"127.0.0.1:1\", \"127.0.0.1:1\"]\n", &[]);
    assert!(err_text(s).contains("sds.listen: 127.0.0.1:1 is listed twice"));
}

#[test]
fn serializes_in_file_spelling() {
    let json = serde_json::to_value(Settings::default()).expect("serializable");
    assert_eq!(json["dataDir"], "./meshca-data");
    assert_eq!(json["sds"]["listen"][0], "unix://./meshca-data/sds.sock");
    assert_eq!(json["sds"]["listen"][1], "127.0.0.1:5678");
    assert_eq!(json["issuance"]["keyAlgorithm"], "ecdsa-p256");
    assert_eq!(json["rollout"]["ackTimeout"], "30s");
    assert_eq!(json["keystore"]["type"], "file");
    assert_eq!(json["tokens"]["maxValidFor"], "365d");
    assert_eq!(json["admin"]["listen"], "127.0.0.1:5681");
}

mod never_panics {
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn on_arbitrary_settings_text(text in "\\PC{0,200}") {
            let _ = super::super::resolve::parse_file(std::path::Path::new("s.yaml"), &text);
        }

        #[test]
        fn on_arbitrary_env_values(key in "MESHCA_[A-Z_]{0,24}", value in "\\PC{0,40}") {
            let _ = super::Settings::load(None, vec![(key, value)]);
        }
    }
}

#[test]
fn limits_come_from_the_file_and_the_environment() {
    let (_dir, s) = load_yaml(
        "limits:\n  namesPerStream: 20\n  connectTimeout: 2s\n",
        &[("MESHCA_LIMITS_STREAMS_PER_PROXY", "3")],
    );
    let limits = s.expect("valid").limits;
    assert_eq!(limits.names_per_stream, 20);
    assert_eq!(limits.connect_timeout, Duration::from_secs(2));
    assert_eq!(limits.streams_per_proxy, 3);
    assert_eq!(limits.idle_timeout, Limits::default().idle_timeout);

    let (dir, s) = load_yaml("limits:\n  idleTimeout: 0s\n", &[]);
    let e = err_text(s);
    let file = dir.path().join("settings.yaml");
    assert!(
        e.contains(&file.display().to_string())
            && e.contains("limits.idleTimeout: must be greater than zero"),
        "{e}"
    );
    let (_dir, s) = load_yaml("limits:\n  maxEverything: 1\n", &[]);
    assert!(err_text(s).contains("unknown field `maxEverything`"));
    let (_dir, s) = load_yaml("", &[("MESHCA_LIMITS_NAME_BYTES", "many")]);
    let e = err_text(s);
    assert!(
        e.contains("MESHCA_LIMITS_NAME_BYTES") && e.contains("expected a whole number"),
        "{e}"
    );
}

#[test]
fn a_postgres_keystore_takes_its_database_from_the_file_and_the_environment() {
    let (_dir, s) = load_yaml(
        "keystore:\n  type: postgres\n  postgres:\n    url: postgres://meshca@db.example:5432/meshca\n    \
         passwordFile: /etc/meshca/db-password\n    keyEncryptionKeyFile: /etc/meshca/kek\n\
         replica:\n  name: meshca-a\n  leaseTimeout: 20s\n",
        &[
            ("MESHCA_KEYSTORE_POSTGRES_MAX_CONNECTIONS", "3"),
            ("MESHCA_KEYSTORE_POSTGRES_PASSWORD", "not a setting, never echoed"),
        ],
    );
    let s = s.expect("valid");
    assert_eq!(s.keystore.kind, KeystoreType::Postgres);
    let pg = s.keystore.postgres.as_ref().expect("postgres settings");
    assert_eq!(pg.url, "postgres://meshca@db.example:5432/meshca");
    assert_eq!(
        pg.password_file.as_deref(),
        Some(Path::new("/etc/meshca/db-password"))
    );
    assert_eq!(
        pg.key_encryption_key_file.as_deref(),
        Some(Path::new("/etc/meshca/kek"))
    );
    assert_eq!(pg.ca_file, None);
    assert_eq!(pg.timeout, DEFAULT_POSTGRES_TIMEOUT);
    assert_eq!(pg.max_connections, 3);
    assert_eq!(s.replica.name, "meshca-a");
    assert_eq!(s.replica.lease_timeout, Duration::from_secs(20));
    let json = serde_json::to_string(&s).expect("serializes");
    assert!(!json.contains("never echoed"), "{json}");
    assert!(json.contains("keyEncryptionKeyFile"), "{json}");

    let (_dir, s) = load_yaml(
        "",
        &[
            ("MESHCA_KEYSTORE_TYPE", "postgres"),
            (
                "MESHCA_KEYSTORE_POSTGRES_URL",
                "postgres://meshca@db/meshca",
            ),
            ("MESHCA_KEYSTORE_POSTGRES_KEY_ENCRYPTION_KEY_FILE", "/k"),
        ],
    );
    let s = s.expect("valid from the environment alone");
    assert_eq!(
        s.keystore.postgres.expect("postgres").url,
        "postgres://meshca@db/meshca"
    );
}

#[test]
fn a_postgres_keystore_names_what_it_lacks_or_what_is_wrong() {
    let cases: [(&str, &str); 7] = [
        ("keystore:\n  type: postgres\n", "keystore.postgres.url: required when keystore.type is postgres"),
        (
            "keystore:\n  type: postgres\n  postgres:\n    url: postgres://db/m\n",
            "keystore.postgres.keyEncryptionKeyFile: required when keystore.type is postgres",
        ),
        (
            "keystore:\n  type: postgres\n  postgres:\n    url: mysql://db/m\n    keyEncryptionKeyFile: /k\n",
            "keystore.postgres.url: must be a postgres:// URL",
        ),
        (
            "keystore:\n  postgres:\n    url: postgres://db/m\n",
            "keystore.postgres.url: only used with keystore.type: postgres (keystore.type is file)",
        ),
        (
            "keystore:\n  type: postgres\n  postgres:\n    url: postgres://db/m\n    keyEncryptionKeyFile: /k\n    maxConnections: 0\n",
            "keystore.postgres.maxConnections: must be between 1 and 256, got 0",
        ),
        (
            "keystore:\n  type: postgres\n  postgres:\n    url: postgres://db/m\n    keyEncryptionKeyFile: /k\n    timeout: 0s\n",
            "keystore.postgres.timeout: must be greater than zero",
        ),
        ("replica:\n  name: Meshca_A\n", "replica.name: \"Meshca_A\" is not a valid name"),
    ];
    for (yaml, expected) in cases {
        let (_dir, s) = load_yaml(yaml, &[]);
        let e = err_text(s);
        assert!(e.contains(expected), "{yaml}: {e}");
    }
}

#[test]
fn workload_api_socket_defaults_into_the_data_dir() {
    let s = Settings::default();
    assert_eq!(
        s.workload_api.listen,
        [PathBuf::from("./meshca-data/workload.sock")]
    );
    let (_dir, s) = load_yaml("dataDir: /srv/ca\n", &[]);
    assert_eq!(
        s.expect("valid").workload_api.listen,
        [PathBuf::from("/srv/ca/workload.sock")]
    );
    let from_env = Settings::load(None, env(&[("MESHCA_DATA_DIR", "/x")])).expect("valid");
    assert_eq!(
        from_env.workload_api.listen,
        [PathBuf::from("/x/workload.sock")]
    );
    let json = serde_json::to_value(Settings::default()).expect("serializable");
    assert_eq!(
        json["workloadApi"]["listen"][0],
        "unix://./meshca-data/workload.sock"
    );
}

#[test]
fn workload_api_sockets_come_from_the_file_and_the_environment() {
    let (_dir, s) = load_yaml(
        "dataDir: /srv/ca\nworkloadApi:\n  listen: [\"unix:///run/meshca/workload.sock\", \"unix://./w.sock\"]\n",
        &[],
    );
    assert_eq!(
        s.expect("valid").workload_api.listen,
        [
            PathBuf::from("/run/meshca/workload.sock"),
            PathBuf::from("./w.sock")
        ]
    );
    let (_dir, s) = load_yaml(
        "workloadApi:\n  listen: [\"unix:///from/file.sock\"]\n",
        &[(
            "MESHCA_WORKLOAD_API_LISTEN",
            "unix:///a.sock, unix:///b.sock",
        )],
    );
    assert_eq!(
        s.expect("valid").workload_api.listen,
        [PathBuf::from("/a.sock"), PathBuf::from("/b.sock")]
    );
    let glued = Settings::load(
        None,
        env(&[("MESHCA_WORKLOADAPI_LISTEN", "unix:///g.sock")]),
    )
    .expect("valid");
    assert_eq!(glued.workload_api.listen, [PathBuf::from("/g.sock")]);
}

#[test]
fn an_empty_workload_api_list_turns_it_off() {
    let (_dir, s) = load_yaml("workloadApi:\n  listen: []\n", &[]);
    assert_eq!(s.expect("valid").workload_api.listen, Vec::<PathBuf>::new());
    let (_dir, s) = load_yaml(
        "workloadApi:\n  listen: [\"unix:///from/file.sock\"]\n",
        &[("MESHCA_WORKLOAD_API_LISTEN", "")],
    );
    assert_eq!(s.expect("valid").workload_api.listen, Vec::<PathBuf>::new());
    let off = Settings::load(None, env(&[("MESHCA_WORKLOAD_API_LISTEN", "")])).expect("valid");
    assert!(off.workload_api.listen.is_empty());
}

#[test]
fn the_workload_api_refuses_tcp() {
    let (dir, s) = load_yaml("workloadApi:\n  listen: [\"127.0.0.1:9000\"]\n", &[]);
    let e = err_text(s);
    assert!(
        e.starts_with(&dir.path().join("settings.yaml").display().to_string())
            && e.contains("workloadApi.listen: 127.0.0.1:9000 is a TCP address")
            && e.contains("peer credentials"),
        "{e}"
    );
    let e = err_text(Settings::load(
        None,
        env(&[("MESHCA_WORKLOAD_API_LISTEN", "unix:///a.sock,[::1]:9000")]),
    ));
    assert!(
        e.starts_with(
            "MESHCA_WORKLOAD_API_LISTEN: workloadApi.listen: [::1]:9000 is a TCP address"
        ),
        "{e}"
    );
    let e = err_text(Settings::load(
        None,
        env(&[("MESHCA_WORKLOAD_API_LISTEN", "tcp://x")]),
    ));
    assert!(
        e.contains("MESHCA_WORKLOAD_API_LISTEN")
            && e.contains("invalid listen address \"tcp://x\""),
        "{e}"
    );
}

#[test]
fn the_workload_api_socket_is_not_an_sds_socket() {
    let (_dir, s) = load_yaml(
        "sds:\n  listen: [\"unix:///run/meshca/s.sock\"]\nworkloadApi:\n  listen: [\"unix:///run/meshca/s.sock\"]\n",
        &[],
    );
    let e = err_text(s);
    assert!(
        e.contains("workloadApi.listen: unix:///run/meshca/s.sock is also an SDS socket (sds.listen, from "),
        "{e}"
    );
    // The defaults of both follow the data directory, to different files; an explicit clash with the
    // default SDS socket is refused too.
    let e = err_text(Settings::load(
        None,
        env(&[(
            "MESHCA_WORKLOAD_API_LISTEN",
            "unix://./meshca-data/sds.sock",
        )]),
    ));
    assert!(
        e.contains("is also an SDS socket (sds.listen, from built-in defaults)"),
        "{e}"
    );
    let (_dir, s) = load_yaml(
        "workloadApi:\n  listen: [\"unix:///w.sock\", \"unix:///w.sock\"]\n",
        &[],
    );
    assert!(err_text(s).contains("workloadApi.listen: unix:///w.sock is listed twice"));
}

#[test]
fn agent_limits_have_defaults_and_overrides() {
    let defaults = Limits::default();
    assert_eq!(defaults.agent_streams_per_agent, 4);
    assert_eq!(defaults.agent_message_bytes, 1024 * 1024);
    let (_dir, s) = load_yaml(
        "limits:\n  agentStreamsPerAgent: 2\n",
        &[("MESHCA_LIMITS_AGENT_MESSAGE_BYTES", "4096")],
    );
    let limits = s.expect("valid").limits;
    assert_eq!(limits.agent_streams_per_agent, 2);
    assert_eq!(limits.agent_message_bytes, 4096);
}

#[test]
fn workload_api_limits_have_defaults_and_overrides() {
    let defaults = Limits::default();
    assert_eq!(defaults.workload_connections, 1024);
    assert_eq!(defaults.workload_streams_per_caller, 64);
    assert_eq!(defaults.workload_idle_timeout, defaults.idle_timeout);
    assert_eq!(
        defaults.workload_idle_timeout(),
        std::time::Duration::from_secs(60)
    );
    assert_eq!(defaults.workload_request_bytes, 64 * 1024);
    assert_eq!(defaults.jwt_audiences_per_request, 32);
    assert_eq!(defaults.jwt_audience_bytes, 1024);
    assert_eq!(defaults.jwt_svid_cache_entries, 4096);

    let (_dir, s) = load_yaml(
        "limits:\n  workloadConnections: 10\n  workloadStreamsPerCaller: 11\n  workloadIdleTimeout: 12s\n  workloadRequestBytes: 13\n",
        &[
            ("MESHCA_LIMITS_JWT_AUDIENCES_PER_REQUEST", "14"),
            ("MESHCA_LIMITS_JWT_AUDIENCE_BYTES", "15"),
            ("MESHCA_LIMITS_JWT_SVID_CACHE_ENTRIES", "16"),
            ("MESHCA_LIMITS_WORKLOAD_CONNECTIONS", "17"),
        ],
    );
    let limits = s.expect("valid").limits;
    assert_eq!(limits.workload_connections, 17);
    assert_eq!(limits.workload_streams_per_caller, 11);
    assert_eq!(limits.workload_idle_timeout, Duration::from_secs(12));
    assert_eq!(limits.workload_request_bytes, 13);
    assert_eq!(limits.jwt_audiences_per_request, 14);
    assert_eq!(limits.jwt_audience_bytes, 15);
    assert_eq!(limits.jwt_svid_cache_entries, 16);
    assert_eq!(limits.idle_timeout, defaults.idle_timeout);

    let e = err_text(Settings::load(
        None,
        env(&[("MESHCA_LIMITS_WORKLOAD_IDLE_TIMEOUT", "0s")]),
    ));
    assert!(
        e.contains("limits.workloadIdleTimeout: must be greater than zero"),
        "{e}"
    );
    let json = serde_json::to_value(Limits::default()).expect("serializable");
    assert_eq!(json["jwtSvidCacheEntries"], 4096);
    assert_eq!(json["workloadIdleTimeout"], "1m");
}

#[test]
fn workload_api_ack_after_comes_from_the_file_and_the_environment_and_is_bounded() {
    assert_eq!(
        Settings::default().workload_api.ack_after.as_std(),
        std::time::Duration::from_secs(1)
    );
    let (_dir, s) = load_yaml("workloadApi:\n  ackAfter: 250ms\n", &[]);
    assert_eq!(
        s.expect("valid").workload_api.ack_after.as_std(),
        std::time::Duration::from_millis(250)
    );
    let (_dir, s) = load_yaml(
        "workloadApi:\n  ackAfter: 250ms\n",
        &[("MESHCA_WORKLOAD_API_ACK_AFTER", "3s")],
    );
    assert_eq!(
        s.expect("valid").workload_api.ack_after.as_std(),
        std::time::Duration::from_secs(3)
    );
    let (_dir, s) = load_yaml("workloadApi:\n  ackAfter: 2m\n", &[]);
    let e = err_text(s);
    assert!(
        e.contains("workloadApi.ackAfter") && e.contains("at most"),
        "{e}"
    );
}

#[test]
fn workload_api_jwt_key_lifetime_comes_from_the_file_and_the_environment_and_is_bounded() {
    assert_eq!(
        Settings::default().workload_api.jwt_key_lifetime.as_std(),
        std::time::Duration::from_secs(24 * 3600)
    );
    let (_dir, s) = load_yaml("workloadApi:\n  jwtKeyLifetime: 7d\n", &[]);
    assert_eq!(
        s.expect("valid").workload_api.jwt_key_lifetime.as_std(),
        std::time::Duration::from_secs(7 * 24 * 3600)
    );
    let (_dir, s) = load_yaml(
        "workloadApi:\n  jwtKeyLifetime: 7d\n",
        &[("MESHCA_WORKLOAD_API_JWT_KEY_LIFETIME", "10m")],
    );
    assert_eq!(
        s.expect("valid").workload_api.jwt_key_lifetime.as_std(),
        std::time::Duration::from_secs(600)
    );
    let (_dir, s) = load_yaml("workloadApi:\n  jwtKeyLifetime: 90d\n", &[]);
    assert_eq!(
        s.expect("valid").workload_api.jwt_key_lifetime.as_std(),
        std::time::Duration::from_secs(90 * 24 * 3600)
    );
    for (value, bound) in [("9m59s", "at least"), ("91d", "at most")] {
        let (_dir, s) = load_yaml(&format!("workloadApi:\n  jwtKeyLifetime: {value}\n"), &[]);
        let e = err_text(s);
        assert!(
            e.contains("workloadApi.jwtKeyLifetime") && e.contains(bound),
            "{value}: {e}"
        );
    }
    let (_dir, s) = load_yaml("", &[("MESHCA_WORKLOAD_API_JWT_KEY_LIFETIME", "1m")]);
    let e = err_text(s);
    assert!(
        e.contains("workloadApi.jwtKeyLifetime")
            && e.contains("MESHCA_WORKLOAD_API_JWT_KEY_LIFETIME"),
        "{e}"
    );
}

#[test]
fn the_agent_section_comes_from_the_file_the_environment_and_the_command_line() {
    let (_dir, result) = load_yaml(
        "agent:\n  servers: [\"ca-1:5678\", \"https://ca-2:5678\"]\n  tokenFile: /etc/meshca/agent.token\n  sdsCa: /etc/meshca/sds-ca.pem\n  listen: unix:///run/w.sock\n  admin: 127.0.0.1:9000\n",
        &[("MESHCA_AGENT_TOKEN_FILE", "/env/token")],
    );
    let s = result.expect("valid");
    assert_eq!(s.agent.servers.len(), 2);
    assert_eq!(s.agent.servers[1].to_string(), "https://ca-2:5678");
    assert_eq!(s.agent.token_file, Some(PathBuf::from("/env/token")));
    assert_eq!(
        s.agent.sds_ca,
        Some(PathBuf::from("/etc/meshca/sds-ca.pem"))
    );
    assert_eq!(s.agent.listen, Path::new("/run/w.sock"));
    assert_eq!(s.agent.admin, SocketAddr::from(([127, 0, 0, 1], 9000)));

    let s = Settings::load_with_overrides(
        None,
        env(&[("MESHCA_AGENT_SERVERS", "a:1,b:2")]),
        vec![(
            "agent.servers".into(),
            "--server".into(),
            "unix:///run/meshca/sds.sock".into(),
        )],
    )
    .expect("valid");
    assert_eq!(
        s.agent.servers,
        vec![ServerAddr::Unix("/run/meshca/sds.sock".into())],
        "the command line wins"
    );
    let defaults = Settings::load(None, no_env()).expect("valid");
    assert!(defaults.agent.servers.is_empty());
    assert_eq!(defaults.agent.listen, Path::new(DEFAULT_AGENT_LISTEN));
    assert_eq!(defaults.agent.admin, DEFAULT_AGENT_ADMIN);
}

#[test]
fn bad_agent_settings_name_the_setting_and_where_it_came_from() {
    let text = err_text(Settings::load_with_overrides(
        None,
        no_env(),
        vec![("agent.servers".into(), "--server".into(), "ca-1".into())],
    ));
    assert!(text.starts_with("--server: agent.servers: "), "{text}");
    assert!(text.contains("\"ca-1\""), "{text}");
    let text = err_text(Settings::load(
        None,
        env(&[("MESHCA_AGENT_LISTEN", "127.0.0.1:1")]),
    ));
    assert!(
        text.starts_with("MESHCA_AGENT_LISTEN: agent.listen: "),
        "{text}"
    );
    let (_dir, result) = load_yaml("agent:\n  admin: 0.0.0.0:9911\n", &[]);
    let text = err_text(result);
    assert!(
        text.contains("agent.admin: 0.0.0.0:9911 is not a loopback address"),
        "{text}"
    );
}

#[test]
fn a_pkcs11_token_takes_its_settings_from_the_file_and_the_environment() {
    let (_dir, s) = load_yaml(
        "keystore:\n  pkcs11:\n    module: /usr/lib/softhsm/libsofthsm2.so\n    token: meshca\n    \
         pinFile: /etc/meshca/hsm-pin\n",
        &[(PKCS11_PIN_ENV, "pin-not-a-setting-never-echoed")],
    );
    let s = s.expect("valid");
    assert_eq!(s.keystore.kind, KeystoreType::File);
    let token = s.keystore.pkcs11.as_ref().expect("pkcs11 settings");
    assert_eq!(token.module, Path::new("/usr/lib/softhsm/libsofthsm2.so"));
    assert_eq!(token.token, "meshca");
    assert_eq!(
        token.pin_file.as_deref(),
        Some(Path::new("/etc/meshca/hsm-pin"))
    );
    let json = serde_json::to_value(&s).expect("serializes");
    assert_eq!(
        json["keystore"]["pkcs11"],
        serde_json::json!({
            "module": "/usr/lib/softhsm/libsofthsm2.so",
            "token": "meshca",
            "pinFile": "/etc/meshca/hsm-pin",
        })
    );
    let text = json.to_string();
    assert!(!text.contains("never-echoed"), "{text}");

    // The environment alone, both spellings of pinFile; the PIN itself is read later, not here.
    for pin_file_var in [
        "MESHCA_KEYSTORE_PKCS11_PIN_FILE",
        "MESHCA_KEYSTORE_PKCS11_PINFILE",
    ] {
        let s = Settings::load(
            None,
            env(&[
                ("MESHCA_KEYSTORE_PKCS11_MODULE", "/opt/hsm/lib.so"),
                ("MESHCA_KEYSTORE_PKCS11_TOKEN", "ca keys"),
                (pin_file_var, "/run/pin"),
                (PKCS11_PIN_ENV, "1234"),
            ]),
        )
        .expect("valid from the environment alone");
        let token = s.keystore.pkcs11.expect("pkcs11");
        assert_eq!(token.module, Path::new("/opt/hsm/lib.so"));
        assert_eq!(token.token, "ca keys");
        assert_eq!(token.pin_file.as_deref(), Some(Path::new("/run/pin")));
    }
    let s = Settings::load(
        None,
        env(&[
            ("MESHCA_KEYSTORE_PKCS11_MODULE", "/opt/hsm/lib.so"),
            ("MESHCA_KEYSTORE_PKCS11_TOKEN", "meshca"),
        ]),
    )
    .expect("the PIN may come from the environment");
    assert_eq!(s.keystore.pkcs11.expect("pkcs11").pin_file, None);

    // Without the section, nothing about a token is shown.
    let json = serde_json::to_value(Settings::default()).expect("serializes");
    assert!(json["keystore"].get("pkcs11").is_none(), "{json}");
    assert!(SECRET_ENV_VARS.contains(&PKCS11_PIN_ENV));
}

#[test]
fn a_pkcs11_token_names_what_it_lacks_or_what_is_wrong() {
    let long = "x".repeat(MAX_PKCS11_TOKEN_LABEL + 1);
    let longest = "x".repeat(MAX_PKCS11_TOKEN_LABEL);
    let ok = format!("keystore:\n  pkcs11:\n    module: /m.so\n    token: {longest}\n");
    assert_eq!(
        load_yaml(&ok, &[])
            .1
            .expect("32 bytes")
            .keystore
            .pkcs11
            .expect("pkcs11")
            .token,
        longest
    );
    let cases: Vec<(String, &str)> = vec![
        (
            "keystore:\n  pkcs11:\n    token: meshca\n".into(),
            "keystore.pkcs11.module: required when keystore.pkcs11 is set",
        ),
        (
            "keystore:\n  pkcs11:\n    module: /m.so\n".into(),
            "keystore.pkcs11.token: required when keystore.pkcs11 is set",
        ),
        (
            "keystore:\n  pkcs11: {}\n".into(),
            "keystore.pkcs11.module: required when keystore.pkcs11 is set",
        ),
        (
            "keystore:\n  pkcs11:\n    module: libsofthsm2.so\n    token: meshca\n".into(),
            "keystore.pkcs11.module: must be an absolute path",
        ),
        (
            "keystore:\n  pkcs11:\n    module: /m.so\n    token: ''\n".into(),
            "keystore.pkcs11.token: must not be empty",
        ),
        (
            format!("keystore:\n  pkcs11:\n    module: /m.so\n    token: {long}\n"),
            "keystore.pkcs11.token: a token label is at most 32 bytes (PKCS#11's label field), got 33 bytes",
        ),
        (
            "keystore:\n  pkcs11:\n    module: /m.so\n    token: t\n    pinFile: ''\n".into(),
            "keystore.pkcs11.pinFile: must not be empty",
        ),
        (
            "keystore:\n  pkcs11:\n    module: /m.so\n    token: t\n    pin: '1234'\n".into(),
            "unknown field `pin`",
        ),
    ];
    for (yaml, expected) in cases {
        let (dir, s) = load_yaml(&yaml, &[]);
        let e = err_text(s);
        let file = dir.path().join("settings.yaml").display().to_string();
        assert!(e.contains(expected) && e.contains(&file), "{yaml}: {e}");
    }
    // A field missing from the environment is blamed on the variable that set the section.
    let e = Settings::load(None, env(&[("MESHCA_KEYSTORE_PKCS11_TOKEN", "meshca")]))
        .expect_err("no module");
    assert_eq!(
        e.to_string(),
        "MESHCA_KEYSTORE_PKCS11_TOKEN: keystore.pkcs11.module: required when keystore.pkcs11 is set"
    );
    let e = Settings::load(
        None,
        env(&[
            ("MESHCA_KEYSTORE_PKCS11_MODULE", "/m.so"),
            ("MESHCA_KEYSTORE_PKCS11_TOKEN", &long),
        ]),
    )
    .expect_err("too long");
    assert!(
        e.to_string()
            .starts_with("MESHCA_KEYSTORE_PKCS11_TOKEN: keystore.pkcs11.token:"),
        "{e}"
    );
}

#[test]
fn a_postgres_keystore_with_a_token_needs_no_key_encryption_key_file() {
    let postgres = "keystore:\n  type: postgres\n  postgres:\n    url: postgres://db/m\n";
    let token = "  pkcs11:\n    module: /m.so\n    token: meshca\n";
    let (_dir, s) = load_yaml(&format!("{postgres}{token}"), &[]);
    let s = s.expect("the key-encryption key is in the token");
    assert_eq!(
        s.keystore
            .postgres
            .expect("postgres")
            .key_encryption_key_file,
        None
    );
    let (_dir, s) = load_yaml(
        &format!("{postgres}    keyEncryptionKeyFile: /k\n{token}"),
        &[],
    );
    assert_eq!(
        s.expect("valid")
            .keystore
            .postgres
            .expect("postgres")
            .key_encryption_key_file
            .as_deref(),
        Some(Path::new("/k"))
    );
    let (_dir, s) = load_yaml(postgres, &[]);
    let e = err_text(s);
    assert!(
        e.contains(
            "keystore.postgres.keyEncryptionKeyFile: required when keystore.type is postgres"
        ),
        "{e}"
    );
}

/// Every settings path is a key of the settings file: a value of the wrong kind there is refused as
/// that field's, not as an unknown key.
#[test]
fn every_field_is_a_key_of_the_settings_file() {
    for field in super::file::fields() {
        let mut yaml = String::new();
        for (depth, key) in field.split('.').enumerate() {
            yaml.push_str(&format!("{}{key}:\n", "  ".repeat(depth)));
        }
        yaml.insert_str(yaml.len() - 1, " {}");
        match super::resolve::parse_file(Path::new("s.yaml"), &yaml) {
            Err(SettingsError::Invalid {
                field: refused,
                message,
                ..
            }) => {
                assert_eq!(refused, field, "{message}");
                assert!(
                    message.starts_with("invalid type: map"),
                    "{field}: {message}"
                );
            }
            other => panic!("{field}: {other:?}"),
        }
    }
}

/// docs/operations.md's settings table lists every setting and its variable, and nothing else.
#[test]
fn the_operations_guide_lists_every_setting_and_its_variable() {
    let guide = include_str!("../../../docs/operations.md");
    let rows = guide
        .lines()
        .skip_while(|line| !line.starts_with("| setting | variable |"))
        .skip(2)
        .take_while(|line| line.starts_with('|'));
    let ticked = |column: &str| -> Vec<String> {
        column
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    };
    let mut settings = std::collections::BTreeSet::new();
    let mut variables = std::collections::BTreeSet::new();
    for row in rows {
        let columns: Vec<&str> = row.split('|').collect();
        settings.extend(ticked(columns[1]));
        variables.extend(ticked(columns[2]));
    }
    let fields: std::collections::BTreeSet<String> =
        super::file::fields().map(str::to_owned).collect();
    assert_eq!(settings, fields);
    assert_eq!(variables, settings_env_vars().into_iter().collect());
}

#[test]
fn federation_endpoints_come_from_the_file_or_one_yaml_variable() {
    let (_dir, s) = load_yaml(
        "federation:\n  refreshHint: 2m\n  fetchMargin: 10s\n  endpoints:\n    - {trustDomain: default.zone-1.mesh.local, listen: \"0.0.0.0:8443\"}\n    - trustDomain: web.example\n      listen: \"127.0.0.1:8444\"\n      profile: https_web\n      tls: {certFile: /etc/meshca/web.pem, keyFile: /etc/meshca/web.key}\n",
        &[],
    );
    let s = s.expect("valid");
    assert_eq!(s.federation.refresh_hint, Duration::from_secs(120));
    assert_eq!(s.federation.fetch_margin, Duration::from_secs(10));
    let endpoints = &s.federation.endpoints;
    assert_eq!(endpoints.len(), 2);
    assert_eq!(
        endpoints[0].trust_domain.as_str(),
        "default.zone-1.mesh.local"
    );
    assert_eq!(
        endpoints[0].listen,
        "0.0.0.0:8443".parse().expect("an address")
    );
    assert_eq!(endpoints[0].profile, EndpointServing::HttpsSpiffe);
    assert_eq!(
        endpoints[1].profile,
        EndpointServing::HttpsWeb {
            tls: TlsFiles {
                cert_file: "/etc/meshca/web.pem".into(),
                key_file: "/etc/meshca/web.key".into(),
            }
        }
    );
    let s = Settings::load(
        None,
        env(&[(
            "MESHCA_FEDERATION_ENDPOINTS",
            "[{trustDomain: a.example, listen: \"127.0.0.1:9443\"}]",
        )]),
    )
    .expect("valid");
    assert_eq!(s.federation.endpoints[0].trust_domain.as_str(), "a.example");
    let defaults = Settings::load(None, no_env()).expect("valid");
    assert!(defaults.federation.endpoints.is_empty());
    assert_eq!(defaults.federation.refresh_hint, Duration::from_secs(300));
    assert_eq!(defaults.federation.fetch_margin, Duration::from_secs(30));
}

#[test]
fn a_wrong_federation_endpoint_names_its_entry_and_field() {
    for (yaml, expected) in [
        ("[{listen: \"0.0.0.0:1\"}]", "federation.endpoints[0].trustDomain: required"),
        ("[{trustDomain: a.example}]", "federation.endpoints[0].listen: required"),
        ("[{trustDomain: a.example, listen: nowhere}]", "federation.endpoints[0].listen: \"nowhere\" is not an IP:port"),
        ("[{trustDomain: a.example, listen: \"0.0.0.0:1\", profile: https_web}]", "federation.endpoints[0].tls: required with profile https_web"),
        ("[{trustDomain: a.example, listen: \"0.0.0.0:1\", tls: {certFile: c, keyFile: k}}]", "federation.endpoints[0].tls: only with profile https_web"),
        ("[{trustDomain: a.example, listen: \"0.0.0.0:1\", profile: http}]", "federation.endpoints[0].profile: \"http\" must be one of"),
        ("[{trustDomain: a.example, listen: \"0.0.0.0:1\"}, {trustDomain: a.example, listen: \"0.0.0.0:2\"}]", "federation.endpoints[1].trustDomain: a.example already has an endpoint, on 0.0.0.0:1"),
        ("[{trustDomain: a.example, listen: \"0.0.0.0:1\"}, {trustDomain: b.example, listen: \"0.0.0.0:1\"}]", "federation.endpoints[1].listen: 0.0.0.0:1 already serves trust domain a.example"),
        ("[{trustDomain: a.example, listen: \"0.0.0.0:1\", port: 3}]", "unknown field `port`"),
    ] {
        let (_dir, s) = load_yaml(&format!("federation:\n  endpoints: {yaml}\n"), &[]);
        let e = err_text(s);
        assert!(e.contains(expected), "{yaml}: {e}");
    }
    let (_dir, s) = load_yaml("federation:\n  refreshHint: 5s\n", &[]);
    assert!(err_text(s).contains("federation.refreshHint: must be from 30s to 1h"));
    let e = err_text(Settings::load(
        None,
        env(&[("MESHCA_FEDERATION_ENDPOINTS", "{not: a list")]),
    ));
    assert!(
        e.contains("MESHCA_FEDERATION_ENDPOINTS") && e.contains("not a YAML list of endpoints"),
        "{e}"
    );
}
