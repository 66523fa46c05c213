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
//! In the migrations clients check servers the way Kuma's sidecars do with MeshServices: through the
//! `meshservice:<service>` context, whose SPIFFE IDs meshca keeps current.

use std::collections::BTreeMap;

use crate::cli::DrillScenario;

/// The mesh every drill runs in.
pub const MESH: &str = "default";
/// How many services the proxies are spread over (`kuma.io/service=svc-<i % SERVICES>`).
pub const SERVICES: usize = 5;
/// The trust domain of the MeshIdentity that `migrate-to-meshidentity` introduces.
const MIGRATED_DOMAIN: &str = "default.drill.local";
/// The trust domains `trust-domain` moves between.
const OLD_DOMAIN: &str = "old.drill.local";
const NEW_DOMAIN: &str = "new.drill.local";

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

/// One edit of the resources directory: files replaced (`Some`) or removed (`None`), then an
/// optional wait before the next edit.
#[derive(Clone, Debug)]
pub struct Edit {
    /// What the edit does, for the log.
    pub what: &'static str,
    /// File name → its new content, or `None` to remove it.
    pub files: Vec<(&'static str, Option<String>)>,
    /// What to wait for before the next edit.
    pub wait: Option<Wait>,
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
    /// Whether clients check servers with `meshservice:` contexts (else: pinned to the initial ID).
    pub by_service: bool,
    /// `kuma.io/service` → (initial ID, final ID) of its proxies.
    ids: BTreeMap<String, (String, String)>,
    /// Who issues every proxy's certificate at the end, as the daemon's status names it.
    pub final_issuer: &'static str,
}

impl Script {
    /// The script of `scenario`, or of its staged variant.
    pub fn new(scenario: DrillScenario, staged: bool) -> Script {
        match scenario {
            DrillScenario::CaRotation => ca_rotation(),
            DrillScenario::MigrateToMeshidentity => migrate_to_meshidentity(staged),
            DrillScenario::TrustDomain => trust_domain(staged),
        }
    }

    /// The MeshServices whose contexts the proxies subscribe to (none when clients pin IDs).
    pub fn services(&self) -> Vec<String> {
        if self.by_service {
            self.ids.keys().cloned().collect()
        } else {
            Vec::new()
        }
    }

    /// The initial and final SPIFFE IDs of `service`'s proxies.
    pub fn ids_of(&self, service: &str) -> (&str, &str) {
        self.ids
            .get(service)
            .map_or(("", ""), |(a, b)| (a.as_str(), b.as_str()))
    }

