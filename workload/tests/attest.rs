//! Attestation of real callers: this test process, and Python clients that connect from child
//! processes (as another user where the tests run as root, which CI does).

use std::io::{BufRead, BufReader, Read};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use meshca_workload::attest::{
    attest, parse_selector, still_same, AttestError, AttestLimits, Caller, GoneReason, PeerProcess,
    Selector,
};

/// The system's interpreter, readable by every user (a per-user install may not be).
const PYTHON: &str = "/usr/bin/python3";

fn sel(text: &str) -> Selector {
    parse_selector(text).unwrap_or_else(|error| panic!("{text:?}: {error}"))
}

/// An abstract socket name no other test uses.
fn fresh_name() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let next = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("meshca-attest-test-{}-{next}", std::process::id())
}

/// A listener on a fresh abstract address, which every user may connect to.
fn listener() -> (UnixListener, String) {
    let name = fresh_name();
    let address = SocketAddr::from_abstract_name(&name).expect("an abstract address");
    let listener = UnixListener::bind_addr(&address).expect("binding the listener");
    (listener, name)
}

/// A Python child that runs `script` (with `connect(name)` defined) through `prefix`.
fn python(prefix: &[&str], script: &str, args: &[&str]) -> Child {
    let program = format!(
        "import socket, sys\n\
         def connect(name):\n    s = socket.socket(socket.AF_UNIX)\n    s.connect('\\0' + name)\n    return s\n\
         {script}"
    );
    let mut command = Command::new(prefix.first().copied().unwrap_or(PYTHON));
    command.args(prefix.iter().skip(1));
    if !prefix.is_empty() {
        command.arg(PYTHON);
    }
    command
        .arg("-c")
        .arg(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("spawning {PYTHON} (through {prefix:?}): {error}"))
}

/// A child that connects to the listener and stays until its stdin closes.
fn connecting_child(prefix: &[&str], name: &str) -> Child {
    python(
        prefix,
        "s = connect(sys.argv[1])\nsys.stdin.read()\n",
        &[name],
    )
}

fn status_ids(key: &str) -> Vec<u32> {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} line in /proc/self/status"));
    line.split_whitespace()
        .map(|id| id.parse().expect("a numeric id"))
        .collect()
}

fn sha256_hex(path: &std::path::Path) -> String {
    let bytes = std::fs::read(path).expect("reading the binary");
    let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn assert_is_this_process(caller: &Caller) {
    let (uid, gid) = (status_ids("Uid:")[1], status_ids("Gid:")[1]);
    assert_eq!(
        (caller.pid, caller.uid, caller.gid),
        (std::process::id(), uid, gid)
    );
    let exe = std::env::current_exe().expect("this test's binary");
    let selectors = &caller.selectors;
    let mut wanted = vec![
        sel(&format!("unix:uid:{uid}")),
        sel(&format!("unix:gid:{gid}")),
        sel(&format!("unix:path:{}", exe.display())),
        sel(&format!("unix:sha256:{}", sha256_hex(&exe))),
    ];
    for group in status_ids("Groups:") {
        wanted.push(sel(&format!("unix:supplementary_gid:{group}")));
    }
    if uid == 0 {
        wanted.extend([sel("unix:user:root"), sel("unix:group:root")]);
    }
    assert!(
        selectors.contains_all(&wanted),
        "{selectors:?} lacks some of {wanted:?}"
    );
}

#[test]
fn this_process_attests_as_itself_through_a_socket_pair() {
    let (server, _client) = UnixStream::pair().expect("a socket pair");
    let peer = PeerProcess::of(&server).expect("the peer");
    let caller = attest(&peer, &AttestLimits::default()).expect("attesting this process");
    assert_is_this_process(&caller);
    still_same(&peer).expect("this process is still itself");
}

#[tokio::test]
async fn this_process_attests_as_itself_through_a_tokio_listener() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("workload.sock");
    let listener = tokio::net::UnixListener::bind(&path).expect("binding");
    let client = tokio::net::UnixStream::connect(&path);
    let (accepted, client) = tokio::join!(listener.accept(), client);
    let (_client, (server, _)) = (client.expect("connecting"), accepted.expect("accepting"));
    let peer = PeerProcess::of(&server).expect("the peer");
    let shared = peer.clone();
    let caller = tokio::task::spawn_blocking(move || attest(&shared, &AttestLimits::default()))
        .await
        .expect("the blocking task")
        .expect("attesting this process");
    assert_is_this_process(&caller);
}

