//! The drills' scenarios as scripts: the resources of the steady state, the edits an operator makes,
//! what the operator waits for between staged edits, and the state every proxy ends in.
//!
//! - `ca-rotation`: a mesh on builtin CA ca-1 switches to ca-2 in one edit (ca-1 kept as secondary)
//!   and, without waiting, a second edit removes ca-1.
//! - `migrate-to-meshidentity`: a legacy mTLS mesh; one edit adds a MeshIdentity with a provider that
//!   selects every dataplane, and at once a second edit switches legacy mTLS off. `--staged` follows
//!   Kuma's provider-less flow instead: SPIFFE IDs first, then the CA, then the identity, then clean-up,
//!   waiting for every proxy between steps.
//! - `trust-domain`: the mesh's MeshIdentity moves to another trust domain in one edit. `--staged`:
//!   a provider-less MeshIdentity for the new trust domain, then a second MeshIdentity with a provider
//!   that selects nothing, then selecting everything, then clean-up.
//!
//! - `workload`: `ca-rotation`, with workloads on the SPIFFE Workload API instead of proxies on SDS: each
//!   simulated workload is a Dataplane of the resource files and a `WorkloadRegistration` that selects
//!   the drill's own process, and takes its SVID and bundles from a `FetchX509SVID` stream.
//! - `egress`: a zone egress and sidecars of two meshes with their own CAs; the sidecars call the egress
//!   (each side validating the other) while the default mesh's CA is rotated and, at once, the default
//!   mesh is switched to the other one (`defaults.mesh`, as SIGHUP applies it).
//!
//! In the migrations clients check servers the way Kuma's sidecars do with MeshServices: through the
//! `meshservice:<service>` context, whose SPIFFE IDs meshca keeps current; sidecars check the egress with
//! `system_trust_bundle_egress`.

use std::collections::BTreeMap;

use super::fleet::MemberSpec;
use super::tls::PeerCheck;

/// The mesh every drill runs in.
pub const MESH: &str = "default";
/// How many services the proxies are spread over (`kuma.io/service=svc-<i % SERVICES>`).
pub const SERVICES: usize = 5;
/// The trust domain of the MeshIdentity that `migrate-to-meshidentity` introduces.
const MIGRATED_DOMAIN: &str = "default.drill.local";
/// The trust domains `trust-domain` moves between.
const OLD_DOMAIN: &str = "old.drill.local";
const NEW_DOMAIN: &str = "new.drill.local";

/// The drills meshca can play.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// Switch a mesh from builtin CA ca-1 to ca-2 in one edit, then remove ca-1 at once.
    CaRotation,
    /// Add a MeshIdentity with a provider selecting every dataplane to a legacy mTLS mesh, then switch
    /// legacy mTLS off at once.
    MigrateToMeshidentity,
    /// Move the mesh's MeshIdentity to another trust domain in one edit.
    TrustDomain,
    /// Sidecars of two meshes call a zone egress while the default mesh's CA is rotated and the default
    /// mesh is switched to the other one.
    Egress,
    /// Replicas on one PostgreSQL database serve the proxies; the mesh's CA is rotated, and one replica
    /// is killed in the middle.
    Failover,
    /// `CaRotation`, with workloads on the Workload API in place of proxies on SDS.
    Workload,
}

/// What the operator waits for after a staged edit, on every proxy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Every `meshservice:` context it applied accepts the final SPIFFE IDs of its service.
    FinalIdsAccepted,
    /// Its mesh bundle has CAs for this trust domain.
    DomainTrusted(&'static str),
    /// It presents its final SPIFFE ID.
    FinalIdPresented,
}

