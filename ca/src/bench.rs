//! The raw floor the issuance benchmark compares against (DESIGN §11).

use std::hint::black_box;
use std::sync::OnceLock;

use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};

/// A message the size of a typical leaf's to-be-signed part.
const MESSAGE: [u8; 300] = [0x5a; 300];

fn signer() -> Option<&'static EcdsaKeyPair> {
    static SIGNER: OnceLock<Option<EcdsaKeyPair>> = OnceLock::new();
    SIGNER
        .get_or_init(|| {
            let rng = SystemRandom::new();
            let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).ok()?;
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng).ok()
        })
        .as_ref()
}

/// One unit of the issuance floor: a ring P-256 key generation plus one P-256 signature over a
/// ~300-byte message with a CA-like key loaded once. Results are black-boxed so nothing is optimised away.
pub fn floor_once() {
    let rng = SystemRandom::new();
    let key = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng);
    black_box(&key);
    if let Some(signer) = signer() {
        let signature = signer.sign(&rng, black_box(&MESSAGE));
        black_box(&signature);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn floor_runs_and_its_signer_loads() {
        assert!(super::signer().is_some());
        super::floor_once();
    }
}
