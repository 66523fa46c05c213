//! Attestation of real callers: this test process, and Python clients that connect from child
//! processes (as another user where the tests run as root, which CI does).

use std::io::{BufRead, BufReader, Read};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use meshca_workload::attest::{
    attest, attest_for, parse_selector, still_same, AttestError, AttestLimits, Caller, GoneReason,
    PeerProcess, Selector, Selectors,
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

/// A Python program: `script`, with `connect(name)` defined.
fn program(script: &str) -> String {
    format!(
        "import socket, sys\n\
         def connect(name):\n    s = socket.socket(socket.AF_UNIX)\n    s.connect('\\0' + name)\n    return s\n\
         {script}"
    )
}

/// A Python child that runs `script` (with `connect(name)` defined) through `prefix`.
fn python(prefix: &[&str], script: &str, args: &[&str]) -> Child {
    let program = program(script);
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

fn has_kind(caller: &Caller, kind: &str) -> bool {
    caller
        .selectors
        .iter()
        .any(|s| s.to_string().starts_with(kind))
}

/// A user can build a mount namespace of their own (`unshare -Urm`), lay a tmpfs over a directory
/// and run their own binary under a registered binary's path: the kernel then gives that path for
/// the process, but the path names another file in the server's mount namespace, so it is no
/// evidence: the caller gets neither `unix:path` nor `unix:sha256`.
#[test]
fn a_binary_path_that_names_another_file_here_is_no_evidence() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let registered = dir.path().join("app");
    std::fs::write(&registered, b"#!/bin/sh\nexit 0\n").expect("writing the registered binary");
    let python = std::fs::canonicalize(PYTHON).expect("the interpreter's real path");
    let (listener, name) = listener();
    let forge =
        "mount -t tmpfs none \"$1\" && cp \"$2\" \"$1/app\" && exec \"$1/app\" -c \"$3\" \"$4\"";
    let script = program("s = connect(sys.argv[1])\nsys.stdin.read()\n");
    let mut child = Command::new("unshare")
        .args(["-Urm", "sh", "-c", forge, "sh"])
        .arg(dir.path())
        .arg(&python)
        .args([script.as_str(), name.as_str()])
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawning unshare");
    let (server, _) = listener.accept().expect("accepting the child");
    let peer = PeerProcess::of(&server).expect("the peer");
    // The kernel names the registered path for the caller's binary...
    let shown = std::fs::read_link(format!("/proc/{}/exe", peer.pid())).expect("its exe link");
    assert_eq!(
        shown, registered,
        "the caller did not run under the registered path"
    );
    // ...but here that path is another file.
    let caller = attest(&peer, &AttestLimits::default()).expect("attesting the child");
    assert!(
        !caller
            .selectors
            .contains(&sel(&format!("unix:path:{}", registered.display()))),
        "{:?}",
        caller.selectors
    );
    assert!(!has_kind(&caller, "unix:path:"), "{:?}", caller.selectors);
    assert!(!has_kind(&caller, "unix:sha256:"), "{:?}", caller.selectors);
    assert!(has_kind(&caller, "unix:uid:"), "{:?}", caller.selectors);
    drop(child.stdin.take());
    child.wait().expect("reaping the child");
}

/// A mount namespace of its own is no reason to lose a selector: a caller in one that runs the same
/// file as the server sees at that path keeps `unix:path` and `unix:sha256`.
#[test]
fn a_caller_in_its_own_mount_namespace_running_the_same_file_keeps_its_path() {
    let (listener, name) = listener();
    let mut child = connecting_child(&["unshare", "-Urm"], &name);
    let (server, _) = listener.accept().expect("accepting the child");
    let peer = PeerProcess::of(&server).expect("the peer");
    let caller = attest(&peer, &AttestLimits::default()).expect("attesting the child");
    let python = std::fs::canonicalize(PYTHON).expect("the interpreter's real path");
    let wanted = [
        sel(&format!("unix:path:{}", python.display())),
        sel(&format!("unix:sha256:{}", sha256_hex(&python))),
    ];
    assert!(
        caller.selectors.contains_all(&wanted),
        "{:?}",
        caller.selectors
    );
    drop(child.stdin.take());
    child.wait().expect("reaping the child");
}

fn assert_gone_because(result: Result<impl std::fmt::Debug, AttestError>, expected: GoneReason) {
    match result {
        Err(AttestError::CallerGone { reason, .. }) => assert_eq!(reason, expected),
        other => panic!("expected the caller to be gone ({expected}), got {other:?}"),
    }
}

/// A Python child that connects, says `ready`, and on `go` runs the rest of its script, which says
/// what it did; the connection is accepted and its peer captured while the child waits.
struct Stepped {
    child: Child,
    stdin: std::process::ChildStdin,
    stdout: BufReader<ChildStdout>,
    peer: PeerProcess,
    _server: UnixStream,
}

impl Stepped {
    fn start(then: &str) -> Stepped {
        let (listener, name) = listener();
        let script = format!(
            "import ctypes, os\ns = connect(sys.argv[1])\nprint('ready', flush=True)\nos.read(0, 3)\n{then}"
        );
        let mut child = python(&[], &script, &[&name]);
        let stdin = child.stdin.take().expect("the child's stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("the child's stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("reading the child");
        assert_eq!(line.trim(), "ready");
        let (server, _) = listener.accept().expect("accepting the child");
        let peer = PeerProcess::of(&server).expect("the peer");
        Stepped {
            child,
            stdin,
            stdout,
            peer,
            _server: server,
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        std::io::Write::write_all(&mut self.stdin, bytes).expect("writing to the child");
    }

    fn expect(&mut self, word: &str) {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("reading the child");
        assert_eq!(line.trim(), word);
    }

    fn finish(self) {
        let Stepped {
            mut child, stdin, ..
        } = self;
        drop(stdin);
        child.wait().expect("reaping the child");
    }
}
/// A process connects, forks a child that keeps the socket, then execs another binary (a registered
/// one): the child is still the attacker's code, so the connection no longer attests as anything.
#[test]
fn a_caller_that_execs_after_connecting_must_reconnect() {
    let mut caller = Stepped::start(
        "if os.fork() == 0:\n\
         \x20   ctypes.CDLL(None).prctl(1, 9)\n\
         \x20   os.read(s.fileno(), 1)\n\
         \x20   os._exit(0)\n\
         print('forked', flush=True)\n\
         os.execv('/bin/cat', ['cat'])\n",
    );
    attest(&caller.peer, &AttestLimits::default()).expect("attesting the child before it execs");
    still_same(&caller.peer).expect("the same process");
    caller.send(b"go\n");
    caller.expect("forked");
    // cat echoes: once it does, the exec is done.
    caller.send(b"ping\n");
    caller.expect("ping");
    assert_eq!(
        std::fs::read_link(format!("/proc/{}/exe", caller.peer.pid())).expect("its exe link"),
        std::fs::canonicalize("/bin/cat").expect("cat's real path"),
    );
    assert_gone_because(still_same(&caller.peer), GoneReason::BinaryChanged);
    assert_gone_because(
        attest(&caller.peer, &AttestLimits::default()),
        GoneReason::BinaryChanged,
    );
    caller.finish();
}

/// A caller that moves to another mount namespace after connecting (where it could make any path
/// name any file) must reconnect.
#[test]
fn a_caller_that_enters_another_mount_namespace_must_reconnect() {
    // CLONE_NEWUSER | CLONE_NEWNS: allowed to any user where user namespaces are.
    let mut caller = Stepped::start(
        "libc = ctypes.CDLL(None, use_errno=True)\n\
         assert libc.unshare(0x10020000) == 0, os.strerror(ctypes.get_errno())\n\
         print('moved', flush=True)\n\
         sys.stdin.read()\n",
    );
    attest(&caller.peer, &AttestLimits::default()).expect("attesting the child before it moves");
    caller.send(b"go\n");
    caller.expect("moved");
    assert_gone_because(still_same(&caller.peer), GoneReason::MountNamespaceChanged);
    assert_gone_because(
        attest(&caller.peer, &AttestLimits::default()),
        GoneReason::MountNamespaceChanged,
    );
    caller.finish();
}

/// A caller no registration could match by its digest costs no hashing: it is asked once, with the
/// caller's other selectors, and the caller is marked as having no digest, so that a registration
/// naming one later makes its stream reconnect.
#[test]
fn the_digest_is_computed_only_where_a_registration_could_use_it() {
    let (server, _client) = UnixStream::pair().expect("a socket pair");
    let peer = PeerProcess::of(&server).expect("the peer");
    let asked = std::cell::Cell::new(0);
    let never = |selectors: &Selectors| {
        asked.set(asked.get() + 1);
        assert!(
            has_kind_in(selectors, "unix:uid:"),
            "asked with the other selectors"
        );
        assert!(
            has_kind_in(selectors, "unix:path:"),
            "asked with the binary's path"
        );
        false
    };
    let skipped = attest_for(&peer, &AttestLimits::default(), &never).expect("attesting");
    assert_eq!(asked.get(), 1);
    assert!(skipped.digest_skipped);
    assert!(
        !has_kind(&skipped, "unix:sha256:"),
        "{:?}",
        skipped.selectors
    );
    assert!(has_kind(&skipped, "unix:path:"), "{:?}", skipped.selectors);
    let wanted =
        attest_for(&peer, &AttestLimits::default(), &|_: &Selectors| true).expect("attesting");
    assert!(!wanted.digest_skipped);
    assert!(has_kind(&wanted, "unix:sha256:"), "{:?}", wanted.selectors);
}

fn has_kind_in(selectors: &Selectors, kind: &str) -> bool {
    selectors.iter().any(|s| s.to_string().starts_with(kind))
}