#[test]
fn a_binary_over_the_limits_gets_every_selector_but_its_digest() {
    let (server, _client) = UnixStream::pair().expect("a socket pair");
    let peer = PeerProcess::of(&server).expect("the peer");
    let full = attest(&peer, &AttestLimits::default()).expect("attesting");
    let digests = |caller: &Caller| {
        caller
            .selectors
            .iter()
            .filter(|s| s.to_string().starts_with("unix:sha256:"))
            .count()
    };
    assert_eq!(digests(&full), 1);
    let too_big = AttestLimits {
        max_binary_bytes: 1024,
        ..AttestLimits::default()
    };
    // (A passed deadline is shown on a file never hashed, in the unit tests of `binary`: this binary's
    // digest is kept once hashed, and a kept digest costs no time.)
    let limits = too_big;
    let bounded = attest(&peer, &limits).expect("attesting within limits");
    assert_eq!(digests(&bounded), 0, "{limits:?}");
    assert_eq!(
        bounded.selectors.len(),
        full.selectors.len() - 1,
        "{limits:?}"
    );
    let without_digest: Vec<Selector> = full
        .selectors
        .iter()
        .filter(|s| !s.to_string().starts_with("unix:sha256:"))
        .cloned()
        .collect();
    assert!(bounded.selectors.contains_all(&without_digest));
}

fn assert_gone(result: Result<impl std::fmt::Debug, AttestError>) {
    match result {
        Err(
            error @ AttestError::CallerGone {
                reason: GoneReason::Exited,
                ..
            },
        ) => {
            let text = error.to_string();
            assert!(text.contains("still the process that connected"), "{text}");
        }
        other => panic!("expected the caller to be gone, got {other:?}"),
    }
}

#[test]
fn a_caller_that_exits_after_connecting_is_gone() {
    let (listener, name) = listener();
    let mut child = connecting_child(&[], &name);
    let (server, _) = listener.accept().expect("accepting the child");
    let peer = PeerProcess::of(&server).expect("the peer");
    assert_eq!(peer.pid(), child.id());
    let caller = attest(&peer, &AttestLimits::default()).expect("attesting the live child");
    let python = std::fs::canonicalize(PYTHON).expect("the interpreter's real path");
    assert!(caller
        .selectors
        .contains(&sel(&format!("unix:path:{}", python.display()))));
    assert!(caller
        .selectors
        .contains(&sel(&format!("unix:sha256:{}", sha256_hex(&python)))));

    drop(child.stdin.take());
    child.wait().expect("reaping the child");
    assert_gone(still_same(&peer));
    assert_gone(attest(&peer, &AttestLimits::default()));
}

#[test]
fn a_caller_that_exited_but_is_not_reaped_is_gone() {
    let (listener, name) = listener();
    let mut child = connecting_child(&[], &name);
    let (server, _) = listener.accept().expect("accepting the child");
    let peer = PeerProcess::of(&server).expect("the peer");
    drop(child.stdin.take());
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).expect("a pid"));
    let options = rustix::process::WaitIdOptions::EXITED | rustix::process::WaitIdOptions::NOWAIT;
    rustix::process::waitid(
        rustix::process::WaitId::Pid(pid.expect("a nonzero pid")),
        options,
    )
    .expect("waiting for the child to exit");
    // A zombie keeps its pid and its /proc entry, but not its identity.
    assert!(std::path::Path::new(&format!("/proc/{}/status", child.id())).exists());
    assert_gone(attest(&peer, &AttestLimits::default()));
    child.wait().expect("reaping the child");
}

