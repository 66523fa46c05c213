//! A kill at any write leaves a daemon that starts. `meshca serve` is killed with SIGKILL (by the
//! `MESHCA_TEST_CRASH_AT=N` hook of `meshca_keystore::crash_point`) at its Nth write, rename or removal,
//! for every N of a first start and of a CA rotation in turn, and started again each time: every restart
//! must reach ready and serve a proxy its certificate, and nothing complete that the killed run left
//! (a CA's key and certificate, the token signing key, the revocation list, the resources it wrote) may
//! change, least of all a CA that issued before the kill.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

use common::{http_get, pem_certs, walk, webpki_verify, Daemon, Env, Token, DATAPLANE_WEB_1};
use meshca_keystore::CRASH_AT_ENV;

/// The Mesh `default` with builtin backend `ca-1` only, or switched to a new builtin `ca-2` (`ca-1`
/// kept as a secondary backend): the one-edit rotation of docs/rotation.md.
fn mesh_yaml(rotated: bool) -> String {
    let backend = |name: &str| {
        format!(
            "    - name: {name}\n      type: builtin\n      dpCert: {{rotation: {{expiration: 1h}}}}\n      conf: {{caCert: {{expiration: 1y}}}}\n"
        )
    };
    let (enabled, secondary, backends) = match rotated {
        false => ("ca-1", "", backend("ca-1")),
        true => (
            "ca-2",
            "  secondaryBackends: [ca-1]\n",
            backend("ca-1") + &backend("ca-2"),
        ),
    };
    format!(
        "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\nmtls:\n  enabledBackend: {enabled}\n{secondary}  backends:\n{backends}"
    )
}

/// Starts `meshca serve` armed to kill itself at crash point `at`. `Ok` when it became ready first;
/// otherwise it must have been killed there, and the step it was about to take is returned.
fn start_killed_at(env: &Env, at: u64) -> Result<Daemon, String> {
    let (status, log) = match env.try_start_with(|cmd| {
        cmd.env(CRASH_AT_ENV, at.to_string());
    }) {
        Ok(daemon) => return Ok(daemon),
        Err(exit) => exit,
    };
    Err(killed_at(status, &log, at))
}

/// Checks that the daemon was killed by the hook at crash point `at`; returns the step it stopped before.
fn killed_at(status: std::process::ExitStatus, log: &str, at: u64) -> String {
    assert_eq!(
        status.signal(),
        Some(9),
        "meshca serve ended ({status}) otherwise than killed at crash point {at}:\n{log}"
    );
    let prefix = format!("{CRASH_AT_ENV}: crash point {at}: ");
    log.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no crash point {at} in the log:\n{log}"))
        .to_owned()
}

/// The highest crash point a log shows.
fn last_point(log: &str) -> u64 {
    let prefix = format!("{CRASH_AT_ENV}: crash point ");
    log.lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .filter_map(|rest| rest.split(':').next()?.parse().ok())
        .max()
        .unwrap_or(0)
}

/// Every regular file under the data and resources directories, by path, with its bytes; without the
/// bookkeeping files (names starting with `.`: locks, temporary files, the creation journal) and the
/// daemon's lock, which hold nothing to keep.
fn files(env: &Env) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    for dir in [&env.data, &env.resources] {
        if !dir.exists() {
            continue;
        }
        for path in walk(dir) {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let kind = std::fs::symlink_metadata(&path)
                .expect("listed")
                .file_type();
            if !kind.is_file() || kind.is_socket() || name.starts_with('.') || name == "daemon.lock"
            {
                continue;
            }
            out.insert(path.clone(), std::fs::read(&path).expect("readable"));
        }
    }
    out
}

