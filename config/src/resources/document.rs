//! Splitting a file into documents, reading each document's header (`type`, `name`, `mesh`)
//! and handing the body to the type's own parser.

use std::fmt;
use std::path::Path;

use serde::de::IgnoredAny;
use serde::Deserialize;
use zeroize::Zeroize;

use super::dataplane::{DataplaneDoc, ZoneEgressDoc};
use super::error::{Report, ResourceError, Source};
use super::federation::{FederationSpec, EVERY_MESH};
use super::identity::IdentitySpec;
use super::mesh::MeshDoc;
use super::registration::RegistrationSpec;
use super::secret::{Secret, SecretDoc};
use super::service::ServiceSpec;
use super::trust::TrustSpec;
use super::{
    Dataplane, FederationRelationship, Labels, Mesh, MeshIdentity, MeshService, MeshTrust,
    WorkloadRegistration, ZoneEgress,
};
use crate::names::{check_name, cut, MAX_NAME_LEN};
use crate::yaml;

/// Any resource meshca reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resource {
    /// `type: Mesh`.
    Mesh(Mesh),
    /// `type: MeshIdentity`.
    MeshIdentity(MeshIdentity),
    /// `type: MeshTrust`.
    MeshTrust(MeshTrust),
    /// `type: Dataplane`.
    Dataplane(Dataplane),
    /// `type: ZoneEgress`.
    ZoneEgress(ZoneEgress),
    /// `type: MeshService`.
    MeshService(MeshService),
    /// `type: WorkloadRegistration`.
    WorkloadRegistration(WorkloadRegistration),
    /// `type: FederationRelationship`.
    FederationRelationship(FederationRelationship),
    /// `type: Secret` (universal).
    Secret(Secret),
}

/// The resource types, as spelled in `type:`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResourceType {
    /// `Mesh`.
    Mesh,
    /// `MeshIdentity`.
    MeshIdentity,
    /// `MeshTrust`.
    MeshTrust,
    /// `Dataplane`.
    Dataplane,
    /// `ZoneEgress`.
    ZoneEgress,
    /// `MeshService`.
    MeshService,
    /// `WorkloadRegistration`.
    WorkloadRegistration,
    /// `FederationRelationship`.
    FederationRelationship,
    /// `Secret` (Kuma's universal Secret).
    Secret,
}

impl ResourceType {
    /// Every type meshca reads.
    pub const ALL: [ResourceType; 9] = [
        ResourceType::Mesh,
        ResourceType::MeshIdentity,
        ResourceType::MeshTrust,
        ResourceType::Dataplane,
        ResourceType::ZoneEgress,
        ResourceType::MeshService,
        ResourceType::WorkloadRegistration,
        ResourceType::FederationRelationship,
        ResourceType::Secret,
    ];

    /// The `type:` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceType::Mesh => "Mesh",
            ResourceType::MeshIdentity => "MeshIdentity",
            ResourceType::MeshTrust => "MeshTrust",
            ResourceType::Dataplane => "Dataplane",
            ResourceType::ZoneEgress => "ZoneEgress",
            ResourceType::MeshService => "MeshService",
            ResourceType::WorkloadRegistration => "WorkloadRegistration",
            ResourceType::FederationRelationship => "FederationRelationship",
            ResourceType::Secret => "Secret",
        }
    }

    /// Whether resources of this type belong to a mesh (all but Mesh and ZoneEgress).
    pub fn is_mesh_scoped(self) -> bool {
        !matches!(self, ResourceType::Mesh | ResourceType::ZoneEgress)
    }

    /// The identifier used in error messages: `Type/name` or `Type/mesh/name`.
    pub fn id(self, mesh: Option<&str>, name: &str) -> String {
        match mesh {
            Some(mesh) => format!("{self}/{mesh}/{name}"),
            None => format!("{self}/{name}"),
        }
    }
}

