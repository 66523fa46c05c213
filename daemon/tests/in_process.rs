//! Starts a daemon in process through the library's public API, with the embedded default settings
//! and a temporary data directory, and checks what an operator would: `/ready`, the SDS server CA
//! written for the TLS listener, and a stop that frees the data directory for the next daemon.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use meshca_config::{ListenAddr, Settings};
use meshca_daemon::{Daemon, DaemonOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long the daemon may take to answer `/ready` with 200, and then to stop.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The embedded defaults, with everything the daemon writes or binds under `root` or on loopback.
fn settings(root: &Path) -> Settings {
    let mut settings = Settings {
        data_dir: root.join("data"),
        resources: root.join("resources"),
        ..Settings::default()
    };
    settings.sds.listen = vec![
        ListenAddr::Unix(root.join("sds.sock")),
        ListenAddr::Tcp(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))),
    ];
    settings.sds.tls = None;
    settings.sds.insecure = false;
    settings.workload_api.listen = vec![root.join("workload.sock")];
    settings.admin.listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    settings
}

/// One HTTP/1.1 GET; the whole response, status line first.
async fn get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response)
}

/// Polls `/ready` until it answers 200, and returns that answer.
async fn wait_ready(admin: SocketAddr) -> String {
    let poll = async {
        loop {
            match get(admin, "/ready").await {
                Ok(response) if response.starts_with("HTTP/1.1 200") => return response,
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    };
    tokio::time::timeout(TIMEOUT, poll)
        .await
        .expect("/ready answers 200 in time")
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_started_in_process_is_ready_and_stops_cleanly() {
    let root = tempfile::tempdir().expect("a temp dir");
    let options = DaemonOptions {
        gate: true,
        watch_files: false,
    };
    let daemon = Daemon::start(settings(root.path()), options)
        .await
        .expect("the daemon starts");
    let ready = wait_ready(daemon.admin_addr).await;
    assert!(ready.ends_with("ready\n"), "{ready}");
    assert!(daemon.unix_target().is_some(), "{daemon:?}");
    assert_eq!(daemon.sds_addrs.len(), 2, "{daemon:?}");

    let data = root.path().join("data");
    assert_eq!(mode(&data), 0o700, "the data directory is private");
    let sds_ca = meshca_daemon::daemon_keys::sds_ca_file(&data);
    let pem = std::fs::read_to_string(&sds_ca).expect("the SDS server CA is written");
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");
    assert_eq!(
        mode(&sds_ca),
        0o644,
        "a certificate clients read to trust SDS"
    );

    tokio::time::timeout(TIMEOUT, daemon.stop())
        .await
        .expect("the daemon stops within the grace period");
    // Stopped means the data directory is free: a second daemon takes it and reuses its SDS CA.
    let again = Daemon::start(settings(root.path()), options)
        .await
        .expect("a second daemon starts on the same data directory");
    wait_ready(again.admin_addr).await;
    assert_eq!(std::fs::read_to_string(&sds_ca).expect("still there"), pem);
    again.stop().await;
}
