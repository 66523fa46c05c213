//! The data directory against mistakes and hostile neighbours: token validity is capped, the directory is
//! private and locked by one daemon, concurrent creators agree on one key, and the revocation list fails
//! closed.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Child;

use common::{mode, pem_certs, wait_exit, wait_for, Env, DATAPLANE_WEB_1, MESH_BUILTIN};

fn env_with_web_1() -> Env {
    let env = Env::new();
    env.write_resource("mesh.yaml", MESH_BUILTIN);
    env.write_resource("dataplanes.yaml", DATAPLANE_WEB_1);
    env
}

/// A `meshca` process started without waiting, its stdout and stderr in files.
struct Spawned {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Spawned {
    fn start(env: &Env, name: &str, mut command: std::process::Command) -> Spawned {
        let stdout = env.root().join(format!("{name}.out"));
        let stderr = env.root().join(format!("{name}.err"));
        let child = command
            .stdout(std::fs::File::create(&stdout).expect("the temp dir is writable"))
            .stderr(std::fs::File::create(&stderr).expect("the temp dir is writable"))
            .spawn()
            .expect("the meshca binary runs");
        Spawned {
            child,
            stdout,
            stderr,
        }
    }

    /// Waits for the exit; panics unless it succeeded. Returns stdout.
    fn success(mut self) -> String {
        let status = wait_exit(&mut self.child).expect("meshca exits");
        let stderr = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        assert!(status.success(), "meshca failed ({status}): {stderr}");
        std::fs::read_to_string(&self.stdout).expect("stdout was captured")
    }

    fn stderr(&self) -> String {
        common::strip_ansi(&std::fs::read_to_string(&self.stderr).unwrap_or_default())
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            common::sigterm(self.child.id());
            let _ = wait_exit(&mut self.child);
        }
    }
}

#[test]
fn valid_for_above_the_configured_maximum_is_refused() {
    let env = Env::new();
    let run = env.cli(&[
        "token",
        "--config",
        env.cfg(),
        "--mesh",
        "default",
        "--name",
        "web-1",
        "--valid-for",
        "400d",
    ]);
    assert_eq!(run.code(), Some(2), "{run}");
    assert!(
        run.stderr.contains("--valid-for 400d") && run.stderr.contains("tokens.maxValidFor (365d)"),
        "names the asked validity and the maximum: {run}"
    );
    assert!(run.stdout.is_empty(), "no token was printed: {run}");
    env.token("default", "web-1", &["--valid-for", "365d"]);

    let env = Env::with_settings("tokens: {maxValidFor: 1h}\n");
    let run = env.cli(&[
        "token",
        "--config",
        env.cfg(),
        "--mesh",
        "default",
        "--name",
        "web-1",
        "--valid-for",
        "61m",
    ]);
    assert_eq!(run.code(), Some(2), "{run}");
    assert!(
        run.stderr.contains("--valid-for 1h1m") && run.stderr.contains("tokens.maxValidFor (1h)"),
        "{run}"
    );
    env.token("default", "web-1", &["--valid-for", "1h"]);
}

#[test]
fn the_data_directory_is_created_private() {
    let env = env_with_web_1();
    let daemon = env.start();
    assert_eq!(mode(&env.data), 0o700, "a new data directory is 0700");
    assert_eq!(daemon.stop().code(), Some(0));
}

