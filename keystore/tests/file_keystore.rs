//! The on-disk keystore: permissions, atomic replacement, refusal of unsafe files, names, listing.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use meshca_keystore::{Creation, FileKeystore, Keystore, KeystoreError, MemoryKeystore, NewEntry};

const KEY: &[u8] =
    b"-----BEGIN PRIVATE KEY-----\nTOP-SECRET-KEY-BYTES\n-----END PRIVATE KEY-----\n";
const CERT: &[u8] = b"-----BEGIN CERTIFICATE-----\npublic\n-----END CERTIFICATE-----\n";

fn mode(path: &Path) -> u32 {
    fs::metadata(path)
        .expect("path exists")
        .permissions()
        .mode()
        & 0o7777
}

fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temporary directory")
}

fn open(dir: &Path) -> FileKeystore {
    FileKeystore::open(dir).expect("keystore opens")
}

#[test]
fn open_creates_a_private_directory() {
    let tmp = temp_dir();
    let dir = tmp.path().join("data/keystore");
    open(&dir);
    assert!(dir.is_dir());
    assert_eq!(mode(&dir), 0o700);
}

#[test]
fn open_tightens_a_loose_directory() {
    let tmp = temp_dir();
    let dir = tmp.path().join("keystore");
    fs::create_dir(&dir).expect("mkdir");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
    open(&dir);
    assert_eq!(mode(&dir), 0o700);
}

#[test]
fn open_refuses_a_file() {
    let tmp = temp_dir();
    let file = tmp.path().join("not-a-dir");
    fs::write(&file, b"x").expect("write");
    assert!(matches!(
        FileKeystore::open(&file),
        Err(KeystoreError::NotADirectory { .. })
    ));
}

#[test]
fn secrets_are_0600_in_0700_directories_and_public_data_is_0644() {
    let tmp = temp_dir();
    let store = open(tmp.path());
    store
        .put_secret("ca/default/ca-1/key.pem", KEY)
        .expect("put secret");
    store
        .put_public("ca/default/ca-1/cert.pem", CERT)
        .expect("put public");
    let root = tmp.path();
    assert_eq!(mode(&root.join("ca/default/ca-1/key.pem")), 0o600);
    assert_eq!(mode(&root.join("ca/default/ca-1/cert.pem")), 0o644);
    for dir in ["ca", "ca/default", "ca/default/ca-1"] {
        assert_eq!(mode(&root.join(dir)), 0o700, "{dir}");
    }
}

#[test]
fn round_trip_and_missing_entries() {
    let tmp = temp_dir();
    let store = open(tmp.path());
    assert!(store.get_secret("tokens/key.pk8").expect("get").is_none());
    assert!(store.get_public("tokens/key.pub").expect("get").is_none());
    store.put_secret("tokens/key.pk8", KEY).expect("put");
    store.put_public("tokens/key.pub", CERT).expect("put");
    let secret = store
        .get_secret("tokens/key.pk8")
        .expect("get")
        .expect("present");
    assert_eq!(secret.expose(), KEY);
    assert_eq!(
        store.get_public("tokens/key.pub").expect("get").as_deref(),
        Some(CERT)
    );
    // A secret may be read as public data (it is only ever narrower), and an empty entry is an entry.
    assert_eq!(
        store.get_public("tokens/key.pk8").expect("get").as_deref(),
        Some(KEY)
    );
    store.put_secret("empty", b"").expect("put");
    assert!(store
        .get_secret("empty")
        .expect("get")
        .expect("present")
        .is_empty());
    // A name below a file is simply absent.
    assert!(store
        .get_secret("tokens/key.pk8/inner")
        .expect("get")
        .is_none());
}

#[test]
fn entries_survive_reopening() {
    let tmp = temp_dir();
    open(tmp.path()).put_secret("ca/key.pem", KEY).expect("put");
    let reopened = open(tmp.path());
    let secret = reopened
        .get_secret("ca/key.pem")
        .expect("get")
        .expect("present");
    assert_eq!(secret.expose(), KEY);
}