#[test]
fn a_socket_passed_to_another_process_does_not_carry_the_identity() {
    let (listener, name) = listener();
    let relay = fresh_name();
    // The receiver takes a connected socket over SCM_RIGHTS, writes through it, and stays.
    let mut receiver = python(
        &[],
        "l = socket.socket(socket.AF_UNIX)\nl.bind('\\0' + sys.argv[1])\nl.listen(1)\n\
         print('ready', flush=True)\nc, _ = l.accept()\n\
         _, fds, _, _ = socket.recv_fds(c, 1, 1)\n\
         socket.socket(fileno=fds[0]).sendall(b'B')\nsys.stdin.read()\n",
        &[&relay],
    );
    wait_ready(receiver.stdout.as_mut().expect("the receiver's stdout"));
    // The connecting process hands its socket on and exits.
    let mut sender = python(
        &[],
        "s = connect(sys.argv[1])\nm = connect(sys.argv[2])\n\
         socket.send_fds(m, [b'x'], [s.fileno()])\n",
        &[&name, &relay],
    );
    let (mut server, _) = listener.accept().expect("accepting the sender");
    let peer = PeerProcess::of(&server).expect("the peer");
    assert_eq!(peer.pid(), sender.id());
    assert!(sender.wait().expect("the sender exits").success());
    let mut byte = [0u8; 1];
    server
        .read_exact(&mut byte)
        .expect("the receiver writes through the passed socket");
    assert_eq!(&byte, b"B");

    assert_gone(still_same(&peer));
    assert_gone(attest(&peer, &AttestLimits::default()));
    drop(receiver.stdin.take());
    receiver.wait().expect("reaping the receiver");
}

fn wait_ready(stdout: &mut ChildStdout) {
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("reading the child's stdout");
    assert_eq!(line.trim(), "ready");
}

/// CI runs the tests as root; elsewhere this part is left out and the rest still runs.
#[test]
fn a_caller_of_another_user_attests_as_that_user() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("not root: the caller of another uid is not tried");
        return;
    }
    let (listener, name) = listener();
    let setpriv = [
        "setpriv",
        "--reuid",
        "65534",
        "--regid",
        "65534",
        "--clear-groups",
    ];
    let mut child = connecting_child(&setpriv, &name);
    let (server, _) = listener.accept().expect("accepting the child");
    let peer = PeerProcess::of(&server).expect("the peer");
    assert_eq!((peer.uid(), peer.gid()), (65534, 65534));
    let caller = attest(&peer, &AttestLimits::default()).expect("attesting the child");
    assert_eq!((caller.uid, caller.gid), (65534, 65534));
    let wanted = [sel("unix:uid:65534"), sel("unix:gid:65534")];
    assert!(
        caller.selectors.contains_all(&wanted),
        "{:?}",
        caller.selectors
    );
    assert!(!caller.selectors.contains(&sel("unix:uid:0")));
    let supplementary = caller
        .selectors
        .iter()
        .filter(|s| s.to_string().starts_with("unix:supplementary_gid:"))
        .count();
    assert_eq!(supplementary, 0, "{:?}", caller.selectors);
    drop(child.stdin.take());
    child.wait().expect("reaping the child");
}

#[test]
fn a_caller_reaped_before_its_connection_is_read_is_gone() {
    let (listener, name) = listener();
    let mut child = connecting_child(&[], &name);
    let (server, _) = listener.accept().expect("accepting the child");
    drop(child.stdin.take());
    child.wait().expect("reaping the child");
    // Linux 6.5 to 6.15 refuse a pidfd for a reaped peer; later kernels give one that says so.
    match PeerProcess::of(&server) {
        Err(error) => assert_gone(Err::<(), _>(error)),
        Ok(peer) => {
            assert_gone(still_same(&peer));
            assert_gone(attest(&peer, &AttestLimits::default()));
        }
    }
}
