//! Certificates and files, checked with code that is not meshca's (x509-parser, rustls-webpki).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The DER certificates of PEM text, in order.
pub fn pem_certs(pem_text: &str) -> Vec<Vec<u8>> {
    ::pem::parse_many(pem_text)
        .expect("valid PEM")
        .into_iter()
        .filter(|p| p.tag() == "CERTIFICATE")
        .map(|p| p.into_contents())
        .collect()
}

/// The URI SANs of a DER certificate, read with x509-parser (not meshca's code).
pub fn uri_sans(der: &[u8]) -> Vec<String> {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(der).expect("a parsable certificate");
    let mut out = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let GeneralName::URI(u) = name {
                out.push((*u).to_owned());
            }
        }
    }
    out
}

/// Verifies `chain` (leaf first) against `anchors` with rustls-webpki, for client and server use.
pub fn webpki_verify(chain: &[Vec<u8>], anchors: &[Vec<u8>]) -> Result<(), String> {
    use rustls_pki_types::{CertificateDer, UnixTime};
    let anchor_ders: Vec<CertificateDer<'_>> = anchors
        .iter()
        .map(|d| CertificateDer::from(d.as_slice()))
        .collect();
    let trust: Vec<_> = anchor_ders
        .iter()
        .map(|d| webpki::anchor_from_trusted_cert(d).map_err(|e| format!("anchor: {e}")))
        .collect::<Result<_, _>>()?;
    let (leaf, rest) = chain.split_first().ok_or("empty chain")?;
    let leaf_der = CertificateDer::from(leaf.as_slice());
    let intermediates: Vec<CertificateDer<'_>> = rest
        .iter()
        .map(|d| CertificateDer::from(d.as_slice()))
        .collect();
    let ee = webpki::EndEntityCert::try_from(&leaf_der).map_err(|e| format!("leaf: {e}"))?;
    let now = UnixTime::since_unix_epoch(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("the clock is after 1970"),
    );
    for usage in [
        webpki::KeyUsage::client_auth(),
        webpki::KeyUsage::server_auth(),
    ] {
        ee.verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &trust,
            &intermediates,
            now,
            usage,
            None,
            None,
        )
        .map_err(|e| format!("webpki: {e}"))?;
    }
    Ok(())
}

/// The permission bits of a path.
pub fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// Every path under `dir` (depth first), directories included.
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.expect("a readable directory entry").path();
            if path.is_dir() {
                stack.push(path.clone());
            }
            out.push(path);
        }
    }
    out
}
