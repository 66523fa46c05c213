//! Writes the seeds of the `spiffe_bundle` fuzz target into `<dir>/corpus/spiffe_bundle/`: bundles as
//! meshca writes them (X.509 authorities on P-256 and P-384, JWT authorities on P-256 and RSA, with and
//! without a sequence and a refresh hint), and one with elements a reader must skip.
//!
//! `cargo run -p meshca-federation --example fuzz-seeds -- federation/fuzz`

use std::path::PathBuf;
use std::time::Duration;

use meshca_federation::{EcCurve, JwkKey, JwtAuthority, SpiffeBundle, X509Authority};
use meshca_identity::TrustDomain;
use rcgen::{
    BasicConstraints, CertificateParams, IsCa, KeyPair, SanType, PKCS_ECDSA_P256_SHA256,
    PKCS_ECDSA_P384_SHA384,
};

fn ca(algorithm: &'static rcgen::SignatureAlgorithm, trust_domain: &TrustDomain) -> X509Authority {
    let key = KeyPair::generate_for(algorithm).expect("a key");
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.subject_alt_names = vec![SanType::URI(
        format!("spiffe://{}", trust_domain.as_str())
            .try_into()
            .expect("a URI"),
    )];
    let der = params
        .self_signed(&key)
        .expect("a certificate")
        .der()
        .to_vec();
    X509Authority::from_der(der, trust_domain).expect("a CA of the trust domain")
}

fn main() {
    let dir = PathBuf::from(std::env::args().nth(1).expect("usage: fuzz-seeds <dir>"))
        .join("corpus")
        .join("spiffe_bundle");
    std::fs::create_dir_all(&dir).expect("the corpus directory");
    let td = TrustDomain::parse("example.org").expect("a trust domain");
    let jwt = |kid: &str, fill: u8| JwtAuthority {
        kid: kid.into(),
        key: JwkKey::Ec {
            curve: EcCurve::P256,
            x: vec![fill; 32],
            y: vec![fill ^ 0x5a; 32],
        },
    };
    let rsa = JwtAuthority {
        kid: "rsa-1".into(),
        key: JwkKey::Rsa {
            n: vec![0xc3; 256],
            e: vec![1, 0, 1],
        },
    };
    let mut full = SpiffeBundle::new(
        td.clone(),
        vec![
            ca(&PKCS_ECDSA_P256_SHA256, &td),
            ca(&PKCS_ECDSA_P384_SHA384, &td),
        ],
        vec![jwt("key-1", 1), rsa],
    );
    full.sequence = Some(42);
    full.refresh_hint = Some(Duration::from_secs(300));
    let bare = SpiffeBundle::new(
        td.clone(),
        vec![ca(&PKCS_ECDSA_P256_SHA256, &td)],
        Vec::new(),
    );
    let mut jwt_only = SpiffeBundle::new(td.clone(), Vec::new(), vec![jwt("a", 2), jwt("b", 3)]);
    jwt_only.sequence = Some(1);
    let mut skipped: serde_json::Value =
        serde_json::from_slice(&full.to_json()).expect("a bundle is JSON");
    if let Some(keys) = skipped["keys"].as_array_mut() {
        keys.push(serde_json::json!({"use": "sig", "kty": "EC", "crv": "P-256"}));
        keys.push(serde_json::json!({"use": "jwt-svid", "kty": "OKP", "crv": "Ed25519", "x": "AA", "kid": "ed"}));
    }
    let seeds = [
        ("full.json", full.to_json()),
        ("x509-only.json", bare.to_json()),
        ("jwt-only.json", jwt_only.to_json()),
        ("skipped.json", serde_json::to_vec(&skipped).expect("JSON")),
    ];
    for (name, bytes) in seeds {
        std::fs::write(dir.join(name), bytes).expect("a seed");
    }
}
