//! `meshca bootstrap`: print an Envoy bootstrap for the proxy a token names.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use meshca_auth::Verifier;
use meshca_config::ListenAddr;

use crate::cli::BootstrapArgs;
use crate::InvalidInput;
use meshca_sds::bootstrap::{Bootstrap, SdsTarget};

pub fn run(args: BootstrapArgs) -> anyhow::Result<ExitCode> {
    meshca_sds::bootstrap::check_ports(args.admin_port, &args.inbound, &args.outbound)
        .map_err(|clash| InvalidInput(clash.to_string()))?;
    let settings = super::load_settings(args.config.config.as_deref())?;
    let token = super::issue::read_token(&args.token_file)?;
    let claims = Verifier::read_unverified(&token).map_err(|e| {
        InvalidInput(format!(
            "--token-file {}: not a meshca token: {e}",
            args.token_file.display()
        ))
    })?;
    if claims.proxy_type == meshca_auth::ProxyType::Agent {
        return Err(InvalidInput(format!(
            "--token-file {}: an agent's token ({}) bootstraps no Envoy: mint the proxy's own with              `meshca token --mesh M --name N`",
            args.token_file.display(),
            claims.name
        ))
        .into());
    }
    let sds = match &args.server {
        Some(server) => target(server, args.sds_ca.as_deref(), &settings.data_dir)?,
        None => {
            let socket = settings.sds.listen.iter().find_map(|addr| match addr {
                ListenAddr::Unix(path) => Some(path.clone()),
                ListenAddr::Tcp(_) => None,
            });
            let socket = socket.ok_or_else(|| {
                InvalidInput(
                    "the settings name no unix SDS listener: pass --server unix:///path or --server host:port"
                        .to_owned(),
                )
            })?;
            SdsTarget::Unix(absolute(&socket)?)
        }
    };
    let bootstrap = Bootstrap {
        token,
        claims,
        sds,
        admin_port: args.admin_port,
        inbound: args.inbound,
        outbound: args.outbound,
        one_request_per_connection: args.one_request_per_connection,
    };
    print!("{}", bootstrap.to_yaml()?);
    Ok(ExitCode::SUCCESS)
}

/// `--server` as an SDS target: `unix://PATH`, or `host:port` with the CA of meshca's certificate.
fn target(server: &str, sds_ca: Option<&Path>, data_dir: &Path) -> anyhow::Result<SdsTarget> {
    if let Some(path) = server.strip_prefix("unix://") {
        if path.is_empty() {
            return Err(InvalidInput("--server unix:// needs a path".to_owned()).into());
        }
        return Ok(SdsTarget::Unix(absolute(Path::new(path))?));
    }
    let (host, port) = server
        .rsplit_once(':')
        .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
        .filter(|(host, port)| !host.is_empty() && *port != 0)
        .ok_or_else(|| {
            InvalidInput(format!(
                "--server {server:?}: expected unix:///path or host:port"
            ))
        })?;
    let ca_file = match sds_ca {
        Some(file) => file.to_path_buf(),
        None => data_dir.join("sds-ca.pem"),
    };
    if let Err(e) = meshca_files::open(&ca_file) {
        let why = match e.kind() {
            std::io::ErrorKind::NotFound => "no such file".to_owned(),
            _ => e.to_string(),
        };
        return Err(InvalidInput(format!(
            "--sds-ca {}: {why} (the CA of meshca's SDS certificate, `<dataDir>/sds-ca.pem` on the meshca host)",
            ca_file.display()
        ))
        .into());
    }
    Ok(SdsTarget::Tls {
        host: host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
        port,
        ca_file: absolute(&ca_file)?,
    })
}

/// Envoy resolves relative paths against its own working directory: make them absolute here.
fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("cannot resolve {}", path.display()))
}
