//! `type: Mesh`: the legacy mTLS backends.

use std::collections::BTreeSet;

use serde::de::IgnoredAny;
use serde::Deserialize;

use super::data_source::{DataSource, Holds, MeshDataSource};
use super::error::{Report, Source};
use super::Labels;
use crate::names::check_name;
use crate::Duration;

/// A Mesh resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mesh {
    /// The mesh name.
    pub name: String,
    /// `labels`.
    pub labels: Labels,
    /// `mtls`; `None` when the Mesh has no `mtls` section.
    pub mtls: Option<Mtls>,
    /// `meshServices.mode` (Kuma's default: `Disabled`). Kuma 2.14 applies a MeshIdentity only in a Mesh
    /// whose mode is `Exclusive`, and so does meshca.
    pub mesh_services: MeshServicesMode,
    /// Where the Mesh was defined.
    pub source: Source,
}

/// `mtls` of a Mesh. Every name in `enabled_backend` and `secondary_backends` is the name of
/// exactly one backend in `backends`, and the enabled backend is never also secondary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mtls {
    /// The backend that issues certificates; `None` means mTLS is off.
    pub enabled_backend: Option<String>,
    /// Backends still trusted but no longer issuing (a meshca extension), without duplicates.
    pub secondary_backends: Vec<String>,
    /// Every defined backend, in file order, with unique names.
    pub backends: Vec<Backend>,
}

impl Mtls {
    /// The backend with this name.
    pub fn backend(&self, name: &str) -> Option<&Backend> {
        self.backends.iter().find(|b| b.name == name)
    }

    /// The enabled (issuing) backend, if mTLS is on.
    pub fn enabled(&self) -> Option<&Backend> {
        self.enabled_backend
            .as_deref()
            .and_then(|n| self.backend(n))
    }

    /// The secondary backends, in the order listed.
    pub fn secondaries(&self) -> impl Iterator<Item = &Backend> {
        self.secondary_backends
            .iter()
            .filter_map(|n| self.backend(n))
    }
}

/// One `mtls.backends[]` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    /// The backend name, unique within its Mesh.
    pub name: String,
    /// `mode` (default Strict).
    pub mode: MtlsMode,
    /// `dpCert.rotation.expiration`: the lifetime of issued certificates, if set (never zero).
    pub dp_cert_expiration: Option<Duration>,
    /// `type` and `conf`.
    pub kind: BackendKind,
}

/// `meshServices.mode`: whether Kuma generates MeshServices and uses them instead of `kuma.io/service`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MeshServicesMode {
    /// No MeshServices (Kuma's default).
    #[default]
    Disabled,
    /// MeshServices generated and used beside `kuma.io/service`.
    Everywhere,
    /// MeshServices generated, used where `reachableBackends` names them.
    ReachableBackends,
    /// MeshServices only: what a MeshIdentity needs to be applied.
    Exclusive,
}

impl MeshServicesMode {
    /// The mode as Kuma spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            MeshServicesMode::Disabled => "Disabled",
            MeshServicesMode::Everywhere => "Everywhere",
            MeshServicesMode::ReachableBackends => "ReachableBackends",
            MeshServicesMode::Exclusive => "Exclusive",
        }
    }
}

/// The `meshServices.mode` spellings (Kuma's protobuf enum names).
const MESH_SERVICES_MODES: [(&str, MeshServicesMode); 4] = [
    ("Disabled", MeshServicesMode::Disabled),
    ("Everywhere", MeshServicesMode::Everywhere),
    ("ReachableBackends", MeshServicesMode::ReachableBackends),
    ("Exclusive", MeshServicesMode::Exclusive),
];

/// Whether plaintext traffic is still accepted while mTLS is on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
pub enum MtlsMode {
    /// Only mTLS traffic.
    #[default]
    #[serde(alias = "STRICT")]
    Strict,
    /// mTLS and plaintext.
    #[serde(alias = "PERMISSIVE")]
    Permissive,
}

/// The CA behind a backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// `type: builtin`: meshca generates and persists the CA.
    Builtin {
        /// `conf.caCert.RSAbits`: 2048, 3072 or 4096 when set.
        ca_rsa_bits: Option<u32>,
        /// `conf.caCert.expiration`, never zero when set.
        ca_expiration: Option<Duration>,
    },
    /// `type: provided`: the operator supplies the CA certificate (chain) and key.
    Provided {
        /// `conf.cert`.
        cert: DataSource,
        /// `conf.key`.
        key: DataSource,
    },
}

