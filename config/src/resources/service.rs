//! `type: MeshService`: a service, its ports and the identities its proxies present.

use std::fmt;

use serde::Deserialize;

use super::error::{Report, Source};
use super::Labels;

/// The label naming the zone a MeshService comes from.
pub const ZONE_LABEL: &str = "kuma.io/zone";

/// A MeshService resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeshService {
    /// The service name.
    pub name: String,
    /// The mesh it belongs to.
    pub mesh: String,
    /// `labels` (`kuma.io/zone` names the zone it comes from).
    pub labels: Labels,
    /// `spec.selector.dataplaneTags`: inbound tags of the dataplanes behind the service;
    /// `None` selects none.
    pub dataplane_tags: Option<Labels>,
    /// `spec.ports`.
    pub ports: Vec<ServicePort>,
    /// `spec.identities`.
    pub identities: Vec<ServiceIdentity>,
    /// Where it was defined.
    pub source: Source,
}

impl MeshService {
    /// The zone in its `kuma.io/zone` label, if any.
    pub fn zone(&self) -> Option<&str> {
        self.labels.get(ZONE_LABEL).map(String::as_str)
    }
}

/// One `spec.ports[]` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    /// `port` (1-65535).
    pub port: u16,
    /// `targetPort`.
    pub target_port: Option<TargetPort>,
    /// `appProtocol`, e.g. `http`.
    pub app_protocol: Option<String>,
    /// `name`.
    pub name: Option<String>,
}

/// A `targetPort`: a number, or the name of an inbound port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetPort {
    /// A port number.
    Number(u16),
    /// A port name.
    Name(String),
}

impl<'de> Deserialize<'de> for TargetPort {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = TargetPort;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a port number (1-65535) or a port name")
            }

            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<TargetPort, E> {
                u16::try_from(v)
                    .ok()
                    .filter(|&p| p != 0)
                    .map(TargetPort::Number)
                    .ok_or_else(|| E::custom(format!("port must be between 1 and 65535, got {v}")))
            }

            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<TargetPort, E> {
                Err(E::custom(format!(
                    "port must be between 1 and 65535, got {v}"
                )))
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<TargetPort, E> {
                if v.is_empty() {
                    Err(E::custom("port name must not be empty"))
                } else {
                    Ok(TargetPort::Name(v.to_owned()))
                }
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// One `spec.identities[]` entry: an identity the service's proxies may present.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ServiceIdentity {
    /// `type: ServiceTag`: a `kuma.io/service` value, `spiffe://<mesh>/<value>` on the wire.
    ServiceTag(String),
    /// `type: SpiffeID`: a full SPIFFE ID (starts with `spiffe://`).
    SpiffeId(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ServiceSpec {
    selector: Option<RawSelector>,
    #[serde(default)]
    ports: Vec<RawPort>,
    #[serde(default)]
    identities: Vec<RawIdentity>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSelector {
    dataplane_tags: Option<Labels>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawPort {
    port: u16,
    target_port: Option<TargetPort>,
    app_protocol: Option<String>,
    name: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IdentityType {
    ServiceTag,
    SpiffeId,
}

/// The `type` spellings of a service identity.
const IDENTITY_TYPES: [(&str, IdentityType); 2] = [
    ("ServiceTag", IdentityType::ServiceTag),
    ("SpiffeID", IdentityType::SpiffeId),
];

/// One `spec.identities[]` entry, with `type` read as text: a wrong one is reported with the others.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIdentity {
    #[serde(rename = "type")]
    kind: String,
    value: String,
}

impl ServiceSpec {
    pub(super) fn into_typed(
        self,
        name: String,
        mesh: String,
        labels: Labels,
        report: &mut Report,
    ) -> MeshService {
        for (i, port) in self.ports.iter().enumerate() {
            if port.port == 0 {
                report.error(
                    format!("spec.ports[{i}].port"),
                    "must be between 1 and 65535",
                );
            }
        }
        let mut identities = Vec::with_capacity(self.identities.len());
        for (i, raw) in self.identities.into_iter().enumerate() {
            let field = format!("spec.identities[{i}].value");
            let kind = report.one_of(
                format!("spec.identities[{i}].type"),
                &raw.kind,
                &IDENTITY_TYPES,
            );
            match kind {
                None => {}
                _ if raw.value.trim().is_empty() => report.error(field, "must not be empty"),
                Some(IdentityType::SpiffeId) if !raw.value.starts_with("spiffe://") => report
                    .error(
                        field,
                        format!(
                            "a SpiffeID identity must start with spiffe://, got {:?}",
                            raw.value
                        ),
                    ),
                Some(IdentityType::SpiffeId) => {
                    identities.push(ServiceIdentity::SpiffeId(raw.value))
                }
                Some(IdentityType::ServiceTag) => {
                    identities.push(ServiceIdentity::ServiceTag(raw.value))
                }
            }
        }
        MeshService {
            name,
            mesh,
            labels,
            dataplane_tags: self.selector.and_then(|s| s.dataplane_tags),
            ports: self
                .ports
                .into_iter()
                .map(|p| ServicePort {
                    port: p.port,
                    target_port: p.target_port,
                    app_protocol: p.app_protocol,
                    name: p.name,
                })
                .collect(),
            identities,
            source: report.source.clone(),
        }
    }
}
