//! Test support: a real, throwaway PostgreSQL server.
//!
//! [`TestPostgres::start`] creates a fresh cluster in a temporary directory and starts it on a free
//! port of 127.0.0.1, with a login role `meshca` that owns a database `meshca`. Dropping the value stops
//! the server and deletes everything. The server is tuned for tests (no fsync), never for data.
//!
//! PostgreSQL's server programs must be installed (Debian's `postgresql` package, which `.ci/run`
//! installs); without them starting panics, so database tests fail rather than silently skip. When the
//! tests run as root, the server runs as `nobody`, because PostgreSQL refuses to run as root.

mod process;
mod programs;
mod user;

use std::collections::BTreeSet;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use tempfile::TempDir;

use crate::programs::Programs;
use crate::user::ServerUser;

/// The role and database the server is created with.
const APP: &str = "meshca";
/// The superuser, reached only over the unix socket (where authentication is `trust`).
const SUPERUSER: &str = "postgres";
/// The lowest port [`free_port`] picks: above the well-known and most registered ones.
const LOWEST_PORT: u16 = 20_000;

/// How many free ports to try when another process takes the port between choosing and binding it.
const PORT_ATTEMPTS: u32 = 5;
/// How many lines of the server log a start failure quotes.
const LOG_TAIL_LINES: usize = 40;
/// Server settings for tests: durability buys nothing for a cluster deleted at the end of the test.
const TEST_SETTINGS: &str =
    "-c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off -c synchronous_commit=off";

/// A PostgreSQL server running in a temporary directory, for the duration of a test.
///
/// Connect as role `meshca` with [`password`](Self::password) over TCP, through [`url`](Self::url).
/// The superuser `postgres` is only used by this type's helpers ([`psql`](Self::psql),
/// [`dump`](Self::dump)), over the unix socket.
pub struct TestPostgres {
    /// Holds the data directory, the socket directory and the log; deleted on drop.
    dir: TempDir,
    programs: Programs,
    user: ServerUser,
    port: u16,
    /// The password of role `meshca`.
    password: String,
    /// Whether the server was asked to serve TLS, so that a restart serves it again.
    tls: bool,
}

/// What differs between the ways to start a server.
struct Options<'a> {
    /// The certificate and private key to serve TLS with, both PEM.
    tls: Option<(&'a str, &'a str)>,
}

/// Why `pg_ctl start` failed.
struct StartFailure {
    /// The command's failure and the log's tail.
    message: String,
    /// The port was taken by someone else: choosing another one may succeed.
    port_taken: bool,
}

impl TestPostgres {
    /// Starts a fresh server with role and database `meshca`.
    ///
    /// Panics when PostgreSQL is not installed or the server does not start; the message says why
    /// and quotes the server log.
    pub fn start() -> TestPostgres {
        TestPostgres::start_with(Options { tls: None })
    }

    /// Like [`start`](Self::start), but the server also accepts TLS connections with the given
    /// certificate and private key (both PEM). Clients choose TLS or not (`sslmode`).
    pub fn start_with_tls(cert_pem: &str, key_pem: &str) -> TestPostgres {
        TestPostgres::start_with(Options {
            tls: Some((cert_pem, key_pem)),
        })
    }

    fn start_with(options: Options<'_>) -> TestPostgres {
        let programs = Programs::find();
        let user = ServerUser::detect();
        let dir = tempfile::Builder::new()
            .prefix("meshca-testpg-")
            .tempdir()
            .expect("creating the test server's temporary directory");
        let mut server = TestPostgres {
            dir,
            programs,
            user,
            port: 0,
            password: random_hex(),
            tls: options.tls.is_some(),
        };
        server.prepare_dir();
        server.init_cluster();
        if let Some((cert_pem, key_pem)) = options.tls {
            server.write_private(&server.data_dir().join("server.crt"), cert_pem);
            server.write_private(&server.data_dir().join("server.key"), key_pem);
        }
        server.start_on_free_port();
        server.create_app_role();
        server
    }

    /// `postgres://meshca@127.0.0.1:PORT/meshca`; the password is not in it (see
    /// [`password`](Self::password)).
    pub fn url(&self) -> String {
        self.database_url(APP)
    }

    /// The password of role `meshca`, random for each server.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The TCP port the server listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Creates another empty database owned by `meshca` and returns its URL (without the password).
    ///
    /// `name` must match `[a-z0-9_]+`, so it needs no quoting beyond SQL's double quotes.
    pub fn create_database(&self, name: &str) -> String {
        let valid = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        assert!(valid, "database name {name:?} does not match [a-z0-9_]+");
        self.psql(
            SUPERUSER,
            &format!("CREATE DATABASE \"{name}\" OWNER {APP};"),
        );
        self.database_url(name)
    }

