//! Canonical (low-S) ES256 signatures.
//!
//! An ECDSA signature `(r, s)` is valid exactly when `(r, n - s)` is: anyone holding a token can make a
//! second, different token with the same claims. meshca mints only the low form (`s <= n/2`) and refuses
//! the high one, so each token has one spelling and a token id cannot be paired with a look-alike.

/// The order `n` of the P-256 group, big-endian.
const P256_ORDER: [u8; 32] = [
    0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xbc, 0xe6, 0xfa, 0xad, 0xa7, 0x17, 0x9e, 0x84, 0xf3, 0xb9, 0xca, 0xc2, 0xfc, 0x63, 0x25, 0x51,
];

/// `floor(n / 2)`, big-endian: the largest low `s`.
const P256_HALF_ORDER: [u8; 32] = [
    0x7f, 0xff, 0xff, 0xff, 0x80, 0x00, 0x00, 0x00, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xde, 0x73, 0x7d, 0x56, 0xd3, 0x8b, 0xcf, 0x42, 0x79, 0xdc, 0xe5, 0x61, 0x7e, 0x31, 0x92, 0xa8,
];

/// The length of one scalar (`r` or `s`) in a fixed-size ES256 signature.
const SCALAR_LEN: usize = 32;

/// Whether a fixed-size ES256 signature (`r || s`, 64 bytes) has `s <= n/2`. Any other length is not low-S.
pub fn is_low_s(signature: &[u8]) -> bool {
    match signature.get(SCALAR_LEN..) {
        // Equal-length big-endian byte strings compare like the numbers they spell.
        Some(s) if s.len() == SCALAR_LEN => s <= P256_HALF_ORDER.as_slice(),
        _ => false,
    }
}

/// Rewrites a fixed-size ES256 signature into its low-S form (`s` becomes `n - s` when `s > n/2`); the
/// signature stays valid for the same key and message. `s` is below `n` in every signature ring makes.
/// Public so that every ES256 signer in meshca (proxy tokens here, JWT-SVIDs in `meshca-workload`)
/// writes the same canonical form.
pub fn normalize(signature: &mut [u8; 2 * SCALAR_LEN]) {
    if is_low_s(signature) {
        return;
    }
    let (_, s) = signature.split_at_mut(SCALAR_LEN);
    let negated = order_minus(s);
    s.copy_from_slice(&negated);
}

/// `n - s` for a big-endian `s` of [`SCALAR_LEN`] bytes with `s < n`.
pub(crate) fn order_minus(s: &[u8]) -> [u8; SCALAR_LEN] {
    let mut out = [0u8; SCALAR_LEN];
    let mut borrow = 0u16;
    for i in (0..SCALAR_LEN).rev() {
        let minuend = u16::from(P256_ORDER[i]);
        let subtrahend = u16::from(s.get(i).copied().unwrap_or(0)) + borrow;
        let (digit, next_borrow) = if minuend >= subtrahend {
            (minuend - subtrahend, 0)
        } else {
            (minuend + 0x100 - subtrahend, 1)
        };
        // `digit` is below 0x100 by construction.
        out[i] = digit as u8;
        borrow = next_borrow;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signature_with_s(s: [u8; SCALAR_LEN]) -> [u8; 2 * SCALAR_LEN] {
        let mut signature = [0x11u8; 2 * SCALAR_LEN];
        signature[SCALAR_LEN..].copy_from_slice(&s);
        signature
    }

    #[test]
    fn half_order_is_half_the_order() {
        // n is odd: n = 2 * floor(n/2) + 1, so n - floor(n/2) = floor(n/2) + 1.
        let mut plus_one = P256_HALF_ORDER;
        for byte in plus_one.iter_mut().rev() {
            let (sum, carry) = byte.overflowing_add(1);
            *byte = sum;
            if !carry {
                break;
            }
        }
        assert_eq!(order_minus(&P256_HALF_ORDER), plus_one);
    }

    #[test]
    fn the_boundary_is_half_the_order() {
        assert!(is_low_s(&signature_with_s(P256_HALF_ORDER)));
        let mut above = P256_HALF_ORDER;
        above[SCALAR_LEN - 1] += 1;
        assert!(!is_low_s(&signature_with_s(above)));
        assert!(is_low_s(&signature_with_s([0; SCALAR_LEN])));
        assert!(!is_low_s(&[0u8; 63]), "a short signature is never low-S");
    }

    #[test]
    fn normalize_negates_only_high_s() {
        let mut s = [0u8; SCALAR_LEN];
        s[SCALAR_LEN - 1] = 5;
        let low = signature_with_s(s);
        let mut unchanged = low;
        normalize(&mut unchanged);
        assert_eq!(unchanged, low);

        let mut high = signature_with_s(order_minus(&s));
        assert!(!is_low_s(&high));
        normalize(&mut high);
        assert_eq!(high, low, "n - (n - s) = s");
    }
}