#[test]
fn a_data_directory_others_can_write_is_refused() {
    let env = env_with_web_1();
    std::fs::create_dir(&env.data).expect("the temp dir is writable");
    std::fs::set_permissions(&env.data, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let data = env.data.display().to_string();
    let token_args = [
        "token",
        "--config",
        env.cfg(),
        "--mesh",
        "default",
        "--name",
        "web-1",
    ];
    for args in [&["serve", "--config", env.cfg()][..], &token_args[..]] {
        let run = env.cli(args);
        assert_eq!(run.code(), Some(1), "{run}");
        assert!(
            run.stderr
                .contains(&format!("dataDir: {data} has mode 0777"))
                && run.stderr.contains(&format!("chmod 700 {data}")),
            "names the directory, its mode and the fix: {run}"
        );
    }
    let left: Vec<_> = std::fs::read_dir(&env.data)
        .expect("readable")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(left.is_empty(), "nothing was written into it: {left:?}");
    assert_eq!(
        mode(&env.data),
        0o777,
        "its mode is the operator's to change"
    );

    std::fs::set_permissions(&env.data, std::fs::Permissions::from_mode(0o750)).expect("chmod");
    let daemon = env.start();
    assert_eq!(
        daemon.stop().code(),
        Some(0),
        "0750 (group search) is accepted"
    );
}

#[test]
fn a_second_daemon_on_a_locked_data_directory_exits_1() {
    let env = env_with_web_1();
    let _daemon = env.start();
    let token = env.token("default", "web-1", &[]);
    let run = env.cli(&["serve", "--config", env.cfg()]);
    assert_eq!(run.code(), Some(1), "{run}");
    assert!(
        run.stderr.contains(&format!(
            "is already running on the data directory {}",
            env.data.display()
        )) && run.stderr.contains("(pid "),
        "names the data directory and the other daemon's pid: {run}"
    );
    // The refused daemon touched nothing the first one serves (its socket, its keys).
    env.fetch_identity(&token);
}

/// Processes held at a gate until [`StartGate::release`], which lets every one of them go at the same
/// instant: each waits (in a shell, before meshca runs) to read a line from a FIFO of its own.
struct StartGate {
    fifos: Vec<PathBuf>,
}

impl StartGate {
    fn new(env: &Env, count: usize) -> StartGate {
        let fifos: Vec<PathBuf> = (0..count)
            .map(|i| env.root().join(format!("gate-{i}")))
            .collect();
        for fifo in &fifos {
            mkfifo(fifo);
        }
        StartGate { fifos }
    }

    /// Starts `meshca ARGS` as process `i`, held at the gate.
    fn spawn(&self, env: &Env, i: usize, name: &str, args: &[&str]) -> Spawned {
        Spawned::start(env, name, env.gated_command(&self.fifos[i], args))
    }

    /// Waits until every process waits at its FIFO, then releases them all at once.
    fn release(self) {
        use std::io::Write;
        let (tx, rx) = std::sync::mpsc::channel();
        let fifos = self.fifos.clone();
        // Opening a FIFO for writing waits for its reader; a thread keeps the wait bounded.
        std::thread::spawn(move || {
            let opened: Vec<std::fs::File> = fifos
                .iter()
                .map(|f| {
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(f)
                        .expect("open FIFO")
                })
                .collect();
            let _ = tx.send(opened);
        });
        let mut writers = rx
            .recv_timeout(common::TIMEOUT)
            .expect("every process waits at its gate");
        for w in &mut writers {
            w.write_all(b"go\n").expect("write to the gate");
        }
        drop(writers);
    }
}

#[test]
fn two_daemons_started_together_leave_one_running() {
    let env = env_with_web_1();
    let gate = StartGate::new(&env, 2);
    let mut daemons = [
        gate.spawn(&env, 0, "serve-a", &["serve", "--config", env.cfg()]),
        gate.spawn(&env, 1, "serve-b", &["serve", "--config", env.cfg()]),
    ];
    gate.release();
    let (loser, status) = wait_for("one of the two daemons to exit", || {
        daemons
            .iter_mut()
            .enumerate()
            .find_map(|(i, d)| match d.child.try_wait() {
                Ok(Some(status)) => Some((i, status)),
                _ => None,
            })
    });
    let stderr = daemons[loser].stderr();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("is already running on the data directory"),
        "the loser stopped at the lock, before creating anything: {stderr}"
    );
    let winner = &mut daemons[1 - loser];
    wait_for("the other daemon to be ready", || {
        assert!(
            matches!(winner.child.try_wait(), Ok(None)),
            "the winner exited too: {}",
            winner.stderr()
        );
        common::http_get(env.admin, "/ready")
            .ok()
            .filter(|r| r.status == 200)
    });
}

