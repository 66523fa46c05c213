//! `type: Dataplane` and `type: ZoneEgress`: the proxies meshca issues identities to.

use serde::de::IgnoredAny;
use serde::Deserialize;

use super::error::{Report, Source};
use super::Labels;

/// The tag naming the service an inbound belongs to.
pub const SERVICE_TAG: &str = "kuma.io/service";

/// A Dataplane resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dataplane {
    /// The dataplane (proxy) name.
    pub name: String,
    /// The mesh it belongs to.
    pub mesh: String,
    /// `labels` (e.g. `kuma.io/workload`), what MeshIdentity selectors match.
    pub labels: Labels,
    /// `networking.address`.
    pub address: Option<String>,
    /// `networking.inbound[]`; each carries a non-empty `kuma.io/service` tag.
    pub inbounds: Vec<Inbound>,
    /// Where it was defined.
    pub source: Source,
}

impl Dataplane {
    /// The `kuma.io/service` of every inbound, in order, without repeats.
    pub fn services(&self) -> Vec<&str> {
        let mut services: Vec<&str> = Vec::new();
        for service in self.inbounds.iter().filter_map(Inbound::service) {
            if !services.contains(&service) {
                services.push(service);
            }
        }
        services
    }
}

/// One `networking.inbound[]` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inbound {
    /// `port`.
    pub port: Option<u16>,
    /// `tags`, including `kuma.io/service`.
    pub tags: Labels,
}

impl Inbound {
    /// The `kuma.io/service` tag.
    pub fn service(&self) -> Option<&str> {
        self.tags.get(SERVICE_TAG).map(String::as_str)
    }
}

/// A ZoneEgress resource (it belongs to no mesh).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZoneEgress {
    /// The egress name.
    pub name: String,
    /// `labels`.
    pub labels: Labels,
    /// `networking.address`.
    pub address: Option<String>,
    /// `networking.port`.
    pub port: Option<u16>,
    /// Where it was defined.
    pub source: Source,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DataplaneDoc {
    #[serde(rename = "type")]
    _kind: IgnoredAny,
    #[serde(rename = "name")]
    _name: Option<IgnoredAny>,
    #[serde(rename = "mesh")]
    _mesh: Option<IgnoredAny>,
    labels: Option<Labels>,
    #[serde(rename = "creationTime")]
    _creation_time: Option<IgnoredAny>,
    #[serde(rename = "modificationTime")]
    _modification_time: Option<IgnoredAny>,
    // Kuma's resource identifier, which kumactl prints: output only.
    #[serde(rename = "kri")]
    _kri: Option<IgnoredAny>,
    networking: Option<RawNetworking>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawNetworking {
    address: Option<String>,
    #[serde(default)]
    inbound: Vec<RawInbound>,
    // Kuma fields meshca has no use for; accepted so existing Kuma files load.
    #[serde(rename = "advertisedAddress")]
    _advertised_address: Option<IgnoredAny>,
    #[serde(rename = "outbound")]
    _outbound: Option<IgnoredAny>,
    #[serde(rename = "admin")]
    _admin: Option<IgnoredAny>,
    #[serde(rename = "gateway")]
    _gateway: Option<IgnoredAny>,
    #[serde(rename = "transparentProxying")]
    _transparent_proxying: Option<IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInbound {
    port: Option<u16>,
    #[serde(default)]
    tags: Labels,
    #[serde(rename = "servicePort")]
    _service_port: Option<IgnoredAny>,
    #[serde(rename = "serviceAddress")]
    _service_address: Option<IgnoredAny>,
    #[serde(rename = "address")]
    _address: Option<IgnoredAny>,
    #[serde(rename = "name")]
    _name: Option<IgnoredAny>,
    #[serde(rename = "health")]
    _health: Option<IgnoredAny>,
    #[serde(rename = "serviceProbe")]
    _service_probe: Option<IgnoredAny>,
    #[serde(rename = "state")]
    _state: Option<IgnoredAny>,
}

impl DataplaneDoc {
    pub(super) fn into_typed(self, name: String, mesh: String, report: &mut Report) -> Dataplane {
        let networking = self.networking;
        let address = networking.as_ref().and_then(|n| n.address.clone());
        let mut inbounds = Vec::new();
        for (i, raw) in networking.into_iter().flat_map(|n| n.inbound).enumerate() {
            if raw.tags.get(SERVICE_TAG).is_none_or(|s| s.is_empty()) {
                report.error(
                    format!("networking.inbound[{i}].tags"),
                    format!("every inbound needs a {SERVICE_TAG} tag naming its service"),
                );
            }
            inbounds.push(Inbound {
                port: raw.port,
                tags: raw.tags,
            });
        }
        Dataplane {
            name,
            mesh,
            labels: self.labels.unwrap_or_default(),
            address,
            inbounds,
            source: report.source.clone(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ZoneEgressDoc {
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
    #[serde(rename = "zone")]
    _zone: Option<IgnoredAny>,
    networking: Option<RawEgressNetworking>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawEgressNetworking {
    address: Option<String>,
    port: Option<u16>,
    #[serde(rename = "advertisedAddress")]
    _advertised_address: Option<IgnoredAny>,
    #[serde(rename = "advertisedPort")]
    _advertised_port: Option<IgnoredAny>,
    #[serde(rename = "admin")]
    _admin: Option<IgnoredAny>,
}

impl ZoneEgressDoc {
    pub(super) fn into_typed(self, name: String, report: &Report) -> ZoneEgress {
        let (address, port) = self
            .networking
            .map(|n| (n.address, n.port))
            .unwrap_or_default();
        ZoneEgress {
            name,
            labels: self.labels.unwrap_or_default(),
            address,
            port,
            source: report.source.clone(),
        }
    }
}
