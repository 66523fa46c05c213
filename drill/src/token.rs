//! A drill with `--pkcs11`: its daemon makes every CA key (and its own keys) in the operator's token.
//! Afterwards the drill counts where the CA keys were (the sandbox keystore holds a `pkcs11:` URI for
//! each key in the token, a key file otherwise) and destroys every key it made, so that drills leave no
//! key behind.

use std::path::Path;

use anyhow::Context;
use meshca_config::Settings;
use meshca_hsm::Pkcs11Uri;

use crate::report::TokenReport;

/// Counts the drill's CA keys by where they were, and destroys those in the token.
pub fn clean_up(settings: &Settings) -> anyhow::Result<TokenReport> {
    let token = meshca_daemon::open_token(settings)?
        .context("the drill's settings name no PKCS#11 token")?;
    let mut report = TokenReport {
        token: token.label().to_owned(),
        ca_keys_in_token: 0,
        ca_keys_in_files: 0,
    };
    // Every key the sandbox keystore records in the token is the drill's: its CAs', and the daemon's own
    // (the token signing key, the SDS CA's, JWT-SVID keys).
    let keystore = settings.data_dir.join("keystore");
    let cas = keystore.join("ca");
    for file in files_under(&keystore)? {
        let is_ca = file.starts_with(&cas);
        match file.file_name().and_then(|n| n.to_str()) {
            Some("key.pem") if is_ca => report.ca_keys_in_files += 1,
            Some(name) if name.ends_with(".pkcs11") => {
                if is_ca {
                    report.ca_keys_in_token += 1;
                }
                let text = std::fs::read_to_string(&file)
                    .with_context(|| format!("cannot read {}", file.display()))?;
                let uri = Pkcs11Uri::parse(text.trim())
                    .with_context(|| format!("{} holds no pkcs11: URI", file.display()))?;
                if let Some(id) = uri.id() {
                    token.destroy_keys(id)?;
                }
            }
            _ => {}
        }
    }
    Ok(report)
}

/// Every file under `dir`, at any depth; none when it does not exist.
fn files_under(dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
        };
        for entry in entries {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push(path);
            }
        }
    }
    Ok(files)
}
