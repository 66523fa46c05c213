//! The TLS material of the daemon's SDS TCP listeners when the operator gives none: a private CA of
//! the daemon (made once; the caller persists it) and the server certificates it signs.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, SystemTime};

use std::sync::Arc;

use meshca_hsm::{HsmError, KeySelector, Token, TokenKey};
use meshca_identity::KeyAlgorithm;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use zeroize::Zeroizing;

use crate::authority::CaSigner;

/// How long the SDS CA is valid.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long an SDS server certificate is valid (a new one is made at every start).
const SERVER_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// How far back both start, for clocks a little behind.
const BACKDATE: Duration = Duration::from_secs(10);

/// Why the SDS CA or a server certificate could not be made or loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SdsTlsError {
    /// The CA's key could not be generated.
    #[error("cannot generate the SDS CA key: {0}")]
    CaKey(rcgen::Error),
    /// The CA's certificate could not be made.
    #[error("cannot create the SDS CA: {0}")]
    CaCertificate(rcgen::Error),
    /// The persisted CA key does not load.
    #[error("{0}")]
    CaKeyUnreadable(rcgen::Error),
    /// The CA's certificate and key cannot sign.
    #[error("the SDS CA cannot sign: {0}")]
    CaCannotSign(rcgen::Error),
    /// The server key could not be generated.
    #[error("cannot generate the SDS server key: {0}")]
    ServerKey(rcgen::Error),
    /// The server certificate could not be made.
    #[error("cannot issue the SDS server certificate: {0}")]
    ServerCertificate(rcgen::Error),
    /// The PKCS#11 token failed to make, find or use the CA's key.
    #[error("the SDS CA's key in the PKCS#11 token: {0}")]
    Token(#[source] HsmError),
    /// The persisted certificate does not read, or its key in the token is not its own.
    #[error("the SDS CA's certificate: {0}")]
    Certificate(String),
}

/// The daemon's SDS CA: its certificate (what clients trust) and its key, in memory or in a PKCS#11
/// token.
pub struct SdsCa {
    cert_pem: String,
    key: CaSigner,
}

impl std::fmt::Debug for SdsCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SdsCa")
            .field("cert_pem", &self.cert_pem)
            .field(
                "key",
                &self
                    .token_key()
                    .map_or("[redacted]", |_| "[in the PKCS#11 token]"),
            )
            .finish()
    }
}

/// A server certificate of the SDS CA, with its key.
pub struct SdsServerCert {
    /// The certificate, DER.
    pub cert_der: Vec<u8>,
    /// Its key, PKCS#8 DER.
    pub key_pkcs8: Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for SdsServerCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SdsServerCert")
            .field("cert_der", &self.cert_der.len())
            .field("key_pkcs8", &"[redacted]")
            .finish()
    }
}

impl SdsCa {
    /// A new CA with a random name, valid for ten years from `now`.
    pub fn generate(now: SystemTime) -> Result<SdsCa, SdsTlsError> {
        let key = KeyPair::generate().map_err(SdsTlsError::CaKey)?;
        Self::self_signed(now, CaSigner::Software(key))
    }

    /// A new CA as [`SdsCa::generate`] makes one, its key made in `token` (P-256, never extractable,
    /// pending until the keystore records it: see [`TokenKey::record_as`]).
    pub fn generate_in_token(now: SystemTime, token: &Token) -> Result<SdsCa, SdsTlsError> {
        let key = token
            .generate_pending_key(KeyAlgorithm::EcdsaP256)
            .map_err(SdsTlsError::Token)?;
        let key = Arc::new(key);
        match Self::self_signed(now, CaSigner::Token(Arc::clone(&key))) {
            Ok(ca) => Ok(ca),
            Err(error) => {
                if let Ok(key) = Arc::try_unwrap(key) {
                    let _ = key.destroy();
                }
                Err(error)
            }
        }
    }

    fn self_signed(now: SystemTime, key: CaSigner) -> Result<SdsCa, SdsTlsError> {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(
            DnType::CommonName,
            format!("meshca SDS CA {}", random_hex(6)),
        );
        params
            .distinguished_name
            .push(DnType::OrganizationName, "meshca");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = (now - BACKDATE).into();
        params.not_after = (now + CA_VALIDITY).into();
        params.serial_number = Some(random_hex(16).as_bytes().to_vec().into());
        let cert = params
            .self_signed(&key)
            .map_err(SdsTlsError::CaCertificate)?;
        Ok(SdsCa {
            cert_pem: cert.pem(),
            key,
        })
    }

    /// The CA as persisted: its certificate and its key, both PEM.
    pub fn from_pem(cert_pem: String, key_pem: &str) -> Result<SdsCa, SdsTlsError> {
        let key = KeyPair::from_pem(key_pem).map_err(SdsTlsError::CaKeyUnreadable)?;
        Ok(SdsCa {
            cert_pem,
            key: CaSigner::Software(key),
        })
    }

