//! Helpers for end-to-end tests of the `meshca` binary: a temp dir with a settings file, CLI runs, a
//! daemon that is stopped on drop, a tiny admin HTTP client, and polling with a deadline.
//!
//! Every wait polls an observable state (a file, `/ready`, the admin JSON API, a process exit) until a
//! deadline; nothing sleeps for a fixed time hoping something happened.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

mod files;
mod process;
/// A hand-driven SDS `StreamSecrets` proxy (async; needs a multi-threaded tokio runtime).
pub mod sds_proxy;

// Re-exported for the test files; each uses a different subset.
#[allow(unused_imports)]
pub use files::{mode, pem_certs, uri_sans, walk, webpki_verify};
#[allow(unused_imports)]
pub use process::{http_get, Background, Daemon, HttpResponse};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

/// Upper bound for every wait (daemon start, applied change, process exit). Generous: the machine is
/// shared and the binary is a debug build.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// Interval between two looks at a polled state.
const POLL: Duration = Duration::from_millis(25);

/// The binary under test.
pub const MESHCA: &str = env!("CARGO_BIN_EXE_meshca");

/// A Mesh `default` with a builtin CA backend `ca-1` (legacy mTLS).
pub const MESH_BUILTIN: &str = "\
type: Mesh
name: default
meshServices:
  mode: Exclusive
mtls:
  enabledBackend: ca-1
  backends:
    - name: ca-1
      type: builtin
      dpCert: {rotation: {expiration: 1d}}
      conf: {caCert: {expiration: 10y}}
";

/// A Dataplane `default/web-1` labelled `app: web`, serving `kuma.io/service: web`.
pub const DATAPLANE_WEB_1: &str = "\
type: Dataplane
mesh: default
name: web-1
labels: {app: web}
networking:
  address: 10.0.0.1
  inbound: [{port: 8080, tags: {kuma.io/service: web}}]
";

/// Polls `probe` until it returns `Some`, or panics after [`TIMEOUT`] naming `what`.
pub fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {TIMEOUT:?} waiting for {what}"
        );
        std::thread::sleep(POLL);
    }
}

/// A free loopback address for the daemon to take. Its port comes from below the kernel's ephemeral
/// range and is never handed out twice in one test binary, so neither a parallel test's `bind(…:0)`
/// nor an outgoing connection's source port takes it before the daemon binds it.
pub fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], meshca_testpg::free_port()))
}

/// Removes ANSI colour sequences (tracing colours its text output).
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Sends SIGTERM to `pid` (through `kill`, so tests need no unsafe code).
pub fn sigterm(pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
}

/// Waits for `child` to exit; after [`TIMEOUT`], kills it and returns `None`.
pub fn wait_exit(child: &mut Child) -> Option<ExitStatus> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// A finished CLI run.
#[derive(Debug)]
pub struct Run {
    /// The command line, for messages.
    pub args: Vec<String>,
    pub status: ExitStatus,
    pub stdout: String,
    /// Without colour sequences.
    pub stderr: String,
}

impl Run {
    /// The exit code (`None` when killed by a signal).
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Panics with the whole output unless the command exited 0.
    pub fn ok(self) -> Run {
        assert!(self.status.success(), "meshca failed: {self}");
        self
    }

    /// The stdout parsed as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self}"))
    }
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "`meshca {}` exited {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.args.join(" "),
            self.status.code(),
            self.stdout,
            self.stderr
        )
    }
}

/// A proxy token minted by `meshca token`.
#[derive(Debug, Clone)]
pub struct Token {
    /// The JWT.
    pub token: String,
    /// Its id (for `--revoke`).
    pub id: String,
    /// A file holding it (for `--token-file`).
    pub file: PathBuf,
}

/// A test's world: a temp dir with `data/`, `resources/` and a settings file with free ports.
#[derive(Debug)]
pub struct Env {
    pub dir: TempDir,
    pub config: PathBuf,
    pub data: PathBuf,
    pub resources: PathBuf,
    pub admin: SocketAddr,
    pub sds_tcp: SocketAddr,
    runs: AtomicUsize,
    /// Variables every command gets (e.g. `SOFTHSM2_CONF` for a test token).
    vars: Vec<(&'static str, std::ffi::OsString)>,
}

impl Env {
    /// A fresh environment with an empty resources directory (the data directory is not created).
    pub fn new() -> Env {
        Env::with_settings("")
    }

    /// A fresh environment whose settings file also holds `extra` (YAML lines).
    pub fn with_settings(extra: &str) -> Env {
        let dir = tempfile::tempdir().expect("a temp dir can be created");
        let root = dir.path().to_path_buf();
        let data = root.join("data");
        let resources = root.join("resources");
        std::fs::create_dir(&resources).expect("the temp dir is writable");
        let admin = free_addr();
        let sds_tcp = free_addr();
        let config = root.join("meshca.yaml");
        let settings = format!(
            "dataDir: {data}\nresources: {resources}\nsds: {{listen: [\"unix://{data}/sds.sock\", \"{sds_tcp}\"]}}\nadmin: {{listen: \"{admin}\"}}\n{extra}",
            data = data.display(),
            resources = resources.display(),
        );
        std::fs::write(&config, settings).expect("the temp dir is writable");
        Env {
            dir,
            config,
            data,
            resources,
            admin,
            sds_tcp,
            runs: AtomicUsize::new(0),
            vars: Vec::new(),
        }
    }

