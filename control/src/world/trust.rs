//! MeshTrusts: the operator's resources, and the ones meshca creates for MeshIdentities with
//! `meshTrustCreation: Enabled`, kept in the keystore as Kuma universal YAML.
//!
//! A created MeshTrust is a record of every CA its MeshIdentity had in its current trust domain: a CA
//! replaced in the MeshIdentity stays trusted until the operator removes it from the record, so that no
//! certificate still presented somewhere loses its trust behind the operator's back. A new trust domain
//! starts the record over (the rollout gate keeps the old trust domain's CAs while proxies present them).

use std::path::Path;

use meshca_ca::TrustAnchor;
use meshca_config::{MeshTrust, Resource};
use meshca_identity::TrustDomain;
use meshca_keystore::Keystore;

use super::{CreatedTrust, LoadedCa, MeshTrustState, World};
use crate::error::UpdateError;

/// A MeshTrust resource with its certificates, each decoded as X.509 and checked to be a CA (its trust
/// domain and PEM block types were checked when the file was parsed).
pub(super) fn load_trust(trust: &MeshTrust, errors: &mut Vec<UpdateError>) -> MeshTrustState {
    let certificates = anchors(trust, &trust.source.file.display().to_string(), errors);
    MeshTrustState {
        name: trust.name.clone(),
        trust_domain: trust.trust_domain.clone(),
        certificates,
    }
}

/// The certificates of every `spec.caBundles` entry of `trust`, read from `file`; an entry that does not
/// hold CA certificates is an error naming its field.
fn anchors(trust: &MeshTrust, file: &str, errors: &mut Vec<UpdateError>) -> Vec<TrustAnchor> {
    let mut certificates = Vec::new();
    for (i, bundle) in trust.ca_bundles.iter().enumerate() {
        match TrustAnchor::parse_pem(bundle.as_bytes()) {
            Ok(mut anchors) => certificates.append(&mut anchors),
            Err(e) => errors.push(UpdateError {
                file: file.to_owned(),
                resource: format!("MeshTrust/{}/{}", trust.mesh, trust.name),
                field: format!("spec.caBundles[{i}].pem.value"),
                message: e.to_string(),
            }),
        }
    }
    certificates
}

/// The keystore entry of the MeshTrust meshca keeps for MeshIdentity `identity` of `mesh`.
pub fn record_path(mesh: &str, identity: &str) -> String {
    format!("meshtrust/{mesh}/{identity}.yaml")
}

/// How a created record is named as the `file` of an [`UpdateError`].
fn record_file(path: &str) -> String {
    format!("keystore entry {path}")
}

/// What a corrupt record's errors add: meshca never replaces a record on its own.
const CORRUPT_HINT: &str = "meshca does not replace a MeshTrust it created on its own: correct the entry, or remove it to have it created anew with the MeshIdentity's current CA only";

/// The MeshTrust of MeshIdentity `identity` of `mesh`, whose CA is `ca` and trust domain `trust_domain`:
/// the keystore's record, with the CA's trust anchors appended if the record lacks them, or started over
/// when the record is for another trust domain. Nothing is written here (see [`persist`]).
pub(super) fn created_trust(
    mesh: &str,
    identity: &str,
    trust_domain: &TrustDomain,
    ca: &LoadedCa,
    keystore: &dyn Keystore,
) -> Result<CreatedTrust, Vec<UpdateError>> {
    let path = record_path(mesh, identity);
    let error = |field: &str, message: String| UpdateError {
        file: record_file(&path),
        resource: format!("MeshTrust/{mesh}/{identity}"),
        field: field.to_owned(),
        message,
    };
    let current = ca
        .ca
        .bundle_pems()
        .iter()
        .map(|pem| TrustAnchor::parse_pem(pem.as_bytes()))
        .collect::<Result<Vec<Vec<_>>, _>>()
        .map_err(|e| {
            vec![error(
                "spec.caBundles",
                format!("the trust anchor of MeshIdentity {identity}'s CA cannot be recorded: {e}"),
            )]
        })?
        .concat();
    let stored = keystore
        .get_public(&path)
        .map_err(|e| vec![error("", format!("cannot read the record: {e}"))])?;
    let recorded = stored
        .map(|bytes| read_record(&bytes, &path, mesh, identity))
        .transpose()?;
    let (certificates, change) = match recorded {
        None => (current.clone(), Some(RecordChange::Created)),
        Some((recorded_domain, old)) if &recorded_domain != trust_domain => (
            current.clone(),
            Some(RecordChange::StartedOver {
                from: recorded_domain,
                leaving: old,
            }),
        ),
        Some((_, mut certificates)) => {
            let added: Vec<TrustAnchor> = current
                .iter()
                .filter(|n| !certificates.iter().any(|c| c.id == n.id))
                .cloned()
                .collect();
            certificates.extend(added.iter().cloned());
            let change = (!added.is_empty()).then_some(RecordChange::Appended(added));
            (certificates, change)
        }
    };
    let pending = change.map(|change| Pending {
        yaml: render(mesh, identity, trust_domain, &certificates),
        change,
    });
    Ok(CreatedTrust {
        name: identity.to_owned(),
        trust_domain: trust_domain.clone(),
        certificates,
        keystore_path: path,
        pending,
    })
}