impl fmt::Display for ResourceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Resource {
    /// The resource's type.
    pub fn kind(&self) -> ResourceType {
        match self {
            Resource::Mesh(_) => ResourceType::Mesh,
            Resource::MeshIdentity(_) => ResourceType::MeshIdentity,
            Resource::MeshTrust(_) => ResourceType::MeshTrust,
            Resource::Dataplane(_) => ResourceType::Dataplane,
            Resource::ZoneEgress(_) => ResourceType::ZoneEgress,
            Resource::MeshService(_) => ResourceType::MeshService,
            Resource::WorkloadRegistration(_) => ResourceType::WorkloadRegistration,
            Resource::FederationRelationship(_) => ResourceType::FederationRelationship,
            Resource::Secret(_) => ResourceType::Secret,
        }
    }

    /// The resource name.
    pub fn name(&self) -> &str {
        match self {
            Resource::Mesh(r) => &r.name,
            Resource::MeshIdentity(r) => &r.name,
            Resource::MeshTrust(r) => &r.name,
            Resource::Dataplane(r) => &r.name,
            Resource::ZoneEgress(r) => &r.name,
            Resource::MeshService(r) => &r.name,
            Resource::WorkloadRegistration(r) => &r.name,
            Resource::FederationRelationship(r) => &r.name,
            Resource::Secret(r) => &r.name,
        }
    }

    /// The mesh it belongs to; `None` for Mesh and ZoneEgress.
    pub fn mesh(&self) -> Option<&str> {
        match self {
            Resource::Mesh(_) | Resource::ZoneEgress(_) => None,
            Resource::MeshIdentity(r) => Some(&r.mesh),
            Resource::MeshTrust(r) => Some(&r.mesh),
            Resource::Dataplane(r) => Some(&r.mesh),
            Resource::MeshService(r) => Some(&r.mesh),
            Resource::WorkloadRegistration(r) => Some(&r.mesh),
            Resource::FederationRelationship(r) => Some(&r.mesh),
            Resource::Secret(r) => Some(&r.mesh),
        }
    }

    /// Where it was defined.
    pub fn source(&self) -> &Source {
        match self {
            Resource::Mesh(r) => &r.source,
            Resource::MeshIdentity(r) => &r.source,
            Resource::MeshTrust(r) => &r.source,
            Resource::Dataplane(r) => &r.source,
            Resource::ZoneEgress(r) => &r.source,
            Resource::MeshService(r) => &r.source,
            Resource::WorkloadRegistration(r) => &r.source,
            Resource::FederationRelationship(r) => &r.source,
            Resource::Secret(r) => &r.source,
        }
    }

    /// `Type/name` or `Type/mesh/name`, as in error messages.
    pub fn id(&self) -> String {
        self.kind().id(self.mesh(), self.name())
    }
}

/// Kuma resource types meshca has no use for. Documents of these types are skipped so that a
/// directory of existing Kuma resources loads; any other unknown type is an error (a typo).
const KUMA_TYPES_SKIPPED: &[&str] = &[
    "CircuitBreaker",
    "ExternalService",
    "FaultInjection",
    "GlobalSecret",
    "HealthCheck",
    "HostnameGenerator",
    "MeshAccessLog",
    "MeshCircuitBreaker",
    "MeshExternalService",
    "MeshFaultInjection",
    "MeshGateway",
    "MeshGatewayRoute",
    "MeshHTTPRoute",
    "MeshHealthCheck",
    "MeshLoadBalancingStrategy",
    "MeshMetric",
    "MeshMultiZoneService",
    "MeshPassthrough",
    "MeshProxyPatch",
    "MeshRateLimit",
    "MeshRetry",
    "MeshTCPRoute",
    "MeshTLS",
    "MeshTimeout",
    "MeshTrace",
    "MeshTrafficPermission",
    "ProxyTemplate",
    "RateLimit",
    "Retry",
    "Timeout",
    "TrafficLog",
    "TrafficPermission",
    "TrafficRoute",
    "TrafficTrace",
    "VirtualOutbound",
    "Zone",
    "ZoneIngress",
];

/// The document form of the types whose fields sit under `spec`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecDoc<S> {
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
    spec: S,
    #[serde(rename = "status")]
    _status: Option<IgnoredAny>,
    /// A MeshService's SNIs, which Kuma 2.14 computes and prints: output only, and a MeshService's only.
    snis: Option<IgnoredAny>,
}

