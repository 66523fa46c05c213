//! Layering (defaults, file, environment) and the checks that need the final values.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::file::{fields, EndpointTlsLayer, FederationLayer, Layer};
use super::types::{
    default_replica_name, AdminSettings, Defaults, EndpointServing, FederationEndpoint,
    FederationSettings, IssuanceSettings, KeystoreSettings, KeystoreType, Pkcs11Settings,
    PostgresSettings, ReplicaSettings, RolloutSettings, SdsSettings, TlsFiles, TokensSettings,
    WorkloadApiSettings, DEFAULT_ACK_TIMEOUT, DEFAULT_ADMIN_LISTEN, DEFAULT_DATA_DIR,
    DEFAULT_FEDERATION_FETCH_MARGIN, DEFAULT_FEDERATION_REFRESH_HINT,
    DEFAULT_FEDERATION_STALE_AFTER, DEFAULT_KEYS_AHEAD, DEFAULT_LEASE_TIMEOUT,
    DEFAULT_POSTGRES_MAX_CONNECTIONS, DEFAULT_POSTGRES_TIMEOUT, DEFAULT_RENEW_AT,
    DEFAULT_TOKEN_MAX_VALID_FOR, DEFAULT_WORKLOAD_ACK_AFTER, DEFAULT_WORKLOAD_JWT_KEY_LIFETIME,
    DEFAULT_ZONE, FALLBACK_REPLICA_NAME, MAX_ISSUANCE_WORKERS, MAX_KEYS_AHEAD,
    MAX_PKCS11_TOKEN_LABEL, MAX_POSTGRES_CONNECTIONS,
};
use super::{
    env, AgentSettings, ListenAddr, Settings, SettingsError, SettingsWarning, DEFAULT_AGENT_ADMIN,
    DEFAULT_AGENT_LISTEN,
};
use crate::names::check_name;

/// The largest settings file read; a settings file is a few hundred bytes.
pub const SETTINGS_FILE_BYTES: u64 = 1024 * 1024;
/// How a read error names a bound that is not a setting.
const FIXED_BOUND: &str = "a fixed bound";

const DEFAULTS_ORIGIN: &str = "built-in defaults";

/// `keystore.pkcs11`, whose origin is where any of its fields, or the empty section, was set.
const PKCS11: &str = "keystore.pkcs11";

impl Settings {
    /// Loads the settings: the embedded defaults, then the YAML file at `path` (if any), then the
    /// `MESHCA_*` variables in `env` (pass `std::env::vars()` in the daemon).
    ///
    /// A variable's name is `MESHCA_` and the field's path, upper-cased and joined by `_`; a
    /// camelCase key may be glued or snake-cased (`MESHCA_DATADIR` or `MESHCA_DATA_DIR`). Lists
    /// (`MESHCA_SDS_LISTEN`) are comma separated. Unknown keys in the file are errors; an unknown
    /// `MESHCA_*` variable is logged as a warning and ignored, since other tools share the prefix
    /// (the command line's own variables, such as `MESHCA_CONFIG`, are left out by the caller).
    /// Relative paths stay relative to the
    /// working directory. If `dataDir` is set but `resources`, `sds.listen` or
    /// `workloadApi.listen` are not, those follow `dataDir`. An empty `MESHCA_WORKLOAD_API_LISTEN`
    /// (or `workloadApi.listen: []`) turns the Workload API off.
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, SettingsError> {
        Settings::load_with_overrides(path, env, Vec::new())
    }

