//! `meshca token`: mint a proxy token with the daemon's signing key, or revoke one.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use meshca_auth::{Claims, ProxyType};

use crate::cli::{Output, ProxyKind, TokenArgs};
use crate::serve::revocations::{self, Revoked};
use crate::serve::{daemon_keys, open_store};
use crate::InvalidInput;

fn invalid(msg: String) -> anyhow::Error {
    InvalidInput(msg).into()
}

fn pairs(flag: &str, values: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for v in values {
        let (k, val) =
            meshca_auth::parse_label(v).map_err(|e| invalid(format!("--{flag} {v:?}: {e}")))?;
        out.insert(k, val);
    }
    Ok(out)
}

pub fn run(args: TokenArgs) -> anyhow::Result<ExitCode> {
    let settings = super::load_settings(args.config.config.as_deref())?;
    if let Some(id) = &args.revoke {
        if id.len() != 32 || !id.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(invalid(format!(
                "--revoke {id:?}: a token id is 32 hex digits (printed by `meshca token`)"
            )));
        }
        let (data_dir, store) = open_store(&settings)?;
        let note = format!("revoked {}", meshca_control::rfc3339(SystemTime::now()));
        if let Some(database) = store.revocations() {
            let added = database
                .revoke(id, &note)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            match added {
                true => eprintln!(
                    "revoked token {id} in the database; every replica refuses it within {}s and closes its streams",
                    revocations::DATABASE_POLL.as_secs()
                ),
                false => eprintln!("token {id} was already revoked (in the database)"),
            }
            return Ok(ExitCode::SUCCESS);
        }
        let key_exists = daemon_keys::has_token_signing_key(&*store.keystore)?;
        let path = data_dir.revocation_list();
        match revocations::revoke(&path, id, key_exists)? {
            Revoked::Added => eprintln!(
                "revoked token {id} (listed in {}); a running daemon closes its streams",
                path.display()
            ),
            Revoked::Already => eprintln!(
                "token {id} was already revoked (listed in {})",
                path.display()
            ),
        }
        return Ok(ExitCode::SUCCESS);
    }
    let (Some(mesh), Some(name)) = (args.mesh.clone(), args.name.clone()) else {
        return Err(invalid("--mesh and --name are required".into()));
    };
    let valid_for: meshca_config::Duration = args
        .valid_for
        .parse()
        .map_err(|e| invalid(format!("--valid-for {:?}: {e}", args.valid_for)))?;
    let max_valid_for = settings.tokens.max_valid_for;
    if valid_for > max_valid_for {
        return Err(invalid(format!(
            "--valid-for {valid_for} is longer than tokens.maxValidFor ({max_valid_for}); mint a shorter \
             token and replace it before it expires, or raise tokens.maxValidFor in the settings"
        )));
    }
    let labels = pairs("label", &args.labels)?;
    let tags = pairs("tag", &args.tags)?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let proxy_type = match args.proxy_type {
        ProxyKind::Dataplane => ProxyType::Dataplane,
        ProxyKind::ZoneEgress => ProxyType::ZoneEgress,
    };
    let mut claims = Claims::new_dataplane(&mesh, &name, labels, tags, valid_for.as_std(), now)
        .map_err(|e| invalid(format!("{e}")))?;
    claims.proxy_type = proxy_type;

    let (data_dir, store) = open_store(&settings)?;
    let key = store.token_signing_key(&data_dir)?;
    let token = key
        .mint(&claims)
        .map_err(|e| anyhow::anyhow!("cannot sign the token: {e}"))?;
    match args.output {
        Output::Human => {
            println!("{token}");
            eprintln!(
                "token {} for {} ({}) valid until unix time {}",
                claims.id,
                claims.node_id(),
                claims.proxy_type,
                claims.expires_at
            );
        }
        Output::Json => super::print_json(&serde_json::json!({
            "token": token,
            "id": claims.id,
            "node_id": claims.node_id(),
            "type": claims.proxy_type.to_string(),
            "expires_at": claims.expires_at,
        }))?,
    }
    Ok(ExitCode::SUCCESS)
}
