//! The resolved, validated daemon settings (docs/operations.md).

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;

use serde::Serialize;

use super::{Limits, ListenAddr};
use crate::Duration;
use meshca_identity::KeyAlgorithm;

/// The daemon settings: embedded defaults, overridden by a settings file, overridden by
/// `MESHCA_*` environment variables (see [`Settings::load`](Settings::load)).
///
/// Every value has been checked: paths are as written (relative ones are relative to the working
/// directory), `renew_at` lies in (0, 1), plaintext SDS only listens on loopback.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    /// The zone name, `{{ .Zone }}` in SPIFFE ID templates (default `default`).
    pub zone: String,
    /// Where the keystore and generated state live (default `./meshca-data`).
    pub data_dir: PathBuf,
    /// The resources directory (default `<dataDir>/resources`).
    pub resources: PathBuf,
    /// Defaults that pick among resources.
    pub defaults: Defaults,
    /// The SDS server.
    pub sds: SdsSettings,
    /// The SPIFFE Workload API for workloads on this host.
    pub workload_api: WorkloadApiSettings,
    /// The admin HTTP server.
    pub admin: AdminSettings,
    /// Certificate issuance.
    pub issuance: IssuanceSettings,
    /// Trust and identity rollouts (docs/rotation.md).
    pub rollout: RolloutSettings,
    /// Durable key storage.
    pub keystore: KeystoreSettings,
    /// Bounds on what clients and resource files can make the daemon hold or wait for.
    pub limits: Limits,
    /// Proxy tokens (`meshca token`).
    pub tokens: TokensSettings,
    /// This daemon among replicas that share one database (`keystore.type: postgres`).
    pub replica: ReplicaSettings,
    /// `meshca agent`: its servers, token and sockets (the daemon ignores it).
    pub agent: super::AgentSettings,
    /// SPIFFE federation with other trust domains.
    pub federation: FederationSettings,
}

/// `defaults:` in the settings file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Defaults {
    /// The mesh whose identity the ZoneEgress uses; `None` lets meshca choose.
    pub mesh: Option<String>,
}

/// `sds:` in the settings file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SdsSettings {
    /// Listen addresses; never empty and without duplicates.
    pub listen: Vec<ListenAddr>,
    /// The server certificate for TCP listeners; `None` means one issued by the daemon's own CA.
    pub tls: Option<TlsFiles>,
    /// Serve plaintext on TCP listeners. Only ever `true` when every TCP listener is loopback,
    /// and never together with `tls`.
    pub insecure: bool,
}

/// `workloadApi:` in the settings file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadApiSettings {
    /// The unix socket paths it listens on (default `<dataDir>/workload.sock`); empty: it is off.
    /// Never TCP: callers are identified by the kernel's peer credentials, which only a unix
    /// socket carries. No duplicates, and none of `sds.listen`'s sockets. Shown as `unix://PATH`.
    #[serde(serialize_with = "unix_urls")]
    pub listen: Vec<PathBuf>,
    /// How long after a message is written to a Workload API stream it counts as ACKed for the
    /// rollout gate (default 1s, at most 1 minute): clients send nothing back, so this is the time a
    /// workload gets to put a new bundle or SVID in use.
    pub ack_after: Duration,
    /// How long a trust domain's JWT-SVID signing key signs before the next one takes over
    /// (default 24h, at least 10 minutes, at most 90 days).
    pub jwt_key_lifetime: Duration,
}

/// Socket paths as `unix://PATH`, the form they are written in.
fn unix_urls<S: serde::Serializer>(paths: &[PathBuf], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(paths.iter().map(|p| ListenAddr::Unix(p.clone())))
}

/// A certificate chain and its private key, as PEM files.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// PEM private key.
    pub key_file: PathBuf,
}

/// `admin:` in the settings file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdminSettings {
    /// The admin HTTP address (default `127.0.0.1:5681`).
    pub listen: SocketAddr,
    /// Host names the admin API and console answer to besides IP addresses, `localhost` and this
    /// machine's host name, lower case (default none). A request naming another `Host` gets 421: a
    /// web page whose own name was rebound to the listener's address reads nothing.
    pub allowed_hosts: Vec<String>,
}

