use std::path::Path;

use super::*;

/// `softhsm2-util --show-slots` with `token`'s configuration: what a process that loads the module
/// with [`TestToken::env`] would see. Its exit status is not judged: with the token directory gone,
/// SoftHSM2 may refuse to start at all.
fn show_slots(token: &TestToken) -> String {
    let mut command = Command::new(&token.softhsm.util);
    command.arg("--show-slots");
    for (name, value) in token.env() {
        command.env(name, value);
    }
    let output = command.output().expect("softhsm2-util runs");
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Whether `--show-slots` lists an initialised token labelled `label`.
fn lists_token(slots: &str, label: &str) -> bool {
    slots
        .lines()
        .any(|line| line.trim() == format!("Label:            {label}").trim())
        && slots.contains("Initialized:      yes")
}

#[test]
fn a_new_token_is_initialised_in_its_own_directory() {
    let token = TestToken::new();
    assert_eq!(token.label(), "meshca");
    assert_eq!(token.pin(), "1234");
    assert_eq!(token.so_pin(), "5678");
    assert!(token.module().is_absolute() && token.module().is_file());
    assert!(
        token.module().ends_with("libsofthsm2.so"),
        "{}",
        token.module().display()
    );
    let slots = show_slots(&token);
    assert!(lists_token(&slots, "meshca"), "{slots}");
    let conf = fs::read_to_string(token.conf()).expect("the configuration exists");
    assert!(
        conf.contains(&format!(
            "directories.tokendir = {}\n",
            token.tokens_dir().display()
        )),
        "{conf}"
    );
    let objects = fs::read_dir(token.tokens_dir())
        .expect("the token directory exists")
        .count();
    assert_eq!(objects, 1, "softhsm2-util made one token directory");
    let [(name, value)] = token.env();
    assert_eq!(name, "SOFTHSM2_CONF");
    assert_eq!(Path::new(&value), token.conf());
    assert_eq!(
        std::env::var_os(CONF_ENV),
        None,
        "the test's own environment is left alone"
    );
}

#[test]
fn tokens_are_independent_and_labelled_as_asked() {
    let first = TestToken::new();
    let second = TestToken::with_label("second token");
    assert_ne!(first.tokens_dir(), second.tokens_dir());
    let slots = show_slots(&second);
    assert!(lists_token(&slots, "second token"), "{slots}");
    assert!(!slots.contains("Label:            meshca"), "{slots}");
}

#[test]
#[should_panic(expected = "a token label is 1 to 32 bytes")]
fn a_label_longer_than_pkcs11_allows_is_refused() {
    TestToken::with_label(&"x".repeat(33));
}

#[test]
fn the_pin_file_holds_the_pin_for_its_owner_only() {
    let token = TestToken::new();
    let meta = fs::metadata(token.pin_file()).expect("the PIN file exists");
    assert!(meta.is_file());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(
        fs::read_to_string(token.pin_file()).expect("read"),
        token.pin()
    );
}

#[test]
fn remove_and_restore_move_the_token_directory() {
    let token = TestToken::new();
    let before: Vec<_> = fs::read_dir(token.tokens_dir())
        .expect("tokens")
        .map(|e| e.expect("entry").file_name())
        .collect();
    token.remove();
    assert!(!token.tokens_dir().exists());
    let slots = show_slots(&token);
    assert!(!lists_token(&slots, "meshca"), "{slots}");
    token.restore();
    let after: Vec<_> = fs::read_dir(token.tokens_dir())
        .expect("tokens are back")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(before, after);
    let slots = show_slots(&token);
    assert!(lists_token(&slots, "meshca"), "{slots}");
}

#[test]
fn dropping_the_token_deletes_everything() {
    let token = TestToken::new();
    let root = token.dir.path().to_owned();
    token.remove();
    assert!(root.is_dir());
    drop(token);
    assert!(!root.exists(), "{} is left behind", root.display());
}

#[test]
fn the_settings_block_names_the_token() {
    let token = TestToken::new();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("settings.yaml");
    fs::write(&path, token.settings_yaml("file")).expect("write");
    let settings = meshca_config::Settings::load(Some(&path), Vec::new()).expect("valid settings");
    assert_eq!(settings.keystore.kind, meshca_config::KeystoreType::File);
    let pkcs11 = settings.keystore.pkcs11.expect("keystore.pkcs11");
    assert_eq!(pkcs11.module, token.module());
    assert_eq!(pkcs11.token, token.label());
    assert_eq!(pkcs11.pin_file, Some(token.pin_file()));

    let postgres = format!(
        "{}  postgres:\n    url: postgres://meshca@127.0.0.1:5432/meshca\nreplica:\n  name: meshca-a\n",
        token.settings_yaml("postgres")
    );
    fs::write(&path, postgres).expect("write");
    let settings = meshca_config::Settings::load(Some(&path), Vec::new()).expect("valid settings");
    assert_eq!(
        settings.keystore.kind,
        meshca_config::KeystoreType::Postgres
    );
    assert!(settings.keystore.pkcs11.is_some());
}

#[test]
fn yaml_strings_are_quoted() {
    assert_eq!(yaml_string("/tmp/a b"), "\"/tmp/a b\"");
    assert_eq!(yaml_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
}
