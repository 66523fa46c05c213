//! Typed meshca settings and mesh resources, parsed and validated once at the boundary.
//!
//! - [`Settings::load`]: daemon settings from embedded defaults, a YAML file and `MESHCA_*`
//!   environment variables.
//! - [`load_dir`] / [`parse_str`]: Kuma universal-format resources (Mesh, MeshIdentity, MeshTrust,
//!   Dataplane, ZoneEgress, MeshService), WorkloadRegistrations and FederationRelationships, with every
//!   error of every file
//!   reported at once.
//! - [`Selector`]: what a registration asks of a process calling the Workload API.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod bounded;
mod duration;
mod names;
mod resources;
mod selector;
mod settings;
mod yaml;

pub use bounded::LoadLimits;
pub use duration::{Duration, DurationError};
pub use resources::{
    default_resources_yaml, load_dir, load_dir_lenient, parse_str, Backend, BackendKind,
    BundleEndpoint, Bundled, BundledCa, DataSource, Dataplane, EndpointProfile, Extension,
    FederationRelationship, Inbound, Labels, Mesh, MeshIdentity, MeshService, MeshServicesMode,
    MeshTrust, Mtls, MtlsMode, Provider, Resource, ResourceError, ResourceType, Resources, Secret,
    ServiceIdentity, ServicePort, Source, SpiffeIdTemplates, TargetPort, WorkloadRegistration,
    ZoneEgress, DEFAULT_JWT_SVID_EXPIRY, EVERY_MESH, MAX_HINT_BYTES, MAX_JWT_SVID_EXPIRY,
    MAX_SECRET_BYTES, SERVICE_TAG, ZONE_LABEL,
};
pub use selector::{
    InvalidValue, Selector, SelectorError, SelectorKind, MAX_SELECTOR_NAME_BYTES,
    MAX_SELECTOR_PATH_BYTES,
};
pub use settings::{
    settings_env_vars, AdminSettings, AgentSettings, Defaults, EndpointServing, FederationEndpoint,
    FederationSettings, IssuanceSettings, KeystoreSettings, KeystoreType, Limits, ListenAddr,
    ListenAddrError, Pkcs11Settings, PostgresSettings, ReplicaSettings, RolloutSettings,
    SdsSettings, ServerAddr, ServerAddrError, Settings, SettingsError, SettingsWarning, TlsFiles,
    TokensSettings, UnknownKeystoreType, WorkloadApiSettings, DEFAULT_ACK_TIMEOUT,
    DEFAULT_ADMIN_LISTEN, DEFAULT_AGENT_ADMIN, DEFAULT_AGENT_LISTEN, DEFAULT_DATA_DIR,
    DEFAULT_KEYS_AHEAD, DEFAULT_LEASE_TIMEOUT, DEFAULT_POSTGRES_MAX_CONNECTIONS,
    DEFAULT_POSTGRES_TIMEOUT, DEFAULT_RENEW_AT, DEFAULT_SDS_TCP, DEFAULT_TOKEN_MAX_VALID_FOR,
    DEFAULT_ZONE, ENV_PREFIX, MAX_ISSUANCE_WORKERS, MAX_KEYS_AHEAD, MAX_PKCS11_PIN_FILE,
    MAX_PKCS11_TOKEN_LABEL, MAX_POSTGRES_CONNECTIONS, PKCS11_PIN_ENV, POSTGRES_PASSWORD_ENV,
    SECRET_ENV_VARS,
};