#[test]
fn concurrent_first_users_of_an_empty_data_directory_agree_on_keys_and_cas() {
    // A daemon, `meshca token` and `meshca issue --mesh` started together on an empty data directory
    // each generated the token key and the mesh's CA: tokens were refused, CAs differed.
    let env = env_with_web_1();
    const TOKENS: usize = 4;
    const ISSUES: usize = 3;
    let gate = StartGate::new(&env, 1 + TOKENS + ISSUES);
    let mut daemon = gate.spawn(&env, 0, "serve", &["serve", "--config", env.cfg()]);
    let tokens: Vec<Spawned> = (0..TOKENS)
        .map(|i| {
            let args = [
                "token",
                "--config",
                env.cfg(),
                "--mesh",
                "default",
                "--name",
                "web-1",
                "--output",
                "json",
            ];
            gate.spawn(&env, 1 + i, &format!("token-{i}"), &args)
        })
        .collect();
    let outs: Vec<PathBuf> = (0..ISSUES)
        .map(|i| env.root().join(format!("out-{i}")))
        .collect();
    let issues: Vec<Spawned> = outs
        .iter()
        .enumerate()
        .map(|(i, out)| {
            let args = [
                "issue",
                "--config",
                env.cfg(),
                "--out",
                out.to_str().expect("UTF-8"),
                "--mesh",
                "default",
                "--name",
                "web-1",
            ];
            gate.spawn(&env, 1 + TOKENS + i, &format!("issue-{i}"), &args)
        })
        .collect();
    gate.release();

    let tokens: Vec<common::Token> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, spawned)| {
            let json: serde_json::Value =
                serde_json::from_str(&spawned.success()).expect("token --output json");
            let token = json["token"].as_str().expect("a token").to_owned();
            let file = env.root().join(format!("token-{i}.jwt"));
            std::fs::write(&file, &token).expect("the temp dir is writable");
            common::Token {
                id: json["id"].as_str().expect("an id").to_owned(),
                token,
                file,
            }
        })
        .collect();
    for spawned in issues {
        spawned.success();
    }
    wait_for("the daemon to be ready", || {
        assert!(
            matches!(daemon.child.try_wait(), Ok(None)),
            "the daemon exited: {}",
            daemon.stderr()
        );
        common::http_get(env.admin, "/ready")
            .ok()
            .filter(|r| r.status == 200)
    });
    let persisted =
        std::fs::read_to_string(env.keystore().join("ca/default/backend/ca-1/cert.pem"))
            .expect("the mesh CA was persisted");
    for out in &outs {
        let bundle = std::fs::read_to_string(out.join("bundle.pem")).expect("bundle.pem");
        assert!(
            pem_certs(&bundle) == pem_certs(&persisted),
            "{} was issued by another CA than the persisted one",
            out.display()
        );
    }
    for token in &tokens {
        let run = env.fetch(token, &["mesh_ca:secret:default"]);
        assert_eq!(
            run.code(),
            Some(0),
            "the daemon refused a CLI-minted token: {run}"
        );
        let secrets = run.json();
        let served = secrets[0]["validation_context"]["trusted_ca_pem"]
            .as_str()
            .expect("mesh_ca:secret:default is a plain trusted_ca");
        assert!(
            pem_certs(served) == pem_certs(&persisted),
            "the daemon serves another CA than the persisted one"
        );
    }
}

/// Polls until a fetch with `token` is refused, and returns that refusal.
fn wait_refused(env: &Env, token: &common::Token) -> common::Run {
    wait_for("fetches with the token to be refused", || {
        let run = env.fetch(token, &["default"]);
        (run.code() != Some(0)).then_some(run)
    })
}

fn assert_revoked(run: &common::Run) {
    assert!(
        run.stderr.contains("Unauthenticated") && run.stderr.contains("revoked"),
        "{run}"
    );
    assert!(!run.stdout.contains("BEGIN CERTIFICATE"), "{run}");
}

fn revoke(env: &Env, id: &str) -> common::Run {
    env.cli(&["token", "--config", env.cfg(), "--revoke", id])
}

#[test]
fn revoking_into_a_list_without_a_final_newline_keeps_both_ids() {
    let env = env_with_web_1();
    let first = env.token("default", "web-1", &[]);
    let second = env.token("default", "web-1", &[]);
    let list = env.data.join("revoked-tokens");
    // Edited by hand, saved without a final newline.
    std::fs::write(&list, format!("# by hand\n{}", first.id)).expect("writable");
    let daemon = env.start();
    assert_revoked(&env.fetch(&first, &["default"]));
    env.fetch_identity(&second);

    let run = revoke(&env, &second.id).ok();
    assert!(run.stderr.contains("revoked token"), "{run}");
    let text = std::fs::read_to_string(&list).expect("the list exists");
    let parsed = meshca_auth::RevocationList::parse(&text).expect("the list stays valid");
    assert!(
        parsed.contains(&first.id) && parsed.contains(&second.id),
        "{text}"
    );
    assert!(
        text.starts_with("# by hand\n"),
        "the operator's lines are kept: {text}"
    );
    assert_revoked(&wait_refused(&env, &second));
    assert_revoked(&env.fetch(&first, &["default"]));

    let again = revoke(&env, &second.id).ok();
    assert!(again.stderr.contains("already revoked"), "{again}");
    assert_eq!(
        std::fs::read_to_string(&list).expect("the list exists"),
        text
    );
    drop(daemon);

    // Nothing was left behind by the rewrite but the list and its writers' lock.
    let mut names: Vec<String> = std::fs::read_dir(&env.data)
        .expect("readable")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("revoked"))
        .collect();
    names.sort();
    assert_eq!(names, ["revoked-tokens", "revoked-tokens.lock"]);
}

