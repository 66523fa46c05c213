//! The few DER encodings between PKCS#11 and X.509: a token's raw ECDSA signature (`r || s`) as the
//! `ECDSA-Sig-Value` certificates carry, an RSA public key from its modulus and exponent, the named
//! curves' parameters, and the OCTET STRING around a token's EC point.

use meshca_identity::KeyAlgorithm;

/// `ECDSA-Sig-Value ::= SEQUENCE { r INTEGER, s INTEGER }` from the token's `r || s` (each half the
/// curve's size, big-endian). `None` when the input is not two equal, non-empty halves.
pub(crate) fn ecdsa_signature(raw: &[u8]) -> Option<Vec<u8>> {
    if raw.is_empty() || !raw.len().is_multiple_of(2) {
        return None;
    }
    let (r, s) = raw.split_at(raw.len() / 2);
    let mut body = integer(r);
    body.extend(integer(s));
    Some(tlv(0x30, &body))
}

/// `RSAPublicKey ::= SEQUENCE { modulus INTEGER, publicExponent INTEGER }`, what an X.509 certificate's
/// subjectPublicKey holds for RSA.
pub(crate) fn rsa_public_key(modulus: &[u8], exponent: &[u8]) -> Vec<u8> {
    let mut body = integer(modulus);
    body.extend(integer(exponent));
    tlv(0x30, &body)
}

/// The DER OID of the named curve of an ECDSA algorithm (`CKA_EC_PARAMS`); `None` for RSA.
pub(crate) fn curve_params(algorithm: KeyAlgorithm) -> Option<&'static [u8]> {
    match algorithm {
        // 1.2.840.10045.3.1.7, prime256v1
        KeyAlgorithm::EcdsaP256 => {
            Some(&[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07])
        }
        // 1.3.132.0.34, secp384r1
        KeyAlgorithm::EcdsaP384 => Some(&[0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22]),
        _ => None,
    }
}

/// The ECDSA algorithm whose curve `params` (`CKA_EC_PARAMS`) names.
pub(crate) fn curve_of(params: &[u8]) -> Option<KeyAlgorithm> {
    [KeyAlgorithm::EcdsaP256, KeyAlgorithm::EcdsaP384]
        .into_iter()
        .find(|a| curve_params(*a) == Some(params))
}

/// The uncompressed point from `CKA_EC_POINT`: PKCS#11 wraps it in a DER OCTET STRING, though some
/// modules give it bare. `None` when it is neither for a point of `len` bytes.
pub(crate) fn ec_point(attribute: &[u8], len: usize) -> Option<&[u8]> {
    match attribute {
        [0x04, l, rest @ ..] if usize::from(*l) == len && rest.len() == len => Some(rest),
        [0x04, ..] if attribute.len() == len => Some(attribute),
        _ => None,
    }
}

/// A DER INTEGER of an unsigned big-endian value: leading zero bytes dropped, one put back when the
/// top bit is set (so that it does not read as negative).
fn integer(value: &[u8]) -> Vec<u8> {
    let start = value
        .iter()
        .position(|b| *b != 0)
        .unwrap_or(value.len().saturating_sub(1));
    let value = &value[start.min(value.len())..];
    let mut body = Vec::with_capacity(value.len() + 1);
    if value.first().is_none_or(|b| b & 0x80 != 0) {
        body.push(0);
    }
    body.extend_from_slice(value);
    tlv(0x02, &body)
}

/// Tag, definite length, value.
fn tlv(tag: u8, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() + 6);
    out.push(tag);
    let len = value.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(value);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use ring::rand::SystemRandom;
    use ring::signature::{self, EcdsaKeyPair, KeyPair};

    /// A fixed-size (`r || s`) signature from ring, as a token returns it, verifies once converted.
    #[test]
    fn fixed_ecdsa_signatures_convert_to_what_verifies() {
        let rng = SystemRandom::new();
        for (fixed, verify) in [
            (
                &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                &signature::ECDSA_P256_SHA256_ASN1,
            ),
            (
                &signature::ECDSA_P384_SHA384_FIXED_SIGNING,
                &signature::ECDSA_P384_SHA384_ASN1,
            ),
        ] {
            let pkcs8 = EcdsaKeyPair::generate_pkcs8(fixed, &rng).expect("a key");
            let key = EcdsaKeyPair::from_pkcs8(fixed, pkcs8.as_ref(), &rng).expect("loads");
            for i in 0..64u8 {
                let msg = [i; 40];
                let raw = key.sign(&rng, &msg).expect("signs");
                let der = ecdsa_signature(raw.as_ref()).expect("even length");
                signature::UnparsedPublicKey::new(verify, key.public_key().as_ref())
                    .verify(&msg, &der)
                    .expect("the converted signature verifies");
            }
        }
    }

    #[test]
    fn integers_follow_der() {
        assert_eq!(integer(&[0, 0, 1]), vec![0x02, 1, 1]);
        assert_eq!(integer(&[0x80]), vec![0x02, 2, 0, 0x80]);
        assert_eq!(integer(&[0, 0]), vec![0x02, 1, 0]);
        assert_eq!(integer(&[]), vec![0x02, 1, 0]);
        assert_eq!(tlv(0x30, &[0; 200])[..3], [0x30, 0x81, 200]);
        assert_eq!(tlv(0x30, &[0; 300])[..4], [0x30, 0x82, 1, 44]);
        assert_eq!(ecdsa_signature(&[1, 2, 3]), None);
        assert_eq!(ecdsa_signature(&[]), None);
    }

    #[test]
    fn curves_and_points() {
        for a in [KeyAlgorithm::EcdsaP256, KeyAlgorithm::EcdsaP384] {
            assert_eq!(curve_of(curve_params(a).expect("a curve")), Some(a));
        }
        assert_eq!(curve_params(KeyAlgorithm::Rsa2048), None);
        let point = [4u8; 65];
        let mut wrapped = vec![0x04, 65];
        wrapped.extend_from_slice(&point);
        assert_eq!(ec_point(&wrapped, 65), Some(&point[..]));
        assert_eq!(ec_point(&point, 65), Some(&point[..]));
        assert_eq!(ec_point(&wrapped[..60], 65), None);
    }

    proptest! {
        /// Whatever the halves, the encoding parses back (with x509-parser's DER reader, through a
        /// minimal decoder here) to the same two unsigned numbers.
        #[test]
        fn ecdsa_signature_round_trips(r in proptest::collection::vec(any::<u8>(), 32), s in proptest::collection::vec(any::<u8>(), 32)) {
            let mut raw = r.clone();
            raw.extend(&s);
            let der = ecdsa_signature(&raw).expect("even");
            let (decoded_r, rest) = read_integer(&der[2..]);
            let (decoded_s, rest) = read_integer(rest);
            prop_assert!(rest.is_empty());
            prop_assert_eq!(usize::from(der[1]), der.len() - 2);
            prop_assert_eq!(strip(&decoded_r), strip(&r));
            prop_assert_eq!(strip(&decoded_s), strip(&s));
            prop_assert!(decoded_r[0] & 0x80 == 0, "never negative");
        }
    }

    fn read_integer(der: &[u8]) -> (Vec<u8>, &[u8]) {
        assert_eq!(der[0], 0x02);
        let len = usize::from(der[1]);
        (der[2..2 + len].to_vec(), &der[2 + len..])
    }

    fn strip(v: &[u8]) -> Vec<u8> {
        let s: Vec<u8> = v.iter().copied().skip_while(|b| *b == 0).collect();
        if s.is_empty() {
            vec![]
        } else {
            s
        }
    }
}
