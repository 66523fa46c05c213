//! `MESHCA_<PATH>` environment overrides.

use std::collections::BTreeMap;

use super::env_value::EnvValueError;
use super::file::{fields, Layer};
use super::types::{PKCS11_PIN_ENV, POSTGRES_PASSWORD_ENV};
use super::{SettingsError, SettingsWarning};

/// The prefix of every settings environment variable.
pub const ENV_PREFIX: &str = "MESHCA_";

/// The test hook that kills the process at its Nth write (`meshca_keystore::CRASH_AT_ENV`): not a
/// setting, and announced by the hook itself at every write while set.
const TEST_CRASH_AT_ENV: &str = "MESHCA_TEST_CRASH_AT";

/// Every accepted variable name for a field: each camelCase segment may be glued (`DATADIR`) or
/// snake-cased (`DATA_DIR`); segments are joined with `_`.
fn variable_names(field: &str) -> Vec<String> {
    let mut names = vec![ENV_PREFIX.trim_end_matches('_').to_owned()];
    for segment in field.split('.') {
        let glued = segment.to_ascii_uppercase();
        let mut snake = String::new();
        for c in segment.chars() {
            if c.is_ascii_uppercase() {
                snake.push('_');
            }
            snake.push(c.to_ascii_uppercase());
        }
        let mut spellings = vec![glued];
        if !spellings.contains(&snake) {
            spellings.push(snake);
        }
        names = names
            .iter()
            .flat_map(|prefix| spellings.iter().map(move |s| format!("{prefix}_{s}")))
            .collect();
    }
    names
}

/// Every accepted variable name, mapped to the field it sets.
fn variables() -> BTreeMap<String, &'static str> {
    fields()
        .flat_map(|field| {
            variable_names(field)
                .into_iter()
                .map(move |name| (name, field))
        })
        .collect()
}

/// The canonical (snake-cased) variable name of every field, for error messages and docs.
pub fn settings_env_vars() -> Vec<String> {
    fields()
        .filter_map(|field| variable_names(field).pop())
        .collect()
}

/// Applies every `MESHCA_*` variable in `env` to `layer`. Returns the field each variable set,
/// with the variable's name, so errors found later can name it.
pub(super) fn apply(
    layer: &mut Layer,
    env: impl IntoIterator<Item = (String, String)>,
    warnings: &mut Vec<SettingsWarning>,
) -> Result<BTreeMap<&'static str, String>, SettingsError> {
    let known = variables();
    let mut set_by: BTreeMap<&'static str, String> = BTreeMap::new();
    let mut vars: Vec<(String, String)> = env
        .into_iter()
        .filter(|(k, _)| k.starts_with(ENV_PREFIX))
        .collect();
    vars.sort();
    for (var, value) in vars {
        if var == POSTGRES_PASSWORD_ENV || var == PKCS11_PIN_ENV || var == TEST_CRASH_AT_ENV {
            // A secret the daemon reads itself, or the test hook: never a settings field.
            continue;
        }
        let Some(&field) = known.get(&var) else {
            // Other tools share the prefix (a test harness's MESHCA_BIN, say): warn, do not refuse to start.
            warnings.push(SettingsWarning {
                origin: var.clone(),
                message: format!(
                    "not a meshca setting, ignored (the settings variables are {})",
                    settings_env_vars().join(", ")
                ),
            });
            continue;
        };
        if let Some(first) = set_by.get(field) {
            return Err(SettingsError::ConflictingEnv {
                first: first.clone(),
                second: var,
                field: field.to_owned(),
            });
        }
        layer
            .set(field, &value)
            .map_err(|e| SettingsError::Invalid {
                origin: var.clone(),
                field: field.to_owned(),
                message: e.to_string(),
            })?;
        set_by.insert(field, var);
    }
    Ok(set_by)
}

/// Applies overrides given on a command line on top of `layer`: each is a field (one of the file's
/// dotted paths), where it came from (`--server`, for errors) and its text, read as the field's
/// environment variable would be. Returns the field each set, with its origin.
pub(super) fn apply_overrides(
    layer: &mut Layer,
    overrides: impl IntoIterator<Item = (String, String, String)>,
) -> Result<BTreeMap<&'static str, String>, SettingsError> {
    let mut set_by = BTreeMap::new();
    for (field, origin, value) in overrides {
        let Some(known) = fields().find(|f| *f == field) else {
            return Err(SettingsError::Invalid {
                origin,
                field,
                message: EnvValueError::NotASetting.to_string(),
            });
        };
        layer
            .set(known, &value)
            .map_err(|e| SettingsError::Invalid {
                origin: origin.clone(),
                field: known.to_owned(),
                message: e.to_string(),
            })?;
        set_by.insert(known, origin);
    }
    Ok(set_by)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_accept_glued_and_snake_segments() {
        assert_eq!(
            variable_names("dataDir"),
            ["MESHCA_DATADIR", "MESHCA_DATA_DIR"]
        );
        assert_eq!(variable_names("zone"), ["MESHCA_ZONE"]);
        assert_eq!(
            variable_names("sds.tls.certFile"),
            ["MESHCA_SDS_TLS_CERTFILE", "MESHCA_SDS_TLS_CERT_FILE"]
        );
    }

    #[test]
    fn every_field_can_be_set() {
        for field in fields() {
            let mut layer = Layer::default();
            let value = match field {
                "sds.listen" => "127.0.0.1:1,unix:///x",
                "workloadApi.listen" => "unix:///w",
                "admin.listen" | "agent.admin" => "127.0.0.1:1",
                "agent.servers" => "ca:5678,unix:///s",
                "agent.listen" => "unix:///w",
                "sds.insecure" => "true",
                "issuance.keyAlgorithm" => "rsa-2048",
                "issuance.renewAt" => "0.5",
                "issuance.workers" => "2",
                "issuance.keysAhead" => "16",
                "rollout.ackTimeout" | "federation.staleAfter" | "federation.fetchMargin" => "5s",
                "federation.refreshHint" => "1m",
                "federation.endpoints" => "[{trustDomain: a.example, listen: \"127.0.0.1:8443\"}]",
                "workloadApi.ackAfter" => "2s",
                "workloadApi.jwtKeyLifetime" => "12h",
                "keystore.type" => "file",
                "keystore.postgres.timeout" | "replica.leaseTimeout" => "5s",
                "keystore.postgres.maxConnections" => "4",
                "tokens.maxValidFor" => "30d",
                limit if limit.ends_with("Timeout") => "5s",
                limit if limit.starts_with("limits.") => "3",
                _ => "x",
            };
            assert_eq!(layer.set(field, value), Ok(()), "{field}");
            for other in fields() {
                assert_eq!(
                    layer.is_set(other),
                    other == field,
                    "{field} set, {other} asked"
                );
            }
        }
    }
}