/// One edit: resource files replaced (`Some`) or removed (`None`), or `defaults.mesh` changed; then an
/// optional wait before the next edit.
#[derive(Clone, Debug, Default)]
pub struct Edit {
    /// What the edit does, for the log.
    pub what: &'static str,
    /// File name → its new content, or `None` to remove it.
    pub files: Vec<(&'static str, Option<String>)>,
    /// A new `defaults.mesh`, applied as SIGHUP applies it, instead of a file change.
    pub default_mesh: Option<&'static str>,
    /// What to wait for before the next edit.
    pub wait: Option<Wait>,
}

/// Who takes part.
#[derive(Clone, Debug)]
enum Roster {
    /// `p-<i>` of mesh `default` serving `svc-<i % SERVICES>`; `ids` per service: (initial, final).
    /// Clients validate servers with the `meshservice:` context of the server's service when
    /// `by_service`, else against its pinned initial ID.
    Services {
        ids: BTreeMap<String, (String, String)>,
        by_service: bool,
    },
    /// Zone egress `egress-1` (the one server, with these initial and final IDs), then sidecars `p-<i>`
    /// of meshes `default` and `other` in turn.
    Egress { egress: (String, String) },
}

/// A scenario, ready to play.
#[derive(Clone, Debug)]
pub struct Script {
    /// Its name in reports.
    pub name: &'static str,
    /// The name of the phase in which the edits happen (`rotation`, `migration`).
    pub change_phase: &'static str,
    /// The resource files of the steady state.
    pub initial: Vec<(&'static str, String)>,
    /// The edits, in order.
    pub edits: Vec<Edit>,
    roster: Roster,
    /// Who issues every proxy's certificate at the end, as the daemon's status names it, when one
    /// issuer does.
    pub final_issuer: Option<&'static str>,
    /// The members are workloads on the Workload API, each a Dataplane and a registration of the
    /// resource files, rather than proxies on SDS.
    pub workloads: bool,
    /// With `workloads`: how many `meshca agent`s serve them (0: the daemon's own socket does).
    /// Member `i`'s registration names agent [`agent_name`]`(i % agents)`.
    pub agents: usize,
}

impl Script {
    /// The script of `scenario`, or of its staged variant.
    pub fn new(scenario: Scenario, staged: bool) -> Script {
        match scenario {
            Scenario::CaRotation => ca_rotation(),
            Scenario::MigrateToMeshidentity => migrate_to_meshidentity(staged),
            Scenario::TrustDomain => trust_domain(staged),
            Scenario::Egress => egress(),
            // The same rotation, over replicas one of which is killed between its two edits.
            Scenario::Failover => Script {
                name: "failover",
                change_phase: "failover",
                ..ca_rotation()
            },
            Scenario::Workload => Script {
                name: "workload",
                workloads: true,
                ..ca_rotation()
            },
        }
    }

    /// The same script with its workloads behind `agents` agents (see [`Script::agents`]).
    pub fn behind_agents(self, agents: usize) -> Script {
        Script { agents, ..self }
    }

    /// The resource files of the steady state for `count` members: [`Script::initial`], and for a
    /// drill of workloads their Dataplanes and registrations, each selecting the process with effective
    /// uid `uid`, hinted with the member's name and naming its agent if there are agents.
    pub fn initial_files(&self, count: usize, uid: u32) -> Vec<(&'static str, String)> {
        let mut files = self.initial.clone();
        if self.workloads {
            let documents: Vec<String> = self
                .members(count)
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    let agent = (self.agents > 0).then(|| agent_name(i % self.agents));
                    workload_documents(m, uid, agent.as_deref())
                })
                .collect();
            files.push(("workloads.yaml", documents.join("---\n")));
        }
        files
    }

    /// Whether clients check servers with `meshservice:` contexts (else: a pinned ID, or the egress).
    pub fn by_service(&self) -> bool {
        matches!(
            self.roster,
            Roster::Services {
                by_service: true,
                ..
            }
        )
    }

    /// The validation contexts with SAN matchers every sidecar subscribes to, each with the SPIFFE ID
    /// (initial, final) of the servers it must accept.
    pub fn contexts(&self) -> BTreeMap<String, (String, String)> {
        match &self.roster {
            Roster::Services {
                ids,
                by_service: true,
            } => ids
                .iter()
                .map(|(service, pair)| (format!("meshservice:{service}"), pair.clone()))
                .collect(),
            Roster::Services { .. } => BTreeMap::new(),
            Roster::Egress { egress } => {
                BTreeMap::from([(EGRESS_CONTEXT.to_owned(), egress.clone())])
            }
        }
    }

    /// The indices of the members that serve (every member when empty): the egress.
    pub fn hubs(&self) -> Vec<usize> {
        match self.roster {
            Roster::Services { .. } => Vec::new(),
            Roster::Egress { .. } => vec![0],
        }
    }