/// Whether `path` is half of a key pair (`key.pem`, `cert.pem`) whose other half `left` lacks: a
/// creation the kill cut short, which may be rolled back.
fn half_of_a_pair(left: &BTreeMap<PathBuf, Vec<u8>>, path: &Path) -> bool {
    let other = match path.file_name().and_then(|n| n.to_str()) {
        Some("key.pem") => "cert.pem",
        Some("cert.pem") => "key.pem",
        _ => return false,
    };
    !left.contains_key(&path.with_file_name(other))
}

/// After a restart: every file the killed run left is unchanged, except half of a pair (rolled back)
/// and `sds-ca.pem` (rewritten at each start, from the SDS CA in the keystore).
fn assert_kept(env: &Env, left: &BTreeMap<PathBuf, Vec<u8>>, what: &str) {
    let sds_ca_pem = env.data.join("sds-ca.pem");
    for (path, bytes) in left {
        if half_of_a_pair(left, path) || *path == sds_ca_pem {
            continue;
        }
        let now = std::fs::read(path).unwrap_or_else(|e| {
            panic!("{what}: {} is gone after the restart: {e}", path.display())
        });
        assert!(
            &now == bytes,
            "{what}: {} changed across the restart",
            path.display()
        );
    }
    let sds_ca = std::fs::read(env.keystore().join("daemon/sds-ca/cert.pem"))
        .expect("the SDS CA after a restart");
    assert_eq!(
        std::fs::read(&sds_ca_pem).expect("sds-ca.pem after a restart"),
        sds_ca,
        "{what}: sds-ca.pem is the SDS CA"
    );
}

/// Every CA certificate in the keystore (DER), for verifying what a proxy was given.
fn keystore_cas(env: &Env) -> Vec<Vec<u8>> {
    walk(&env.keystore().join("ca"))
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "cert.pem"))
        .flat_map(|p| pem_certs(&std::fs::read_to_string(&p).expect("readable")))
        .collect()
}

/// A proxy fetches its certificate; returns its chain after checking it chains to a CA in `anchors`.
fn proxy_gets_its_certificate(
    env: &Env,
    token: &Token,
    anchors: &[Vec<u8>],
    what: &str,
) -> Vec<Vec<u8>> {
    let chain = pem_certs(&env.fetch_identity(token));
    webpki_verify(&chain, anchors).unwrap_or_else(|e| {
        panic!("{what}: the proxy's certificate chains to no CA expected: {e}")
    });
    chain
}

#[test]
fn a_kill_at_any_write_of_a_first_start_leaves_a_daemon_that_starts() {
    let mut steps = Vec::new();
    for at in 1.. {
        // Empty resources: the first start also writes the default Mesh and MeshIdentity.
        let env = Env::new();
        let step = match start_killed_at(&env, at) {
            Ok(daemon) => {
                // Past the last crash point: the whole first start ran.
                let log = daemon.log();
                assert!(
                    !log.contains("MESHCA_TEST_CRASH_AT: not a meshca setting"),
                    "{log}"
                );
                assert_eq!(daemon.stop().code(), Some(0));
                break;
            }
            Err(step) => step,
        };
        let what = format!("killed at crash point {at} ({step})");
        steps.push(step);
        let left = files(&env);

        let daemon = env
            .try_start_with(|_| {})
            .unwrap_or_else(|(status, log)| panic!("{what}: the restart exited {status}:\n{log}"));
        assert_kept(&env, &left, &what);
        let token = env.token("default", "web-1", &[]);
        proxy_gets_its_certificate(&env, &token, &keystore_cas(&env), &what);
        assert_eq!(daemon.stop().code(), Some(0), "{what}");
    }
    // Every write of a first start was a crash point: the default resources, the MeshIdentity's CA,
    // its MeshTrust, the revocation list, the token signing key, the SDS CA and sds-ca.pem.
    for target in [
        "resources/default.yaml",
        "/key.pem",
        "/cert.pem",
        "meshtrust/default/identity.yaml",
        "data/revoked-tokens",
        "daemon/token-signing-key.p8",
        "daemon/sds-ca/key.pem",
        "daemon/sds-ca/cert.pem",
        "data/sds-ca.pem",
    ] {
        assert!(
            steps
                .iter()
                .any(|s| s.starts_with("rename ") && s.ends_with(target)),
            "no crash point renamed {target} into place: {steps:#?}"
        );
    }
}

