//! Resource names → secrets (DESIGN §7). Names are matched exactly; a name outside the
//! table is unknown.

use std::sync::Arc;

use envoy_types::pb::google::protobuf::Any;

use crate::secret::{self, EncodedSecret, Form};
use crate::snapshot::{MeshView, ProxyEntry, ProxyIdentity, ProxyKey, Snapshot, TrustBundle};

/// Who is asking, as far as resource names are concerned.
#[derive(Debug, Clone)]
pub(crate) struct ProxyContext {
    pub key: ProxyKey,
    /// Zone egress proxies may ask for the trust of any mesh.
    pub zone_egress: bool,
    /// The form of validation contexts whose name does not force one.
    pub form: Form,
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

    /// The secret packed under the exact name that was asked.
    pub(crate) fn to_any(&self, name: &str) -> Any {
        match self {
            Resolved::Identity(identity) => secret::identity_any(name, identity),
            Resolved::Validation(encoded) => encoded.to_any(name),
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

/// Where the asking proxy's identity stands in a snapshot.
#[derive(Debug, Clone)]
pub(crate) enum IdentityState {
    Ready(Arc<ProxyIdentity>),
    NoIdentity(String),
    /// Pending, or not in the snapshot yet.
    Waiting,
    Refused(String),
}

impl IdentityState {
    pub(crate) fn of(snapshot: &Snapshot, key: &ProxyKey) -> Self {
        match snapshot.proxies.get(key) {
            Some(ProxyEntry::Ready(identity)) => IdentityState::Ready(identity.clone()),
            Some(ProxyEntry::NoIdentity { reason }) => IdentityState::NoIdentity(reason.clone()),
            Some(ProxyEntry::Refused { reason }) => IdentityState::Refused(reason.clone()),
            Some(ProxyEntry::Pending) | None => IdentityState::Waiting,
        }
    }
}

const SYSTEM_TRUST_BUNDLE: &str = "system_trust_bundle";
const SYSTEM_TRUST_BUNDLE_PREFIX: &str = "system_trust_bundle_";
const EGRESS_BUNDLE: &str = "system_trust_bundle_egress";
const MESH_CA_PREFIX: &str = "mesh_ca:secret:";
const IDENTITY_CERT_PREFIX: &str = "identity_cert:secret:";
const MESH_SERVICE_PREFIX: &str = "meshservice:";

/// Looks `name` up for the proxy described by `ctx` in `snapshot`.
pub(crate) fn resolve(snapshot: &Snapshot, ctx: &ProxyContext, name: &str) -> Lookup {
    let own_mesh = ctx.key.mesh.as_str();
    let identity = || identity_lookup(snapshot, &ctx.key);
    match name {
        "default" => return identity(),
        SYSTEM_TRUST_BUNDLE | "ROOTCA" => return mesh_trust(snapshot, own_mesh, ctx.form),
        EGRESS_BUNDLE => {
            return match &snapshot.egress {
                Some(bundle) => trust(bundle, ctx.form, "the zone egress trust bundle"),
                None => Lookup::Unavailable("no zone egress identity exists".into()),
            }
        }
        "ALL" => return trust(&snapshot.all, ctx.form, "the trust of all meshes"),
        "mesh_ca:secret:all" => {
            return trust(&snapshot.all, Form::Plain, "the trust of all meshes")
        }
        _ => {}
    }
    if let Some(mesh) = name.strip_prefix(IDENTITY_CERT_PREFIX) {
        return if mesh == own_mesh {
            identity()
        } else {
            Lookup::Unknown
        };
    }
    if let Some(mesh) = name.strip_prefix(SYSTEM_TRUST_BUNDLE_PREFIX) {
        return if mesh == own_mesh || ctx.zone_egress {
            mesh_trust(snapshot, mesh, ctx.form)
        } else {
            Lookup::Unknown
        };
    }
    if let Some(mesh) = name.strip_prefix(MESH_CA_PREFIX) {
        return if mesh == own_mesh || ctx.zone_egress {
            mesh_trust(snapshot, mesh, Form::Plain)
        } else {
            Lookup::Unknown
        };
    }
    if let Some(service) = name.strip_prefix(MESH_SERVICE_PREFIX) {
        return mesh_service(snapshot, own_mesh, service, ctx.form);
    }
    match IdentityState::of(snapshot, &ctx.key) {
        IdentityState::Ready(identity)
            if identity.spiffe_id == name || identity.identity_name.as_deref() == Some(name) =>
        {
            Lookup::Found(Resolved::Identity(identity))
        }
        IdentityState::Ready(_) => Lookup::Unknown,
        // Without an identity we cannot tell whether a SPIFFE ID is this proxy's own:
        // treat it as an identity name that is not available yet.
        _ if name.starts_with("spiffe://") => identity(),
        _ => Lookup::Unknown,
    }
}

fn identity_lookup(snapshot: &Snapshot, key: &ProxyKey) -> Lookup {
    match IdentityState::of(snapshot, key) {
        IdentityState::Ready(identity) => Lookup::Found(Resolved::Identity(identity)),
        IdentityState::NoIdentity(reason) => {
            Lookup::Unavailable(format!("proxy {key} has no identity: {reason}"))
        }
        IdentityState::Waiting => {
            Lookup::Unavailable(format!("the identity of proxy {key} is not ready yet"))
        }
        IdentityState::Refused(reason) => {
            Lookup::Unavailable(format!("proxy {key} is refused: {reason}"))
        }
    }
}

fn mesh_view<'a>(snapshot: &'a Snapshot, mesh: &str) -> Result<&'a MeshView, Lookup> {
    snapshot
        .meshes
        .get(mesh)
        .ok_or_else(|| Lookup::Unavailable(format!("mesh {mesh:?} is not known")))
}

fn mesh_trust(snapshot: &Snapshot, mesh: &str, form: Form) -> Lookup {
    match mesh_view(snapshot, mesh) {
        Ok(view) => trust(&view.trust, form, &format!("the trust of mesh {mesh:?}")),
        Err(lookup) => lookup,
    }
}

fn trust(bundle: &TrustBundle, form: Form, what: &str) -> Lookup {
    if bundle.is_empty() {
        return Lookup::Unavailable(format!("{what} holds no CA certificate"));
    }
    Lookup::Found(Resolved::Validation(secret::bundle_secret(bundle, form)))
}

fn mesh_service(snapshot: &Snapshot, mesh: &str, service: &str, form: Form) -> Lookup {
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

/// The resources asked for, in order, without repeats.
pub(crate) fn dedup(names: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::with_capacity(names.len());
    names
        .into_iter()
        .filter(|name| seen.insert(name.clone()))
        .collect()
}

/// The resolvable subset of `names`, each with its content version, plus the names that
/// are unknown. Unavailable names are left out silently: they may appear later.
pub(crate) struct Selection {
    pub items: Vec<(String, Resolved, String)>,
    pub unknown: Vec<String>,
}

/// Resolves every name of a subscription.
pub(crate) fn select(snapshot: &Snapshot, ctx: &ProxyContext, names: &[String]) -> Selection {
    let mut items = Vec::with_capacity(names.len());
    let mut unknown = Vec::new();
    for name in names {
        match resolve(snapshot, ctx, name) {
            Lookup::Found(resolved) => {
                let version = resolved.version();
                items.push((name.clone(), resolved, version));
            }
            Lookup::Unavailable(why) => {
                tracing::debug!(proxy = %ctx.key, resource = %name, %why, "resource not available");
            }
            Lookup::Unknown => unknown.push(name.clone()),
        }
    }
    Selection { items, unknown }
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