    /// The members for `count` proxies. Sidecar `p-<i>` serves `svc-<i % SERVICES>`, labelled
    /// `kuma.io/workload: svc-<i % SERVICES>` (the MeshIdentities' path template reads it). The egress
    /// drill adds its egress first.
    pub fn members(&self, count: usize) -> Vec<MemberSpec> {
        let sidecar = |mesh: &str, i: usize, ids: (String, String), check: PeerCheck| {
            let service = service_name(i % SERVICES);
            MemberSpec {
                mesh: mesh.to_owned(),
                name: format!("p-{i}"),
                labels: BTreeMap::from([("kuma.io/workload".to_owned(), service.clone())]),
                service,
                initial_id: ids.0,
                final_id: ids.1,
                check,
                egress: false,
                // Every scenario changes the certificates of mesh `default`.
                renews: mesh == MESH,
            }
        };
        match &self.roster {
            Roster::Services { ids, by_service } => (0..count)
                .map(|i| {
                    let service = service_name(i % SERVICES);
                    let pair = ids.get(&service).cloned().unwrap_or_default();
                    let check = if *by_service {
                        PeerCheck::Context(format!("meshservice:{service}"))
                    } else {
                        PeerCheck::Exact(pair.0.clone())
                    };
                    sidecar(MESH, i, pair, check)
                })
                .collect(),
            Roster::Egress { egress } => {
                let hub = MemberSpec {
                    mesh: MESH.to_owned(),
                    name: "egress-1".to_owned(),
                    service: String::new(),
                    labels: BTreeMap::new(),
                    initial_id: egress.0.clone(),
                    final_id: egress.1.clone(),
                    check: PeerCheck::Context(EGRESS_CONTEXT.to_owned()),
                    egress: true,
                    renews: true,
                };
                let sidecars = (1..count.max(2)).map(|i| {
                    let mesh = if i % 2 == 1 { MESH } else { OTHER_MESH };
                    let id = legacy_id_in(mesh, &service_name(i % SERVICES));
                    // Sidecars only call the egress: nobody checks them as servers.
                    sidecar(mesh, i, (id.clone(), id.clone()), PeerCheck::Exact(id))
                });
                std::iter::once(hub).chain(sidecars).collect()
            }
        }
    }
}

/// The second mesh of the egress drill.
pub const OTHER_MESH: &str = "other";
/// The validation context sidecars check the zone egress with.
const EGRESS_CONTEXT: &str = "system_trust_bundle_egress";

/// A member as a workload: its Dataplane, and a registration that selects the process with effective
/// uid `uid`, hints the SVID with the member's name and names `agent`, if any.
fn workload_documents(member: &MemberSpec, uid: u32, agent: Option<&str>) -> String {
    let mut documents = registered_workload(
        &member.mesh,
        &member.name,
        &member.service,
        &member.labels,
        uid,
    );
    if let Some(agent) = agent {
        documents.push_str(&format!("  agent: {agent}\n"));
    }
    documents
}

/// The name of a drill's agent `index` (`host-a`, `host-b`, ...), as its token and the registrations
/// it serves name it.
pub fn agent_name(index: usize) -> String {
    format!("host-{}", char::from(b'a' + (index % 26) as u8))
}

/// The resource documents of a workload: Dataplane `name` of `mesh` (one inbound tagged `service`,
/// with `labels`), and a WorkloadRegistration of the same name that gives its identity to processes of
/// effective uid `uid`, hinted `name`.
pub(crate) fn registered_workload(
    mesh: &str,
    name: &str,
    service: &str,
    labels: &BTreeMap<String, String>,
    uid: u32,
) -> String {
    let labels: String = labels
        .iter()
        .map(|(k, v)| format!("  {k}: {v}\n"))
        .collect();
    format!(
        "type: Dataplane\nmesh: {mesh}\nname: {name}\nlabels:\n{labels}networking:\n  address: 127.0.0.1\n  \
         inbound:\n    - port: 8080\n      tags: {{kuma.io/service: {service}}}\n---\n\
         type: WorkloadRegistration\nmesh: {mesh}\nname: {name}\nspec:\n  dataplane: {name}\n  \
         selectors: [\"unix:uid:{uid}\"]\n  hint: {name}\n",
    )
}

fn service_name(i: usize) -> String {
    format!("svc-{i}")
}

/// Every service's (initial, final) IDs, from the two functions of the service name.
fn ids(
    initial: impl Fn(&str) -> String,
    last: impl Fn(&str) -> String,
) -> BTreeMap<String, (String, String)> {
    (0..SERVICES)
        .map(|i| {
            let service = service_name(i);
            let pair = (initial(&service), last(&service));
            (service, pair)
        })
        .collect()
}

fn legacy_id(service: &str) -> String {
    legacy_id_in(MESH, service)
}

