//! Test support: certificates made for tests (rcgen), the YAML that carries them into resources, and a
//! capture of what a piece of code logs.

use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair, KeyUsagePurpose,
    SanType,
};

/// A certificate with its key, as PEM.
#[derive(Debug)]
pub struct TestCa {
    /// The certificate.
    pub cert_pem: String,
    /// Its key (PKCS#8).
    pub key_pem: String,
}

fn params(cn: &str, ca: bool, uri: Option<&str>, now: SystemTime) -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    p.distinguished_name = dn;
    p.is_ca = if ca {
        IsCa::Ca(BasicConstraints::Unconstrained)
    } else {
        IsCa::ExplicitNoCa
    };
    p.key_usages = if ca {
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign]
    } else {
        vec![KeyUsagePurpose::DigitalSignature]
    };
    let day = Duration::from_secs(86_400);
    p.not_before = (now - day).into();
    p.not_after = (now + 365 * day).into();
    if let Some(uri) = uri {
        p.subject_alt_names = vec![SanType::URI(uri.try_into().expect("ia5 string"))];
    }
    p
}

fn self_signed(p: CertificateParams) -> TestCa {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("keygen");
    let cert = p.self_signed(&key).expect("self-signed");
    TestCa {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

/// A self-signed CA named `cn`, valid around `now`, with no URI SAN (so no trust domain of its own).
pub fn ca(cn: &str, now: SystemTime) -> TestCa {
    self_signed(params(cn, true, None, now))
}

/// A self-signed CA named `cn` with the URI SAN `uri` (a SPIFFE trust domain's CA).
pub fn ca_with_uri(cn: &str, uri: &str, now: SystemTime) -> TestCa {
    self_signed(params(cn, true, Some(uri), now))
}

/// A root CA `root_cn` and, signed by it, an intermediate CA `cn` whose PEM is the intermediate followed by
/// the root (with the intermediate's key), both without URI SAN.
pub fn intermediate(root_cn: &str, cn: &str, now: SystemTime) -> (TestCa, TestCa) {
    let root_params = params(root_cn, true, None, now);
    let root_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("keygen");
    let root = root_params.self_signed(&root_key).expect("self-signed");
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("keygen");
    let issuer = rcgen::Issuer::from_params(&root_params, &root_key);
    let cert = params(cn, true, None, now)
        .signed_by(&key, &issuer)
        .expect("signed");
    (
        TestCa {
            cert_pem: root.pem(),
            key_pem: root_key.serialize_pem(),
        },
        TestCa {
            cert_pem: format!("{}{}", cert.pem(), root.pem()),
            key_pem: key.serialize_pem(),
        },
    )
}

/// A self-signed certificate that is not a CA.
pub fn leaf(cn: &str, now: SystemTime) -> TestCa {
    self_signed(params(cn, false, None, now))
}

/// PEM text as a double-quoted YAML scalar.
pub fn quoted(pem: &str) -> String {
    format!("\"{}\"", pem.replace('\n', "\\n"))
}

/// The `ca:` of a Bundled provider with `ca` inline (flow style).
pub fn provided(ca: &TestCa) -> String {
    format!(
        "ca: {{certificate: {{type: InsecureInline, insecureInline: {{value: {}}}}}, privateKey: {{type: InsecureInline, insecureInline: {{value: {}}}}}}}",
        quoted(&ca.cert_pem),
        quoted(&ca.key_pem)
    )
}

/// A MeshTrust `name` of mesh `default` for `trust_domain` holding each PEM as one bundle.
pub fn mesh_trust(name: &str, trust_domain: &str, pems: &[&str]) -> String {
    let bundles: String = pems
        .iter()
        .map(|p| format!("    - {{type: Pem, pem: {{value: {}}}}}\n", quoted(p)))
        .collect();
    format!(
        "type: MeshTrust\nname: {name}\nmesh: default\nspec:\n  trustDomain: {trust_domain}\n  caBundles:\n{bundles}"
    )
}

/// Runs `f` and returns what it logged at WARN and above, without ANSI colours.
pub fn warnings<T>(f: impl FnOnce() -> T) -> (T, String) {
    logged(tracing::Level::WARN, f)
}

/// Runs `f` and returns what it logged at `level` and above, without ANSI colours.
pub fn logged<T>(level: tracing::Level, f: impl FnOnce() -> T) -> (T, String) {
    #[derive(Clone, Default)]
    struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("not poisoned").extend_from_slice(data);
            Ok(data.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(level)
        .finish();
    let out = tracing::subscriber::with_default(subscriber, || {
        // Callsites another test thread registered while no subscriber of this thread existed may have
        // cached "never interested"; recompute, now that this one exists.
        tracing::callsite::rebuild_interest_cache();
        f()
    });
    let logged = String::from_utf8(buffer.0.lock().expect("not poisoned").clone()).expect("UTF-8");
    (out, logged)
}

/// The world `yaml` (read as file `test.yaml`) describes, with CAs from `keystore`, after `previous`.
pub fn load_world(
    yaml: &str,
    keystore: &dyn meshca_keystore::Keystore,
    settings: &meshca_config::Settings,
    previous: Option<&crate::world::World>,
    now: SystemTime,
) -> Result<crate::world::World, Vec<crate::UpdateError>> {
    use crate::UpdateError;
    let parsed = meshca_config::parse_str(std::path::Path::new("test.yaml"), yaml)
        .map_err(|e| e.iter().map(UpdateError::from).collect::<Vec<_>>())?;
    let resources = meshca_config::Resources::from_resources(parsed)
        .map_err(|e| e.iter().map(UpdateError::from).collect::<Vec<_>>())?;
    crate::world::World::load(
        resources,
        &crate::world::CaSource {
            keystore,
            mode: crate::world::LoadMode::Apply,
            settings,
            previous,
            now,
        },
    )
}