#[test]
fn writes_replace_the_file_instead_of_rewriting_it() {
    let tmp = temp_dir();
    let store = open(tmp.path());
    let path = tmp.path().join("ca/key.pem");
    store
        .put_public("ca/key.pem", b"old public data")
        .expect("put");
    let old_inode = fs::metadata(&path).expect("exists").ino();
    store.put_secret("ca/key.pem", KEY).expect("replace");
    let meta = fs::metadata(&path).expect("exists");
    assert_ne!(meta.ino(), old_inode, "a new file was renamed into place");
    assert_eq!(
        meta.permissions().mode() & 0o7777,
        0o600,
        "the replacement has the secret mode"
    );
    assert_eq!(
        store
            .get_secret("ca/key.pem")
            .expect("get")
            .expect("present")
            .expose(),
        KEY
    );
}

#[test]
fn a_leftover_temporary_file_is_ignored_then_cleaned() {
    let tmp = temp_dir();
    let store = open(tmp.path());
    store.put_secret("ca/key.pem", KEY).expect("put");
    // What a crash between "create temporary file" and "rename" leaves behind.
    let leftover = tmp.path().join("ca/.#key.pem.4242.0.tmp");
    fs::write(&leftover, b"half-written new k").expect("simulate crash");
    assert_eq!(
        store
            .get_secret("ca/key.pem")
            .expect("get")
            .expect("present")
            .expose(),
        KEY
    );
    assert_eq!(store.list("").expect("list"), vec!["ca/key.pem"]);

    let reopened = open(tmp.path());
    assert!(!leftover.exists(), "open removes leftovers");
    assert_eq!(
        reopened
            .get_secret("ca/key.pem")
            .expect("get")
            .expect("present")
            .expose(),
        KEY
    );

    fs::write(&leftover, b"half-written new k").expect("simulate crash");
    reopened.put_secret("ca/key.pem", b"new key").expect("put");
    assert!(
        !leftover.exists(),
        "a write of the same entry removes leftovers"
    );
    assert_eq!(
        reopened
            .get_secret("ca/key.pem")
            .expect("get")
            .expect("present")
            .expose(),
        b"new key"
    );
}

#[test]
fn a_failed_write_leaves_nothing_behind() {
    let tmp = temp_dir();
    let store = open(tmp.path());
    store.put_secret("ca/inner/key.pem", KEY).expect("put");
    // "ca/inner" is a directory, so the rename over it fails after the temporary file was written.
    let err = store
        .put_secret("ca/inner", b"x")
        .expect_err("cannot replace a directory");
    assert!(matches!(err, KeystoreError::Io { .. }), "{err}");
    let names: Vec<_> = fs::read_dir(tmp.path().join("ca"))
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, vec!["inner"], "no temporary file remains");
    assert_eq!(
        store
            .get_secret("ca/inner/key.pem")
            .expect("get")
            .expect("present")
            .expose(),
        KEY
    );
}

#[test]
fn secrets_others_can_read_are_refused() {
    let tmp = temp_dir();
    let store = open(tmp.path());
    store.put_secret("ca/key.pem", KEY).expect("put");
    let path = tmp.path().join("ca/key.pem");
    for loose in [0o640, 0o604, 0o644, 0o660, 0o610] {
        fs::set_permissions(&path, fs::Permissions::from_mode(loose)).expect("chmod");
        match store.get_secret("ca/key.pem") {
            Err(KeystoreError::InsecurePermissions { path: got, mode }) => {
                assert_eq!(got, path);
                assert_eq!(mode, loose);
            }
            other => panic!("mode {loose:o}: expected refusal, got {other:?}"),
        }
    }
    // Public data written with 0644 is never handed out as a secret either.
    store.put_public("ca/cert.pem", CERT).expect("put");
    let err = store
        .get_secret("ca/cert.pem")
        .expect_err("public file is not a secret");
    assert!(matches!(err, KeystoreError::InsecurePermissions { .. }));
    // Narrower than 0600 is fine.
    fs::set_permissions(&path, fs::Permissions::from_mode(0o400)).expect("chmod");
    assert!(store.get_secret("ca/key.pem").expect("get").is_some());
}

#[test]
fn errors_name_the_path_and_never_contain_key_bytes() {
    let tmp = temp_dir();
    let store = open(tmp.path());
    store.put_secret("ca/key.pem", KEY).expect("put");
    let path = tmp.path().join("ca/key.pem");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
    let message = store
        .get_secret("ca/key.pem")
        .expect_err("insecure")
        .to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains("0644"), "{message}");
    assert!(!message.contains("TOP-SECRET"), "{message}");
}