impl<S> SpecDoc<S> {
    /// Refuses `snis` on anything but a MeshService.
    fn no_snis(&self, kind: ResourceType, report: &mut Report) {
        if self.snis.is_some() {
            report.error(
                "snis",
                format!(
                    "unknown field: a {kind} has no snis (Kuma computes them for a MeshService)"
                ),
            );
        }
    }
}

/// What one file held.
#[derive(Debug, Default)]
pub(super) struct ParsedFile {
    /// The resources whose documents had no error.
    pub(super) resources: Vec<Resource>,
    /// Every error, in document order.
    pub(super) errors: Vec<ResourceError>,
    /// The Meshes and Dataplanes whose documents had errors: other resources may still refer to
    /// them without a second, misleading "does not exist" error.
    pub(super) broken: Vec<Broken>,
    /// What was skipped on purpose and is worth a look (Kuma's Insight resources): no error.
    pub(super) notes: Vec<ResourceError>,
}

/// A Mesh or Dataplane whose document had errors (already reported), named by its header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Broken {
    /// [`ResourceType::Mesh`] or [`ResourceType::Dataplane`].
    pub(super) kind: ResourceType,
    /// The mesh of a Dataplane; `None` for a Mesh.
    pub(super) mesh: Option<String>,
    /// The resource name.
    pub(super) name: String,
}

/// Kuma's Insight types (status Kuma computes, which `kumactl export` writes): skipped, with one note per
/// file.
const KUMA_INSIGHT_TYPES: [&str; 7] = [
    "DataplaneInsight",
    "MeshInsight",
    "ServiceInsight",
    "ZoneInsight",
    "ZoneIngressInsight",
    "ZoneEgressInsight",
    "MeshServiceInsight",
];

/// Parses every document of one file. Errors of one document do not stop the others; a YAML
/// syntax error ends the file (the parser cannot resynchronise). A document that is a list as
/// `kumactl get ... -o yaml` prints one (`items:`, with `next` and `total`) is read item by item.
pub(super) fn parse_file(file: &Path, text: &str) -> ParsedFile {
    let mut parsed = ParsedFile::default();
    let mut insights: Vec<String> = Vec::new();
    let values = yaml_serde::Deserializer::from_str(text);
    let typed = yaml_serde::Deserializer::from_str(text);
    for (index, (value, typed)) in values.zip(typed).enumerate() {
        let source = Source {
            file: file.to_owned(),
            document: index + 1,
        };
        let value = match yaml_serde::Value::deserialize(value) {
            Ok(value) => value,
            Err(e) => {
                let mut report = Report::new(source);
                report.error("", format!("YAML syntax error: {e}"));
                parsed.errors.append(&mut report.errors);
                break;
            }
        };
        match list_items(&value) {
            Some(Ok(items)) => {
                for (k, item) in items.iter().enumerate() {
                    let mut report = Report::new(source.clone());
                    // Each item again as YAML text, for the typed reader that names failing fields.
                    match yaml_serde::to_string(item) {
                        Ok(mut item_text) => {
                            match yaml_serde::Deserializer::from_str(&item_text).next() {
                                Some(typed) => parse_document(
                                    item,
                                    typed,
                                    &mut report,
                                    &mut parsed,
                                    &mut insights,
                                ),
                                None => report.error("", "an empty item"),
                            }
                            // Items may hold inline private keys, as files do.
                            item_text.zeroize();
                        }
                        Err(e) => report.error("", format!("cannot be read as a resource: {e}")),
                    }
                    for mut error in report.errors {
                        error.field = match error.field.as_str() {
                            "" => format!("items[{k}]"),
                            field => format!("items[{k}].{field}"),
                        };
                        parsed.errors.push(error);
                    }
                }
            }
            Some(Err(message)) => {
                let mut report = Report::new(source);
                report.error("items", message);
                parsed.errors.append(&mut report.errors);
            }
            None => {
                let mut report = Report::new(source);
                parse_document(&value, typed, &mut report, &mut parsed, &mut insights);
                parsed.errors.append(&mut report.errors);
            }
        }
    }
    if !insights.is_empty() {
        insights.sort();
        insights.dedup();
        parsed.notes.push(ResourceError {
            file: file.to_owned(),
            document: 0,
            resource: None,
            field: String::new(),
            message: format!(
                "Kuma's {} resources are skipped: Kuma computes them, and meshca reports its own status",
                insights.join(", ")
            ),
        });
    }
    parsed
}

