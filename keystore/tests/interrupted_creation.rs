//! A creation killed at any step: the rule is "a kill at any write leaves none or all of a group, and a
//! complete group is never removed", also when the next writer is killed while it recovers.
//!
//! Each kill is real: this test binary runs itself again as a child (`child_process_creating_a_pair`)
//! with `MESHCA_TEST_CRASH_AT=N`, which SIGKILLs the child at its Nth write, rename or removal.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};

use meshca_keystore::{Creation, FileKeystore, Keystore, KeystoreError, NewEntry, CRASH_AT_ENV};

/// Where the child works; set only for the child.
const CHILD_DIR_ENV: &str = "MESHCA_KEYSTORE_TEST_CHILD_DIR";
/// The tag the child writes.
const CHILD_TAG_ENV: &str = "MESHCA_KEYSTORE_TEST_CHILD_TAG";

const KEY: &str = "ca/key.pem";
const CERT: &str = "ca/cert.pem";

/// Creates a CA-shaped pair (`ca/key.pem` secret, `ca/cert.pem` public) holding `tag`, or finds one.
fn create_pair(store: &dyn Keystore, tag: u8) -> Result<Creation, KeystoreError> {
    let (key, cert) = (vec![tag; 1024], vec![tag; 512]);
    store.create_if_absent(&[NewEntry::secret(KEY, &key), NewEntry::public(CERT, &cert)])
}

/// What the directory holds, read without opening the keystore (opening recovers): `Some(tag)` for a
/// whole pair, `None` for nothing or for half a pair that a journal names (a creation the kill cut
/// short); panics on a mixed pair or on half a pair without a journal.
fn on_disk(dir: &Path) -> Option<u8> {
    let key = std::fs::read(dir.join(KEY)).ok();
    let cert = std::fs::read(dir.join(CERT)).ok();
    match (key, cert) {
        (None, None) => None,
        (Some(key), Some(cert)) => {
            let tag = key[0];
            assert_eq!(key, vec![tag; 1024], "one writer's whole key");
            assert_eq!(cert, vec![tag; 512], "the certificate of the key's writer");
            Some(tag)
        }
        (key, cert) => {
            assert!(
                journal_exists(dir),
                "half a pair on disk (key: {}, cert: {}) and no journal to recover it",
                key.is_some(),
                cert.is_some()
            );
            None
        }
    }
}

/// Whether a journal names an unfinished creation.
fn journal_exists(dir: &Path) -> bool {
    dir.join(".#creating").exists()
}

/// Not a test of its own: the child process of the tests below. It opens the keystore and creates the
/// pair, and is killed at the crash point its parent chose.
#[test]
fn child_process_creating_a_pair() {
    let Some(dir) = std::env::var_os(CHILD_DIR_ENV) else {
        return;
    };
    let tag: u8 = std::env::var(CHILD_TAG_ENV)
        .ok()
        .and_then(|t| t.parse().ok())
        .expect("the parent sets the tag");
    let store = FileKeystore::open(Path::new(&dir)).expect("the keystore opens");
    create_pair(&store, tag).expect("the pair is created or found");
}

