//! `meshca token`: mint a proxy token with the daemon's signing key, or revoke one.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use meshca_auth::{Claims, ProxyType};

use crate::cli::{Output, ProxyKind, TokenArgs};
use crate::InvalidInput;
use meshca_daemon::revocations::{self, Revoked};
use meshca_daemon::{daemon_keys, open_store_without_ca_keys as open_store};

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

/// A token's expiry as meshca shows a certificate's: the UTC date (RFC 3339) and the time left. A time
/// past what a date can hold (year 9999, reachable only through a huge `tokens.maxValidFor`) is shown
/// as the unix time it is.
fn expiry(expires_at: u64, now: SystemTime) -> String {
    let representable = i64::try_from(expires_at)
        .ok()
        .is_some_and(|secs| time::OffsetDateTime::from_unix_timestamp(secs).is_ok());
    if !representable {
        return format!("unix time {expires_at}");
    }
    let t = UNIX_EPOCH + Duration::from_secs(expires_at);
    format!(
        "{} ({} left)",
        meshca_control::rfc3339(t),
        super::human_duration(meshca_control::seconds_until(t, now))
    )
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
    let Some(name) = args.name.clone() else {
        return Err(invalid("--name is required".into()));
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
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let claims = match args.proxy_type {
        ProxyKind::Agent => {
            if args.mesh.is_some() || !args.labels.is_empty() || !args.tags.is_empty() {
                return Err(invalid(
                    "--type agent takes no --mesh, --label or --tag: an agent serves the \
                     WorkloadRegistrations of any mesh that name it (spec.agent)"
                        .into(),
                ));
            }
            Claims::new_agent(&name, valid_for.as_std(), now)
        }
        kind @ (ProxyKind::Dataplane | ProxyKind::ZoneEgress) => {
            let Some(mesh) = args.mesh.clone() else {
                return Err(invalid("--mesh is required for a proxy's token".into()));
            };
            let labels = pairs("label", &args.labels)?;
            let tags = pairs("tag", &args.tags)?;
            let proxy_type = match kind {
                ProxyKind::ZoneEgress => ProxyType::ZoneEgress,
                _ => ProxyType::Dataplane,
            };
            Claims::new_dataplane(&mesh, &name, labels, tags, valid_for.as_std(), now).map(
                |mut claims| {
                    claims.proxy_type = proxy_type;
                    claims
                },
            )
        }
    }
    .map_err(|e| invalid(format!("{e}")))?;

    let (data_dir, store) = meshca_daemon::open_store_to_mint(&settings)?;
    let key = store.token_signing_key(&data_dir)?;
    let token = key
        .mint(&claims)
        .map_err(|e| anyhow::anyhow!("cannot sign the token: {e}"))?;
    match args.output {
        Output::Human => {
            println!("{token}");
            eprintln!(
                "token {} for {} ({}) valid until {}",
                claims.id,
                claims.subject(),
                claims.proxy_type,
                expiry(claims.expires_at, SystemTime::now())
            );
        }
        Output::Json => super::print_json(&serde_json::json!({
            "token": token,
            "id": claims.id,
            "node_id": (claims.proxy_type != ProxyType::Agent).then(|| claims.node_id()),
            "subject": claims.subject(),
            "type": claims.proxy_type.to_string(),
            "expires_at": claims.expires_at,
        }))?,
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_is_a_utc_date_and_the_time_left() {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        assert_eq!(
            expiry(1_800_000_000 + 2 * 86_400 + 3600, now),
            "2027-01-17T09:00:00Z (2d1h left)"
        );
        assert_eq!(
            expiry(u64::MAX, now),
            format!("unix time {}", u64::MAX),
            "beyond year 9999"
        );
    }
}
