//! Daemon settings: embedded defaults, a YAML file, `MESHCA_*` environment overrides.

mod agent;
mod env;
mod env_value;
mod error;
mod file;
mod limits;
mod listen;
mod resolve;
mod types;

pub use agent::{
    AgentSettings, ServerAddr, ServerAddrError, DEFAULT_AGENT_ADMIN, DEFAULT_AGENT_LISTEN,
};
pub use env::{settings_env_vars, ENV_PREFIX};
pub use error::{SettingsError, SettingsWarning};
pub use limits::Limits;
pub use listen::{ListenAddr, ListenAddrError};
pub use types::{
    AdminSettings, Defaults, EndpointServing, FederationEndpoint, FederationSettings,
    IssuanceSettings, KeystoreSettings, KeystoreType, Pkcs11Settings, PostgresSettings,
    ReplicaSettings, RolloutSettings, SdsSettings, Settings, TlsFiles, TokensSettings,
    UnknownKeystoreType, WorkloadApiSettings, DEFAULT_ACK_TIMEOUT, DEFAULT_ADMIN_LISTEN,
    DEFAULT_DATA_DIR, DEFAULT_KEYS_AHEAD, DEFAULT_LEASE_TIMEOUT, DEFAULT_POSTGRES_MAX_CONNECTIONS,
    DEFAULT_POSTGRES_TIMEOUT, DEFAULT_RENEW_AT, DEFAULT_SDS_TCP, DEFAULT_TOKEN_MAX_VALID_FOR,
    DEFAULT_ZONE, MAX_ISSUANCE_WORKERS, MAX_KEYS_AHEAD, MAX_PKCS11_PIN_FILE,
    MAX_PKCS11_TOKEN_LABEL, MAX_POSTGRES_CONNECTIONS, PKCS11_PIN_ENV, POSTGRES_PASSWORD_ENV,
    SECRET_ENV_VARS,
};

#[cfg(test)]
mod tests;