    /// The same environment, with `vars` set for every command it runs.
    pub fn with_vars(
        mut self,
        vars: impl IntoIterator<Item = (&'static str, std::ffi::OsString)>,
    ) -> Env {
        self.vars.extend(vars);
        self
    }

    /// The temp dir.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// The settings file as an argument.
    pub fn cfg(&self) -> &str {
        self.config
            .to_str()
            .expect("temp dir paths are UTF-8 on this machine")
    }

    /// The keystore directory.
    pub fn keystore(&self) -> PathBuf {
        self.data.join("keystore")
    }

    /// The unix SDS socket as a `--server` address.
    pub fn sds_unix(&self) -> String {
        format!("unix://{}", self.data.join("sds.sock").display())
    }

    /// Writes a resource file atomically (written beside the directory, then renamed in), so the
    /// daemon's watcher never reads half a file.
    pub fn write_resource(&self, name: &str, yaml: &str) {
        let staging = self.root().join(format!(".staging-{name}"));
        std::fs::write(&staging, yaml).expect("the temp dir is writable");
        std::fs::rename(&staging, self.resources.join(name)).expect("the temp dir is writable");
    }

    /// Copies the data directory to `template` (`cp -a`: modes and owners kept), to start later runs
    /// from the same state.
    pub fn save_data(&self, template: &Path) {
        copy_dir(&self.data, template);
    }

    /// Replaces the data directory with a copy of `template` (see [`Env::save_data`]).
    pub fn restore_data(&self, template: &Path) {
        if self.data.exists() {
            std::fs::remove_dir_all(&self.data).expect("the data directory can be removed");
        }
        copy_dir(template, &self.data);
    }

    /// An agent token for host `name`, minted with the daemon's key (`meshca token --type agent`).
    pub fn agent_token(&self, name: &str) -> String {
        let run = self
            .cli(&[
                "token",
                "--config",
                self.cfg(),
                "--type",
                "agent",
                "--name",
                name,
                "--output",
                "json",
            ])
            .ok();
        run.json()["token"]
            .as_str()
            .expect("`token` in the JSON")
            .to_owned()
    }

    /// A `meshca` command with a clean environment (no `MESHCA_*` from the caller, no colours).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = self.command_of(MESHCA);
        cmd.args(args);
        cmd
    }

    /// `meshca ARGS` that starts only once a line is written to the FIFO `gate`: a shell waits
    /// reading it, then becomes meshca. The environment is [`Env::command`]'s.
    pub fn gated_command(&self, gate: &Path, args: &[&str]) -> Command {
        let mut cmd = self.command_of("sh");
        cmd.args(["-c", "read -r _ < \"$0\" && exec \"$@\""])
            .arg(gate)
            .arg(MESHCA)
            .args(args);
        cmd
    }

