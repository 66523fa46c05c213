//! Loading FederationRelationships into the world, and the federated authorities a mesh's bundles
//! publish.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meshca_config::Settings;
use meshca_federation::{SpiffeBundle, X509Authority};
use meshca_identity::TrustDomain;
use meshca_keystore::MemoryKeystore;

use crate::bundles::mesh_cas;
use crate::federated::Federated;
use crate::test_certs::{self, TestCa};
use crate::world::World;
use crate::UpdateError;

fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn partner() -> TrustDomain {
    "partner.example".parse().expect("a trust domain")
}

fn load(yaml: &str) -> Result<World, Vec<UpdateError>> {
    load_in(yaml, &MemoryKeystore::new())
}

fn load_in(yaml: &str, keystore: &MemoryKeystore) -> Result<World, Vec<UpdateError>> {
    test_certs::load_world(yaml, keystore, &Settings::default(), None, t0())
}

fn relationship(mesh: &str, td: &str, url: &str, initial: &std::path::Path) -> String {
    format!(
        "type: FederationRelationship\nname: partner\nmesh: \"{mesh}\"\nspec:\n  trustDomain: {td}\n  bundleEndpoint: {{url: \"{url}\", profile: https_spiffe, spiffeID: \"spiffe://{td}/server\"}}\n  initialBundle: {{file: {}}}\n",
        initial.display()
    )
}

const MESHES: &str = "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\nmtls: {enabledBackend: ca-1, backends: [{name: ca-1, type: builtin}]}\n---\ntype: Mesh\nname: other\nmeshServices:\n  mode: Exclusive\n---\n";

fn der(ca: &TestCa) -> Vec<u8> {
    ::pem::parse(&ca.cert_pem).expect("PEM").into_contents()
}

fn subjects(world: &World, federated: &Federated, mesh: &str) -> Vec<(String, String)> {
    mesh_cas(&world.meshes[mesh], world, federated)
        .into_iter()
        .filter(|ca| ca.trust_domain == partner())
        .map(|ca| (ca.trust_domain.to_string(), ca.subject))
        .collect()
}

#[test]
fn a_mesh_trusts_the_initial_bundle_until_the_importer_holds_one() {
    let dir = tempfile::tempdir().expect("a directory");
    let initial_ca = test_certs::ca("Partner Initial", t0());
    let initial = dir.path().join("partner.pem");
    std::fs::write(&initial, &initial_ca.cert_pem).expect("written");
    let yaml = format!(
        "{MESHES}{}",
        relationship(
            "default",
            "partner.example",
            "https://bundles.partner.example/",
            &initial
        )
    );
    let world = load(&yaml).expect("valid");
    let domain = &world.federation[&partner()];
    assert_eq!(
        domain.relationships,
        [("default".to_owned(), "partner".to_owned())]
    );
    assert_eq!(domain.peer.url, "https://bundles.partner.example/");
    assert!(domain.peer.initial.is_some());

    let mut federated = Federated::default();
    assert_eq!(
        subjects(&world, &federated, "default"),
        [(
            "partner.example".to_owned(),
            "CN=Partner Initial".to_owned()
        )]
    );
    assert!(
        subjects(&world, &federated, "other").is_empty(),
        "another mesh does not trust it"
    );

    // The importer holds the peer's bundle: its authorities replace the initial ones.
    let next = test_certs::ca("Partner Next", t0());
    let held = SpiffeBundle::new(
        partner(),
        vec![X509Authority::from_der(der(&next), &partner()).expect("a CA")],
        Vec::new(),
    );
    let holding = BTreeMap::from([(partner(), Arc::new(held))]);
    assert!(federated.update(&holding), "a change");
    assert!(
        !federated.update(&holding),
        "the same bundles again are no change"
    );
    assert_eq!(
        subjects(&world, &federated, "default"),
        [("partner.example".to_owned(), "CN=Partner Next".to_owned())]
    );
}

