//! Building worlds: MeshTrust checks, created MeshTrusts and their keystore records, MeshIdentity CA rules.

use std::path::Path;
use std::time::{Duration, SystemTime};

use meshca_config::{Resources, Settings};
use meshca_keystore::{Keystore, MemoryKeystore};

use crate::test_certs::{self, mesh_trust};
use crate::world::{CaSource, World};
use crate::UpdateError;

fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

/// Loads `yaml` (as file `test.yaml`) against `keystore`, after `previous`.
fn load(
    yaml: &str,
    keystore: &dyn Keystore,
    previous: Option<&World>,
) -> Result<World, Vec<UpdateError>> {
    let parsed = meshca_config::parse_str(Path::new("test.yaml"), yaml)
        .map_err(|e| e.iter().map(UpdateError::from).collect::<Vec<_>>())?;
    let resources = Resources::from_resources(parsed)
        .map_err(|e| e.iter().map(UpdateError::from).collect::<Vec<_>>())?;
    World::load(
        resources,
        &CaSource {
            keystore,
            settings: &Settings::default(),
            previous,
            now: t0(),
        },
    )
}

#[test]
fn mesh_trust_certificates_must_decode_and_be_cas() {
    let ca = test_certs::ca("Partner Root", t0());
    let leaf = test_certs::leaf("Not A CA", t0());
    let garbage = "-----BEGIN CERTIFICATE-----\nMIIBAA==\n-----END CERTIFICATE-----\n";
    let yaml = format!(
        "type: Mesh\nname: default\n---\n{}",
        mesh_trust(
            "partner",
            "partner.example",
            &[
                &ca.cert_pem,
                garbage,
                &format!("{}{}", ca.cert_pem, leaf.cert_pem)
            ]
        )
    );
    let errors = load(&yaml, &MemoryKeystore::new(), None).expect_err("two bad bundles");
    assert_eq!(errors.len(), 2, "{errors:#?}");
    for e in &errors {
        assert_eq!(
            (e.file.as_str(), e.resource.as_str()),
            ("test.yaml", "MeshTrust/default/partner")
        );
    }
    assert_eq!(errors[0].field, "spec.caBundles[1].pem.value");
    assert!(
        errors[0]
            .message
            .contains("certificate 1 is not a valid X.509 certificate"),
        "{}",
        errors[0]
    );
    assert_eq!(errors[1].field, "spec.caBundles[2].pem.value");
    assert!(
        errors[1]
            .message
            .contains("certificate 2 (CN=Not A CA) is not a CA"),
        "{}",
        errors[1]
    );

    let yaml = format!(
        "type: Mesh\nname: default\n---\n{}",
        mesh_trust("partner", "partner.example", &[&ca.cert_pem])
    );
    let world = load(&yaml, &MemoryKeystore::new(), None).expect("a CA is accepted");
    let trust = &world.meshes["default"].trusts[0];
    assert_eq!(trust.certificates.len(), 1);
    assert_eq!(trust.certificates[0].subject, "CN=Partner Root");
}

/// MeshIdentity `web` of mesh `default` selecting every dataplane, Bundled with the given `bundled` fields.
fn identity(trust_domain: &str, bundled: &str) -> String {
    format!(
        "type: MeshIdentity\nname: web\nmesh: default\nspec:\n  selector: {{dataplane: {{matchLabels: {{}}}}}}\n  spiffeID: {{trustDomain: {trust_domain}}}\n  provider:\n    type: Bundled\n    bundled: {{{bundled}}}\n"
    )
}

#[test]
fn a_self_signed_provided_ca_needs_insecure_allow_self_signed() {
    let ca = test_certs::ca("Lonely Root", t0());
    let strict = format!(
        "type: Mesh\nname: default\n---\n{}",
        identity("web.example", &test_certs::provided(&ca))
    );
    let errors = load(&strict, &MemoryKeystore::new(), None).expect_err("refused");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let e = &errors[0];
    assert_eq!(
        (e.file.as_str(), e.resource.as_str(), e.field.as_str()),
        (
            "test.yaml",
            "MeshIdentity/default/web",
            "spec.provider.bundled.ca"
        )
    );
    assert!(
        e.message.contains("self-signed") && e.message.contains("insecureAllowSelfSigned"),
        "{e}"
    );
    let lax = format!(
        "type: Mesh\nname: default\n---\n{}",
        identity(
            "web.example",
            &format!(
                "insecureAllowSelfSigned: true, {}",
                test_certs::provided(&ca)
            )
        )
    );
    load(&lax, &MemoryKeystore::new(), None).expect("accepted with the switch");
}