/// Replaces the data directory with a copy of `template`, and the Mesh with its ca-1-only version.
fn restore(env: &Env, template: &Path) {
    env.restore_data(template);
    env.write_resource("mesh.yaml", &mesh_yaml(false));
}

/// The PEM certificate and key of backend `name`'s CA.
fn backend_ca(env: &Env, name: &str) -> (Vec<u8>, Vec<u8>) {
    let dir = env.keystore().join("ca/default/backend").join(name);
    let read = |file: &str| std::fs::read(dir.join(file)).expect("the backend's CA is persisted");
    (read("cert.pem"), read("key.pem"))
}

#[test]
fn a_kill_at_any_write_of_a_rotation_keeps_the_ca_that_issued() {
    // The data directory after a first start with ca-1 only, copied afresh before every run.
    let env = Env::new();
    env.write_resource("mesh.yaml", &mesh_yaml(false));
    env.write_resource("dataplanes.yaml", DATAPLANE_WEB_1);
    assert_eq!(env.start().stop().code(), Some(0));
    let token = env.token("default", "web-1", &[]);
    let template = env.root().join("template");
    env.save_data(&template);

    // How many crash points a start from the template passes before it is ready.
    restore(&env, &template);
    let daemon = env.start_with(|cmd| {
        cmd.env(CRASH_AT_ENV, u32::MAX.to_string());
    });
    let start_points = last_point(&daemon.log());
    assert_eq!(daemon.stop().code(), Some(0));

    let mut steps = Vec::new();
    for at in start_points + 1.. {
        restore(&env, &template);
        let mut daemon = start_killed_at(&env, at)
            .unwrap_or_else(|step| panic!("killed at {at} ({step}), before the rotation"));
        // ca-1 issues before the rotation: from now on it must never change.
        let (ca1_cert, ca1_key) = backend_ca(&env, "ca-1");
        let ca1 = pem_certs(&String::from_utf8_lossy(&ca1_cert));
        proxy_gets_its_certificate(&env, &token, &ca1, "before the rotation");

        env.write_resource("mesh.yaml", &mesh_yaml(true));
        let killed = common::wait_for("the rotation to be served, or the kill", || {
            if let Some(status) = daemon.exited() {
                return Some(Some(status));
            }
            let meshes = http_get(env.admin, "/api/meshes").ok()?;
            let meshes: serde_json::Value = serde_json::from_str(&meshes.body).ok()?;
            (meshes[0]["mtls"]["enabled_backend"] == "ca-2").then_some(None)
        });
        let Some(status) = killed else {
            // Past the last crash point: the whole rotation ran.
            assert_eq!(daemon.stop().code(), Some(0));
            break;
        };
        let step = killed_at(status, &daemon.log(), at);
        let what = format!("killed at crash point {at} ({step}) of the rotation");
        steps.push(step);
        let left = files(&env);

        let daemon = env
            .try_start_with(|_| {})
            .unwrap_or_else(|(status, log)| panic!("{what}: the restart exited {status}:\n{log}"));
        assert_eq!(
            backend_ca(&env, "ca-1"),
            (ca1_cert, ca1_key),
            "{what}: ca-1, which issued, was replaced"
        );
        assert_kept(&env, &left, &what);
        proxy_gets_its_certificate(&env, &token, &keystore_cas(&env), &what);
        assert_eq!(daemon.stop().code(), Some(0), "{what}");
    }
    for target in ["backend/ca-2/key.pem", "backend/ca-2/cert.pem"] {
        assert!(
            steps
                .iter()
                .any(|s| s.starts_with("rename ") && s.ends_with(target)),
            "no crash point of the rotation renamed {target} into place: {steps:#?}"
        );
    }
}
