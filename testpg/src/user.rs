//! The operating-system user the server runs as.
//!
//! PostgreSQL refuses to run as root, and tests run as root in CI and in the development container. As
//! root, every PostgreSQL program therefore runs as the existing unprivileged user `nobody` (group
//! `nogroup`), and the files it must read or write are handed to that user.

use std::fs;
use std::os::unix::fs::{chown, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::process;
use crate::programs::find_program;

/// The unprivileged user that runs the server when the tests run as root.
const USER: &str = "nobody";
/// That user's group.
const GROUP: &str = "nogroup";

/// Who runs PostgreSQL's programs.
#[derive(Debug)]
pub(crate) enum ServerUser {
    /// Not root: everything runs as the current user, with no wrapper.
    Current,
    /// Root: everything runs as `nobody` through a wrapper that drops root.
    Nobody {
        /// `nobody`'s user id, for `chown`.
        uid: u32,
        /// `nogroup`'s group id, for `chown`.
        gid: u32,
        /// The program that switches user.
        wrapper: Wrapper,
    },
}

/// A util-linux program that runs a command as another user.
#[derive(Debug)]
pub(crate) enum Wrapper {
    /// `setpriv`: switches ids and nothing else (no PAM session, environment kept).
    Setpriv(PathBuf),
    /// `runuser`: the fallback when `setpriv` is missing.
    Runuser(PathBuf),
}

impl ServerUser {
    /// `Current` unless the effective user is root (the id PostgreSQL checks).
    pub(crate) fn detect() -> ServerUser {
        if !rustix::process::geteuid().is_root() {
            return ServerUser::Current;
        }
        ServerUser::Nobody {
            uid: lookup_id("passwd", USER),
            gid: lookup_id("group", GROUP),
            wrapper: Wrapper::find(),
        }
    }

    /// A command that runs `program` as this user.
    pub(crate) fn command(&self, program: &Path) -> Command {
        match self {
            ServerUser::Current => Command::new(program),
            ServerUser::Nobody {
                uid,
                gid,
                wrapper: Wrapper::Setpriv(setpriv),
            } => {
                let mut command = Command::new(setpriv);
                command
                    .arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={gid}"))
                    .args(["--clear-groups", "--"])
                    .arg(program);
                command
            }
            ServerUser::Nobody {
                wrapper: Wrapper::Runuser(runuser),
                ..
            } => {
                let mut command = Command::new(runuser);
                command.args(["-u", USER, "-g", GROUP, "--"]).arg(program);
                command
            }
        }
    }

    /// Makes this user the owner of `path`, which the current process created.
    pub(crate) fn give(&self, path: &Path) {
        if let ServerUser::Nobody { uid, gid, .. } = self {
            chown(path, Some(*uid), Some(*gid))
                .unwrap_or_else(|e| panic!("chown {USER}:{GROUP} {}: {e}", path.display()));
        }
    }

    /// Panics unless this user can reach `dir`: as `nobody`, every parent must be searchable by others.
    pub(crate) fn check_reachable(&self, dir: &Path) {
        if matches!(self, ServerUser::Current) {
            return;
        }
        for parent in dir.ancestors().skip(1) {
            let mode = fs::metadata(parent)
                .unwrap_or_else(|e| panic!("reading the permissions of {}: {e}", parent.display()))
                .permissions()
                .mode();
            assert!(
                mode & 0o001 != 0,
                "the test PostgreSQL server runs as {USER}, which cannot enter {} (mode {mode:o}); \
                 set TMPDIR to a directory every user can enter, such as /tmp",
                parent.display()
            );
        }
    }
}

impl Wrapper {
    /// `setpriv`, else `runuser`; panics when util-linux provides neither.
    fn find() -> Wrapper {
        if let Some(setpriv) = find_program("setpriv") {
            return Wrapper::Setpriv(setpriv);
        }
        if let Some(runuser) = find_program("runuser") {
            return Wrapper::Runuser(runuser);
        }
        panic!(
            "the tests run as root, which PostgreSQL refuses, and neither `setpriv` nor `runuser` \
             (util-linux) was found to run the server as {USER}"
        )
    }
}

/// The numeric id of `name` in the `passwd` or `group` database, through `getent`.
fn lookup_id(database: &str, name: &str) -> u32 {
    let mut command = Command::new("getent");
    command.args([database, name]);
    let output = process::run(&mut command, b"");
    let line = String::from_utf8_lossy(&output.stdout);
    line.split(':')
        .nth(2)
        .and_then(|id| id.trim().parse().ok())
        .unwrap_or_else(|| panic!("`getent {database} {name}` printed no numeric id: {line:?}"))
}
