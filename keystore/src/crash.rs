//! Crash points: the test hook that proves a kill at any write leaves a data directory meshca starts from.
//!
//! Every step that changes the data directory (creating a directory or a file, writing it, renaming it
//! into place, removing it; lock files aside, which hold nothing) calls [`crash_point`] first, in this
//! crate and in the daemon. When the
//! environment variable [`CRASH_AT_ENV`] (`MESHCA_TEST_CRASH_AT`) holds a number N, the process kills
//! itself with SIGKILL at the Nth crash point it reaches, before that step happens: exactly what
//! `kill -9` at that moment does (no destructor runs, no lock is released by hand, nothing is flushed).
//! Tests start `meshca serve` with N = 1, 2, 3, ... in turn and check that every restart recovers.
//!
//! While the variable is set, every crash point is also logged to stderr with its number, so a test can
//! count the steps of a start. It is read once; unset (always, outside tests) a crash point does nothing.
//!
//! Why not `strace -e inject=...:signal=SIGKILL:when=N`: strace counts each system call per thread, and
//! the daemon writes from several threads, so "the Nth write of the start" would have no stable meaning;
//! it would also count log writes to stderr.

use std::fmt::Display;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The environment variable that arms the crash points, for tests only: `MESHCA_TEST_CRASH_AT=N` kills
/// the process at its Nth crash point.
pub const CRASH_AT_ENV: &str = "MESHCA_TEST_CRASH_AT";

/// The point at which this process kills itself, if the variable is set to a number.
fn armed() -> Option<u64> {
    static AT: OnceLock<Option<u64>> = OnceLock::new();
    *AT.get_or_init(|| {
        std::env::var(CRASH_AT_ENV)
            .ok()
            .and_then(|v| v.trim().parse().ok())
    })
}

/// Marks the step `what` is about to take (e.g. `rename .#key.pem.12.0.tmp to ca/x/key.pem`). With
/// [`CRASH_AT_ENV`] set to this point's number the process ends here by SIGKILL; see the module doc.
pub fn crash_point(what: impl Display) {
    static REACHED: AtomicU64 = AtomicU64::new(0);
    let Some(at) = armed() else {
        return;
    };
    let n = REACHED.fetch_add(1, Ordering::Relaxed) + 1;
    eprintln!("{CRASH_AT_ENV}: crash point {n}: {what}");
    if n == at {
        eprintln!("{CRASH_AT_ENV}: killing this process at crash point {n}");
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        // SIGKILL cannot be caught; should sending it fail, end as abruptly anyway.
        std::process::abort();
    }
}
