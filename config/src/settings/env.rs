//! `MESHCA_<PATH>` environment overrides.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::str::FromStr;

use super::file::{fields, Layer};
use super::limits::LimitError;
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
        set(layer, field, &value).map_err(|e| SettingsError::Invalid {
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
                message: "not a settings field".to_owned(),
            });
        };
        set(layer, known, &value).map_err(|e| SettingsError::Invalid {
            origin: origin.clone(),
            field: known.to_owned(),
            message: e.to_string(),
        })?;
        set_by.insert(known, origin);
    }
    Ok(set_by)
}

/// Why an environment variable's text is not a value of its field; the caller names the variable
/// and the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
enum EnvValueError {
    /// The variable is set to the empty string.
    #[error("must not be empty; unset the variable to use the default")]
    Empty,
    /// The field's own parser refused the text (a listen address, a duration, a key algorithm).
    #[error("{0}")]
    Parse(String),
    /// A switch that is not `true`, `false`, `1` or `0`.
    #[error("expected true or false, got {0:?}")]
    NotBool(String),
    /// A number was expected.
    #[error("expected a number, got {0:?}")]
    NotNumber(String),
    /// A whole number was expected.
    #[error("expected a whole number, got {0:?}")]
    NotWholeNumber(String),
    /// A limit's value.
    #[error(transparent)]
    Limit(#[from] LimitError),
}

fn parse<T: FromStr>(value: &str) -> Result<T, EnvValueError>
where
    T::Err: Display,
{
    value
        .parse()
        .map_err(|e: T::Err| EnvValueError::Parse(e.to_string()))
}

fn non_empty(value: &str) -> Result<String, EnvValueError> {
    if value.is_empty() {
        Err(EnvValueError::Empty)
    } else {
        Ok(value.to_owned())
    }
}

fn parse_bool(value: &str) -> Result<bool, EnvValueError> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(EnvValueError::NotBool(value.to_owned())),
    }
}

/// A number of `T`, or the error `refused` makes of the text.
fn parse_number<T: FromStr>(
    value: &str,
    refused: fn(String) -> EnvValueError,
) -> Result<T, EnvValueError> {
    value.parse().map_err(|_| refused(value.to_owned()))
}

fn parse_list<T: FromStr>(value: &str) -> Result<Vec<T>, EnvValueError>
where
    T::Err: Display,
{
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(parse)
        .collect()
}

