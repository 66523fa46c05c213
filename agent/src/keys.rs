//! Workload keys: made on the agent's host, kept in its memory only, and proved to the servers by
//! certificate signing requests.
//!
//! A key is never written, logged or printed: [`WorkloadKey`]'s `Debug` shows its id only, and the
//! private half is a [`meshca_ca::PrivateKey`] (zeroized on drop).

use std::fmt;

use meshca_ca::{KeyAlgorithm, PrivateKey, PublicKey};
use meshca_control::SecretPem;
use rcgen::{CertificateParams, DistinguishedName, KeyPair};
use rustls_pki_types::PrivatePkcs8KeyDer;

use crate::proto::key_id;

/// Why a key or its request could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The registration asks for an algorithm this build does not know.
    #[error("registration {registration}: unknown key algorithm {algorithm:?}")]
    UnknownAlgorithm {
        /// `mesh/name` of the registration.
        registration: String,
        /// What the server sent.
        algorithm: String,
    },
    /// Generating the key failed.
    #[error("generating a {algorithm} key failed: {source}")]
    Generate {
        /// The algorithm.
        algorithm: KeyAlgorithm,
        /// What failed.
        #[source]
        source: meshca_ca::KeyError,
    },
    /// Signing the certificate request failed.
    #[error("signing a certificate request with a {algorithm} key failed: {reason}")]
    Request {
        /// The algorithm.
        algorithm: KeyAlgorithm,
        /// What rcgen said.
        reason: String,
    },
}

/// A workload key the agent made, with the request that proves it holds it.
pub struct WorkloadKey {
    private: PrivateKey,
    public: PublicKey,
    id: Vec<u8>,
    csr: Vec<u8>,
}

impl fmt::Debug for WorkloadKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkloadKey")
            .field("algorithm", &self.public.algorithm())
            .field("id", &hex(&self.id))
            .finish_non_exhaustive()
    }
}

/// The rcgen algorithm a key of `algorithm` signs its request with.
fn signing_algorithm(algorithm: KeyAlgorithm) -> &'static rcgen::SignatureAlgorithm {
    match algorithm {
        KeyAlgorithm::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
        KeyAlgorithm::EcdsaP384 => &rcgen::PKCS_ECDSA_P384_SHA384,
        KeyAlgorithm::Rsa2048 | KeyAlgorithm::Rsa3072 | KeyAlgorithm::Rsa4096 => {
            &rcgen::PKCS_RSA_SHA256
        }
    }
}

impl WorkloadKey {
    /// A new key of `algorithm` and its signed request (no SANs: the server decides the identity).
    pub fn generate(algorithm: KeyAlgorithm) -> Result<WorkloadKey, KeyError> {
        let (private, public) = PrivateKey::generate(algorithm)
            .map_err(|source| KeyError::Generate { algorithm, source })?;
        let failed = |reason: String| KeyError::Request { algorithm, reason };
        let der = PrivatePkcs8KeyDer::from(private.pkcs8_der());
        let pair = KeyPair::from_pkcs8_der_and_sign_algo(&der, signing_algorithm(algorithm))
            .map_err(|e| failed(e.to_string()))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        let csr = params
            .serialize_request(&pair)
            .map_err(|e| failed(e.to_string()))?
            .der()
            .to_vec();
        Ok(WorkloadKey {
            id: key_id(public.raw()),
            private,
            public,
            csr,
        })
    }

    /// Which key it is, as an identity's `key_id` names it.
    pub fn id(&self) -> &[u8] {
        &self.id
    }

    /// The public half.
    pub fn public(&self) -> &PublicKey {
        &self.public
    }

    /// The PKCS#10 request (DER) signed with the key.
    pub fn csr(&self) -> &[u8] {
        &self.csr
    }

    /// The private key as PEM, to serve with its certificate (zeroized on drop).
    pub(crate) fn secret_pem(&self) -> SecretPem {
        SecretPem::new(self.private.to_pem().to_string())
    }
}

/// Lowercase hex, for logs (of key ids, never of keys).
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_id_is_what_the_server_reads_from_the_request() {
        for algorithm in [KeyAlgorithm::EcdsaP256, KeyAlgorithm::EcdsaP384] {
            let key = WorkloadKey::generate(algorithm).expect("a key");
            let public = meshca_ca::csr_public_key(key.csr()).expect("the request verifies");
            assert_eq!(public.algorithm(), algorithm);
            assert_eq!(key_id(public.raw()), key.id());
            assert_eq!(public, *key.public());
        }
    }

    #[test]
    fn an_rsa_key_signs_its_request_too() {
        let key = WorkloadKey::generate(KeyAlgorithm::Rsa2048).expect("a key");
        let public = meshca_ca::csr_public_key(key.csr()).expect("the request verifies");
        assert_eq!(key_id(public.raw()), key.id());
    }

    #[test]
    fn debug_shows_no_key_material() {
        let key = WorkloadKey::generate(KeyAlgorithm::EcdsaP256).expect("a key");
        let shown = format!("{key:?}");
        let pem = key.secret_pem();
        let body: String = pem
            .expose()
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        assert!(!shown.contains(&body[..20]), "{shown}");
        assert!(shown.contains(&hex(key.id())), "{shown}");
    }
}