    /// `program` in the temp dir with a clean environment (no `MESHCA_*` from the caller, no colours).
    fn command_of(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.current_dir(self.root())
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null());
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("MESHCA_") {
                cmd.env_remove(k);
            }
        }
        cmd.envs(self.vars.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// Runs `meshca ARGS` to completion (killed after [`TIMEOUT`]) and captures its output.
    pub fn cli(&self, args: &[&str]) -> Run {
        self.cli_with(self.command(args), args)
    }

    /// Runs a prepared command to completion; output goes through files so a chatty child never blocks.
    pub fn cli_with(&self, mut cmd: Command, args: &[&str]) -> Run {
        let n = self.runs.fetch_add(1, Ordering::Relaxed);
        let out_path = self.root().join(format!("run-{n}.out"));
        let err_path = self.root().join(format!("run-{n}.err"));
        let out = std::fs::File::create(&out_path).expect("the temp dir is writable");
        let err = std::fs::File::create(&err_path).expect("the temp dir is writable");
        let mut child = cmd
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("the meshca binary runs");
        let status = wait_exit(&mut child).unwrap_or_else(|| {
            panic!(
                "`meshca {}` did not exit within {TIMEOUT:?}",
                args.join(" ")
            )
        });
        Run {
            args: args.iter().map(|s| s.to_string()).collect(),
            status,
            stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
            stderr: strip_ansi(&std::fs::read_to_string(&err_path).unwrap_or_default()),
        }
    }

    /// Mints a token with `meshca token --output json`; `extra` adds flags such as `--label app=web`.
    pub fn token(&self, mesh: &str, name: &str, extra: &[&str]) -> Token {
        let mut args = vec![
            "token",
            "--config",
            self.cfg(),
            "--mesh",
            mesh,
            "--name",
            name,
            "--output",
            "json",
        ];
        args.extend_from_slice(extra);
        let run = self.cli(&args).ok();
        let v = run.json();
        let token = v["token"].as_str().expect("`token` in the JSON").to_owned();
        let id = v["id"].as_str().expect("`id` in the JSON").to_owned();
        let n = self.runs.fetch_add(1, Ordering::Relaxed);
        let file = self.root().join(format!("{mesh}.{name}-{n}.token"));
        std::fs::write(&file, &token).expect("the temp dir is writable");
        Token { token, id, file }
    }

    /// `meshca sds fetch --output json` over the default (unix) listener.
    pub fn fetch(&self, token: &Token, names: &[&str]) -> Run {
        let file = token.file.to_str().expect("UTF-8 path");
        let mut args = vec![
            "sds",
            "fetch",
            "--config",
            self.cfg(),
            "--token-file",
            file,
            "--output",
            "json",
        ];
        args.extend_from_slice(names);
        self.cli(&args)
    }

    /// Fetches `names`, asserts success, and returns the secrets by name.
    pub fn fetch_ok(&self, token: &Token, names: &[&str]) -> serde_json::Map<String, Value> {
        let run = self.fetch(token, names).ok();
        let list = run.json();
        let list = list
            .as_array()
            .unwrap_or_else(|| panic!("sds fetch printed no list: {run}"));
        list.iter()
            .map(|s| {
                let name = s["name"]
                    .as_str()
                    .expect("every secret has a name")
                    .to_owned();
                (name, s.clone())
            })
            .collect()
    }

    /// Fetches `default` and returns its certificate chain PEM.
    pub fn fetch_identity(&self, token: &Token) -> String {
        let secrets = self.fetch_ok(token, &["default"]);
        secrets["default"]["tls_certificate"]["certificate_chain_pem"]
            .as_str()
            .expect("`default` is a tls_certificate with a chain")
            .to_owned()
    }

    /// `meshca inspect --output json` of PEM text (written to a file first).
    pub fn inspect(&self, pem: &str) -> Vec<Value> {
        let n = self.runs.fetch_add(1, Ordering::Relaxed);
        let path = self.root().join(format!("inspect-{n}.pem"));
        std::fs::write(&path, pem).expect("the temp dir is writable");
        let run = self
            .cli(&["inspect", path.to_str().expect("UTF-8"), "--output", "json"])
            .ok();
        run.json()
            .as_array()
            .unwrap_or_else(|| panic!("inspect printed no list: {run}"))
            .clone()
    }

    /// Starts `meshca serve` and waits until `/ready` answers 200.
    pub fn start(&self) -> Daemon {
        Daemon::start(self, None, |_| {})
    }

    /// Starts `meshca serve` with its command adjusted by `configure`, and waits until it is ready or
    /// has exited (then its exit status and log).
    pub fn try_start_with(
        &self,
        configure: impl FnOnce(&mut Command),
    ) -> Result<Daemon, (ExitStatus, String)> {
        Daemon::try_start(self, None, configure)
    }

    /// Starts `meshca serve` with `RUST_LOG` set, and waits until ready.
    pub fn start_logging(&self, rust_log: &str) -> Daemon {
        Daemon::start(self, Some(rust_log), |_| {})
    }

    /// Starts `meshca serve` with its command adjusted by `configure` (e.g. an environment variable),
    /// and waits until ready.
    pub fn start_with(&self, configure: impl FnOnce(&mut Command)) -> Daemon {
        Daemon::start(self, None, configure)
    }

    /// Starts `meshca issue --watch` over the unix socket with `token`: a workload holding an SDS stream
    /// open. Returns once it wrote its first certificate, with that certificate's serial.
    pub fn hold_stream(&self, token: &Token) -> (Background, String) {
        let out = self.root().join(format!("workload-{}", token.id));
        let mut watch = self.spawn(&[
            "issue",
            "--config",
            self.cfg(),
            "--server",
            &self.sds_unix(),
            "--token-file",
            token.file.to_str().expect("UTF-8"),
            "--out",
            out.to_str().expect("UTF-8"),
            "--watch",
        ]);
        wait_for("issue --watch to write its files", || {
            if let Some(status) = watch.exited() {
                panic!("issue --watch ended ({status}): {}", watch.log());
            }
            out.join("svid.pem").is_file().then_some(())
        });
        let svid = std::fs::read_to_string(out.join("svid.pem")).expect("svid.pem was written");
        let serial = self.inspect(&svid)[0]["serial"]
            .as_str()
            .expect("inspect prints a serial")
            .to_owned();
        (watch, serial)
    }

    /// Starts a long-running `meshca ARGS` (e.g. `issue --watch`), killed on drop.
    pub fn spawn(&self, args: &[&str]) -> Background {
        let n = self.runs.fetch_add(1, Ordering::Relaxed);
        let log = self.root().join(format!("bg-{n}.log"));
        let f = std::fs::File::create(&log).expect("the temp dir is writable");
        let f2 = f.try_clone().expect("a file handle can be duplicated");
        let child = self
            .command(args)
            .stdout(f)
            .stderr(f2)
            .spawn()
            .expect("the meshca binary runs");
        Background {
            child: Some(child),
            log,
        }
    }
}

/// This test process's effective uid, as `/proc` says (the `meshca` it runs has the same).
pub fn my_uid() -> String {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .expect("an effective uid")
        .to_owned()
}

/// `cp -a from to`.
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
