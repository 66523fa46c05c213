//! Resource names → secrets. What a name means comes from the one table in `meshca-control`
//! ([`ResourceName::target`]); this module finds the secret for it in a snapshot.

use std::sync::Arc;

use envoy_types::pb::google::protobuf::Any;
use meshca_control::{
    Asker, MeshView, ProxyEntry, ProxyIdentity, ProxyKey, ResourceName, Target, TrustBundle,
    TrustScope, TrustView,
};

use crate::secret::{self, EncodedSecret, Form, KeylessIdentity};

/// Who is asking, as far as resource names are concerned.
#[derive(Debug, Clone)]
pub(crate) struct ProxyContext {
    pub key: ProxyKey,
    /// Zone egress proxies may ask for the trust of any mesh.
    pub zone_egress: bool,
    /// The form of validation contexts whose name does not force one.
    pub form: Form,
}

impl ProxyContext {
    pub(crate) fn asker(&self) -> Asker<'_> {
        Asker {
            key: &self.key,
            zone_egress: self.zone_egress,
        }
    }
}

/// A secret that can be served right now.
#[derive(Debug, Clone)]
pub(crate) enum Resolved {
    Identity(Arc<ProxyIdentity>),
    Validation(Arc<EncodedSecret>),
}

impl Resolved {
    /// The content version of this secret (never derived from key bytes).
    pub(crate) fn version(&self) -> String {
        match self {
            Resolved::Identity(identity) => secret::identity_version(identity),
            Resolved::Validation(encoded) => encoded.version().to_owned(),
        }
    }

    /// The secret packed under the exact name that was asked; an identity whose key a meshca agent
    /// holds is refused.
    pub(crate) fn to_any(&self, name: &str) -> Result<Any, KeylessIdentity> {
        match self {
            Resolved::Identity(identity) => secret::identity_any(name, identity),
            Resolved::Validation(encoded) => Ok(encoded.to_any(name)),
        }
    }
}

/// The outcome of looking a name up.
#[derive(Debug, Clone)]
pub(crate) enum Lookup {
    Found(Resolved),
    /// A name from the table whose content does not exist right now (identity not
    /// issued, no egress bundle, no such MeshService...).
    Unavailable(String),
    /// Not a name this proxy may ask for.
    Unknown,
}

/// Looks `name` up for the proxy described by `ctx` in the trust of a snapshot, where the proxy's entry
/// is `entry` (looked up once for all the names of a response).
pub(crate) fn resolve(
    snapshot: &TrustView,
    entry: Option<&ProxyEntry>,
    ctx: &ProxyContext,
    name: &ResourceName,
) -> Lookup {
    let identity = match entry {
        Some(ProxyEntry::Ready(identity)) => Some(&**identity),
        _ => None,
    };
    match name.target(ctx.asker(), identity) {
        Target::Identity => identity_lookup(entry, &ctx.key),
        Target::Trust { scope, plain } => {
            let form = if plain { Form::Plain } else { ctx.form };
            match scope {
                TrustScope::Mesh(mesh) => match mesh_view(snapshot, mesh) {
                    Ok(view) => trust(&view.trust, form, || format!("the trust of mesh {mesh:?}")),
                    Err(lookup) => lookup,
                },
                TrustScope::All => trust(&snapshot.all, form, || "the trust of all meshes".into()),
                TrustScope::Egress => match &snapshot.egress {
                    Some(egress) if !egress.trust().is_empty() => Lookup::Found(
                        Resolved::Validation(secret::mesh_service_secret(egress, form)),
                    ),
                    Some(_) => Lookup::Unavailable(
                        "the zone egress trust bundle holds no CA certificate".into(),
                    ),
                    None => Lookup::Unavailable("no zone egress identity exists".into()),
                },
            }
        }
        Target::MeshService { mesh, service } => mesh_service(snapshot, mesh, service, ctx.form),
        Target::Unknown => Lookup::Unknown,
    }
}

fn identity_lookup(entry: Option<&ProxyEntry>, key: &ProxyKey) -> Lookup {
    match entry {
        Some(ProxyEntry::Ready(identity)) => Lookup::Found(Resolved::Identity(identity.clone())),
        Some(ProxyEntry::NoIdentity { reason }) => {
            Lookup::Unavailable(format!("proxy {key} has no identity: {reason}"))
        }
        Some(ProxyEntry::Pending) | None => {
            Lookup::Unavailable(format!("the identity of proxy {key} is not ready yet"))
        }
        Some(ProxyEntry::Refused { reason }) => {
            Lookup::Unavailable(format!("proxy {key} is refused: {reason}"))
        }
    }
}

fn mesh_view<'a>(snapshot: &'a TrustView, mesh: &str) -> Result<&'a MeshView, Lookup> {
    snapshot
        .meshes
        .get(mesh)
        .ok_or_else(|| Lookup::Unavailable(format!("mesh {mesh:?} is not known")))
}

fn trust(bundle: &TrustBundle, form: Form, what: impl FnOnce() -> String) -> Lookup {
    if bundle.is_empty() {
        return Lookup::Unavailable(format!("{} holds no CA certificate", what()));
    }
    Lookup::Found(Resolved::Validation(secret::bundle_secret(bundle, form)))
}

fn mesh_service(snapshot: &TrustView, mesh: &str, service: &str, form: Form) -> Lookup {
    let view = match mesh_view(snapshot, mesh) {
        Ok(view) => view,
        Err(lookup) => return lookup,
    };
    match view.mesh_services.get(service) {
        Some(trust) if !trust.trust().is_empty() => Lookup::Found(Resolved::Validation(
            secret::mesh_service_secret(trust, form),
        )),
        Some(_) => Lookup::Unavailable(format!(
            "MeshService {service:?} of mesh {mesh:?} has no CA certificate to trust"
        )),
        None => Lookup::Unavailable(format!(
            "MeshService {service:?} is not known in mesh {mesh:?}"
        )),
    }
}

/// The version of a response holding `items`: changes iff a name or a content changes.
pub(crate) fn response_version<'a>(items: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut listing = String::new();
    for (name, version) in items {
        listing.push_str(name);
        listing.push('\0');
        listing.push_str(version);
        listing.push('\n');
    }
    secret::content_version(b"response", listing.as_bytes())
}