/// `issuance:` in the settings file.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IssuanceSettings {
    /// The key algorithm of issued certificates (default `ecdsa-p256`).
    pub key_algorithm: KeyAlgorithm,
    /// The fraction of a certificate's lifetime after which it is renewed, in (0, 1) (default 0.8).
    pub renew_at: f64,
    /// How many threads issue certificates in parallel; 0 (the default) means one per core.
    pub workers: usize,
    /// With an `rsa-*` key algorithm, how many leaf keys the issuance threads generate ahead while
    /// idle, each used for one certificate only (default 512; 0: none). ECDSA keys are not worth it.
    pub keys_ahead: usize,
}

/// `issuance.keysAhead` unless set.
pub const DEFAULT_KEYS_AHEAD: usize = 512;

/// The most keys `issuance.keysAhead` may ask for (an RSA-4096 key holds about 2.4 KB).
pub const MAX_KEYS_AHEAD: usize = 65_536;

/// The most threads `issuance.workers` may ask for.
pub const MAX_ISSUANCE_WORKERS: usize = 1024;

/// `rollout:` in the settings file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSettings {
    /// How long a rollout step waits for ACKs before it proceeds anyway (default 30s, never zero).
    pub ack_timeout: Duration,
}

/// `federation:` in the settings file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FederationSettings {
    /// The bundle endpoints meshca serves, one per trust domain it exports (default none).
    pub endpoints: Vec<FederationEndpoint>,
    /// The `spiffe_refresh_hint` the endpoints serve: how often peers are told to fetch (default
    /// 5m, from 30s to 1h, the bounds peers hold a hint to).
    pub refresh_hint: Duration,
    /// What a new CA of an exported trust domain waits beyond one refresh hint, after it is first
    /// served, before anything is issued from it: the time a peer polling as told may take to fetch
    /// (default 30s).
    pub fetch_margin: Duration,
    /// A federated bundle not fetched anew for this long is stale: said loudly, still served
    /// (default 24h, never zero).
    pub stale_after: Duration,
}

/// One bundle endpoint meshca serves (`federation.endpoints[]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FederationEndpoint {
    /// The trust domain whose bundle it serves.
    pub trust_domain: meshca_identity::TrustDomain,
    /// Where it listens (TCP, TLS).
    pub listen: std::net::SocketAddr,
    /// How it proves itself.
    pub profile: EndpointServing,
}

/// How a bundle endpoint meshca serves proves itself to peers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "profile")]
pub enum EndpointServing {
    /// `https_spiffe`: an X.509-SVID `spiffe://<trust domain>/meshca/bundle-endpoint` from a CA
    /// of the trust domain its peers hold.
    HttpsSpiffe,
    /// `https_web`: the operator's Web PKI certificate (the files are read again when they change).
    HttpsWeb {
        /// `tls.certFile` and `tls.keyFile`.
        tls: TlsFiles,
    },
}

/// The default `federation.staleAfter`: a day.
pub const DEFAULT_FEDERATION_STALE_AFTER: Duration = Duration::from_secs(24 * 3600);
/// The default `federation.refreshHint`: five minutes.
pub const DEFAULT_FEDERATION_REFRESH_HINT: Duration = Duration::from_secs(300);
/// The default `federation.fetchMargin`: 30 seconds.
pub const DEFAULT_FEDERATION_FETCH_MARGIN: Duration = Duration::from_secs(30);

/// `tokens:` in the settings file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokensSettings {
    /// The longest `meshca token --valid-for` accepted (default one year, never zero).
    pub max_valid_for: Duration,
}

/// `keystore:` in the settings file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KeystoreSettings {
    /// The keystore implementation (default `file`).
    #[serde(rename = "type")]
    pub kind: KeystoreType,
    /// The database, with `type: postgres` (and only then).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub postgres: Option<PostgresSettings>,
    /// The PKCS#11 token that holds the CA keys (and, with `postgres`, the key-encryption key), with
    /// either keystore type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pkcs11: Option<Pkcs11Settings>,
}

/// `keystore.pkcs11:` in the settings file: the token (an HSM, SoftHSM2 for a trial) that holds CA
/// keys. The PIN is no field: it comes from `pin_file`, or else `MESHCA_KEYSTORE_PKCS11_PIN`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pkcs11Settings {
    /// The vendor's PKCS#11 module, an absolute path (`MESHCA_KEYSTORE_PKCS11_MODULE`).
    pub module: PathBuf,
    /// The token's label: 1 to [`MAX_PKCS11_TOKEN_LABEL`] bytes (`MESHCA_KEYSTORE_PKCS11_TOKEN`).
    pub token: String,
    /// A file holding the user PIN, readable by its owner only. Without it, the PIN comes from
    /// `MESHCA_KEYSTORE_PKCS11_PIN`.
    pub pin_file: Option<PathBuf>,
}