/// The items of a document that is a list as kumactl prints one (`items`, and optionally `next` and
/// `total`, no `type`); `None` for any other document.
fn list_items(value: &yaml_serde::Value) -> Option<Result<&Vec<yaml_serde::Value>, String>> {
    let map = value.as_mapping()?;
    if map.contains_key("type") || !map.contains_key("items") {
        return None;
    }
    if let Some(other) = map
        .keys()
        .filter_map(|k| k.as_str())
        .find(|k| !["items", "next", "total"].contains(k))
    {
        return Some(Err(format!(
            "a list as kumactl prints one holds items, next and total; {other:?} is not one of them"
        )));
    }
    Some(match map.get("items") {
        Some(yaml_serde::Value::Sequence(items)) => Ok(items),
        Some(yaml_serde::Value::Null) => Err("must be a list of resources".to_owned()),
        _ => Err("must be a list of resources".to_owned()),
    })
}

/// Parses one resource document (or list item): its header, then its body. A Kuma Insight is noted in
/// `insights` and skipped.
fn parse_document(
    value: &yaml_serde::Value,
    typed: yaml_serde::Deserializer<'_>,
    report: &mut Report,
    parsed: &mut ParsedFile,
    insights: &mut Vec<String>,
) {
    if let Some(kind) = value.get("type").and_then(|t| t.as_str()) {
        if KUMA_INSIGHT_TYPES.contains(&kind) {
            insights.push(kind.to_owned());
            return;
        }
    }
    if let Ok(Some(header)) = parse_header(value, report) {
        let referred = matches!(header.kind, ResourceType::Mesh | ResourceType::Dataplane);
        let broken = referred.then(|| Broken {
            kind: header.kind,
            mesh: header.mesh.clone(),
            name: header.name.clone(),
        });
        let resource = parse_body(header, typed, report);
        match resource {
            Some(resource) if !report.has_errors() => parsed.resources.push(resource),
            _ => parsed.broken.extend(broken),
        }
    }
}

/// The `type`, `name` and `mesh` of a document, each checked.
struct Header {
    kind: ResourceType,
    name: String,
    mesh: Option<String>,
}

fn string_field(value: &yaml_serde::Value, key: &str, report: &mut Report) -> Option<String> {
    match value.get(key)? {
        yaml_serde::Value::String(s) => Some(s.clone()),
        _ => {
            report.error(key, "must be a string");
            None
        }
    }
}

