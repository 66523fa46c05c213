//! Finding SoftHSM2: its PKCS#11 module and `softhsm2-util`.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

/// The module's file name.
const MODULE: &str = "libsofthsm2.so";

/// Where Debian puts the module (a link into the multiarch directory), then the multiarch directory
/// of this machine's usual architecture.
const MODULE_DIRS: [&str; 2] = ["/usr/lib/softhsm", "/usr/lib/x86_64-linux-gnu/softhsm"];

/// Directories searched after `PATH` for `softhsm2-util`.
const SYSTEM_DIRS: [&str; 4] = ["/usr/bin", "/usr/sbin", "/bin", "/sbin"];

/// What a test without SoftHSM2 says: it fails, so that a machine without it is noticed.
const NOT_INSTALLED: &str = "SoftHSM2 is not installed (Debian: apt-get install softhsm2) — tests \
                             with a token fail rather than skip";

/// SoftHSM2 on this machine.
#[derive(Debug, Clone)]
pub(crate) struct SoftHsm {
    /// The PKCS#11 module meshca loads.
    pub(crate) module: PathBuf,
    /// The tool that initialises tokens.
    pub(crate) util: PathBuf,
}

impl SoftHsm {
    /// Finds the module and `softhsm2-util`; panics naming what is missing when either is.
    pub(crate) fn find() -> SoftHsm {
        let module = find_module().unwrap_or_else(|| {
            panic!(
                "{NOT_INSTALLED}: {MODULE} was found in none of {}, /usr/lib/*/softhsm",
                MODULE_DIRS.join(", ")
            )
        });
        let util = find_program("softhsm2-util").unwrap_or_else(|| {
            panic!(
                "{NOT_INSTALLED}: softhsm2-util was found neither on PATH nor in {SYSTEM_DIRS:?}"
            )
        });
        SoftHsm { module, util }
    }
}

/// The module in the first of [`MODULE_DIRS`] that has it, else in any `/usr/lib/<triple>/softhsm/`.
fn find_module() -> Option<PathBuf> {
    MODULE_DIRS
        .iter()
        .map(|dir| Path::new(dir).join(MODULE))
        .find(|candidate| candidate.is_file())
        .or_else(|| {
            let mut found: Vec<PathBuf> = fs::read_dir("/usr/lib")
                .ok()?
                .filter_map(Result::ok)
                .map(|entry| entry.path().join("softhsm").join(MODULE))
                .filter(|candidate| candidate.is_file())
                .collect();
            found.sort();
            found.into_iter().next()
        })
}

/// Finds `name` on `PATH`, then in the usual system directories.
fn find_program(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path)
        .chain(SYSTEM_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}
