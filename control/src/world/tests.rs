//! Building worlds: MeshTrust checks, created MeshTrusts and their keystore records, MeshIdentity CA rules.

use std::path::Path;
use std::time::{Duration, SystemTime};

use meshca_config::{Resources, Settings};
use meshca_keystore::{Creation, Keystore, KeystoreError, MemoryKeystore, NewEntry};

use crate::test_certs::{self, mesh_trust, warnings};
use crate::world::{CaSource, IdentityProvider, LoadMode, World};
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
    test_certs::load_world(yaml, keystore, &Settings::default(), previous, t0())
}

#[test]
fn mesh_trust_certificates_must_decode_and_be_cas() {
    let ca = test_certs::ca("Partner Root", t0());
    let leaf = test_certs::leaf("Not A CA", t0());
    let garbage = "-----BEGIN CERTIFICATE-----\nMIIBAA==\n-----END CERTIFICATE-----\n";
    let yaml = format!(
        "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\n---\n{}",
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
        "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\n---\n{}",
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
        "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\n---\n{}",
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
        "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\n---\n{}",
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

/// A keystore that counts the public entries written.
#[derive(Debug, Default)]
struct Counting {
    inner: MemoryKeystore,
    writes: std::sync::Mutex<Vec<String>>,
}

impl Counting {
    fn writes(&self) -> Vec<String> {
        self.writes.lock().expect("not poisoned").clone()
    }

    fn record(&self) -> String {
        let bytes = self
            .inner
            .get_public(RECORD)
            .expect("readable")
            .expect("the record exists");
        String::from_utf8(bytes).expect("UTF-8")
    }
}

impl Keystore for Counting {
    fn get_secret(&self, name: &str) -> Result<Option<meshca_keystore::Secret>, KeystoreError> {
        self.inner.get_secret(name)
    }
    fn put_secret(&self, name: &str, data: &[u8]) -> Result<(), KeystoreError> {
        self.inner.put_secret(name, data)
    }
    fn get_public(&self, name: &str) -> Result<Option<Vec<u8>>, KeystoreError> {
        self.inner.get_public(name)
    }
    fn put_public(&self, name: &str, data: &[u8]) -> Result<(), KeystoreError> {
        self.writes
            .lock()
            .expect("not poisoned")
            .push(name.to_owned());
        self.inner.put_public(name, data)
    }
    fn create_if_absent(&self, entries: &[NewEntry<'_>]) -> Result<Creation, KeystoreError> {
        self.inner.create_if_absent(entries)
    }
    fn delete(&self, name: &str) -> Result<(), KeystoreError> {
        self.inner.delete(name)
    }
    fn list(&self, prefix: &str) -> Result<Vec<String>, KeystoreError> {
        self.inner.list(prefix)
    }
}

/// Where meshca keeps the MeshTrust of MeshIdentity `web` of mesh `default`.
const RECORD: &str = "meshtrust/default/web.yaml";

/// Mesh `default` and MeshIdentity `web` creating a MeshTrust, in trust domain `td`, with `ca` provided
/// or an autogenerated CA.
fn creating(td: &str, ca: Option<&test_certs::TestCa>) -> String {
    let source = match ca {
        Some(ca) => format!(
            "insecureAllowSelfSigned: true, {}",
            test_certs::provided(ca)
        ),
        None => "autogenerate: {enabled: true}".to_owned(),
    };
    format!(
        "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\n---\n{}",
        identity(td, &format!("meshTrustCreation: Enabled, {source}"))
    )
}

/// The identity CA of `web`.
fn identity_ca(world: &World) -> std::sync::Arc<meshca_ca::CertificateAuthority> {
    match &world.meshes["default"].identities[0].provider {
        IdentityProvider::Bundled { ca, .. } => ca.ca.clone(),
        other => panic!("not bundled: {other:?}"),
    }
}

#[test]
fn a_created_mesh_trust_is_recorded_in_kuma_format_and_reused_after_a_restart() {
    let keystore = Counting::default();
    let world = load(&creating("web.example", None), &keystore, None).expect("valid");
    assert_eq!(keystore.writes(), [RECORD], "the record is written once");
    let ca = identity_ca(&world);

    // An operator can read it, and meshca's own parser reads it as a MeshTrust resource.
    let text = keystore.record();
    let parsed = meshca_config::parse_str(Path::new("copy.yaml"), &text).expect("valid Kuma YAML");
    let [meshca_config::Resource::MeshTrust(trust)] = parsed.as_slice() else {
        panic!("one MeshTrust: {parsed:?}");
    };
    assert_eq!(
        (trust.name.as_str(), trust.mesh.as_str()),
        ("web", "default")
    );
    assert_eq!(trust.trust_domain.as_str(), "web.example");
    assert_eq!(
        trust.labels.get("kuma.io/origin").map(String::as_str),
        Some("meshca")
    );
    assert_eq!(trust.ca_bundles, &*ca.bundle_pems());
    assert!(
        text.starts_with("# The MeshTrust meshca keeps for MeshIdentity web"),
        "{text}"
    );
    let created = &world.meshes["default"].created_trusts;
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].keystore_path, RECORD);
    assert_eq!(created[0].certificates.len(), 1);
    assert_eq!(
        created[0].certificates[0].id,
        ca.id(),
        "a self-signed anchor is its CA"
    );

    // A restart: a new world from the same keystore reuses the CA and the record as they are.
    let again = load(&creating("web.example", None), &keystore, None).expect("valid");
    assert_eq!(identity_ca(&again).id(), ca.id());
    assert_eq!(
        keystore.writes(),
        [RECORD],
        "nothing changed, nothing written"
    );
    assert_eq!(keystore.record(), text);
    assert_eq!(
        again.meshes["default"].created_trusts[0].certificates,
        created[0].certificates
    );
}

#[test]
fn a_trust_domain_change_starts_the_record_over_and_warns_which_cas_leave_it() {
    let keystore = Counting::default();
    let before = load(&creating("a.example", None), &keystore, None).expect("valid");
    let old = identity_ca(&before);
    let (after, logged) =
        warnings(|| load(&creating("b.example", None), &keystore, Some(&before)).expect("valid"));
    let new = identity_ca(&after);
    assert_ne!(
        new.id(),
        old.id(),
        "a new trust domain, a new autogenerated CA"
    );
    let created = &after.meshes["default"].created_trusts[0];
    assert_eq!(created.trust_domain.as_str(), "b.example");
    let ids: Vec<&str> = created.certificates.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        ids,
        [new.id()],
        "the old trust domain's CA is not carried over"
    );
    assert!(keystore.record().contains("trustDomain: b.example"));
    assert!(
        logged.contains("WARN")
            && logged.contains("trust domain changed")
            && logged.contains("a.example")
            && logged.contains(old.id())
            && logged.contains(old.subject()),
        "{logged}"
    );
}

