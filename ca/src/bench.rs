//! The raw floor the issuance benchmark compares against (BENCHMARKS.md).

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

/// The issuance floor could not run (the system's random source or ring failed).
#[derive(Debug, thiserror::Error)]
#[error("the issuance floor could not run: {0}")]
pub struct FloorError(&'static str);

/// One unit of the issuance floor: a ring P-256 key generation plus one P-256 signature over a
/// ~300-byte message with a CA-like key loaded once. Results are black-boxed so nothing is optimised
/// away; a step that fails is an error, never silently skipped (a floor that skips work would be fast).
pub fn floor_once() -> Result<(), FloorError> {
    let rng = SystemRandom::new();
    let key = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
        .map_err(|_| FloorError("P-256 key generation failed"))?;
    black_box(&key);
    let signer = signer().ok_or(FloorError("the signing key could not be made"))?;
    let signature = signer
        .sign(&rng, black_box(&MESSAGE))
        .map_err(|_| FloorError("signing failed"))?;
    black_box(&signature);
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn floor_runs_and_its_signer_loads() {
        assert!(super::signer().is_some());
        super::floor_once().expect("the floor runs");
    }
}
