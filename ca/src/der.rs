//! The few DER operations key conversion needs: read one TLV, write one TLV, and the OIDs involved.

/// DER tag of SEQUENCE.
pub(crate) const SEQUENCE: u8 = 0x30;
/// DER tag of INTEGER.
pub(crate) const INTEGER: u8 = 0x02;
/// DER tag of OCTET STRING.
pub(crate) const OCTET_STRING: u8 = 0x04;
/// DER tag of OBJECT IDENTIFIER.
pub(crate) const OID: u8 = 0x06;
/// DER tag of `[0]` constructed (ECPrivateKey parameters).
pub(crate) const CONTEXT_0: u8 = 0xa0;

/// id-ecPublicKey (1.2.840.10045.2.1), content bytes.
pub(crate) const OID_EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
/// prime256v1 / P-256 (1.2.840.10045.3.1.7).
pub(crate) const OID_P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
/// secp384r1 / P-384 (1.3.132.0.34).
pub(crate) const OID_P384: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x22];
/// rsaEncryption (1.2.840.113549.1.1.1).
pub(crate) const OID_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];

/// A human name for a key algorithm or curve OID (content bytes), for error messages.
pub(crate) fn oid_name(oid: &[u8]) -> String {
    let known: &[(&[u8], &str)] = &[
        (OID_EC_PUBLIC_KEY, "ECDSA"),
        (OID_P256, "P-256"),
        (OID_P384, "P-384"),
        (&[0x2b, 0x81, 0x04, 0x00, 0x23], "P-521"),
        (
            &[0x2b, 0x24, 0x03, 0x03, 0x02, 0x08, 0x01, 0x01, 0x07],
            "brainpoolP256r1",
        ),
        (&[0x2b, 0x81, 0x04, 0x00, 0x0a], "secp256k1"),
        (OID_RSA, "RSA"),
        (
            &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0a],
            "RSASSA-PSS",
        ),
        (&[0x2b, 0x65, 0x70], "Ed25519"),
        (&[0x2b, 0x65, 0x71], "Ed448"),
        (&[0x2b, 0x65, 0x6e], "X25519"),
        (&[0x2b, 0x65, 0x6f], "X448"),
        (&[0x2a, 0x86, 0x48, 0xce, 0x38, 0x04, 0x01], "DSA"),
    ];
    known
        .iter()
        .find(|(bytes, _)| *bytes == oid)
        .map(|(_, name)| (*name).to_owned())
        .unwrap_or_else(|| format!("OID {}", dotted(oid)))
}

/// Dotted notation of OID content bytes (best effort; used only in messages).
fn dotted(oid: &[u8]) -> String {
    let mut arcs: Vec<u64> = Vec::new();
    let mut value: u64 = 0;
    for &b in oid {
        value = value
            .saturating_mul(128)
            .saturating_add(u64::from(b & 0x7f));
        if b & 0x80 == 0 {
            if arcs.is_empty() {
                let first = (value / 40).min(2);
                arcs.push(first);
                arcs.push(value - first * 40);
            } else {
                arcs.push(value);
            }
            value = 0;
        }
    }
    arcs.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(".")
}

/// Reads one TLV from `input`: returns (tag, content, rest). Only definite lengths (DER).
pub(crate) fn read_tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// The number of bytes a TLV with `len` content bytes takes.
pub(crate) fn tlv_len(len: usize) -> usize {
    1 + header_len(len) + len
}

fn header_len(len: usize) -> usize {
    match len {
        0..=0x7f => 1,
        0x80..=0xff => 2,
        0x100..=0xffff => 3,
        _ => 4,
    }
}

/// Appends a TLV to `out`. Content longer than 16 MiB is not a key and never reaches here.
pub(crate) fn write_tlv(out: &mut Vec<u8>, tag: u8, content: &[u8]) {
    out.push(tag);
    let len = content.len();
    match header_len(len) {
        1 => out.push(len as u8),
        2 => out.extend_from_slice(&[0x81, len as u8]),
        3 => out.extend_from_slice(&[0x82, (len >> 8) as u8, len as u8]),
        _ => out.extend_from_slice(&[0x83, (len >> 16) as u8, (len >> 8) as u8, len as u8]),
    }
    out.extend_from_slice(content);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tlv_round_trips_every_length_form() {
        for len in [0usize, 1, 0x7f, 0x80, 0xff, 0x100, 0x1234, 0x10000] {
            let content = vec![7u8; len];
            let mut out = Vec::new();
            write_tlv(&mut out, SEQUENCE, &content);
            assert_eq!(out.len(), tlv_len(len));
            out.push(9);
            let (tag, got, rest) = read_tlv(&out).expect("valid TLV");
            assert_eq!((tag, got, rest), (SEQUENCE, content.as_slice(), &[9u8][..]));
        }
        assert_eq!(read_tlv(&[0x30, 0x05, 1, 2]), None);
        assert_eq!(read_tlv(&[0x30, 0x80]), None);
    }

    #[test]
    fn oid_names() {
        assert_eq!(oid_name(&[0x2b, 0x65, 0x70]), "Ed25519");
        assert_eq!(oid_name(OID_P384), "P-384");
        assert_eq!(oid_name(&[0x2a, 0x03, 0x04]), "OID 1.2.3.4");
    }
}