#[test]
fn a_corrupt_record_is_an_error_naming_it_and_is_never_replaced() {
    let keystore = Counting::default();
    load(&creating("web.example", None), &keystore, None).expect("valid");
    let good = keystore.record();
    let key = "-----BEGIN PRIVATE KEY-----\nMIIBAA==\n-----END PRIVATE KEY-----\n";
    let with_key = good.replacen(
        "          -----BEGIN CERTIFICATE-----",
        &format!(
            "{}          -----BEGIN CERTIFICATE-----",
            key.lines()
                .map(|l| format!("          {l}\n"))
                .collect::<String>()
        ),
        1,
    );
    for (corrupt, field, what) in [
        (
            with_key.as_str(),
            "spec.caBundles[0].pem.value",
            "labelled PRIVATE KEY",
        ),
        ("type: MeshTrust\nname: [", "", "YAML syntax error"),
        (
            &good.replace("name: web", "name: api"),
            "name",
            "holds MeshTrust api of mesh default, not web",
        ),
        (
            &good.replace("trustDomain: web.example", "trustDomain: Web!"),
            "spec.trustDomain",
            "",
        ),
    ] {
        keystore
            .inner
            .put_public(RECORD, corrupt.as_bytes())
            .expect("written");
        let writes = keystore.writes().len();
        let errors = load(&creating("web.example", None), &keystore, None).expect_err("corrupt");
        assert_eq!(errors.len(), 1, "{errors:#?}");
        let e = &errors[0];
        assert_eq!(e.file, format!("keystore entry {RECORD}"), "{e}");
        assert_eq!(e.field, field, "{e}");
        assert!(e.message.contains(what), "{e}");
        assert!(
            e.message.contains("remove it to have it created anew"),
            "{e}"
        );
        assert_eq!(keystore.writes().len(), writes, "never replaced: {e}");
    }
}

