//! Certificate signing requests (PKCS#10): how a workload whose key never leaves its host asks for a
//! certificate. Only the public key and the proof that the requester holds its private half (the
//! request's signature) are taken from it; what the certificate says (its SPIFFE ID, validity, usages)
//! is the CA's decision alone, so the request's subject, SANs and extensions are never copied into a
//! certificate ([`read_csr`] reports the URI SANs asked for, so that a server can refuse a request for
//! another identity).

use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;

use crate::key::PublicKey;
use crate::spki::{self, SpkiError};

/// The largest request accepted: an RSA-4096 request is about 1.2 KB; room to spare, and a bound before
/// anything is parsed.
pub const MAX_CSR_BYTES: usize = 16 * 1024;

/// Why a certificate signing request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CsrError {
    /// Larger than [`MAX_CSR_BYTES`].
    #[error(
        "the certificate signing request is {len} bytes; at most {MAX_CSR_BYTES} are accepted"
    )]
    TooLarge {
        /// Its length.
        len: usize,
    },
    /// Not a DER PKCS#10 request (or bytes after it).
    #[error("not a DER certificate signing request (PKCS#10): {0}")]
    Malformed(String),
    /// The signature does not verify with the request's own key: whoever sent it does not hold the
    /// private key.
    #[error("the certificate signing request's signature does not verify with its public key")]
    BadSignature,
    /// A key of a kind meshca issues no leaves for.
    #[error("the certificate signing request's key is {0}; leaves are issued for ECDSA P-256 or P-384 and RSA 2048, 3072 or 4096 keys")]
    UnsupportedKey(String),
}

/// The public key of a DER certificate signing request, once its signature verified with that key.
pub fn csr_public_key(der: &[u8]) -> Result<PublicKey, CsrError> {
    read_csr(der).map(|csr| csr.public_key)
}

/// What meshca reads of a certificate signing request whose signature verified.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SignedRequest {
    /// The key to certify.
    pub public_key: PublicKey,
    /// The URI SANs the request asks for (its extension request), as written. meshca never copies
    /// them into a certificate; a server checks them so that a request asking for another identity
    /// than the one it would get is refused, not silently rewritten.
    pub uri_sans: Vec<String>,
}