#[test]
fn unreadable_files_are_errors_naming_the_path() {
    let tmp = temp_dir();
    let store = open(tmp.path());
    // Tests may run as root, which reads any mode; a symlink loop is unreadable for everyone.
    let path = tmp.path().join("loop.pem");
    std::os::unix::fs::symlink(&path, &path).expect("symlink");
    match store.get_secret("loop.pem") {
        Err(err @ KeystoreError::Io { .. }) => {
            let message = err.to_string();
            assert!(message.contains(&path.display().to_string()), "{message}");
        }
        other => panic!("expected an io error, got {other:?}"),
    }
    fs::create_dir(tmp.path().join("dir")).expect("mkdir");
    assert!(matches!(
        store.get_public("dir"),
        Err(KeystoreError::NotAFile { .. })
    ));
}

#[test]
fn invalid_names_are_refused_by_every_operation() {
    let tmp = temp_dir();
    let store = open(tmp.path());
    for name in [
        "",
        "/etc/shadow",
        "../outside",
        "a/../../outside",
        "a//b",
        "a/",
        "a b",
        "a#b",
    ] {
        let refused =
            |r: Result<(), KeystoreError>| matches!(r, Err(KeystoreError::InvalidName { .. }));
        assert!(refused(store.put_secret(name, KEY)), "{name}");
        assert!(refused(store.put_public(name, CERT)), "{name}");
        assert!(refused(store.get_secret(name).map(|_| ())), "{name}");
        assert!(refused(store.get_public(name).map(|_| ())), "{name}");
        assert!(refused(store.delete(name)), "{name}");
    }
    assert!(!tmp
        .path()
        .parent()
        .expect("parent")
        .join("outside")
        .exists());
    assert!(matches!(
        store.list("../"),
        Err(KeystoreError::InvalidName { .. })
    ));
}

#[test]
fn delete_removes_and_is_idempotent() {
    let tmp = temp_dir();
    let store = open(tmp.path());
    store.put_secret("ca/key.pem", KEY).expect("put");
    store.delete("ca/key.pem").expect("delete");
    assert!(!tmp.path().join("ca/key.pem").exists());
    assert!(store.get_secret("ca/key.pem").expect("get").is_none());
    store.delete("ca/key.pem").expect("deleting again succeeds");
    store
        .delete("never/existed")
        .expect("deleting the absent succeeds");
}

/// The same behaviour from both implementations, through `Arc<dyn Keystore>` as the daemon holds them.
fn check_listing(store: Arc<dyn Keystore>) {
    for name in [
        "ca/default/ca-2/key.pem",
        "ca/default/ca-1/key.pem",
        "ca/other/ca-1/key.pem",
        "tokens/signing.pk8",
    ] {
        store.put_secret(name, KEY).expect("put");
    }
    store
        .put_public("ca/default/ca-1/cert.pem", CERT)
        .expect("put");
    assert_eq!(
        store.list("").expect("list"),
        vec![
            "ca/default/ca-1/cert.pem",
            "ca/default/ca-1/key.pem",
            "ca/default/ca-2/key.pem",
            "ca/other/ca-1/key.pem",
            "tokens/signing.pk8",
        ]
    );
    assert_eq!(
        store.list("ca/default/").expect("list"),
        vec![
            "ca/default/ca-1/cert.pem",
            "ca/default/ca-1/key.pem",
            "ca/default/ca-2/key.pem"
        ]
    );
    assert_eq!(
        store.list("ca/default/ca-2").expect("list"),
        vec!["ca/default/ca-2/key.pem"]
    );
    assert_eq!(store.list("tok").expect("list"), vec!["tokens/signing.pk8"]);
    assert!(store.list("nothing/").expect("list").is_empty());
    assert!(store.list("tokens/signing.pk8/").expect("list").is_empty());
    assert!(matches!(
        store.get_secret("ca/default/ca-1/cert.pem"),
        Err(KeystoreError::InsecurePermissions { .. })
    ));
}

#[test]
fn listing_file_keystore() {
    let tmp = temp_dir();
    check_listing(Arc::new(open(tmp.path())));
    // Bookkeeping and foreign files are not entries.
    fs::write(tmp.path().join("ca/.#x.1.1.tmp"), b"x").expect("write");
    fs::write(tmp.path().join("ca/not valid"), b"x").expect("write");
    let store = FileKeystore::open(tmp.path()).expect("reopen");
    assert_eq!(
        store.list("ca/other").expect("list"),
        vec!["ca/other/ca-1/key.pem"]
    );
    assert_eq!(store.list("").expect("list").len(), 5);
}