fn legacy_id_in(mesh: &str, service: &str) -> String {
    format!("spiffe://{mesh}/{service}")
}

fn workload_id(domain: &str, service: &str) -> String {
    format!("spiffe://{domain}/workload/{service}")
}

fn backend(name: &str) -> String {
    format!(
        "    - name: {name}\n      type: builtin\n      dpCert: {{rotation: {{expiration: 1h}}}}\n      conf: {{caCert: {{expiration: 1y}}}}\n"
    )
}

/// Mesh `default` with legacy mTLS: `enabled` issues, `secondary` stays trusted, `backends` defined.
fn legacy_mesh(enabled: &str, secondary: Option<&str>, backends: &[&str]) -> String {
    legacy_mesh_named(MESH, enabled, secondary, backends)
}

/// A Mesh with legacy mTLS.
fn legacy_mesh_named(
    mesh: &str,
    enabled: &str,
    secondary: Option<&str>,
    backends: &[&str],
) -> String {
    let secondary = secondary
        .map(|s| format!("  secondaryBackends: [{s}]\n"))
        .unwrap_or_default();
    let backends: String = backends.iter().map(|b| backend(b)).collect();
    format!(
        "type: Mesh\nname: {mesh}\nmeshServices:\n  mode: Exclusive\nmtls:\n  enabledBackend: {enabled}\n{secondary}  backends:\n{backends}"
    )
}

/// The Mesh without legacy mTLS (MeshIdentities issue).
fn plain_mesh() -> String {
    format!("type: Mesh\nname: {MESH}\nmeshServices:\n  mode: Exclusive\n")
}

