//! Every daemon setting, declared once: the settings file's layer structs (every field optional,
//! unknown keys rejected), the list of settings paths, and how each is set from its environment
//! variable all come from the table at the end of this file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::LazyLock;

use serde::Deserialize;

use super::env_value::{non_empty, parse_list, read, EnvValueError};
use super::limits::{LimitsLayer, LIMIT_FIELDS};

/// One `federation.endpoints[]` entry as written; checked when the settings are resolved.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct EndpointLayer {
    pub(super) trust_domain: Option<String>,
    pub(super) listen: Option<String>,
    pub(super) profile: Option<String>,
    pub(super) tls: Option<EndpointTlsLayer>,
}

/// `federation.endpoints[].tls`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct EndpointTlsLayer {
    pub(super) cert_file: Option<PathBuf>,
    pub(super) key_file: Option<PathBuf>,
}

/// `MESHCA_FEDERATION_ENDPOINTS`: a YAML flow list, e.g.
/// `[{trustDomain: a.example, listen: "0.0.0.0:8443"}]`.
fn read_endpoints(text: &str) -> Result<Vec<EndpointLayer>, EnvValueError> {
    yaml_serde::from_str(non_empty(text)?).map_err(|e| {
        EnvValueError::Parse(format!(
            "not a YAML list of endpoints ({e}), e.g. [{{trustDomain: a.example, listen: \"0.0.0.0:8443\"}}]"
        ))
    })
}
use super::{KeystoreType, ListenAddr, ServerAddr};
use crate::Duration;
use meshca_identity::KeyAlgorithm;

