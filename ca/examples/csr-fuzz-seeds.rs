//! Writes the `csr` fuzz target's seeds (docs/fuzzing.md) into `<fuzz dir>/corpus/csr/`: certificate
//! signing requests for each key algorithm meshca issues leaves for (keys made for this and thrown
//! away), one with the SANs and subject a workload library puts in, and one for a curve meshca refuses.
//!
//! `cargo run -p meshca-ca --example csr-fuzz-seeds -- workload/fuzz`

use std::path::PathBuf;

use meshca_ca::{KeyAlgorithm, PrivateKey};
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};

fn request(key: &KeyPair, dns: &[&str], common_name: Option<&str>) -> Vec<u8> {
    let names: Vec<String> = dns.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(names).expect("valid names");
    params.distinguished_name = DistinguishedName::new();
    if let Some(name) = common_name {
        params.distinguished_name.push(DnType::CommonName, name);
    }
    params
        .serialize_request(key)
        .expect("a request")
        .der()
        .to_vec()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fuzz = PathBuf::from(
        std::env::args()
            .nth(1)
            .ok_or("usage: csr-fuzz-seeds <fuzz dir>")?,
    );
    let corpus = fuzz.join("corpus/csr");
    std::fs::create_dir_all(&corpus)?;
    let p256 = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let p384 = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384)?;
    let (rsa, _) = PrivateKey::generate(KeyAlgorithm::Rsa2048)?;
    let rsa = KeyPair::from_pkcs8_der_and_sign_algo(
        &rustls_pki_types::PrivatePkcs8KeyDer::from(rsa.pkcs8_der().to_vec()),
        &rcgen::PKCS_RSA_SHA256,
    )?;
    let ed25519 = KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
    let seeds = [
        ("p256", request(&p256, &[], None)),
        ("p384", request(&p384, &[], None)),
        ("rsa2048", request(&rsa, &[], None)),
        (
            "p256-named",
            request(&p256, &["web.example", "web"], Some("web")),
        ),
        ("ed25519", request(&ed25519, &[], None)),
    ];
    for (name, der) in seeds {
        std::fs::write(corpus.join(format!("seed-{name}")), der)?;
    }
    Ok(())
}