/// A MeshService per service, selecting its dataplanes.
fn mesh_services() -> String {
    (0..SERVICES)
        .map(|i| {
            let name = service_name(i);
            format!(
                "type: MeshService\nname: {name}\nmesh: {MESH}\nspec:\n  selector: {{dataplaneTags: {{kuma.io/service: {name}}}}}\n  ports: [{{port: 80, targetPort: 8080}}]\n"
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

/// Which dataplanes a MeshIdentity selects.
#[derive(Clone, Copy)]
enum Selects {
    All,
    None,
}

/// A MeshIdentity issuing `spiffe://<domain>/workload/<kuma.io/workload>`; with `provider`, from an
/// autogenerated CA published as a MeshTrust, else in SPIFFE-ID-only mode.
fn identity(name: &str, domain: &str, selects: Selects, provider: bool) -> String {
    let selector = match selects {
        Selects::All => "{dataplane: {matchLabels: {}}}",
        Selects::None => "{}",
    };
    let provider = if provider {
        "  provider:\n    type: Bundled\n    bundled:\n      meshTrustCreation: Enabled\n      certificateParameters: {expiry: 1h}\n      autogenerate: {enabled: true}\n"
    } else {
        ""
    };
    format!(
        "type: MeshIdentity\nname: {name}\nmesh: {MESH}\nspec:\n  selector: {selector}\n  spiffeID:\n    trustDomain: {domain}\n    path: \"/workload/{{{{ .Workload }}}}\"\n{provider}"
    )
}

fn ca_rotation() -> Script {
    Script {
        name: "ca-rotation",
        change_phase: "rotation",
        initial: vec![("mesh.yaml", legacy_mesh("ca-1", None, &["ca-1"]))],
        edits: vec![
            Edit {
                what: "ca-2 issues, ca-1 stays trusted",
                files: vec![(
                    "mesh.yaml",
                    Some(legacy_mesh("ca-2", Some("ca-1"), &["ca-1", "ca-2"])),
                )],
                wait: None,
                default_mesh: None,
            },
            Edit {
                what: "ca-1 removed",
                files: vec![("mesh.yaml", Some(legacy_mesh("ca-2", None, &["ca-2"])))],
                wait: None,
                default_mesh: None,
            },
        ],
        roster: Roster::Services {
            ids: ids(legacy_id, legacy_id),
            by_service: false,
        },
        final_issuer: Some("backend ca-2"),
        workloads: false,
        agents: 0,
    }
}

fn migrate_to_meshidentity(staged: bool) -> Script {
    let legacy = legacy_mesh("ca-1", None, &["ca-1"]);
    let issuing = Some(identity("workloads", MIGRATED_DOMAIN, Selects::All, true));
    let edits = if staged {
        vec![
            Edit {
                what: "a provider-less MeshIdentity publishes the new SPIFFE IDs",
                files: vec![(
                    "spiffe-only.yaml",
                    Some(identity(
                        "workloads-spiffe-only",
                        MIGRATED_DOMAIN,
                        Selects::All,
                        false,
                    )),
                )],
                wait: Some(Wait::FinalIdsAccepted),
                default_mesh: None,
            },
            Edit {
                what: "the MeshIdentity with a provider, selecting nothing yet, publishes its CA",
                files: vec![(
                    "identity.yaml",
                    Some(identity("workloads", MIGRATED_DOMAIN, Selects::None, true)),
                )],
                wait: Some(Wait::DomainTrusted(MIGRATED_DOMAIN)),
                default_mesh: None,
            },
            Edit {
                what: "the MeshIdentity selects every dataplane",
                files: vec![("identity.yaml", issuing)],
                wait: Some(Wait::FinalIdPresented),
                default_mesh: None,
            },
            Edit {
                what: "legacy mTLS and the provider-less MeshIdentity removed",
                files: vec![
                    ("mesh.yaml", Some(plain_mesh())),
                    ("spiffe-only.yaml", None),
                ],
                wait: None,
                default_mesh: None,
            },
        ]
    } else {
        vec![
            Edit {
                what: "a MeshIdentity with a provider selects every dataplane",
                files: vec![("identity.yaml", issuing)],
                wait: None,
                default_mesh: None,
            },
            Edit {
                what: "legacy mTLS removed",
                files: vec![("mesh.yaml", Some(plain_mesh()))],
                wait: None,
                default_mesh: None,
            },
        ]
    };
    Script {
        name: "migrate-to-meshidentity",
        change_phase: "migration",
        initial: vec![("mesh.yaml", legacy), ("services.yaml", mesh_services())],
        edits,
        roster: Roster::Services {
            ids: ids(legacy_id, |s| workload_id(MIGRATED_DOMAIN, s)),
            by_service: true,
        },
        final_issuer: Some("MeshIdentity workloads"),
        workloads: false,
        agents: 0,
    }
}

fn trust_domain(staged: bool) -> Script {
    let initial = vec![
        ("mesh.yaml", plain_mesh()),
        ("services.yaml", mesh_services()),
        (
            "identity.yaml",
            identity("workloads", OLD_DOMAIN, Selects::All, true),
        ),
    ];
    let (edits, final_issuer) = if staged {
        // `next` sorts before `workloads`: when both select every dataplane with the same specificity,
        // `next` wins, so selecting everything is the switch.
        let edits = vec![
            Edit {
                what: "a provider-less MeshIdentity publishes the new trust domain's SPIFFE IDs",
                files: vec![(
                    "next-spiffe-only.yaml",
                    Some(identity("next-spiffe-only", NEW_DOMAIN, Selects::All, false)),
                )],
                wait: Some(Wait::FinalIdsAccepted),
                default_mesh: None,
            },
            Edit {
                what: "a MeshIdentity for the new trust domain, selecting nothing yet, publishes its CA",
                files: vec![(
                    "next.yaml",
                    Some(identity("next", NEW_DOMAIN, Selects::None, true)),
                )],
                wait: Some(Wait::DomainTrusted(NEW_DOMAIN)),
                default_mesh: None,
            },
            Edit {
                what: "the new MeshIdentity selects every dataplane",
                files: vec![(
                    "next.yaml",
                    Some(identity("next", NEW_DOMAIN, Selects::All, true)),
                )],
                wait: Some(Wait::FinalIdPresented),
                default_mesh: None,
            },
            Edit {
                what: "the old MeshIdentity and the provider-less one removed",
                files: vec![("identity.yaml", None), ("next-spiffe-only.yaml", None)],
                wait: None,
                default_mesh: None,
            },
        ];
        (edits, Some("MeshIdentity next"))
    } else {
        let edits = vec![Edit {
            what: "the MeshIdentity moves to the new trust domain",
            files: vec![(
                "identity.yaml",
                Some(identity("workloads", NEW_DOMAIN, Selects::All, true)),
            )],
            wait: None,
            default_mesh: None,
        }];
        (edits, Some("MeshIdentity workloads"))
    };
    Script {
        name: "trust-domain",
        change_phase: "migration",
        initial,
        edits,
        roster: Roster::Services {
            ids: ids(
                |s| workload_id(OLD_DOMAIN, s),
                |s| workload_id(NEW_DOMAIN, s),
            ),
            by_service: true,
        },
        final_issuer,
        workloads: false,
        agents: 0,
    }
}

fn egress() -> Script {
    Script {
        name: "egress",
        change_phase: "rotation",
        initial: vec![
            ("mesh.yaml", legacy_mesh("ca-1", None, &["ca-1"])),
            (
                "other.yaml",
                legacy_mesh_named(OTHER_MESH, "other-1", None, &["other-1"]),
            ),
        ],
        edits: vec![
            Edit {
                what: "the default mesh's ca-2 issues, ca-1 stays trusted",
                files: vec![(
                    "mesh.yaml",
                    Some(legacy_mesh("ca-2", Some("ca-1"), &["ca-1", "ca-2"])),
                )],
                ..Edit::default()
            },
            Edit {
                what: "ca-1 removed",
                files: vec![("mesh.yaml", Some(legacy_mesh("ca-2", None, &["ca-2"])))],
                ..Edit::default()
            },
            Edit {
                what: "defaults.mesh switched to the other mesh",
                default_mesh: Some(OTHER_MESH),
                ..Edit::default()
            },
        ],
        roster: Roster::Egress {
            egress: (
                legacy_id_in(MESH, "zone-egress"),
                legacy_id_in(OTHER_MESH, "zone-egress"),
            ),
        },
        // The egress and the two meshes' sidecars end with three issuers.
        final_issuer: None,
        workloads: false,
        agents: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every state a script passes through is a valid resources directory.
    #[test]
    fn every_step_of_every_script_is_valid() {
        let scenarios = [
            Scenario::CaRotation,
            Scenario::MigrateToMeshidentity,
            Scenario::TrustDomain,
            Scenario::Egress,
        ];
        for scenario in scenarios {
            for staged in [false, true] {
                let script = Script::new(scenario, staged);
                let dir = tempfile::tempdir().expect("a temp dir");
                let write = |name: &str, content: &Option<String>| match content {
                    Some(yaml) => std::fs::write(dir.path().join(name), yaml).expect("writable"),
                    None => std::fs::remove_file(dir.path().join(name)).expect("present"),
                };
                let check = |step: &str| {
                    if let Err(errors) = meshca_config::load_dir(dir.path(), &Default::default()) {
                        panic!("{} ({staged}) {step}: {errors:?}", script.name);
                    }
                };
                for (name, yaml) in &script.initial {
                    write(name, &Some(yaml.clone()));
                }
                check("steady state");
                for edit in &script.edits {
                    for (name, content) in &edit.files {
                        write(name, content);
                    }
                    check(edit.what);
                }
            }
        }
    }

    #[test]
    fn members_spread_over_five_services() {
        let script = Script::new(Scenario::MigrateToMeshidentity, false);
        let members = script.members(7);
        assert_eq!(members[3].name, "p-3");
        assert_eq!(members[6].service, "svc-1");
        assert_eq!(members[6].labels["kuma.io/workload"], "svc-1");
        assert_eq!(
            (members[6].initial_id.as_str(), members[6].final_id.as_str()),
            (
                "spiffe://default/svc-1",
                "spiffe://default.drill.local/workload/svc-1"
            )
        );
        assert_eq!(
            members[6].check,
            PeerCheck::Context("meshservice:svc-1".into())
        );
        assert_eq!(script.contexts().len(), SERVICES);
        assert!(script.hubs().is_empty());
        let pinned = Script::new(Scenario::CaRotation, false);
        assert!(pinned.contexts().is_empty());
        assert_eq!(
            pinned.members(2)[1].check,
            PeerCheck::Exact("spiffe://default/svc-1".into())
        );
    }

    #[test]
    fn the_egress_drill_has_one_egress_and_sidecars_of_both_meshes() {
        let script = Script::new(Scenario::Egress, false);
        let members = script.members(5);
        assert_eq!(members.len(), 5);
        assert!(members[0].egress && !members[1].egress);
        assert_eq!(script.hubs(), [0]);
        let meshes: Vec<&str> = members[1..].iter().map(|m| m.mesh.as_str()).collect();
        assert_eq!(meshes, ["default", "other", "default", "other"]);
        assert_eq!(
            script.contexts()["system_trust_bundle_egress"],
            (
                "spiffe://default/zone-egress".to_owned(),
                "spiffe://other/zone-egress".to_owned()
            )
        );
        assert_eq!(
            script.edits.last().and_then(|e| e.default_mesh),
            Some("other")
        );
    }
}