/// Sets one field of `layer` from the text of an environment variable.
fn set(layer: &mut Layer, field: &str, value: &str) -> Result<(), EnvValueError> {
    if field == "workloadApi.listen" {
        // The one list an empty value is meaningful for: it turns the Workload API off.
        layer.workload_api.get_or_insert_default().listen = Some(parse_list(value)?);
        return Ok(());
    }
    let value = non_empty(value)?;
    let value = value.as_str();
    match field {
        "zone" => layer.zone = Some(value.to_owned()),
        "dataDir" => layer.data_dir = Some(value.into()),
        "resources" => layer.resources = Some(value.into()),
        "defaults.mesh" => layer.defaults.get_or_insert_default().mesh = Some(value.to_owned()),
        "sds.listen" => layer.sds.get_or_insert_default().listen = Some(parse_list(value)?),
        "sds.tls.certFile" => {
            let sds = layer.sds.get_or_insert_default();
            sds.tls.get_or_insert_default().cert_file = Some(value.into());
        }
        "sds.tls.keyFile" => {
            let sds = layer.sds.get_or_insert_default();
            sds.tls.get_or_insert_default().key_file = Some(value.into());
        }
        "sds.insecure" => layer.sds.get_or_insert_default().insecure = Some(parse_bool(value)?),
        "admin.listen" => layer.admin.get_or_insert_default().listen = Some(parse(value)?),
        "admin.allowedHosts" => {
            layer.admin.get_or_insert_default().allowed_hosts = Some(parse_list(value)?);
        }
        "issuance.keyAlgorithm" => {
            layer.issuance.get_or_insert_default().key_algorithm = Some(parse(value)?);
        }
        "issuance.renewAt" => {
            let renew_at = parse_number::<f64>(value, EnvValueError::NotNumber)?;
            layer.issuance.get_or_insert_default().renew_at = Some(renew_at);
        }
        "issuance.workers" => {
            let workers = parse_number::<usize>(value, EnvValueError::NotWholeNumber)?;
            layer.issuance.get_or_insert_default().workers = Some(workers);
        }
        "issuance.keysAhead" => {
            let keys = parse_number::<usize>(value, EnvValueError::NotWholeNumber)?;
            layer.issuance.get_or_insert_default().keys_ahead = Some(keys);
        }
        "workloadApi.ackAfter" => {
            layer.workload_api.get_or_insert_default().ack_after = Some(parse(value)?)
        }
        "workloadApi.jwtKeyLifetime" => {
            layer.workload_api.get_or_insert_default().jwt_key_lifetime = Some(parse(value)?)
        }
        "rollout.ackTimeout" => {
            layer.rollout.get_or_insert_default().ack_timeout = Some(parse(value)?)
        }
        "keystore.type" => layer.keystore.get_or_insert_default().kind = Some(parse(value)?),
        postgres if postgres.starts_with("keystore.postgres.") => {
            let layer = layer
                .keystore
                .get_or_insert_default()
                .postgres
                .get_or_insert_default();
            match postgres {
                "keystore.postgres.url" => layer.url = Some(value.to_owned()),
                "keystore.postgres.passwordFile" => layer.password_file = Some(value.into()),
                "keystore.postgres.keyEncryptionKeyFile" => {
                    layer.key_encryption_key_file = Some(value.into())
                }
                "keystore.postgres.caFile" => layer.ca_file = Some(value.into()),
                "keystore.postgres.timeout" => layer.timeout = Some(parse(value)?),
                "keystore.postgres.maxConnections" => {
                    layer.max_connections =
                        Some(parse_number(value, EnvValueError::NotWholeNumber)?)
                }
                other => {
                    unreachable!("FIELDS and set() list the same fields; {other} is missing here")
                }
            }
        }
        pkcs11 if pkcs11.starts_with("keystore.pkcs11.") => {
            let layer = layer
                .keystore
                .get_or_insert_default()
                .pkcs11
                .get_or_insert_default();
            match pkcs11 {
                "keystore.pkcs11.module" => layer.module = Some(value.into()),
                "keystore.pkcs11.token" => layer.token = Some(value.to_owned()),
                "keystore.pkcs11.pinFile" => layer.pin_file = Some(value.into()),
                other => {
                    unreachable!("FIELDS and set() list the same fields; {other} is missing here")
                }
            }
        }
        "replica.name" => layer.replica.get_or_insert_default().name = Some(value.to_owned()),
        "replica.leaseTimeout" => {
            layer.replica.get_or_insert_default().lease_timeout = Some(parse(value)?)
        }
        "tokens.maxValidFor" => {
            layer.tokens.get_or_insert_default().max_valid_for = Some(parse(value)?)
        }
        limit if limit.starts_with("limits.") => {
            layer.limits.get_or_insert_default().set(limit, value)?;
        }
        "agent.servers" => layer.agent.get_or_insert_default().servers = Some(parse_list(value)?),
        "agent.tokenFile" => layer.agent.get_or_insert_default().token_file = Some(value.into()),
        "agent.sdsCa" => layer.agent.get_or_insert_default().sds_ca = Some(value.into()),
        "agent.listen" => layer.agent.get_or_insert_default().listen = Some(parse(value)?),
        "agent.admin" => layer.agent.get_or_insert_default().admin = Some(parse(value)?),
        other => unreachable!("FIELDS and set() list the same fields; {other} is missing here"),
    }
    Ok(())
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
                "rollout.ackTimeout" => "5s",
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
            assert_eq!(set(&mut layer, field, value), Ok(()), "{field}");
            assert!(layer.is_set(field), "{field}");
        }
    }
}