/// The document form of a Mesh.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct MeshDoc {
    #[serde(rename = "type")]
    _kind: IgnoredAny,
    #[serde(rename = "name")]
    _name: Option<IgnoredAny>,
    labels: Option<Labels>,
    #[serde(rename = "creationTime")]
    _creation_time: Option<IgnoredAny>,
    #[serde(rename = "modificationTime")]
    _modification_time: Option<IgnoredAny>,
    // Kuma's resource identifier, which kumactl prints: output only.
    #[serde(rename = "kri")]
    _kri: Option<IgnoredAny>,
    mtls: Option<RawMtls>,
    // Kuma Mesh sections meshca has no use for; accepted so existing Kuma files load.
    #[serde(rename = "logging")]
    _logging: Option<IgnoredAny>,
    #[serde(rename = "metrics")]
    _metrics: Option<IgnoredAny>,
    #[serde(rename = "tracing")]
    _tracing: Option<IgnoredAny>,
    #[serde(rename = "networking")]
    _networking: Option<IgnoredAny>,
    #[serde(rename = "routing")]
    _routing: Option<IgnoredAny>,
    #[serde(rename = "constraints")]
    _constraints: Option<IgnoredAny>,
    mesh_services: Option<RawMeshServices>,
    #[serde(rename = "skipCreatingInitialPolicies")]
    _skip_creating_initial_policies: Option<IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMeshServices {
    mode: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawMtls {
    enabled_backend: Option<String>,
    #[serde(default)]
    secondary_backends: Vec<String>,
    #[serde(default)]
    backends: Vec<RawBackend>,
    #[serde(rename = "skipValidation")]
    _skip_validation: Option<IgnoredAny>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BackendType {
    Builtin,
    Provided,
}

/// The backend types meshca serves.
const BACKEND_TYPES: [(&str, BackendType); 2] = [
    ("builtin", BackendType::Builtin),
    ("provided", BackendType::Provided),
];

/// Kuma's other backend types: recognised in the message, refused (meshca cannot issue from them).
const KUMA_BACKEND_TYPES_REFUSED: [&str; 3] = ["vault", "acmpca", "certmanager"];

/// The `mode` spellings: Kuma's and the upper-case ones of its protobuf.
const MODES: [(&str, MtlsMode); 4] = [
    ("Strict", MtlsMode::Strict),
    ("Permissive", MtlsMode::Permissive),
    ("STRICT", MtlsMode::Strict),
    ("PERMISSIVE", MtlsMode::Permissive),
];

/// One `mtls.backends[]` entry, with `type`, `mode` and durations read as text: each wrong one is
/// reported with the backend's other violations.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawBackend {
    name: String,
    #[serde(rename = "type")]
    kind: Option<String>,
    mode: Option<String>,
    dp_cert: Option<RawDpCert>,
    conf: Option<RawConf>,
    #[serde(rename = "rootChain")]
    _root_chain: Option<IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawDpCert {
    rotation: Option<RawRotation>,
    #[serde(rename = "requestTimeout")]
    _request_timeout: Option<IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRotation {
    expiration: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawConf {
    ca_cert: Option<RawCaCert>,
    cert: Option<MeshDataSource>,
    key: Option<MeshDataSource>,
    /// Kuma's switch to skip its checks of a provided CA (`kumactl export` sets it on the builtin CAs
    /// it writes as provided): accepted, and meshca checks every provided CA all the same.
    #[serde(rename = "skipValidation")]
    _skip_validation: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCaCert {
    #[serde(rename = "RSAbits")]
    rsa_bits: Option<u32>,
    expiration: Option<String>,
}

/// Parses a duration, reporting one that does not parse or is zero (every certificate would expire at
/// once).
fn check_positive(text: Option<String>, field: &str, report: &mut Report) -> Option<Duration> {
    match text?.parse::<Duration>() {
        Ok(d) if d.0.is_zero() => {
            report.error(field, "must be greater than zero");
            None
        }
        Ok(d) => Some(d),
        Err(e) => {
            report.error(field, e.to_string());
            None
        }
    }
}

impl MeshDoc {
    pub(super) fn into_typed(self, name: String, report: &mut Report) -> Mesh {
        let mesh_services = self
            .mesh_services
            .and_then(|m| m.mode)
            .and_then(|mode| report.one_of("meshServices.mode", &mode, &MESH_SERVICES_MODES))
            .unwrap_or_default();
        Mesh {
            name,
            labels: self.labels.unwrap_or_default(),
            mtls: self.mtls.map(|m| m.into_typed(report)),
            mesh_services,
            source: report.source.clone(),
        }
    }
}

impl RawMtls {
    fn into_typed(self, report: &mut Report) -> Mtls {
        let mut names = BTreeSet::new();
        let mut backends = Vec::with_capacity(self.backends.len());
        for (i, raw) in self.backends.into_iter().enumerate() {
            let field = format!("mtls.backends[{i}]");
            if let Err(m) = check_name(&raw.name) {
                report.error(format!("{field}.name"), m.to_string());
            } else if !names.insert(raw.name.clone()) {
                report.error(
                    format!("{field}.name"),
                    format!("another backend is already named {:?}", raw.name),
                );
            }
            if let Some(backend) = raw.into_typed(&field, report) {
                backends.push(backend);
            }
        }
        let defined = || names.iter().cloned().collect::<Vec<_>>().join(", ");
        let unknown = |name: &str| {
            format!(
                "no backend named {name:?}; defined backends: {}",
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    defined()
                }
            )
        };
        if let Some(enabled) = &self.enabled_backend {
            if !names.contains(enabled) {
                report.error("mtls.enabledBackend", unknown(enabled));
            }
        }
        let mut seen = BTreeSet::new();
        for (i, name) in self.secondary_backends.iter().enumerate() {
            let field = format!("mtls.secondaryBackends[{i}]");
            if !names.contains(name) {
                report.error(field, unknown(name));
            } else if self.enabled_backend.as_ref() == Some(name) {
                report.error(
                    field,
                    format!("{name:?} is the enabled backend; a backend cannot be both enabled and secondary"),
                );
            } else if !seen.insert(name) {
                report.error(field, format!("{name:?} is listed twice"));
            }
        }
        Mtls {
            enabled_backend: self.enabled_backend,
            secondary_backends: self.secondary_backends,
            backends,
        }
    }
}

impl RawBackend {
    fn into_typed(self, field: &str, report: &mut Report) -> Option<Backend> {
        let errors_before = report.errors.len();
        let dp_cert_expiration = check_positive(
            self.dp_cert
                .and_then(|d| d.rotation)
                .and_then(|r| r.expiration),
            &format!("{field}.dpCert.rotation.expiration"),
            report,
        );
        let mode = match &self.mode {
            None => Some(MtlsMode::Strict),
            Some(mode) => report.one_of(format!("{field}.mode"), mode, &MODES),
        };
        let conf_field = format!("{field}.conf");
        let conf = self.conf.unwrap_or_default();
        let type_field = format!("{field}.type");
        let kind = match self.kind.as_deref() {
            None => {
                report.error(type_field, "required; one of builtin, provided");
                None
            }
            Some(kind) if KUMA_BACKEND_TYPES_REFUSED.contains(&kind) => {
                report.error(
                    type_field,
                    format!("{kind:?} backends are not served by meshca; use builtin or provided"),
                );
                None
            }
            Some(kind) => report.one_of(type_field, kind, &BACKEND_TYPES),
        };
        let kind = match kind? {
            BackendType::Builtin => {
                for (name, set) in [("cert", conf.cert.is_some()), ("key", conf.key.is_some())] {
                    if set {
                        report.error(
                            format!("{conf_field}.{name}"),
                            "not allowed for a builtin backend (meshca generates its CA); use type: provided to bring your own",
                        );
                    }
                }
                let ca_cert = conf.ca_cert;
                let ca_rsa_bits = ca_cert.as_ref().and_then(|c| c.rsa_bits);
                if let Some(bits) = ca_rsa_bits.filter(|b| ![2048, 3072, 4096].contains(b)) {
                    report.error(
                        format!("{conf_field}.caCert.RSAbits"),
                        format!("must be 2048, 3072 or 4096, got {bits}"),
                    );
                }
                let ca_expiration = check_positive(
                    ca_cert.and_then(|c| c.expiration),
                    &format!("{conf_field}.caCert.expiration"),
                    report,
                );
                Some(BackendKind::Builtin {
                    ca_rsa_bits,
                    ca_expiration,
                })
            }
            BackendType::Provided => {
                if conf.ca_cert.is_some() {
                    report.error(
                        format!("{conf_field}.caCert"),
                        "not allowed for a provided backend (its CA comes from conf.cert and conf.key)",
                    );
                }
                let mut part = |source: Option<MeshDataSource>, name: &str, holds| match source {
                    Some(s) => s.into_typed(&format!("{conf_field}.{name}"), holds, report),
                    None => {
                        report.error(
                            format!("{conf_field}.{name}"),
                            "required for a provided backend",
                        );
                        None
                    }
                };
                let cert = part(conf.cert, "cert", Holds::Certificate);
                let key = part(conf.key, "key", Holds::Key);
                match (cert, key) {
                    (Some(cert), Some(key)) => Some(BackendKind::Provided { cert, key }),
                    _ => None,
                }
            }
        };
        if report.errors.len() > errors_before {
            return None;
        }
        Some(Backend {
            name: self.name,
            mode: mode?,
            dp_cert_expiration,
            kind: kind?,
        })
    }
}