    /// Runs `sql` (one or more statements) in `database` as the superuser and returns what it printed.
    ///
    /// Output is unaligned, rows only, without command tags (`psql -qAt`): `select 1` gives `"1"`;
    /// fields are separated by `|`, rows by newlines, and the final newline is removed. Panics with
    /// psql's stderr when a statement fails.
    pub fn psql(&self, database: &str, sql: &str) -> String {
        let mut command = self.command(&self.programs.psql);
        command
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args(self.superuser_connection(database));
        let output = process::run(&mut command, sql.as_bytes());
        let stdout = String::from_utf8(output.stdout).expect("psql printed UTF-8");
        stdout.trim_end_matches('\n').to_owned()
    }

    /// The plain SQL dump (schema and data) of `database`, by `pg_dump` as the superuser.
    ///
    /// For checking what a database holds at rest, e.g. that no private key is stored in clear.
    pub fn dump(&self, database: &str) -> Vec<u8> {
        let mut command = self.command(&self.programs.pg_dump);
        command
            .args(["--format=plain", "--no-password"])
            .args(self.superuser_connection(database));
        process::run(&mut command, b"").stdout
    }

    /// Stops the server (`pg_ctl stop -m fast`), keeping its data for
    /// [`start_again`](Self::start_again). Panics if it is not running.
    pub fn stop(&mut self) {
        let mut command = self.pg_ctl("stop");
        command.args(["-m", "fast", "-w"]);
        process::run(&mut command, b"");
    }

    /// Starts the stopped server again, on the same port and with the same data: for tests of a
    /// database that goes away and comes back. Panics if it is running or does not start.
    pub fn start_again(&mut self) {
        assert!(
            !self.is_running(),
            "start_again: the server is already running"
        );
        if let Err(failure) = self.try_start() {
            panic!("{}", failure.message);
        }
    }

    /// Whether the server is running, as `pg_ctl status` sees it.
    pub fn is_running(&self) -> bool {
        process::output(&mut self.pg_ctl("status"), b"")
            .status
            .success()
    }