#[test]
fn revoking_into_an_invalid_list_is_refused_naming_the_line() {
    let env = env_with_web_1();
    let token = env.token("default", "web-1", &[]);
    let list = env.data.join("revoked-tokens");
    let invalid = format!("{}\n{}\n", "f".repeat(32), &token.id[..31]);
    std::fs::write(&list, &invalid).expect("writable");
    let run = revoke(&env, &token.id);
    assert_eq!(run.code(), Some(1), "{run}");
    assert!(
        run.stderr.contains(&list.display().to_string()) && run.stderr.contains("line 2"),
        "names the file and the line: {run}"
    );
    assert!(!run.stderr.contains("revoked token"), "{run}");
    assert_eq!(std::fs::read_to_string(&list).expect("exists"), invalid);
}

#[test]
fn deleting_the_list_while_the_daemon_runs_keeps_tokens_revoked() {
    let env = env_with_web_1();
    let daemon = env.start();
    let list = env.data.join("revoked-tokens");
    let header =
        std::fs::read_to_string(&list).expect("the daemon created the list at first start");
    assert!(
        header.starts_with("# meshca token revocation list"),
        "with a header explaining it: {header}"
    );
    let token = env.token("default", "web-1", &[]);
    let (mut watch, _) = env.hold_stream(&token);
    revoke(&env, &token.id).ok();
    assert_revoked(&wait_refused(&env, &token));
    wait_for("the revoked stream to be closed", || watch.exited());

    std::fs::remove_file(&list).expect("the list can be removed");
    // The daemon notices (its watcher), logs and counts the failed reload, and keeps the list it had.
    wait_for("the failed reload to be counted", || {
        let metrics = daemon.admin_get("/metrics").body;
        let failures: u64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix("meshca_revocation_reload_failures_total "))?
            .trim()
            .parse()
            .ok()?;
        (failures >= 1).then_some(())
    });
    assert!(
        daemon.log().contains("revocation list not reloaded")
            && daemon.log().contains("is missing"),
        "{}",
        daemon.log()
    );
    assert_revoked(&env.fetch(&token, &["default"]));
    let (mut watch, _) = {
        let other = env.token("default", "web-1", &[]);
        env.hold_stream(&other)
    };
    assert!(watch.exited().is_none(), "other tokens keep working");
    let run = env.cli(&[
        "issue",
        "--config",
        env.cfg(),
        "--server",
        &env.sds_unix(),
        "--token-file",
        token.file.to_str().expect("UTF-8"),
        "--out",
        env.root().join("revoked-out").to_str().expect("UTF-8"),
    ]);
    assert_ne!(
        run.code(),
        Some(0),
        "a new stream with the revoked token is refused: {run}"
    );
    assert!(run.stderr.contains("revoked"), "{run}");

    // Revoking while the list is missing would write a list with only the new id: refused.
    let run = revoke(&env, &"e".repeat(32));
    assert_eq!(run.code(), Some(1), "{run}");
    assert!(run.stderr.contains("is missing"), "{run}");
    assert!(!list.exists());
}

#[test]
fn a_start_without_the_list_after_it_existed_is_refused() {
    let env = env_with_web_1();
    let token = env.token("default", "web-1", &[]);
    let list = env.data.join("revoked-tokens");
    assert!(
        list.is_file(),
        "minting the first token created the list with the key"
    );
    std::fs::remove_file(&list).expect("the list can be removed");

    let run = env.cli(&["serve", "--config", env.cfg()]);
    assert_eq!(run.code(), Some(1), "{run}");
    assert!(
        run.stderr.contains(&format!(
            "the token revocation list {} is missing",
            list.display()
        )) && run.stderr.contains(&format!("touch {}", list.display())),
        "says what is missing and how to start anyway on purpose: {run}"
    );
    assert!(!list.exists(), "the refused start did not recreate it");

    std::fs::write(&list, "").expect("writable");
    let _daemon = env.start();
    env.fetch_identity(&token);
}

/// Makes a FIFO at `path` (nothing ever writes to it).
fn mkfifo(path: &std::path::Path) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(made.success(), "mkfifo {}", path.display());
}

/// The daemon's count of revocation lists it could not read.
fn revocation_reload_failures(daemon: &common::Daemon) -> Option<u64> {
    daemon
        .admin_get("/metrics")
        .body
        .lines()
        .find_map(|l| l.strip_prefix("meshca_revocation_reload_failures_total "))?
        .trim()
        .parse()
        .ok()
}