/// The longest token label: PKCS#11's `CK_TOKEN_INFO.label` field holds 32 bytes.
pub const MAX_PKCS11_TOKEN_LABEL: usize = 32;

/// The largest PIN file read (a PIN is a few dozen characters at most).
pub const MAX_PKCS11_PIN_FILE: u64 = 256;

/// The environment variable that holds the token's user PIN when `keystore.pkcs11.pinFile` is unset
/// (a secret: never a settings field, never shown, never handed to a child process).
pub const PKCS11_PIN_ENV: &str = "MESHCA_KEYSTORE_PKCS11_PIN";

/// `keystore.postgres:` in the settings file: the database replicas share.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PostgresSettings {
    /// `postgres://user@host:port/database`, without a password (`MESHCA_KEYSTORE_POSTGRES_URL`).
    pub url: String,
    /// A file holding the database password. Without it, the password comes from
    /// `MESHCA_KEYSTORE_POSTGRES_PASSWORD`, or there is none.
    pub password_file: Option<PathBuf>,
    /// The key that seals every secret stored in the database: 32 random bytes or 64 hex digits,
    /// the same file on every replica, readable by its owner only. Required unless
    /// `keystore.pkcs11` is set, where the key-encryption key lives in the token instead.
    pub key_encryption_key_file: Option<PathBuf>,
    /// PEM certificates of the CAs the database server's certificate must chain to; the system's
    /// roots when unset.
    pub ca_file: Option<PathBuf>,
    /// How long connecting, or one database operation, may take (default 10s).
    pub timeout: Duration,
    /// The most connections a replica opens (default 8).
    pub max_connections: usize,
}

/// `keystore.postgres.timeout` unless set.
pub const DEFAULT_POSTGRES_TIMEOUT: Duration = Duration(std::time::Duration::from_secs(10));

/// `keystore.postgres.maxConnections` unless set.
pub const DEFAULT_POSTGRES_MAX_CONNECTIONS: usize = 8;

/// The most connections `keystore.postgres.maxConnections` may ask for.
pub const MAX_POSTGRES_CONNECTIONS: usize = 256;

/// The environment variable that holds the database password (a secret: never a settings field, so
/// never shown by `meshca status` or the admin API).
pub const POSTGRES_PASSWORD_ENV: &str = "MESHCA_KEYSTORE_POSTGRES_PASSWORD";

/// The environment variables that hold secrets: meshca reads them, and never hands them on to a
/// process it starts (`meshca issue --exec`, a drill's Envoys).
pub const SECRET_ENV_VARS: &[&str] = &[POSTGRES_PASSWORD_ENV, PKCS11_PIN_ENV];

/// `replica:` in the settings file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaSettings {
    /// This replica's name, unique among the replicas of one database (default: the host name).
    pub name: String,
    /// How long a replica may go without a heartbeat before the others count it as gone, and its
    /// proxies as disconnected (default 15s).
    pub lease_timeout: Duration,
}

/// A replica's name when `replica.name` is unset and the host name is no valid name (only a lone
/// daemon may go by it: replicas of one database must name themselves).
pub(super) const FALLBACK_REPLICA_NAME: &str = "meshca";

/// The host name, lower-cased, as the default `replica.name`; why it cannot be one otherwise.
pub(super) fn default_replica_name() -> Result<String, crate::names::NameError> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_ascii_lowercase())
        .unwrap_or_default();
    crate::names::check_name(&host).map(|()| host)
}

/// `replica.leaseTimeout` unless set.
pub const DEFAULT_LEASE_TIMEOUT: Duration = Duration(std::time::Duration::from_secs(15));

/// The keystore implementations meshca has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeystoreType {
    /// Files under `<dataDir>`, mode 0600 in a 0700 directory.
    #[default]
    File,
    /// A PostgreSQL database that replicas share (`keystore.postgres`).
    Postgres,
}

impl KeystoreType {
    /// Every keystore type, as spelled in the settings file.
    pub const ALL: [KeystoreType; 2] = [KeystoreType::File, KeystoreType::Postgres];

    /// The settings-file spelling, e.g. `file`.
    pub fn as_str(self) -> &'static str {
        match self {
            KeystoreType::File => "file",
            KeystoreType::Postgres => "postgres",
        }
    }
}

impl fmt::Display for KeystoreType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error for a keystore type meshca does not have.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown keystore type {0:?}; supported: file, postgres")]
pub struct UnknownKeystoreType(pub String);

