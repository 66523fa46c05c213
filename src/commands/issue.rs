//! `meshca issue`: svid.pem, key.pem (0600) and bundle.pem for a workload that is not Envoy, from a running
//! daemon over SDS or straight from the local keystore.

use std::path::Path;
use std::process::ExitCode;
use std::time::SystemTime;

use anyhow::{anyhow, Context};
use futures::StreamExt;
use zeroize::Zeroizing;

use crate::cli::IssueArgs;
use meshca_control::{issue_standalone, load_world, renewal_time, rfc3339, StandaloneError};
use meshca_daemon::atomic_file::write_atomic;

use crate::InvalidInput;
use meshca_daemon::open_store;

/// What is written for the workload.
pub(super) struct Files {
    pub svid: String,
    pub key: Zeroizing<String>,
    pub bundle: String,
    /// More public files (name, PEM), written before the bundle.
    pub extra: Vec<(String, String)>,
}

/// Refuses an output directory that someone else could write into (and so plant or swap files in),
/// unless it is sticky and owned by the caller.
fn check_out_dir(dir: &Path, flag: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta =
        std::fs::metadata(dir).with_context(|| format!("{flag}: cannot read {}", dir.display()))?;
    if !meta.is_dir() {
        return Err(InvalidInput(format!("{flag}: {} is not a directory", dir.display())).into());
    }
    let me = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .with_context(|| "cannot tell which user runs meshca (/proc/self)")?;
    let writable_by_others = meta.mode() & 0o022 != 0;
    let sticky = meta.mode() & 0o1000 != 0;
    if writable_by_others && !(sticky && meta.uid() == me) {
        return Err(InvalidInput(format!(
            "{flag}: {} is writable by other users (mode {:o}), who could read or replace the private key; use a directory only you can write to",
            dir.display(),
            meta.mode() & 0o7777
        ))
        .into());
    }
    Ok(())
}

/// Writes the files into `dir` (created when absent; `flag` names it in errors), each atomically.
pub(super) fn write_files(
    dir: &Path,
    flag: &str,
    files: &Files,
    exec: Option<&str>,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("{flag}: cannot create {}", dir.display()))?;
    check_out_dir(dir, flag)?;
    // Trust first, then the key, then the certificate: a reader that sees the new certificate
    // already has the key and trust that go with it.
    for (name, pem) in &files.extra {
        write_atomic(dir, name, pem.as_bytes(), 0o644)?;
    }
    write_atomic(dir, "bundle.pem", files.bundle.as_bytes(), 0o644)?;
    write_atomic(dir, "key.pem", files.key.as_bytes(), 0o600)?;
    write_atomic(dir, "svid.pem", files.svid.as_bytes(), 0o644)?;
    if let Some(cmd) = exec {
        let mut command =
            meshca_daemon::children::without_secrets(std::process::Command::new("sh"));
        let status = command
            .arg("-c")
            .arg(cmd)
            .status()
            .with_context(|| format!("--exec {cmd:?}"))?;
        if !status.success() {
            tracing::warn!(command = cmd, %status, "--exec command failed");
        }
    }
    Ok(())
}

pub async fn run(args: IssueArgs) -> anyhow::Result<ExitCode> {
    match (&args.server, &args.mesh, &args.name) {
        (Some(server), _, _) => from_server(&args, server).await,
        (None, Some(mesh), Some(name)) => from_keystore(&args, mesh, name).await,
        _ => Err(InvalidInput(
            "give either --server ADDR --token-file F, or --mesh M --name N".into(),
        )
        .into()),
    }
}

async fn from_keystore(args: &IssueArgs, mesh: &str, name: &str) -> anyhow::Result<ExitCode> {
    let settings = super::load_settings(args.config.config.as_deref())?;
    let (_, store) = open_store(&settings)?;
    let keystore = store.keystore;
    loop {
        let now = SystemTime::now();
        let world = load_world(&settings, &*keystore, None, now).map_err(|errors| {
            let lines: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            anyhow::Error::new(InvalidInput(format!(
                "the resources are invalid:\n  {}",
                lines.join("\n  ")
            )))
        })?;
        let issued = issue_standalone(
            &world,
            &settings.zone,
            settings.issuance.key_algorithm,
            mesh,
            name,
            now,
        )
        .map_err(|e| match e {
            StandaloneError::NoIdentity { .. } => anyhow::Error::new(InvalidInput(e.to_string())),
            e => anyhow::Error::new(e),
        })?;
        let svid = issued.svid;
        let bundle = issued.bundle_pem;
        let files = Files {
            svid: svid.chain_pem.clone(),
            key: svid.key.to_pem(),
            bundle,
            extra: Vec::new(),
        };
        write_files(&args.out, "--out", &files, args.exec.as_deref())?;
        eprintln!(
            "wrote {} for {} (expires {})",
            args.out.display(),
            svid.spiffe_id,
            rfc3339(svid.not_after)
        );
        if !args.watch {
            return Ok(ExitCode::SUCCESS);
        }
        let renew = renewal_time(
            svid.not_before,
            svid.not_after,
            settings.issuance.renew_at,
            0.5,
        );
        let wait = renew.duration_since(SystemTime::now()).unwrap_or_default();
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
        }
    }
}