    /// The server log so far (empty before the first start).
    pub fn log(&self) -> String {
        match fs::read(self.log_path()) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(_) => String::new(),
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn socket_dir(&self) -> PathBuf {
        self.dir.path().join("socket")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    fn database_url(&self, database: &str) -> String {
        format!("postgres://{APP}@127.0.0.1:{}/{database}", self.port)
    }

    /// Makes the temporary directory private to the server user, with a directory for the socket.
    fn prepare_dir(&self) {
        let root = self.dir.path();
        self.user.check_reachable(root);
        fs::set_permissions(root, fs::Permissions::from_mode(0o700))
            .expect("making the test server's temporary directory private (0700)");
        self.user.give(root);
        fs::create_dir(self.socket_dir()).expect("creating the test server's socket directory");
        self.user.give(&self.socket_dir());
    }

    /// `initdb`: the superuser's password comes from a file, deleted once the cluster exists.
    fn init_cluster(&self) {
        let pwfile = self.dir.path().join("superuser-password");
        self.write_private(&pwfile, &random_hex());
        let mut command = self.command(&self.programs.initdb);
        command
            .arg("-D")
            .arg(self.data_dir())
            .args(["--auth-local=trust", "--auth-host=scram-sha-256"])
            .arg(format!("--username={SUPERUSER}"))
            .arg(format!("--pwfile={}", pwfile.display()))
            .args(["-E", "UTF8", "--locale=C", "--no-sync"]);
        process::run(&mut command, b"");
        fs::remove_file(&pwfile).expect("deleting the superuser's password file");
    }

    /// Starts the server on a port that was free a moment ago, trying another if it was taken since.
    fn start_on_free_port(&mut self) {
        for attempt in 1..=PORT_ATTEMPTS {
            self.port = free_port();
            match self.try_start() {
                Ok(()) => return,
                Err(failure) if failure.port_taken && attempt < PORT_ATTEMPTS => continue,
                Err(failure) => panic!("{}", failure.message),
            }
        }
    }

    /// `pg_ctl start`, waiting until the server accepts connections.
    fn try_start(&self) -> Result<(), StartFailure> {
        let log_before = self.log().len();
        let mut command = self.pg_ctl("start");
        command
            .arg("-l")
            .arg(self.log_path())
            .arg("-w")
            .arg("-o")
            .arg(self.server_options());
        let output = process::output(&mut command, b"");
        if output.status.success() {
            return Ok(());
        }
        let log = self.log();
        let this_start = log.get(log_before..).unwrap_or(&log);
        Err(StartFailure {
            message: format!(
                "{}\nlast lines of the server log ({}):\n{}",
                process::failure(&command, &output),
                self.log_path().display(),
                tail(&log, LOG_TAIL_LINES)
            ),
            port_taken: this_start.contains("Address already in use"),
        })
    }

    /// The server's command line, which `pg_ctl` passes through a shell: paths are quoted.
    fn server_options(&self) -> String {
        let mut options = format!(
            "-p {} -k {} {TEST_SETTINGS}",
            self.port,
            shell_quote(&self.socket_dir())
        );
        if self.tls {
            let data = self.data_dir();
            options.push_str(&format!(
                " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
                shell_quote(&data.join("server.crt")),
                shell_quote(&data.join("server.key"))
            ));
        }
        options
    }

    /// Creates the login role `meshca` and its database.
    fn create_app_role(&self) {
        // CREATE DATABASE cannot share a transaction: psql sends the statements one by one.
        let sql = format!(
            "CREATE ROLE {APP} LOGIN PASSWORD '{}';\nCREATE DATABASE {APP} OWNER {APP};\n",
            self.password
        );
        self.psql(SUPERUSER, &sql);
    }

    /// `psql`/`pg_dump` arguments that connect to `database` as the superuser over the unix socket.
    fn superuser_connection(&self, database: &str) -> Vec<String> {
        vec![
            "-h".to_owned(),
            self.socket_dir().display().to_string(),
            "-p".to_owned(),
            self.port.to_string(),
            "-U".to_owned(),
            SUPERUSER.to_owned(),
            "-d".to_owned(),
            database.to_owned(),
        ]
    }

    /// `pg_ctl <action> -D <data>`.
    fn pg_ctl(&self, action: &str) -> Command {
        let mut command = self.command(&self.programs.pg_ctl);
        command.arg(action).arg("-D").arg(self.data_dir());
        command
    }

    /// A command that runs `program` as the server user, in the temporary directory (the test's own
    /// directory may be closed to `nobody`), with no `PG*` variable of the test's environment.
    fn command(&self, program: &Path) -> Command {
        let mut command = self.user.command(program);
        command
            .current_dir(self.dir.path())
            .env("HOME", self.dir.path());
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("PG") {
                command.env_remove(name);
            }
        }
        command
    }

    /// Writes a file only its owner can read, and gives it to the server user.
    fn write_private(&self, path: &Path, contents: &str) {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        file.write_all(contents.as_bytes())
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        self.user.give(path);
    }
}

impl Drop for TestPostgres {
    /// Stops the server at once (`-m immediate`: its data is about to be deleted), then the temporary
    /// directory goes. Errors are ignored, and nothing here panics: a panic while a failed test
    /// unwinds would abort the test binary.
    fn drop(&mut self) {
        let mut command = self.pg_ctl("stop");
        command.args(["-m", "immediate", "-w"]);
        let _ = command.output();
    }
}

impl fmt::Debug for TestPostgres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestPostgres")
            .field("dir", &self.dir.path())
            .field("port", &self.port)
            .field("user", &self.user)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// A port of 127.0.0.1 that was free when asked; another process may take it before its user does.
///
/// It comes from below the kernel's ephemeral range, so that between choosing it and binding it (and
/// while a server is stopped, see [`TestPostgres::start_again`]) no `bind(…:0)` or outgoing
/// connection elsewhere in the tests is handed it, and never twice in one process, so that two
/// servers or daemons of one test binary do not race for it.
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let below = ephemeral_start().unwrap_or(0);
    if below > LOWEST_PORT + 1024 {
        let span = u32::from(below - LOWEST_PORT);
        for _ in 0..1000 {
            let port = LOWEST_PORT + u16::try_from(random_u32() % span).expect("under the span");
            if !handed_out.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
                handed_out.insert(port);
                return port;
            }
        }
    }
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("binding 127.0.0.1:0 to find a free port")
            .port();
        if handed_out.insert(port) {
            return port;
        }
    }
}

/// The first port of the kernel's ephemeral range (`net.ipv4.ip_local_port_range`), if readable.
fn ephemeral_start() -> Option<u16> {
    fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A random number from the kernel.
fn random_u32() -> u32 {
    let mut bytes = [0u8; 4];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("reading /dev/urandom");
    u32::from_le_bytes(bytes)
}

/// 16 random bytes from the kernel, in hex: a password with no character that needs quoting.
fn random_hex() -> String {
    let mut bytes = [0u8; 16];
    File::open("/dev/urandom")
        .and_then(|mut urandom| urandom.read_exact(&mut bytes))
        .expect("reading 16 bytes from /dev/urandom for a password");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `path` in single quotes, for a shell.
fn shell_quote(path: &Path) -> String {
    let text = path
        .to_str()
        .expect("the temporary directory's path is UTF-8");
    assert!(
        !text.contains('\''),
        "the temporary directory's path holds a quote: {text}"
    );
    format!("'{text}'")
}

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests;