impl FromStr for KeystoreType {
    type Err = UnknownKeystoreType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KeystoreType::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| UnknownKeystoreType(s.to_owned()))
    }
}

impl Serialize for KeystoreType {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for KeystoreType {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The default zone name.
pub const DEFAULT_ZONE: &str = "default";
/// The default data directory.
pub const DEFAULT_DATA_DIR: &str = "./meshca-data";
/// The default TCP address of the SDS server.
pub const DEFAULT_SDS_TCP: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 5678);
/// The default admin HTTP address.
pub const DEFAULT_ADMIN_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 5681);
/// The default renewal point, as a fraction of a certificate's lifetime.
pub const DEFAULT_RENEW_AT: f64 = 0.8;
/// The default rollout ACK timeout.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(30);
/// The default `workloadApi.ackAfter`: one second.
pub const DEFAULT_WORKLOAD_ACK_AFTER: Duration = Duration::from_secs(1);
/// The default `workloadApi.jwtKeyLifetime`: a day.
pub const DEFAULT_WORKLOAD_JWT_KEY_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// The default longest validity of a proxy token: one year (365 days).
pub const DEFAULT_TOKEN_MAX_VALID_FOR: Duration = Duration::from_secs(365 * 24 * 3600);

impl Settings {
    /// The resources directory for a data directory when none is configured.
    pub fn default_resources_dir(data_dir: &std::path::Path) -> PathBuf {
        data_dir.join("resources")
    }

    /// The Workload API socket for a data directory when none is configured.
    pub fn default_workload_api_listen(data_dir: &std::path::Path) -> Vec<PathBuf> {
        vec![data_dir.join("workload.sock")]
    }

    /// The SDS listen addresses for a data directory when none are configured.
    pub fn default_sds_listen(data_dir: &std::path::Path) -> Vec<ListenAddr> {
        vec![
            ListenAddr::Unix(data_dir.join("sds.sock")),
            ListenAddr::Tcp(DEFAULT_SDS_TCP),
        ]
    }
}

impl Default for Settings {
    /// The embedded defaults: what `meshca serve` uses with no settings file and no environment.
    fn default() -> Self {
        let data_dir = PathBuf::from(DEFAULT_DATA_DIR);
        Settings {
            zone: DEFAULT_ZONE.to_owned(),
            resources: Settings::default_resources_dir(&data_dir),
            defaults: Defaults::default(),
            sds: SdsSettings {
                listen: Settings::default_sds_listen(&data_dir),
                tls: None,
                insecure: false,
            },
            workload_api: WorkloadApiSettings {
                listen: Settings::default_workload_api_listen(&data_dir),
                ack_after: DEFAULT_WORKLOAD_ACK_AFTER,
                jwt_key_lifetime: DEFAULT_WORKLOAD_JWT_KEY_LIFETIME,
            },
            admin: AdminSettings {
                listen: DEFAULT_ADMIN_LISTEN,
                allowed_hosts: Vec::new(),
            },
            issuance: IssuanceSettings {
                key_algorithm: KeyAlgorithm::default(),
                renew_at: DEFAULT_RENEW_AT,
                workers: 0,
                keys_ahead: DEFAULT_KEYS_AHEAD,
            },
            rollout: RolloutSettings {
                ack_timeout: DEFAULT_ACK_TIMEOUT,
            },
            federation: FederationSettings {
                endpoints: Vec::new(),
                refresh_hint: DEFAULT_FEDERATION_REFRESH_HINT,
                fetch_margin: DEFAULT_FEDERATION_FETCH_MARGIN,
                stale_after: DEFAULT_FEDERATION_STALE_AFTER,
            },
            keystore: KeystoreSettings::default(),
            limits: Limits::default(),
            tokens: TokensSettings {
                max_valid_for: DEFAULT_TOKEN_MAX_VALID_FOR,
            },
            replica: ReplicaSettings {
                name: default_replica_name().unwrap_or_else(|_| FALLBACK_REPLICA_NAME.to_owned()),
                lease_timeout: DEFAULT_LEASE_TIMEOUT,
            },
            agent: super::AgentSettings {
                servers: Vec::new(),
                token_file: None,
                sds_ca: None,
                listen: PathBuf::from(super::DEFAULT_AGENT_LISTEN),
                admin: super::DEFAULT_AGENT_ADMIN,
            },
            data_dir,
        }
    }
}