/// Whatever is put in the revocation list's place, the running daemon reads nothing that blocks or
/// never ends: it refuses the file, keeps the list it had, and keeps serving and stopping.
#[test]
fn a_fifo_or_a_device_in_place_of_the_revocation_list_is_refused_without_stalling() {
    let env = env_with_web_1();
    let mut daemon = env.start();
    let token = env.token("default", "web-1", &[]);
    env.fetch_identity(&token);
    let list = env.data.join("revoked-tokens");
    let saved = std::fs::read_to_string(&list).expect("the list exists");
    for (n, replace) in ["fifo", "/dev/zero"].into_iter().enumerate() {
        let staging = env.root().join(format!("staged-list-{n}"));
        match replace {
            "fifo" => mkfifo(&staging),
            device => std::os::unix::fs::symlink(device, &staging).expect("symlink"),
        }
        std::fs::rename(&staging, &list).expect("the data directory is writable");
        wait_for("the refused list to be counted", || {
            (revocation_reload_failures(&daemon)? > n as u64).then_some(())
        });
        let health = daemon.admin_get("/healthz");
        assert_eq!(health.status, 200, "{replace}: {}", health.body);
        env.fetch_identity(&token);
        let rss = daemon.rss_mib();
        assert!(rss < 200, "{replace}: RSS {rss} MiB");
        let log = daemon.log();
        let expected = match replace {
            "fifo" => "a FIFO",
            _ => "a device",
        };
        assert!(
            log.contains("revocation list not reloaded") && log.contains(expected),
            "{replace}: the log says why: {log}"
        );
    }
    std::fs::remove_file(&list).expect("removable");
    std::fs::write(&list, saved).expect("writable");
    let status = {
        common::sigterm(daemon.pid());
        wait_for("the daemon to stop on SIGTERM", || daemon.exited())
    };
    assert!(status.success(), "{status}");
}

/// Every file meshca is pointed at is opened without blocking and refused unless it is a regular
/// file: a FIFO named by a setting stops the start at once, naming the setting or the file.
#[test]
fn a_fifo_named_by_a_setting_stops_the_start_naming_it() {
    let env = env_with_web_1();
    let fifo = env.root().join("fifo");
    mkfifo(&fifo);
    let fifo_path = fifo.to_str().expect("UTF-8");

    for command in [
        &["serve", "--config"][..],
        &["token", "--mesh", "default", "--name", "web-1", "--config"],
    ] {
        let mut args = command.to_vec();
        args.push(fifo_path);
        let run = env.cli(&args);
        assert_ne!(run.code(), Some(0), "{run}");
        assert!(
            run.stderr.contains(fifo_path) && run.stderr.contains("a FIFO"),
            "names the settings file and what it is: {run}"
        );
    }

    let key = env.root().join("key.pem");
    std::fs::write(&key, "").expect("writable");
    let cases = [
        (
            format!("tls: {{certFile: {fifo_path}, keyFile: {}}}, ", key.display()),
            "sds.tls.certFile",
        ),
        (
            format!(
                "keystore: {{type: postgres, postgres: {{url: \"postgres://meshca@127.0.0.1:9/meshca\", \
                 passwordFile: {fifo_path}, keyEncryptionKeyFile: {}}}}}\n",
                key.display()
            ),
            "keystore.postgres.passwordFile",
        ),
        (
            format!(
                "keystore: {{type: postgres, postgres: {{url: \"postgres://meshca@127.0.0.1:9/meshca\", \
                 caFile: {fifo_path}, keyEncryptionKeyFile: {}}}}}\n",
                key.display()
            ),
            "keystore.postgres.caFile",
        ),
        (
            format!(
                "keystore: {{pkcs11: {{module: /usr/lib/softhsm/libsofthsm2.so, token: meshca, \
                 pinFile: {fifo_path}}}}}\n"
            ),
            "keystore.pkcs11.pinFile",
        ),
    ];
    for (n, (settings, setting)) in cases.iter().enumerate() {
        let config = env.root().join(format!("fifo-{n}.yaml"));
        let base = std::fs::read_to_string(&env.config).expect("readable");
        let text = match settings.strip_prefix("tls: ") {
            Some(_) => base.replace("sds: {", &format!("sds: {{{settings}")),
            None => format!("{base}{settings}"),
        };
        std::fs::write(&config, text).expect("writable");
        let run = env.cli(&["serve", "--config", config.to_str().expect("UTF-8")]);
        assert_ne!(run.code(), Some(0), "{setting}: {run}");
        assert!(
            run.stderr.contains(setting) && run.stderr.contains("a FIFO"),
            "names {setting} and what it is: {run}"
        );
    }
}
