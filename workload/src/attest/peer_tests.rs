//! The fallback for kernels without `SO_PEERPIDFD`, driven directly (this kernel has it), and the
//! checks every way of holding a process shares.

use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};

use rustix::process::{waitid, WaitId, WaitIdOptions};

use super::super::{attest, AttestLimits};
use super::*;

fn own_stat() -> parse::Stat {
    read_stat(std::process::id()).expect("this process's stat")
}

/// A child that lives until its stdin closes.
fn waiting_child() -> Child {
    Command::new("/bin/cat")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawning /bin/cat")
}

/// Closes the child's stdin and waits until it has exited, without reaping it: it stays a zombie.
fn exit_unreaped(child: &mut Child) {
    drop(child.stdin.take());
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("a pid")).expect("a nonzero pid");
    waitid(
        WaitId::Pid(pid),
        WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
    )
    .expect("waiting for the child to exit");
}

fn assert_gone(result: Result<(), AttestError>, expected: GoneReason) {
    match result {
        Err(AttestError::CallerGone { reason, .. }) => assert_eq!(reason, expected),
        other => panic!("expected the caller to be gone ({expected}), got {other:?}"),
    }
}

#[test]
fn peer_process_is_send_sync_and_cheap_to_clone() {
    fn send_sync<T: Send + Sync + Clone>() {}
    send_sync::<PeerProcess>();
}

#[test]
fn the_kernel_hands_out_a_peer_pidfd_here() {
    let (server, _client) = UnixStream::pair().expect("a socket pair");
    let peer = PeerProcess::of(&server).expect("the peer");
    assert_eq!(peer.pid(), std::process::id());
    assert!(format!("{peer:?}").contains("SO_PEERPIDFD"), "{peer:?}");
    still_same(&peer).expect("this process is still itself");
}

#[test]
fn the_fallback_attests_a_live_process() {
    let (server, _client) = UnixStream::pair().expect("a socket pair");
    let by_socket = PeerProcess::of(&server).expect("the peer");
    let peer = PeerProcess::by_pid(by_socket.pid(), by_socket.uid(), by_socket.gid())
        .expect("the fallback");
    let debug = format!("{peer:?}");
    assert!(
        debug.contains("pidfd_open") && debug.contains("starttime"),
        "{debug}"
    );
    still_same(&peer).expect("this process is still itself");
    let by_fallback = attest(&peer, &AttestLimits::default()).expect("attesting by the fallback");
    let by_pidfd = attest(&by_socket, &AttestLimits::default()).expect("attesting by the pidfd");
    assert_eq!(by_fallback, by_pidfd);
}

#[test]
fn the_fallback_sees_another_process_behind_the_pid() {
    let me = std::process::id();
    let starttime = own_stat().starttime;
    let ids = (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    );
    for pidfd in [
        None,
        pidfd_open(rustix::process::getpid(), PidfdFlags::empty()).ok(),
    ] {
        let hold = Hold::Opened {
            pidfd,
            starttime: starttime.wrapping_add(1),
        };
        let peer = PeerProcess::new(me, ids.0, ids.1, hold);
        assert_gone(still_same(&peer), GoneReason::Replaced);
    }
}

#[test]
fn the_fallback_sees_an_exited_process_reaped_or_not() {
    let mut child = waiting_child();
    let peer = PeerProcess::by_pid(child.id(), 0, 0).expect("the child");
    let without_pidfd = Hold::Opened {
        pidfd: None,
        starttime: read_stat(child.id()).expect("the child's stat").starttime,
    };
    let peer_without_pidfd = PeerProcess::new(child.id(), 0, 0, without_pidfd);
    exit_unreaped(&mut child);
    assert_gone(still_same(&peer), GoneReason::Exited);
    assert_gone(still_same(&peer_without_pidfd), GoneReason::Exited);
    child.wait().expect("reaping the child");
    assert_gone(still_same(&peer), GoneReason::Exited);
    assert_gone(still_same(&peer_without_pidfd), GoneReason::Exited);
    assert!(matches!(
        PeerProcess::by_pid(peer.pid(), 0, 0),
        Err(AttestError::CallerGone {
            reason: GoneReason::Exited,
            ..
        })
    ));
}

#[test]
fn a_caller_whose_ids_changed_since_it_connected_is_gone() {
    let (server, _client) = UnixStream::pair().expect("a socket pair");
    let real = PeerProcess::of(&server).expect("the peer");
    let other_uid = PeerProcess::by_pid(real.pid(), real.uid().wrapping_add(1), real.gid())
        .expect("the fallback");
    let error = attest(&other_uid, &AttestLimits::default()).expect_err("a uid that changed");
    assert!(
        matches!(
            error,
            AttestError::CallerGone {
                reason: GoneReason::UidChanged { .. },
                ..
            }
        ),
        "{error}"
    );
    let other_gid = PeerProcess::by_pid(real.pid(), real.uid(), real.gid().wrapping_add(1))
        .expect("the fallback");
    assert_gone(
        still_same(&other_gid),
        GoneReason::GidChanged {
            connected: real.gid().wrapping_add(1),
            now: real.gid(),
        },
    );
    assert!(error
        .to_string()
        .contains("could not verify the caller is still the process that connected"));
}

#[test]
fn a_pidfd_of_another_pid_is_another_process() {
    let mut child = waiting_child();
    let child_pid =
        Pid::from_raw(i32::try_from(child.id()).expect("a pid")).expect("a nonzero pid");
    let pidfd = pidfd_open(child_pid, PidfdFlags::empty()).expect("a pidfd of the child");
    let ids = (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    );
    let peer = PeerProcess::new(std::process::id(), ids.0, ids.1, Hold::PeerPidfd(pidfd));
    assert_gone(still_same(&peer), GoneReason::Replaced);
    drop(child.stdin.take());
    child.wait().expect("reaping the child");
}
