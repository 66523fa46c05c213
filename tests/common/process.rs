//! Processes the tests start and stop: the daemon (with its admin API) and background CLI commands.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::Value;

use super::{sigterm, strip_ansi, wait_exit, wait_for, Env, TIMEOUT};

/// A background `meshca` process, stopped (SIGTERM, then SIGKILL) on drop.
#[derive(Debug)]
pub struct Background {
    pub(super) child: Option<Child>,
    pub(super) log: PathBuf,
}

impl Background {
    /// Its output so far.
    pub fn log(&self) -> String {
        read_log(&self.log)
    }

    /// Whether it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Stops it; returns how it ended.
    pub fn stop(mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        sigterm(child.id());
        wait_exit(&mut child)
    }

    /// Stops it; returns how it ended, and its whole output.
    pub fn stop_and_log(self) -> (Option<ExitStatus>, String) {
        let log = self.log.clone();
        let status = self.stop();
        (status, read_log(&log))
    }
}

/// A process's output so far, without colours (empty if it wrote none).
fn read_log(path: &std::path::Path) -> String {
    strip_ansi(&std::fs::read_to_string(path).unwrap_or_default())
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A child already reaped has no pid of its own any more: signal only a running one.
            if matches!(child.try_wait(), Ok(None)) {
                sigterm(child.id());
            }
            let _ = wait_exit(&mut child);
        }
    }
}

/// An HTTP response from the admin API.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub body: String,
}

/// A one-shot HTTP/1.0 GET (the admin API is plain HTTP on loopback).
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<HttpResponse> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {head:?}")))?;
    Ok(HttpResponse {
        status,
        body: body.to_owned(),
    })
}

/// A running `meshca serve`, stopped with SIGTERM on drop.
#[derive(Debug)]
pub struct Daemon {
    child: Option<Child>,
    pub admin: SocketAddr,
    log: PathBuf,
}

impl Daemon {
    pub(super) fn start(
        env: &Env,
        rust_log: Option<&str>,
        configure: impl FnOnce(&mut Command),
    ) -> Daemon {
        Daemon::try_start(env, rust_log, configure).unwrap_or_else(|(status, log)| {
            panic!("meshca serve exited ({status}) before it was ready:\n{log}")
        })
    }

    /// Starts `meshca serve` and waits until `/ready` answers 200, or until it exits first: then its
    /// exit status and log.
    pub(super) fn try_start(
        env: &Env,
        rust_log: Option<&str>,
        configure: impl FnOnce(&mut Command),
    ) -> Result<Daemon, (ExitStatus, String)> {
        let n = env.runs.fetch_add(1, Ordering::Relaxed);
        let log = env.root().join(format!("daemon-{n}.log"));
        let err = std::fs::File::create(&log).expect("the temp dir is writable");
        let mut cmd = env.command(&["serve", "--config", env.cfg()]);
        if let Some(filter) = rust_log {
            cmd.env("RUST_LOG", filter);
        }
        configure(&mut cmd);
        let child = cmd
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("the meshca binary runs");
        let mut daemon = Daemon {
            child: Some(child),
            admin: env.admin,
            log,
        };
        let exited = wait_for("the daemon to answer 200 on /ready", || {
            if let Some(status) = daemon.exited() {
                return Some(Some(status));
            }
            match http_get(daemon.admin, "/ready") {
                Ok(r) if r.status == 200 => Some(None),
                _ => None,
            }
        });
        match exited {
            None => Ok(daemon),
            Some(status) => Err((status, daemon.log())),
        }
    }

    /// Whether the daemon has exited, and how.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// The daemon's stderr so far, without colours.
    pub fn log(&self) -> String {
        strip_ansi(&self.raw_log())
    }

    /// The daemon's stderr so far, exactly as written.
    pub fn raw_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("a running daemon").id()
    }

    /// The daemon's resident memory, in MiB (from `/proc`).
    pub fn rss_mib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("the daemon's /proc entry");
        let kib: u64 = status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .expect("VmRSS in /proc/<pid>/status");
        kib / 1024
    }

    /// SIGTERM, then waits for the exit (panics if it takes longer than [`TIMEOUT`]).
    pub fn stop(mut self) -> ExitStatus {
        let mut child = self.child.take().expect("a daemon is stopped once");
        sigterm(child.id());
        wait_exit(&mut child)
            .unwrap_or_else(|| panic!("meshca serve ignored SIGTERM for {TIMEOUT:?}"))
    }

    /// GET on the admin API.
    pub fn admin_get(&self, path: &str) -> HttpResponse {
        http_get(self.admin, path).unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// GET on the admin API, expecting 200 and JSON.
    pub fn admin_json(&self, path: &str) -> Value {
        let r = self.admin_get(path);
        assert_eq!(r.status, 200, "GET {path}: {}", r.body);
        serde_json::from_str(&r.body)
            .unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {}", r.body))
    }

    /// Polls `path` until `accept` returns `Some` for its JSON.
    pub fn wait_json<T>(
        &self,
        path: &str,
        what: &str,
        mut accept: impl FnMut(&Value) -> Option<T>,
    ) -> T {
        wait_for(what, || {
            let r = http_get(self.admin, path).ok()?;
            if r.status != 200 {
                return None;
            }
            let v: Value = serde_json::from_str(&r.body).ok()?;
            accept(&v)
        })
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A child already reaped has no pid of its own any more: signal only a running one.
            if matches!(child.try_wait(), Ok(None)) {
                sigterm(child.id());
            }
            let _ = wait_exit(&mut child);
        }
    }
}
