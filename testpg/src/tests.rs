use std::net::TcpStream;

use super::*;

/// Runs `sql` as `meshca` over TCP through `url`, as an application would connect: by password.
fn psql_over_tcp(pg: &TestPostgres, url: &str, password: &str, sql: &str) -> std::process::Output {
    let mut command = pg.command(&pg.programs.psql);
    command.env("PGPASSWORD", password).args([
        "-X",
        "-q",
        "-A",
        "-t",
        "-v",
        "ON_ERROR_STOP=1",
        "-d",
        url,
        "-c",
        sql,
    ]);
    process::output(&mut command, b"")
}

fn stdout(output: &std::process::Output) -> String {
    assert!(
        output.status.success(),
        "psql failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .trim_end()
        .to_owned()
}

#[test]
fn answers_sql_as_superuser() {
    let pg = TestPostgres::start();
    assert_eq!(pg.psql("meshca", "select 1"), "1");
    assert_eq!(pg.psql("meshca", "select 1, 'a'; select 2"), "1|a\n2");
    assert!(pg.is_running());
}

#[test]
fn meshca_logs_in_over_tcp_with_its_password_only() {
    let pg = TestPostgres::start();
    assert_eq!(
        pg.url(),
        format!("postgres://meshca@127.0.0.1:{}/meshca", pg.port())
    );
    assert_eq!(pg.password().len(), 32);
    let url = format!("{}?sslmode=disable", pg.url());
    let who = psql_over_tcp(
        &pg,
        &url,
        pg.password(),
        "select current_user, current_database()",
    );
    assert_eq!(stdout(&who), "meshca|meshca");
    let wrong = psql_over_tcp(&pg, &url, "not-the-password", "select 1");
    assert!(!wrong.status.success(), "a wrong password was accepted");
}

#[test]
fn creates_databases_owned_by_meshca() {
    let pg = TestPostgres::start();
    let url = pg.create_database("second_db1");
    assert_eq!(
        url,
        format!("postgres://meshca@127.0.0.1:{}/second_db1", pg.port())
    );
    let owner = pg.psql(
        "postgres",
        "select pg_get_userbyid(datdba) from pg_database where datname = 'second_db1'",
    );
    assert_eq!(owner, "meshca");
    let url = format!("{url}?sslmode=disable");
    let created = psql_over_tcp(
        &pg,
        &url,
        pg.password(),
        "create table t (x int); select 'ok'",
    );
    assert_eq!(stdout(&created), "ok");
}

#[test]
#[should_panic(expected = "does not match [a-z0-9_]+")]
fn rejects_database_names_that_need_quoting() {
    let pg = TestPostgres::start();
    pg.create_database("Bad-Name");
}

#[test]
fn psql_failure_quotes_stderr() {
    let pg = TestPostgres::start();
    let panic = std::panic::catch_unwind(|| pg.psql("meshca", "select * from no_such_table"))
        .expect_err("a failing statement must panic");
    let message = panic
        .downcast_ref::<String>()
        .expect("the panic message is a String");
    assert!(message.contains("psql"), "{message}");
    assert!(message.contains("no_such_table"), "{message}");
}

#[test]
fn stop_and_start_again_keep_the_data() {
    let mut pg = TestPostgres::start();
    pg.psql(
        "meshca",
        "create table kept (x int); insert into kept values (1), (2);",
    );
    let port = pg.port();
    pg.stop();
    assert!(!pg.is_running());
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    pg.start_again();
    assert!(pg.is_running());
    assert_eq!(pg.port(), port);
    assert_eq!(pg.psql("meshca", "select count(*) from kept"), "2");
}

#[test]
fn dump_holds_schema_and_data() {
    let pg = TestPostgres::start();
    pg.psql(
        "meshca",
        "create table secrets (v text); insert into secrets values ('marker-4f1c');",
    );
    let dump = String::from_utf8(pg.dump("meshca")).expect("the dump is UTF-8");
    assert!(dump.contains("CREATE TABLE public.secrets"), "{dump}");
    assert!(dump.contains("marker-4f1c"), "{dump}");
}

#[test]
fn serves_tls_when_given_a_certificate() {
    let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
    let pg = TestPostgres::start_with_tls(
        &certified.cert.pem(),
        &certified.signing_key.serialize_pem(),
    );
    assert_eq!(pg.psql("meshca", "show ssl"), "on");
    let url = format!("{}?sslmode=require", pg.url());
    let ssl = psql_over_tcp(
        &pg,
        &url,
        pg.password(),
        "select ssl from pg_stat_ssl where pid = pg_backend_pid()",
    );
    assert_eq!(stdout(&ssl), "t");
}

#[test]
fn tls_survives_a_restart() {
    let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
    let mut pg = TestPostgres::start_with_tls(
        &certified.cert.pem(),
        &certified.signing_key.serialize_pem(),
    );
    pg.stop();
    pg.start_again();
    assert_eq!(pg.psql("meshca", "show ssl"), "on");
}

#[test]
fn plain_server_has_no_tls() {
    let pg = TestPostgres::start();
    assert_eq!(pg.psql("meshca", "show ssl"), "off");
}

#[test]
fn two_servers_run_at_once() {
    let first = TestPostgres::start();
    let second = TestPostgres::start();
    assert_ne!(first.port(), second.port());
    first.psql("meshca", "create table only_here (x int)");
    assert_eq!(
        second.psql(
            "meshca",
            "select count(*) from pg_tables where tablename = 'only_here'"
        ),
        "0"
    );
}

#[test]
fn log_shows_the_server_starting() {
    let pg = TestPostgres::start();
    assert!(
        pg.log()
            .contains("database system is ready to accept connections"),
        "{}",
        pg.log()
    );
}

#[test]
fn drop_stops_the_server_and_deletes_its_directory() {
    let pg = TestPostgres::start();
    let dir = pg.dir.path().to_path_buf();
    let port = pg.port();
    drop(pg);
    assert!(!dir.exists(), "{} still exists", dir.display());
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[test]
fn a_taken_port_is_recognised_and_reported_with_the_log() {
    let mut pg = TestPostgres::start();
    pg.stop();
    let _squatter = std::net::TcpListener::bind(("127.0.0.1", pg.port())).unwrap();
    let Err(failure) = pg.try_start() else {
        panic!("the server started on a port another socket holds");
    };
    assert!(failure.port_taken, "{}", failure.message);
    assert!(failure.message.contains("pg_ctl"), "{}", failure.message);
    assert!(
        failure.message.contains("Address already in use"),
        "{}",
        failure.message
    );
}

/// Ports are never handed out twice in one process, and come from below the ephemeral range (where
/// no `bind(…:0)` is given them while a stopped server is away).
#[test]
fn free_ports_are_all_different_and_below_the_ephemeral_range() {
    let ports: Vec<u16> = (0..500).map(|_| free_port()).collect();
    let distinct: BTreeSet<u16> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), ports.len(), "a port was handed out twice");
    let start = ephemeral_start().expect("the ephemeral range is readable on Linux");
    assert!(
        start > LOWEST_PORT + 1024,
        "ephemeral range starts at {start}"
    );
    assert!(
        ports.iter().all(|p| (LOWEST_PORT..start).contains(p)),
        "{ports:?}"
    );
}