#[test]
fn listing_memory_keystore() {
    check_listing(Arc::new(MemoryKeystore::new()));
}

#[test]
fn concurrent_writers_leave_one_complete_value() {
    let tmp = temp_dir();
    let store = Arc::new(open(tmp.path()));
    let values: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 64 * 1024]).collect();
    std::thread::scope(|scope| {
        for value in &values {
            let store = Arc::clone(&store);
            scope.spawn(move || {
                for _ in 0..5 {
                    store.put_secret("ca/key.pem", value).expect("put");
                }
            });
        }
    });
    let stored = store
        .get_secret("ca/key.pem")
        .expect("get")
        .expect("present");
    assert!(
        values.iter().any(|v| v.as_slice() == stored.expose()),
        "one writer's whole value"
    );
    let names: Vec<_> = fs::read_dir(tmp.path().join("ca"))
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, vec!["key.pem"], "no temporary file remains");
}

/// Creates a CA-shaped pair (`ca/key.pem` secret, `ca/cert.pem` public) holding `tag`, or finds one.
fn create_pair(store: &dyn Keystore, tag: u8) -> Creation {
    let key = vec![tag; 1024];
    let cert = vec![tag; 512];
    store
        .create_if_absent(&[
            NewEntry::secret("ca/key.pem", &key),
            NewEntry::public("ca/cert.pem", &cert),
        ])
        .expect("create_if_absent")
}

/// The tag of the stored pair; panics unless key and certificate belong together.
fn stored_pair(store: &dyn Keystore) -> u8 {
    let key = store.get_secret("ca/key.pem").expect("get").expect("key");
    let cert = store.get_public("ca/cert.pem").expect("get").expect("cert");
    let tag = key.expose()[0];
    assert_eq!(
        key.expose(),
        vec![tag; 1024].as_slice(),
        "one writer's whole key"
    );
    assert_eq!(
        cert,
        vec![tag; 512],
        "the certificate of the same writer as the key"
    );
    tag
}