/// Reads a record: one MeshTrust named after its MeshIdentity in its mesh, whose certificates are CAs.
fn read_record(
    bytes: &[u8],
    path: &str,
    mesh: &str,
    identity: &str,
) -> Result<(TrustDomain, Vec<TrustAnchor>), Vec<UpdateError>> {
    let file = record_file(path);
    let corrupt = |field: &str, message: &str| {
        vec![UpdateError {
            file: file.clone(),
            resource: format!("MeshTrust/{mesh}/{identity}"),
            field: field.to_owned(),
            message: format!("{message}; {CORRUPT_HINT}"),
        }]
    };
    let text =
        std::str::from_utf8(bytes).map_err(|_| corrupt("", "the record is not UTF-8 text"))?;
    let resources = meshca_config::parse_str(Path::new(&file), text).map_err(|errors| {
        errors
            .iter()
            .map(|e| {
                let mut e = UpdateError::from(e);
                e.resource = format!("MeshTrust/{mesh}/{identity}");
                e.message = format!("{}; {CORRUPT_HINT}", e.message);
                e
            })
            .collect::<Vec<_>>()
    })?;
    let trust = match resources.as_slice() {
        [Resource::MeshTrust(trust)] => trust,
        _ => {
            return Err(corrupt(
                "",
                &format!(
                    "the record must hold exactly one MeshTrust, named {identity}, of mesh {mesh}"
                ),
            ))
        }
    };
    if trust.name != identity || trust.mesh != mesh {
        return Err(corrupt(
            "name",
            &format!(
                "the record holds MeshTrust {} of mesh {}, not {identity} of mesh {mesh}",
                trust.name, trust.mesh
            ),
        ));
    }
    let mut errors = Vec::new();
    let certificates = anchors(trust, &file, &mut errors);
    if !errors.is_empty() {
        for e in &mut errors {
            e.message = format!("{}; {CORRUPT_HINT}", e.message);
        }
        return Err(errors);
    }
    Ok((trust.trust_domain.clone(), certificates))
}

/// A created MeshTrust in Kuma's universal format, so an operator can read it or copy it.
fn render(
    mesh: &str,
    identity: &str,
    trust_domain: &TrustDomain,
    certificates: &[TrustAnchor],
) -> String {
    let mut out = format!(
        "# The MeshTrust meshca keeps for MeshIdentity {identity} of mesh {mesh} (meshTrustCreation: Enabled).\n\
         # meshca appends the identity's CA whenever it changes and starts over when its trust domain\n\
         # changes; every CA listed here is in the mesh's trust bundles. Remove a CA once no proxy presents\n\
         # certificates from it, then reload meshca (SIGHUP).\n\
         type: MeshTrust\nname: {identity}\nmesh: {mesh}\nlabels:\n  kuma.io/origin: meshca\nspec:\n  trustDomain: {trust_domain}\n  caBundles:\n"
    );
    for certificate in certificates {
        out.push_str(&format!(
            "    # {}\n    - type: Pem\n      pem:\n        value: |\n",
            certificate
                .subject
                .chars()
                .filter(|c| !c.is_control())
                .collect::<String>()
        ));
        for line in certificate.pem.lines() {
            out.push_str("          ");
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// A record to write once the world is accepted, and why.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    yaml: String,
    change: RecordChange,
}

#[derive(Debug, Clone)]
enum RecordChange {
    /// There was none.
    Created,
    /// The identity's current CA joined the record.
    Appended(Vec<TrustAnchor>),
    /// The record was for trust domain `from`; these CAs of it leave.
    StartedOver {
        from: TrustDomain,
        leaving: Vec<TrustAnchor>,
    },
}

/// Writes every created MeshTrust of `world` that changed, each atomically, and says what changed. Call
/// it only for a world that loaded without any error: a rejected update leaves the records as they were.
pub(super) fn persist(world: &World, keystore: &dyn Keystore) -> Result<(), Vec<UpdateError>> {
    let mut errors = Vec::new();
    for (mesh, trust) in world
        .meshes
        .values()
        .flat_map(|m| m.created_trusts.iter().map(move |t| (&m.name, t)))
    {
        let Some(pending) = &trust.pending else {
            continue;
        };
        if let Err(e) = keystore.put_public(&trust.keystore_path, pending.yaml.as_bytes()) {
            errors.push(UpdateError {
                file: record_file(&trust.keystore_path),
                resource: format!("MeshTrust/{mesh}/{}", trust.name),
                field: String::new(),
                message: format!(
                    "cannot write the MeshTrust meshca keeps for MeshIdentity {}: {e}",
                    trust.name
                ),
            });
            continue;
        }
        log_change(mesh, trust, &pending.change);
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

fn log_change(mesh: &str, trust: &CreatedTrust, change: &RecordChange) {
    let describe = |certificates: &[TrustAnchor]| {
        certificates
            .iter()
            .map(|c| format!("{} (id {})", c.subject, c.id))
            .collect::<Vec<_>>()
    };
    match change {
        RecordChange::Created => tracing::info!(
            mesh,
            identity = %trust.name,
            trust_domain = %trust.trust_domain,
            entry = %trust.keystore_path,
            "created the MeshTrust of a MeshIdentity with meshTrustCreation: Enabled"
        ),
        RecordChange::Appended(added) => tracing::info!(
            mesh,
            identity = %trust.name,
            trust_domain = %trust.trust_domain,
            entry = %trust.keystore_path,
            added = ?describe(added),
            "the MeshIdentity's CA changed: added it to its MeshTrust; the CAs before it stay trusted until removed from the entry"
        ),
        RecordChange::StartedOver { from, leaving } => tracing::warn!(
            mesh,
            identity = %trust.name,
            old_trust_domain = %from,
            trust_domain = %trust.trust_domain,
            entry = %trust.keystore_path,
            leaving = ?describe(leaving),
            "the MeshIdentity's trust domain changed: its MeshTrust starts over for the new trust domain, and these CAs of the old one leave it (each stays in the bundles while connected proxies present its certificates)"
        ),
    }
}