/// Runs the child on `dir`, writing `tag`, killed at crash point `at`.
fn run_child(dir: &Path, tag: u8, at: u32) -> ExitStatus {
    let exe = std::env::current_exe().expect("the test binary's path");
    Command::new(exe)
        .args([
            "child_process_creating_a_pair",
            "--exact",
            "--test-threads=1",
        ])
        .env(CHILD_DIR_ENV, dir)
        .env(CHILD_TAG_ENV, tag.to_string())
        .env(CRASH_AT_ENV, at.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("the test binary runs")
}

/// Copies a keystore directory as it is, with its modes.
fn copy_dir(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp runs");
    assert!(
        status.success(),
        "cp -a {} {}",
        from.display(),
        to.display()
    );
}

/// Checks the state a kill left: then a writer that is not killed finds the complete pair (kept as it
/// was, when the kill left one) or creates its own.
fn finish_and_check(dir: &Path, left: Option<u8>, what: &str) {
    let store = FileKeystore::open(dir).unwrap_or_else(|e| panic!("{what}: open: {e}"));
    assert!(!journal_exists(dir), "{what}: opening recovers the journal");
    let after_open = on_disk(dir);
    if let Some(tag) = left {
        assert_eq!(after_open, Some(tag), "{what}: a complete pair was removed");
    }
    let outcome = create_pair(&store, 9).unwrap_or_else(|e| panic!("{what}: create: {e}"));
    match after_open {
        Some(tag) => {
            assert_eq!(outcome, Creation::Existing, "{what}");
            assert_eq!(on_disk(dir), Some(tag), "{what}: the pair found is kept");
        }
        None => {
            assert_eq!(outcome, Creation::Created, "{what}");
            assert_eq!(on_disk(dir), Some(9), "{what}");
        }
    }
    assert_eq!(
        std::fs::metadata(dir.join(KEY))
            .map(|m| m.permissions().mode() & 0o777)
            .ok(),
        Some(0o600),
        "{what}: the key is private"
    );
}

#[test]
fn a_kill_at_any_step_of_a_creation_or_of_its_recovery_leaves_none_or_all() {
    let tmp = tempfile::tempdir().expect("temporary directory");
    let mut first = 1;
    loop {
        let dir = tmp.path().join(format!("first-{first}"));
        std::fs::create_dir(&dir).expect("mkdir");
        let status = run_child(&dir, 1, first);
        if status.success() {
            // Past the last crash point: the creation ran to its end.
            assert!(
                first > 8,
                "only {first} crash points in a creation: the hook is not live"
            );
            assert_eq!(on_disk(&dir), Some(1));
            assert!(!journal_exists(&dir));
            break;
        }
        assert_eq!(
            status.signal(),
            Some(9),
            "killed at point {first}: {status}"
        );
        let left = on_disk(&dir);

        // The next writer is killed too, at each step of its recovery and creation.
        let mut second = 1;
        loop {
            let again = tmp.path().join(format!("first-{first}-second-{second}"));
            copy_dir(&dir, &again);
            let status = run_child(&again, 2, second);
            let what = format!("killed at point {first}, then at point {second}");
            if status.success() {
                let stored = on_disk(&again);
                assert_eq!(stored, Some(left.unwrap_or(2)), "{what}: never killed");
                assert!(!journal_exists(&again));
                break;
            }
            assert_eq!(status.signal(), Some(9), "{what}: {status}");
            let now = on_disk(&again);
            if let Some(tag) = left {
                assert_eq!(now, Some(tag), "{what}: a complete pair was removed");
            }
            finish_and_check(&again, now, &what);
            second += 1;
        }
        finish_and_check(&dir, left, &format!("killed at point {first}"));
        first += 1;
    }
}

#[test]
fn half_a_pair_without_a_journal_is_left_to_the_operator() {
    let tmp = tempfile::tempdir().expect("temporary directory");
    let store = FileKeystore::open(tmp.path()).expect("opens");
    assert_eq!(create_pair(&store, 1).expect("created"), Creation::Created);
    std::fs::remove_file(tmp.path().join(CERT)).expect("remove the certificate by hand");
    let store = FileKeystore::open(tmp.path()).expect("opens");
    assert!(matches!(
        create_pair(&store, 2),
        Err(KeystoreError::PartlyPresent { .. })
    ));
    assert_eq!(
        std::fs::read(tmp.path().join(KEY)).expect("the key is still there"),
        vec![1; 1024]
    );
}

#[test]
fn a_journal_edited_by_hand_is_refused_and_removes_nothing() {
    let tmp = tempfile::tempdir().expect("temporary directory");
    let store = FileKeystore::open(tmp.path()).expect("opens");
    create_pair(&store, 1).expect("created");
    std::fs::write(
        tmp.path().join(".#creating"),
        "ca/key.pem\n../../etc/passwd\n",
    )
    .expect("write");
    let err = FileKeystore::open(tmp.path()).expect_err("refused");
    assert!(matches!(err, KeystoreError::Journal { .. }), "{err:?}");
    assert!(err.to_string().contains(".#creating"), "{err}");
    assert_eq!(on_disk(tmp.path()), Some(1));
}