/// Reads a DER certificate signing request: its key, once its signature verified with that key, and
/// the URI SANs it asks for.
pub fn read_csr(der: &[u8]) -> Result<SignedRequest, CsrError> {
    if der.len() > MAX_CSR_BYTES {
        return Err(CsrError::TooLarge { len: der.len() });
    }
    let (rest, csr) = X509CertificationRequest::from_der(der)
        .map_err(|error| CsrError::Malformed(error.to_string()))?;
    if !rest.is_empty() {
        return Err(CsrError::Malformed(format!(
            "{} bytes follow the request",
            rest.len()
        )));
    }
    let key =
        spki::public_key(&csr.certification_request_info.subject_pki).map_err(|e| match e {
            SpkiError::Malformed(m) => CsrError::Malformed(m),
            SpkiError::UnsupportedKey(k) => CsrError::UnsupportedKey(k),
        })?;
    csr.verify_signature().map_err(|_| CsrError::BadSignature)?;
    let mut uri_sans = Vec::new();
    for extension in csr.requested_extensions().into_iter().flatten() {
        match extension {
            ParsedExtension::SubjectAlternativeName(san) => {
                for name in &san.general_names {
                    if let GeneralName::URI(uri) = name {
                        uri_sans.push((*uri).to_owned());
                    }
                }
            }
            ParsedExtension::UnsupportedExtension { .. } => {}
            ParsedExtension::ParseError { error } => {
                return Err(CsrError::Malformed(format!(
                    "an extension it requests does not parse: {error}"
                )))
            }
            _ => {}
        }
    }
    Ok(SignedRequest {
        public_key: key,
        uri_sans,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshca_identity::KeyAlgorithm;
    use rcgen::{CertificateParams, KeyPair};

    fn csr_for(key: &KeyPair) -> Vec<u8> {
        let mut params =
            CertificateParams::new(vec!["anything.example".to_owned()]).expect("params");
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .serialize_request(key)
            .expect("a request")
            .der()
            .to_vec()
    }

    #[test]
    fn the_uri_sans_a_request_asks_for_are_read() {
        let key = KeyPair::generate().expect("a key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.subject_alt_names = vec![
            rcgen::SanType::URI("spiffe://td/w".try_into().expect("a URI")),
            rcgen::SanType::DnsName("x.example".try_into().expect("a name")),
        ];
        let der = params
            .serialize_request(&key)
            .expect("a request")
            .der()
            .to_vec();
        let read = read_csr(&der).expect("accepted");
        assert_eq!(read.uri_sans, ["spiffe://td/w"]);
        assert!(read_csr(&csr_for(&key))
            .expect("accepted")
            .uri_sans
            .is_empty());
    }

    #[test]
    fn the_key_of_a_signed_request_is_taken_with_its_algorithm() {
        for (alg, expected) in [
            (&rcgen::PKCS_ECDSA_P256_SHA256, KeyAlgorithm::EcdsaP256),
            (&rcgen::PKCS_ECDSA_P384_SHA384, KeyAlgorithm::EcdsaP384),
        ] {
            let key = KeyPair::generate_for(alg).expect("a key");
            let public = csr_public_key(&csr_for(&key)).expect("accepted");
            assert_eq!(public.algorithm(), expected);
            assert_eq!(public.raw(), rcgen::PublicKeyData::der_bytes(&key));
        }
    }

    #[test]
    fn an_rsa_request_is_taken_with_its_size() {
        let (private, public) =
            crate::PrivateKey::generate(KeyAlgorithm::Rsa2048).expect("an RSA key");
        let der = rustls_pki_types::PrivatePkcs8KeyDer::from(private.pkcs8_der().to_vec());
        let key = KeyPair::from_pkcs8_der_and_sign_algo(&der, &rcgen::PKCS_RSA_SHA256)
            .expect("rcgen reads it");
        let taken = csr_public_key(&csr_for(&key)).expect("accepted");
        assert_eq!(taken, public);
    }

    #[test]
    fn a_request_whose_signature_does_not_verify_is_refused() {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("a key");
        let mut der = csr_for(&key);
        // The signature is the request's last bytes: change one of them.
        let last = der.len() - 1;
        der[last] ^= 0x01;
        assert_eq!(csr_public_key(&der), Err(CsrError::BadSignature));
    }

    #[test]
    fn garbage_oversized_and_trailing_bytes_are_refused() {
        assert!(matches!(
            csr_public_key(b"not a request"),
            Err(CsrError::Malformed(_))
        ));
        assert_eq!(
            csr_public_key(&vec![0x30; MAX_CSR_BYTES + 1]),
            Err(CsrError::TooLarge {
                len: MAX_CSR_BYTES + 1
            })
        );
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("a key");
        let mut der = csr_for(&key);
        der.push(0);
        assert!(matches!(csr_public_key(&der), Err(CsrError::Malformed(_))));
    }

    /// One request, and the key it holds, for the properties below (a key per case would dominate).
    static REQUEST: std::sync::LazyLock<(Vec<u8>, PublicKey)> = std::sync::LazyLock::new(|| {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("a key");
        let der = csr_for(&key);
        let public = csr_public_key(&der).expect("accepted");
        (der, public)
    });

    proptest::proptest! {
        #[test]
        fn any_bytes_are_refused_or_read_without_a_panic(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..2048)
        ) {
            let _ = csr_public_key(&bytes);
        }

        /// A request changed anywhere is refused, or (a change the signature does not cover, such as
        /// an equivalent encoding) still yields the very key it held: never another.
        #[test]
        fn a_changed_request_is_refused_or_holds_the_same_key(
            index in proptest::num::usize::ANY,
            flip in 1u8..=255,
        ) {
            let (der, public) = &*REQUEST;
            let mut changed = der.clone();
            let at = index % changed.len();
            changed[at] ^= flip;
            if let Ok(key) = csr_public_key(&changed) {
                proptest::prop_assert_eq!(&key, public);
            }
        }

        /// A request cut short is refused.
        #[test]
        fn a_truncated_request_is_refused(len in proptest::num::usize::ANY) {
            let (der, _) = &*REQUEST;
            let len = len % der.len();
            proptest::prop_assert!(csr_public_key(&der[..len]).is_err());
        }
    }
}