    /// Proxy `p-<i>` serves `svc-<i % SERVICES>`, labelled `kuma.io/workload: svc-<i % SERVICES>` (the
    /// MeshIdentities' path template reads it).
    pub fn members(&self, count: usize) -> Vec<(String, String, BTreeMap<String, String>)> {
        (0..count)
            .map(|i| {
                let service = service_name(i % SERVICES);
                let labels = BTreeMap::from([("kuma.io/workload".to_owned(), service.clone())]);
                (format!("p-{i}"), service, labels)
            })
            .collect()
    }
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
    format!("spiffe://{MESH}/{service}")
}

fn workload_id(domain: &str, service: &str) -> String {
    format!("spiffe://{domain}/workload/{service}")
}

fn backend(name: &str) -> String {
    format!(
        "    - name: {name}\n      type: builtin\n      dpCert: {{rotation: {{expiration: 1h}}}}\n      conf: {{caCert: {{expiration: 1y}}}}\n"
    )
}

/// The Mesh with legacy mTLS: `enabled` issues, `secondary` stays trusted, `backends` defined.
fn legacy_mesh(enabled: &str, secondary: Option<&str>, backends: &[&str]) -> String {
    let secondary = secondary
        .map(|s| format!("  secondaryBackends: [{s}]\n"))
        .unwrap_or_default();
    let backends: String = backends.iter().map(|b| backend(b)).collect();
    format!(
        "type: Mesh\nname: {MESH}\nmtls:\n  enabledBackend: {enabled}\n{secondary}  backends:\n{backends}"
    )
}

/// The Mesh without legacy mTLS (MeshIdentities issue).
fn plain_mesh() -> String {
    format!("type: Mesh\nname: {MESH}\n")
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
            },
            Edit {
                what: "ca-1 removed",
                files: vec![("mesh.yaml", Some(legacy_mesh("ca-2", None, &["ca-2"])))],
                wait: None,
            },
        ],
        by_service: false,
        ids: ids(legacy_id, legacy_id),
        final_issuer: "backend ca-2",
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
            },
            Edit {
                what: "the MeshIdentity with a provider, selecting nothing yet, publishes its CA",
                files: vec![(
                    "identity.yaml",
                    Some(identity("workloads", MIGRATED_DOMAIN, Selects::None, true)),
                )],
                wait: Some(Wait::DomainTrusted(MIGRATED_DOMAIN)),
            },
            Edit {
                what: "the MeshIdentity selects every dataplane",
                files: vec![("identity.yaml", issuing)],
                wait: Some(Wait::FinalIdPresented),
            },
            Edit {
                what: "legacy mTLS and the provider-less MeshIdentity removed",
                files: vec![
                    ("mesh.yaml", Some(plain_mesh())),
                    ("spiffe-only.yaml", None),
                ],
                wait: None,
            },
        ]
    } else {
        vec![
            Edit {
                what: "a MeshIdentity with a provider selects every dataplane",
                files: vec![("identity.yaml", issuing)],
                wait: None,
            },
            Edit {
                what: "legacy mTLS removed",
                files: vec![("mesh.yaml", Some(plain_mesh()))],
                wait: None,
            },
        ]
    };
    Script {
        name: "migrate-to-meshidentity",
        change_phase: "migration",
        initial: vec![("mesh.yaml", legacy), ("services.yaml", mesh_services())],
        edits,
        by_service: true,
        ids: ids(legacy_id, |s| workload_id(MIGRATED_DOMAIN, s)),
        final_issuer: "MeshIdentity workloads",
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
            },
            Edit {
                what: "a MeshIdentity for the new trust domain, selecting nothing yet, publishes its CA",
                files: vec![(
                    "next.yaml",
                    Some(identity("next", NEW_DOMAIN, Selects::None, true)),
                )],
                wait: Some(Wait::DomainTrusted(NEW_DOMAIN)),
            },
            Edit {
                what: "the new MeshIdentity selects every dataplane",
                files: vec![(
                    "next.yaml",
                    Some(identity("next", NEW_DOMAIN, Selects::All, true)),
                )],
                wait: Some(Wait::FinalIdPresented),
            },
            Edit {
                what: "the old MeshIdentity and the provider-less one removed",
                files: vec![("identity.yaml", None), ("next-spiffe-only.yaml", None)],
                wait: None,
            },
        ];
        (edits, "MeshIdentity next")
    } else {
        let edits = vec![Edit {
            what: "the MeshIdentity moves to the new trust domain",
            files: vec![(
                "identity.yaml",
                Some(identity("workloads", NEW_DOMAIN, Selects::All, true)),
            )],
            wait: None,
        }];
        (edits, "MeshIdentity workloads")
    };
    Script {
        name: "trust-domain",
        change_phase: "migration",
        initial,
        edits,
        by_service: true,
        ids: ids(
            |s| workload_id(OLD_DOMAIN, s),
            |s| workload_id(NEW_DOMAIN, s),
        ),
        final_issuer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every state a script passes through is a valid resources directory.
    #[test]
    fn every_step_of_every_script_is_valid() {
        let scenarios = [
            DrillScenario::CaRotation,
            DrillScenario::MigrateToMeshidentity,
            DrillScenario::TrustDomain,
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
        let script = Script::new(DrillScenario::MigrateToMeshidentity, false);
        let members = script.members(7);
        assert_eq!(members[3].0, "p-3");
        assert_eq!(members[6].1, "svc-1");
        assert_eq!(members[6].2["kuma.io/workload"], "svc-1");
        assert_eq!(
            script.ids_of("svc-1"),
            (
                "spiffe://default/svc-1",
                "spiffe://default.drill.local/workload/svc-1"
            )
        );
        assert_eq!(script.services().len(), SERVICES);
        assert!(Script::new(DrillScenario::CaRotation, false)
            .services()
            .is_empty());
    }
}