/// Declares the settings: one row per setting, nested in sections as in the settings file.
///
/// A row is `"fileKey" rust_field: Type`, which becomes `rust_field: Option<Type>` of its
/// section's layer struct, read from the file under `fileKey`. Its path is the keys down to it,
/// joined by `.` (`sds.tls.certFile`); [`fields`] lists the paths in table order, and the
/// environment variables are named after them (`super::env`). After the type, a row may have:
/// - nothing: a setting, whose variable's text must not be empty and is read by the type's
///   [`FromEnv`](super::env_value::FromEnv) (see [`read`]);
/// - `with reader`: a setting whose variable's text is read by `reader` instead;
/// - `{ rows }`: a section, whose layer struct `Type` is declared by these rows;
/// - `{ .. }`: a section declared by a table of its own (`limits`), which lists its paths (they
///   come after this table's), says which are set and reads their (non-empty) text.
///
/// Each layer struct gets `is_set(path)` and `set(path, text)` for the settings under it.
/// Doc comments on a row go to its field (and, for a section, its struct).
macro_rules! settings {
    // The table: the top-level layer, whose paths have no prefix.
    ($(#[doc = $doc:literal])* $name:ident { $($rows:tt)* }) => {
        settings!(@section [$(#[doc = $doc])*] $name [] { $($rows)* });
    };

    // One section: its layer struct, then the structs of the sections in it. `$prefix` is the
    // section's path and a ".", as literals for `concat!` (`["sds" "." "tls" "."]`).
    (@section [$($attr:tt)*] $name:ident $prefix:tt { $(
        $(#[doc = $doc:literal])*
        $key:literal $field:ident: $ty:ident $(<$arg:ty>)? $({ $($rows:tt)* })? $(with $read:path)?
    ),* $(,)? }) => {
        $($attr)*
        #[derive(Debug, Default, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub(super) struct $name {
            $( $(#[doc = $doc])* #[serde(rename = $key)] pub(super) $field: Option<$ty $(<$arg>)?>, )*
        }

        impl $name {
            /// Adds the path of every setting under this section to `paths`, in table order.
            fn paths(paths: &mut Vec<&'static str>) {
                $( settings!(@paths paths, $ty, $prefix $key $({ $($rows)* })?); )*
            }

            /// Whether the setting at `path` (one of [`fields`]) is set in this layer.
            pub(super) fn is_set(&self, path: &str) -> bool {
                $( settings!(@is_set self.$field, path, $prefix $key $({ $($rows)* })?); )*
                false
            }

            /// Sets the setting at `path` (one of [`fields`]) from an environment variable's text.
            pub(super) fn set(&mut self, path: &str, text: &str) -> Result<(), EnvValueError> {
                $( settings!(
                    @set self.$field, path, text, $prefix $key $({ $($rows)* })? $(with $read)?
                ); )*
                Err(EnvValueError::NotASetting)
            }
        }

        $( settings!(@subsection [$(#[doc = $doc])*] $ty, $prefix $key $({ $($rows)* })?); )*
    };

    // A row's paths: a setting's own; a section's, from its struct; none for a section with a
    // table of its own (`fields` adds them after all of these).
    (@paths $paths:ident, $ty:ident, [$($prefix:literal)*] $key:literal) => {
        $paths.push(concat!($($prefix,)* $key));
    };
    (@paths $paths:ident, $ty:ident, $prefix:tt $key:literal { .. }) => {};
    (@paths $paths:ident, $ty:ident, $prefix:tt $key:literal { $($rows:tt)* }) => {
        $ty::paths($paths);
    };

    // Whether a row is set: a setting when it has a value; in a section, the section says.
    (@is_set $slot:expr, $path:ident, [$($prefix:literal)*] $key:literal) => {
        if $path == concat!($($prefix,)* $key) {
            return $slot.is_some();
        }
    };
    (@is_set $slot:expr, $path:ident, [$($prefix:literal)*] $key:literal { $($rows:tt)* }) => {
        if $path.starts_with(concat!($($prefix,)* $key, ".")) {
            return $slot.as_ref().is_some_and(|section| section.is_set($path));
        }
    };

    // Setting a row from a variable's text: a setting reads it (with `read` unless the row names
    // a reader); a section sets its own setting, the section created if need be.
    (@set $slot:expr, $path:ident, $text:ident, $prefix:tt $key:literal) => {
        settings!(@set $slot, $path, $text, $prefix $key with read);
    };
    (@set $slot:expr, $path:ident, $text:ident, [$($prefix:literal)*] $key:literal with $read:path) => {
        if $path == concat!($($prefix,)* $key) {
            $slot = Some($read($text)?);
            return Ok(());
        }
    };
    (@set $slot:expr, $path:ident, $text:ident, [$($prefix:literal)*] $key:literal { .. }) => {
        if $path.starts_with(concat!($($prefix,)* $key, ".")) {
            let text = non_empty($text)?;
            return $slot.get_or_insert_default().set($path, text).map_err(EnvValueError::from);
        }
    };
    (@set $slot:expr, $path:ident, $text:ident, [$($prefix:literal)*] $key:literal { $($rows:tt)* }) => {
        if $path.starts_with(concat!($($prefix,)* $key, ".")) {
            return $slot.get_or_insert_default().set($path, $text);
        }
    };

    // The struct of a section declared by this table; nothing for a setting or another table's.
    (@subsection [$($attr:tt)*] $ty:ident, $prefix:tt $key:literal) => {};
    (@subsection [$($attr:tt)*] $ty:ident, $prefix:tt $key:literal { .. }) => {};
    (@subsection [$($attr:tt)*] $ty:ident, [$($prefix:literal)*] $key:literal { $($rows:tt)* }) => {
        settings!(@section [
            #[doc = concat!("`", $($prefix,)* $key, ":` in one layer of settings; `None` means \"not set here\".")]
            $($attr)*
        ] $ty [$($prefix)* $key "."] { $($rows)* });
    };
}

settings! {
    /// One layer of settings (the file, then the environment on top). `None` means "not set here".
    Layer {
        "zone" zone: String,
        "dataDir" data_dir: PathBuf,
        "resources" resources: PathBuf,
        "defaults" defaults: DefaultsLayer {
            "mesh" mesh: String,
        },
        "sds" sds: SdsLayer {
            "listen" listen: Vec<ListenAddr>,
            "tls" tls: TlsLayer {
                "certFile" cert_file: PathBuf,
                "keyFile" key_file: PathBuf,
            },
            "insecure" insecure: bool,
        },
        /// Addresses are read like `sds.listen`'s, so that a TCP one is refused with a reason
        /// rather than as a malformed address.
        "workloadApi" workload_api: WorkloadApiLayer {
            // The one list an empty variable is meaningful for: it turns the Workload API off.
            "listen" listen: Vec<ListenAddr> with parse_list,
            "ackAfter" ack_after: Duration,
            "jwtKeyLifetime" jwt_key_lifetime: Duration,
        },
        "admin" admin: AdminLayer {
            "listen" listen: SocketAddr,
            "allowedHosts" allowed_hosts: Vec<String>,
        },
        "issuance" issuance: IssuanceLayer {
            "keyAlgorithm" key_algorithm: KeyAlgorithm,
            "renewAt" renew_at: f64,
            "workers" workers: usize,
            "keysAhead" keys_ahead: usize,
        },
        "rollout" rollout: RolloutLayer {
            "ackTimeout" ack_timeout: Duration,
        },
        /// Endpoints are read from the environment as one YAML flow list, like the file's.
        "federation" federation: FederationLayer {
            "endpoints" endpoints: Vec<EndpointLayer> with read_endpoints,
            "refreshHint" refresh_hint: Duration,
            "fetchMargin" fetch_margin: Duration,
            "staleAfter" stale_after: Duration,
        },
        "keystore" keystore: KeystoreLayer {
            "type" kind: KeystoreType,
            "postgres" postgres: PostgresLayer {
                "url" url: String,
                "passwordFile" password_file: PathBuf,
                "keyEncryptionKeyFile" key_encryption_key_file: PathBuf,
                "caFile" ca_file: PathBuf,
                "timeout" timeout: Duration,
                "maxConnections" max_connections: usize,
            },
            "pkcs11" pkcs11: Pkcs11Layer {
                "module" module: PathBuf,
                "token" token: String,
                "pinFile" pin_file: PathBuf,
            },
        },
        "tokens" tokens: TokensLayer {
            "maxValidFor" max_valid_for: Duration,
        },
        "replica" replica: ReplicaLayer {
            "name" name: String,
            "leaseTimeout" lease_timeout: Duration,
        },
        "limits" limits: LimitsLayer { .. },
        /// The listen address is read like `sds.listen`'s, so that a TCP one is refused with a
        /// reason.
        "agent" agent: AgentLayer {
            "servers" servers: Vec<ServerAddr>,
            "tokenFile" token_file: PathBuf,
            "sdsCa" sds_ca: PathBuf,
            "listen" listen: ListenAddr,
            "admin" admin: SocketAddr,
        },
    }
}

/// The paths of [`fields`]: the table's, then the limits' (from their own table).
static FIELDS: LazyLock<Vec<&'static str>> = LazyLock::new(|| {
    let mut paths = Vec::new();
    Layer::paths(&mut paths);
    paths.extend_from_slice(LIMIT_FIELDS);
    paths
});

/// Every settings field as written in the file (its dotted camelCase path). The environment
/// variable names are derived from these.
pub(super) fn fields() -> impl Iterator<Item = &'static str> {
    FIELDS.iter().copied()
}