    /// [`Settings::load`], returning what it would log as warnings (an unknown `MESHCA_*`
    /// variable) instead of logging them: for `meshca validate`'s report.
    pub fn load_reporting(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(Settings, Vec<SettingsWarning>), SettingsError> {
        let mut warnings = Vec::new();
        let settings = Settings::load_collecting(path, env, Vec::new(), &mut warnings)?;
        Ok((settings, warnings))
    }

    /// [`Settings::load`], then `overrides` on top of the environment: each is a field's dotted path
    /// (`agent.servers`), where it came from (a command-line flag, which errors name) and its text,
    /// read as the field's environment variable is.
    pub fn load_with_overrides(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: Vec<(String, String, String)>,
    ) -> Result<Settings, SettingsError> {
        let mut warnings = Vec::new();
        let loaded = Settings::load_collecting(path, env, overrides, &mut warnings);
        for warning in &warnings {
            tracing::warn!("{warning}");
        }
        loaded
    }

    fn load_collecting(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: Vec<(String, String, String)>,
        warnings: &mut Vec<SettingsWarning>,
    ) -> Result<Settings, SettingsError> {
        let mut origins: BTreeMap<&'static str, String> = BTreeMap::new();
        let mut layer = match path {
            Some(path) => {
                let text = meshca_files::read_text(path, SETTINGS_FILE_BYTES, FIXED_BOUND)
                    .map_err(|source| SettingsError::Read {
                        path: path.to_owned(),
                        source,
                    })?;
                let layer = parse_file(path, &text)?;
                for field in fields().filter(|f| layer.is_set(f)) {
                    origins.insert(field, path.display().to_string());
                }
                if layer.keystore.as_ref().is_some_and(|k| k.pkcs11.is_some()) {
                    // `pkcs11: {}` sets no field, but an error about what it lacks names the file.
                    origins.insert(PKCS11, path.display().to_string());
                }
                layer
            }
            None => Layer::default(),
        };
        origins.extend(env::apply(&mut layer, env, warnings)?);
        origins.extend(env::apply_overrides(&mut layer, overrides)?);
        resolve(layer, &origins)
    }
}

/// Parses the text of a settings file; an empty file (or one with only comments) sets nothing.
pub(super) fn parse_file(path: &Path, text: &str) -> Result<Layer, SettingsError> {
    let value: yaml_serde::Value =
        yaml_serde::from_str(text).map_err(|e| SettingsError::Syntax {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
    if value.is_null() {
        return Ok(Layer::default());
    }
    crate::yaml::deserialize(yaml_serde::Deserializer::from_str(text)).map_err(|e| {
        SettingsError::Invalid {
            origin: path.display().to_string(),
            field: e.field,
            message: e.message,
        }
    })
}

/// Builds errors that name where a field was set.
struct Origins<'a>(&'a BTreeMap<&'static str, String>);

impl Origins<'_> {
    fn of(&self, field: &str) -> String {
        self.0
            .get(field)
            .cloned()
            .unwrap_or_else(|| DEFAULTS_ORIGIN.to_owned())
    }

    fn invalid(&self, field: &str, message: impl Into<String>) -> SettingsError {
        self.invalid_from(field, field, message)
    }

    /// An error about `field` whose value came from where `origin_field` was set.
    fn invalid_from(
        &self,
        origin_field: &str,
        field: &str,
        message: impl Into<String>,
    ) -> SettingsError {
        SettingsError::Invalid {
            origin: self.of(origin_field),
            field: field.to_owned(),
            message: message.into(),
        }
    }
}

/// `federation:`: the endpoints (each trust domain and address once, `tls` with `https_web` only) and
/// the durations.
fn resolve_federation(
    layer: FederationLayer,
    origins: &Origins<'_>,
) -> Result<FederationSettings, SettingsError> {
    const FIELD: &str = "federation.endpoints";
    let mut endpoints: Vec<FederationEndpoint> = Vec::new();
    for (i, raw) in layer.endpoints.unwrap_or_default().into_iter().enumerate() {
        let at = |field: &str| format!("{FIELD}[{i}].{field}");
        let invalid =
            |field: &str, message: String| origins.invalid_from(FIELD, &at(field), message);
        let trust_domain = raw
            .trust_domain
            .ok_or_else(|| {
                invalid(
                    "trustDomain",
                    "required: the trust domain whose bundle it serves".into(),
                )
            })?
            .parse::<meshca_identity::TrustDomain>()
            .map_err(|e| invalid("trustDomain", e.to_string()))?;
        let listen = raw.listen.ok_or_else(|| {
            invalid(
                "listen",
                "required: an IP:port to serve the bundle on".into(),
            )
        })?;
        let listen: std::net::SocketAddr = listen
            .parse()
            .map_err(|_| invalid("listen", format!("{listen:?} is not an IP:port")))?;
        let profile = match (raw.profile.as_deref().unwrap_or("https_spiffe"), raw.tls) {
            ("https_spiffe", None) => EndpointServing::HttpsSpiffe,
            ("https_spiffe", Some(_)) => {
                return Err(invalid(
                    "tls",
                    "only with profile https_web: an https_spiffe endpoint presents an X.509-SVID meshca issues".into(),
                ))
            }
            ("https_web", Some(EndpointTlsLayer { cert_file: Some(cert_file), key_file: Some(key_file) })) => {
                EndpointServing::HttpsWeb {
                    tls: TlsFiles {
                        cert_file: non_empty_path(origins, FIELD, cert_file)?,
                        key_file: non_empty_path(origins, FIELD, key_file)?,
                    },
                }
            }
            ("https_web", _) => {
                return Err(invalid(
                    "tls",
                    "required with profile https_web: {certFile, keyFile} of the endpoint's Web PKI certificate".into(),
                ))
            }
            (other, _) => {
                return Err(invalid(
                    "profile",
                    format!("{other:?} must be one of [\"https_spiffe\", \"https_web\"]"),
                ))
            }
        };
        if let Some(earlier) = endpoints.iter().find(|e| e.trust_domain == trust_domain) {
            return Err(invalid(
                "trustDomain",
                format!(
                    "{} already has an endpoint, on {}",
                    trust_domain, earlier.listen
                ),
            ));
        }
        if let Some(earlier) = endpoints.iter().find(|e| e.listen == listen) {
            return Err(invalid(
                "listen",
                format!(
                    "{listen} already serves trust domain {}",
                    earlier.trust_domain
                ),
            ));
        }
        endpoints.push(FederationEndpoint {
            trust_domain,
            listen,
            profile,
        });
    }
    let refresh_hint = layer
        .refresh_hint
        .unwrap_or(DEFAULT_FEDERATION_REFRESH_HINT);
    let hint_bounds = std::time::Duration::from_secs(30)..=std::time::Duration::from_secs(3600);
    if !hint_bounds.contains(&refresh_hint.as_std()) {
        return Err(origins.invalid(
            "federation.refreshHint",
            "must be from 30s to 1h: peers hold a refresh hint to those bounds",
        ));
    }
    let fetch_margin = layer
        .fetch_margin
        .unwrap_or(DEFAULT_FEDERATION_FETCH_MARGIN);
    let stale_after = layer.stale_after.unwrap_or(DEFAULT_FEDERATION_STALE_AFTER);
    if stale_after.0.is_zero() {
        return Err(origins.invalid("federation.staleAfter", "must be greater than zero"));
    }
    Ok(FederationSettings {
        endpoints,
        refresh_hint,
        fetch_margin,
        stale_after,
    })
}

fn non_empty_path(
    origins: &Origins<'_>,
    field: &str,
    path: PathBuf,
) -> Result<PathBuf, SettingsError> {
    if path.as_os_str().is_empty() {
        Err(origins.invalid(field, "must not be empty"))
    } else {
        Ok(path)
    }
}

fn resolve(
    layer: Layer,
    origins: &BTreeMap<&'static str, String>,
) -> Result<Settings, SettingsError> {
    let origins = &Origins(origins);
    let zone = layer.zone.unwrap_or_else(|| DEFAULT_ZONE.to_owned());
    check_name(&zone).map_err(|m| origins.invalid("zone", m.to_string()))?;
    let data_dir = non_empty_path(
        origins,
        "dataDir",
        layer.data_dir.unwrap_or_else(|| DEFAULT_DATA_DIR.into()),
    )?;
    let resources = match layer.resources {
        Some(path) => non_empty_path(origins, "resources", path)?,
        None => Settings::default_resources_dir(&data_dir),
    };
    let mesh = layer.defaults.and_then(|d| d.mesh);
    if let Some(mesh) = &mesh {
        check_name(mesh).map_err(|m| origins.invalid("defaults.mesh", m.to_string()))?;
    }
    let sds = resolve_sds(layer.sds.unwrap_or_default(), &data_dir, origins)?;
    let workload_api = resolve_workload_api(
        layer.workload_api.unwrap_or_default(),
        &data_dir,
        &sds,
        origins,
    )?;
    let admin_layer = layer.admin.unwrap_or_default();
    let admin = AdminSettings {
        listen: admin_layer.listen.unwrap_or(DEFAULT_ADMIN_LISTEN),
        allowed_hosts: allowed_hosts(admin_layer.allowed_hosts.unwrap_or_default(), origins)?,
    };
    let issuance = layer.issuance.unwrap_or_default();
    let renew_at = issuance.renew_at.unwrap_or(DEFAULT_RENEW_AT);
    if !(renew_at > 0.0 && renew_at < 1.0) {
        return Err(origins.invalid(
            "issuance.renewAt",
            format!("must be between 0 and 1 (exclusive), got {renew_at}"),
        ));
    }
    let workers = issuance.workers.unwrap_or(0);
    if workers > MAX_ISSUANCE_WORKERS {
        return Err(origins.invalid(
            "issuance.workers",
            format!("must be at most {MAX_ISSUANCE_WORKERS} (0 means one per core), got {workers}"),
        ));
    }
    let keys_ahead = issuance.keys_ahead.unwrap_or(DEFAULT_KEYS_AHEAD);
    if keys_ahead > MAX_KEYS_AHEAD {
        return Err(origins.invalid(
            "issuance.keysAhead",
            format!(
                "must be at most {MAX_KEYS_AHEAD} (0 generates no key ahead), got {keys_ahead}"
            ),
        ));
    }
    let ack_timeout = layer
        .rollout
        .and_then(|r| r.ack_timeout)
        .unwrap_or(DEFAULT_ACK_TIMEOUT);
    if ack_timeout.0.is_zero() {
        return Err(origins.invalid("rollout.ackTimeout", "must be greater than zero"));
    }
    let federation = resolve_federation(layer.federation.unwrap_or_default(), origins)?;
    let limits = layer
        .limits
        .unwrap_or_default()
        .resolve()
        .map_err(|e| origins.invalid(e.path().unwrap_or("limits"), e.to_string()))?;
    let max_valid_for = layer
        .tokens
        .and_then(|t| t.max_valid_for)
        .unwrap_or(DEFAULT_TOKEN_MAX_VALID_FOR);
    if max_valid_for.as_std().as_secs() == 0 {
        return Err(origins.invalid(
            "tokens.maxValidFor",
            "must be at least one second (a token's validity is counted in whole seconds)",
        ));
    }
    let keystore = resolve_keystore(layer.keystore.unwrap_or_default(), origins)?;
    let replica = resolve_replica(layer.replica.unwrap_or_default(), keystore.kind, origins)?;
    let agent = resolve_agent(layer.agent.unwrap_or_default(), origins)?;
    Ok(Settings {
        agent,
        zone,
        resources,
        defaults: Defaults { mesh },
        sds,
        workload_api,
        admin,
        issuance: IssuanceSettings {
            key_algorithm: issuance.key_algorithm.unwrap_or_default(),
            renew_at,
            workers,
            keys_ahead,
        },
        rollout: RolloutSettings { ack_timeout },
        federation,
        keystore,
        tokens: TokensSettings { max_valid_for },
        replica,
        limits,
        data_dir,
    })
}

fn resolve_keystore(
    keystore: super::file::KeystoreLayer,
    origins: &Origins<'_>,
) -> Result<KeystoreSettings, SettingsError> {
    let kind = keystore.kind.unwrap_or_default();
    let pkcs11 = keystore
        .pkcs11
        .map(|p| resolve_pkcs11(p, origins))
        .transpose()?;
    let Some(postgres) = keystore.postgres else {
        if kind == KeystoreType::Postgres {
            return Err(origins.invalid_from(
                "keystore.type",
                "keystore.postgres.url",
                "required when keystore.type is postgres",
            ));
        }
        return Ok(KeystoreSettings {
            kind,
            postgres: None,
            pkcs11,
        });
    };
    if kind != KeystoreType::Postgres {
        let field = super::file::fields()
            .find(|f| f.starts_with("keystore.postgres.") && origins.0.contains_key(f))
            .unwrap_or("keystore.postgres.url");
        return Err(origins.invalid(
            field,
            format!("only used with keystore.type: postgres (keystore.type is {kind}); set it, or remove keystore.postgres"),
        ));
    }
    let required = |value: Option<String>, field: &str| match value {
        Some(v) if !v.trim().is_empty() => Ok(v),
        Some(_) => Err(origins.invalid(field, "must not be empty")),
        None => Err(origins.invalid_from(
            "keystore.type",
            field,
            "required when keystore.type is postgres",
        )),
    };
    let url = required(postgres.url, "keystore.postgres.url")?;
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(origins.invalid(
            "keystore.postgres.url",
            "must be a postgres:// URL, such as postgres://meshca@db.example:5432/meshca",
        ));
    }
    let key_encryption_key_file = match postgres.key_encryption_key_file {
        Some(path) => Some(non_empty_path(
            origins,
            "keystore.postgres.keyEncryptionKeyFile",
            path,
        )?),
        // The key-encryption key then lives in the token.
        None if pkcs11.is_some() => None,
        None => {
            return Err(origins.invalid_from(
                "keystore.type",
                "keystore.postgres.keyEncryptionKeyFile",
                "required when keystore.type is postgres (unless keystore.pkcs11 holds the key-encryption key in a token)",
            ))
        }
    };
    let password_file = postgres
        .password_file
        .map(|p| non_empty_path(origins, "keystore.postgres.passwordFile", p))
        .transpose()?;
    let ca_file = postgres
        .ca_file
        .map(|p| non_empty_path(origins, "keystore.postgres.caFile", p))
        .transpose()?;
    let timeout = postgres.timeout.unwrap_or(DEFAULT_POSTGRES_TIMEOUT);
    if timeout.0.is_zero() {
        return Err(origins.invalid("keystore.postgres.timeout", "must be greater than zero"));
    }
    let max_connections = postgres
        .max_connections
        .unwrap_or(DEFAULT_POSTGRES_MAX_CONNECTIONS);
    if !(1..=MAX_POSTGRES_CONNECTIONS).contains(&max_connections) {
        return Err(origins.invalid(
            "keystore.postgres.maxConnections",
            format!("must be between 1 and {MAX_POSTGRES_CONNECTIONS}, got {max_connections}"),
        ));
    }
    Ok(KeystoreSettings {
        kind,
        postgres: Some(PostgresSettings {
            url,
            password_file,
            key_encryption_key_file,
            ca_file,
            timeout,
            max_connections,
        }),
        pkcs11,
    })
}

/// `keystore.pkcs11`: the module and the token's label are required once the section is there.
fn resolve_pkcs11(
    pkcs11: super::file::Pkcs11Layer,
    origins: &Origins<'_>,
) -> Result<Pkcs11Settings, SettingsError> {
    // Where the section came from: the first of its fields that was set, else the empty section.
    let section = super::file::fields()
        .find(|f| f.starts_with("keystore.pkcs11.") && origins.0.contains_key(f))
        .unwrap_or(PKCS11);
    let required =
        |field: &str| origins.invalid_from(section, field, "required when keystore.pkcs11 is set");
    const MODULE: &str = "keystore.pkcs11.module";
    const TOKEN: &str = "keystore.pkcs11.token";
    let module = pkcs11.module.ok_or_else(|| required(MODULE))?;
    if module.as_os_str().is_empty() {
        return Err(origins.invalid(MODULE, "must not be empty"));
    }
    if !module.is_absolute() {
        return Err(origins.invalid(
            MODULE,
            format!(
                "must be an absolute path (such as /usr/lib/softhsm/libsofthsm2.so), got {}: the dynamic loader would search its own directories for a relative one",
                module.display()
            ),
        ));
    }
    let token = pkcs11.token.ok_or_else(|| required(TOKEN))?;
    if token.trim_end_matches(' ').is_empty() {
        return Err(origins.invalid(TOKEN, "must not be empty: it is the token's label"));
    }
    if token.len() > MAX_PKCS11_TOKEN_LABEL {
        return Err(origins.invalid(
            TOKEN,
            format!(
                "a token label is at most {MAX_PKCS11_TOKEN_LABEL} bytes (PKCS#11's label field), got {} bytes",
                token.len()
            ),
        ));
    }
    let pin_file = pkcs11
        .pin_file
        .map(|p| non_empty_path(origins, "keystore.pkcs11.pinFile", p))
        .transpose()?;
    Ok(Pkcs11Settings {
        module,
        token,
        pin_file,
    })
}

/// `replica:`: the name defaults to the host name (lower-cased), which must then be a valid name
/// when replicas share a database.
fn resolve_replica(
    replica: super::file::ReplicaLayer,
    keystore: KeystoreType,
    origins: &Origins<'_>,
) -> Result<ReplicaSettings, SettingsError> {
    let name = match replica.name {
        Some(name) => {
            check_name(&name).map_err(|m| origins.invalid("replica.name", m.to_string()))?;
            name
        }
        None => match default_replica_name() {
            Ok(host) => host,
            Err(m) if keystore == KeystoreType::Postgres => {
                return Err(origins.invalid(
                    "replica.name",
                    format!("unset, and the host name cannot be a replica's name ({m}): set replica.name"),
                ));
            }
            Err(_) => FALLBACK_REPLICA_NAME.to_owned(),
        },
    };
    let lease_timeout = replica.lease_timeout.unwrap_or(DEFAULT_LEASE_TIMEOUT);
    if lease_timeout.0.is_zero() {
        return Err(origins.invalid("replica.leaseTimeout", "must be greater than zero"));
    }
    Ok(ReplicaSettings {
        name,
        lease_timeout,
    })
}

fn resolve_sds(
    sds: super::file::SdsLayer,
    data_dir: &Path,
    origins: &Origins<'_>,
) -> Result<SdsSettings, SettingsError> {
    let listen = match sds.listen {
        Some(listen) if listen.is_empty() => {
            return Err(origins.invalid("sds.listen", "at least one listen address is required"));
        }
        Some(listen) => listen,
        None => Settings::default_sds_listen(data_dir),
    };
    let mut seen = BTreeSet::new();
    if let Some(dup) = listen.iter().find(|a| !seen.insert(a.to_string())) {
        return Err(origins.invalid("sds.listen", format!("{dup} is listed twice")));
    }
    let tls = match sds.tls.map(|t| (t.cert_file, t.key_file)) {
        None | Some((None, None)) => None,
        Some((Some(cert_file), Some(key_file))) => Some(TlsFiles {
            cert_file: non_empty_path(origins, "sds.tls.certFile", cert_file)?,
            key_file: non_empty_path(origins, "sds.tls.keyFile", key_file)?,
        }),
        Some((Some(_), None)) => {
            return Err(origins.invalid_from(
                "sds.tls.certFile",
                "sds.tls.keyFile",
                "required when sds.tls.certFile is set",
            ));
        }
        Some((None, Some(_))) => {
            return Err(origins.invalid_from(
                "sds.tls.keyFile",
                "sds.tls.certFile",
                "required when sds.tls.keyFile is set",
            ));
        }
    };
    let insecure = sds.insecure.unwrap_or(false);
    if insecure && tls.is_some() {
        return Err(origins.invalid(
            "sds.insecure",
            "cannot be combined with sds.tls; remove one of them",
        ));
    }
    if insecure {
        let public = listen.iter().find_map(|a| match a {
            ListenAddr::Tcp(addr) if !addr.ip().is_loopback() => Some(addr),
            ListenAddr::Tcp(_) | ListenAddr::Unix(_) => None,
        });
        if let Some(addr) = public {
            return Err(origins.invalid(
                "sds.insecure",
                format!(
                    "plaintext SDS is only allowed on loopback addresses, but sds.listen (from {}) includes {addr}; listen on 127.0.0.1 or [::1], or drop sds.insecure to serve TLS",
                    origins.of("sds.listen")
                ),
            ));
        }
    }
    Ok(SdsSettings {
        listen,
        tls,
        insecure,
    })
}

/// The longest `workloadApi.ackAfter`.
const MAX_WORKLOAD_ACK_AFTER: std::time::Duration = std::time::Duration::from_secs(60);
/// The shortest `workloadApi.jwtKeyLifetime`: a key's successor is created `ackAfter` (at most a
/// minute) plus a minute before the key's lifetime ends, so a much shorter lifetime would be spent
/// mostly handing over.
const MIN_JWT_KEY_LIFETIME: std::time::Duration = std::time::Duration::from_secs(10 * 60);
/// The longest `workloadApi.jwtKeyLifetime`: 90 days.
const MAX_JWT_KEY_LIFETIME: std::time::Duration = std::time::Duration::from_secs(90 * 24 * 3600);

/// `workloadApi:`: unix sockets only, each listed once, none shared with SDS.
fn resolve_workload_api(
    workload_api: super::file::WorkloadApiLayer,
    data_dir: &Path,
    sds: &SdsSettings,
    origins: &Origins<'_>,
) -> Result<WorkloadApiSettings, SettingsError> {
    const FIELD: &str = "workloadApi.listen";
    let ack_after = workload_api.ack_after.unwrap_or(DEFAULT_WORKLOAD_ACK_AFTER);
    if ack_after.as_std() > MAX_WORKLOAD_ACK_AFTER {
        return Err(origins.invalid(
            "workloadApi.ackAfter",
            format!("must be at most {MAX_WORKLOAD_ACK_AFTER:?}: rollouts wait this long for every Workload API stream"),
        ));
    }
    let jwt_key_lifetime = workload_api
        .jwt_key_lifetime
        .unwrap_or(DEFAULT_WORKLOAD_JWT_KEY_LIFETIME);
    if jwt_key_lifetime.as_std() < MIN_JWT_KEY_LIFETIME {
        return Err(origins.invalid(
            "workloadApi.jwtKeyLifetime",
            "must be at least 10m: the next key is created ackAfter plus a minute before a key's lifetime ends",
        ));
    }
    if jwt_key_lifetime.as_std() > MAX_JWT_KEY_LIFETIME {
        return Err(origins.invalid(
            "workloadApi.jwtKeyLifetime",
            "must be at most 90d: a JWT signing key is rotated at least that often",
        ));
    }
    let Some(addrs) = workload_api.listen else {
        return Ok(WorkloadApiSettings {
            listen: Settings::default_workload_api_listen(data_dir),
            ack_after,
            jwt_key_lifetime,
        });
    };
    let mut listen: Vec<PathBuf> = Vec::with_capacity(addrs.len());
    for addr in addrs {
        let path = match addr {
            ListenAddr::Unix(path) => path,
            ListenAddr::Tcp(tcp) => {
                return Err(origins.invalid(
                    FIELD,
                    format!("{tcp} is a TCP address; the Workload API listens on unix sockets only (unix:///path), because it identifies its callers by the kernel's peer credentials, which TCP does not carry"),
                ));
            }
        };
        if listen.contains(&path) {
            return Err(
                origins.invalid(FIELD, format!("unix://{} is listed twice", path.display()))
            );
        }
        if sds.listen.contains(&ListenAddr::Unix(path.clone())) {
            return Err(origins.invalid(
                FIELD,
                format!(
                    "unix://{} is also an SDS socket (sds.listen, from {}); give the Workload API its own socket",
                    path.display(),
                    origins.of("sds.listen")
                ),
            ));
        }
        listen.push(path);
    }
    Ok(WorkloadApiSettings {
        listen,
        ack_after,
        jwt_key_lifetime,
    })
}

/// `agent:`: a unix socket to serve on, a loopback admin listener.
fn resolve_agent(
    agent: super::file::AgentLayer,
    origins: &Origins<'_>,
) -> Result<AgentSettings, SettingsError> {
    let listen = match agent.listen {
        None => PathBuf::from(DEFAULT_AGENT_LISTEN),
        Some(ListenAddr::Unix(path)) => path,
        Some(ListenAddr::Tcp(tcp)) => {
            return Err(origins.invalid(
                "agent.listen",
                format!("{tcp} is a TCP address; the Workload API listens on a unix socket only (unix:///path), because it identifies its callers by the kernel's peer credentials"),
            ))
        }
    };
    let admin = agent.admin.unwrap_or(DEFAULT_AGENT_ADMIN);
    if !admin.ip().is_loopback() {
        return Err(origins.invalid(
            "agent.admin",
            format!(
                "{admin} is not a loopback address; the agent's status listens on loopback only"
            ),
        ));
    }
    let token_file = match agent.token_file {
        Some(path) => Some(non_empty_path(origins, "agent.tokenFile", path)?),
        None => None,
    };
    let sds_ca = match agent.sds_ca {
        Some(path) => Some(non_empty_path(origins, "agent.sdsCa", path)?),
        None => None,
    };
    Ok(AgentSettings {
        servers: agent.servers.unwrap_or_default(),
        token_file,
        sds_ca,
        listen,
        admin,
    })
}

/// `admin.allowedHosts`: DNS names (letters, digits, `-` and `.`, at most 253 bytes), lower-cased; a
/// trailing dot is dropped, as `Host` headers are compared without it.
fn allowed_hosts(names: Vec<String>, origins: &Origins<'_>) -> Result<Vec<String>, SettingsError> {
    let mut allowed = Vec::with_capacity(names.len());
    for (index, name) in names.into_iter().enumerate() {
        let lower = name.to_ascii_lowercase();
        let trimmed = lower.strip_suffix('.').unwrap_or(&lower);
        let valid = !trimmed.is_empty()
            && trimmed.len() <= 253
            && trimmed.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        if !valid {
            return Err(origins.invalid(
                "admin.allowedHosts",
                format!(
                    "entry {index} ({name:?}) is not a host name: letters, digits, '-' and '.', \
                     without a port or scheme"
                ),
            ));
        }
        allowed.push(trimmed.to_owned());
    }
    Ok(allowed)
}
