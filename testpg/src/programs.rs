//! Finding PostgreSQL's programs and the helpers that drop root.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

/// Where Debian installs each major version's programs, one `<N>/bin/` per version.
const DEBIAN_ROOT: &str = "/usr/lib/postgresql";

/// Directories searched after `PATH`: tests may run with a `PATH` that lacks the `sbin` directories.
const SYSTEM_DIRS: [&str; 4] = ["/usr/bin", "/usr/sbin", "/bin", "/sbin"];

/// The PostgreSQL programs a test server needs, taken from one installation so their versions match.
#[derive(Debug, Clone)]
pub(crate) struct Programs {
    /// Creates the data directory.
    pub(crate) initdb: PathBuf,
    /// Starts, stops and queries the server.
    pub(crate) pg_ctl: PathBuf,
    /// Runs SQL.
    pub(crate) psql: PathBuf,
    /// Dumps a database; it must be at least as new as the server, hence the same installation.
    pub(crate) pg_dump: PathBuf,
}

impl Programs {
    /// Finds the newest Debian installation, else `initdb` and `pg_ctl` on `PATH`.
    ///
    /// Panics when there is neither: a test that needs PostgreSQL must fail loudly, never skip.
    pub(crate) fn find() -> Programs {
        let bin = newest_debian_bin().or_else(bin_on_path).unwrap_or_else(|| {
            panic!(
                "PostgreSQL's server programs (initdb, pg_ctl) were not found: looked in \
                 {DEBIAN_ROOT}/<N>/bin/ and on PATH. The database tests need a real PostgreSQL \
                 server; install Debian's `postgresql` package (`apt-get install postgresql`), \
                 as .ci/run does."
            )
        });
        Programs {
            initdb: bin.join("initdb"),
            pg_ctl: bin.join("pg_ctl"),
            psql: client(&bin, "psql"),
            pg_dump: client(&bin, "pg_dump"),
        }
    }
}

/// The `bin` directory of the highest version under [`DEBIAN_ROOT`] that has the server programs.
fn newest_debian_bin() -> Option<PathBuf> {
    fs::read_dir(DEBIAN_ROOT)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            has_server_programs(&bin).then_some((version, bin))
        })
        .max_by_key(|(version, _)| *version)
        .map(|(_, bin)| bin)
}

/// The directory of the `initdb` on `PATH`, when `pg_ctl` sits next to it.
fn bin_on_path() -> Option<PathBuf> {
    let initdb = find_program("initdb")?;
    let bin = initdb.parent()?.to_path_buf();
    has_server_programs(&bin).then_some(bin)
}

fn has_server_programs(bin: &Path) -> bool {
    bin.join("initdb").is_file() && bin.join("pg_ctl").is_file()
}

/// A client program from the server's own directory, else Debian's `/usr/bin` wrapper or `PATH`.
fn client(bin: &Path, name: &str) -> PathBuf {
    let own = bin.join(name);
    if own.is_file() {
        return own;
    }
    find_program(name).unwrap_or_else(|| {
        panic!(
            "PostgreSQL's server programs are in {} but `{name}` was found neither there nor on \
             PATH; install Debian's `postgresql` package (`apt-get install postgresql`)",
            bin.display()
        )
    })
}

/// Finds `name` on `PATH`, then in the usual system directories.
pub(crate) fn find_program(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path)
        .chain(SYSTEM_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}