    /// The CA as persisted with its key in `token`: its certificate (PEM) and the key `selector` names,
    /// proven to be the certificate's by a signature.
    pub fn from_pem_in_token(
        cert_pem: String,
        token: &Token,
        selector: KeySelector<'_>,
    ) -> Result<SdsCa, SdsTlsError> {
        let chain = crate::material::read_chain(cert_pem.as_bytes())
            .map_err(|e| SdsTlsError::Certificate(e.to_string()))?;
        let key =
            crate::authority::find_token_key(&chain, token, selector).map_err(|e| match e {
                crate::CaError::Token(e) => SdsTlsError::Token(e),
                other => SdsTlsError::Certificate(other.to_string()),
            })?;
        Ok(SdsCa {
            cert_pem,
            key: CaSigner::Token(Arc::new(key)),
        })
    }

    /// The CA's key when it is in a PKCS#11 token.
    pub fn token_key(&self) -> Option<&TokenKey> {
        match &self.key {
            CaSigner::Software(_) => None,
            CaSigner::Token(key) => Some(key),
        }
    }

    /// The CA's id: lowercase hex SHA-256 of its certificate's DER (a key in a token is labelled so).
    pub fn id(&self) -> String {
        ::pem::parse(&self.cert_pem)
            .map(|block| crate::certs::sha256_hex(block.contents()))
            .unwrap_or_default()
    }

    /// The CA's certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's key, PEM (a secret: persist it as one); `None` when it is in a token.
    pub fn key_pem(&self) -> Option<Zeroizing<String>> {
        match &self.key {
            CaSigner::Software(key) => Some(Zeroizing::new(key.serialize_pem())),
            CaSigner::Token(_) => None,
        }
    }

    /// A server certificate for `dns_names` and the loopback addresses, valid for a year from `now`
    /// (a name that is not ASCII is left out).
    pub fn issue_server_cert(
        self,
        dns_names: &[String],
        now: SystemTime,
    ) -> Result<SdsServerCert, SdsTlsError> {
        let issuer = Issuer::from_ca_cert_pem(&self.cert_pem, self.key)
            .map_err(SdsTlsError::CaCannotSign)?;
        let key = KeyPair::generate().map_err(SdsTlsError::ServerKey)?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "meshca SDS");
        for name in dns_names {
            if let Ok(dns) = name.clone().try_into() {
                params.subject_alt_names.push(SanType::DnsName(dns));
            }
        }
        for ip in [
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        ] {
            params.subject_alt_names.push(SanType::IpAddress(ip));
        }
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = (now - BACKDATE).into();
        params.not_after = (now + SERVER_VALIDITY).into();
        params.serial_number = Some(random_hex(16).as_bytes().to_vec().into());
        let cert = params
            .signed_by(&key, &issuer)
            .map_err(SdsTlsError::ServerCertificate)?;
        Ok(SdsServerCert {
            cert_der: cert.der().to_vec(),
            key_pkcs8: Zeroizing::new(key.serialize_der()),
        })
    }
}

/// `n` random bytes as lowercase hex.
fn random_hex(n: usize) -> String {
    use ring::rand::SecureRandom;
    let mut b = vec![0u8; n];
    // SystemRandom only fails when the OS has no entropy source; a fixed value then still yields valid names.
    let _ = ring::rand::SystemRandom::new().fill(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_certificate_names_the_host_and_loopback_and_chains_to_the_ca() {
        let now = SystemTime::now();
        let ca = SdsCa::generate(now).expect("a CA");
        let key_pem = ca.key_pem().expect("a software key");
        let again = SdsCa::from_pem(ca.cert_pem().to_owned(), &key_pem).expect("reloads");
        assert_eq!(again.cert_pem(), ca.cert_pem());
        let ca_der = ::pem::parse(ca.cert_pem()).expect("PEM").into_contents();
        let names = ["localhost".to_owned(), "hôte".to_owned()];
        let server = again.issue_server_cert(&names, now).expect("a server cert");
        let (_, cert) = x509_parser::parse_x509_certificate(&server.cert_der).expect("DER");
        let (_, ca_cert) = x509_parser::parse_x509_certificate(&ca_der).expect("DER");
        assert_eq!(cert.issuer(), ca_cert.subject());
        let san = cert
            .subject_alternative_name()
            .expect("readable")
            .expect("present");
        assert_eq!(
            san.value.general_names.len(),
            3,
            "localhost, 127.0.0.1, ::1"
        );
        assert!(!server.key_pkcs8.is_empty());
    }

    #[test]
    fn a_key_that_is_no_pem_is_refused() {
        assert!(matches!(
            SdsCa::from_pem(String::new(), "nonsense"),
            Err(SdsTlsError::CaKeyUnreadable(_))
        ));
    }
}