#[test]
fn a_rejected_update_writes_no_record() {
    let x = test_certs::ca("CA X", t0());
    let y = test_certs::ca("CA Y", t0());
    let keystore = Counting::default();
    let serving = load(&creating("web.example", Some(&x)), &keystore, None).expect("valid");
    let recorded = keystore.record();
    assert_eq!(keystore.writes(), [RECORD]);

    // Y replaces X, and the same update breaks something else: rejected whole, X's record untouched.
    let broken = format!(
        "{}---\n{}",
        creating("web.example", Some(&y)),
        mesh_trust(
            "bad",
            "bad.example",
            &[&test_certs::leaf("Leaf", t0()).cert_pem]
        )
    );
    load(&broken, &keystore, Some(&serving)).expect_err("a MeshTrust holds a leaf");
    // Or a file of the update does not parse: the world itself is fine, but the update is rejected.
    let parsed =
        meshca_config::parse_str(Path::new("test.yaml"), &creating("web.example", Some(&y)))
            .expect("parses");
    let resources = Resources::from_resources(parsed).expect("valid");
    let unparsed = meshca_config::parse_str(Path::new("other.yaml"), "type: Nope\nname: x\n")
        .expect_err("unknown type");
    let settings = Settings::default();
    crate::check_world(
        resources,
        unparsed,
        &CaSource {
            keystore: &keystore,
            mode: LoadMode::Apply,
            settings: &settings,
            previous: Some(&serving),
            now: t0(),
        },
    )
    .expect_err("other.yaml does not parse");
    assert_eq!(
        keystore.writes(),
        [RECORD],
        "nothing written by rejected updates"
    );
    assert_eq!(keystore.record(), recorded);

    // A later valid update serves what it would have served had the rejected ones never happened.
    let world = load(
        &creating("web.example", Some(&x)),
        &keystore,
        Some(&serving),
    )
    .expect("valid");
    let subjects: Vec<&str> = world.meshes["default"].created_trusts[0]
        .certificates
        .iter()
        .map(|c| c.subject.as_str())
        .collect();
    assert_eq!(subjects, ["CN=CA X"]);
    assert_eq!(keystore.writes(), [RECORD]);
}

#[test]
fn a_check_builds_the_world_with_its_generated_cas_and_writes_nothing() {
    let keystore = Counting::default();
    // A builtin backend and an autogenerated identity CA whose MeshTrust meshca creates.
    let yaml = format!(
        "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\nmtls:\n  enabledBackend: ca-1\n  backends: [{{name: ca-1, type: builtin}}]\n---\n{}",
        identity(
            "web.example",
            "meshTrustCreation: Enabled, autogenerate: {enabled: true}"
        )
    );
    let parsed = meshca_config::parse_str(Path::new("test.yaml"), &yaml).expect("parses");
    let resources = Resources::from_resources(parsed).expect("valid");
    let settings = Settings::default();
    let world = crate::check_world(
        resources,
        Vec::new(),
        &CaSource {
            keystore: &keystore,
            mode: LoadMode::Check,
            settings: &settings,
            previous: None,
            now: t0(),
        },
    )
    .expect("valid");
    let mesh = &world.meshes["default"];
    assert!(mesh.enabled_backend.is_some(), "the builtin backend's CA");
    assert_eq!(
        mesh.created_trusts.len(),
        1,
        "the identity's created MeshTrust"
    );
    identity_ca(&world);
    assert_eq!(keystore.writes(), Vec::<String>::new());
    assert_eq!(
        keystore.inner.list("").expect("listable"),
        Vec::<String>::new(),
        "no generated CA persisted"
    );
}

#[test]
fn the_first_start_resources_apply_their_mesh_identity_as_kuma_would() {
    let keystore = MemoryKeystore::new();
    let world = load(meshca_config::default_resources_yaml(), &keystore, None).expect("valid");
    let mesh = &world.meshes["default"];
    assert_eq!(
        mesh.identities
            .iter()
            .map(|i| i.name.as_str())
            .collect::<Vec<_>>(),
        ["identity"]
    );
    assert!(mesh.inactive_identities.is_empty());
    assert!(world.warnings.is_empty(), "{:?}", world.warnings);
    assert!(
        !keystore.list("").expect("listed").is_empty(),
        "its CA is generated"
    );

    // Without the Mesh's mode, Kuma 2.14 holds the MeshIdentity back, and so does meshca: no CA is made.
    let without =
        meshca_config::default_resources_yaml().replace("meshServices:\n  mode: Exclusive\n", "");
    assert_ne!(without, meshca_config::default_resources_yaml());
    let keystore = MemoryKeystore::new();
    let world = load(&without, &keystore, None).expect("valid");
    let mesh = &world.meshes["default"];
    assert!(mesh.identities.is_empty());
    assert_eq!(mesh.inactive_identities[0].name, "identity");
    assert_eq!(mesh.inactive_identities[0].provider, "Bundled");
    assert_eq!(
        keystore.list("").expect("listed"),
        Vec::<String>::new(),
        "no CA generated"
    );
    let warning = &world.warnings[0];
    assert_eq!(
        (warning.resource.as_str(), warning.field.as_str()),
        ("MeshIdentity/default/identity", "mesh")
    );
    assert!(
        warning.message.contains("MeshServicesDisabled"),
        "{warning}"
    );
}