/// Reads the header. `Ok(None)` is a document to skip (empty, or a Kuma type meshca ignores).
fn parse_header(value: &yaml_serde::Value, report: &mut Report) -> Result<Option<Header>, ()> {
    if value.is_null() {
        return Ok(None);
    }
    if !value.is_mapping() {
        report.error(
            "",
            "expected a resource: a mapping with type, name and its fields",
        );
        return Err(());
    }
    let known = || {
        ResourceType::ALL
            .iter()
            .map(|t| t.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(type_name) = string_field(value, "type", report) else {
        if value.get("type").is_none() {
            report.error("type", format!("required; one of {}", known()));
        }
        return Err(());
    };
    let Some(kind) = ResourceType::ALL
        .into_iter()
        .find(|t| t.as_str() == type_name)
    else {
        if KUMA_TYPES_SKIPPED.contains(&type_name.as_str()) {
            tracing::debug!(file = %report.source.file.display(), document = report.source.document, r#type = %type_name, "skipping a Kuma resource type meshca does not use");
            return Ok(None);
        }
        report.error(
            "type",
            format!(
                "unknown resource type {type_name:?}; meshca reads {}",
                known()
            ),
        );
        return Err(());
    };
    let name = string_field(value, "name", report);
    let mesh = string_field(value, "mesh", report);
    let mut ok = !report.has_errors();
    match &name {
        None if value.get("name").is_none() => {
            report.error("name", "required");
            ok = false;
        }
        None => {}
        Some(name) => {
            // Named in every error of the document: cut, in case the name is what is wrong.
            let mesh = mesh.as_deref().filter(|_| kind.is_mesh_scoped());
            let mesh = mesh.map(|m| cut(m, MAX_NAME_LEN));
            report.resource = Some(kind.id(mesh.as_deref(), &cut(name, MAX_NAME_LEN)));
            if let Err(m) = check_name(name) {
                report.error("name", m.to_string());
                ok = false;
            }
        }
    }
    match (&mesh, kind.is_mesh_scoped()) {
        (Some(_), false) => {
            report.error(
                "mesh",
                format!("a {kind} belongs to no mesh; remove this field"),
            );
            ok = false;
        }
        (None, true) if value.get("mesh").is_none() => {
            report.error(
                "mesh",
                format!("required: the name of the Mesh this {kind} belongs to"),
            );
            ok = false;
        }
        (Some(mesh), true)
            if kind == ResourceType::FederationRelationship && mesh == EVERY_MESH => {}
        (Some(mesh), true) => {
            if let Err(m) = check_name(mesh) {
                report.error("mesh", m.to_string());
                ok = false;
            }
        }
        (None, _) => {}
    }
    match name {
        Some(name) if ok => Ok(Some(Header { kind, name, mesh })),
        _ => Err(()),
    }
}

/// Parses the body of a document whose header is valid; errors go to `report`.
fn parse_body(
    header: Header,
    typed: yaml_serde::Deserializer<'_>,
    report: &mut Report,
) -> Option<Resource> {
    let Header { kind, name, mesh } = header;
    // A mesh-scoped header always has a mesh here; Mesh and ZoneEgress never do.
    let mesh = mesh.unwrap_or_default();
    Some(match kind {
        ResourceType::Mesh => {
            let doc = body::<MeshDoc>(typed, report)?;
            Resource::Mesh(doc.into_typed(name, report))
        }
        ResourceType::ZoneEgress => {
            let doc = body::<ZoneEgressDoc>(typed, report)?;
            Resource::ZoneEgress(doc.into_typed(name, report))
        }
        ResourceType::Dataplane => {
            let doc = body::<DataplaneDoc>(typed, report)?;
            Resource::Dataplane(doc.into_typed(name, mesh, report))
        }
        ResourceType::MeshIdentity => {
            let doc = body::<SpecDoc<IdentitySpec>>(typed, report)?;
            doc.no_snis(kind, report);
            let labels = doc.labels.unwrap_or_default();
            Resource::MeshIdentity(doc.spec.into_typed(name, mesh, labels, report)?)
        }
        ResourceType::MeshTrust => {
            let doc = body::<SpecDoc<TrustSpec>>(typed, report)?;
            doc.no_snis(kind, report);
            let labels = doc.labels.unwrap_or_default();
            Resource::MeshTrust(doc.spec.into_typed(name, mesh, labels, report)?)
        }
        ResourceType::MeshService => {
            let doc = body::<SpecDoc<ServiceSpec>>(typed, report)?;
            let labels = doc.labels.unwrap_or_default();
            Resource::MeshService(doc.spec.into_typed(name, mesh, labels, report))
        }
        ResourceType::WorkloadRegistration => {
            let doc = body::<SpecDoc<RegistrationSpec>>(typed, report)?;
            doc.no_snis(kind, report);
            let labels = doc.labels.unwrap_or_default();
            Resource::WorkloadRegistration(doc.spec.into_typed(name, mesh, labels, report)?)
        }
        ResourceType::Secret => {
            let doc = body::<SecretDoc>(typed, report)?;
            Resource::Secret(doc.into_typed(name, mesh, report)?)
        }
        ResourceType::FederationRelationship => {
            let doc = body::<SpecDoc<FederationSpec>>(typed, report)?;
            doc.no_snis(kind, report);
            let labels = doc.labels.unwrap_or_default();
            Resource::FederationRelationship(doc.spec.into_typed(name, mesh, labels, report)?)
        }
    })
}

/// Deserializes the body of a document, reporting the failing field.
fn body<T: serde::de::DeserializeOwned>(
    typed: yaml_serde::Deserializer<'_>,
    report: &mut Report,
) -> Option<T> {
    yaml::deserialize(typed)
        .map_err(|e| report.error(e.field, e.message))
        .ok()
}