/// The mesh and name a token names, read without verifying it (the daemon verifies).
pub fn token_subject(token: &str) -> anyhow::Result<(String, String)> {
    use base64::Engine;
    let payload = token
        .split('.')
        .nth(1)
        .ok_or_else(|| anyhow!("the token file does not hold a token"))?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .map_err(|_| anyhow!("the token file does not hold a token"))?;
    let v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|_| anyhow!("the token file does not hold a token"))?;
    match (v["mesh"].as_str(), v["name"].as_str()) {
        (Some(m), Some(n)) => Ok((m.to_owned(), n.to_owned())),
        _ => Err(anyhow!("the token names no mesh and proxy")),
    }
}

/// Reads a token file (surrounding whitespace ignored).
pub fn read_token(path: &Path) -> anyhow::Result<String> {
    let text = meshca_files::read_text(
        path,
        meshca_files::PEM_FILE_BYTES,
        meshca_files::PEM_FILE_BOUND,
    )
    .with_context(|| format!("--token-file: cannot read {}", path.display()))?;
    Ok(text.trim().to_owned())
}

/// Connects to `server`, with TLS checked against `ca_file` unless it is a unix socket.
pub async fn connect(
    server: &str,
    ca_file: &Path,
    token: String,
) -> anyhow::Result<meshca_sds::SdsClient> {
    let tls = if server.starts_with("unix:") {
        None
    } else {
        let ca_pem = meshca_files::read(
            ca_file,
            meshca_files::PEM_FILE_BYTES,
            meshca_files::PEM_FILE_BOUND,
        )
        .with_context(|| {
            format!(
                "cannot read the SDS CA {} (give --server-ca, or use the unix socket)",
                ca_file.display()
            )
        })?;
        let host = server
            .rsplit_once(':')
            .map_or(server, |(h, _)| h)
            .trim_matches(['[', ']']);
        Some(meshca_serve::ClientTls {
            ca_pem,
            server_name: host.to_owned(),
        })
    };
    meshca_sds::SdsClient::connect(server, tls, token)
        .await
        .map_err(|e| anyhow!("cannot connect to {server}: {e}"))
}

async fn from_server(args: &IssueArgs, server: &str) -> anyhow::Result<ExitCode> {
    let settings = super::load_settings(args.config.config.as_deref())?;
    let token_file = args
        .token_file
        .as_deref()
        .ok_or_else(|| InvalidInput("--server needs --token-file".into()))?;
    let token = read_token(token_file)?;
    let (mesh, name) = token_subject(&token)?;
    let ca_file = args
        .server_ca
        .clone()
        .unwrap_or_else(|| meshca_daemon::daemon_keys::sds_ca_file(&settings.data_dir));
    let mut client = connect(server, &ca_file, token).await?;
    let names = vec!["default".to_owned(), format!("mesh_ca:secret:{mesh}")];
    let mut updates = Box::pin(
        client
            .stream(&format!("{mesh}.{name}"), &names, None)
            .await
            .map_err(|e| anyhow!("{e}"))?,
    );
    let mut identity: Option<(String, Zeroizing<String>)> = None;
    let mut bundle: Option<String> = None;
    while let Some(update) = updates.next().await {
        let secrets = update.map_err(|e| anyhow!("SDS stream from {server} failed: {e}"))?;
        for secret in &secrets {
            if let Some((chain, key)) = meshca_sds::tls_certificate_parts(secret) {
                identity = Some((chain, Zeroizing::new(key.expose().to_owned())));
            } else if let meshca_sds::SecretKindView::ValidationContext {
                trusted_ca_pem: Some(pem),
                ..
            } = meshca_sds::describe(secret).kind
            {
                bundle = Some(pem);
            }
        }
        if let (Some((svid, key)), Some(bundle)) = (&identity, &bundle) {
            let files = Files {
                svid: svid.clone(),
                key: key.clone(),
                bundle: bundle.clone(),
                extra: Vec::new(),
            };
            write_files(&args.out, "--out", &files, args.exec.as_deref())?;
            eprintln!("wrote {} for {mesh}.{name}", args.out.display());
            if !args.watch {
                return Ok(ExitCode::SUCCESS);
            }
        }
    }
    Err(anyhow!("the SDS stream from {server} ended"))
}