#[test]
fn concurrent_creators_agree_on_one_pair() {
    // Each thread opens the keystore itself, as separate processes do: the lock is per open file.
    for _ in 0..10 {
        let tmp = temp_dir();
        let start = std::sync::Barrier::new(8);
        let outcomes: Vec<(u8, Creation)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (1..=8u8)
                .map(|tag| {
                    let (dir, start) = (tmp.path(), &start);
                    scope.spawn(move || {
                        let store = open(dir);
                        start.wait();
                        (tag, create_pair(&store, tag))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("creator thread"))
                .collect()
        });
        let winners: Vec<u8> = outcomes
            .iter()
            .filter(|(_, c)| *c == Creation::Created)
            .map(|(tag, _)| *tag)
            .collect();
        assert_eq!(winners.len(), 1, "exactly one creator: {outcomes:?}");
        assert_eq!(
            stored_pair(&open(tmp.path())),
            winners[0],
            "the stored pair is the winner's"
        );
    }
}

#[test]
fn create_if_absent_finds_existing_entries_and_refuses_half_a_pair() {
    let tmp = temp_dir();
    let file = open(tmp.path());
    let memory = MemoryKeystore::new();
    for (store, on_disk) in [(&file as &dyn Keystore, true), (&memory, false)] {
        assert_eq!(create_pair(store, 1), Creation::Created);
        assert_eq!(create_pair(store, 2), Creation::Existing);
        assert_eq!(stored_pair(store), 1, "the first pair is kept");
        if on_disk {
            assert_eq!(mode(&tmp.path().join("ca/key.pem")), 0o600);
            assert_eq!(mode(&tmp.path().join("ca/cert.pem")), 0o644);
        }

        store.delete("ca/cert.pem").expect("delete");
        let err = store
            .create_if_absent(&[
                NewEntry::secret("ca/key.pem", b"new key"),
                NewEntry::public("ca/cert.pem", b"new cert"),
            ])
            .expect_err("half a pair is not completed");
        match &err {
            KeystoreError::PartlyPresent { present, missing } => {
                assert_eq!(present, &["ca/key.pem"]);
                assert_eq!(missing, &["ca/cert.pem"]);
            }
            other => panic!("expected PartlyPresent, got {other:?}"),
        }
        assert!(err.to_string().contains("ca/cert.pem"), "{err}");
        assert!(store.get_public("ca/cert.pem").expect("get").is_none());
        assert_eq!(
            store
                .get_secret("ca/key.pem")
                .expect("get")
                .expect("key")
                .expose(),
            vec![1u8; 1024].as_slice(),
            "the existing key is untouched"
        );
        store.delete("ca/key.pem").expect("delete");
    }
    assert!(matches!(
        memory.create_if_absent(&[NewEntry::public("../x", b"")]),
        Err(KeystoreError::InvalidName { .. })
    ));
    assert_eq!(
        format!("{:?}", NewEntry::secret("k", KEY)),
        "NewEntry { name: \"k\", secret: true, .. }"
    );
}

#[test]
fn debug_output_shows_no_content() {
    let tmp = temp_dir();
    let store = open(tmp.path());
    store.put_secret("key.pem", KEY).expect("put");
    let secret = store.get_secret("key.pem").expect("get").expect("present");
    assert_eq!(format!("{secret:?}"), "Secret([redacted])");
    let memory = MemoryKeystore::new();
    memory.put_secret("key.pem", KEY).expect("put");
    for debug in [format!("{store:?}"), format!("{memory:?}")] {
        assert!(!debug.contains("TOP-SECRET"), "{debug}");
    }
}

/// A keystore an earlier meshca wrote without a creation journal, killed between a CA's key and its
/// certificate: the key is set aside once (kept, never read), the CA can be created anew, and from then on
/// half a pair is the operator's again.
#[test]
fn a_key_without_its_certificate_from_before_the_journal_is_set_aside_once() {
    let tmp = temp_dir();
    let root = tmp.path().join("keystore");
    for dir in ["meshes/default/ca-1", "meshes/default/ca-2"] {
        fs::create_dir_all(root.join(dir)).expect("mkdir");
    }
    fs::set_permissions(&root, fs::Permissions::from_mode(0o700)).expect("chmod");
    let half = root.join("meshes/default/ca-1/key.pem");
    fs::write(&half, KEY).expect("write");
    fs::set_permissions(&half, fs::Permissions::from_mode(0o600)).expect("chmod");
    let whole = root.join("meshes/default/ca-2");
    fs::write(whole.join("key.pem"), b"whole key").expect("write");
    fs::set_permissions(whole.join("key.pem"), fs::Permissions::from_mode(0o600)).expect("chmod");
    fs::write(whole.join("cert.pem"), CERT).expect("write");

    let store = open(&root);
    assert!(!half.exists(), "the half-written key left its place");
    let aside: Vec<_> = fs::read_dir(root.join(".#interrupted"))
        .expect("the set-aside directory")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(
        aside[0]
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("meshes%default%ca-1%key.pem.")),
        "{aside:?}"
    );
    assert_eq!(fs::read(&aside[0]).expect("kept"), KEY, "nothing is lost");
    assert_eq!(mode(&aside[0]), 0o600);
    assert_eq!(mode(&root.join(".#interrupted")), 0o700);
    assert!(
        store
            .get_secret("meshes/default/ca-2/key.pem")
            .expect("get")
            .is_some(),
        "a whole pair is untouched"
    );
    assert!(
        !store
            .list("")
            .expect("list")
            .iter()
            .any(|n| n.contains("interrupted")),
        "what is set aside is no entry"
    );
    let pair = [
        NewEntry::secret("meshes/default/ca-1/key.pem", b"new key"),
        NewEntry::public("meshes/default/ca-1/cert.pem", b"new cert"),
    ];
    assert_eq!(
        store.create_if_absent(&pair).expect("created anew"),
        Creation::Created
    );

    // Opened once by this meshca, the keystore is journaled: half a pair now is a file removed by hand.
    store
        .delete("meshes/default/ca-1/cert.pem")
        .expect("delete");
    let store = open(&root);
    assert!(
        store
            .get_secret("meshes/default/ca-1/key.pem")
            .expect("get")
            .is_some(),
        "not set aside a second time"
    );
    assert!(matches!(
        store.create_if_absent(&pair),
        Err(KeystoreError::PartlyPresent { .. })
    ));
}
