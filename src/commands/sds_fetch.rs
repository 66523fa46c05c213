//! `meshca sds fetch`: ask a running daemon for secrets as Envoy would, and print them (keys redacted).

use std::process::ExitCode;

use anyhow::anyhow;
use meshca_config::ListenAddr;

use super::issue::{connect, read_token, token_subject};
use crate::cli::{Output, SdsFetchArgs};
use crate::InvalidInput;

pub async fn run(args: SdsFetchArgs) -> anyhow::Result<ExitCode> {
    let settings = super::load_settings(args.config.config.as_deref())?;
    let token = read_token(&args.token_file)?;
    let node_id = match &args.node_id {
        Some(id) => id.clone(),
        None => {
            let (mesh, name) = token_subject(&token)?;
            format!("{mesh}.{name}")
        }
    };
    let server = match &args.server {
        Some(s) => s.clone(),
        None => match settings.sds.listen.first() {
            Some(ListenAddr::Unix(p)) => format!("unix://{}", p.display()),
            Some(ListenAddr::Tcp(a)) => a.to_string(),
            None => {
                return Err(
                    InvalidInput("no --server and no sds.listen in the settings".into()).into(),
                )
            }
        },
    };
    let ca_file = args
        .server_ca
        .clone()
        .unwrap_or_else(|| meshca_daemon::daemon_keys::sds_ca_file(&settings.data_dir));
    let mut client = connect(&server, &ca_file, token).await?;
    let secrets = client
        .fetch(&node_id, &args.names, None)
        .await
        .map_err(|e| anyhow!("{e}"))?;
    let views: Vec<_> = secrets.iter().map(meshca_sds::describe).collect();
    match args.output {
        Output::Json => super::print_json(&views)?,
        Output::Human => {
            for v in &views {
                println!("{}", serde_json::to_string_pretty(v)?);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