#[test]
fn a_relationship_for_every_mesh_applies_to_each() {
    let dir = tempfile::tempdir().expect("a directory");
    let initial = dir.path().join("partner.pem");
    std::fs::write(&initial, test_certs::ca("Partner", t0()).cert_pem).expect("written");
    let yaml = format!(
        "{MESHES}{}",
        relationship("*", "partner.example", "https://b/", &initial)
    );
    let world = load(&yaml).expect("valid");
    for mesh in ["default", "other"] {
        assert_eq!(
            subjects(&world, &Federated::default(), mesh).len(),
            1,
            "{mesh}"
        );
    }
}

#[test]
fn every_problem_names_the_relationships_file_resource_and_field() {
    let dir = tempfile::tempdir().expect("a directory");
    let missing = dir.path().join("missing.pem");
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "no PEM here").expect("written");
    // A local trust domain (mesh default's legacy mTLS), a URL that is not https, a missing file.
    let yaml = format!(
        "{MESHES}{}---\n{}",
        relationship("default", "default", "https://b/", &not_pem),
        relationship("other", "partner.example", "http://b/", &missing)
            .replace("name: partner", "name: p2"),
    );
    let errors = load(&yaml).expect_err("invalid");
    let fields: Vec<(&str, &str)> = errors
        .iter()
        .map(|e| (e.resource.as_str(), e.field.as_str()))
        .collect();
    assert_eq!(
        fields,
        [
            ("FederationRelationship/default/partner", "spec.trustDomain"),
            ("FederationRelationship/other/p2", "spec.bundleEndpoint.url"),
            ("FederationRelationship/other/p2", "spec.initialBundle.file"),
        ],
        "{errors:#?}"
    );
    assert!(
        errors[0]
            .message
            .contains("meshca issues for trust domain default"),
        "{}",
        errors[0]
    );
    assert!(errors[1].message.contains("https"), "{}", errors[1]);
    assert!(errors[2].message.contains("missing.pem"), "{}", errors[2]);
    assert!(errors.iter().all(|e| e.file == "test.yaml"));

    // An initial bundle of another trust domain, and an https_web caFile that is not PEM.
    let stranger = test_certs::ca_with_uri("Stranger", "spiffe://stranger.example", t0());
    let other_domain = dir.path().join("stranger.pem");
    std::fs::write(&other_domain, &stranger.cert_pem).expect("written");
    let web = format!(
        "type: FederationRelationship\nname: web\nmesh: other\nspec:\n  trustDomain: web.example\n  bundleEndpoint: {{url: \"https://b/\", profile: https_web, caFile: {}}}\n",
        not_pem.display()
    );
    let yaml = format!(
        "{MESHES}{}---\n{web}",
        relationship("default", "partner.example", "https://b/", &other_domain)
    );
    let errors = load(&yaml).expect_err("invalid");
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert_eq!(errors[0].field, "spec.initialBundle.file");
    assert!(
        errors[0].message.contains("stranger.example"),
        "{}",
        errors[0]
    );
    assert_eq!(errors[1].field, "spec.bundleEndpoint.caFile");
    assert!(errors[1].message.contains("not.pem"), "{}", errors[1]);
}

#[test]
fn an_edited_initial_bundle_is_a_change_of_content() {
    let dir = tempfile::tempdir().expect("a directory");
    let initial = dir.path().join("partner.pem");
    std::fs::write(&initial, test_certs::ca("First", t0()).cert_pem).expect("written");
    let yaml = format!(
        "{MESHES}{}",
        relationship("default", "partner.example", "https://b/", &initial)
    );
    let keystore = MemoryKeystore::new();
    let first = load_in(&yaml, &keystore).expect("valid");
    assert!(first.same_content(&load_in(&yaml, &keystore).expect("valid")));
    std::fs::write(&initial, test_certs::ca("Second", t0()).cert_pem).expect("written");
    assert!(!first.same_content(&load_in(&yaml, &keystore).expect("valid")));
}
